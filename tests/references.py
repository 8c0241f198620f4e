"""Independent privacy-accounting references shared by the tests.

Nothing here uses fedfdp's accountant: the closed form of the Gaussian mechanism
(``mu``-GDP, for ``q = 1`` ledgers) and Google's dp-accounting PLD accountant (for
Poisson-subsampled Gaussian ledgers, add/remove).  A test that needs dp-accounting
is skipped when it is not installed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from scipy import optimize, special

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
