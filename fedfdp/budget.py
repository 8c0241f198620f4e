"""From a configuration to a privacy plan, and the per-run budget guard.

:func:`plan_privacy` resolves the privacy-defining numbers of a run once, from
the configuration and the (public) number of training records ``N``:
``δ`` (default ``1/(2N)``), the noise multiplier ``σ`` (given, or calibrated
so that the run's private rounds end at, never above, ``target-epsilon``) and
the budget cap (``max-epsilon``, defaulting to the target).

:class:`Budget` wraps the accountant for a run: before each private round it
asks, without mutating, whether composing that round would exceed the cap,
and refuses it with :class:`~fedfdp.accounting.PrivacyBudgetExhausted`; then it
composes the round's event — the one the sampling plan names
(:attr:`fedfdp.sampling_plan.SamplingSettings.event`): a Poisson-subsampled
Gaussian (Theorem 5), touching the privacy unit with the plan's participation.
Every ε it reports is the **upper** end of the accountant's interval, for the
**add/remove** relation (Def. 6) at the plan's δ — or, for ``mode = "corrdp"``,
for the relation its :class:`Accounting` names (``"corrdp"``, reported in the
column ``epsilon_corrdp``: :mod:`fedfdp.corrdp.run`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fedfdp.accounting import FDPAccountant, PrivacyBudgetExhausted, calibrate_noise_multiplier
from fedfdp.config import Config, ConfigError
from fedfdp.quantile_clipping import recipe_quantile, split_noise
from fedfdp.sampling_plan import AccountedEvent, SamplingSettings


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
        Poisson rate of the accounted event (:mod:`fedfdp.sampling_plan`):
        ``q`` for the record unit, ``p`` for the device unit.
    delta : float
    private_rounds : int
        Rounds that compose a privacy event.
    max_epsilon : float or None
        Refuse any round that would take ε above this.
    relation : str
        Neighbouring relation of every reported ε: ``add-remove`` (``corrdp`` for
        ``mode = "corrdp"``).
    unbounded : bool
        True for ``nonprivate``: private data is used without noise, ε = ∞.
    unit : str
        ``record`` or ``device``.
    participation : float
        Probability that a round touches the privacy unit at all (record unit
        with Poisson device sampling at ``p``: ``p``; otherwise 1).
    count_noise : float or None
        Adaptive clipping: the standard deviation ``σ_b`` of the noise on the
        count of clipped vectors within ``C`` (sensitivity 1, so ``σ_b`` is
        also its multiplier); None with a fixed ``C``.
    accounted_noise_multiplier : float or None
        What the accountant is charged per round: ``σ`` itself, or with adaptive
        clipping ``σ_eff = (σ⁻² + σ_b⁻²)^(−1/2)`` — the gradient sum (sensitivity
        ``C``, noise ``σC``) and the count (sensitivity 1, noise ``σ_b``)
        released together are one Gaussian mechanism of that multiplier
        (Andrew et al. 2021, Thm. 1).
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
    participation: float = 1.0
    count_noise: float | None = None
    accounted_noise_multiplier: float | None = None

    def __post_init__(self) -> None:
        if self.accounted_noise_multiplier is None and self.noise_multiplier is not None:
            object.__setattr__(self, "accounted_noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class Accounting:
    """How a run's ε is accounted and reported (a :class:`fedfdp.server.ServerParts` component).

    Attributes
    ----------
    relation : str
        The neighbouring relation named beside every ε (``add-remove``; ``corrdp``).
    column : str
        The output column of the ε: ``epsilon``, or ``epsilon_corrdp`` — a CorrDP ε
        is never written where a DP or FDP ε is expected (the ``epsilon`` column is
        then empty).
    new : callable
        ``new()`` → a fresh accountant with :class:`~fedfdp.accounting.FDPAccountant`'s
        run interface: ``compose(σ, q, count, participation=)``, ``epsilon(δ)``,
        ``would_exceed(cap, δ, σ, q, participation=)``, ``state_dict()`` (with the
        charges under ``"ledger"``), ``load_state_dict()``.
    calibrate : callable
        ``calibrate(target ε, q, rounds, δ, participation=p)`` → the smallest σ whose ε
        is at most the target.
    resolved : mapping
        Extra values for the ``[resolved]`` table of ``config.toml``.
    text : str
        What the relation means, written beside the ε (``relation_text``) when the
        column is not ``epsilon``.
    """

    relation: str = "add-remove"
    column: str = "epsilon"
    new: Callable[[], Any] = FDPAccountant
    calibrate: Callable[..., float] = calibrate_noise_multiplier
    resolved: Mapping[str, Any] = field(default_factory=dict)
    text: str = ""

    def columns(self, epsilon: float) -> dict[str, Any]:
        """The ε columns of an output row (``epsilon`` empty when another column holds
        it, with the relation spelled out in ``relation_text``)."""
        if self.column == "epsilon":
            return {"epsilon": epsilon}
        return {"epsilon": float("nan"), self.column: epsilon, "relation_text": self.text}


#: The accounting of DP and FDP runs (add/remove, Theorem 5).
FDP_ACCOUNTING = Accounting()


def run_delta(cfg: Config, num_records: int) -> float:
    """δ of a run: ``delta``, or ``1/(2N)`` when unset."""
    return cfg.privacy.delta if cfg.privacy.delta is not None else 1.0 / (2 * num_records)


def sampling_settings(cfg: Config) -> SamplingSettings:
    """The sampling settings of ``cfg`` (what the sampling plan is built from)."""
    p = cfg.privacy
    return SamplingSettings(
        sampling_rate=p.sampling_rate,
        device_sampling_rate=p.device_sampling_rate,
        unit=p.privacy_unit,
        nodes_per_round=cfg.privacy.clients_per_round,
        public_batch_size=p.public_batch_size,
    )


def plan_privacy(
    cfg: Config, num_records: int, event: AccountedEvent | None = None, accounting: Accounting | None = None
) -> PrivacyPlan:
    """Resolve σ, δ and the cap for ``cfg`` over ``num_records`` training records.

    The accounted event per private round comes from the sampling plan
    (``event``; default: the one :func:`sampling_settings` of ``cfg`` names,
    :mod:`fedfdp.sampling_plan`); σ is calibrated for that event by
    ``accounting`` (default :data:`FDP_ACCOUNTING`; ``mode = "corrdp"`` needs the
    CorrDP accounting of its data, :func:`fedfdp.parts.server_parts_for`). With
    adaptive clipping the accounted multiplier ``σ_eff`` is calibrated and split
    between the gradient and the count of vectors within ``C`` by
    ``clipping-budget-share`` (:func:`fedfdp.quantile_clipping.split_noise`).
    """
    if num_records < 1:
        raise ValueError(f"num_records={num_records}: the dataset has no training records")
    p = cfg.privacy
    accounting = accounting if accounting is not None else FDP_ACCOUNTING
    if (p.mode == "corrdp") != (accounting.relation == "corrdp"):
        raise ConfigError(
            f"mode={p.mode!r} with the {accounting.relation!r} accounting: mode 'corrdp' (and only it) is "
            "accounted by the CorrDP accountant of its data (fedfdp.parts.server_parts_for(cfg, data))"
        )
    delta = run_delta(cfg, num_records)
    rounds = cfg.privacy.num_rounds - p.public_pretrain_rounds
    event = event if event is not None else sampling_settings(cfg).event
    rate, share = event.sampling_rate, event.participation
    if not p.is_private:
        return PrivacyPlan(
            False, None, rate, delta, 0, None, unbounded=p.mode == "nonprivate", unit=p.privacy_unit,
            participation=share,
        )
    sigma = p.noise_multiplier
    if sigma is None:
        if p.target_epsilon is None:
            raise ValueError("a private mode needs noise-multiplier or target-epsilon")
        sigma = accounted = accounting.calibrate(p.target_epsilon, rate, rounds, delta, participation=share)
    else:
        # a given σ is the gradient's; the count adds its share on top
        accounted = sigma * math.sqrt(1 - p.clipping_budget_share) if p.adaptive_clipping else sigma
    count_noise = None
    if p.adaptive_clipping:
        sigma, count_noise = split_noise(accounted, p.clipping_budget_share)
    cap = p.max_epsilon if p.max_epsilon is not None else p.target_epsilon
    return PrivacyPlan(True, float(sigma), rate, delta, rounds, cap, relation=accounting.relation,
                       unit=p.privacy_unit, participation=share, count_noise=count_noise,
                       accounted_noise_multiplier=float(accounted))


def plan_with_clipping(
    cfg: Config, num_records: int, num_params: int, num_devices: int, event: AccountedEvent | None = None,
    accounting: Accounting | None = None,
) -> tuple[PrivacyPlan, float]:
    """The plan of :func:`plan_privacy` and ``γ`` of adaptive clipping (0: a fixed ``C``),
    decided once for every engine (the server, ``fedfdp compare``'s checks).

    ``γ`` is ``clipping-quantile`` when set, else (``"auto"``) the ``fdp`` recipe's
    :func:`~fedfdp.quantile_clipping.recipe_quantile` from the split plan's σ and
    ``σ_b``, the model's ``num_params`` and the expected batch ``q·participation``
    times the units (records, or ``num_devices`` for the device unit): public
    quantities only. When it resolves to a fixed ``C`` no count is released, and
    the plan is made again without the split (the gradient gets the whole budget:
    ``σ = σ_eff``, the same ε).
    """
    plan = plan_privacy(cfg, num_records, event=event, accounting=accounting)
    p = cfg.privacy
    if plan.count_noise is None or plan.noise_multiplier is None:
        return plan, 0.0
    if p.clipping_quantile is not None:
        return plan, float(p.clipping_quantile)
    units = num_devices if plan.unit == "device" else num_records
    expected = plan.sampling_rate * plan.participation * units
    gamma = recipe_quantile(plan.noise_multiplier, plan.count_noise, num_params, expected)
    if gamma == 0.0:
        fixed = replace(cfg, privacy=replace(p, clipping_quantile=0.0))
        plan = plan_privacy(fixed, num_records, event=event, accounting=accounting)
    return plan, gamma


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
            plan.max_epsilon, plan.delta, plan.accounted_noise_multiplier, plan.sampling_rate,
            participation=plan.participation,
        ):
            spent = self.epsilon()
            raise PrivacyBudgetExhausted(spent, plan.max_epsilon, plan.delta)

    def spend(self) -> float:
        """Compose one private round; return the new ε."""
        if self.plan.noise_multiplier is None:
            raise ValueError("noise multiplier unresolved: this plan spends no privacy")
        plan = self.plan
        self.accountant.compose(
            plan.accounted_noise_multiplier, plan.sampling_rate, participation=plan.participation
        )
        return self.epsilon()
