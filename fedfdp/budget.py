"""From a configuration to a privacy plan, and the per-run budget guard.

:func:`plan_privacy` resolves the privacy-defining numbers of a run once, from
the configuration and the (public) number of training records ``N``:
``δ`` (default ``1/(2N)``), the noise multiplier ``σ`` (given, or calibrated
so that the run's private rounds end at, never above, ``target-epsilon``) and
the budget cap (``max-epsilon``, defaulting to the target).

:class:`Budget` wraps the accountant for a run: before each private round it
asks, without mutating, whether composing that round would exceed the cap,
and refuses it with :class:`~fedfdp.accounting.PrivacyBudgetExhausted`; after
the round it composes one Poisson-subsampled Gaussian event (Theorem 5).
Every ε it reports is the **upper** end of the accountant's interval, for the
**add/remove** relation (Def. 6) at the plan's δ.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedfdp.accounting import FDPAccountant, PrivacyBudgetExhausted, calibrate_noise_multiplier
from fedfdp.config import Config


@dataclass(frozen=True)
class PrivacyPlan:
    """Resolved privacy parameters of a run.

    Attributes
    ----------
    private : bool
        Whether any round spends ε.
    noise_multiplier : float or None
        σ (None for non-private modes).
    sampling_rate : float
        Rate used for accounting: ``q`` (record unit, all devices or a
        fixed-count, data-independent device choice), ``p·q`` (record unit,
        Poisson device sampling at rate ``p``), ``p`` (device unit).
    delta : float
    private_rounds : int
        Rounds that compose a privacy event.
    max_epsilon : float or None
        Refuse any round that would take ε above this.
    relation : str
        Neighbouring relation of every reported ε: ``add-remove``.
    unbounded : bool
        True for ``nonprivate``: private data is used without noise, ε = ∞.
    """

    private: bool
    noise_multiplier: float | None
    sampling_rate: float
    delta: float
    private_rounds: int
    max_epsilon: float | None
    relation: str = "add-remove"
    unbounded: bool = False
    unit: str = "record"


def plan_privacy(cfg: Config, num_records: int) -> PrivacyPlan:
    """Resolve σ, δ and the cap for ``cfg`` over ``num_records`` training records."""
    if num_records < 1:
        raise ValueError(f"num_records={num_records}: the dataset has no training records")
    p = cfg.privacy
    delta = p.delta if p.delta is not None else 1.0 / (2 * num_records)
    rounds = cfg.training.num_rounds - p.public_pretrain_rounds
    rate = accounting_rate(cfg)
    if not p.is_private:
        return PrivacyPlan(
            False, None, rate, delta, 0, None, unbounded=p.mode == "nonprivate", unit=p.privacy_unit
        )
    sigma = p.noise_multiplier
    if sigma is None:
        if p.target_epsilon is None:
            raise ValueError("a private mode needs noise-multiplier or target-epsilon")
        sigma = calibrate_noise_multiplier(p.target_epsilon, rate, rounds, delta)
    cap = p.max_epsilon if p.max_epsilon is not None else p.target_epsilon
    return PrivacyPlan(True, float(sigma), rate, delta, rounds, cap, unit=p.privacy_unit)


def accounting_rate(cfg: Config) -> float:
    """Poisson rate of the privacy unit in one round.

    * record unit, every device (or a fixed count of devices chosen
      data-independently, as Flower does): ``q`` — the device choice can be
      assumed public, and within chosen devices each record is included with
      probability ``q``; an upper bound on the true rate.
    * record unit, Poisson device sampling at rate ``p``: ``p·q`` — a record is
      included iff its device is drawn and its own coin comes up; the two draws
      are independent and the device draw stays secret (the update is
      normalised by the constant ``p·q·N``, never by the drawn devices' sizes).
    * device unit: ``p`` — each device's whole clipped contribution is
      included iff the device is drawn.
    """
    p = cfg.privacy
    if p.privacy_unit == "device":
        if p.device_sampling_rate is None:
            raise ValueError("device-sampling-rate is unset: privacy-unit=device needs it")
        return p.device_sampling_rate
    if p.device_sampling_rate is not None:
        return p.device_sampling_rate * p.sampling_rate
    return p.sampling_rate


class Budget:
    """Guards the privacy budget of one run.

    Parameters
    ----------
    plan : PrivacyPlan
    accountant : FDPAccountant, optional
        Restored accountant (from a checkpoint); a fresh one otherwise.
    """

    def __init__(self, plan: PrivacyPlan, accountant: FDPAccountant | None = None) -> None:
        self.plan = plan
        self.accountant = accountant if accountant is not None else FDPAccountant()

    def epsilon(self) -> float:
        """ε spent so far: upper bound, add/remove, at ``plan.delta``
        (``inf`` for ``nonprivate``, 0 for public-only training)."""
        if self.plan.unbounded:
            return float("inf")
        if not self.plan.private:
            return 0.0
        return self.accountant.epsilon(self.plan.delta)

    def check(self) -> None:
        """Raise :class:`PrivacyBudgetExhausted` if one more private round would
        exceed the cap. Does not change the ledger."""
        plan = self.plan
        if not plan.private or plan.max_epsilon is None:
            return
        if plan.noise_multiplier is None:
            raise ValueError("noise multiplier unresolved: this plan spends no privacy")
        if self.accountant.would_exceed(
            plan.max_epsilon, plan.delta, plan.noise_multiplier, plan.sampling_rate
        ):
            spent = self.epsilon()
            raise PrivacyBudgetExhausted(spent, plan.max_epsilon, plan.delta)

    def spend(self) -> float:
        """Compose one private round; return the new ε."""
        if self.plan.noise_multiplier is None:
            raise ValueError("noise multiplier unresolved: this plan spends no privacy")
        self.accountant.compose(self.plan.noise_multiplier, self.plan.sampling_rate)
        return self.epsilon()
