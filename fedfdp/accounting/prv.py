"""The privacy random variable of one round of the subsampled Gaussian mechanism.

Mechanism
---------
One private round releases the sum of per-record gradients clipped to L2 norm ``C``
(add/remove sensitivity ``C``) over a Poisson batch of rate ``q``, plus
``N(0, sigma^2 C^2 I)``.  By **Theorem 5** it is dominated (in units of ``C``) by

    P = N(0, sigma^2)                            the simulator: the record is absent,
    Q = (1 - q) N(0, sigma^2) + q N(1, sigma^2)  the record is present.

Neighbouring relation
---------------------
Add/remove (Definition 6), both orderings: **remove** is the privacy loss
``log(Q/P)(w)`` with ``w ~ Q`` (prv-accountant's ``PoissonSubsampledGaussianMechanism``,
dp-accounting's ``REMOVE``); **add** is ``log(P/Q)(w)`` with ``w ~ P``, at most
``-log(1 - q)`` (dp-accounting's ``ADD``; implemented here, ``_cell_masses``).

Method (Gopi, Lee & Wutschitz, NeurIPS 2021; prv-accountant 0.2.0)
------------------------------------------------------------------
Each privacy random variable (PRV) is truncated to an interval holding all but
``eta`` of its mass (normal quantiles) and discretised cell-centred on the mesh
``k h``.  Cell masses are differences of normal CDFs taken on the accurate side
(``ndtr`` / survival), then shifted so the discrete mean equals the truncated
continuous mean (quadrature).  The Renyi moments of the pair (trapezoidal
quadrature) give Chernoff tail bounds for the composition window and the Renyi-DP
cap; by Mironov, Talwar & Zhang (2019) the remove-ordering moments also bound the
add ordering.  ``q = 1`` is the Gaussian mechanism, solved in closed form:
``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` for ``mu``-GDP.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import integrate, optimize, special

# Renyi orders for the tail bounds and for the RDP cap.
_RDP_ORDERS = np.concatenate(
    [
        np.arange(1.05, 2.0, 0.05),
        np.arange(2.0, 10.0, 0.25),
        np.arange(10.0, 64.0, 2.0),
        np.arange(64.0, 257.0, 8.0),
    ]
)

Group = tuple[float, float, int]  # (sigma, q, count)


def _loss(omega: np.ndarray | float, sigma: float, q: float) -> np.ndarray:
    """``log(Q/P)(omega)`` for ``P = N(0, s^2)``, ``Q = (1-q) N(0, s^2) + q N(1, s^2)``."""
    x = (2.0 * np.asarray(omega, dtype=float) - 1.0) / (2.0 * sigma * sigma)
    if q == 1.0:
        return x
    return np.logaddexp(math.log1p(-q), math.log(q) + x)


def _log_expm1(u: np.ndarray) -> np.ndarray:
    """``log(exp(u) - 1)`` for ``u >= 0`` (``-inf`` at 0), stable for large ``u``."""
    u = np.asarray(u, dtype=float)
    out = np.full(u.shape, -np.inf)
    big = u > 1.0
    small = (u > 0.0) & ~big
    out[big] = u[big] + np.log1p(-np.exp(-u[big]))
    out[small] = np.log(np.expm1(u[small]))
    return out


def _loss_inv(y: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """The ``omega`` with ``_loss(omega) = y``; ``-inf`` for ``y <= log(1-q)``."""
    y = np.asarray(y, dtype=float)
    if q == 1.0:
        x = y
    else:
        c = math.log1p(-q)
        x = c - math.log(q) + _log_expm1(y - c)
    return sigma * sigma * x + 0.5


def _phi_cells(z: np.ndarray) -> np.ndarray:
    """Masses of ``N(0,1)`` between consecutive ascending points ``z`` (tail-accurate)."""
    lo, hi = z[:-1], z[1:]
    left = special.ndtr(hi) - special.ndtr(lo)
    right = special.ndtr(-lo) - special.ndtr(-hi)
    return np.maximum(np.where(lo > 0.0, right, left), 0.0)


def _components(q: float, direction: str) -> list[tuple[float, float]]:
    """Gaussian components ``(weight, mean)`` of the law of ``omega`` (std ``sigma``)."""
    comps = [(1.0 - q, 0.0), (q, 1.0)] if direction == "remove" else [(1.0, 0.0)]
    return [(w, m) for w, m in comps if w > 0.0]


def _omega_of(y: np.ndarray, sigma: float, q: float, direction: str) -> np.ndarray:
    """Map loss values to ``omega`` (increasing for remove, decreasing for add)."""
    if direction == "remove":
        return _loss_inv(y, sigma, q)
    return _loss_inv(-np.asarray(y, dtype=float), sigma, q)


def _cell_masses(edges: np.ndarray, sigma: float, q: float, direction: str) -> np.ndarray:
    """Probability of the loss of ``direction`` falling in ``(edges[k], edges[k+1]]``.

    remove: loss ``log(Q/P)(w)``, ``w ~ Q``; add: loss ``-log(Q/P)(w)``, ``w ~ P``.
    """
    w = _omega_of(edges, sigma, q, direction)
    if direction == "add":  # omega decreases in the loss: flip to ascending
        w = w[::-1]
    out = np.zeros(len(edges) - 1)
    for weight, mean in _components(q, direction):
        out += weight * _phi_cells((w - mean) / sigma)
    return out[::-1] if direction == "add" else out


def _truncation(sigma: float, q: float, direction: str, eta: float) -> tuple[float, float]:
    """An interval of loss values holding all but ``eta`` of the mass (conservatively)."""
    z = -float(special.ndtri(eta / 2.0))  # each tail of each component <= eta/2
    w_lo = -sigma * z
    w_hi = (1.0 if direction == "remove" else 0.0) + sigma * z
    a, b = float(_loss(w_lo, sigma, q)), float(_loss(w_hi, sigma, q))
    return (a, b) if direction == "remove" else (-b, -a)


def _truncated_mean(sigma: float, q: float, direction: str, a: float, b: float) -> float:
    """``E[L 1{a < L <= b}]`` for the loss ``L`` of ``direction`` (adaptive quadrature)."""
    wa, wb = _omega_of(np.array([a, b]), sigma, q, direction)
    lo, hi = (wa, wb) if direction == "remove" else (wb, wa)
    sign = 1.0 if direction == "remove" else -1.0
    total = 0.0
    for weight, mean in _components(q, direction):
        zlo = max((lo - mean) / sigma, -40.0) if np.isfinite(lo) else -40.0
        zhi = min((hi - mean) / sigma, 40.0) if np.isfinite(hi) else 40.0
        if zhi <= zlo:
            continue

        def integrand(z: float, mean: float = mean) -> float:
            return float(_loss(mean + sigma * z, sigma, q)) * math.exp(-0.5 * z * z)

        pts = [0.0] if zlo < 0.0 < zhi else None
        val, _ = integrate.quad(
            integrand, zlo, zhi, points=pts, epsabs=1e-14, epsrel=1e-12, limit=400
        )
        total += weight * val / math.sqrt(2.0 * math.pi)
    return sign * total


@functools.lru_cache(maxsize=1024)
def _log_moments(sigma: float, q: float) -> np.ndarray:
    """``log A_a = log E_P[(Q/P)^a] = (a-1) D_a(Q||P)`` at the orders ``_RDP_ORDERS``.

    Trapezoidal quadrature in ``omega`` on a mesh of ``min(sigma/4, sigma^2)``
    (exponentially accurate for these analytic, Gaussian-tailed integrands; a test
    checks it against prv-accountant's series).  By Mironov, Talwar & Zhang (2019)
    ``D_a(P||Q) <= D_a(Q||P)``, so these moments bound the add ordering as well.
    """
    if q == 1.0:
        return _RDP_ORDERS * (_RDP_ORDERS - 1.0) / (2.0 * sigma * sigma)
    step = min(sigma / 4.0, sigma * sigma)
    omega = np.arange(-14.0 * sigma, float(_RDP_ORDERS[-1]) + 1.0 + 14.0 * sigma, step)
    log_phi = -0.5 * (omega / sigma) ** 2 - math.log(sigma * math.sqrt(2.0 * math.pi))
    g = _loss(omega, sigma, q)
    out = np.empty(len(_RDP_ORDERS))
    for s in range(0, len(_RDP_ORDERS), 16):
        x = log_phi[None, :] + _RDP_ORDERS[s : s + 16, None] * g[None, :]
        m = x.max(axis=1, keepdims=True)
        out[s : s + 16] = m[:, 0] + np.log(np.exp(x - m).sum(axis=1)) + math.log(step)
    return np.maximum(out, 0.0)


def _total_moments(groups: Sequence[Group]) -> np.ndarray:
    total = np.zeros(len(_RDP_ORDERS))
    for sigma, q, count in groups:
        total += count * _log_moments(sigma, q)
    return total


def _chernoff_upper(groups: Sequence[Group], prob: float) -> float:
    """``L`` with ``Pr[sum of losses > L] <= prob``, either ordering (Chernoff)."""
    total = _total_moments(groups)
    return float(np.min((total + math.log(1.0 / prob)) / (_RDP_ORDERS - 1.0)))


def _chernoff_lower(groups: Sequence[Group], prob: float) -> float:
    """``x`` with ``Pr[sum of losses < -x] <= prob``, either ordering.

    ``E_Q[(P/Q)^l] = exp((l-1) D_l(P||Q)) <= A_l`` for ``l >= 1`` (Mironov et al.) and
    ``E_P[(Q/P)^l] = A_l``, so ``Pr[L_N < -x] <= exp(sum_i n_i log A_l - l x)``;
    ``l = 1`` gives ``e^-x``.  ``x`` may be negative.
    """
    total = _total_moments(groups)
    log_inv = math.log(1.0 / prob)
    return float(min(log_inv, np.min((total + log_inv) / _RDP_ORDERS)))


def _rdp_epsilon(groups: Sequence[Group], delta: float) -> float:
    """Renyi-DP upper bound on the add/remove epsilon (Balle et al. 2020 conversion)."""
    a = _RDP_ORDERS
    eps = (_total_moments(groups) - math.log(delta) - np.log(a)) / (a - 1.0) + np.log1p(-1.0 / a)
    return max(0.0, float(np.min(eps)))


def _gaussian_delta(mu: float, eps: np.ndarray | float) -> np.ndarray:
    """Exact ``delta(eps)`` of ``mu``-GDP: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``."""
    eps = np.asarray(eps, dtype=float)
    a = special.log_ndtr(-eps / mu + mu / 2.0)
    b = eps + special.log_ndtr(-eps / mu - mu / 2.0)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.exp(a) * -np.expm1(np.minimum(b - a, 0.0))
    return np.clip(np.nan_to_num(d, nan=0.0), 0.0, 1.0)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest ``eps >= 0`` with ``delta(eps) <= delta`` for ``mu``-GDP, rounded up."""
    if float(_gaussian_delta(mu, 0.0)) <= delta:
        return 0.0
    hi = 1.0
    while float(_gaussian_delta(mu, hi)) > delta:
        hi *= 2.0

    def f(e: float) -> float:
        return float(_gaussian_delta(mu, e)) - delta

    root = float(optimize.brentq(f, 0.0, hi, xtol=1e-13, rtol=1e-15))
    step = 1e-13 * max(1.0, root)
    while f(root) > 0.0:  # make sure the certificate holds at the returned value
        root += step
        step *= 2.0
    return root


def _discretise(
    sigma: float, q: float, direction: str, h: float, eta: float
) -> tuple[int, np.ndarray, float]:
    """Cell-centred, mean-preserving discretisation on the grid ``k h``.

    Returns ``(k_first, pmf, shift)``: mass ``pmf[j]`` sits at ``(k_first + j) h + shift``.
    """
    a, b = _truncation(sigma, q, direction, eta)
    k_a = math.floor(a / h + 0.5)
    k_b = max(math.ceil(b / h - 0.5), k_a)
    edges = (np.arange(k_a, k_b + 2) - 0.5) * h
    masses = _cell_masses(edges, sigma, q, direction)
    total = float(masses.sum())
    if not total > 0.0:
        raise RuntimeError(f"empty discretisation for sigma={sigma}, q={q}")
    pmf = masses / total
    mean_c = _truncated_mean(sigma, q, direction, float(edges[0]), float(edges[-1])) / total
    mean_d = float(np.sum(np.arange(k_a, k_b + 1) * h * pmf))
    shift = mean_c - mean_d
    if not abs(shift) < h / 2.0:
        raise RuntimeError(
            f"discretised mean differs from the continuous mean by {shift:.3g} "
            f"(mesh {h:.3g}) for sigma={sigma}, q={q}"
        )
    return int(k_a), pmf, float(shift)
