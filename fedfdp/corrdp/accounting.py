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

The ledger
----------
:class:`CorrDPAccountant` keeps the rounds ``(σ, C, q, p)`` and composes every class
from them on demand (classes dominated by another, ``d ≤ d'`` with at least as much
noise in every round, are skipped). :func:`effective_noise_multiplier` is a single
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

from fedfdp.accounting import FDPAccountant
from fedfdp.corrdp.noise import CorrDPDesign
from fedfdp.corrdp.roles import RELATION

#: Explanation of the relation, printed beside every CorrDP ε.
RELATION_TEXT = (
    "CorrDP: one record's sensitive features replaced -> eps, one insensitive feature j "
    "replaced -> eps/TV(j); labels fixed; membership not protected"
)


@dataclass(frozen=True)
class Round:
    """``count`` rounds with base noise multiplier ``σ``, clipping norm ``C``, sampling
    rate ``q`` and participation ``p``."""

    noise_multiplier: float
    clipping_norm: float
    sampling_rate: float
    participation: float = 1.0
    count: int = 1

    def __post_init__(self) -> None:
        for name, v in (("noise-multiplier", self.noise_multiplier), ("clipping-norm", self.clipping_norm)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}={v}: must be finite and > 0")
        for name, v in (("sampling-rate", self.sampling_rate), ("participation", self.participation)):
            if not (math.isfinite(v) and 0 < v <= 1):
                raise ValueError(f"{name}={v}: must be in (0, 1]")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count={self.count!r}: must be an integer >= 1")


@dataclass(frozen=True)
class ClassEpsilon:
    """One class: its weight ``d_c``, the two bounds on its ``ε_c`` (upper ends of the
    accountant's intervals), ``ε_c`` = the smaller, and ``d_c·ε_c``."""

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
    relation : str
        Always ``"corrdp"``.
    binding : str
        The class attaining the max.
    classes : tuple of ClassEpsilon
        The classes composed (dominated ones are skipped).

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> e = corrdp_epsilon(CorrDPDesign(roles, 2, (0.5, 0.5), 1.0), 4.0, 1.0, 0.1, 20, 1e-5)
    >>> e.relation, [c.name for c in e.classes], e.label().startswith("eps_corrdp = ")
    ('corrdp', ['sensitive', 'feature:speed'], True)
    """

    epsilon: float
    delta: float
    relation: str
    binding: str
    classes: tuple[ClassEpsilon, ...]

    def label(self) -> str:
        """``ε = … (corrdp …)``: the form in which a CorrDP ε may be shown."""
        return f"eps_corrdp = {self.epsilon:.4g} (upper bound; {RELATION_TEXT}; delta = {self.delta:.3g})"


def _key(r: Round) -> tuple[float, float, float, float]:
    return (r.noise_multiplier, r.clipping_norm, r.sampling_rate, r.participation)


def _events(
    design: CorrDPDesign, rounds: Sequence[Round]
) -> dict[str, tuple[float, list[tuple[float, Round]]]]:
    weights = design.class_weights()
    out: dict[str, tuple[float, list[tuple[float, Round]]]] = {
        c: (w, []) for c, w in weights.items() if w > 0
    }
    for r in rounds:
        for cls in design.classes(r.noise_multiplier, r.clipping_norm):
            if cls.name in out:
                out[cls.name][1].append((cls.noise_multiplier, r))
    return out


def _undominated(events: dict[str, tuple[float, list[tuple[float, Round]]]]) -> list[str]:
    names = list(events)
    keep = []
    for c in names:
        wc, ec = events[c]
        dominated = False
        for o in names:
            if o == c:
                continue
            wo, eo = events[o]
            at_least = wo >= wc and all(so <= sc for (so, _), (sc, _) in zip(eo, ec, strict=True))
            strictly = wo > wc or any(so < sc for (so, _), (sc, _) in zip(eo, ec, strict=True))
            if at_least and (strictly or o < c):  # ties: keep one
                dominated = True
                break
        if not dominated:
            keep.append(c)
    return keep


def _whole_record_epsilon(
    design: CorrDPDesign, rounds: Sequence[Round], delta: float, eps_error: float
) -> float:
    """Bound (ii): add/remove subsampled Gaussians with shift ``M`` per round, replacement by Prop. 1."""
    acc = FDPAccountant(eps_error=eps_error)
    for r in rounds:
        visibility = design.record_visibility(r.noise_multiplier, r.clipping_norm)
        acc.compose(1.0 / visibility, r.sampling_rate, r.count, participation=r.participation)
    return float(acc.epsilon(delta, "replacement"))


def _class_epsilon(events: list[tuple[float, Round]], delta: float, eps_error: float) -> float:
    """Bound (i): the revealed-coin participation events of one class."""
    acc = FDPAccountant(eps_error=eps_error)
    for sigma_c, r in events:
        if math.isinf(sigma_c):
            continue  # this class's sensitivity is 0: nothing to compose
        acc.compose(sigma_c, 1.0, r.count, participation=r.sampling_rate * r.participation)
    if acc.rounds == 0:
        return 0.0
    return float(acc.epsilon(delta))


class CorrDPAccountant:
    """Ledger and ε of CorrDP-SGD rounds (module docstring).

    Parameters
    ----------
    design : CorrDPDesign
    eps_error : float
        Passed to every class's :class:`~fedfdp.accounting.FDPAccountant`.

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> acc = CorrDPAccountant(CorrDPDesign(roles, 2, (0.5, 0.5), 1.0))
    >>> acc.compose(noise_multiplier=4.0, clipping_norm=1.0, sampling_rate=0.1, count=20)
    >>> acc.rounds, acc.epsilon_bound(1e-5).relation
    (20, 'corrdp')
    >>> acc.would_exceed(1e9, 1e-5, 4.0, 1.0, 0.1), acc.rounds
    (False, 20)
    """

    relation = RELATION

    def __init__(self, design: CorrDPDesign, eps_error: float = 0.05) -> None:
        self.design = design
        self.eps_error = eps_error
        self._rounds: list[Round] = []

    @property
    def ledger(self) -> tuple[Round, ...]:
        return tuple(self._rounds)

    @property
    def rounds(self) -> int:
        return sum(r.count for r in self._rounds)

    def compose(
        self,
        noise_multiplier: float,
        clipping_norm: float,
        sampling_rate: float,
        count: int = 1,
        *,
        participation: float = 1.0,
    ) -> None:
        """Record ``count`` rounds of base ``σ`` and ``C`` at rate ``q``, participation ``p``."""
        r = Round(noise_multiplier, clipping_norm, sampling_rate, participation, count)
        last = self._rounds[-1] if self._rounds else None
        if last is not None and _key(last) == _key(r):
            self._rounds[-1] = Round(*_key(r), last.count + count)
        else:
            self._rounds.append(r)

    def _bound(self, rounds: Sequence[Round], delta: float) -> CorrDPEpsilon:
        if not (math.isfinite(delta) and self.design.delta_estimation < delta < 1.0):
            raise ValueError(
                f"delta={delta}: must be in (delta_estimation={self.design.delta_estimation}, 1)"
            )
        mech_delta = delta - self.design.delta_estimation
        events = _events(self.design, rounds)
        whole = _whole_record_epsilon(self.design, rounds, mech_delta, self.eps_error) if rounds else 0.0
        results = []
        for name in _undominated(events):
            weight, ev = events[name]
            revealed = _class_epsilon(ev, mech_delta, self.eps_error)
            results.append(ClassEpsilon(name, weight, min(revealed, whole), revealed, whole))
        if not results:
            return CorrDPEpsilon(0.0, delta, RELATION, "", ())
        best = max(results, key=lambda c: c.weighted)
        return CorrDPEpsilon(best.weighted, delta, RELATION, best.name, tuple(results))

    def epsilon_bound(self, delta: float) -> CorrDPEpsilon:
        """The CorrDP ε of the ledger at total ``δ``, with its breakdown."""
        return self._bound(self._rounds, delta)

    def epsilon(self, delta: float) -> float:
        return self.epsilon_bound(delta).epsilon

    def would_exceed(
        self,
        max_epsilon: float,
        delta: float,
        noise_multiplier: float,
        clipping_norm: float,
        sampling_rate: float,
        count: int = 1,
        *,
        participation: float = 1.0,
    ) -> bool:
        """Whether ``count`` more such rounds would take ε above ``max_epsilon`` (no mutation)."""
        extra = Round(noise_multiplier, clipping_norm, sampling_rate, participation, count)
        return self._bound([*self._rounds, extra], delta).epsilon > max_epsilon

    def state_dict(self) -> dict[str, Any]:
        return {
            "relation": RELATION,
            "eps_error": self.eps_error,
            "rounds": [
                [r.noise_multiplier, r.clipping_norm, r.sampling_rate, r.participation, r.count]
                for r in self._rounds
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("relation") != RELATION:
            raise ValueError(f"state relation={state.get('relation')!r}: not a CorrDP ledger")
        rounds = [Round(float(s), float(c), float(q), float(p), int(n)) for s, c, q, p, n in state["rounds"]]
        self.eps_error = float(state.get("eps_error", self.eps_error))
        self._rounds = rounds


#: Bounds of :class:`CorrDPRunAccountant`, shared by its instances (least recently used dropped).
_BOUNDS: OrderedDict[tuple[Any, ...], CorrDPEpsilon] = OrderedDict()
_BOUNDS_SIZE = 512


class CorrDPRunAccountant:
    """A run's CorrDP ledger at a fixed clipping norm, with
    :class:`~fedfdp.accounting.FDPAccountant`'s run interface (what
    :class:`fedfdp.budget.Budget` and the write-ahead ledger call).

    ``compose(σ, q, count, participation=p)`` records rounds of base ``σ`` at the
    design's ``C``; ``epsilon(δ)`` is the CorrDP ε (:class:`CorrDPAccountant`,
    relation ``"corrdp"``). Every bound computed is memoised (per process, by the
    design, the rounds and δ), so the budget check before a round and the ε after it
    cost one evaluation, and runs of the same design and σ (seeds of a sweep, an
    audit's trials) share them.
    ``state_dict()["ledger"]`` holds the rounds ``[σ, q, participation, count]``
    (the ledger's integrity check compares it with a replay of the charges).

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
    >>> acc = CorrDPRunAccountant(CorrDPDesign(roles, 2, (0.5, 0.5), 1.0), clipping_norm=1.0)
    >>> acc.compose(4.0, 0.1, 20)
    >>> acc.epsilon(1e-5) == corrdp_epsilon(acc.design, 4.0, 1.0, 0.1, 20, 1e-5).epsilon
    True
    >>> acc.would_exceed(1e9, 1e-5, 4.0, 0.1), acc.rounds
    (False, 20)
    """

    relation = RELATION

    def __init__(self, design: CorrDPDesign, clipping_norm: float, eps_error: float = 0.05) -> None:
        self.design = design
        self.clipping_norm = float(clipping_norm)
        self.accountant = CorrDPAccountant(design, eps_error)

    @property
    def rounds(self) -> int:
        return self.accountant.rounds

    def _epsilon(self, rounds: Sequence[Round], delta: float) -> CorrDPEpsilon:
        key = (self.design, self.accountant.eps_error, tuple(rounds), delta)
        found = _BOUNDS.get(key)
        if found is None:
            found = self.accountant._bound(rounds, delta)
            _BOUNDS[key] = found
            while len(_BOUNDS) > _BOUNDS_SIZE:
                _BOUNDS.popitem(last=False)
        else:
            _BOUNDS.move_to_end(key)
        return found

    def compose(
        self, noise_multiplier: float, sampling_rate: float, count: int = 1, *, participation: float = 1.0
    ) -> None:
        """Record ``count`` rounds of base ``σ`` at rate ``q`` and participation ``p``."""
        self.accountant.compose(
            noise_multiplier, self.clipping_norm, sampling_rate, count, participation=participation
        )

    def epsilon_bound(self, delta: float) -> CorrDPEpsilon:
        """The CorrDP ε of the rounds so far with its per-class breakdown."""
        return self._epsilon(self.accountant.ledger, delta)

    def epsilon(self, delta: float) -> float:
        return self.epsilon_bound(delta).epsilon

    def would_exceed(
        self,
        max_epsilon: float,
        delta: float,
        noise_multiplier: float,
        sampling_rate: float,
        count: int = 1,
        *,
        participation: float = 1.0,
    ) -> bool:
        """Whether ``count`` more rounds would take ε above ``max_epsilon`` (no mutation)."""
        extra = Round(noise_multiplier, self.clipping_norm, sampling_rate, participation, count)
        ledger = list(self.accountant.ledger)
        if ledger and _key(ledger[-1]) == _key(extra):
            ledger[-1] = Round(*_key(extra), ledger[-1].count + count)
        else:
            ledger.append(extra)
        return self._epsilon(ledger, delta).epsilon > max_epsilon

    def state_dict(self) -> dict[str, Any]:
        rounds = self.accountant.ledger
        return {
            "relation": RELATION,
            "clipping_norm": self.clipping_norm,
            "eps_error": self.accountant.eps_error,
            "ledger": [[r.noise_multiplier, r.sampling_rate, r.participation, r.count] for r in rounds],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        relation = state.get("relation") if isinstance(state, dict) else None
        if relation != RELATION:
            raise ValueError(f"state relation={relation!r}: not a CorrDP ledger")
        if float(state.get("clipping_norm", math.nan)) != self.clipping_norm:
            raise ValueError(
                f"state clipping_norm={state.get('clipping_norm')!r}: the run clips at {self.clipping_norm}"
            )
        c = self.clipping_norm
        rounds = [[float(s), c, float(q), float(p), int(n)] for s, q, p, n in state["ledger"]]
        eps_error = state.get("eps_error", self.accountant.eps_error)
        self.accountant.load_state_dict({"relation": RELATION, "eps_error": eps_error, "rounds": rounds})


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
    acc = CorrDPAccountant(design, eps_error)
    acc.compose(noise_multiplier, clipping_norm, sampling_rate, rounds, participation=participation)
    return acc.epsilon_bound(delta)


def effective_noise_multiplier(design: CorrDPDesign, noise_multiplier: float, clipping_norm: float) -> float:
    """``σ_eff = min_c 1/μ_c`` over classes of positive weight: charging
    ``FDPAccountant.compose(σ_eff, 1.0, participation=q·p)`` per round bounds every
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
    """Smallest base ``σ`` (within ``rel_tol``) whose CorrDP ε is ``≤ target_epsilon``.

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
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target-epsilon={target_epsilon}: must be finite and > 0")

    def eps(s: float) -> float:
        return corrdp_epsilon(
            design, s, clipping_norm, sampling_rate, rounds, delta,
            participation=participation, eps_error=eps_error,
        ).epsilon  # fmt: skip

    lo, hi = 1e-3, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"target-epsilon={target_epsilon}: unreachable with noise multiplier <= 1e6")
    if eps(lo) <= target_epsilon:
        return lo
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= target_epsilon else (mid, hi)
    return hi
