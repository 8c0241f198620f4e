"""The ε of CorrDP-SGD: per-class Gaussian pairs, composed by fedfdp's PRV accountant.

Relation (named ``"corrdp"`` wherever an ε is shown)
---------------------------------------------------
Def. 2.2 with ``d(D, D') = TV(j)``: neighbours replace one record's sensitive inputs
(which must be ``(ε, δ)``-indistinguishable), or one insensitive feature ``j``'s
inputs (``(ε/TV(j), δ)``); labels fixed (Assumption 3.1). A CorrDP ε is **not** a DP
or FDP ε: it says nothing about membership (neighbours are replacements) and allows
``ε/TV(j)`` for a change of feature ``j`` alone.

One round, one class: two rigorous bounds
-----------------------------------------
:class:`~fedfdp.corrdp.noise.CorrDPDesign` gives each class ``c`` (``sensitive``;
``feature:<name>``) a sensitivity vector and ``μ_c``: when the changed record is in the
batch the two noisy sums are ``N(a, Σ)`` and ``N(b, Σ)`` with
``‖Σ^{-1/2}(a − b)‖ ≤ μ_c``, while ``‖Σ^{-1/2}a‖, ‖Σ^{-1/2}b‖ ≤ M``
(:meth:`CorrDPDesign.record_visibility`, the whole clipped record). With Poisson
sampling at rate ``q`` (devices drawn with probability ``p``) the record is in the
batch with probability ``q·p``, by the **same** coin in both datasets: the pair of
one round is ``(1−qp)N(0,Σ) + qp N(a,Σ)`` vs ``(1−qp)N(0,Σ) + qp N(b,Σ)``.

(i) **Revealed coin** (keeps the class structure). Give the adversary the coin: the
pair ``(coin, output)`` dominates the output (the output is a function of it) and is
exactly "with probability ``q·p`` a Gaussian pair with ``μ_c``, otherwise identical"
— :class:`fedfdp.accounting.FDPAccountant`'s participation event
``compose(1/μ_c, sampling_rate=1.0, participation=q·p)``. Exact for full batches
(``q = p = 1``); with sampling it amplifies δ but not ε.

(ii) **Whole record** (keeps the amplification). ``D → D∖{e} → D'`` are two
add/remove steps, each a Poisson-subsampled Gaussian with shift ``≤ M`` (noise
multiplier ``1/M``, rate ``q``, participation ``p``), joined by group privacy —
Prop. 1 of the FDP paper, ``FDPAccountant.epsilon(δ, "replacement")``. It holds for
every replacement of the record, so it ignores the class (it is a DP bound).

Both hold for the whole run; per class fedfdp takes the smaller,
``ε_c(δ) = min(ε_c^(i), ε^(ii))``, and the run is ``(ε, δ)``-CorrDP with::

    ε = max_c d_c · ε_c(δ),    d_sensitive = 1,  d_feature:j = TV(j).

(each class must satisfy ``ε_c ≤ ε/d_c``). With in-sample TVs (Theorem 3.11) the
accountant is asked at ``δ − δ_est`` and ``δ`` is reported (``δ_est`` = the TV
estimate's failure probability; Def. 3.10's choice ``δ_est = δ/2`` of the total is
the paper's ``(ε, 2δ)``).

Why not the usual rate-``q`` subsampled Gaussian with shift ``μ_c``
----------------------------------------------------------------------
The add/remove pair ``(1−q)N(0) + qN(μ_c)`` vs ``N(0)`` does not dominate the
replacement pair above when ``a`` and ``b`` are far from 0 but close to each other:
the adversary then sees whether the record was sampled and the loss is not amplified
(a numerical counterexample is in ``tests/test_corrdp_sgd.py``). The exact worst case
over ``‖a‖, ‖b‖ ≤ M``, ``‖a − b‖ ≤ μ_c`` lies between (i) and the rate-``q`` pair; a
tight accountant for it (a 2-D privacy-loss distribution composed numerically) is
open work (``docs/corrdp.md`` §8).

Estimates released before training (noisy TVs)
-----------------------------------------------
With ``tv-estimate`` the insensitive TVs are released with Gaussian noise
(:func:`fedfdp.corrdp.run.release_feature_tvs`) before round 1: each is a Gaussian
mechanism whose sensitivity under the replacement of one record (which covers every
CorrDP neighbour) is normalised to 1, charged as ``SubsampledGaussian(σ_tv, 1.0)``.
The accountant composes these events apart from the rounds: their ``ε_est`` at
``δ_g`` is the Gaussian mechanism's (the pair ``N(0, σ²)``, ``N(1, σ²)``, composed),
and each class pays it on top of its own, by basic (adaptive) composition::

    ε = max_c d_c · (ε_c(δ_m) + ε_est(δ_g)),   δ_m = δ − δ_est − δ_g,  δ_g = (δ − δ_est)/2

(valid because a class's loss is at most the sum of the two losses; ``d_c ≤ 1``; loose
by the split of δ and by adding instead of composing numerically). The designs that
follow use only the released values, so their rounds are accounted as before.

The ledger
----------
:class:`CorrDPAccountant` keeps the rounds as
:class:`~fedfdp.accounting.events.CorrDPRound` events — each names its classes with
``(d_c, 1/μ_c)``, the whole-record ``1/M``, ``q`` and ``p``, so a ledger is
re-accounted without the design — and composes every class from them on demand
(classes dominated by another, ``d ≤ d'`` with at least as much noise in every round,
are skipped). :meth:`CorrDPDesign.round_event` turns ``(σ, C, q, p)`` into the event.
:func:`effective_noise_multiplier` is a single
noise multiplier that the existing ledger may be charged instead,
``(σ_eff, 1.0, participation = q·p)``: ``σ_eff = min_c 1/μ_c`` bounds every class's
ε, hence the CorrDP ε (``d_c ≤ 1``), but ignores the TV weights.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedfdp.accounting import FDPAccountant, SubsampledGaussian
from fedfdp.accounting.events import CorrDPRound, Relation, event_from_dict
from fedfdp.accounting.protocol import append_repeated, calibrate
from fedfdp.corrdp.noise import CorrDPDesign

#: Explanation of the relation, printed beside every CorrDP ε.
RELATION_TEXT = (
    "CorrDP: one record's sensitive features replaced -> eps, one insensitive feature j "
    "replaced -> eps/TV(j); labels fixed; membership not protected"
)
_STATE_VERSION = 2


@dataclass(frozen=True)
class ClassEpsilon:
    """One class: its weight ``d_c``, the two bounds on its ``ε_c`` (upper ends of the
    accountant's intervals), ``ε_c`` = the smaller, and ``d_c·ε_c``.
    """

    name: str
    weight: float
    epsilon: float
    revealed_coin: float
    whole_record: float

    @property
    def weighted(self) -> float:
        return self.weight * self.epsilon


@dataclass(frozen=True)
class CorrDPEpsilon:
    """A CorrDP ε with its relation, δ and per-class breakdown.

    Attributes
    ----------
    epsilon : float
        ``max_c d_c ε_c`` (each ``ε_c`` the accountant's certified upper bound).
    delta : float
        Total δ (mechanism + TV estimation).
    relation : Relation
        Always ``Relation.CORRDP``.
    binding : str
        The class attaining the max.
    classes : tuple of ClassEpsilon
        The classes composed (dominated ones are skipped).

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> e = corrdp_epsilon(CorrDPDesign(roles, 2, (0.5, 0.5), 1.0), 4.0, 1.0, 0.1, 20, 1e-5)
    >>> str(e.relation), [c.name for c in e.classes], e.label().startswith("eps_corrdp = ")
    ('corrdp', ['sensitive', 'feature:speed'], True)
    """

    epsilon: float
    delta: float
    relation: Relation
    binding: str
    classes: tuple[ClassEpsilon, ...]

    @property
    def upper(self) -> float:
        """The number to print (each class's ε is already a certified upper bound)."""
        return self.epsilon

    def label(self) -> str:
        """``ε = … (corrdp …)``: the form in which a CorrDP ε may be shown."""
        return f"eps_corrdp = {self.epsilon:.4g} (upper bound; {RELATION_TEXT}; delta = {self.delta:.3g})"


Rounds = tuple[tuple[CorrDPRound, int], ...]


def _appended(rounds: Sequence[tuple[CorrDPRound, int]], event: CorrDPRound, count: int) -> Rounds:
    return tuple(append_repeated(rounds, event, count))


def _class_events(rounds: Rounds) -> dict[str, tuple[float, list[tuple[float, float, int]]]]:
    """Per class of positive weight: ``(d_c, [(1/μ_c, q·p, count) per entry])``."""
    out: dict[str, tuple[float, list[tuple[float, float, int]]]] = {}
    for event, count in rounds:
        for cls in event.classes:
            if cls.weight <= 0:
                continue
            weight, seq = out.setdefault(cls.name, (cls.weight, []))
            if weight != cls.weight:
                raise ValueError(f"class {cls.name}: weight {cls.weight} differs from an earlier "
                                 f"round's {weight}")
            seq.append((cls.noise_multiplier, event.sampling_rate * event.participation, count))
    return out


def _undominated(events: dict[str, tuple[float, list[tuple[float, float, int]]]]) -> list[str]:
    names = list(events)
    keep = []
    for c in names:
        wc, ec = events[c]
        dominated = False
        for o in names:
            if o == c:
                continue
            wo, eo = events[o]
            if len(eo) != len(ec):
                continue
            at_least = wo >= wc and all(so <= sc for (so, _, _), (sc, _, _) in zip(eo, ec, strict=True))
            strictly = wo > wc or any(so < sc for (so, _, _), (sc, _, _) in zip(eo, ec, strict=True))
            if at_least and (strictly or o < c):  # ties: keep one
                dominated = True
                break
        if not dominated:
            keep.append(c)
    return keep


def _whole_record_epsilon(rounds: Rounds, delta: float, eps_error: float) -> float:
    """Bound (ii): add/remove subsampled Gaussians with shift ``M`` per round, replacement by Prop. 1."""
    acc = FDPAccountant(eps_error=eps_error)
    for event, count in rounds:
        record = SubsampledGaussian(event.record_noise_multiplier, event.sampling_rate, event.participation)
        acc.compose(record, count)
    return float(acc.epsilon(delta, Relation.REPLACEMENT))


def _class_epsilon(events: list[tuple[float, float, int]], delta: float, eps_error: float) -> float:
    """Bound (i): the revealed-coin participation events of one class."""
    acc = FDPAccountant(eps_error=eps_error)
    for sigma_c, touch, count in events:
        if math.isinf(sigma_c):
            continue  # this class's sensitivity is 0: nothing to compose
        acc.compose(SubsampledGaussian(sigma_c, 1.0, touch), count)
    if acc.rounds == 0:
        return 0.0
    return float(acc.epsilon(delta))


#: Bounds computed by any :class:`CorrDPAccountant`, shared (least recently used dropped):
#: the budget check before a round and the ε after it cost one evaluation, and runs of
#: the same design and σ (seeds of a sweep, an audit's trials) share them.
_BOUNDS: OrderedDict[tuple[Any, ...], CorrDPEpsilon] = OrderedDict()
_BOUNDS_SIZE = 512


class CorrDPAccountant:
    """Ledger and ε of CorrDP-SGD rounds (module docstring); implements
    :class:`fedfdp.accounting.protocol.Accountant` for
    :class:`~fedfdp.accounting.events.CorrDPRound` events.

    Parameters
    ----------
    delta_estimation : float
        δ spent by in-sample TV estimation (Theorem 3.11): every ε is computed at
        ``δ − delta_estimation`` and reported at ``δ``.
    eps_error : float
        Passed to every class's :class:`~fedfdp.accounting.FDPAccountant`.

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> design = CorrDPDesign(roles, 2, (0.5, 0.5), 1.0)
    >>> acc = CorrDPAccountant()
    >>> event = design.round_event(noise_multiplier=4.0, clipping_norm=1.0, sampling_rate=0.1)
    >>> acc.compose(event, 20)
    >>> acc.rounds, str(acc.epsilon_bound(1e-5).relation)
    (20, 'corrdp')
    >>> acc.would_exceed(event, max_epsilon=1e9, delta=1e-5), acc.rounds
    (False, 20)
    """

    relation = Relation.CORRDP

    def __init__(self, delta_estimation: float = 0.0, eps_error: float = 0.05) -> None:
        if not (math.isfinite(delta_estimation) and 0.0 <= delta_estimation < 1.0):
            raise ValueError(f"delta_estimation={delta_estimation}: must be in [0, 1)")
        self.delta_estimation = float(delta_estimation)
        self.eps_error = float(eps_error)
        self._rounds: Rounds = ()
        self._estimates: tuple[tuple[SubsampledGaussian, int], ...] = ()

    @property
    def estimates(self) -> tuple[tuple[SubsampledGaussian, int], ...]:
        """The Gaussian releases composed before the rounds (``(event, count)``)."""
        return self._estimates

    @property
    def ledger(self) -> Rounds:
        """``(event, count)`` entries (consecutive equal events merged)."""
        return self._rounds

    @property
    def rounds(self) -> int:
        return sum(n for _, n in self._rounds)

    def compose(self, event: CorrDPRound | SubsampledGaussian, count: int = 1) -> None:
        """Record ``count`` rounds of ``event``, or ``count`` Gaussian releases (a
        ``SubsampledGaussian`` with ``q = p = 1``: an estimate, module docstring).
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count={count!r}: must be an integer >= 1")
        if isinstance(event, SubsampledGaussian) and event.sampling_rate == event.participation == 1.0:
            self._estimates = tuple(append_repeated(self._estimates, event, count))
            return
        if not isinstance(event, CorrDPRound):
            raise ValueError(f"event={event!r}: the CorrDP accountant composes CorrDPRound events "
                             "(and Gaussian releases with sampling_rate = participation = 1)")
        self._rounds = _appended(self._rounds, event, count)

    def _estimate_epsilon(self, delta: float) -> float:
        acc = FDPAccountant(eps_error=self.eps_error)
        for event, count in self._estimates:
            acc.compose(event, count)
        return float(acc.epsilon(delta))

    def _compute(self, rounds: Rounds, delta: float) -> CorrDPEpsilon:
        mech_delta = delta - self.delta_estimation
        extra = 0.0
        if self._estimates:
            mech_delta /= 2.0  # the other half, δ_g, for the estimates
            extra = self._estimate_epsilon(mech_delta)
        events = _class_events(rounds)
        whole = _whole_record_epsilon(rounds, mech_delta, self.eps_error) if rounds else 0.0
        results = []
        for name in _undominated(events):
            weight, ev = events[name]
            revealed = _class_epsilon(ev, mech_delta, self.eps_error)
            results.append(ClassEpsilon(name, weight, min(revealed, whole) + extra, revealed, whole))
        if not results:
            return CorrDPEpsilon(extra, delta, Relation.CORRDP, "estimates" if extra else "", ())
        best = max(results, key=lambda c: c.weighted)
        return CorrDPEpsilon(best.weighted, delta, Relation.CORRDP, best.name, tuple(results))

    def _bound(self, rounds: Rounds, delta: float) -> CorrDPEpsilon:
        if not (math.isfinite(delta) and self.delta_estimation < delta < 1.0):
            raise ValueError(f"delta={delta}: must be in (delta_estimation={self.delta_estimation}, 1)")
        key = (self.delta_estimation, self.eps_error, rounds, self._estimates, delta)
        found = _BOUNDS.get(key)
        if found is None:
            found = self._compute(rounds, delta)
            _BOUNDS[key] = found
            while len(_BOUNDS) > _BOUNDS_SIZE:
                _BOUNDS.popitem(last=False)
        else:
            _BOUNDS.move_to_end(key)
        return found

    def epsilon_bound(self, delta: float) -> CorrDPEpsilon:
        """The CorrDP ε of the ledger at total ``δ``, with its breakdown."""
        return self._bound(self._rounds, delta)

    def epsilon(self, delta: float) -> float:
        return self.epsilon_bound(delta).epsilon

    def would_exceed(self, event: CorrDPRound, count: int = 1, *, max_epsilon: float, delta: float) -> bool:
        """Whether ``count`` more rounds of ``event`` would take ε above ``max_epsilon``
        (no mutation).
        """
        return self._bound(_appended(self._rounds, event, count), delta).epsilon > max_epsilon

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "relation": str(Relation.CORRDP),
            "delta_estimation": self.delta_estimation,
            "eps_error": self.eps_error,
            "ledger": [{"event": ev.to_dict(), "count": n} for ev, n in self._rounds],
            "estimates": [{"event": ev.to_dict(), "count": n} for ev, n in self._estimates],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the ledger by the one in ``state``; nothing changes on error."""
        if not isinstance(state, dict) or state.get("relation") != Relation.CORRDP:
            found = state.get("relation") if isinstance(state, dict) else None
            raise ValueError(f"state relation={found!r}: not a CorrDP ledger")
        if state.get("version") != _STATE_VERSION or not isinstance(state.get("ledger"), list):
            raise ValueError(f"state version={state.get('version')!r}: expected {_STATE_VERSION} "
                             "with a ledger list")
        if float(state.get("delta_estimation", -1.0)) != self.delta_estimation:
            raise ValueError(f"state delta_estimation={state.get('delta_estimation')!r}: this accountant "
                             f"has {self.delta_estimation}")
        rounds: Rounds = ()
        for i, item in enumerate(state["ledger"]):
            if not isinstance(item, dict) or set(item) != {"event", "count"}:
                raise ValueError(f"state ledger[{i}]={item!r}: expected a dict with keys event, count")
            event = event_from_dict(item["event"])
            count = item["count"]
            if not isinstance(event, CorrDPRound) or isinstance(count, bool) or not isinstance(count, int) \
                    or count < 1:
                raise ValueError(f"state ledger[{i}]: not a CorrDP round with a count >= 1")
            rounds = _appended(rounds, event, count)
        estimates: list[tuple[SubsampledGaussian, int]] = []
        for i, item in enumerate(state.get("estimates", [])):
            release = event_from_dict(item.get("event")) if isinstance(item, dict) else None
            count = item.get("count") if isinstance(item, dict) else None
            if not isinstance(release, SubsampledGaussian) or release.sampling_rate != 1.0 or \
                    isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"state estimates[{i}]: not a Gaussian release with a count >= 1")
            estimates = append_repeated(estimates, release, count)
        self._rounds = rounds
        self._estimates = tuple(estimates)


def corrdp_epsilon(
    design: CorrDPDesign,
    noise_multiplier: float,
    clipping_norm: float,
    sampling_rate: float,
    rounds: int,
    delta: float,
    *,
    participation: float = 1.0,
    eps_error: float = 0.05,
) -> CorrDPEpsilon:
    """CorrDP ε of ``rounds`` identical rounds (see :class:`CorrDPAccountant`).

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> design = CorrDPDesign(roles, 2, (0.5, 0.5), 1.0)
    >>> more, less = (corrdp_epsilon(design, s, 1.0, 0.1, 20, 1e-5).epsilon for s in (2.0, 4.0))
    >>> more > less > 0
    True
    """
    acc = CorrDPAccountant(design.delta_estimation, eps_error)
    acc.compose(design.round_event(noise_multiplier=noise_multiplier, clipping_norm=clipping_norm,
                                   sampling_rate=sampling_rate, participation=participation), rounds)
    return acc.epsilon_bound(delta)


def effective_noise_multiplier(design: CorrDPDesign, noise_multiplier: float, clipping_norm: float) -> float:
    """``σ_eff = min_c 1/μ_c`` over classes of positive weight: charging
    ``SubsampledGaussian(σ_eff, 1.0, participation=q·p)`` per round bounds every
    class's revealed-coin ε and therefore the CorrDP ε (``d_c ≤ 1``), relation
    ``"corrdp"``. Looser than :class:`CorrDPAccountant` (ignores the TV weights and
    bound (ii)).

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> design = CorrDPDesign(roles, 2, (0.5, 0.5), 1.0)
    >>> s_eff = effective_noise_multiplier(design, 4.0, 1.0)
    >>> s_eff == min(1 / mu for mu in design.class_mu(4.0, 1.0).values())
    True
    """
    classes = [c for c in design.classes(noise_multiplier, clipping_norm) if c.weight > 0]
    return min(c.noise_multiplier for c in classes)


def calibrate_noise_multiplier(
    design: CorrDPDesign,
    target_epsilon: float,
    clipping_norm: float,
    sampling_rate: float,
    rounds: int,
    delta: float,
    *,
    participation: float = 1.0,
    eps_error: float = 0.05,
    rel_tol: float = 1e-3,
) -> float:
    """Smallest base ``σ`` (within ``rel_tol``) whose CorrDP ε is ``≤ target_epsilon``:
    :func:`fedfdp.accounting.protocol.calibrate` over :meth:`CorrDPDesign.round_event`.

    Every class's noise multiplier is proportional to ``σ``, so ε decreases in ``σ``.

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> design = CorrDPDesign(roles, 2, (0.5, 0.5), 1.0)
    >>> sigma = calibrate_noise_multiplier(design, 2.0, 1.0, 1.0, 10, 1e-5, rel_tol=1e-2)
    >>> corrdp_epsilon(design, sigma, 1.0, 1.0, 10, 1e-5).epsilon <= 2.0
    True
    """
    return calibrate(
        lambda: CorrDPAccountant(design.delta_estimation, eps_error),
        lambda s: design.round_event(noise_multiplier=s, clipping_norm=clipping_norm,
                                     sampling_rate=sampling_rate, participation=participation),
        target_epsilon=target_epsilon, rounds=rounds, delta=delta, rtol=rel_tol, max_noise_multiplier=1e6,
    )
