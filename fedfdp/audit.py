"""Empirical privacy: the statistics of a canary audit (a lower bound on ε).

Canary audit (lower bound on ε)
-------------------------------
A mechanism ``M`` is ``(ε, δ)``-FDP for a neighbouring relation when, for every
pair of neighbouring worlds ``W1, W2`` and every event ``E``,
``Pr[M(W1) ∈ E] ≤ e^ε Pr[M(W2) ∈ E] + δ`` and the same with the worlds
swapped. The worlds are

* **replacement** (Def. 5 of the FDP paper): two datasets that differ only in
  one record's private features (same ``Ψ``);
* **add/remove** (Def. 6): ``W1 = M(S ∪ {x})`` and ``W2 = sim(S, Ψ(x))``, the
  simulator of Algorithm 2 (appendix) — ``x``'s private contribution absent,
  its public features still in the public batch.

A distinguishing test that says "world 1" on ``E`` has false-positive rate
``FPR = Pr[M(W2) ∈ E]`` and false-negative rate ``FNR = 1 − Pr[M(W1) ∈ E]``,
so ``(ε, δ)``-FDP forces both

    ε ≥ log((1 − δ − FNR) / FPR)   and   ε ≥ log((1 − δ − FPR) / FNR).

From ``n`` independent trials in each world the audit replaces ``FPR`` and
``FNR`` by one-sided Clopper–Pearson **upper** bounds at level ``α/2`` each
(``α = 0.05``: a union bound makes both hold together with probability
``≥ 95%``). On that event the true rates are at most the bounds, the right-hand
sides only decrease, and so

    ε_lb = max(log((1 − δ − FNR_ub) / FPR_ub), log((1 − δ − FPR_ub) / FNR_ub), 0)

is a 95% lower bound on the ε of the implemented mechanism at ``δ``. If it
exceeds the ε the accountant claims (Theorem 5 for add/remove, Prop. 1 for
replacement), the implementation is not the accounted mechanism. The test's
statistic and threshold must not be fitted on the trials they are evaluated
on: :func:`choose_test` picks them on separate calibration trials.

Black-box form (hockey-stick divergence)
----------------------------------------
The same test also bounds the hockey-stick divergence
``H_{e^ε}(P‖Q) = sup_E P(E) − e^ε Q(E)`` of the two worlds' outputs from below
(:func:`hockey_stick_lower_bound`): ``(ε, δ)`` holds for a pair exactly when
both ``H_{e^ε}(P1‖P2)`` and ``H_{e^ε}(P2‖P1)`` are at most ``δ`` — the criterion
of black-box testers such as Google's dp_auditorium. :func:`audit_trials` runs
the whole procedure on per-trial scores of two neighbouring inputs (choose the
test on the first share of each world's trials, bound on the rest);
``tests/test_blackbox_mechanisms.py`` applies it to one real round of every mode.

One run (Steinke, Nasr and Jagielski 2023)
------------------------------------------
:func:`one_run_bound` turns the scores of ``m`` canaries, each put in the training
data of **one** run by an independent fair coin, into guesses and a ``1 − alpha``
lower bound on ε (:func:`one_run_p_value`: the theorem's tail of
``Binomial(r, e^ε/(1+e^ε))`` plus its δ term; :func:`one_run_epsilon`). The run and
the canaries are :mod:`simulations.auditing.one_run`'s (``fedfdp audit --one-run``).

The attribute-inference attack of Theorem 4 lives in :mod:`fedfdp.attack`.

Nothing here imports Flower: the harness that drives the client and strategy
lives in :mod:`simulations.audit`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "AuditResult",
    "EpsilonLowerBound",
    "Test",
    "audit_trials",
    "canary_scores",
    "choose_test",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "evaluate_test",
    "hockey_stick_lower_bound",
]

#: Default total confidence level of the audit (split α/2 per error rate).
ALPHA = 0.05


# --------------------------------------------------------------------------------------
# Clopper–Pearson
# --------------------------------------------------------------------------------------


def _check_counts(k: int, n: int) -> tuple[int, int]:
    if isinstance(k, bool) or isinstance(n, bool):
        raise ValueError(f"k={k!r}, n={n!r}: counts must be integers")
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"k={k}, n={n}: need n >= 1 and 0 <= k <= n")
    return k, n


def _check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha={alpha!r}: must be in (0, 1)")
    return a


def canary_scores(scores: Sequence[float] | np.ndarray,
                  included: Sequence[bool] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A one-run audit's inputs checked: one finite-or-infinite, non-NaN score per canary
    and its inclusion coin, at least two canaries (both one-run analyses read them).

    Raises
    ------
    ValueError
        One line: shapes that do not match, fewer than two canaries, a NaN score.
    """
    s = np.asarray(scores, dtype=float)
    inc = np.asarray(included, dtype=bool)
    if s.ndim != 1 or s.shape != inc.shape or len(s) < 2:
        raise ValueError(f"scores {s.shape}, included {inc.shape}: need one score per canary, >= 2 canaries")
    if np.isnan(s).any():
        raise ValueError("scores: NaN for some canary")
    return s, inc


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper confidence bound on a binomial rate.

    With probability at least ``1 − alpha`` over ``k ~ Bin(n, p)``, ``p`` is at
    most the returned value: the ``1 − alpha`` quantile of ``Beta(k + 1, n − k)``
    (``1`` when ``k = n``; ``1 − alpha^(1/n)`` when ``k = 0``).
    """
    k, n = _check_counts(k, n)
    a = _check_alpha(alpha)
    if k == n:
        return 1.0
    if k == 0:
        return float(-math.expm1(math.log(a) / n))
    return float(stats.beta.ppf(1.0 - a, k + 1, n - k))


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower confidence bound on a binomial rate:
    the ``alpha`` quantile of ``Beta(k, n − k + 1)`` (``0`` when ``k = 0``,
    ``alpha^(1/n)`` when ``k = n``).
    """
    k, n = _check_counts(k, n)
    a = _check_alpha(alpha)
    if k == 0:
        return 0.0
    if k == n:
        return float(math.exp(math.log(a) / n))
    return float(stats.beta.ppf(a, k, n - k + 1))


# --------------------------------------------------------------------------------------
# ε lower bound from a test's error counts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpsilonLowerBound:
    """A 95% (``1 − alpha``) lower bound on ε at ``delta`` from one test's errors.

    Attributes
    ----------
    epsilon : float
        ``max(log((1 − δ − FNR_ub)/FPR_ub), log((1 − δ − FPR_ub)/FNR_ub), 0)``.
    fpr, fnr : float
        Observed error rates (world 2 called world 1; world 1 called world 2).
    fpr_upper, fnr_upper : float
        One-sided Clopper–Pearson upper bounds, each at level ``alpha/2``.
    false_positives, negatives, false_negatives, positives : int
        The counts: trials in world 2 (negatives) and world 1 (positives).
    delta, alpha : float
    """

    epsilon: float
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float
    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    delta: float
    alpha: float


def _log_ratio(num: float, den: float) -> float:
    if num <= 0.0:
        return 0.0
    if den <= 0.0:
        return math.inf
    return math.log(num / den)


def epsilon_lower_bound(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    alpha: float = ALPHA,
) -> EpsilonLowerBound:
    """Lower confidence bound on ε from a distinguishing test's error counts.

    Parameters
    ----------
    false_positives, negatives : int
        World-2 trials the test called world 1, out of ``negatives``.
    false_negatives, positives : int
        World-1 trials the test called world 2, out of ``positives``.
    delta : float
        The δ of the ``(ε, δ)`` statement, in ``[0, 1)``.
    alpha : float
        Total error probability; ``alpha/2`` goes to each Clopper–Pearson
        bound, so both hold together with probability ``≥ 1 − alpha`` (union
        bound) and the returned ε is then below the mechanism's true ε.

    Returns
    -------
    EpsilonLowerBound
    """
    fp, nn_ = _check_counts(false_positives, negatives)
    fn, np_ = _check_counts(false_negatives, positives)
    d = float(delta)
    if not 0.0 <= d < 1.0:
        raise ValueError(f"delta={delta!r}: must be in [0, 1)")
    a = _check_alpha(alpha)
    fpr_ub = clopper_pearson_upper(fp, nn_, a / 2)
    fnr_ub = clopper_pearson_upper(fn, np_, a / 2)
    eps = max(_log_ratio(1.0 - d - fnr_ub, fpr_ub), _log_ratio(1.0 - d - fpr_ub, fnr_ub), 0.0)
    return EpsilonLowerBound(
        epsilon=eps,
        fpr=fp / nn_,
        fnr=fn / np_,
        fpr_upper=fpr_ub,
        fnr_upper=fnr_ub,
        false_positives=fp,
        negatives=nn_,
        false_negatives=fn,
        positives=np_,
        delta=d,
        alpha=a,
    )


# --------------------------------------------------------------------------------------
# choosing the test on calibration trials
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Test:
    """A threshold test on one of several candidate statistics.

    Says "world 1" when ``sign · score[statistic] > threshold``.
    """

    statistic: str
    sign: float
    threshold: float

    def decide(self, scores: np.ndarray) -> np.ndarray:
        """Boolean "world 1" decisions for an array of that statistic's scores."""
        return self.sign * np.asarray(scores, dtype=float) > self.threshold


def choose_test(
    positives: dict[str, np.ndarray],
    negatives: dict[str, np.ndarray],
    delta: float,
    alpha: float = ALPHA,
    max_candidates: int = 2000,
    sizes: tuple[int, int] | None = None,
) -> tuple[Test, float]:
    """Pick the statistic, direction and threshold on calibration trials.

    For every statistic (a name mapping to per-trial scores in world 1,
    ``positives``, and world 2, ``negatives``) and both directions, the
    threshold that maximises :func:`epsilon_lower_bound` on these calibration
    trials is found; the best of all is returned with its calibration ε. Only
    the chosen test is then evaluated on separate trials
    (:func:`evaluate_test`), so the final bound pays for no search.

    Scores may be infinite: ``-inf`` always says "world 2" and ``+inf`` always
    "world 1" (with ``sign = -1`` the roles swap, which gives the complementary
    test: a statistic ``T if E else -inf`` yields both "E and T > t" and
    "not (E and T < t)").

    ``sizes = (positives, negatives)`` of the trials the test will be
    evaluated on: the bound is then projected to that many trials, with error
    rates estimated as ``(k + 1/2)/(n + 1)`` (so a threshold no calibration
    trial crossed is not taken for a perfect one). Without it the bound is
    computed on the calibration counts themselves.
    """
    if set(positives) != set(negatives) or not positives:
        raise ValueError("positives and negatives must name the same, non-empty set of statistics")
    best: tuple[Test, float] | None = None
    for name in positives:
        pos = np.asarray(positives[name], dtype=float)
        neg = np.asarray(negatives[name], dtype=float)
        if len(pos) == 0 or len(neg) == 0:
            raise ValueError(f"statistic {name!r}: no calibration trials")
        for sign in (1.0, -1.0):
            t, e = _search(sign * pos, sign * neg, delta, alpha, max_candidates, sizes)
            if best is None or e > best[1]:
                best = (Test(name, sign, t), e)
    if best is None:  # unreachable: the loop runs for both signs
        raise RuntimeError(f"statistic {name!r}: no test chosen")
    return best


def _search(
    pos: np.ndarray,
    neg: np.ndarray,
    delta: float,
    alpha: float,
    max_candidates: int,
    sizes: tuple[int, int] | None = None,
) -> tuple[float, float]:
    """Best threshold over (at most ``max_candidates``) quantiles of the pooled scores."""
    n_pos, n_neg = len(pos), len(neg)
    pooled = np.concatenate([pos, neg])
    pooled = np.unique(pooled[np.isfinite(pooled)])
    if len(pooled) == 0:
        return math.inf, 0.0
    if len(pooled) > max_candidates:
        pooled = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, max_candidates)))
    ps, ns = np.sort(pos), np.sort(neg)
    tp = n_pos - np.searchsorted(ps, pooled, side="right")
    fp = n_neg - np.searchsorted(ns, pooled, side="right")
    best_t, best_e = math.inf, 0.0
    for t, a, b in zip(pooled, tp, fp, strict=True):
        fn = n_pos - int(a)
        if sizes is None:
            e = epsilon_lower_bound(int(b), n_neg, fn, n_pos, delta, alpha).epsilon
        else:
            tp_n, tn_n = sizes
            fp_p = min(tn_n, round((int(b) + 0.5) / (n_neg + 1) * tn_n))
            fn_p = min(tp_n, round((fn + 0.5) / (n_pos + 1) * tp_n))
            e = epsilon_lower_bound(fp_p, tn_n, fn_p, tp_n, delta, alpha).epsilon
        if e > best_e:
            best_t, best_e = float(t), e
    return best_t, best_e


def evaluate_test(
    test: Test,
    positives: np.ndarray,
    negatives: np.ndarray,
    delta: float,
    alpha: float = ALPHA,
) -> EpsilonLowerBound:
    """Apply a fixed test to fresh trials and bound ε (:func:`epsilon_lower_bound`)."""
    pos = test.decide(positives)
    neg = test.decide(negatives)
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("evaluate_test: need trials in both worlds")
    return epsilon_lower_bound(int(neg.sum()), len(neg), int((~pos).sum()), len(pos), delta, alpha)


@dataclass(frozen=True)
class AuditResult:
    """Outcome of one audit: the bound, the claim and how they compare."""

    epsilon_lower: float
    epsilon_claimed: float
    relation: str
    delta: float
    trials: int
    test: Test
    bound: EpsilonLowerBound
    calibration_epsilon: float

    @property
    def violated(self) -> bool:
        """Whether the lower bound exceeds the claimed ε (the implementation is
        not the accounted mechanism, with 95% confidence).
        """
        return self.epsilon_lower > self.epsilon_claimed


# --------------------------------------------------------------------------------------
# black-box form: divergence bound, and the whole procedure on per-trial scores
# --------------------------------------------------------------------------------------


def hockey_stick_lower_bound(bound: EpsilonLowerBound, epsilon: float) -> float:
    """Lower confidence bound on the hockey-stick divergence at ``e^ε`` of the two worlds.

    With ``E`` the event "the test says world 1", ``P1(E) ≥ 1 − FNR_ub`` and
    ``P2(E) ≤ FPR_ub`` hold together with probability ``≥ 1 − alpha`` (the two
    Clopper–Pearson bounds of ``bound``), and then

        H_{e^ε}(P1‖P2) ≥ P1(E) − e^ε P2(E) ≥ (1 − FNR_ub) − e^ε FPR_ub,
        H_{e^ε}(P2‖P1) ≥ (1 − FPR_ub) − e^ε FNR_ub     (the complement of E).

    Returns the larger of the two (at least 0). A mechanism that is ``(ε, δ)``
    for the pair has both divergences ``≤ δ``, so a value above ``δ`` refutes the
    claim with confidence ``1 − alpha`` — the same verdict as
    ``bound.epsilon > ε``.
    """
    e = float(epsilon)
    if not (math.isfinite(e) and e >= 0.0):
        raise ValueError(f"epsilon={epsilon!r}: must be finite and >= 0")
    forward = (1.0 - bound.fnr_upper) - math.exp(e) * bound.fpr_upper
    backward = (1.0 - bound.fpr_upper) - math.exp(e) * bound.fnr_upper
    return max(forward, backward, 0.0)


def _scores(name: str, value: Mapping[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
    if isinstance(value, Mapping):
        return {k: np.asarray(v, dtype=float) for k, v in value.items()}
    arr = np.asarray(value, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name}: scores of shape {arr.shape}; need one score per trial")
    return {"score": arr}


def audit_trials(
    positives: Mapping[str, np.ndarray] | np.ndarray,
    negatives: Mapping[str, np.ndarray] | np.ndarray,
    *,
    claimed_epsilon: float,
    delta: float,
    relation: str,
    calibration: float = 1.0 / 3.0,
    alpha: float = ALPHA,
) -> AuditResult:
    """A black-box audit of one neighbouring pair from per-trial scores.

    ``positives`` are the scores of trials on world 1 (the input with the unit),
    ``negatives`` those on world 2 (its neighbour), each a statistic name →
    scores in trial order (or one array). The first ``calibration`` share of
    each world's trials chooses the statistic, direction and threshold
    (:func:`choose_test`, projected to the held-out counts); the rest bound ε
    (:func:`evaluate_test`), so the bound pays for no search. The result is
    :attr:`~AuditResult.violated` when the ``1 − alpha`` lower bound exceeds
    ``claimed_epsilon``.
    """
    pos, neg = _scores("positives", positives), _scores("negatives", negatives)
    if set(pos) != set(neg) or not pos:
        raise ValueError("positives and negatives must name the same, non-empty set of statistics")
    if not 0.0 < calibration < 1.0:
        raise ValueError(f"calibration={calibration!r}: must be in (0, 1)")
    if not (math.isfinite(claimed_epsilon) and claimed_epsilon >= 0.0):
        raise ValueError(f"claimed_epsilon={claimed_epsilon!r}: must be finite and >= 0")
    n_pos = {len(v) for v in pos.values()}
    n_neg = {len(v) for v in neg.values()}
    if len(n_pos) != 1 or len(n_neg) != 1:
        raise ValueError("every statistic needs one score per trial (same length per world)")
    cut_pos = round(calibration * n_pos.pop())
    cut_neg = round(calibration * n_neg.pop())
    held_pos = {k: v[cut_pos:] for k, v in pos.items()}
    held_neg = {k: v[cut_neg:] for k, v in neg.items()}
    first = next(iter(pos))
    sizes = (len(held_pos[first]), len(held_neg[first]))
    if min(cut_pos, cut_neg) < 1 or min(sizes) < 1:
        raise ValueError(
            f"trials (world 1, world 2): {(cut_pos, cut_neg)} for calibration, {sizes} held out; "
            "need at least one of each"
        )
    calib_pos = {k: v[:cut_pos] for k, v in pos.items()}
    calib_neg = {k: v[:cut_neg] for k, v in neg.items()}
    test, cal_eps = choose_test(calib_pos, calib_neg, delta, alpha, sizes=sizes)
    bound = evaluate_test(test, held_pos[test.statistic], held_neg[test.statistic], delta, alpha)
    return AuditResult(
        epsilon_lower=bound.epsilon,
        epsilon_claimed=float(claimed_epsilon),
        relation=relation,
        delta=float(delta),
        trials=sum(sizes),
        test=test,
        bound=bound,
        calibration_epsilon=cal_eps,
    )


# --------------------------------------------------------------------------------------
# one-run auditing (Steinke, Nasr and Jagielski 2023)
# --------------------------------------------------------------------------------------
#
# m canaries, each in the training data or not by an independent fair coin; one
# training run; the auditor guesses "in" for some canaries, "out" for others and
# abstains on the rest. If the run is (ε, δ)-DP with respect to each canary (for
# FDP: the add/remove relation of Def. 6, the simulator standing in for an absent
# canary), the number W of correct guesses among r guesses satisfies, for every v,
#
#     P[W ≥ v] ≤ P[B ≥ v] + 2mδ · max_{1≤i≤v} P[v − i ≤ B < v] / i,   B ~ Bin(r, e^ε/(1 + e^ε))
#
# (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS
# 2023: the theorem for approximate DP; for δ = 0 it says W is stochastically dominated
# by B). The right-hand side at the observed W is a p-value for the claim "(ε, δ)".


def one_run_p_value(epsilon: float, delta: float, canaries: int, guesses: int, correct: int) -> float:
    """The p-value of ``correct`` right guesses out of ``guesses`` under the claim that
    the run is ``(epsilon, delta)``-DP with respect to each of ``canaries`` canaries
    included by independent fair coins (the theorem in the section comment above).

    ``P[B ≥ v] + 2mδ · max_{1≤i≤v} P[v − i ≤ B < v]/i`` with ``B ~ Bin(r, e^ε/(1+e^ε))``,
    ``m = canaries``, ``r = guesses``, ``v = correct``; at most 1.
    """
    m, r, v = _check_guesses(canaries, guesses, correct)
    e, d = float(epsilon), float(delta)
    if not (math.isfinite(e) and e >= 0.0):
        raise ValueError(f"epsilon={epsilon!r}: must be finite and >= 0")
    if not 0.0 <= d < 1.0:
        raise ValueError(f"delta={delta!r}: must be in [0, 1)")
    p = 1.0 / (1.0 + math.exp(-e))
    tail = float(stats.binom.sf(v - 1, r, p))  # P[B ≥ v]
    if d == 0.0 or v == 0:
        return min(1.0, tail)
    steps = np.arange(1, v + 1)
    between = stats.binom.sf(v - steps - 1, r, p) - tail  # P[v − i ≤ B < v]
    return float(min(1.0, tail + 2.0 * m * d * float(np.max(between / steps))))


def _check_guesses(canaries: int, guesses: int, correct: int) -> tuple[int, int, int]:
    for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{name}={value!r}: must be an integer")
    m, r, v = int(canaries), int(guesses), int(correct)
    if not 0 <= v <= r <= m or m < 1:
        raise ValueError(f"canaries={m}, guesses={r}, correct={v}: need 0 <= correct <= guesses <= canaries")
    return m, r, v


def one_run_epsilon(canaries: int, guesses: int, correct: int, delta: float, alpha: float = ALPHA) -> float:
    """The ``1 − alpha`` lower confidence bound on ε from one run's guesses: the largest
    ε whose claim ``(ε, delta)`` the guesses reject at level ``alpha``
    (:func:`one_run_p_value` ``≤ alpha``); 0 when not even ε = 0 is rejected. For
    ``delta = 0`` in closed form (``P[Bin(r, p) ≥ v] = α`` at the ``α``-quantile of
    ``Beta(v, r − v + 1)``), otherwise by bisection below that value.

    The p-value grows with ε when ``2·canaries·delta ≤ 1`` (the δ term's derivative
    cannot outweigh the tail's), so every ε below the returned one is rejected too;
    a larger δ term is refused. If the run is ``(ε*, delta)``-DP, the returned value
    exceeds ε* with probability at most ``alpha``.
    """
    m, r, v = _check_guesses(canaries, guesses, correct)
    a = _check_alpha(alpha)
    if 2.0 * m * float(delta) > 1.0:
        raise ValueError(
            f"canaries={m}, delta={delta}: the theorem's delta term 2*m*delta = {2 * m * delta:.3g} "
            "exceeds 1 (fewer canaries, or a smaller delta)"
        )
    if r == 0 or v == 0 or one_run_p_value(0.0, delta, m, r, v) > a:
        return 0.0
    # δ = 0: P[Bin(r, p) ≥ v] = I_p(v, r − v + 1) is α at the α-quantile of Beta(v, r − v + 1)
    p0 = float(stats.beta.ppf(a, v, r - v + 1))
    top = math.log(p0) - math.log1p(-p0) if p0 < 1.0 else 745.0
    if float(delta) == 0.0:
        return max(0.0, top)
    lo, hi = 0.0, max(top, 0.0)  # the δ term only raises the p-value: the bound is at most top
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(mid, delta, m, r, v) <= a:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class OneRunBound:
    """The one-run audit's bound (:func:`one_run_bound`).

    Attributes
    ----------
    epsilon : float
        The ``1 − alpha`` lower bound on ε at ``delta``: the best over the guess
        patterns tried, each bounded at ``alpha / candidates`` (Bonferroni).
    guesses_in, guesses_out : int
        The pattern that gave it: "in" for the top-scored ``guesses_in`` canaries,
        "out" for the bottom-scored ``guesses_out`` (``r`` is their sum).
    correct : int
        ``v``: correct guesses of that pattern.
    canaries, included : int
        ``m`` and how many canaries the coins put in.
    delta, alpha : float
    candidates : int
        Patterns tried.
    """

    epsilon: float
    guesses_in: int
    guesses_out: int
    correct: int
    canaries: int
    included: int
    delta: float
    alpha: float
    candidates: int

    @property
    def guesses(self) -> int:
        return self.guesses_in + self.guesses_out


#: Guess patterns of :func:`one_run_bound`: ``(in, out)`` as shares of the canaries —
#: "in" for the top-scored, "out" for the bottom-scored, abstaining on the rest. Fixed
#: before any score is seen.
GUESS_PATTERNS: tuple[tuple[float, float], ...] = (
    (0.025, 0.0), (0.05, 0.0), (0.1, 0.0), (0.2, 0.0), (0.35, 0.0),
    (0.05, 0.05), (0.1, 0.1), (0.2, 0.2), (0.35, 0.35), (0.5, 0.5),
)


def one_run_bound(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    alpha: float = ALPHA,
    patterns: tuple[tuple[float, float], ...] = GUESS_PATTERNS,
) -> OneRunBound:
    """Guess from scores and bound ε (Steinke et al. 2023; :func:`one_run_epsilon`).

    For each pattern ``(a, b)`` the auditor guesses "in" for the ``round(a·m)``
    highest ``scores`` and "out" for the ``round(b·m)`` lowest (abstaining on the
    rest), counts the correct guesses against ``included`` (the coins) and bounds ε
    at level ``alpha/len(patterns)``; the largest bound is returned (Bonferroni over
    the patterns: it holds with probability ``≥ 1 − alpha``). Ties are broken by
    canary index, a rule fixed before the scores.
    """
    s, inc = canary_scores(scores, included)
    if not patterns or any(not (min(a, b) >= 0.0 and 0.0 < a + b <= 1.0) for a, b in patterns):
        raise ValueError(f"patterns={patterns}: need shares (in, out) >= 0 with 0 < in + out <= 1")
    a_ = _check_alpha(alpha)
    m = len(s)
    order = np.argsort(s, kind="stable")
    best = OneRunBound(0.0, 0, 0, 0, m, int(inc.sum()), float(delta), a_, len(patterns))
    for share_in, share_out in patterns:
        k_in, k_out = round(share_in * m), round(share_out * m)
        if k_in + k_out == 0 or k_in + k_out > m:
            continue
        correct = int(inc[order[m - k_in:]].sum() + (~inc[order[:k_out]]).sum())
        eps = one_run_epsilon(m, k_in + k_out, correct, delta, a_ / len(patterns))
        if eps > best.epsilon:
            best = OneRunBound(eps, k_in, k_out, correct, m, int(inc.sum()), float(delta), a_, len(patterns))
    return best


__all__ += ["GUESS_PATTERNS", "OneRunBound", "one_run_bound", "one_run_epsilon", "one_run_p_value"]
