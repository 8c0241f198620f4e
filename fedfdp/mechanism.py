"""The resolved mechanism: the one object that says what a run guarantees.

:func:`resolve_mechanism` turns the configuration and the run's **public facts**
(the device sizes, hence ``N``; the model's parameter count) into a frozen
:class:`ResolvedMechanism`: the mode, the neighbouring relation, ``δ``, ``σ``, the
clipping decision (a fixed ``C``, or adaptive clipping's ``γ``, ``η`` and the count's
noise ``σ_b``), the sampling settings, the budget cap and the event every private
round is charged. Every engine (Flower, centralised), ``fedfdp compare``, the audit,
the attack, resume and the CLI's checks read it; nothing else derives ``σ``, ``q``,
``γ`` or the event. The run's ledger starts with it (:meth:`ResolvedMechanism.to_dict`)
and every checkpoint carries its :meth:`~ResolvedMechanism.digest`.

Derivation (each quantity decided once, here)
---------------------------------------------
* ``δ``: ``delta``, or ``1/(2N)``.
* the per-round event's sampling: ``(q, p)`` from the sampling plan
  (:class:`fedfdp.sampling_plan.Subsampling`: rate ``q`` for the record unit with
  participation ``p`` under Poisson device sampling, rate ``p`` for the device unit).
* ``σ_eff``, the accounted noise multiplier: ``noise-multiplier`` (times ``√(1 − r)``
  when the count of adaptive clipping takes the share ``r``), or the smallest ``σ_eff``
  whose ε after the private rounds is at most the target (:func:`calibrate`, the one
  calibrator, over the accounting's event family).
* the clipping decision: ``γ = clipping-quantile``, or under ``"auto"`` in mode
  ``fdp`` the recipe's :func:`~fedfdp.quantile_clipping.recipe_quantile` from the
  split ``(σ, σ_b)``, the parameter count and the expected batch — public quantities;
  ``γ = 0`` keeps ``C`` fixed and gives the gradient the whole ``σ_eff``.
* the event: the accounting's family at ``σ_eff`` — a
  :class:`~fedfdp.accounting.events.SubsampledGaussian` (Theorem 5; with adaptive
  clipping the gradient sum and the count released together are one Gaussian
  mechanism of multiplier ``σ_eff``, Andrew et al. 2021 Thm. 1), or for ``corrdp`` a
  :class:`~fedfdp.accounting.events.CorrDPRound` of its design.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedfdp.accounting import FDPAccountant
from fedfdp.accounting.distributed import DistributedAccountant
from fedfdp.accounting.events import PrivacyEvent, Relation, SubsampledGaussian
from fedfdp.accounting.protocol import Accountant, NoEvent, calibrate, default_delta
from fedfdp.config import Aggregation, Config, ConfigError, Mode, PrivacyUnit, PublicLoss
from fedfdp.data.private_statistics import Estimate, estimation_budget, estimation_events
from fedfdp.data.split import refuse_label_split
from fedfdp.ledger_replay import replay
from fedfdp.modes import Phase, phase_for_round
from fedfdp.quantile_clipping import diffusion_quantile, recipe_quantile, split_noise
from fedfdp.sampling_plan import SamplingSettings, Subsampling
from fedfdp.secagg.plan import SecAggPlan, secagg_event, secagg_plan

#: ``family(σ, q, p)`` → the event of one round at noise multiplier ``σ``.
EventFamily = Callable[[float, float, float], PrivacyEvent]


def _gaussian_family(sigma: float, rate: float, participation: float) -> PrivacyEvent:
    return SubsampledGaussian(sigma, rate, participation)


def _fdp_accountant() -> Accountant[Any]:
    return FDPAccountant()


@dataclass(frozen=True)
class Accounting:
    """How a run's ε is accounted and reported (a :class:`fedfdp.round_engine.ServerParts`
    component; :func:`fedfdp.run_plan.server_parts_for` picks it per mode).

    Attributes
    ----------
    relation : Relation
        The neighbouring relation named beside every ε.
    column : str
        The output column of the ε: ``epsilon``, or ``epsilon_corrdp`` — a CorrDP ε is
        never written where a DP or FDP ε is expected (the ``epsilon`` column is then
        empty).
    family : callable
        ``family(σ, q, p)`` → the event one round at noise multiplier ``σ`` releases.
    new : callable
        ``new()`` → a fresh :class:`~fedfdp.accounting.protocol.Accountant` for those events.
    resolved : mapping
        Extra values for the ``[resolved]`` table of ``config.toml``.
    text : str
        What the relation means, written beside the ε when the column is not ``epsilon``.
    estimates : tuple of Estimate
        Statistics of the data this accounting's mode released with accounted noise
        before training (CorrDP's noisy TVs), charged like the data's own estimates
        (:attr:`ResolvedMechanism.estimates`); the accountant must compose their events.
    """

    relation: Relation = Relation.ADD_REMOVE
    column: str = "epsilon"
    family: EventFamily = _gaussian_family
    new: Callable[[], Accountant[Any]] = _fdp_accountant
    resolved: Mapping[str, Any] = field(default_factory=dict)
    text: str = ""
    estimates: tuple[Estimate, ...] = ()

    def columns(self, epsilon: float) -> dict[str, Any]:
        """The ε columns of an output row (``epsilon`` empty when another column holds
        it, with the relation spelled out in ``relation_text``).
        """
        if self.column == "epsilon":
            return {"epsilon": epsilon}
        return {"epsilon": float("nan"), self.column: epsilon, "relation_text": self.text}


#: The accounting of DP and FDP runs (add/remove, Theorem 5).
FDP_ACCOUNTING = Accounting()


def _distributed_accountant() -> Accountant[Any]:
    return DistributedAccountant()


#: The accounting of ``aggregation = "secagg"`` (add/remove): every private round a
#: :class:`~fedfdp.accounting.distributed.DistributedDiscreteGaussian`, ε the smaller of
#: routes A and B (``docs/secagg_accounting.md``). ``σ`` is calibrated over the secure
#: aggregation plan's own event family (:func:`resolve_mechanism`); this accounting's
#: ``family`` is never used.
DISTRIBUTED_ACCOUNTING = Accounting(new=_distributed_accountant, resolved={"aggregation": "secagg"})


def run_accounting(cfg: Config, accounting: Accounting = FDP_ACCOUNTING) -> Accounting:
    """The accounting a run uses: :data:`DISTRIBUTED_ACCOUNTING` under
    ``aggregation = "secagg"`` in place of the add/remove one, else ``accounting``.
    """
    if cfg.privacy.aggregation is Aggregation.SECAGG and accounting.relation is Relation.ADD_REMOVE:
        return DISTRIBUTED_ACCOUNTING
    return accounting


@dataclass(frozen=True)
class PublicFacts:
    """What a mechanism is resolved over besides the configuration: public by
    definition (the FDP paper discloses dataset and batch sizes; the model is public).

    Attributes
    ----------
    device_sizes : tuple of int
        Training records per device, in device order (``N`` is their sum).
    num_params : int
        Trainable parameters of the model (the recipe's ``d``).
    """

    device_sizes: tuple[int, ...]
    num_params: int

    def __post_init__(self) -> None:
        sizes = tuple(int(s) for s in self.device_sizes)
        if not sizes or min(sizes) < 0 or sum(sizes) < 1:
            raise ValueError(f"device sizes {list(sizes)[:8]}: the dataset has no training records")
        if isinstance(self.num_params, bool) or not isinstance(self.num_params, int) or self.num_params < 1:
            raise ValueError(f"num_params={self.num_params!r}: the model has no trainable parameter")
        object.__setattr__(self, "device_sizes", sizes)

    @property
    def num_records(self) -> int:
        """``N``."""
        return sum(self.device_sizes)

    @property
    def num_devices(self) -> int:
        """The number of devices."""
        return len(self.device_sizes)


@dataclass(frozen=True)
class Clipping:
    """The clipping decision of a run.

    Attributes
    ----------
    norm : float
        ``C`` of the first private round (the sensitivity of one unit's contribution).
    quantile : float
        ``γ`` of adaptive clipping; 0: ``C`` stays fixed.
    learning_rate : float
        ``η`` of the geometric update of ``C``.
    count_noise : float or None
        ``σ_b``: the std of the noise on the count of vectors within ``C``
        (sensitivity 1); None with a fixed ``C`` (no count is released).
    """

    norm: float
    quantile: float = 0.0
    learning_rate: float = 0.0
    count_noise: float | None = None

    @property
    def adaptive(self) -> bool:
        """Whether ``C`` adapts (``quantile > 0``)."""
        return self.quantile > 0


@dataclass(frozen=True)
class ResolvedMechanism:
    """Everything that defines a run's guarantee, resolved once (module docstring).

    Attributes
    ----------
    mode : str
        The training mode (its phases: :func:`fedfdp.modes.phase_for_round`).
    relation : Relation
        The relation of every reported ε.
    column : str
        The output column of the ε.
    private : bool
        Whether any round spends ε.
    unbounded : bool
        ``nonprivate``: private data used without noise, ε = ∞.
    delta : float
    noise_multiplier : float or None
        ``σ`` of the gradient sum (noise std ``σC``).
    accounted_noise_multiplier : float or None
        ``σ_eff``: what the event carries (``σ`` itself with a fixed ``C``).
    clipping : Clipping
    sampling : SamplingSettings
        Rates, unit, node choice and public batch (:mod:`fedfdp.sampling_plan`).
    subsampling : Subsampling
        ``(q, p)`` of the accounted event, as the sampling plan names it.
    event : PrivacyEvent or None
        The event one private round is charged (None when nothing is charged).
    num_rounds, public_pretrain_rounds, private_rounds : int
    max_epsilon : float or None
        The cap: a round that would take ε above it is refused.
    target_epsilon : float or None
        The ε calibrated to (None when σ was given).
    num_records, num_devices, num_params : int
        The public facts.
    unit : str
        ``record`` or ``device``.
    public_view : str
        The public view (``public-loss``).
    reproducible_noise : bool
        Whether secret randomness derives from the seed (every output says so).
    estimates : tuple of Estimate
        The charges of ``private-statistics = "estimate"`` (one Gaussian histogram per
        estimated column, :mod:`fedfdp.data.private_statistics`): written to the ledger
        right after this mechanism, before any round, composed with the rounds by the
        accountant (so in every printed ε) and in the calibration of a target ε.
    secagg : SecAggPlan or None
        ``aggregation = "secagg"``: ``σ_loc``, ``s``, ``d``, ``n_min``, ``t_c``, ``k``, ``t``
        (:mod:`fedfdp.secagg.plan`); the event is then charged for ``n_min − t_c``
        honest parties. None: a trusted server adds the noise.
    """

    mode: Mode
    relation: Relation
    column: str
    private: bool
    unbounded: bool
    delta: float
    noise_multiplier: float | None
    accounted_noise_multiplier: float | None
    clipping: Clipping
    sampling: SamplingSettings
    subsampling: Subsampling
    event: PrivacyEvent | None
    num_rounds: int
    public_pretrain_rounds: int
    private_rounds: int
    max_epsilon: float | None
    target_epsilon: float | None
    num_records: int
    num_devices: int
    num_params: int
    unit: PrivacyUnit
    public_view: PublicLoss
    reproducible_noise: bool
    secagg: SecAggPlan | None = None
    estimates: tuple[Estimate, ...] = ()

    # -- the names the plan had (read by engines, reports and tests) --
    @property
    def sampling_rate(self) -> float:
        """``q`` of the accounted event (``p`` for the device unit)."""
        return self.subsampling.rate

    @property
    def participation(self) -> float:
        """``p`` of the accounted event."""
        return self.subsampling.participation

    @property
    def count_noise(self) -> float | None:
        """``σ_b`` of adaptive clipping (:attr:`Clipping.count_noise`)."""
        return self.clipping.count_noise

    def phase(self, round_: int) -> Phase:
        """What round ``round_`` computes."""
        return phase_for_round(self.mode, self.public_pretrain_rounds, round_)

    def expected_batch(self) -> float:
        """``E[batch]`` of a private round over every unit (records, or devices for the
        device unit): ``q·p`` times the units.
        """
        units = self.num_devices if self.unit is PrivacyUnit.DEVICE else self.num_records
        return self.sampling_rate * self.participation * units

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (the ledger's first entry)."""
        return {
            "mode": str(self.mode),
            "relation": str(self.relation),
            "column": self.column,
            "private": self.private,
            "unbounded": self.unbounded,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "accounted_noise_multiplier": self.accounted_noise_multiplier,
            "clipping": {"norm": self.clipping.norm, "quantile": self.clipping.quantile,
                         "learning_rate": self.clipping.learning_rate,
                         "count_noise": self.clipping.count_noise},
            "sampling": {"sampling_rate": self.sampling.sampling_rate,
                         "device_sampling_rate": self.sampling.device_sampling_rate,
                         "unit": str(self.sampling.unit), "nodes_per_round": self.sampling.nodes_per_round,
                         "public_batch_size": self.sampling.public_batch_size},
            "event": self.event.to_dict() if self.event is not None else None,
            "num_rounds": self.num_rounds,
            "public_pretrain_rounds": self.public_pretrain_rounds,
            "private_rounds": self.private_rounds,
            "max_epsilon": self.max_epsilon,
            "target_epsilon": self.target_epsilon,
            "num_records": self.num_records,
            "num_devices": self.num_devices,
            "num_params": self.num_params,
            "unit": str(self.unit),
            "public_view": str(self.public_view),
            "reproducible_noise": self.reproducible_noise,
            # only under secure aggregation (a plain run's digest is unchanged)
            **({"secagg": self.secagg.to_dict()} if self.secagg is not None else {}),
            # only with private-statistics = "estimate" (a run without estimates keeps its digest)
            **({"estimates": [{"statistic": e.statistic, "event": e.event.to_dict()} for e in self.estimates]}
               if self.estimates else {}),
        }

    def digest(self) -> str:
        """SHA-256 of :meth:`to_dict` in canonical JSON."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()


def canonical_json(doc: Any) -> str:
    """``doc`` as canonical JSON (sorted keys, no spaces): what digests are taken of."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def run_delta(cfg: Config, num_records: int) -> float:
    """δ of a run: ``delta``, or ``1/(2N)`` when unset (the accounting's one default,
    :func:`fedfdp.accounting.protocol.default_delta`).
    """
    return cfg.privacy.delta if cfg.privacy.delta is not None else default_delta(num_records)


def tv_estimation_delta(cfg: Config, num_records: int) -> float:
    """The share of δ a CorrDP run's in-sample TV estimate spends (CorrDP paper, Theorem
    3.11): ``tv-delta``, or half the run's δ (:func:`run_delta`) when unset.
    """
    p = cfg.privacy
    return p.tv_delta if p.tv_delta is not None else run_delta(cfg, num_records) / 2


def sampling_settings(cfg: Config) -> SamplingSettings:
    """The sampling settings of ``cfg`` (what the sampling plan is built from)."""
    p = cfg.privacy
    return SamplingSettings(
        sampling_rate=p.sampling_rate,
        device_sampling_rate=p.device_sampling_rate,
        unit=p.privacy_unit,
        nodes_per_round=p.clients_per_round,
        public_batch_size=p.public_batch_size,
    )




def resolve_mechanism(
    cfg: Config,
    facts: PublicFacts,
    *,
    accounting: Accounting = FDP_ACCOUNTING,
    subsampling: Subsampling | None = None,
) -> ResolvedMechanism:
    """The resolved mechanism of ``cfg`` over ``facts`` (module docstring): the one
    place ``σ``, ``δ``, the clipping decision, the cap and the event are derived.

    Parameters
    ----------
    accounting : Accounting
        The relation, the event family and the accountant (default: add/remove,
        :class:`~fedfdp.accounting.events.SubsampledGaussian`); ``mode = "corrdp"``
        needs the CorrDP accounting of its data (:func:`fedfdp.run_plan.server_parts_for`).
    subsampling : Subsampling, optional
        ``(q, p)`` of the accounted event as the run's sampling plan names it
        (default: the configuration's, :meth:`SamplingSettings.subsampling`).

    Raises
    ------
    ConfigError
        A target ε that no noise multiplier reaches, or ``corrdp`` with another accounting.

    Examples
    --------
    >>> from fedfdp import Config, PrivacyConfig
    >>> cfg = Config(privacy=PrivacyConfig(mode="dp", noise_multiplier=1.0))
    >>> m = resolve_mechanism(cfg, PublicFacts((100, 100), num_params=10))
    >>> m.event, m.delta
    (SubsampledGaussian(noise_multiplier=1.0, sampling_rate=0.05, participation=1.0), 0.0025)
    """
    p = cfg.privacy
    accounting = run_accounting(cfg, accounting)
    if (p.mode is Mode.CORRDP) != (accounting.relation is Relation.CORRDP):
        raise ConfigError(
            f"mode={str(p.mode)!r} with the {str(accounting.relation)!r} accounting: mode 'corrdp' "
            "(and only it) is accounted by the CorrDP accountant of its data "
            "(fedfdp.run_plan.server_parts_for(cfg, data))"
        )
    refuse_label_split(p, cfg.data)  # a private label: no split or hold-out may have read it
    settings = sampling_settings(cfg)
    sub = subsampling if subsampling is not None else settings.subsampling
    delta = run_delta(cfg, facts.num_records)
    rounds = p.num_rounds - p.public_pretrain_rounds
    own_estimates = estimation_events(cfg.data, facts.num_records)
    if own_estimates and accounting.relation is Relation.CORRDP:
        raise ConfigError(
            f"private-statistics='estimate' (columns {[e.statistic for e in own_estimates]}): the CorrDP "
            "accountant does not compose the estimates with training (mode='corrdp'); declare private-ranges"
        )
    estimates = (*own_estimates, *accounting.estimates)

    def build(**specific: Any) -> ResolvedMechanism:
        return ResolvedMechanism(
            mode=p.mode, relation=accounting.relation, column=accounting.column, delta=delta,
            sampling=settings, subsampling=sub, num_rounds=p.num_rounds,
            public_pretrain_rounds=p.public_pretrain_rounds, num_records=facts.num_records,
            num_devices=facts.num_devices, num_params=facts.num_params, unit=p.privacy_unit,
            public_view=p.public_loss, reproducible_noise=p.reproducible_noise, estimates=estimates,
            **specific,
        )

    if not p.is_private:
        return build(
            private=False, unbounded=p.mode is Mode.NONPRIVATE, noise_multiplier=None,
            accounted_noise_multiplier=None, clipping=Clipping(p.clipping_norm), event=None,
            private_rounds=0, max_epsilon=None, target_epsilon=None,
        )
    units = facts.num_devices if p.privacy_unit is PrivacyUnit.DEVICE else facts.num_records
    expected = sub.rate * sub.participation * units
    if expected < 1.0:
        device = p.privacy_unit is PrivacyUnit.DEVICE
        what, key, rate = ("devices", "device-sampling-rate", p.device_sampling_rate) if device else (
            "records", "sampling-rate", p.sampling_rate)
        raise ConfigError(
            f"{key}={rate:g}: the expected private batch is {expected:.3g} {what} (< 1); "
            "the noisy sum would be divided by it, amplifying the noise: raise the rate or use more data"
        )
    target = p.calibration_target  # None when σ is given
    share = p.clipping_budget_share
    adaptive = p.adaptive_clipping

    def family(sigma: float) -> PrivacyEvent:
        return accounting.family(sigma, sub.rate, sub.participation)

    if accounting is DISTRIBUTED_ACCOUNTING:  # σ calibrated centrally, then σ_loc (fedfdp.secagg.plan)
        return _resolve_secagg(cfg, facts, build, sub, delta, rounds, estimates)

    given = p.noise_multiplier  # σ of the gradient when configured (then target is None)
    if given is not None:
        accounted = given * math.sqrt(1 - share) if adaptive else given  # the count adds its share on top
    elif target is None:  # pragma: no cover - a target exists whenever σ is unset
        raise ConfigError("noise-multiplier and target-epsilon are both unset")
    else:
        def new() -> Accountant[Any]:  # the estimates first: training gets what their composition leaves
            return replay([e.event for e in estimates], accounting.new)

        try:
            accounted = calibrate(new, family, target_epsilon=target, rounds=rounds, delta=delta)
        except ValueError as exc:
            spent = (f" (the estimates of private-statistics='estimate' alone: estimation-epsilon="
                     f"{estimation_budget(cfg.data):.3g} at δ = {delta:.3g})" if own_estimates else "")
            raise ConfigError(f"{_naming_target(target, exc)}{spent}") from None
    clipping = Clipping(p.clipping_norm)
    sigma = accounted
    if adaptive:
        split_sigma, count_noise = split_noise(accounted, share)
        if p.clipping_quantile is not None:
            gamma = float(p.clipping_quantile)
        elif cfg.training.model == "ddpm":  # the private norms' mass sits in their tail (docs/images.md)
            gamma = diffusion_quantile(count_noise, expected)
        else:
            gamma = recipe_quantile(split_sigma, count_noise, facts.num_params, expected)
        if gamma > 0:
            sigma = split_sigma
            clipping = Clipping(p.clipping_norm, gamma, p.clipping_learning_rate, count_noise)
        else:  # the recipe keeps C fixed: no count is released, the gradient gets the whole σ_eff
            sigma = accounted = float(given) if given is not None else accounted
    cap = p.epsilon_cap
    return build(
        private=True, unbounded=False, noise_multiplier=float(sigma),
        accounted_noise_multiplier=float(accounted),
        clipping=clipping, event=family(float(accounted)), private_rounds=rounds, max_epsilon=cap,
        target_epsilon=target,
    )


def _naming_target(target: float, exc: ValueError) -> str:
    """A calibration failure naming ``target-epsilon`` once (the calibration's own
    message may already start with it).
    """
    text = str(exc)
    return text if text.startswith("target-epsilon=") else f"target-epsilon={target}: {text}"


def _resolve_secagg(cfg: Config, facts: PublicFacts, build: Callable[..., ResolvedMechanism],
                    sub: Subsampling, delta: float, rounds: int,
                    estimates: tuple[Estimate, ...] = ()) -> ResolvedMechanism:
    """``aggregation = "secagg"``: σ (given, or calibrated to the target), a fixed ``C``, the
    plan of :func:`fedfdp.secagg.plan.secagg_plan` and its event at ``n_min − t_c``. A target
    is met by :func:`calibrate` over the distributed accountant's route A (an upper bound of
    the printed ε, the smaller of routes A and B) and the event family
    ``σ ↦ secagg_event(secagg_plan(σ, …), q)``: route A's ``2Λ`` and ``δe^{−Λ}`` are part of
    the ε calibrated (below the σ where ``σ_loc`` reaches its minimum the family has no event).
    The ``estimates`` (``private-statistics = "estimate"``, released once before training by
    the party holding the table) are composed first, as in the trusted-server path: training
    gets what their composition leaves (:mod:`fedfdp.accounting.distributed`).
    """
    p = cfg.privacy
    if sub.participation != 1.0:
        raise ConfigError(f"device-sampling-rate={p.device_sampling_rate}: aggregation='secagg' credits no "
                          "participation below 1 (the server draws the devices)")
    target = p.calibration_target

    def planned(sig: float) -> tuple[SecAggPlan, PrivacyEvent]:
        try:
            plan = secagg_plan(
                sig, dimension=facts.num_params, num_records=facts.num_records, max_parties=facts.num_devices,
                min_survivors=int(p.secagg_min_survivors or 0), colluders=p.secagg_colluders,
                neighbours=p.secagg_neighbours, threshold=p.secagg_threshold, scale=p.secagg_scale,
            )
            return plan, secagg_event(plan, sub.rate)
        except NoEvent:
            raise  # σ_loc below its minimum: no event at this σ (the calibration searches above it)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    if p.noise_multiplier is not None:
        sigma = float(p.noise_multiplier)
    elif target is None:  # pragma: no cover - a target exists whenever σ is unset
        raise ConfigError("noise-multiplier and target-epsilon are both unset")
    else:
        def route_a() -> Accountant[Any]:  # min(route A, route B) <= route A: never above the target
            return replay([e.event for e in estimates], lambda: DistributedAccountant(route_b=False))

        try:
            sigma = calibrate(route_a, lambda s: planned(s)[1], target_epsilon=target, rounds=rounds,
                              delta=delta)
        except ConfigError:
            raise  # the plan's refusal
        except NoEvent as exc:  # the target is met only below the σ the plan accounts
            raise ConfigError(str(exc)) from None
        except ValueError as exc:
            raise ConfigError(_naming_target(target, exc)) from None
    try:
        plan, event = planned(sigma)
    except NoEvent as exc:
        raise ConfigError(str(exc)) from None
    return build(
        private=True, unbounded=False, noise_multiplier=sigma, accounted_noise_multiplier=sigma,
        clipping=Clipping(p.clipping_norm), event=event, private_rounds=rounds, max_epsilon=p.epsilon_cap,
        target_epsilon=target, secagg=plan,
    )
