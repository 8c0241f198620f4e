"""The FDP accountant: a ledger of privacy events, epsilon, budget checks and state.

Mechanism
---------
Each ledger event is ``count`` rounds of the Poisson-subsampled Gaussian mechanism
of Algorithm 1: per-record private gradients clipped to L2 norm ``C`` (add/remove
sensitivity ``C``), a Poisson batch of rate ``q``, noise ``N(0, sigma^2 C^2 I)``.
Public work depends on ``Psi(S)`` only and is not recorded (Remark 2).  By
**Theorem 5** each round is ``T(P, Q)``-DP_i^Psi with ``P = N(0, sigma^2)``,
``Q = (1 - q) N(0, sigma^2) + q N(1, sigma^2)``, and rounds compose (Theorem 3).
An event's ``participation`` ``p`` is the probability that a round touches the record
at all (Poisson device sampling, the draw known to the adversary): the round is
then the mixture of that pair (probability ``p``) and ``(P, P)``.
A :class:`~fedfdp.accounting.events.ThresholdedHistogram` (released private
categories) is composed through its Gaussian part ``N(0, σ²)`` vs ``N(1, σ²)``, and
its ``δ_t`` is taken off the ``δ`` the epsilon is reported at: ``ε(δ)`` is the
Gaussian parts' ``ε(δ − Σ −ln(1 − δ_t))``; under replacement, Proposition 1 from
that statement (``δ`` then pays ``(1 + e^{ε/2})`` times the sum; the event's
docstring has the argument).

Neighbouring relations
----------------------
``"add-remove"`` (Definition 6, both orderings of the pair; the headline number)
is composed numerically by :mod:`fedfdp.accounting.composition`;
``"replacement"`` (Definition 5) follows by Proposition 1
(:mod:`fedfdp.accounting.replacement`).  The epsilon reported is the certified
**upper** end of the numerical error interval (:class:`EpsilonBound`).

Errors carry their value: :class:`PrivacyBudgetExhausted` carries the epsilon already
spent; bad input raises ``ValueError`` naming the parameter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfdp import validate
from fedfdp.accounting.composition import DISC_SHARE, Bounds, compose_bounds
from fedfdp.accounting.events import (
    Relation,
    SubsampledGaussian,
    ThresholdedHistogram,
    event_from_dict,
)
from fedfdp.accounting.protocol import Repeated, append_repeated
from fedfdp.accounting.replacement import replacement_epsilon

__all__ = [
    "RELATIONS",
    "EpsilonBound",
    "FDPAccountant",
    "PrivacyBudgetExhausted",
    "Repeated",
    "as_events",
    "check_relation",
    "epsilon_for",
    "threshold_delta_cost",
]

#: The relations the FDP accountant states an ε for (Definitions 6 and 5).
RELATIONS: tuple[Relation, ...] = (Relation.ADD_REMOVE, Relation.REPLACEMENT)
# version 2 adds each event's participation; version-1 states load with participation 1
# version 3 stores each entry as {"event": SubsampledGaussian.to_dict(), "count": n};
# versions 1 (no participation) and 2 (flat fields) still load
_STATE_VERSION = 3
_LEGACY_FIELDS = {
    1: ("noise_multiplier", "sampling_rate", "count"),
    2: ("noise_multiplier", "sampling_rate", "count", "participation"),
}


# --------------------------------------------------------------------------------------
# errors, events, results, validation
# --------------------------------------------------------------------------------------


class PrivacyBudgetExhausted(RuntimeError):
    """The next step would take the privacy loss above the budget.

    Attributes
    ----------
    epsilon_spent : float
        Upper-bound epsilon already spent (before the refused step).
    max_epsilon : float
        The budget.
    delta : float
        The delta at which both are stated.
    epsilon_requested : float or None
        Upper-bound epsilon the refused step would have reached, when known.

    Examples
    --------
    >>> from fedfdp import FDPAccountant, PrivacyBudgetExhausted, SubsampledGaussian
    >>> acc = FDPAccountant()
    >>> round_ = SubsampledGaussian(noise_multiplier=1.0, sampling_rate=0.05)
    >>> acc.compose(round_, 100)
    >>> try:
    ...     acc.spend(round_, max_epsilon=1.0, delta=1e-5)
    ... except PrivacyBudgetExhausted as err:
    ...     print(round(err.epsilon_spent, 2), err.max_epsilon)
    3.55 1.0
    """

    def __init__(
        self,
        epsilon_spent: float,
        max_epsilon: float,
        delta: float,
        epsilon_requested: float | None = None,
    ) -> None:
        self.epsilon_spent = float(epsilon_spent)
        self.max_epsilon = float(max_epsilon)
        self.delta = float(delta)
        self.epsilon_requested = None if epsilon_requested is None else float(epsilon_requested)
        msg = (
            f"privacy budget exhausted: epsilon_spent={self.epsilon_spent:.6g}, "
            f"max_epsilon={self.max_epsilon:.6g}, delta={self.delta:.3g}"
        )
        if self.epsilon_requested is not None:
            msg += f" (the next step would reach epsilon={self.epsilon_requested:.6g})"
        super().__init__(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.epsilon_spent, self.max_epsilon, self.delta, self.epsilon_requested)
        return (type(self), args)


def check_relation(relation: Any) -> Relation:
    """``relation`` as a :class:`~fedfdp.accounting.events.Relation` if it is one of
    :data:`RELATIONS` (a member or its string), else ``ValueError``.
    """
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r}: unknown, expected one of {tuple(map(str, RELATIONS))}")
    return Relation(relation)


@dataclass(frozen=True)
class EpsilonBound:
    """An epsilon with its numerical error interval.

    ``lower <= epsilon <= upper`` for the accounted dominating pair (the numerical
    slack is folded in); ``estimate`` is the point estimate.  ``upper`` is the number
    to print and to compare with budgets.  ``relation`` is the
    :class:`~fedfdp.accounting.events.Relation` it is stated for (``"add-remove"`` or
    ``"replacement"``; a string naming one is converted).
    """

    lower: float
    estimate: float
    upper: float
    delta: float
    relation: Relation

    def __post_init__(self) -> None:
        object.__setattr__(self, "relation", Relation(self.relation))

    @property
    def error(self) -> float:
        """``upper - estimate``."""
        return self.upper - self.estimate


# --------------------------------------------------------------------------------------
# the accountant
# --------------------------------------------------------------------------------------


def as_events(ledger_or_accountant: Any) -> tuple[Repeated, ...]:
    """The composed rounds of an accountant, a :class:`Repeated`, a
    :class:`~fedfdp.accounting.events.SubsampledGaussian` or a sequence of those.
    """
    if isinstance(ledger_or_accountant, FDPAccountant):
        return ledger_or_accountant.ledger
    if isinstance(ledger_or_accountant, Repeated):
        return (ledger_or_accountant,)
    if isinstance(ledger_or_accountant, SubsampledGaussian | ThresholdedHistogram):
        return (Repeated(ledger_or_accountant),)
    if isinstance(ledger_or_accountant, (str, bytes, dict)):
        raise ValueError(
            f"ledger_or_accountant={ledger_or_accountant!r}: expected an FDPAccountant or "
            "a sequence of Repeated events"
        )
    try:
        events = tuple(ledger_or_accountant)
    except TypeError:
        raise ValueError(
            f"ledger_or_accountant={ledger_or_accountant!r}: expected an FDPAccountant or "
            "a sequence of Repeated events"
        ) from None
    out = []
    for ev in events:
        if isinstance(ev, SubsampledGaussian | ThresholdedHistogram):
            ev = Repeated(ev)
        if not isinstance(ev, Repeated):
            raise ValueError(f"ledger entry {ev!r}: expected a Repeated or SubsampledGaussian event")
        out.append(ev)
    return tuple(out)


def threshold_delta_cost(events: Sequence[Repeated]) -> float:
    """``Σ count · (−ln(1 − δ_t))`` over the thresholded histograms of ``events``: the
    δ they take off an add/remove composition of the Gaussian parts (0 without any).
    """
    return float(sum(r.count * r.event.delta_cost for r in events
                     if isinstance(r.event, ThresholdedHistogram)))


def appended(ledger: Sequence[Repeated], entry: Repeated) -> list[Repeated]:
    """``ledger + [entry]``, merged into the last entry when the events are equal."""
    merged = append_repeated([(r.event, r.count) for r in ledger], entry.event, entry.count)
    return [Repeated(event, count) for event, count in merged]


class FDPAccountant:
    """Ledger and epsilon of a run of Algorithm 1 (FDP-SGD) or its federated form.

    Each :meth:`compose` records ``count`` rounds of the Poisson-subsampled Gaussian
    mechanism: sensitivity 1 after dividing by the clip norm ``C``, noise multiplier
    ``sigma`` (noise std ``sigma C``), sampling rate ``q``.  By Theorem 5 each round is
    ``T(N(0, s^2), (1-q) N(0, s^2) + q N(1, s^2))``-DP_i^Psi and rounds compose
    (Theorem 3).  :meth:`epsilon` reports the certified upper end of the numerical
    error interval, for add/remove (Definition 6, both orderings of the pair) or
    replacement (Definition 5 via Proposition 1).  See the module docstring for the
    method and its guarantees.  Memory and time are bounded for every input: see
    :mod:`fedfdp.accounting.composition`.

    Parameters
    ----------
    eps_error : float
        Target for ``upper - estimate``, in ``(0, 1]``.  ``0.9 eps_error`` is the
        discretisation error (prv-accountant's ``eps_error``); the rest absorbs the
        effect of ``delta_error``.  Time grows like ``1 / eps_error``.
    delta_error : float
        Relative delta slack, in ``(0, 0.1]``: ``delta_error * delta`` is
        prv-accountant's ``delta_error`` (absolute floor 1e-13).
    max_grid_points : int
        Largest composition window (points).  A window or an FFT that would exceed
        it, or the memory limit ``composition.MEMORY_LIMIT_BYTES`` (1 GiB), is
        composed on a coarser mesh (a wider, still certified interval); when even
        that fails (astronomical epsilon), only the Renyi-DP bound, a valid but
        looser upper bound, is reported.

    Examples
    --------
    >>> from fedfdp import FDPAccountant, SubsampledGaussian
    >>> acc = FDPAccountant()
    >>> acc.compose(SubsampledGaussian(noise_multiplier=1.0, sampling_rate=0.05), 100)
    >>> round(acc.epsilon(1e-5), 2)          # upper bound, add/remove, delta = 1e-5
    3.55
    >>> acc.compose(SubsampledGaussian(1.0, 0.05, participation=0.2), 100)   # Poisson devices, p = 0.2
    >>> acc.rounds
    200
    """

    #: The relation :meth:`epsilon` reports by default (Definition 6).
    relation = Relation.ADD_REMOVE

    def __init__(
        self,
        eps_error: float = 0.05,
        delta_error: float = 1e-3,
        max_grid_points: int = 2**24,
    ) -> None:
        self._eps_error = validate.rate("eps_error", eps_error)
        delta_error = validate.real("delta_error", delta_error)
        if not 0.0 < delta_error <= 0.1:
            raise ValueError(f"delta_error={delta_error!r}: must be in (0, 0.1]")
        self._delta_error = delta_error
        self._max_grid_points = validate.count("max_grid_points", max_grid_points, 1024)
        self._ledger: list[Repeated] = []
        # (events, delta, relation) -> bound: the metrics row, the result line and a
        # resume may ask for the same ε (the budget check uses the Budget's headroom)
        self._memo: dict[tuple[tuple[Repeated, ...], float, Relation], EpsilonBound] = {}

    # ------------------------------------------------------------------------- ledger
    @property
    def eps_error(self) -> float:
        """Target for ``upper - estimate``."""
        return self._eps_error

    @property
    def delta_error(self) -> float:
        """Relative delta slack."""
        return self._delta_error

    @property
    def ledger(self) -> tuple[Repeated, ...]:
        """Immutable events; consecutive events with equal ``(sigma, q, participation)``
        are merged.
        """
        return tuple(self._ledger)

    @property
    def rounds(self) -> int:
        """Total number of composed rounds."""
        return sum(ev.count for ev in self._ledger)

    def compose(self, event: SubsampledGaussian | ThresholdedHistogram, count: int = 1) -> None:
        """Record ``count`` rounds of ``event`` (a
        :class:`~fedfdp.accounting.events.SubsampledGaussian`: ``σ``, ``q``,
        participation ``p``).
        """
        self._ledger = appended(self._ledger, Repeated(event, count))

    # ------------------------------------------------------------------------- epsilon
    def _profile_for(self, events: Sequence[Repeated], delta_abs_error: float) -> Bounds:
        eps_disc = DISC_SHARE * self._eps_error
        return compose_bounds(events, eps_disc, delta_abs_error, self._max_grid_points)

    def _bound(self, events: Sequence[Repeated], delta: float, relation: Relation | str) -> EpsilonBound:
        delta = validate.open_unit("delta", delta)
        relation = check_relation(relation)
        if not events:
            return EpsilonBound(0.0, 0.0, 0.0, delta, relation)
        key = (tuple(events), delta, relation)
        if key not in self._memo:
            if len(self._memo) >= 8:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = self._compute_bound(events, delta, relation)
        return self._memo[key]

    def _compute_bound(self, events: Sequence[Repeated], delta: float, relation: Relation) -> EpsilonBound:
        cost = threshold_delta_cost(events)
        if cost > 0.0:  # thresholded histograms: their Gaussian parts with the thresholds' δ set aside
            plain = self._gaussian_bound(events, delta, relation)  # a lower bound stays one
            if relation is Relation.REPLACEMENT:
                return self._replacement_with_cost(events, delta, cost, plain.lower)
            if delta - cost <= 0.0:
                return EpsilonBound(plain.lower, np.inf, np.inf, delta, relation)
            shifted = self._gaussian_bound(events, delta - cost, relation)
            return EpsilonBound(plain.lower, shifted.estimate, shifted.upper, delta, relation)
        return self._gaussian_bound(events, delta, relation)

    def _replacement_with_cost(
        self, events: Sequence[Repeated], delta_r: float, cost: float, lower: float
    ) -> EpsilonBound:
        """Proposition 1 from the add/remove statement ``(ε_G(d), d + cost)`` of a ledger
        with thresholded histograms: the Gaussian parts' replacement ``2 ε_G(d)`` at
        ``δ_x`` (:func:`replacement_epsilon`: ``d (1 + e^{ε_G(d)}) ≤ δ_x``) holds at
        ``δ_x + cost (1 + e^{ε_G(d)})``. So ``δ_x = δ_r − cost (1 + e^{g/2})`` for a guess
        ``g`` of the answer, accepted once the answer is ``≤ g`` (a fixed point from
        ``δ_r − 2 cost``); infinite when no ``δ_x > 0`` is left.
        """
        guess = 0.0
        for _ in range(60):
            delta_x = delta_r - cost * (1.0 + math.exp(min(guess / 2.0, 700.0)))
            if delta_x <= 0.0:
                break
            b = self._gaussian_bound(events, delta_x, Relation.REPLACEMENT)
            if b.upper <= guess:
                return EpsilonBound(min(lower, b.estimate), b.estimate, b.upper, delta_r,
                                    Relation.REPLACEMENT)
            guess = b.upper * 1.001 + 1e-9
        return EpsilonBound(lower, np.inf, np.inf, delta_r, Relation.REPLACEMENT)

    def _gaussian_bound(self, events: Sequence[Repeated], delta: float, relation: Relation) -> EpsilonBound:
        """The bound of the events' Gaussian parts (every event's dominating pair)."""
        if relation is Relation.REPLACEMENT:
            return self._replacement(events, delta)
        prof = self._profile_for(events, self._delta_error * delta)
        lo, est, up = prof.epsilon_bounds(delta)
        return EpsilonBound(float(lo[0]), float(est[0]), float(up[0]), delta, relation)

    def _replacement(self, events: Sequence[Repeated], delta_r: float) -> EpsilonBound:
        """Proposition 1 in (eps, delta) form (see :func:`replacement_epsilon`)."""
        lower, est_r, up_r = replacement_epsilon(
            events, delta_r, self._profile_for, self._delta_error
        )
        return EpsilonBound(lower, est_r, up_r, delta_r, Relation.REPLACEMENT)

    def epsilon_bound(self, delta: float, relation: Relation | str = Relation.ADD_REMOVE) -> EpsilonBound:
        """Epsilon of the ledger at ``delta`` with its numerical error interval.

        Parameters
        ----------
        delta : float
            In ``(0, 1)``.
        relation : Relation or str
            ``Relation.ADD_REMOVE`` (Definition 6, both orderings of the dominating
            pair, the maximum is reported) or ``Relation.REPLACEMENT`` (Definition 5
            via Proposition 1, see the module docstring); its string
            (``"replacement"``) is accepted and converted.
        """
        return self._bound(self._ledger, delta, relation)

    def epsilon(self, delta: float, relation: Relation | str = Relation.ADD_REMOVE) -> float:
        """Certified upper bound on epsilon at ``delta``: the number to print."""
        return self.epsilon_bound(delta, relation).upper

    def _prospect(
        self, max_epsilon: float, event: SubsampledGaussian | ThresholdedHistogram, count: int
    ) -> tuple[float, list[Repeated]]:
        """The validated cap and the ledger as it would be after ``count`` more rounds."""
        max_epsilon = validate.at_least("max_epsilon", max_epsilon, 0.0)
        return max_epsilon, appended(self._ledger, Repeated(event, count))

    def would_exceed(
        self,
        event: SubsampledGaussian | ThresholdedHistogram,
        count: int = 1,
        *,
        max_epsilon: float,
        delta: float,
        relation: Relation | str = Relation.ADD_REMOVE,
    ) -> bool:
        """Whether ``count`` more rounds of ``event`` would take the upper epsilon above
        ``max_epsilon``. Does not modify the ledger.
        """
        max_epsilon, events = self._prospect(max_epsilon, event, count)
        return self._bound(events, delta, relation).upper > max_epsilon

    def spend(
        self,
        event: SubsampledGaussian | ThresholdedHistogram,
        count: int = 1,
        *,
        max_epsilon: float,
        delta: float,
        relation: Relation | str = Relation.ADD_REMOVE,
    ) -> float:
        """Compose ``count`` rounds of ``event`` if the upper epsilon stays within
        ``max_epsilon``; return the new upper epsilon.

        Raises
        ------
        PrivacyBudgetExhausted
            Carrying the epsilon already spent; the ledger is left unchanged.
        """
        max_epsilon, new_events = self._prospect(max_epsilon, event, count)
        new_eps = self._bound(new_events, delta, relation).upper
        if new_eps > max_epsilon:
            spent = self._bound(self._ledger, delta, relation).upper
            raise PrivacyBudgetExhausted(spent, max_epsilon, delta, new_eps)
        self._ledger = new_events
        return new_eps

    # ------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: format version (3), precision knobs and the ledger
        (each entry's event, :meth:`SubsampledGaussian.to_dict`, and count).
        """
        return {
            "version": _STATE_VERSION,
            "eps_error": self._eps_error,
            "delta_error": self._delta_error,
            "ledger": [{"event": ev.event.to_dict(), "count": ev.count} for ev in self._ledger],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the ledger by the one in ``state``; nothing changes on error.

        The stored precision knobs are validated but the accountant keeps its own:
        they change how tightly epsilon is reported, not what was spent. Version-1
        and version-2 states (flat fields; version 1 without participation) load too.

        Raises
        ------
        ValueError
            If ``state`` is not a dict of the format written by :meth:`state_dict`.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state={type(state).__name__}: must be a dict")
        missing = {"version", "ledger"} - set(state)
        if missing:
            raise ValueError(f"state: missing keys {sorted(missing)}")
        unknown = set(state) - {"version", "ledger", "eps_error", "delta_error"}
        if unknown:
            raise ValueError(f"state: unknown keys {sorted(unknown)}")
        version = state["version"]
        if type(version) is not int or version not in (*_LEGACY_FIELDS, _STATE_VERSION):
            raise ValueError(
                f"state version={version!r}: unsupported (expected one of "
                f"{sorted((*_LEGACY_FIELDS, _STATE_VERSION))})"
            )
        if "eps_error" in state:
            validate.rate("state eps_error", state["eps_error"])
        if "delta_error" in state:
            validate.real("state delta_error", state["delta_error"])
        ledger = state["ledger"]
        if not isinstance(ledger, list):
            raise ValueError(f"state ledger={type(ledger).__name__}: must be a list")
        events: list[Repeated] = []
        for i, item in enumerate(ledger):
            try:
                if version == _STATE_VERSION:
                    if not isinstance(item, dict) or set(item) != {"event", "count"}:
                        raise ValueError(f"{item!r}: expected a dict with keys event, count")
                    event = event_from_dict(item["event"])
                    if not isinstance(event, SubsampledGaussian | ThresholdedHistogram):
                        raise ValueError(f"event kind {event.kind}: not an FDP event")
                    entry = Repeated(event, item["count"])
                else:
                    names = _LEGACY_FIELDS[version]
                    if not isinstance(item, dict) or set(item) != set(names):
                        raise ValueError(f"{item!r}: expected a dict with keys {', '.join(names)}")
                    p = item.get("participation", 1.0)
                    entry = Repeated(SubsampledGaussian(item["noise_multiplier"], item["sampling_rate"], p),
                                     item["count"])
            except ValueError as err:
                raise ValueError(f"state ledger[{i}]: {err}") from None
            events = appended(events, entry)
        self._ledger = events

    def __repr__(self) -> str:
        return (
            f"FDPAccountant(eps_error={self._eps_error}, delta_error={self._delta_error}, "
            f"rounds={self.rounds}, events={len(self._ledger)})"
        )


# --------------------------------------------------------------------------------------
# convenience functions
# --------------------------------------------------------------------------------------


def epsilon_for(
    noise_multiplier: float,
    sampling_rate: float,
    rounds: int,
    delta: float,
    relation: Relation | str = Relation.ADD_REMOVE,
    eps_error: float = 0.05,
    *,
    participation: float = 1.0,
) -> EpsilonBound:
    """Epsilon bound of ``rounds`` identical rounds (see :class:`FDPAccountant`),
    each touching the record with probability ``participation``.
    """
    acc = FDPAccountant(eps_error=eps_error)
    event = SubsampledGaussian(noise_multiplier, sampling_rate, participation)
    acc.compose(event, validate.count("rounds", rounds))
    return acc.epsilon_bound(delta, relation)
