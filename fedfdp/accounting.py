"""Privacy accounting for feature differential privacy (FDP).

Mechanism
---------
One training round of Algorithm 1 releases the sum of per-record private gradients,
each clipped to L2 norm ``C`` (sensitivity ``C`` under adding/removing one record),
of a Poisson-subsampled batch (each record joins independently with probability
``q``), plus Gaussian noise ``N(0, sigma^2 C^2 I)``.  Public work (public gradients,
public pre-training) is a function of ``Psi(S)`` only and costs nothing (Remark 2).
By Theorem 5 of the FDP paper each round is dominated by the pair

    P = N(0, sigma^2)        (the simulator: the record is absent),
    Q = (1 - q) N(0, sigma^2) + q N(1, sigma^2)      (the record is present),

and rounds compose (Theorem 3): the whole run is ``f-DP_i^Psi`` (add/remove, the
simulation-based Definition 6) with ``f = T(P_1 x ... x P_T, Q_1 x ... x Q_T)``,
the rounds free to use different ``(sigma, q)``.

Neighbouring relations
----------------------
``"add-remove"`` (the headline number, Definition 6).  Definition 6 asks for *both*
``Pr[M(S u {x}) in E] <= 1 - f(Pr[sim in E])`` and the reverse inequality, so both
orderings of the pair are accounted:

* **remove** direction: ``H_{e^eps}(Q || P)``, privacy loss ``log(Q/P)`` under ``Q``.
  This is the one that prv-accountant's ``PoissonSubsampledGaussianMechanism``
  models (its CDF is that of ``log(Q/P)(w)``, ``w ~ Q``) and dp-accounting's
  ``AdjacencyType.REMOVE`` (``mu_upper`` = mixture, ``mu_lower`` = Gaussian).
* **add** direction: ``H_{e^eps}(P || Q)``, privacy loss ``log(P/Q)`` under ``P``,
  bounded above by ``-log(1 - q)`` per round (dp-accounting's ``ADD``).
  prv-accountant has no such random variable; it is implemented here.

The reported epsilon is the maximum over the two directions, as dp-accounting does
for ``ADD_OR_REMOVE_ONE``.

``"replacement"`` (Definition 5) follows from add/remove by Proposition 1
(``f-DP_i => (f o f)-DP_r``), in its (eps, delta) form: an
``(eps_i, delta_i)``-DP_i mechanism is ``(2 eps_i, delta_i (1 + e^{eps_i}))``-DP_r.
For a target ``delta_r`` we search ``delta_i`` and keep the best *certified* pair:
``eps_i`` is the upper end of the add/remove error interval at ``delta_i``, the pair
is accepted only if ``delta_i (1 + e^{eps_i}) <= delta_r``, and ``2 eps_i`` is
reported.  Every accepted pair is a valid (eps, delta)-DP_i statement, so its image
under Proposition 1 is a valid replacement guarantee; taking the best of several
valid guarantees is valid.  When even the smallest ``delta_i`` the float64
accountant can resolve is infeasible the answer is ``inf`` (vacuous, not wrong).

Numerical method (privacy random variables, Gopi, Lee & Wutschitz 2021)
------------------------------------------------------------------------
For each direction and each distinct ``(sigma, q)`` the privacy loss random variable
(PRV) is truncated to an interval holding all but ``eta = delta_error / (8 N)`` of its
mass (exact normal tail quantiles), discretised on a mesh
``h = eps_disc / sqrt(N/2 log(12/delta_error))`` (prv-accountant's mesh rule, ``N`` the
total number of rounds) with cell-centred masses computed from exact normal CDFs in
float64, and shifted so its mean equals the truncated continuous mean.  The ledger is
composed by one FFT per distinct ``(sigma, q)``: ``irfft(prod_i rfft(p_i)^{n_i})`` on a
window that holds the composed PRV up to ``delta_error/4`` (Chernoff bound from the
Renyi divergence of the subsampled Gaussian, computed by quadrature) and
``delta_error/16`` (the bound ``Pr_Q[log(Q/P) < -x] <= e^{-x}``).  Rounds with ``q = 1``
are exactly one Gaussian PRV with ``mu^2 = sum_i n_i / sigma_i^2`` and are merged.

Error interval: the rounding errors are independent, zero-mean and lie in an interval
of length ``h``, so by Hoeffding their sum exceeds ``eps_disc`` with probability at most
``delta_error / 6``; with the truncation terms above this gives, for every ``eps``,

    d~(eps + eps_disc) - delta_error <= delta(eps) <= d~(eps - eps_disc) + delta_error,

where ``d~`` is the hockey-stick curve of the discrete composed PRV (prv-accountant's
Theorem).  Hence ``lower = eps~(delta + delta_error) - eps_disc``,
``estimate = eps~(delta)``, ``upper = eps~(delta - delta_error) + eps_disc``.  The
*upper* value is what ``epsilon`` returns.  ``eps_disc = 0.9 eps_error`` and
``delta_error = delta_error_rel * delta`` (``1e-3`` by default), so ``upper - estimate``
stays within ``eps_error`` unless the curve is very steep in ``delta`` (the actual
width is in the returned :class:`EpsilonBound`).

A ledger made only of ``q = 1`` rounds is a Gaussian mechanism with
``mu = sqrt(sum_i n_i / sigma_i^2)`` and is solved in closed form,
``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.

No function here draws random numbers.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import fft as _fft
from scipy import integrate, optimize, special

__all__ = [
    "RELATIONS",
    "EpsilonBound",
    "FDPAccountant",
    "PrivacyBudgetExhausted",
    "PrivacyEvent",
    "attribute_inference_bound",
    "calibrate_noise_multiplier",
    "epsilon_for",
    "plot_tradeoff",
    "save_tradeoff_csv",
    "tradeoff_curve",
]

RELATIONS = ("add-remove", "replacement")
_STATE_VERSION = 1
# Share of ``eps_error`` given to the discretisation term; the rest absorbs the
# ``delta_error`` term of the interval.
_DISC_SHARE = 0.9
# Smallest delta_error the float64 FFT pipeline is trusted with (its round-off on a
# probability vector of a few million entries is ~1e-14 in L1).
_DELTA_ERROR_FLOOR = 1e-13
# Frequencies whose composed Fourier coefficient has modulus below exp(_LOG_F_CUT)
# are set to zero (their total contribution to any probability is < 1e-30).
_LOG_F_CUT = -80.0
# Renyi orders for the tail bound of the composed PRV.
_RDP_ORDERS = np.concatenate(
    [
        np.arange(1.05, 2.0, 0.05),
        np.arange(2.0, 10.0, 0.25),
        np.arange(10.0, 64.0, 2.0),
        np.arange(64.0, 257.0, 8.0),
    ]
)


# --------------------------------------------------------------------------------------
# errors, events, results
# --------------------------------------------------------------------------------------


class PrivacyBudgetExhausted(RuntimeError):
    """The next step would take the privacy loss above the budget.

    Attributes
    ----------
    epsilon_spent : float
        Upper-bound epsilon already spent (before the refused step).
    max_epsilon : float
        The budget.
    delta : float
        The delta at which both are stated.
    epsilon_requested : float or None
        Upper-bound epsilon the refused step would have led to, when known.
    """

    def __init__(
        self,
        epsilon_spent: float,
        max_epsilon: float,
        delta: float,
        epsilon_requested: float | None = None,
    ) -> None:
        self.epsilon_spent = float(epsilon_spent)
        self.max_epsilon = float(max_epsilon)
        self.delta = float(delta)
        self.epsilon_requested = None if epsilon_requested is None else float(epsilon_requested)
        msg = (
            f"privacy budget exhausted: epsilon_spent={self.epsilon_spent:.6g}, "
            f"max_epsilon={self.max_epsilon:.6g}, delta={self.delta:.3g}"
        )
        if self.epsilon_requested is not None:
            msg += f" (the next step would reach epsilon={self.epsilon_requested:.6g})"
        super().__init__(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.epsilon_spent, self.max_epsilon, self.delta, self.epsilon_requested),
        )


def _check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}={value!r}: must be a real number")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name}={value!r}: must not be NaN")
    return v


def _check_sigma(value: Any, name: str = "noise_multiplier") -> float:
    v = _check_real(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name}={value!r}: must be finite")
    if v <= 0:
        raise ValueError(f"{name}={value!r}: must be > 0")
    return v


def _check_rate(value: Any, name: str = "sampling_rate") -> float:
    v = _check_real(name, value)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"{name}={value!r}: must be in (0, 1]")
    return v


def _check_count(value: Any, name: str = "count") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r}: must be an integer >= 1")
    if value < 1:
        raise ValueError(f"{name}={value!r}: must be an integer >= 1")
    return int(value)


def _check_delta(value: Any, name: str = "delta") -> float:
    v = _check_real(name, value)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name}={value!r}: must be in (0, 1)")
    return v


def _check_relation(relation: Any) -> str:
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r}: unknown, expected one of {RELATIONS}")
    return relation


@dataclass(frozen=True)
class PrivacyEvent:
    """``count`` rounds of the Poisson-subsampled Gaussian mechanism.

    Parameters
    ----------
    noise_multiplier : float
        ``sigma``: noise std divided by the clip norm (the L2 sensitivity), finite > 0.
    sampling_rate : float
        ``q``: probability that a record joins the private batch, in ``(0, 1]``.
    count : int
        Number of identical rounds, ``>= 1``.
    """

    noise_multiplier: float
    sampling_rate: float
    count: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", _check_sigma(self.noise_multiplier))
        object.__setattr__(self, "sampling_rate", _check_rate(self.sampling_rate))
        object.__setattr__(self, "count", _check_count(self.count))


@dataclass(frozen=True)
class EpsilonBound:
    """An epsilon with its numerical error interval.

    ``lower <= true epsilon <= upper`` for the accounted dominating pair (up to the
    documented ``delta_error`` slack, which is folded in); ``estimate`` is the point
    estimate.  ``upper`` is the number to print and to compare with budgets.
    """

    lower: float
    estimate: float
    upper: float
    delta: float
    relation: str

    @property
    def error(self) -> float:
        """Width of the upper half of the interval, ``upper - estimate``."""
        return self.upper - self.estimate


# --------------------------------------------------------------------------------------
# the privacy loss of one round
# --------------------------------------------------------------------------------------


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


def _components(sigma: float, q: float, direction: str) -> list[tuple[float, float]]:
    """Gaussian components ``(weight, mean)`` of the law of ``omega`` (std ``sigma``)."""
    if direction == "remove":
        comps = [(1.0 - q, 0.0), (q, 1.0)]
    else:
        comps = [(1.0, 0.0)]
    return [(w, m) for w, m in comps if w > 0.0]


def _omega_of(y: np.ndarray, sigma: float, q: float, direction: str) -> np.ndarray:
    """Map loss values to ``omega`` (increasing for remove, decreasing for add)."""
    if direction == "remove":
        return _loss_inv(y, sigma, q)
    return _loss_inv(-np.asarray(y, dtype=float), sigma, q)


def _cell_masses(edges: np.ndarray, sigma: float, q: float, direction: str) -> np.ndarray:
    """Probability of the loss falling in each cell ``(edges[k], edges[k+1]]``."""
    w = _omega_of(edges, sigma, q, direction)
    if direction == "add":  # omega decreasing in the loss: flip to ascending
        w = w[::-1]
    out = np.zeros(len(edges) - 1)
    for weight, mean in _components(sigma, q, direction):
        out += weight * _phi_cells((w - mean) / sigma)
    if direction == "add":
        out = out[::-1]
    return out


def _truncation(sigma: float, q: float, direction: str, eta: float) -> tuple[float, float]:
    """An interval of loss values holding all but ``eta`` of the mass (conservatively)."""
    z = -float(special.ndtri(eta / 2.0))  # each tail of each component <= eta/2
    w_lo = -sigma * z  # omega quantiles valid for every component
    w_hi = (1.0 if direction == "remove" else 0.0) + sigma * z
    a, b = float(_loss(w_lo, sigma, q)), float(_loss(w_hi, sigma, q))
    return (a, b) if direction == "remove" else (-b, -a)


def _truncated_mean(sigma: float, q: float, direction: str, a: float, b: float) -> float:
    """``E[L 1{a < L <= b}]`` for the loss ``L`` of the given direction."""
    wa, wb = _omega_of(np.array([a, b]), sigma, q, direction)
    lo, hi = (wa, wb) if direction == "remove" else (wb, wa)
    sign = 1.0 if direction == "remove" else -1.0
    total = 0.0
    for weight, mean in _components(sigma, q, direction):
        zlo = max((lo - mean) / sigma, -40.0) if np.isfinite(lo) else -40.0
        zhi = min((hi - mean) / sigma, 40.0) if np.isfinite(hi) else 40.0
        if zhi <= zlo:
            continue

        def integrand(z: float, mean: float = mean) -> float:
            return float(_loss(mean + sigma * z, sigma, q)) * math.exp(-0.5 * z * z)

        pts = [p for p in (0.0,) if zlo < p < zhi]
        val, _ = integrate.quad(
            integrand, zlo, zhi, points=pts or None, epsabs=1e-14, epsrel=1e-12, limit=400
        )
        total += weight * val / math.sqrt(2.0 * math.pi)
    return sign * total


@functools.lru_cache(maxsize=1024)
def _log_moments(sigma: float, q: float) -> np.ndarray:
    """``log E_P[(Q/P)^alpha]`` at ``_RDP_ORDERS`` (``(alpha-1) D_alpha(Q||P)``).

    Trapezoidal quadrature in ``omega`` on a mesh of ``min(sigma/4, sigma^2)`` (spectrally accurate
    for these Gaussian-type integrands); a test checks it against prv-accountant's
    series.  By Mironov, Talwar & Zhang (2019), ``D_alpha(P||Q) <= D_alpha(Q||P)``, so
    the same moments bound the add direction.
    """
    if q == 1.0:
        return _RDP_ORDERS * (_RDP_ORDERS - 1.0) / (2.0 * sigma * sigma)
    step = min(sigma / 4.0, sigma * sigma)
    lo = -14.0 * sigma
    hi = float(_RDP_ORDERS[-1]) + 1.0 + 14.0 * sigma
    omega = np.arange(lo, hi + step, step)
    log_phi = -0.5 * (omega / sigma) ** 2 - math.log(sigma * math.sqrt(2.0 * math.pi))
    g = _loss(omega, sigma, q)
    out = np.empty(len(_RDP_ORDERS))
    for s in range(0, len(_RDP_ORDERS), 16):
        x = log_phi[None, :] + _RDP_ORDERS[s : s + 16, None] * g[None, :]
        m = x.max(axis=1, keepdims=True)
        out[s : s + 16] = m[:, 0] + np.log(np.exp(x - m).sum(axis=1)) + math.log(step)
    return np.maximum(out, 0.0)


def _chernoff_tail(groups: Sequence[tuple[float, float, int]], prob: float) -> float:
    """``L`` with ``Pr[sum of losses > L] <= prob`` in either direction."""
    total = np.zeros(len(_RDP_ORDERS))
    for sigma, q, count in groups:
        total += count * _log_moments(sigma, q)
    return float(np.min((total + math.log(1.0 / prob)) / (_RDP_ORDERS - 1.0)))


def _chernoff_lower(groups: Sequence[tuple[float, float, int]], prob: float) -> float:
    """``x`` with ``Pr[sum of losses < -x] <= prob`` in either direction.

    ``E_Q[e^{-l log(Q/P)}] = E_P[(P/Q)^{l-1}] <= E_P[(Q/P)^l]`` for ``l >= 1``
    (Mironov et al.), and the same moment bounds the add direction, so
    ``Pr[L_N < -x] <= exp(sum_i n_i log A_l - l x)``; ``l = 1`` gives ``e^{-x}``.
    ``x`` may be negative (the composed loss is then almost surely positive).
    """
    total = np.zeros(len(_RDP_ORDERS))
    for sigma, q, count in groups:
        total += count * _log_moments(sigma, q)
    log_inv = math.log(1.0 / prob)
    return float(min(log_inv, np.min((total + log_inv) / _RDP_ORDERS)))


def _rdp_epsilon(groups: Sequence[tuple[float, float, int]], delta: float) -> float:
    """RDP upper bound on add/remove epsilon (Balle et al. 2020 conversion)."""
    total = np.zeros(len(_RDP_ORDERS))
    for sigma, q, count in groups:
        total += count * _log_moments(sigma, q)
    a = _RDP_ORDERS
    eps = total / (a - 1.0) - np.log(delta * a) / (a - 1.0) + np.log1p(-1.0 / a)
    return max(0.0, float(np.min(eps)))


# --------------------------------------------------------------------------------------
# the composed privacy random variable
# --------------------------------------------------------------------------------------


def _exp_grid(x0: float, h: float, n: int) -> np.ndarray:
    """``exp(x0 + j h)`` for ``j < n`` via a two-level table (one exp per ~1000 points)."""
    m = 1024
    rows = -(-n // m)
    coarse = np.exp(x0 + h * m * np.arange(rows))
    fine = np.exp(h * np.arange(m))
    return (coarse[:, None] * fine[None, :]).ravel()[:n]


class _Curve:
    """Hockey-stick curve of one discrete composed PRV (one direction).

    The masses sit at ``t_j = t0 + j h``; ``delta~(eps) = sum_{t_j > eps} p_j (1 - e^{eps - t_j})``.
    """

    def __init__(self, t0: float, h: float, pmf: np.ndarray) -> None:
        p = np.maximum(pmf, 0.0)
        self.t0, self.h, self.n = t0, h, len(p)
        self.d1 = np.cumsum(p[::-1])[::-1]  # sum_{j>=i} p_j
        w = p * _exp_grid(-t0, -h, len(p))  # p_j e^{-t_j}
        self.d2 = np.cumsum(w[::-1])[::-1]  # sum_{j>=i} p_j e^{-t_j}

    @property
    def t_first(self) -> float:
        return self.t0

    @property
    def t_last(self) -> float:
        return self.t0 + (self.n - 1) * self.h

    def _index(self, eps: np.ndarray) -> np.ndarray:
        """First grid index with ``t_i >= eps`` (``n`` if none)."""
        return np.clip(np.ceil((eps - self.t0) / self.h - 1e-9), 0, self.n).astype(np.int64)

    def delta(self, eps: np.ndarray) -> np.ndarray:
        """``delta~(eps)``, exact for the discrete distribution."""
        eps = np.asarray(eps, dtype=float)
        i = self._index(eps)
        inside = i < self.n
        ic = np.minimum(i, self.n - 1)
        with np.errstate(over="ignore", invalid="ignore"):
            val = self.d1[ic] - np.exp(eps) * self.d2[ic]
        val = np.where(inside, np.nan_to_num(val, nan=0.0, neginf=0.0), 0.0)
        return np.clip(val, 0.0, 1.0)

    def _delta_at(self, i: int) -> float:
        t = self.t0 + i * self.h
        return float(self.d1[i] - math.exp(t) * self.d2[i])

    def epsilon(self, delta: float) -> float:
        """Smallest ``eps`` with ``delta~(eps) <= delta`` (may be negative or ``-inf``).

        ``delta~`` is non-increasing; a bisection finds the grid cell of the crossing
        and the cell's closed form ``sum_{j>=i} p_j - e^eps sum_{j>=i} p_j e^{-t_j}``
        is inverted exactly.
        """
        lo, hi = -1, self.n - 1  # invariant: delta~(t_lo) > delta >= delta~(t_hi)
        if self._delta_at(0) <= delta:
            hi = 0
        else:
            lo = 0
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._delta_at(mid) <= delta:
                    hi = mid
                else:
                    lo = mid
        num = self.d1[hi] - delta
        t_hi = self.t0 + hi * self.h
        if not num > 0.0:
            return -math.inf if hi == 0 else self.t0 + lo * self.h
        eps = math.log(num / self.d2[hi]) if self.d2[hi] > 0.0 else t_hi
        t_lo = -math.inf if hi == 0 else self.t0 + lo * self.h
        return min(max(eps, t_lo), t_hi)


class _SpectralCurve:
    """Hockey-stick curve of a composed PRV held as its kept Fourier coefficients.

    The composed masses on the window ``t_j = t0 + j h`` (``0 <= j < width``) are the
    inverse real DFT ``c_j = (1/n) sum_k G_k e^{2 pi i k (k_lo + j)/n}`` restricted to
    the kept frequencies (the others are below ``e^-80``).  The tail sums needed for
    ``delta~`` are geometric series in ``z_k = e^{2 pi i k/n}``, so every evaluation costs
    ``O(#kept)`` and no length-``n`` array is formed:

        d1(i) = sum_{j>=i} c_j,     e2(i) = sum_{j>=i} c_j e^{-(t_j - t_i)},
        delta~(eps) = d1(i) - e^{eps - t_i} e2(i)   for  t_{i-1} < eps <= t_i.
    """

    def __init__(
        self,
        t0: float,
        h: float,
        width: int,
        n: int,
        k_lo: int,
        freqs: np.ndarray,
        g: np.ndarray,
    ) -> None:
        self.t0, self.h, self.n_grid, self.n = t0, h, width, n
        f = freqs.astype(np.int64)
        self.f = f
        mult = np.where((f == 0) | (2 * f == n), 1.0, 2.0)
        self.a = mult * g * np.exp(1j * self._angle(np.array([k_lo])))[0] / n
        self.zero = f == 0
        one = np.ones(1, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.inv1mz = np.where(self.zero, 0.0, 1.0 / self._one_minus(np.zeros(1), one)[0])
        self.inv1mr = 1.0 / self._one_minus(np.array([-h]), one)[0]
        # magnitude of the terms summed per evaluation (for the round-off bound)
        self.term_scale = float(
            np.sum(np.abs(self.a) * (2.0 * np.abs(self.inv1mz) + 2.0 * np.abs(self.inv1mr)))
            + np.sum(np.abs(self.a[self.zero])) * width
        )

    @property
    def t_first(self) -> float:
        return self.t0

    @property
    def t_last(self) -> float:
        return self.t0 + (self.n_grid - 1) * self.h

    def _angle(self, m: np.ndarray) -> np.ndarray:
        """Angles ``2 pi k m / n`` reduced exactly to ``(-pi, pi]`` (rows ``m``, columns ``k``)."""
        r = (np.asarray(m, dtype=np.int64)[:, None] * self.f[None, :]) % self.n
        r = np.where(2 * r > self.n, r - self.n, r)
        return (2.0 * np.pi / self.n) * r

    def _one_minus(self, x: np.ndarray, m: np.ndarray) -> np.ndarray:
        """``1 - exp(x + i 2 pi k m / n)`` without cancellation (rows ``x, m``)."""
        ang = self._angle(m)
        x = np.asarray(x, dtype=float)[:, None]
        s = np.sin(0.5 * ang)
        re = -np.expm1(x) + np.exp(x) * 2.0 * s * s
        im = -np.exp(x) * np.sin(ang)
        return re + 1j * im

    def _sums(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(d1(i), e2(i))`` for grid indices ``0 <= i <= width``.

        ``d1 = sum_k a_k z^i (1 - z^rem) / (1 - z)`` (``rem = width - i``; ``a_0 rem`` for
        ``k = 0``) and ``e2 = sum_k a_k z^i (1 - (z e^-h)^rem) / (1 - z e^-h)``, with every
        ``1 - e^w`` formed without cancellation.
        """
        i = np.asarray(i, dtype=np.int64)
        rem = self.n_grid - i
        zi = np.exp(1j * self._angle(i))
        a_sum = zi * self._one_minus(np.zeros(len(i)), rem) * self.inv1mz[None, :]
        a_sum = a_sum + np.where(self.zero[None, :], rem[:, None].astype(float), 0.0)
        b_sum = zi * self._one_minus(-self.h * rem, rem) * self.inv1mr[None, :]
        return (a_sum @ self.a).real, (b_sum @ self.a).real

    def _index(self, eps: np.ndarray) -> np.ndarray:
        return np.clip(np.ceil((eps - self.t0) / self.h - 1e-9), 0, self.n_grid).astype(np.int64)

    def delta(self, eps: np.ndarray) -> np.ndarray:
        """``delta~(eps)``."""
        eps = np.asarray(eps, dtype=float)
        flat = eps.ravel()
        out = np.zeros(flat.shape)
        for s in range(0, len(flat), 512):
            e = flat[s : s + 512]
            i = self._index(e)
            d1, e2 = self._sums(i)
            t_i = self.t0 + i * self.h
            with np.errstate(over="ignore", invalid="ignore"):
                val = d1 - np.exp(e - t_i) * e2
            out[s : s + 512] = np.where(i < self.n_grid, np.nan_to_num(val, nan=0.0), 0.0)
        return np.clip(out, 0.0, 1.0).reshape(eps.shape)

    def _delta_at(self, i: int) -> tuple[float, float, float]:
        d1, e2 = self._sums(np.array([i]))
        return float(d1[0] - e2[0]), float(d1[0]), float(e2[0])

    def epsilon(self, delta: float) -> float:
        """Smallest ``eps`` with ``delta~(eps) <= delta`` (bisection on the grid)."""
        lo, hi = -1, self.n_grid - 1
        if self._delta_at(0)[0] > delta:
            lo = 0
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._delta_at(mid)[0] <= delta:
                    hi = mid
                else:
                    lo = mid
        else:
            hi = 0
        _, d1, e2 = self._delta_at(hi)
        t_hi = self.t0 + hi * self.h
        t_lo = -math.inf if hi == 0 else self.t0 + lo * self.h
        if not d1 - delta > 0.0:
            return t_lo
        eps = t_hi + math.log((d1 - delta) / e2) if e2 > 0.0 else t_hi
        return min(max(eps, t_lo), t_hi)


# Share of delta_error used by the analytic error terms (Hoeffding 1/6, per-round
# truncation 1/8, composed upper tail 1/4, lower-tail aliasing 1/16); the rest is
# left for floating-point round-off.
_ANALYTIC_SHARE = 1.0 / 6.0 + 1.0 / 8.0 + 1.0 / 4.0 + 1.0 / 16.0


@dataclass(frozen=True)
class _Profile:
    """Both directions of a composed ledger, with the error terms that bound them.

    ``delta_slack`` is the additive delta error: ``delta_error``, or more when the
    estimated float64 round-off (``~ N eps_machine sum|G_k|``) exceeds its share.
    """

    groups: tuple[tuple[float, float, int], ...]
    remove: _Curve | None = None
    add: _Curve | None = None
    eps_disc: float = 0.0
    delta_slack: float = 0.0
    gaussian_mu: float | None = None  # closed form (ledger of q = 1 rounds only)

    @property
    def curves(self) -> tuple[_Curve, ...]:
        return tuple(c for c in (self.remove, self.add) if c is not None)

    def epsilon_bounds(self, delta: float) -> tuple[float, float, float]:
        """``(lower, estimate, upper)`` add/remove epsilon at ``delta``.

        ``upper`` is also capped by the Renyi-DP bound (valid for both directions),
        which only matters when round-off swamps a tiny ``delta``.
        """
        if self.gaussian_mu is not None:
            e = _gaussian_epsilon(self.gaussian_mu, delta)
            return e, e, e
        rdp = _rdp_epsilon(self.groups, delta)
        if not self.curves:  # grid too large: RDP only
            return 0.0, rdp, rdp
        de, ed = self.delta_slack, self.eps_disc
        lo = est = up = 0.0
        for c in self.curves:
            lo = max(lo, c.epsilon(delta + de) - ed)
            est = max(est, c.epsilon(delta))
            up = max(up, c.epsilon(delta - de) + ed if delta > de else math.inf)
        up = min(up, rdp)
        est = min(est, up)
        return float(min(lo, est)), float(est), float(up)

    def delta_upper(self, eps: np.ndarray) -> np.ndarray:
        """Certified upper bound on the larger of the two ``delta(eps)`` curves."""
        eps = np.asarray(eps, dtype=float)
        if self.gaussian_mu is not None:
            return _gaussian_delta(self.gaussian_mu, eps)
        out = np.zeros(eps.shape)
        for c in self.curves:
            out = np.maximum(out, c.delta(eps - self.eps_disc) + self.delta_slack)
        return np.minimum(out, 1.0)


def _gaussian_delta(mu: float, eps: np.ndarray | float) -> np.ndarray:
    """Exact ``delta(eps)`` of ``mu``-GDP, ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``."""
    eps = np.asarray(eps, dtype=float)
    a = special.log_ndtr(-eps / mu + mu / 2.0)
    b = eps + special.log_ndtr(-eps / mu - mu / 2.0)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.exp(a) * -np.expm1(np.minimum(b - a, 0.0))
    return np.clip(np.nan_to_num(d, nan=0.0), 0.0, 1.0)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest ``eps >= 0`` with ``delta(eps) <= delta`` for ``mu``-GDP (rounded up)."""
    if float(_gaussian_delta(mu, 0.0)) <= delta:
        return 0.0
    hi = 1.0
    while float(_gaussian_delta(mu, hi)) > delta:
        hi *= 2.0
    f = lambda e: float(_gaussian_delta(mu, e)) - delta  # noqa: E731
    root = optimize.brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-14)
    # step up until the certificate holds (brentq may land a hair below the root)
    step = 1e-12 * max(1.0, root)
    while f(root) > 0.0:
        root += step
        step *= 2.0
    return float(root)


def _groups(events: Iterable[PrivacyEvent]) -> tuple[tuple[float, float, int], ...]:
    """Aggregate counts per distinct ``(sigma, q)`` (composition is commutative)."""
    acc: dict[tuple[float, float], int] = {}
    for ev in events:
        key = (ev.noise_multiplier, ev.sampling_rate)
        acc[key] = acc.get(key, 0) + ev.count
    return tuple((s, q, n) for (s, q), n in sorted(acc.items()))


def _merge_gaussians(
    groups: Sequence[tuple[float, float, int]],
) -> tuple[tuple[float, float, int], ...]:
    """Replace all ``q = 1`` groups by one Gaussian with ``1/s^2 = sum n_i / s_i^2``."""
    inv = sum(n / (s * s) for s, q, n in groups if q == 1.0)
    out = [(s, q, n) for s, q, n in groups if q < 1.0]
    if inv > 0.0:
        out.append((1.0 / math.sqrt(inv), 1.0, 1))
    return tuple(out)


def _discretise(
    sigma: float, q: float, direction: str, h: float, eta: float
) -> tuple[int, np.ndarray, float]:
    """Cell-centred, mean-preserving discretisation on the grid ``k h``.

    Returns ``(k_first, pmf, shift)``: mass ``pmf[j]`` sits at ``(k_first + j) h + shift``.
    """
    a, b = _truncation(sigma, q, direction, eta)
    k_a = math.floor(a / h + 0.5)
    k_b = math.ceil(b / h - 0.5)
    ks = np.arange(k_a, k_b + 1)
    edges = (np.arange(k_a, k_b + 2) - 0.5) * h
    masses = _cell_masses(edges, sigma, q, direction)
    total = masses.sum()
    if not total > 0.0:
        raise RuntimeError(f"empty discretisation for sigma={sigma}, q={q}")
    pmf = masses / total
    mean_c = _truncated_mean(sigma, q, direction, float(edges[0]), float(edges[-1])) / total
    mean_d = float(np.dot(ks * h, pmf))
    shift = mean_c - mean_d
    if not abs(shift) < h / 2.0:
        raise RuntimeError(
            f"discretised mean differs from the continuous mean by {shift:.3g} "
            f"(mesh {h:.3g}) for sigma={sigma}, q={q}"
        )
    return int(k_a), pmf, float(shift)


def _grid(
    groups: Sequence[tuple[float, float, int]], eps_disc: float, delta_error: float
) -> tuple[float, float, int, int]:
    """Mesh, per-round truncation mass and composed window ``[k_lo, k_hi]``."""
    n_total = sum(n for _, _, n in groups)
    h = eps_disc / math.sqrt(n_total / 2.0 * math.log(12.0 / delta_error))
    eta = delta_error / (8.0 * n_total)
    upper = _chernoff_tail(groups, delta_error / 4.0) + 1.0
    lower = _chernoff_lower(groups, delta_error / 16.0) + 1.0
    # the composed truncated PRVs also never leave [sum n a_i, sum n b_i]
    sup_hi = sup_lo = 0.0
    for s, q, n in groups:
        a_r, b_r = _truncation(s, q, "remove", eta)
        a_a, b_a = _truncation(s, q, "add", eta)
        sup_hi += n * max(b_r, b_a)
        sup_lo += n * min(a_r, a_a)
    upper = min(upper, sup_hi + 2 * h)
    lower = min(lower, -sup_lo + 2 * h)
    k_hi = math.ceil(upper / h) + 1
    k_lo = min(-math.ceil(lower / h) - 1, k_hi - 16)
    return h, eta, k_lo, k_hi


def _pairwise_rows(x: np.ndarray) -> np.ndarray:
    """Sum over the first axis by pairwise addition (error ~log2(rows) ulp)."""
    while x.shape[0] > 1:
        if x.shape[0] % 2:
            x = np.concatenate([x, np.zeros((1, *x.shape[1:]), dtype=x.dtype)])
        x = x[0::2] + x[1::2]
    return x[0]


def _dft_longdouble(pmf: np.ndarray, k_first: int, freqs: np.ndarray, n: int) -> np.ndarray:
    """``sum_j pmf_j exp(-2 pi i f (k_first + j) / n)`` at ``freqs``, in long double.

    Blocked direct DFT (``j = a B + b``): twiddles come from exact integer reduction
    modulo ``n`` and long-double sin/cos, sums are pairwise.  Relative accuracy
    ~1e-18 against ~2e-16 for a float64 FFT.
    """
    s = len(pmf)
    b = int(math.ceil(math.sqrt(s)))
    a = -(-s // b)
    p = np.zeros(a * b, dtype=np.longdouble)
    p[:s] = pmf
    p = p.reshape(a, b)
    two_pi_n = np.longdouble(2) * np.arccos(np.longdouble(-1)) / np.longdouble(n)
    f = freqs.astype(np.int64)
    ang_b = ((np.arange(b, dtype=np.int64)[:, None] * f[None, :]) % n).astype(np.longdouble)
    ang_b *= two_pi_n
    rows = (k_first + b * np.arange(a, dtype=np.int64)) % n
    ang_a = ((rows[:, None] * f[None, :]) % n).astype(np.longdouble) * two_pi_n
    re_in = p @ np.cos(ang_b)
    im_in = -(p @ np.sin(ang_b))
    ca, sa = np.cos(ang_a), np.sin(ang_a)
    re = _pairwise_rows(ca * re_in + sa * im_in)
    im = _pairwise_rows(ca * im_in - sa * re_in)
    return re + 1j * im


# Long-double direct DFTs are used while (support x kept frequencies) stays below this.
_DFT_WORK_LIMIT = 4e7
# Composed PRVs with at most this many kept frequencies are evaluated spectrally.
_SPECTRAL_MAX = 2048


def _compose_direction(
    groups: Sequence[tuple[float, float, int]],
    direction: str,
    h: float,
    eta: float,
    k_lo: int,
    k_hi: int,
    noise_budget: float,
) -> tuple[_Curve, float]:
    """Compose one direction by FFT; returns the curve and a round-off bound.

    Each float64 spectrum is accurate to ~``eps_machine`` relative, so the composed
    spectrum ``G = prod F_i^{n_i}`` is accurate to ``~N eps_machine`` relative and the
    composed masses to ``2 N u sum_k |G_k|`` in L1 with ``u = 2 eps_machine``.  When
    that exceeds ``noise_budget`` the kept part of each spectrum (the frequencies
    where ``|G_k| > e^-80``) is recomputed in long double (``u = 4 eps_longdouble``)
    and ``G`` is formed in long double; only the final inverse FFT runs in float64.
    Against an all-long-double reference (N = 10,000, q = 1/16, sigma = 0.8) the L1
    errors were 1.5e-12 (float64) and 1.9e-15 (long double spectrum), against bounds
    of 3.4e-11 and 5e-14 from these formulas.
    """
    width = k_hi - k_lo + 1
    parts = [(_discretise(s, q, direction, h, eta), n) for s, q, n in groups]
    longest = max(len(p) for (_, p, _), _ in parts)
    n_fft = _fft.next_fast_len(max(width, longest + 1), real=True)
    log_mod = np.zeros(n_fft // 2 + 1)
    spectra = []
    shift = 0.0
    n_total = 0
    for (k_first, pmf, s), n in parts:
        arr = np.zeros(n_fft)
        arr[np.arange(k_first, k_first + len(pmf)) % n_fft] = pmf
        spec = _fft.rfft(arr)
        with np.errstate(divide="ignore"):
            log_mod += n * np.log(np.abs(spec))
        spectra.append(spec)
        shift += n * s
        n_total += n
    keep = log_mod > _LOG_F_CUT
    sum_g = float(np.exp(log_mod[keep]).sum())
    eps64 = float(np.finfo(np.float64).eps)
    irfft_err = eps64 * sum_g * math.log2(n_fft)
    noise = 4.0 * n_total * eps64 * sum_g + irfft_err
    freqs = np.nonzero(keep)[0]
    work = len(freqs) * sum(len(p) for (_, p, _), _ in parts)
    comp = np.zeros(n_fft // 2 + 1, dtype=complex)
    if noise > noise_budget and work <= _DFT_WORK_LIMIT:
        log_g = np.zeros(len(freqs), dtype=np.clongdouble)
        for (k_first, pmf, _), n in parts:
            log_g += n * np.log(_dft_longdouble(pmf, k_first, freqs, n_fft))
        comp[keep] = np.exp(log_g).astype(complex)
        eps_ld = float(np.finfo(np.longdouble).eps)
        noise = 8.0 * n_total * eps_ld * sum_g + irfft_err
    else:
        phase = np.zeros(len(freqs))
        for spec, (_, n) in zip(spectra, parts, strict=True):
            phase += n * np.angle(spec[keep])
        comp[keep] = np.exp(log_mod[keep] + 1j * phase)
    if len(freqs) <= _SPECTRAL_MAX:
        curve = _SpectralCurve(k_lo * h + shift, h, width, n_fft, k_lo, freqs, comp[keep])
        return curve, noise - irfft_err + 8.0 * eps64 * curve.term_scale
    out = _fft.irfft(comp, n_fft)
    out = np.roll(out, -k_lo)[:width]
    return _Curve(k_lo * h + shift, h, out), noise


@functools.lru_cache(maxsize=4)
def _profile(
    groups: tuple[tuple[float, float, int], ...],
    eps_disc: float,
    delta_error: float,
    max_grid_points: int,
) -> _Profile:
    """Compose a ledger (aggregated by ``_groups``) into both hockey-stick curves."""
    if all(q == 1.0 for _, q, _ in groups):
        inv = sum(n / (s * s) for s, _, n in groups)
        return _Profile(groups, gaussian_mu=math.sqrt(inv))
    merged = _merge_gaussians(groups)
    h, eta, k_lo, k_hi = _grid(merged, eps_disc, delta_error)
    if k_hi - k_lo + 1 > max_grid_points or k_hi * h > 700.0:
        # privacy loss far too large to resolve with this mesh: the Renyi-DP bound,
        # valid (if looser) for both directions, is all that is reported
        return _Profile(groups)
    budget = 0.25 * (1.0 - _ANALYTIC_SHARE) * delta_error
    remove, noise_r = _compose_direction(merged, "remove", h, eta, k_lo, k_hi, budget)
    add, noise_a = _compose_direction(merged, "add", h, eta, k_lo, k_hi, budget)
    slack = max(delta_error, _ANALYTIC_SHARE * delta_error + max(noise_r, noise_a))
    return _Profile(groups, remove, add, eps_disc, slack)


# --------------------------------------------------------------------------------------
# the accountant
# --------------------------------------------------------------------------------------


def _as_events(ledger_or_accountant: Any) -> tuple[PrivacyEvent, ...]:
    if isinstance(ledger_or_accountant, FDPAccountant):
        return ledger_or_accountant.ledger
    if isinstance(ledger_or_accountant, PrivacyEvent):
        return (ledger_or_accountant,)
    try:
        events = tuple(ledger_or_accountant)
    except TypeError:
        raise ValueError(
            f"ledger_or_accountant={ledger_or_accountant!r}: expected an FDPAccountant or "
            "a sequence of PrivacyEvent"
        ) from None
    for ev in events:
        if not isinstance(ev, PrivacyEvent):
            raise ValueError(f"ledger entry {ev!r}: expected a PrivacyEvent")
    return events


class FDPAccountant:
    """Ledger and epsilon of a run of Algorithm 1 (FDP-SGD) or its federated form.

    Each ``compose`` adds ``count`` rounds of the Poisson-subsampled Gaussian
    mechanism with noise multiplier ``sigma`` (noise std / clip norm; sensitivity 1
    after normalisation) and sampling rate ``q``.  By Theorem 5 of the FDP paper each
    round is ``T(N(0, s^2), (1-q) N(0, s^2) + q N(1, s^2))``-DP_i^Psi and rounds compose
    (Theorem 3).  ``epsilon`` reports the certified upper end of the numerical error
    interval, for add/remove (Definition 6, both orderings of the pair) or for
    replacement (Definition 5, via Proposition 1).  See the module docstring for the
    numerical method and its guarantees.

    Parameters
    ----------
    eps_error : float
        Target for ``upper - estimate``; ``0.9 * eps_error`` goes to the discretisation
        (prv-accountant's ``eps_error``), the rest absorbs the ``delta_error`` term.
        In ``(0, 1]``; smaller is tighter and slower (time ~ ``1/eps_error``).
    delta_error : float
        Relative delta slack: ``delta_error * delta`` is prv-accountant's
        ``delta_error``.  In ``(0, 0.1]``.
    max_grid_points : int
        Largest discretisation grid; beyond it (astronomically large epsilon) the
        accountant falls back to the Renyi-DP bound, still a valid upper bound.
    """

    def __init__(
        self,
        eps_error: float = 0.05,
        delta_error: float = 1e-3,
        max_grid_points: int = 2**23,
    ) -> None:
        eps_error = _check_real("eps_error", eps_error)
        if not 0.0 < eps_error <= 1.0:
            raise ValueError(f"eps_error={eps_error!r}: must be in (0, 1]")
        delta_error = _check_real("delta_error", delta_error)
        if not 0.0 < delta_error <= 0.1:
            raise ValueError(f"delta_error={delta_error!r}: must be in (0, 0.1]")
        if isinstance(max_grid_points, bool) or not isinstance(max_grid_points, int):
            raise ValueError(f"max_grid_points={max_grid_points!r}: must be an integer")
        if max_grid_points < 1024:
            raise ValueError(f"max_grid_points={max_grid_points!r}: must be >= 1024")
        self._eps_error = eps_error
        self._delta_error = delta_error
        self._max_grid_points = max_grid_points
        self._ledger: list[PrivacyEvent] = []

    # ----------------------------------------------------------------- ledger
    @property
    def eps_error(self) -> float:
        return self._eps_error

    @property
    def delta_error(self) -> float:
        return self._delta_error

    @property
    def ledger(self) -> tuple[PrivacyEvent, ...]:
        """Immutable events, consecutive identical ``(sigma, q)`` merged by count."""
        return tuple(self._ledger)

    @property
    def rounds(self) -> int:
        """Total number of composed rounds."""
        return sum(ev.count for ev in self._ledger)

    @staticmethod
    def _appended(
        ledger: Sequence[PrivacyEvent], event: PrivacyEvent
    ) -> list[PrivacyEvent]:
        out = list(ledger)
        if out and (out[-1].noise_multiplier, out[-1].sampling_rate) == (
            event.noise_multiplier,
            event.sampling_rate,
        ):
            last = out[-1]
            out[-1] = PrivacyEvent(last.noise_multiplier, last.sampling_rate, last.count + event.count)
        else:
            out.append(event)
        return out

    def compose(self, noise_multiplier: float, sampling_rate: float, count: int = 1) -> None:
        """Record ``count`` rounds with noise multiplier ``sigma`` and sampling rate ``q``."""
        self._ledger = self._appended(
            self._ledger, PrivacyEvent(noise_multiplier, sampling_rate, count)
        )

    # ----------------------------------------------------------------- epsilon
    def _profile_for(self, events: Sequence[PrivacyEvent], delta_abs_error: float) -> _Profile:
        return _profile(
            _groups(events),
            _DISC_SHARE * self._eps_error,
            max(delta_abs_error, _DELTA_ERROR_FLOOR),
            self._max_grid_points,
        )

    def _bound(
        self, events: Sequence[PrivacyEvent], delta: float, relation: str
    ) -> EpsilonBound:
        delta = _check_delta(delta)
        relation = _check_relation(relation)
        if not events:
            return EpsilonBound(0.0, 0.0, 0.0, delta, relation)
        if relation == "add-remove":
            prof = self._profile_for(events, self._delta_error * delta)
            lo, est, up = prof.epsilon_bounds(delta)
            return EpsilonBound(lo, est, up, delta, relation)
        return self._replacement(events, delta)

    def _replacement(self, events: Sequence[PrivacyEvent], delta_r: float) -> EpsilonBound:
        """Proposition 1 in (eps, delta) form, optimised over the add/remove delta.

        ``upper = 2 eps_up(d)`` for the largest ``d`` found with
        ``d (1 + exp(eps_up(d))) <= delta_r``, where ``eps_up`` is the certified
        add/remove upper bound; ``estimate`` does the same with the estimate curve;
        ``lower = 2 lower_ar(delta_r / 2)`` (every feasible ``d`` is ``<= delta_r / 2``
        and epsilon decreases in delta).
        """
        rel = self._delta_error
        half = delta_r / 2.0
        prof = self._profile_for(events, rel * half)
        lower = 2.0 * prof.epsilon_bounds(half)[0]
        # locate the optimum with the estimate curve: d = delta_r / (1 + e^{eps(d)})
        d = half
        for _ in range(100):
            est = prof.epsilon_bounds(d)[1]
            d_new = min(half, delta_r / (1.0 + math.exp(min(est, 700.0))))
            if d_new < 1e-300 or abs(math.log(d_new / d)) < 1e-4:
                d = max(d_new, 1e-300)
                break
            d = d_new
        d_min = min(max(d / 30.0, 1e-300), half / 2.0)
        prof = self._profile_for(events, rel * d_min)
        grid = np.geomspace(d_min, half, 64)
        out = []
        for which in (1, 2):

            def feasible(d_i: float, which: int = which) -> tuple[bool, float]:
                e = prof.epsilon_bounds(d_i)[which]
                return d_i * (1.0 + math.exp(min(e, 700.0))) <= delta_r, e

            best = math.inf
            ok_idx = [i for i, di in enumerate(grid) if feasible(float(di))[0]]
            if ok_idx:
                i = ok_idx[-1]
                lo_d = float(grid[i])
                best = feasible(lo_d)[1]
                if i + 1 < len(grid):
                    hi_d = float(grid[i + 1])
                    for _ in range(30):
                        mid = math.sqrt(lo_d * hi_d)
                        ok, e = feasible(mid)
                        if ok:
                            lo_d, best = mid, min(best, e)
                        else:
                            hi_d = mid
            out.append(2.0 * best)
        est, up = out
        est = min(est, up)
        return EpsilonBound(min(lower, est), est, up, delta_r, "replacement")

    def epsilon_bound(self, delta: float, relation: str = "add-remove") -> EpsilonBound:
        """Epsilon of the ledger at ``delta`` with its error interval.

        Parameters
        ----------
        delta : float
            In ``(0, 1)``.
        relation : {"add-remove", "replacement"}
            Definition 6 (both orderings of the dominating pair) or Definition 5
            (via Proposition 1; see the module docstring).
        """
        return self._bound(self._ledger, delta, relation)

    def epsilon(self, delta: float, relation: str = "add-remove") -> float:
        """Certified upper bound on epsilon at ``delta`` (the number to print)."""
        return self.epsilon_bound(delta, relation).upper

    def would_exceed(
        self,
        max_epsilon: float,
        delta: float,
        noise_multiplier: float,
        sampling_rate: float,
        count: int = 1,
        relation: str = "add-remove",
    ) -> bool:
        """Whether composing one more event would take the upper epsilon above ``max_epsilon``.

        Does not modify the ledger.
        """
        max_epsilon = _check_real("max_epsilon", max_epsilon)
        if max_epsilon < 0:
            raise ValueError(f"max_epsilon={max_epsilon!r}: must be >= 0")
        event = PrivacyEvent(noise_multiplier, sampling_rate, count)
        events = self._appended(self._ledger, event)
        return self._bound(events, delta, relation).upper > max_epsilon

    def spend(
        self,
        noise_multiplier: float,
        sampling_rate: float,
        *,
        max_epsilon: float,
        delta: float,
        count: int = 1,
        relation: str = "add-remove",
    ) -> float:
        """Compose the event if it keeps epsilon within budget, else raise.

        Returns the new upper epsilon.

        Raises
        ------
        PrivacyBudgetExhausted
            With the epsilon already spent; the ledger is left unchanged.
        """
        max_epsilon = _check_real("max_epsilon", max_epsilon)
        if max_epsilon < 0:
            raise ValueError(f"max_epsilon={max_epsilon!r}: must be >= 0")
        event = PrivacyEvent(noise_multiplier, sampling_rate, count)
        new_events = self._appended(self._ledger, event)
        new_eps = self._bound(new_events, delta, relation).upper
        if new_eps > max_epsilon:
            spent = self._bound(self._ledger, delta, relation).upper
            raise PrivacyBudgetExhausted(spent, max_epsilon, delta, new_eps)
        self._ledger = new_events
        return new_eps

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the ledger and the precision knobs."""
        return {
            "version": _STATE_VERSION,
            "eps_error": self._eps_error,
            "delta_error": self._delta_error,
            "ledger": [
                {
                    "noise_multiplier": ev.noise_multiplier,
                    "sampling_rate": ev.sampling_rate,
                    "count": ev.count,
                }
                for ev in self._ledger
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the ledger by the one in ``state`` (validated; nothing changes on error).

        The precision knobs stored in ``state`` are checked for type but the
        accountant keeps its own (they change the reported bound, not the spending).
        """
        if not isinstance(state, dict):
            raise ValueError(f"state={type(state).__name__}: must be a dict")
        missing = {"version", "ledger"} - set(state)
        if missing:
            raise ValueError(f"state: missing keys {sorted(missing)}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(
                f"state version={state['version']!r}: unsupported (expected {_STATE_VERSION})"
            )
        for key in ("eps_error", "delta_error"):
            if key in state:
                _check_real(f"state {key}", state[key])
        ledger = state["ledger"]
        if not isinstance(ledger, list):
            raise ValueError(f"state ledger={type(ledger).__name__}: must be a list")
        events: list[PrivacyEvent] = []
        for i, item in enumerate(ledger):
            if not isinstance(item, dict):
                raise ValueError(f"state ledger[{i}]={item!r}: must be a dict")
            extra = set(item) - {"noise_multiplier", "sampling_rate", "count"}
            if extra or "noise_multiplier" not in item or "sampling_rate" not in item:
                raise ValueError(
                    f"state ledger[{i}]={item!r}: expected keys noise_multiplier, "
                    "sampling_rate, count"
                )
            try:
                ev = PrivacyEvent(
                    item["noise_multiplier"], item["sampling_rate"], item.get("count", 1)
                )
            except ValueError as err:
                raise ValueError(f"state ledger[{i}]: {err}") from None
            events = self._appended(events, ev)
        self._ledger = events

    def __repr__(self) -> str:
        return (
            f"FDPAccountant(eps_error={self._eps_error}, delta_error={self._delta_error}, "
            f"rounds={self.rounds}, events={len(self._ledger)})"
        )


# --------------------------------------------------------------------------------------
# convenience functions
# --------------------------------------------------------------------------------------


def epsilon_for(
    noise_multiplier: float,
    sampling_rate: float,
    rounds: int,
    delta: float,
    relation: str = "add-remove",
    eps_error: float = 0.05,
) -> EpsilonBound:
    """Epsilon bound of ``rounds`` identical rounds (see :class:`FDPAccountant`)."""
    acc = FDPAccountant(eps_error=eps_error)
    acc.compose(noise_multiplier, sampling_rate, _check_count(rounds, "rounds"))
    return acc.epsilon_bound(delta, relation)


def calibrate_noise_multiplier(
    target_epsilon: float,
    sampling_rate: float,
    rounds: int,
    delta: float,
    relation: str = "add-remove",
    eps_error: float = 0.05,
    rtol: float = 1e-3,
    max_noise_multiplier: float = 1e4,
) -> float:
    """Smallest (to ``rtol``) noise multiplier whose *upper* epsilon is ``<= target``.

    Bisection on ``log sigma``: the returned ``sigma`` always satisfies
    ``epsilon_for(sigma, q, rounds, delta).upper <= target_epsilon`` (never
    overshoots) and ``sigma / (1 + rtol)`` did not (or was never needed).

    Raises
    ------
    ValueError
        Invalid input, or a target that no ``sigma <= max_noise_multiplier`` reaches
        (for ``q < 1`` the upper bound never drops below about ``eps_error``).
    """
    target = _check_real("target_epsilon", target_epsilon)
    if not target > 0 or not math.isfinite(target):
        raise ValueError(f"target_epsilon={target_epsilon!r}: must be finite and > 0")
    q = _check_rate(sampling_rate)
    n = _check_count(rounds, "rounds")
    delta = _check_delta(delta)
    relation = _check_relation(relation)
    rtol = _check_real("rtol", rtol)
    if not 0.0 < rtol < 1.0:
        raise ValueError(f"rtol={rtol!r}: must be in (0, 1)")
    max_sigma = _check_sigma(max_noise_multiplier, "max_noise_multiplier")
    acc_proto = FDPAccountant(eps_error=eps_error)

    def eps(sigma: float) -> float:
        acc = FDPAccountant(eps_error=acc_proto.eps_error)
        acc.compose(sigma, q, n)
        return acc.epsilon(delta, relation)

    hi = 1.0
    while eps(hi) > target:
        hi *= 2.0
        if hi > max_sigma:
            raise ValueError(
                f"target_epsilon={target!r}: unreachable with noise_multiplier <= {max_sigma:g} "
                f"(sampling_rate={q}, rounds={n}, delta={delta}, eps_error={eps_error})"
            )
    lo = hi / 2.0
    while lo > 1e-3 and eps(lo) <= target:
        hi, lo = lo, lo / 2.0
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


# --------------------------------------------------------------------------------------
# trade-off function and attribute inference (Theorem 4)
# --------------------------------------------------------------------------------------


def _default_alphas() -> np.ndarray:
    return np.unique(np.concatenate([[0.0], np.geomspace(1e-6, 1e-2, 200), np.linspace(0.01, 1.0, 400)]))


def _tradeoff_lower(
    events: Sequence[PrivacyEvent], alphas: np.ndarray, eps_error: float, delta_error: float
) -> np.ndarray:
    if not events:
        return 1.0 - alphas
    prof = _profile(_groups(events), _DISC_SHARE * eps_error, delta_error, 2**23)
    if prof.rdp_groups is not None:
        raise ValueError("privacy loss too large for a trade-off curve (use fewer rounds)")
    if prof.gaussian_mu is not None:
        mu = prof.gaussian_mu  # exact: G_mu(a) = Phi(Phi^-1(1 - a) - mu)
        with np.errstate(divide="ignore"):
            return np.clip(special.ndtr(special.ndtri(1.0 - alphas) - mu), 0.0, 1.0)
    t_lo = min(c.t_first for c in prof.curves) + prof.eps_disc
    t_hi = max(c.t_last for c in prof.curves) + prof.eps_disc
    eps = np.linspace(max(t_lo, -30.0), t_hi, 6000)
    dup = prof.delta_upper(eps)
    use = dup < 1.0
    eps, dup = eps[use], dup[use]
    out = np.zeros(len(alphas))
    for s in range(0, len(alphas), 256):
        a = alphas[s : s + 256, None]
        lines = 1.0 - dup[None, :] - np.exp(eps)[None, :] * a
        out[s : s + 256] = np.max(lines, axis=1, initial=0.0)
    return np.clip(out, 0.0, 1.0 - alphas)


def _check_alphas(alphas: Any) -> np.ndarray:
    a = np.asarray(alphas, dtype=float)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"alphas with shape {a.shape}: must be a non-empty 1-D array")
    if not np.all(np.isfinite(a)) or a.min() < 0.0 or a.max() > 1.0:
        raise ValueError("alphas: every value must be in [0, 1]")
    return a


def tradeoff_curve(
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    *,
    eps_error: float | None = None,
    delta_error: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """Composed add/remove trade-off function, as a certified lower bound.

    Returns ``(alphas, betas)`` with ``betas[i] <= f(alphas[i])`` where
    ``f = C(T(P^T, Q^T))`` is the symmetrised (Definition 6 asks for both orderings)
    trade-off function of Theorem 5: the largest convex function below both
    ``T(P^T, Q^T)`` and its inverse ``T(Q^T, P^T)``.  Computed as
    ``max(0, max_eps [1 - delta_up(eps) - e^eps alpha])`` over a grid of ``eps`` values
    (Dong, Roth & Su, Prop. 2.12), where ``delta_up`` is the certified upper bound on
    the larger of the two hockey-stick curves; each term is a line below ``f``, so the
    result is a convex lower bound and ``1 - beta`` upper-bounds attack success
    (Theorem 4).

    Parameters
    ----------
    ledger_or_accountant : FDPAccountant or sequence of PrivacyEvent
    alphas : array, optional
        Type I errors in ``[0, 1]``; default a log/linear grid of 600 points.
    eps_error : float, optional
        Discretisation target (the accountant's when given one, else 0.05).
    delta_error : float
        Absolute delta slack of the curve (adds at most this to ``1 - beta``).
    """
    events = _as_events(ledger_or_accountant)
    if eps_error is None:
        eps_error = (
            ledger_or_accountant.eps_error
            if isinstance(ledger_or_accountant, FDPAccountant)
            else 0.05
        )
    eps_error = _check_real("eps_error", eps_error)
    if not 0.0 < eps_error <= 1.0:
        raise ValueError(f"eps_error={eps_error!r}: must be in (0, 1]")
    delta_error = _check_real("delta_error", delta_error)
    if not _DELTA_ERROR_FLOOR <= delta_error < 0.01:
        raise ValueError(f"delta_error={delta_error!r}: must be in [{_DELTA_ERROR_FLOOR}, 0.01)")
    a = _default_alphas() if alphas is None else _check_alphas(alphas)
    return a, _tradeoff_lower(events, a, eps_error, delta_error)


def attribute_inference_bound(ledger_or_accountant: Any, ball: float, **kwargs: Any) -> float:
    """Upper bound on attribute-inference success, ``1 - f(Ball)`` (Theorem 4).

    ``ball`` is ``Ball(X, u, d, rho)``: the best success rate of a guess that does not
    see the model (Definition 8), in ``[0, 1]``.  ``f`` is the certified lower bound
    of :func:`tradeoff_curve`, so the result is an upper bound in ``[ball, 1]``.
    """
    b = _check_real("ball", ball)
    if not 0.0 <= b <= 1.0:
        raise ValueError(f"ball={ball!r}: must be in [0, 1]")
    _, beta = tradeoff_curve(ledger_or_accountant, np.array([b]), **kwargs)
    return float(min(1.0, max(b, 1.0 - beta[0])))


def save_tradeoff_csv(
    path: str | os.PathLike[str],
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    **kwargs: Any,
) -> None:
    """Write the trade-off curve to ``path`` as CSV with columns ``alpha,beta``."""
    a, b = tradeoff_curve(ledger_or_accountant, alphas, **kwargs)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["alpha", "beta"])
        for x, y in zip(a, b, strict=True):
            w.writerow([repr(float(x)), repr(float(y))])


def plot_tradeoff(
    path: str | os.PathLike[str],
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    *,
    title: str | None = None,
    **kwargs: Any,
) -> None:
    """Plot the trade-off curve (and the ``beta = 1 - alpha`` line) to a PNG file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, b = tradeoff_curve(ledger_or_accountant, alphas, **kwargs)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    try:
        ax.plot(a, b, label="f (lower bound)")
        ax.plot([0, 1], [1, 0], ls="--", c="grey", lw=0.8, label="perfect privacy")
        ax.set_xlabel("type I error alpha")
        ax.set_ylabel("type II error beta")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.legend(loc="upper right")
        if title:
            ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def _dumps_state(acc: FDPAccountant) -> str:  # pragma: no cover - debugging helper
    return json.dumps(acc.state_dict())
