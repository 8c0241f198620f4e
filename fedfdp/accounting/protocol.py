"""The one accountant protocol, the one merge, the one calibrator and the default δ.

Every accountant of fedfdp — :class:`~fedfdp.accounting.FDPAccountant` for
:class:`~fedfdp.accounting.events.SubsampledGaussian` events,
:class:`~fedfdp.accounting.distributed.DistributedAccountant` for
:class:`~fedfdp.accounting.events.DistributedDiscreteGaussian` rounds,
:class:`~fedfdp.corrdp.accounting.CorrDPAccountant` for
:class:`~fedfdp.accounting.events.CorrDPRound` events — implements
:class:`Accountant`: events in, an ε with its numerical interval out, for its
:class:`~fedfdp.accounting.events.Relation`, keyword arguments only where a float
could be mistaken for another.

:func:`append_repeated` is the one merge of consecutive equal events (every
accountant's ledger, the ledger replay's event list); :class:`Repeated` is an entry of
the FDP accountant's ledger.

:func:`calibrate` is the one search for the smallest noise multiplier that meets a
target ε, for any accountant and any family of events ``σ ↦ event`` (the shape of
dp-accounting's ``calibrate_dp_mechanism``): bisection on ``log σ`` over the certified
**upper** ε, so the σ returned never overshoots. A family defined on part of the σ
axis only (secure aggregation's, :mod:`fedfdp.secagg.plan`) raises :class:`NoEvent`
where it has no event.

:func:`default_delta` is ``δ = 1/(2N)``, the δ of every run, estimate and CLI account
that states none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from fedfdp import validate
from fedfdp.accounting.events import PrivacyEvent, Relation, SubsampledGaussian, ThresholdedHistogram

#: The search never goes below this noise multiplier: a target that even this σ meets
#: returns it (ε ≤ target still holds; a smaller σ is not explored).
MIN_NOISE_MULTIPLIER = 2.0**-10
#: Nor above this one: a target it cannot meet is refused.
MAX_NOISE_MULTIPLIER = 1e4


class Bound(Protocol):
    """An ε with its interval: ``upper`` is the number to print and to compare with
    budgets (the accountant's certified upper bound).
    """

    @property
    def upper(self) -> float: ...

    @property
    def delta(self) -> float: ...


#: The kind of event an accountant composes (contravariant: an accountant of every
#: :class:`PrivacyEvent` is an accountant of each kind).
E_contra = TypeVar("E_contra", bound=PrivacyEvent, contravariant=True)


@runtime_checkable
class Accountant(Protocol[E_contra]):
    """What every accountant implements (and all that the budget, the ledger and the
    calibrator use).

    ``compose(event, count)`` records ``count`` rounds of ``event``;
    ``epsilon(delta)`` is the certified upper ε of everything composed, at ``delta``,
    for the accountant's ``relation``; ``epsilon_bound(delta)`` the same with its
    interval; ``would_exceed(event, count, max_epsilon=, delta=)`` asks, without
    changing anything, whether ``count`` more rounds of ``event`` would take the
    upper ε above ``max_epsilon``; ``state_dict``/``load_state_dict`` save and
    restore the composed events (JSON-serialisable; nothing changes on error).
    """

    relation: Relation

    def compose(self, event: E_contra, count: int = 1) -> None: ...

    def epsilon(self, delta: float) -> float: ...

    def epsilon_bound(self, delta: float) -> Any: ...

    def would_exceed(
        self, event: E_contra, count: int = 1, *, max_epsilon: float, delta: float
    ) -> bool: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


E = TypeVar("E", bound=PrivacyEvent)


def append_repeated(entries: Sequence[tuple[E, int]], event: E, count: int) -> list[tuple[E, int]]:
    """``entries + [(event, count)]``, merged into the last entry when its event is equal
    (composition is the same either way; merging keeps ledgers short). The one merge of
    every accountant.

    Examples
    --------
    >>> from fedfdp.accounting.events import SubsampledGaussian
    >>> a, b = SubsampledGaussian(1.0, 0.1), SubsampledGaussian(2.0, 0.1)
    >>> [n for _, n in append_repeated(append_repeated([(a, 2)], a, 3), b, 1)]
    [5, 1]
    """
    n = validate.count("count", count)
    out = list(entries)
    if out and out[-1][0] == event:
        out[-1] = (event, out[-1][1] + n)
    else:
        out.append((event, n))
    return out


@dataclass(frozen=True)
class Repeated:
    """``count`` rounds of one :class:`~fedfdp.accounting.events.SubsampledGaussian`
    (or :class:`~fedfdp.accounting.events.ThresholdedHistogram`) event: an entry of
    :attr:`fedfdp.accounting.FDPAccountant.ledger` (consecutive equal events merge,
    :func:`append_repeated`), what :mod:`fedfdp.accounting.composition` composes.

    Parameters
    ----------
    event : SubsampledGaussian or ThresholdedHistogram
        The round's mechanism (``σ``, ``q``, participation ``p``).
    count : int
        Number of identical rounds, ``>= 1``.
    """

    event: SubsampledGaussian | ThresholdedHistogram
    count: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.event, SubsampledGaussian | ThresholdedHistogram):
            raise ValueError(f"event={self.event!r}: the FDP accountant composes SubsampledGaussian "
                             "and ThresholdedHistogram events")
        object.__setattr__(self, "count", validate.count("count", self.count))

    @property
    def noise_multiplier(self) -> float:
        """``σ`` of the repeated event."""
        return self.event.noise_multiplier

    @property
    def sampling_rate(self) -> float:
        """``q`` of the repeated event (1 for a :class:`ThresholdedHistogram`)."""
        return self.event.sampling_rate

    @property
    def participation(self) -> float:
        """``p`` of the repeated event (1 for a :class:`ThresholdedHistogram`)."""
        return self.event.participation


class NoEvent(ValueError):
    """An event family has no accounted event at this noise multiplier (the message says
    why, naming the value): :func:`calibrate` counts such a ``σ`` as one that does not
    meet the target, and raises this error when the target may only be met where the
    family has no event.
    """


def calibrate(
    new_accountant: Callable[[], Accountant[E]],
    event_for: Callable[[float], E],
    *,
    target_epsilon: float,
    rounds: int,
    delta: float,
    rtol: float = 1e-3,
    max_noise_multiplier: float = MAX_NOISE_MULTIPLIER,
) -> float:
    """Smallest noise multiplier ``σ`` (to ``rtol``) whose upper ε is ``≤ target``.

    ``rounds`` rounds of ``event_for(σ)`` are composed by a fresh
    ``new_accountant()`` and its ``epsilon(delta)`` (the certified upper end, for the
    accountant's relation) is compared with the target; ε must decrease in ``σ`` (true
    of every event family here: each is a post-processing of a Gaussian whose noise
    grows with ``σ``). Whatever the event's own terms are — the δ of thresholded
    histograms (:class:`~fedfdp.accounting.events.ThresholdedHistogram`, composed
    before the family or in it), the slack ``2Λ`` and ``δe^{−Λ}`` of a distributed
    discrete Gaussian round — they are part of the ε compared, so the σ found meets
    the target at ``δ`` with them included. The result satisfies ``ε(σ) ≤ target`` and
    ``ε(σ/(1 + rtol)) > target`` (up to the bracketing); the search stays in
    ``[MIN_NOISE_MULTIPLIER, max_noise_multiplier]``, and evaluates each ``σ`` once.

    A ``σ`` for which ``event_for`` raises :class:`NoEvent` does not meet the target;
    when the search ends just above such a ``σ`` (the smallest ``σ`` with an event that
    meets the target is the family's edge, and a smaller one might meet it where the
    family has no event), the family's refusal at the smallest ``σ`` it refused is
    raised.

    Raises
    ------
    ValueError
        On a target that is not finite and > 0, ``rounds < 1``, or a target that no
        ``σ ≤ max_noise_multiplier`` meets (the message names the target).
    NoEvent
        As above.
    """
    target = validate.positive("target_epsilon", target_epsilon)
    rounds = validate.count("rounds", rounds)
    rtol = validate.open_unit("rtol", rtol)
    known: dict[float, float] = {}
    refused: dict[float, NoEvent] = {}

    def eps(sigma: float) -> float:
        if sigma not in known:
            try:
                event = event_for(sigma)
            except NoEvent as exc:
                refused[sigma] = exc
                known[sigma] = math.inf
            else:
                acc = new_accountant()
                acc.compose(event, rounds)
                known[sigma] = float(acc.epsilon(delta))
        return known[sigma]

    hi = 1.0
    if math.isinf(eps(hi)) and math.isinf(eps(max_noise_multiplier)):
        if max_noise_multiplier in refused:  # no event at the largest σ either: the family's refusal
            raise refused[max_noise_multiplier]
        # no σ helps: a δ not spent by the Gaussian parts (thresholded histograms' δ_t) is >= delta
        raise ValueError(
            f"target-epsilon={target:g}: unreachable at delta={delta:g}: epsilon is infinite at every "
            "noise multiplier (the thresholds' delta of the released categories leaves no delta; raise delta)"
        )
    while eps(hi) > target:
        hi *= 2.0
        if hi > max_noise_multiplier:
            raise ValueError(
                f"target-epsilon={target:g}: unreachable with noise-multiplier <= {max_noise_multiplier:g} "
                f"over {rounds} rounds at delta={delta:g} (raise the target, or run fewer rounds)"
            )
    if hi == 1.0 and eps(MIN_NOISE_MULTIPLIER) <= target:
        return MIN_NOISE_MULTIPLIER
    lo = hi / 2.0
    while lo > 1e-3 and eps(lo) <= target:
        hi, lo = lo, lo / 2.0
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    if lo in refused:  # the target may be met below the family's edge: its refusal (the first σ refused)
        raise refused[min(refused)]
    return hi


def default_delta(num_records: int) -> float:
    """``δ = 1/(2N)``: the δ of a run over ``N = num_records`` training records that
    states none (``fedfdp run``), of the estimates of ``private-statistics =
    "estimate"``, and of ``fedfdp account --num-records N``.

    Examples
    --------
    >>> default_delta(3306) == 1 / 6612
    True
    """
    return 1.0 / (2 * validate.count("num_records", num_records))
