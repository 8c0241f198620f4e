"""Independent privacy-accounting references shared by the tests.

Nothing here uses fedfdp's accountant: the closed form of the Gaussian mechanism
(``mu``-GDP, for ``q = 1`` ledgers), Google's dp-accounting PLD accountant (for
Poisson-subsampled Gaussian ledgers, add/remove), and the binomial mixture of
dp-accounting's k-fold compositions for rounds with participation ``p < 1``
(:func:`participation_eps_ref`).  A test that needs dp-accounting is skipped when
it is not installed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import optimize, special, stats

#: dp-accounting's default value discretisation interval in these tests.
VDI = 1e-4


def gaussian_delta_ref(mu: float, eps: float) -> float:
    """Closed-form delta(eps) of the Gaussian mechanism, in log space (no overflow)."""
    a = special.log_ndtr(-eps / mu + mu / 2.0)
    b = eps + special.log_ndtr(-eps / mu - mu / 2.0)
    return float(math.exp(a) - math.exp(b))


def gaussian_eps_ref(mu: float, delta: float) -> float:
    """Smallest eps >= 0 with ``gaussian_delta_ref(mu, eps) <= delta`` (Brent's method)."""
    f = lambda e: gaussian_delta_ref(mu, e) - delta  # noqa: E731
    if f(0.0) <= 0.0:
        return 0.0
    hi = 1.0
    while f(hi) > 0.0:
        hi *= 2.0
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-13))


def dp_ref_pld(events: list[tuple[float, float, int]], vdi: float = VDI) -> Any:
    """dp-accounting's composed add/remove PLD accountant of ``(sigma, q, count)`` events."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=vdi
    )
    for sigma, q, count in events:
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), count)
    return acc


def dp_ref_eps(events: list[tuple[float, float, int]], delta: float, vdi: float = VDI) -> float:
    """dp-accounting's add/remove epsilon of ``(sigma, q, count)`` events at ``delta``."""
    return float(dp_ref_pld(events, vdi).get_epsilon(delta))


def participation_delta_ref(
    sigma: float, q: float, p: float, rounds: int, vdi: float = VDI, tail: float = 1e-12
) -> Any:
    """``delta(eps)`` of ``rounds`` rounds that each touch the record with probability ``p``.

    The round is a ``q``-subsampled Gaussian with probability ``p`` and nothing
    otherwise, the adversary knowing which.  With ``K ~ Binomial(T, p)`` touching
    rounds the composed pair is the mixture over ``k`` of the ``k``-fold pairs with the
    label ``K`` revealed, so for each ordering
    ``delta_T(eps) = sum_k Binom(k; T, p) delta_k(eps)``, ``delta_k`` being the ``k``-fold
    hockey-stick curve, here dp-accounting's PLD (``from_gaussian_mechanism`` with
    ``sampling_prob = q``; ``_pmf_remove`` / ``_pmf_add``: its ``ADD_OR_REMOVE_ONE``
    orderings, pessimistic).  The larger of the two orderings is returned.

    ``k`` outside the central range holding all but ``tail`` of the binomial mass is
    bounded above (``delta_k <= 1`` above it, ``delta_k <= delta_{k_lo}`` below it, as
    ``delta_k`` grows with ``k``), so the result is an upper bound on the exact curve
    within ``tail`` of it (plus dp-accounting's own pessimism, ~``vdi``).

    Returns a function ``eps -> delta`` (scalar).
    """
    pytest.importorskip("dp_accounting")
    from dp_accounting.pld import privacy_loss_distribution as dp_pld

    k_lo = max(int(stats.binom.ppf(tail / 2.0, rounds, p)), 1)
    k_hi = max(min(int(stats.binom.isf(tail / 2.0, rounds, p)) + 1, rounds), k_lo)
    one = dp_pld.from_gaussian_mechanism(
        sigma, sensitivity=1.0, sampling_prob=q, value_discretization_interval=vdi
    )
    plds = [one.self_compose(k_lo) if k_lo > 1 else one]
    for _ in range(k_lo + 1, k_hi + 1):
        plds.append(plds[-1].compose(one))
    weights = stats.binom.pmf(np.arange(k_lo, k_hi + 1), rounds, p)
    below = float(stats.binom.cdf(k_lo - 1, rounds, p))  # includes k = 0 (delta_0 = 0)
    above = float(stats.binom.sf(k_hi, rounds, p))

    def delta(eps: float) -> float:
        out = 0.0
        for attr in ("_pmf_remove", "_pmf_add"):
            d = np.array([float(getattr(pld, attr).get_delta_for_epsilon(eps)) for pld in plds])
            out = max(out, float(np.dot(weights, d)) + below * d[0] + above)
        return out

    return delta


def participation_eps_ref(
    sigma: float, q: float, p: float, rounds: int, delta: float, vdi: float = VDI
) -> float:
    """Add/remove epsilon at ``delta`` of :func:`participation_delta_ref` (bisection to 1e-7)."""
    f = participation_delta_ref(sigma, q, p, rounds, vdi, tail=1e-4 * delta)
    if f(0.0) <= delta:
        return 0.0
    hi = 1.0
    while f(hi) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: f(e) - delta, 0.0, hi, xtol=1e-7))


def participation_gaussian_eps_ref(sigma: float, p: float, rounds: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``rounds`` Gaussian rounds (``q = 1``), each touching the
    record with probability ``p`` (known to the adversary): with ``K ~ Binomial(T, p)``,
    ``delta(eps) = sum_k Binom(k; T, p) delta_mu_k(eps)``, ``mu_k = sqrt(k) / sigma``, in
    closed form (symmetric: both orderings agree).  Exact up to root finding."""
    ks = np.arange(rounds + 1)
    weights = stats.binom.pmf(ks, rounds, p)

    def f(eps: float) -> float:
        d = [gaussian_delta_ref(math.sqrt(k) / sigma, eps) if k else 0.0 for k in ks]
        return float(np.dot(weights, d)) - delta

    if f(0.0) <= 0.0:
        return 0.0
    hi = 1.0
    while f(hi) > 0.0:
        hi *= 2.0
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-12))
