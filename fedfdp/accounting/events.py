"""The one vocabulary of privacy events: what a private round releases, in full.

Every charge a run makes, every calibration and every ledger entry is one of these
immutable events; the accountants (:mod:`fedfdp.accounting.protocol`) compose them.
Like dp-accounting's ``DpEvent``, an event documents the mechanism completely: a
ledger of events can be re-accounted without the configuration, the data or the
code that produced it (``fedfdp account --run``).

===========================  ========================================================
event                        mechanism of one round (dominating pair, in units of the
                             sensitivity)
===========================  ========================================================
:class:`SubsampledGaussian`  Poisson-subsampled Gaussian (FDP paper, Theorem 5):
                             ``P = N(0, σ²)``, ``Q = (1−q) N(0, σ²) + q N(1, σ²)``;
                             with participation ``p < 1`` the mixture "with
                             probability ``p`` that pair, else ``(P, P)``", the draw
                             known to the adversary (Poisson device sampling)
:class:`CorrDPRound`         one round of CorrDP-SGD (CorrDP paper, Algorithm 1,
                             Eq. (3)): per class of neighbour a Gaussian pair of
                             noise multiplier ``1/μ_c`` with weight ``d_c``, and the
                             whole-record shift ``M`` (``fedfdp.corrdp.accounting``)
``ThresholdedHistogram``     a Gaussian histogram over the values the data holds,
                             released only where the noisy count clears ``τ``: the
                             Gaussian pair ``N(0, σ²)`` vs ``N(1, σ²)`` except, with
                             probability ``δ_t``, a value held by one record only
                             (:class:`ThresholdedHistogram`; composed by the FDP
                             accountant, which takes ``δ_t`` off the ``δ`` it reports at)
``DistributedDiscrete...``   one round of secure aggregation where each of ``n_h``
                             honest parties adds ``N_Z(0, σ_loc²)``
                             (:class:`DistributedDiscreteGaussian`: sensitivity
                             ``Δ = s + √d``, dominated within ``e^{±Λ_r}`` by the
                             subsampled Gaussian of ``σ_eff``; the lemmas in
                             :mod:`fedfdp.accounting.discrete_gaussian_bounds`, the
                             accounts in :mod:`fedfdp.accounting.distributed`)
===========================  ========================================================

Events are plain data: they import only the number checks (:mod:`fedfdp.validate`)
and the discrete Gaussian's bounds (numpy), nothing above them, validate on
construction (``ValueError`` naming the field), and round-trip through JSON
(:meth:`PrivacyEvent.to_dict`, :func:`event_from_dict`), so the ledger stores events,
not tuples.

Examples
--------
>>> from fedfdp.accounting.events import SubsampledGaussian, event_from_dict
>>> ev = SubsampledGaussian(noise_multiplier=1.2, sampling_rate=0.05, participation=0.2)
>>> event_from_dict(ev.to_dict()) == ev
True
>>> SubsampledGaussian(noise_multiplier=1.0, sampling_rate=1.5)
Traceback (most recent call last):
...
ValueError: sampling_rate=1.5: must be in (0, 1]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, assert_never

from fedfdp.accounting.discrete_gaussian_bounds import (
    MAX_SLACK,
    MIN_LOCAL_SIGMA,
    SMOOTHING,
    sensitivity,
    smoothing_divergence_bound,
    sum_divergence_bound,
)
from fedfdp.validate import count, finite, positive, rate, real, unit


class EventKind(StrEnum):
    """The kinds of privacy event (the ``kind`` field of a serialised event)."""

    def __repr__(self) -> str:
        return repr(self.value)

    SUBSAMPLED_GAUSSIAN = "subsampled-gaussian"
    THRESHOLDED_HISTOGRAM = "thresholded-histogram"
    CORRDP_ROUND = "corrdp-round"
    DISTRIBUTED_DISCRETE_GAUSSIAN = "distributed-discrete-gaussian"


class Relation(StrEnum):
    """Neighbouring relations an ε is stated for.

    ``ADD_REMOVE``: FDP paper Definition 6 (one record added or removed, only its Ψ
    known to the simulator; the headline number). ``REPLACEMENT``: Definition 5 (one
    record replaced by another with the same Ψ), by Proposition 1. ``CORRDP``: the
    CorrDP relation (one record's sensitive features, or one insensitive feature,
    replaced; labels fixed) — a CorrDP ε is never a DP or FDP ε.
    """

    ADD_REMOVE = "add-remove"
    REPLACEMENT = "replacement"
    CORRDP = "corrdp"

    def __repr__(self) -> str:  # the literal, as in the configuration's messages
        return repr(self.value)


@dataclass(frozen=True)
class PrivacyEvent:
    """Base of every privacy event (abstract: use a subclass).

    Subclasses set :attr:`kind`, validate their fields in ``__post_init__`` and
    serialise with :meth:`to_dict`.
    """

    kind: ClassVar[EventKind]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable mapping with ``kind`` and every field."""
        raise NotImplementedError


@dataclass(frozen=True)
class SubsampledGaussian(PrivacyEvent):
    """One round of the Poisson-subsampled Gaussian mechanism (FDP paper, Theorem 5).

    The private sum of per-unit contributions clipped to L2 norm ``C`` (add/remove
    sensitivity ``C``) over a Poisson sample of rate ``q``, plus ``N(0, σ²C²I)``.
    Dominating pair in units of ``C``: ``P = N(0, σ²)``,
    ``Q = (1 − q) N(0, σ²) + q N(1, σ²)``. With ``participation`` ``p < 1`` the round
    touches the unit only with probability ``p``, and the adversary may know whether it
    did (a record's device-mates reveal its device's draw): the pair is then the
    mixture "with probability ``p`` Theorem 5's pair, else ``(P, P)``" — **not** rate
    ``p·q``.

    Attributes
    ----------
    noise_multiplier : float
        ``σ``: noise std over sensitivity; finite, > 0.
    sampling_rate : float
        ``q`` in ``(0, 1]``: probability that the unit joins the private sample given
        that the round touches it.
    participation : float
        ``p`` in ``(0, 1]`` (default 1: the plain subsampled Gaussian).

    Examples
    --------
    >>> from fedfdp import FDPAccountant, SubsampledGaussian
    >>> round_ = SubsampledGaussian(noise_multiplier=1.0, sampling_rate=0.05)
    >>> acc = FDPAccountant()
    >>> acc.compose(round_, 100)                   # 100 rounds
    >>> round(acc.epsilon(1e-5), 2)                # add/remove, upper bound
    3.55
    >>> round_.to_dict()["kind"]
    'subsampled-gaussian'
    """

    kind: ClassVar[EventKind] = EventKind.SUBSAMPLED_GAUSSIAN
    noise_multiplier: float
    sampling_rate: float
    participation: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", positive("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "sampling_rate", rate("sampling_rate", self.sampling_rate))
        object.__setattr__(self, "participation", rate("participation", self.participation))

    def to_dict(self) -> dict[str, Any]:
        """``kind``, ``noise_multiplier``, ``sampling_rate`` and ``participation``."""
        return {
            "kind": str(self.kind),
            "noise_multiplier": self.noise_multiplier,
            "sampling_rate": self.sampling_rate,
            "participation": self.participation,
        }


@dataclass(frozen=True)
class ThresholdedHistogram(PrivacyEvent):
    """A Gaussian histogram over the values present in the data, released where the
    noisy count clears a threshold (private categories: ``private-statistics =
    "estimate"`` on a text column, :mod:`fedfdp.data.private_statistics`).

    Mechanism: count the records of every value the data holds, add ``N(0, σ²)`` to
    each count, release the values whose noisy count exceeds
    ``τ = 1 + σ Φ⁻¹(1 − δ_t)`` (:meth:`threshold`), so that a value held by one record
    only is released with probability exactly ``δ_t``.

    Sensitivity and relation. Add/remove (FDP paper Definition 6): one record changes
    one count by 1. If its value is held by other records too, the key set is the same
    on both sides and the release is a post-processing of the Gaussian mechanism of L2
    sensitivity 1: dominating pair ``P = N(0, σ²)``, ``Q = N(1, σ²)`` (this event's
    Gaussian part, :meth:`gaussian`, i.e. ``SubsampledGaussian(σ, 1)``). If it is the
    only record of its value, one side is ``M(D)`` and the other
    ``(1 − δ_t) M(D) + δ_t R``: identical to the Gaussian case except with
    probability ``δ_t``. Composed with any other events, a pair of the second kind
    costs at most ``−ln(1 − δ_t)`` (≥ ``δ_t``) of additive δ over the composition of
    the Gaussian parts (:attr:`delta_cost`; one side is a mixture, costing ``δ_t``,
    the other is bounded below by ``(1 − δ_t)`` times its Gaussian counterpart,
    costing ``ln(1/(1 − δ_t))`` since ``∫ Q(L > ln t) dt/t`` over
    ``[γ(1 − δ_t), γ]`` is at most that). So the FDP accountant reports
    ``ε`` at ``δ`` as the Gaussian parts' ``ε`` at ``δ − Σ delta_cost``. Replacement
    (Definition 5: two counts change, L2 √2) follows from that add/remove statement by
    Proposition 1: ``(ε, d + Σ delta_cost)`` add/remove gives
    ``(2ε, (d + Σ delta_cost)(1 + e^ε))`` replacement, so the thresholds cost
    ``(1 + e^ε) Σ delta_cost`` of the replacement δ.

    Attributes
    ----------
    noise_multiplier : float
        ``σ``: the noise std of every count (sensitivity 1); finite, > 0.
    threshold_delta : float
        ``δ_t`` in ``(0, 0.5)``: the probability that a value held by one record only
        is released.

    Examples
    --------
    >>> ev = ThresholdedHistogram(noise_multiplier=4.0, threshold_delta=1e-6)
    >>> round(ev.threshold(), 3), event_from_dict(ev.to_dict()) == ev
    (20.014, True)
    """

    kind: ClassVar[EventKind] = EventKind.THRESHOLDED_HISTOGRAM
    noise_multiplier: float
    threshold_delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", positive("noise_multiplier", self.noise_multiplier))
        d = real("threshold_delta", self.threshold_delta)
        if not 0.0 < d < 0.5:
            raise ValueError(f"threshold_delta={self.threshold_delta!r}: must be in (0, 0.5)")
        object.__setattr__(self, "threshold_delta", d)

    #: The Gaussian part is not subsampled: a rate and a participation of 1.
    sampling_rate: ClassVar[float] = 1.0
    participation: ClassVar[float] = 1.0

    def threshold(self) -> float:
        """``τ = 1 + σ Φ⁻¹(1 − δ_t)`` (computed as ``1 − σ Φ⁻¹(δ_t)``, exact in the tail)."""
        from statistics import NormalDist

        return 1.0 - self.noise_multiplier * NormalDist().inv_cdf(self.threshold_delta)

    @property
    def delta_cost(self) -> float:
        """``−ln(1 − δ_t)``: what one such event adds to the δ of an add/remove
        composition (class docstring).
        """
        return -math.log1p(-self.threshold_delta)

    def gaussian(self) -> SubsampledGaussian:
        """The Gaussian part: ``SubsampledGaussian(σ, sampling_rate=1)``."""
        return SubsampledGaussian(self.noise_multiplier, 1.0)

    def to_dict(self) -> dict[str, Any]:
        """``kind``, ``noise_multiplier`` and ``threshold_delta``."""
        return {"kind": str(self.kind), "noise_multiplier": self.noise_multiplier,
                "threshold_delta": self.threshold_delta}


@dataclass(frozen=True)
class CorrDPClass:
    """One class of CorrDP neighbour in a round: its name, its weight ``d_c`` (1 for
    the sensitive class, ``TV(j)`` for insensitive feature ``j``) and the noise
    multiplier ``1/μ_c`` of its Gaussian pair (``∞`` when the class's sensitivity is 0).
    """

    name: str
    weight: float
    noise_multiplier: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"class name={self.name!r}: must be a non-empty string")
        object.__setattr__(self, "weight", unit(f"class {self.name} weight", self.weight))
        object.__setattr__(self, "noise_multiplier", positive(
            f"class {self.name} noise_multiplier", self.noise_multiplier, allow_inf=True))

    def to_list(self) -> list[Any]:
        """``[name, weight, noise_multiplier]``, an infinite multiplier written ``"inf"``."""
        sigma = self.noise_multiplier
        return [self.name, self.weight, sigma if math.isfinite(sigma) else "inf"]


@dataclass(frozen=True)
class CorrDPRound(PrivacyEvent):
    """One round of CorrDP-SGD (CorrDP paper Algorithm 1 with Eq. (3)'s per-block noise).

    Under the CorrDP relation (one record's sensitive features, or one insensitive
    feature ``j``, replaced; labels fixed) the noisy sum of a round is, per class
    ``c`` of neighbour, a Gaussian pair whose whitened shift is at most ``μ_c`` when
    the changed record is in the batch (probability ``q·p``, the same coin in both
    worlds), and the whole record's whitened norm is at most ``M``. The accountant
    (:class:`fedfdp.corrdp.accounting.CorrDPAccountant`) bounds each class's ``ε_c``
    by the smaller of the revealed-coin and whole-record bounds and reports
    ``max_c d_c ε_c``.

    Attributes
    ----------
    classes : tuple of CorrDPClass
        Every class with its weight and ``1/μ_c``.
    record_noise_multiplier : float
        ``1/M``.
    sampling_rate, participation : float
        ``q`` and ``p`` in ``(0, 1]``.
    """

    kind: ClassVar[EventKind] = EventKind.CORRDP_ROUND
    classes: tuple[CorrDPClass, ...]
    record_noise_multiplier: float
    sampling_rate: float
    participation: float = 1.0

    def __post_init__(self) -> None:
        classes = tuple(self.classes)
        if not classes or not all(isinstance(c, CorrDPClass) for c in classes):
            raise ValueError(f"classes={self.classes!r}: must be a non-empty tuple of CorrDPClass")
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: duplicate names {names}")
        object.__setattr__(self, "classes", classes)
        object.__setattr__(self, "record_noise_multiplier",
                           positive("record_noise_multiplier", self.record_noise_multiplier))
        object.__setattr__(self, "sampling_rate", rate("sampling_rate", self.sampling_rate))
        object.__setattr__(self, "participation", rate("participation", self.participation))

    def to_dict(self) -> dict[str, Any]:
        """``kind``, ``classes`` (each :meth:`CorrDPClass.to_list`), ``record_noise_multiplier``,
        ``sampling_rate`` and ``participation``.
        """
        return {
            "kind": str(self.kind),
            "classes": [c.to_list() for c in self.classes],
            "record_noise_multiplier": self.record_noise_multiplier,
            "sampling_rate": self.sampling_rate,
            "participation": self.participation,
        }


@dataclass(frozen=True)
class DistributedDiscreteGaussian(PrivacyEvent):
    """One round of secure aggregation with distributed discrete Gaussian noise.

    Each honest party adds ``N_Z(0, σ_loc²)`` per coordinate to its scaled, randomly
    rounded clipped private sum (``C`` scaled to ``s``), over a Poisson sample of
    rate ``q``; the server sees the sum mod 2³², ``n_h`` of whose noises it cannot
    subtract. Add/remove sensitivity ``Δ = s + √d`` (L2, integer units). By Lemmas 1
    and 2 of ``docs/secagg_accounting.md`` the round is within density ratio
    ``e^{±Λ_r}`` of a post-processing of the Gaussian mechanism of noise multiplier
    ``σ_eff`` (:attr:`noise_multiplier`), dominated by Theorem 5's subsampled-Gaussian
    pair (:meth:`gaussian_event`); :mod:`fedfdp.accounting.distributed` composes it.

    Attributes
    ----------
    local_sigma : float
        ``σ_loc``, each party's noise std in integer units, ``>= MIN_LOCAL_SIGMA``.
    honest_parties : int
        ``n_h = |U3| - t_c >= 1``.
    scale : float
        ``s > 0``: the clip norm ``C`` in integer units.
    dimension : int
        ``d >= 1``: coordinates summed.
    sampling_rate : float
        ``q`` in ``(0, 1]``: the parties' record-level Poisson rate.
    smoothing : float
        ``t`` of Lemma 2, ``0 < t < √n_h σ_loc`` (default 2).

    Raises
    ------
    ValueError
        Naming the value: ``σ_loc < MIN_LOCAL_SIGMA``, ``n_h < 1``, a round slack
        above ``MAX_SLACK``, ``t² >= n_h σ_loc²``, or any malformed field.

    Examples
    --------
    >>> ev = DistributedDiscreteGaussian(local_sigma=3.3e5, honest_parties=10, scale=2**19,
    ...                                  dimension=10**5, sampling_rate=0.05)
    >>> round(ev.noise_multiplier, 4), ev.slack < 1e-25, event_from_dict(ev.to_dict()) == ev
    (1.9892, True, True)
    """

    kind: ClassVar[EventKind] = EventKind.DISTRIBUTED_DISCRETE_GAUSSIAN
    local_sigma: float
    honest_parties: int
    scale: float
    dimension: int
    sampling_rate: float
    smoothing: float = SMOOTHING

    def __post_init__(self) -> None:
        sigma = finite("local_sigma", self.local_sigma)
        if not sigma >= MIN_LOCAL_SIGMA:
            raise ValueError(
                f"local_sigma={self.local_sigma!r}: must be >= {MIN_LOCAL_SIGMA} (integer units; "
                "below it the distributed discrete Gaussian is not accounted)"
            )
        object.__setattr__(self, "local_sigma", sigma)
        object.__setattr__(self, "honest_parties", count("honest_parties n_h", self.honest_parties))
        object.__setattr__(self, "scale", positive("scale", self.scale))
        object.__setattr__(self, "dimension", count("dimension", self.dimension))
        object.__setattr__(self, "sampling_rate", rate("sampling_rate", self.sampling_rate))
        t = positive("smoothing", self.smoothing)
        object.__setattr__(self, "smoothing", t)
        if not t * t < self.honest_parties * sigma * sigma:
            raise ValueError(
                f"smoothing={t!r}: t² must be < n_h σ_loc² = {self.honest_parties * sigma * sigma!r}"
            )
        if not self.slack <= MAX_SLACK:
            raise ValueError(f"round slack Λ={self.slack!r}: must be <= {MAX_SLACK} (raise local_sigma)")

    @property
    def sensitivity(self) -> float:
        """``Δ = s + √d``."""
        return sensitivity(self.scale, self.dimension)

    @property
    def noise_multiplier(self) -> float:
        """``σ_eff = √(n_h σ_loc² - t²) / Δ``: the smoothed round's Gaussian noise
        multiplier.
        """
        var = self.honest_parties * self.local_sigma**2 - self.smoothing**2
        return math.sqrt(var) / self.sensitivity

    @property
    def slack(self) -> float:
        """``Λ_r = d (τ_{n_h}(σ_loc) + ln((1+η(t²))/(1-η(t²))))``: the round's
        log-density-ratio distance from the smoothed (Gaussian) round.
        """
        per_coordinate = sum_divergence_bound(self.local_sigma, self.honest_parties)
        per_coordinate += smoothing_divergence_bound(self.smoothing)
        return self.dimension * per_coordinate

    def gaussian_event(self) -> SubsampledGaussian:
        """The subsampled-Gaussian event that dominates the smoothed round (route A)."""
        return SubsampledGaussian(self.noise_multiplier, self.sampling_rate)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable mapping of every field."""
        return {
            "kind": str(self.kind),
            "local_sigma": self.local_sigma,
            "honest_parties": self.honest_parties,
            "scale": self.scale,
            "dimension": self.dimension,
            "sampling_rate": self.sampling_rate,
            "smoothing": self.smoothing,
        }


def _fields(doc: Any, kind: EventKind, names: set[str]) -> dict[str, Any]:
    if set(doc) != names | {"kind"}:
        raise ValueError(f"{kind} event {doc!r}: expected the fields {sorted(names)}")
    return {k: doc[k] for k in names}


def event_from_dict(doc: Any) -> PrivacyEvent:
    """The event a :meth:`PrivacyEvent.to_dict` mapping describes; ``ValueError`` naming
    what is wrong for anything else (an unknown kind included).
    """
    if not isinstance(doc, dict):
        raise ValueError(f"event {doc!r}: must be a mapping")
    try:
        kind = EventKind(str(doc.get("kind")))
    except ValueError:
        raise ValueError(f"event kind={doc.get('kind')!r}: unknown (expected one of "
                         f"{', '.join(k.value for k in EventKind)})") from None
    if kind is EventKind.SUBSAMPLED_GAUSSIAN:
        names = {"noise_multiplier", "sampling_rate", "participation"}
        return SubsampledGaussian(**_fields(doc, kind, names))
    if kind is EventKind.THRESHOLDED_HISTOGRAM:
        return ThresholdedHistogram(**_fields(doc, kind, {"noise_multiplier", "threshold_delta"}))
    if kind is EventKind.CORRDP_ROUND:
        f = _fields(doc, kind, {"classes", "record_noise_multiplier", "sampling_rate", "participation"})
        if not isinstance(f["classes"], list):
            raise ValueError(f"corrdp-round classes={f['classes']!r}: must be a list")
        classes = []
        for item in f["classes"]:
            if not isinstance(item, list) or len(item) != 3:
                raise ValueError(f"corrdp-round class {item!r}: expected [name, weight, noise_multiplier]")
            name, weight, sigma = item
            classes.append(CorrDPClass(name, weight, math.inf if sigma == "inf" else sigma))
        return CorrDPRound(
            tuple(classes), f["record_noise_multiplier"], f["sampling_rate"], f["participation"]
        )
    if kind is EventKind.DISTRIBUTED_DISCRETE_GAUSSIAN:
        names = {"local_sigma", "honest_parties", "scale", "dimension", "sampling_rate", "smoothing"}
        return DistributedDiscreteGaussian(**_fields(doc, kind, names))
    assert_never(kind)
