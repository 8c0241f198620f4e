"""One-run auditing with trade-off functions (f-DP).

Mahloujifar, Melis and Chaudhuri, *Auditing f-Differential Privacy in One Run*
(ICML 2025, arXiv:2410.22235): the setting of Steinke, Nasr and Jagielski
(NeurIPS 2023) — ``m`` canaries, each in or out by an independent fair coin, one
run, ``k`` guesses of which ``c`` are right — analysed with the whole trade-off
curve ``f`` the claim gives for each canary instead of one ``(ε, δ)`` pair.

The bound (their recursive algorithm)
-------------------------------------
Write ``g(x) = f(1 − x)``: if the mechanism is ``f``-DP with respect to a canary,
an event of probability ``x`` with the canary in has probability at least
``g(x)`` with it out, and the other way round (``f`` symmetric). Pick a canary
``J`` uniformly among the ``m``; let ``C`` be the number of right guesses and

    R_i = P[J guessed right, C ≥ i],     H_i = P[J guessed wrong, C ≥ i].

Flipping ``J``'s coin turns "``J`` right, ``C ≥ i``" into "``J`` wrong,
``C ≥ i − 1``" on the same output, so ``f``-DP (and Jensen's inequality over
``J`` and over the two guess directions, ``g`` being convex) gives
``H_{i−1} ≥ g(R_i)``. With ``p_i = P[C = i]``, ``R_i − R_{i+1} = p_i·i/m`` and
``H_i − H_{i+1} = p_i·(k − i)/m``, and the masses add up to ``k/m``. If
``P[C ≥ c] ≥ β``, moving the tail's mass to ``C = c`` keeps every constraint
below ``c``, so

    R_c = βc/m,  H_c = β(k − c)/m,
    H_i = max(H_{i+1}, g(R_{i+1})),  R_i = R_{i+1} + i/(k − i)·(H_i − H_{i+1})   (i = c−1, …, 0)

is the least mass any ``f``-DP mechanism needs for a tail ``β`` at ``c``. When
``R_0 + H_0 > k/m`` no ``f``-DP mechanism has ``P[C ≥ c] ≥ β``: observing ``c``
rejects the claim "``f``-DP" at level ``β`` (:func:`fdp_rejects`).

Curves
------
* :func:`gaussian_curve`: ``μ``-GDP (Dong, Roth and Su, *Gaussian Differential
  Privacy*, JRSS-B 2022), ``g(x) = Φ(Φ⁻¹(x) − μ)``. :func:`gdp_lower_bound` is the
  largest ``μ`` on a grid below which every grid point is rejected: if the run is
  ``μ*``-GDP, the smallest grid point at or above ``μ*`` is rejected with
  probability at most ``β``, so the bound exceeds ``μ*`` with probability at most
  ``β`` — no monotonicity in ``μ`` is assumed.
* :func:`epsilon_delta_curve`: the curve of a mechanism that is ``(ε_j, δ_j)``-DP for
  every pair of a list (both orderings, as the accountant certifies each pair):
  ``g(x) ≥ max_j e^{−ε_j}(x − δ_j)`` (Dong, Roth and Su, Prop. 2.5: the trade-off
  function of ``(ε, δ)``-DP). From the accountant's certified ``ε(δ)`` on a grid of
  ``δ`` it is a lower bound on the claim's own curve, hence a valid claim to test.

Nothing here imports Flower or the run: the canaries and the run are
:mod:`simulations.auditing.one_run`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from fedfdp.accounting.prv import gaussian_epsilon
from fedfdp.audit import canary_scores

__all__ = [
    "MU_GRID",
    "InverseCurve",
    "OneRunFDP",
    "epsilon_delta_curve",
    "fdp_rejects",
    "fdp_required_mass",
    "gaussian_curve",
    "gdp_lower_bound",
    "guess_counts",
    "needed_correct",
    "one_run_fdp",
]

#: ``g``: maps an array ``x`` of probabilities to the least probability of the same
#: event in the other world, one value per curve (a batch of curves evaluates a batch
#: of ``x`` of the same shape).
InverseCurve = Callable[[np.ndarray], np.ndarray]

#: Grid of ``μ`` searched by :func:`gdp_lower_bound`.
MU_GRID = np.round(np.arange(0.0, 12.0 + 1e-9, 0.01), 2)


def _counts(canaries: int, guesses: int, correct: int) -> tuple[int, int, int]:
    for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{name}={value!r}: must be an integer")
    m, k, c = int(canaries), int(guesses), int(correct)
    if m < 1 or not 0 <= c <= k <= m:
        raise ValueError(f"canaries={m}, guesses={k}, correct={c}: need 0 <= correct <= guesses <= canaries")
    return m, k, c


def fdp_required_mass(
    g: InverseCurve, canaries: int, guesses: int, correct: int, beta: float, curves: int = 1
) -> np.ndarray:
    """The least total mass, in units of ``k/m``, an ``f``-DP mechanism needs for
    ``P[C ≥ correct] ≥ beta`` (module docstring: the recursion); one value per curve.

    A value above 1 means no ``f``-DP mechanism can have that tail. The recursion stops
    early once every curve is above 1 (the mass only grows).
    """
    m, k, c = _counts(canaries, guesses, correct)
    b = float(beta)
    if not 0.0 < b < 1.0:
        raise ValueError(f"beta={beta!r}: must be in (0, 1)")
    r = np.full(curves, b * c / m)
    h = np.full(curves, b * (k - c) / m)
    limit = k / m
    for i in range(c - 1, -1, -1):
        h_next = np.maximum(h, g(r))
        r = r + i / (k - i) * (h_next - h)
        h = h_next
        if np.all(r + h > limit):
            break
    return (r + h) / limit


def fdp_rejects(g: InverseCurve, canaries: int, guesses: int, correct: int, beta: float) -> bool:
    """Whether ``correct`` right guesses out of ``guesses`` reject the claim "``f``-DP
    with respect to each of ``canaries`` canaries" at level ``beta``
    (:func:`fdp_required_mass` above 1). Never with no right guess.
    """
    if correct == 0:
        return False
    return bool(fdp_required_mass(g, canaries, guesses, correct, beta)[0] > 1.0)


def gaussian_curve(mu: float | np.ndarray) -> InverseCurve:
    """``g(x) = Φ(Φ⁻¹(x) − μ)`` of ``μ``-GDP, for one ``μ`` or an array of them."""
    mus = np.asarray(mu, dtype=float)
    if np.any(~np.isfinite(mus)) or np.any(mus < 0):
        raise ValueError(f"mu={mu!r}: must be finite and >= 0")

    def g(x: np.ndarray) -> np.ndarray:
        return np.asarray(special.ndtr(special.ndtri(np.clip(x, 0.0, 1.0)) - mus), dtype=float)

    return g


def epsilon_delta_curve(epsilons: Sequence[float], deltas: Sequence[float]) -> InverseCurve:
    """``g(x) = max(0, max_j e^{−ε_j}(x − δ_j))``: a lower bound on ``g`` of any mechanism
    that is ``(ε_j, δ_j)``-DP for every ``j`` in both orderings (Dong, Roth and Su 2022,
    Prop. 2.5).
    """
    e = np.asarray(epsilons, dtype=float)
    d = np.asarray(deltas, dtype=float)
    if e.shape != d.shape or e.ndim != 1 or not len(e):
        raise ValueError("epsilons and deltas: one-dimensional, same non-zero length")
    if np.any(~np.isfinite(e)) or np.any(e < 0) or np.any(d < 0) or np.any(d > 1):
        raise ValueError("epsilons must be finite and >= 0, deltas in [0, 1]")
    scale = np.exp(-e)

    def g(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return np.max(scale * (x[..., None] - d), axis=-1, initial=0.0)

    return g


def gdp_lower_bound(canaries: int, guesses: int, correct: int, beta: float) -> float:
    """The ``1 − beta`` lower confidence bound on ``μ`` (GDP) from one run's guesses:
    the largest point of :data:`MU_GRID` below which every grid point is rejected
    (module docstring); 0 when ``μ = 0`` is not rejected.
    """
    m, k, c = _counts(canaries, guesses, correct)
    if c == 0:
        return 0.0
    rejected = fdp_required_mass(gaussian_curve(MU_GRID), m, k, c, beta, len(MU_GRID)) > 1.0
    kept = np.flatnonzero(~rejected)
    if len(kept) == 0:
        return float(MU_GRID[-1])
    return float(MU_GRID[kept[0] - 1]) if kept[0] > 0 else 0.0


def guess_counts(
    scores: np.ndarray, included: np.ndarray, share_in: float, share_out: float
) -> tuple[int, int, int]:
    """``(k_in, k_out, correct)`` of the guess pattern ``(share_in, share_out)``: "in" for the
    ``round(share_in·m)`` highest scores, "out" for the ``round(share_out·m)`` lowest; ties
    broken by canary index (a rule fixed before the scores).
    """
    s = np.asarray(scores, dtype=float)
    inc = np.asarray(included, dtype=bool)
    m = len(s)
    order = np.argsort(s, kind="stable")
    k_in, k_out = round(share_in * m), round(share_out * m)
    if k_in + k_out > m:
        raise ValueError(f"patterns ({share_in}, {share_out}): more guesses than canaries")
    correct = int(inc[order[m - k_in:]].sum() + (~inc[order[:k_out]]).sum())
    return k_in, k_out, correct


@dataclass(frozen=True)
class OneRunFDP:
    """The f-DP analysis of one run's guesses (:func:`one_run_fdp`).

    Attributes
    ----------
    mu_lower : float
        ``1 − alpha`` lower bound on ``μ`` (GDP), the best over the patterns, each at
        ``alpha/patterns`` (Bonferroni).
    epsilon_of_mu : float
        ``ε(δ)`` of ``mu_lower``-GDP at ``delta`` (Dong, Roth and Su 2022, Cor. 2.13): the ε a
        Gaussian mechanism with that ``μ`` has; a lower bound on the run's ε only for a run
        whose curve is Gaussian.
    claim_rejected : bool
        Whether some pattern rejects the claim's curve (``claim``) at ``alpha/patterns``.
    guesses_in, guesses_out, correct : int
        The pattern that gave ``mu_lower`` (or rejected the claim) and its right guesses.
    needed : int or None
        Right guesses that pattern needs to reject the claim (None: not even all), by
        bisection, for reading.
    can_reject : bool
        Whether any pattern, all its guesses right, would reject the claim: the audit's
        power before the run (False: too few canaries or guesses to see anything).
    alpha, delta : float
    """

    mu_lower: float
    epsilon_of_mu: float
    claim_rejected: bool
    guesses_in: int
    guesses_out: int
    correct: int
    needed: int | None
    can_reject: bool
    alpha: float
    delta: float


def needed_correct(claim: InverseCurve, canaries: int, guesses: int, beta: float) -> int | None:
    """The fewest right guesses out of ``guesses`` that reject ``claim`` at ``beta``, by
    bisection over ``c`` (for reading and for the power check: the verdict tests the
    observed count itself); None if not even all right do.
    """
    if guesses == 0 or not fdp_rejects(claim, canaries, guesses, guesses, beta):
        return None
    lo, hi = 0, guesses  # lo never rejects (0 right), hi rejects
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fdp_rejects(claim, canaries, guesses, mid, beta):
            hi = mid
        else:
            lo = mid
    return hi


def one_run_fdp(
    scores: np.ndarray,
    included: np.ndarray,
    claim: InverseCurve,
    delta: float,
    alpha: float,
    patterns: Sequence[tuple[float, float]],
) -> OneRunFDP:
    """Guess by each pattern (:func:`guess_counts`) and analyse with f-DP: the best
    ``μ`` lower bound, and whether any pattern rejects ``claim`` (each pattern at
    ``alpha/len(patterns)``: Bonferroni, so both statements hold with probability
    ``≥ 1 − alpha`` each).
    """
    s, inc = canary_scores(scores, included)
    if not patterns:
        raise ValueError("patterns: need at least one")
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha={alpha!r}: must be in (0, 1)")
    beta = a / len(patterns)
    m = len(s)
    best_mu, best = 0.0, (0, 0, 0)
    rejected, can, reject_at = False, False, None
    for share_in, share_out in patterns:
        k_in, k_out, c = guess_counts(s, inc, share_in, share_out)
        k = k_in + k_out
        if k == 0:
            continue
        mu = gdp_lower_bound(m, k, c, beta)
        if mu > best_mu:
            best_mu, best = mu, (k_in, k_out, c)
        need = needed_correct(claim, m, k, beta)
        can = can or need is not None
        # the verdict is the test at the observed count itself (``need`` is for reading)
        if reject_at is None and fdp_rejects(claim, m, k, c, beta):
            rejected, reject_at = True, (k_in, k_out, c, need)
    if reject_at is not None:
        k_in, k_out, c, need = reject_at
    else:
        k_in, k_out, c = best
        need = needed_correct(claim, m, k_in + k_out, beta) if k_in + k_out else None
    eps = gaussian_epsilon(best_mu, float(delta)) if best_mu > 0 else 0.0
    return OneRunFDP(best_mu, eps, rejected, k_in, k_out, c, need, can, a, float(delta))

