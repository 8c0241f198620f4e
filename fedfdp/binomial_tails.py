"""Public counts that a binomial count stays within except with a stated probability.

A party whose work must not depend on a secret count (how many records its Poisson
batch holds, how many candidates of a rejection sampler survive a step) does a
**public** amount of work instead: a count chosen from public quantities (the number
of trials ``m``, the success probability ``p``) such that the secret count exceeds it
with probability at most ``β``. Both bounds below are the Chernoff-Hoeffding bound

``P(X >= k) <= exp(-m·D(k/m ‖ p))`` for ``k/m >= p``, ``P(X <= k) <= exp(-m·D(k/m ‖ p))``
for ``k/m <= p``, ``X ~ Bin(m, p)``,

with ``D`` the Kullback-Leibler divergence of two Bernoulli laws (Hoeffding 1963,
Theorem 1); the counts returned are the smallest for which that bound is at most
``β`` (with a relative margin of ``10⁻⁹`` on ``ln(1/β)`` for the float evaluation of
``D``). They depend on ``m``, ``p`` and ``β`` only.

Examples
--------
>>> upper_count(1000, 0.05, 2.0**-80)  # a 1000-record device at q = 0.05: 50 expected
137
>>> trials_for(100, 0.5, 2.0**-80) >= 200
True
"""

from __future__ import annotations

import math
from functools import lru_cache

from fedfdp.validate import count, open_unit, unit

__all__ = ["chernoff_log_tail", "trials_for", "upper_count"]


def _kl(a: float, p: float) -> float:
    """``D(a ‖ p)`` for Bernoulli laws, ``0·ln 0 = 0``."""
    out = 0.0
    if a > 0.0:
        out += a * math.log(a / p)
    if a < 1.0:
        out += (1.0 - a) * (math.log1p(-a) - math.log1p(-p))
    return max(out, 0.0)


def chernoff_log_tail(m: int, p: float, k: int) -> float:
    """``ln`` of the Chernoff bound on ``P(X >= k)`` (``k >= mp``) or on ``P(X <= k)``
    (``k <= mp``) for ``X ~ Bin(m, p)``; ``-inf`` when the event is impossible.
    """
    if k > m or k < 0:
        return -math.inf
    if p >= 1.0:
        return 0.0 if k <= m else -math.inf
    return -m * _kl(k / m, p)


def _target(beta: float) -> float:
    return math.log(1.0 / beta) * (1.0 + 1e-9)


@lru_cache(maxsize=4096)
def upper_count(m: int, p: float, beta: float) -> int:
    """The smallest ``c`` with ``P(Bin(m, p) > c) <= β`` by the Chernoff bound.

    Parameters
    ----------
    m : int
        Trials, ``>= 0``.
    p : float
        Success probability in ``[0, 1]`` (an upper bound on it gives a valid count).
    beta : float
        The tail allowed, in ``(0, 1)``.
    """
    m = count("m", m, 0)
    p = unit("p", p)
    beta = open_unit("beta", beta)
    if p == 0.0 or m == 0:
        return 0
    target = _target(beta)
    lo, hi = math.floor(m * p), m  # P(X > m) = 0
    if lo >= m:
        return m
    # smallest c in [lo, m] with bound(P(X >= c + 1)) <= β; the bound decreases in c
    while lo < hi:
        mid = (lo + hi) // 2
        if -chernoff_log_tail(m, p, mid + 1) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


@lru_cache(maxsize=4096)
def trials_for(successes: int, p: float, beta: float) -> int:
    """The smallest ``m`` with ``P(Bin(m, p) < successes) <= β`` by the Chernoff bound:
    how many independent trials of success probability at least ``p`` yield
    ``successes`` successes except with probability ``β``.
    """
    successes = count("successes", successes, 0)
    p = unit("p", p)
    if p == 0.0:
        raise ValueError("p=0.0: no number of trials succeeds")
    beta = open_unit("beta", beta)
    if successes == 0:
        return 0
    if p == 1.0:
        return successes
    target = _target(beta)

    def enough(m: int) -> bool:  # bound(P(X <= successes - 1)) <= β; improves with m
        return (successes - 1) < m * p and -chernoff_log_tail(m, p, successes - 1) >= target

    hi = max(successes, math.ceil(successes / p))
    while not enough(hi):
        hi *= 2
    lo = successes
    while lo < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
