"""The privacy random variable of one round of the subsampled Gaussian mechanism.

Mechanism
---------
One private round releases the sum of per-record gradients clipped to L2 norm ``C``
(add/remove sensitivity ``C``) over a Poisson batch of rate ``q``, plus
``N(0, sigma^2 C^2 I)``.  By **Theorem 5** it is dominated (in units of ``C``) by

    P = N(0, sigma^2)                            the simulator: the record is absent,
    Q = (1 - q) N(0, sigma^2) + q N(1, sigma^2)  the record is present.

With participation ``p < 1`` (Poisson device sampling, the draw known to the
adversary) a round is, with probability ``p``, this pair and otherwise ``(P, P)``;
its privacy loss has an extra atom at 0 of mass ``1 - p`` (:func:`discretise`) and
its Renyi moments are ``p A_a + 1 - p`` (:func:`_group_log_moments`).

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
from typing import NamedTuple

import numpy as np
from scipy import integrate, optimize, special

# Renyi orders for the tail bounds and for the RDP cap.
RDP_ORDERS = np.concatenate(
    [
        np.arange(1.05, 2.0, 0.05),
        np.arange(2.0, 10.0, 0.25),
        np.arange(10.0, 64.0, 2.0),
        np.arange(64.0, 257.0, 8.0),
    ]
)

# Largest omega grid of the Renyi-moment quadrature; below sigma ~ 0.022 the grid
# would be longer and the integer-order closed form is used instead (``log_moments``).
_MOMENT_GRID_MAX = 2**19


class Group(NamedTuple):
    """``rounds`` rounds with noise multiplier ``sigma``, sampling rate ``q`` and
    participation ``p`` (probability that the round touches the record at all).
    """

    sigma: float
    q: float
    rounds: int
    p: float = 1.0


#: A :class:`Group` or a plain ``(sigma, q, rounds)`` / ``(sigma, q, rounds, p)`` tuple.
GroupLike = Group | tuple[float, float, int] | tuple[float, float, int, float]


def as_group(g: GroupLike) -> Group:
    """``Group`` from a ``(sigma, q, rounds)`` or ``(sigma, q, rounds, p)`` tuple."""
    if isinstance(g, Group):
        return g
    if len(g) not in (3, 4):
        raise ValueError(f"group={g!r}: expected (sigma, q, rounds) or (sigma, q, rounds, p)")
    return Group(float(g[0]), float(g[1]), int(g[2]), float(g[3]) if len(g) == 4 else 1.0)


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


def loss_inv(y: np.ndarray, sigma: float, q: float) -> np.ndarray:
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
        return loss_inv(y, sigma, q)
    return loss_inv(-np.asarray(y, dtype=float), sigma, q)


# Cells per block of ``_cell_masses`` (bounds its temporaries; elementwise, so the
# blocking does not change the result).
_CELL_BLOCK = 2**20


def _cell_masses(edges: np.ndarray, sigma: float, q: float, direction: str) -> np.ndarray:
    """Probability of the loss of ``direction`` falling in ``(edges[k], edges[k+1]]``.

    remove: loss ``log(Q/P)(w)``, ``w ~ Q``; add: loss ``-log(Q/P)(w)``, ``w ~ P``.
    """
    if len(edges) > _CELL_BLOCK + 1:
        return np.concatenate(
            [
                _cell_masses(edges[i : i + _CELL_BLOCK + 1], sigma, q, direction)
                for i in range(0, len(edges) - 1, _CELL_BLOCK)
            ]
        )
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
def log_moments(sigma: float, q: float) -> np.ndarray:
    """``log A_a = log E_P[(Q/P)^a] = (a-1) D_a(Q||P)`` at the orders ``RDP_ORDERS``.

    Trapezoidal quadrature in ``omega`` on a mesh of ``min(sigma/4, sigma^2)``
    (exponentially accurate for these analytic, Gaussian-tailed integrands; a test
    checks it against prv-accountant's series).  By Mironov, Talwar & Zhang (2019)
    ``D_a(P||Q) <= D_a(Q||P)``, so these moments bound the add ordering as well.
    """
    if not sigma * sigma > 0.0:  # sigma^2 underflows: no noise to speak of
        return np.full(len(RDP_ORDERS), np.inf)
    if q == 1.0:
        with np.errstate(over="ignore"):
            return RDP_ORDERS * (RDP_ORDERS - 1.0) / (2.0 * sigma * sigma)
    step = min(sigma / 4.0, sigma * sigma)
    if (float(RDP_ORDERS[-1]) + 1.0 + 28.0 * sigma) / step > _MOMENT_GRID_MAX:
        return log_moments_integer(sigma, q)
    omega = np.arange(-14.0 * sigma, float(RDP_ORDERS[-1]) + 1.0 + 14.0 * sigma, step)
    log_phi = -0.5 * (omega / sigma) ** 2 - math.log(sigma * math.sqrt(2.0 * math.pi))
    g = _loss(omega, sigma, q)
    out = np.empty(len(RDP_ORDERS))
    for s in range(0, len(RDP_ORDERS), 16):
        x = log_phi[None, :] + RDP_ORDERS[s : s + 16, None] * g[None, :]
        m = x.max(axis=1, keepdims=True)
        out[s : s + 16] = m[:, 0] + np.log(np.exp(x - m).sum(axis=1)) + math.log(step)
    return np.maximum(out, 0.0)


def log_moments_integer(sigma: float, q: float) -> np.ndarray:
    """Upper bounds on ``log A_a`` at ``RDP_ORDERS`` without quadrature (small ``sigma``).

    At integer orders the moment is the binomial sum (Mironov, Talwar & Zhang 2019)
    ``A_k = sum_j C(k, j) (1-q)^(k-j) q^j exp(j (j-1) / (2 sigma^2))``, summed in log
    space (``+inf`` when it overflows).  ``log A_a`` is the cumulant generating
    function of the privacy loss under ``P`` at ``a - 1``, hence convex in ``a``, so
    between consecutive integers it lies below the chord: the fractional orders get
    the linear interpolation of their integer neighbours (``log A_1 = 0``), an upper
    bound, which is all the tail bounds and the Renyi-DP cap need.  Memory: a few
    arrays of ``257 x 258`` numbers, whatever ``sigma``.
    """
    k_max = math.ceil(float(RDP_ORDERS[-1]))
    ks = np.arange(1, k_max + 1, dtype=float)
    j = np.arange(k_max + 1, dtype=float)
    inv = 1.0 / (2.0 * sigma * sigma)  # may be inf
    with np.errstate(over="ignore", invalid="ignore"):
        quad = np.where(j >= 2.0, j * (j - 1.0) * inv, 0.0)
    log_c = special.gammaln(ks[:, None] + 1.0) - special.gammaln(j[None, :] + 1.0)
    log_c = log_c - special.gammaln(np.maximum(ks[:, None] - j[None, :], 0.0) + 1.0)
    terms = log_c + (ks[:, None] - j[None, :]) * math.log1p(-q) + j[None, :] * math.log(q)
    terms = np.where(j[None, :] <= ks[:, None], terms + quad[None, :], -np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        top = terms.max(axis=1)
        log_a = np.where(
            np.isfinite(top),
            top + np.log(np.exp(terms - np.where(np.isfinite(top), top, 0.0)[:, None]).sum(axis=1)),
            np.inf,
        )
    log_a = np.concatenate([[0.0], np.maximum(log_a, 0.0)])  # index k = order k (log A_0 unused)
    a = RDP_ORDERS
    lo = np.floor(a).astype(int)
    t = a - lo
    hi = np.minimum(lo + 1, k_max)
    with np.errstate(invalid="ignore"):
        frac = (1.0 - t) * log_a[lo] + t * log_a[hi]
    out = np.where(t == 0.0, log_a[lo], frac)
    return np.where(np.isnan(out), np.inf, out)


def _group_log_moments(g: Group) -> np.ndarray:
    """``log`` of the Renyi moments of one round of group ``g`` at ``RDP_ORDERS``.

    With participation ``p`` the round is the mixture (prob. ``p``: Theorem 5's pair,
    else the identical pair ``(P, P)``, the branch revealed), whose moment generating
    function is ``p A_a + (1 - p)``; the same holds branch by branch for the add
    ordering's moments, so the bound by the remove ordering (Mironov et al.) carries
    over.
    """
    lm = log_moments(g.sigma, g.q)
    if g.p == 1.0:
        return lm
    return np.logaddexp(math.log(g.p) + lm, math.log1p(-g.p))


def _total_moments(groups: Sequence[GroupLike]) -> np.ndarray:
    total = np.zeros(len(RDP_ORDERS))
    for g in groups:
        g = as_group(g)
        if g.p == 1.0:
            total += g.rounds * log_moments(g.sigma, g.q)
        else:
            total += g.rounds * _group_log_moments(g)
    return total


def chernoff_upper(groups: Sequence[GroupLike], prob: float) -> float:
    """``L`` with ``Pr[sum of losses > L] <= prob``, either ordering (Chernoff)."""
    total = _total_moments(groups)
    return float(np.min((total + math.log(1.0 / prob)) / (RDP_ORDERS - 1.0)))


def chernoff_lower(groups: Sequence[GroupLike], prob: float) -> float:
    """``x`` with ``Pr[sum of losses < -x] <= prob``, either ordering.

    ``E_Q[(P/Q)^l] = exp((l-1) D_l(P||Q)) <= A_l`` for ``l >= 1`` (Mironov et al.) and
    ``E_P[(Q/P)^l] = A_l``, so ``Pr[L_N < -x] <= exp(sum_i n_i log A_l - l x)``;
    ``l = 1`` gives ``e^-x``.  ``x`` may be negative.
    """
    total = _total_moments(groups)
    log_inv = math.log(1.0 / prob)
    return float(min(log_inv, np.min((total + log_inv) / RDP_ORDERS)))


def rdp_epsilon(groups: Sequence[GroupLike], delta: float) -> float:
    """Renyi-DP upper bound on the add/remove epsilon (Balle et al. 2020 conversion)."""
    return rdp_epsilon_log(groups, math.log(delta))


def rdp_epsilon_log(groups: Sequence[GroupLike], log_delta: float) -> float:
    """:func:`rdp_epsilon` at ``delta = exp(log_delta)`` (any ``log_delta``, no underflow).

    ``+inf`` when every moment overflows (a vacuous but valid bound).
    """
    a = RDP_ORDERS
    eps = (_total_moments(groups) - log_delta - np.log(a)) / (a - 1.0) + np.log1p(-1.0 / a)
    return max(0.0, float(np.min(eps)))


def rdp_delta(groups: Sequence[GroupLike], eps: np.ndarray) -> np.ndarray:
    """Renyi-DP upper bound on either ordering's ``delta(eps)``: the inverse of the
    conversion in :func:`rdp_epsilon`, minimised over the orders (capped at 1).
    """
    eps = np.asarray(eps, dtype=float)
    a = RDP_ORDERS[:, None]
    total = _total_moments(groups)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        log_d = total - np.log(a) - (a - 1.0) * (eps.ravel()[None, :] - np.log1p(-1.0 / a))
        log_d = np.where(np.isnan(log_d), np.inf, log_d)
        out = np.exp(np.minimum(np.min(log_d, axis=0), 0.0))
    return out.reshape(eps.shape)


def tv_bound(groups: Sequence[GroupLike]) -> float:
    """Upper bound on the total variation between the composed pair's two sides.

    A round touches the record with probability ``p q`` (participation times
    sampling rate); with probability ``prod_i (1 - p_i q_i)^{n_i}`` no round does and
    both sides have the same law, so ``delta(eps) <= TV <= 1 - prod_i (1 - p_i q_i)^{n_i}``
    for every ``eps >= 0`` and both orderings.  Padded by a relative ``1e-9``.
    """
    log_none = 0.0  # log Pr[no round touches the record]
    for g in groups:
        g = as_group(g)
        touch = g.p * g.q
        if touch >= 1.0:
            return 1.0
        log_none += g.rounds * math.log1p(-touch)
    return min(1.0, -math.expm1(log_none) * (1.0 + 1e-9))


def gaussian_delta(mu: float, eps: np.ndarray | float) -> np.ndarray:
    """Exact ``delta(eps)`` of ``mu``-GDP: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``."""
    eps = np.asarray(eps, dtype=float)
    a = special.log_ndtr(-eps / mu + mu / 2.0)
    b = eps + special.log_ndtr(-eps / mu - mu / 2.0)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.exp(a) * -np.expm1(np.minimum(b - a, 0.0))
    return np.clip(np.nan_to_num(d, nan=0.0), 0.0, 1.0)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest ``eps >= 0`` with ``delta(eps) <= delta`` for ``mu``-GDP, rounded up."""
    if float(gaussian_delta(mu, 0.0)) <= delta:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    hi = 1.0
    while float(gaussian_delta(mu, hi)) > delta:
        hi *= 2.0
        if hi > 1e300:  # epsilon beyond the float range: the bound is +inf
            return math.inf

    def f(e: float) -> float:
        return float(gaussian_delta(mu, e)) - delta

    root = float(optimize.brentq(f, 0.0, hi, xtol=1e-13, rtol=1e-15))
    step = 1e-13 * max(1.0, root)
    while f(root) > 0.0:  # make sure the certificate holds at the returned value
        root += step
        step *= 2.0
    return root


class DiscretisationError(RuntimeError):
    """The discretised PRV failed its own sanity check (mass or mean); the caller
    falls back to the Renyi-DP bound.
    """


def support_length(sigma: float, q: float, direction: str, h: float, eta: float) -> float:
    """Number of cells :func:`discretise` would use (``inf`` if the loss overflows)."""
    with np.errstate(over="ignore", invalid="ignore"):
        a, b = _truncation(sigma, q, direction, eta)
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return (max(b, 0.0) - min(a, 0.0)) / h + 2.0


def discretise(
    sigma: float, q: float, direction: str, h: float, eta: float, p: float = 1.0
) -> tuple[int, np.ndarray, float]:
    """Cell-centred, mean-preserving discretisation on the grid ``k h``.

    Returns ``(k_first, pmf, shift)``: mass ``pmf[j]`` sits at ``(k_first + j) h + shift``.

    Error analysis (Gopi, Lee & Wutschitz 2021).  Every loss value in the cell
    ``((k - 1/2) h, (k + 1/2) h]`` is mapped to ``k h + shift``; ``shift`` makes the
    discrete mean equal to the truncated continuous mean.  This is a coupling in
    which the error ``discrete - continuous`` lies in ``[shift - h/2, shift + h/2]``
    (an interval of length ``h``) and has mean exactly 0, which is what the Hoeffding
    bound of :mod:`fedfdp.accounting.composition` needs.

    Participation ``p < 1``: the round's loss is, with probability ``p``, the
    subsampled Gaussian's and, with probability ``1 - p``, exactly 0 (the device was
    not drawn; both sides of the pair are ``P`` and the adversary may know it).  The
    atom at 0 is the centre of cell ``k = 0``, so before the shift it is represented
    without error; it is added to that cell (the cell range is widened to contain
    ``k = 0`` if needed) and one shift is computed for the whole mixture:
    ``mean_c = p E[L 1{L in window}] / total`` (the atom contributes 0).  After the
    shift the atom's error is ``shift`` itself, inside ``[shift - h/2, shift + h/2]``
    like every other error, and the mean error is 0: the coupling keeps range ``h``
    and mean 0, and the Hoeffding argument holds unchanged.  (Putting the atom on the
    *shifted* grid of the subsampled part alone, split between its two neighbours,
    would also keep the mean, but its errors would reach ``shift - h``: a range of
    ``1.5 h``.)  Mass outside the window is ``p`` times that of the subsampled part,
    at most ``eta``.  ``p = 1`` is exactly the discretisation of the subsampled
    Gaussian.
    """
    a, b = _truncation(sigma, q, direction, eta)
    k_a = math.floor(a / h + 0.5)
    k_b = max(math.ceil(b / h - 0.5), k_a)
    if p != 1.0:
        k_a, k_b = min(k_a, 0), max(k_b, 0)
    edges = (np.arange(k_a, k_b + 2) - 0.5) * h
    masses = _cell_masses(edges, sigma, q, direction)
    if p != 1.0:
        masses = p * masses
        masses[-k_a] += 1.0 - p
    total = float(masses.sum())
    if not total > 0.0:
        raise DiscretisationError(f"empty discretisation for sigma={sigma}, q={q}")
    pmf = masses / total
    mean_c = _truncated_mean(sigma, q, direction, float(edges[0]), float(edges[-1]))
    if p != 1.0:
        mean_c = p * mean_c
    mean_c = mean_c / total
    mean_d = float(np.sum(np.arange(k_a, k_b + 1) * h * pmf))
    shift = mean_c - mean_d
    if not abs(shift) < h / 2.0:
        raise DiscretisationError(
            f"discretised mean differs from the continuous mean by {shift:.3g} "
            f"(mesh {h:.3g}) for sigma={sigma}, q={q}, p={p}"
        )
    return int(k_a), pmf, float(shift)
