"""Privacy accounting for feature differential privacy (FDP).

Mechanism
---------
One round of Algorithm 1 (or of its federated form) releases the sum of per-record
private gradients, each clipped to L2 norm ``C`` (so adding or removing one record
moves the sum by at most ``C``), over a Poisson-subsampled batch (each record joins
independently with probability ``q``), plus Gaussian noise ``N(0, sigma^2 C^2 I)``.
Public work (public gradients, public pre-training) depends on ``Psi(S)`` only and
costs nothing (Remark 2).  By **Theorem 5** of the FDP paper each round is dominated
by the pair (in units of ``C``)

    P = N(0, sigma^2)                            the simulator: the record is absent,
    Q = (1 - q) N(0, sigma^2) + q N(1, sigma^2)  the record is present,

and rounds compose adaptively (Theorem 3): a run is ``f-DP_i^Psi`` with
``f = T(P_1 x ... x P_T, Q_1 x ... x Q_T)``, each round with its own ``(sigma, q)``.

Neighbouring relations
----------------------
``"add-remove"`` (Definition 6, simulation-based; the headline number).  Definition 6
asks for ``Pr[M(S u {x}) in E] <= 1 - f(Pr[sim(S, Psi(x)) in E])`` *and* the reverse
inequality, so both orderings of the pair are accounted:

* **remove**: ``delta(eps) = H_{e^eps}(Q || P)``, privacy loss ``log(Q/P)`` under ``Q``.
  This is the ordering prv-accountant's ``PoissonSubsampledGaussianMechanism`` models
  (its CDF is that of ``log(Q/P)(w)`` with ``w ~ Q``), and dp-accounting's ``REMOVE``
  (``mu_upper`` = the mixture, ``mu_lower`` = the Gaussian).
* **add**: ``delta(eps) = H_{e^eps}(P || Q)``, privacy loss ``log(P/Q)`` under ``P``,
  at most ``-log(1 - q)`` per round (dp-accounting's ``ADD``).  prv-accountant has no
  random variable for it; it is implemented here (``_cell_masses``).

The epsilon reported is the larger of the two, as dp-accounting does for
``ADD_OR_REMOVE_ONE``.

``"replacement"`` (Definition 5) follows from add/remove by **Proposition 1**
(``f-DP_i => (f o f)-DP_r``), used in its (eps, delta) form:
``(eps, delta)-DP_i => (2 eps, delta (1 + e^eps))-DP_r`` (the paper's proof chains the
two simulator inequalities through ``sim``).  For a target ``delta_r`` we search
``delta_i`` and keep the best *certified* pair: ``eps_i`` is the **upper** end of the
add/remove interval at ``delta_i``, the pair is kept only if
``delta_i (1 + e^{eps_i}) <= delta_r``, and ``2 eps_i`` is reported.  Each kept pair is
a true ``(eps_i, delta_i)``-DP_i statement, so its image under Proposition 1 is a true
replacement guarantee at ``delta_i (1 + e^{eps_i}) <= delta_r``, hence at ``delta_r``;
the best of several true upper bounds is a true upper bound.  The search runs over
log grids of ``delta_i`` from the fixed point of the Renyi-DP bound (feasible by
construction, since the upper end is capped by Renyi DP) up to ``delta_r / 2``.  Only
when even that needs ``delta_i < 1e-300`` (``eps_i`` near 700) is the answer ``inf``
(vacuous, never wrong).  A tighter numerical ``f o f`` is not attempted.

Numerical method: privacy random variables (Gopi, Lee & Wutschitz, NeurIPS 2021)
--------------------------------------------------------------------------------
This follows prv-accountant 0.2.0 (same PRV, mesh rule, error theorem), re-implemented
for speed and extended with the add direction:

1. For each direction and distinct ``(sigma, q)`` the PRV is truncated to an interval
   holding all but ``eta = delta_error / (8 N)`` of its mass (normal quantiles) and
   discretised cell-centred on the mesh ``h = eps_disc / sqrt(N/2 log(12/delta_error))``
   (prv-accountant's rule; ``N`` = total rounds).  Cell masses are differences of
   normal CDFs taken on the accurate side (``ndtr`` / survival), then shifted so the
   discrete mean equals the truncated continuous mean (quadrature).
2. The ledger is composed in Fourier space, ``G = prod_i F_i^{n_i}`` with ``F_i`` the
   DFT of each discretised PRV, on a window that holds the composed loss up to
   ``delta_error/4`` above and ``delta_error/16`` below (Chernoff bounds from the Renyi
   moments of the subsampled Gaussian; by Mironov, Talwar & Zhang 2019 the
   remove-ordering moments also bound the add ordering).  Only frequencies with
   ``|G_k| > e^-80`` matter; a coarse FFT with a Lipschitz bound on ``|F_i|`` certifies
   which ones can, and those are evaluated by a direct DFT (or by a full-length FFT
   when that is cheaper).  With few kept frequencies the hockey-stick curve is
   evaluated from ``G`` directly (geometric sums, no inverse FFT), otherwise by an
   inverse FFT and cumulative sums.
3. By Hoeffding the summed rounding errors exceed ``eps_disc`` with probability at
   most ``delta_error/6``; with the truncation terms, for every ``eps``

       d~(eps + eps_disc) - delta_error <= delta(eps) <= d~(eps - eps_disc) + delta_error,

   ``d~`` being the hockey-stick curve of the discrete composed PRV.  So
   ``lower = eps~(delta + delta_error) - eps_disc``, ``estimate = eps~(delta)``,
   ``upper = eps~(delta - delta_error) + eps_disc``; ``upper`` is what is printed.
   The upper value is also capped by the Renyi-DP bound (valid for both orderings).

Float64 round-off is bounded explicitly (``~2 N eps_machine sum|G_k|`` in L1; against
a long-double reference the actual error was 20x smaller) and added to
``delta_error`` when it exceeds its share; before that happens the largest Fourier
coefficients are recomputed in long double (about 1000x less round-off).  Rounding
of the cell masses is a relative perturbation and changes ``delta`` by a relative
``~N 1e-12`` at most.

Precision and speed: ``eps_disc = 0.9 eps_error`` and ``delta_error = 1e-3 delta`` (the
``delta_error`` knob is relative), so ``upper - estimate`` is ``0.9 eps_error`` plus
the (small) effect of ``delta_error``: 0.045-0.048 at the default ``eps_error = 0.05``;
the exact interval is in the returned :class:`EpsilonBound`.  10,000 rounds at
``q = 1/16``, ``sigma = 0.8``, ``delta = 1e-5`` take about 0.06-0.2 s on two cores
(``benchmarks/accounting.py``, ``docs/accounting.md``).  Ledgers with more than 128
distinct ``(sigma, q)`` are rounded onto a log grid (``sigma`` down and ``q`` up for
the upper bound, the reverse for the lower), which keeps both bounds valid.

A ledger of ``q = 1`` rounds only is the Gaussian mechanism with
``mu = sqrt(sum_i n_i / sigma_i^2)``, solved in closed form:
``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.

Nothing here draws random numbers.
"""

from __future__ import annotations

import csv
import functools
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
    "epsilon_prv_accountant",
    "plot_tradeoff",
    "save_tradeoff_csv",
    "tradeoff_curve",
]

RELATIONS = ("add-remove", "replacement")
_STATE_VERSION = 1
# Share of ``eps_error`` given to the discretisation; the rest absorbs the effect of
# ``delta_error`` on the interval.
_DISC_SHARE = 0.9
# Smallest absolute delta_error used (keeps the mesh finite for tiny deltas).
_DELTA_ERROR_FLOOR = 1e-13
# Share of delta_error used by the analytic terms: Hoeffding 1/6 (in the coupling and
# once more for mass it may push out of the window), per-round truncation 1/8,
# composed upper tail 1/4, lower-tail aliasing 1/16.  The rest is for round-off.
_ANALYTIC_SHARE = 2.0 / 6.0 + 1.0 / 8.0 + 1.0 / 4.0 + 1.0 / 16.0
# Fourier coefficients of the composition below exp(_LOG_F_CUT) are dropped.
_LOG_F_CUT = -80.0
# Long-double direct DFTs are used while (support x kept frequencies) is below this.
_DFT_WORK_LIMIT = 4e7
# Compositions with at most this many kept frequencies are evaluated spectrally.
_SPECTRAL_MAX = 128
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


# --------------------------------------------------------------------------------------
# errors, events, results, validation
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
        Upper-bound epsilon the refused step would have reached, when known.
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
        args = (self.epsilon_spent, self.max_epsilon, self.delta, self.epsilon_requested)
        return (type(self), args)


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
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
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
    return str(relation)


def _check_eps_error(value: Any, name: str = "eps_error") -> float:
    v = _check_real(name, value)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"{name}={value!r}: must be in (0, 1]")
    return v


@dataclass(frozen=True)
class PrivacyEvent:
    """``count`` rounds of the Poisson-subsampled Gaussian mechanism.

    Parameters
    ----------
    noise_multiplier : float
        ``sigma``: noise std divided by the clip norm (the L2 sensitivity); finite, > 0.
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

    ``lower <= epsilon <= upper`` for the accounted dominating pair (the numerical
    slack is folded in); ``estimate`` is the point estimate.  ``upper`` is the number
    to print and to compare with budgets.  ``relation`` is ``"add-remove"`` or
    ``"replacement"``.
    """

    lower: float
    estimate: float
    upper: float
    delta: float
    relation: str

    @property
    def error(self) -> float:
        """``upper - estimate``."""
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


# --------------------------------------------------------------------------------------
# discretisation and composition
# --------------------------------------------------------------------------------------


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


class _CurveBase:
    """Hockey-stick curve ``delta~`` of a discrete composed PRV on ``t_i = t0 + i h``.

    ``delta~(eps) = sum_{t_j > eps} c_j (1 - e^{eps - t_j}) = d1(i) - e^{eps - t_i} e2(i)``
    for ``t_{i-1} < eps <= t_i``, with ``d1(i) = sum_{j>=i} c_j`` and
    ``e2(i) = sum_{j>=i} c_j e^{-(t_j - t_i)}``.
    """

    t0: float
    h: float
    n_grid: int

    def _sums(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    @property
    def t_first(self) -> float:
        return self.t0

    @property
    def t_last(self) -> float:
        return self.t0 + (self.n_grid - 1) * self.h

    def _index(self, eps: np.ndarray) -> np.ndarray:
        """First grid index with ``t_i >= eps`` (``n_grid`` if none)."""
        x = np.ceil((eps - self.t0) / self.h - 1e-9)
        return np.clip(x, 0, self.n_grid).astype(np.int64)

    def delta(self, eps: np.ndarray) -> np.ndarray:
        """``delta~(eps)`` (exact for the discrete distribution)."""
        eps = np.asarray(eps, dtype=float)
        flat = eps.ravel()
        out = np.zeros(flat.shape)
        for s in range(0, len(flat), 512):
            e = flat[s : s + 512]
            i = self._index(e)
            inside = i < self.n_grid
            d1, e2 = self._sums(np.minimum(i, self.n_grid - 1))
            with np.errstate(over="ignore", invalid="ignore"):
                val = d1 - np.exp(e - (self.t0 + i * self.h)) * e2
            out[s : s + 512] = np.where(inside, np.nan_to_num(val, nan=0.0), 0.0)
        return np.clip(out, 0.0, 1.0).reshape(eps.shape)

    def epsilon(self, deltas: np.ndarray) -> np.ndarray:
        """Smallest ``eps`` with ``delta~(eps) <= delta``, elementwise (may be ``-inf``).

        Bisection over the grid (``delta~`` is non-increasing) finds the cell of the
        crossing, whose closed form is then inverted exactly.
        """
        d = np.atleast_1d(np.asarray(deltas, dtype=float))
        m = len(d)
        d1_0, e2_0 = self._sums(np.zeros(1, dtype=np.int64))
        first_ok = (d1_0[0] - e2_0[0]) <= d
        lo = np.where(first_ok, -1, 0)
        hi = np.where(first_ok, 0, self.n_grid - 1)
        while True:
            act = np.nonzero(hi - lo > 1)[0]
            if len(act) == 0:
                break
            mid = (lo[act] + hi[act]) // 2
            d1, e2 = self._sums(mid)
            ok = (d1 - e2) <= d[act]
            hi[act] = np.where(ok, mid, hi[act])
            lo[act] = np.where(ok, lo[act], mid)
        d1, e2 = self._sums(hi)
        t_hi = self.t0 + hi * self.h
        t_lo = np.where(hi == 0, -np.inf, self.t0 + lo * self.h)
        num = d1 - d
        with np.errstate(divide="ignore", invalid="ignore"):
            eps = t_hi + np.log(num / e2)
        eps = np.where(e2 > 0.0, eps, t_hi)
        eps = np.where(num > 0.0, eps, t_lo)
        return np.minimum(np.maximum(eps, t_lo), t_hi).reshape(m)


class _ArrayCurve(_CurveBase):
    """Curve from the composed masses themselves (inverse FFT + cumulative sums)."""

    def __init__(self, t0: float, h: float, pmf: np.ndarray) -> None:
        p = np.maximum(pmf, 0.0)
        self.t0, self.h, self.n_grid = t0, h, len(p)
        self.d1 = np.cumsum(p[::-1])[::-1]
        self.d2 = np.cumsum((p * _exp_grid(-t0, -h, len(p)))[::-1])[::-1]  # sum p e^{-t}

    def _sums(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = np.asarray(i, dtype=np.int64)
        return self.d1[i], self.d2[i] * np.exp(self.t0 + i * self.h)


def _exp_grid(x0: float, h: float, n: int) -> np.ndarray:
    """``exp(x0 + j h)`` for ``j < n`` via a two-level table."""
    m = 1024
    coarse = np.exp(x0 + h * m * np.arange(-(-n // m)))
    fine = np.exp(h * np.arange(m))
    return (coarse[:, None] * fine[None, :]).ravel()[:n]


class _SpectralCurve(_CurveBase):
    """Curve evaluated from the kept Fourier coefficients ``G_k`` of the composition.

    The masses are ``c_j = (1/n) sum_k G_k z_k^(k_lo + j)``, ``z_k = e^{2 pi i k/n}``, so the
    tail sums are geometric series: ``d1(i) = sum_k a_k z^i (1 - z^r)/(1 - z)`` and
    ``e2(i) = sum_k a_k z^i (1 - (z e^-h)^r)/(1 - z e^-h)`` with ``r = n_grid - i`` and
    ``a_k = m_k G_k z_k^k_lo / n``.  Each ``1 - e^w`` is formed without cancellation
    and angles are reduced exactly with integer arithmetic.
    """

    def __init__(
        self, t0: float, h: float, width: int, n: int, k_lo: int, freqs: np.ndarray, g: np.ndarray
    ) -> None:
        self.t0, self.h, self.n_grid, self.n = t0, h, width, n
        self.f = freqs.astype(np.int64)
        mult = np.where((self.f == 0) | (2 * self.f == n), 1.0, 2.0)
        self.a = mult * g * np.exp(1j * self._angle(np.array([k_lo])))[0] / n
        self.zero = self.f == 0
        one = np.ones(1, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / self._one_minus(np.zeros(1), one)[0]
        self.inv1mz = np.where(self.zero, 0.0, inv)
        self.inv1mr = 1.0 / self._one_minus(np.array([-h]), one)[0]
        # size of the summed terms, for the round-off bound
        self.term_scale = float(
            np.sum(np.abs(self.a) * 2.0 * (np.abs(self.inv1mz) + np.abs(self.inv1mr)))
            + np.sum(np.abs(self.a[self.zero])) * width
        )

    def _angle(self, m: np.ndarray) -> np.ndarray:
        """``2 pi k m / n`` reduced exactly to ``(-pi, pi]`` (rows ``m``, columns ``k``)."""
        r = (np.asarray(m, dtype=np.int64)[:, None] * self.f[None, :]) % self.n
        r = np.where(2 * r > self.n, r - self.n, r)
        return (2.0 * np.pi / self.n) * r

    def _one_minus(self, x: np.ndarray, m: np.ndarray) -> np.ndarray:
        """``1 - exp(x + i 2 pi k m / n)`` without cancellation."""
        ang = self._angle(m)
        # clamp: e^-700 is negligible and keeps the arithmetic out of subnormals (slow)
        x = np.maximum(np.asarray(x, dtype=float), -700.0)[:, None]
        s = np.sin(0.5 * ang)
        return (-np.expm1(x) + np.exp(x) * 2.0 * s * s) - 1j * np.exp(x) * np.sin(ang)

    def _sums(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = np.asarray(i, dtype=np.int64)
        rem = self.n_grid - i
        zi = np.exp(1j * self._angle(i))
        a_sum = zi * self._one_minus(np.zeros(len(i)), rem) * self.inv1mz[None, :]
        a_sum = a_sum + np.where(self.zero[None, :], rem[:, None].astype(float), 0.0)
        b_sum = zi * self._one_minus(-self.h * rem, rem) * self.inv1mr[None, :]
        # elementwise products: small BLAS calls are slow when threads are contended
        return (a_sum * self.a).sum(axis=1).real, (b_sum * self.a).sum(axis=1).real


def _pairwise_rows(x: np.ndarray) -> np.ndarray:
    """Sum over the first axis by pairwise addition."""
    while x.shape[0] > 1:
        if x.shape[0] % 2:
            x = np.concatenate([x, np.zeros((1, *x.shape[1:]), dtype=x.dtype)])
        x = x[0::2] + x[1::2]
    return x[0]


def _dft(
    pmf: np.ndarray, k_first: int, freqs: np.ndarray, n: int, dtype: type = np.float64
) -> np.ndarray:
    """``sum_j pmf_j exp(-2 pi i f (k_first + j) / n)`` at the integer frequencies ``freqs``.

    Blocked direct DFT (``j = a B + b``, two real matrix products) with exact integer
    reduction of the angles and pairwise sums.  In ``np.longdouble`` the relative
    accuracy is ~1e-18 (a float64 FFT: ~2e-16).
    """
    s = len(pmf)
    b = math.ceil(math.sqrt(s))
    a = -(-s // b)
    p = np.zeros(a * b, dtype=dtype)
    p[:s] = pmf
    p = p.reshape(a, b)
    two_pi_n = dtype(2) * np.arccos(dtype(-1)) / dtype(n)
    f = freqs.astype(np.int64)
    ang_b = ((np.arange(b, dtype=np.int64)[:, None] * f[None, :]) % n).astype(dtype) * two_pi_n
    rows = (k_first + b * np.arange(a, dtype=np.int64)) % n
    ang_a = ((rows[:, None] * f[None, :]) % n).astype(dtype) * two_pi_n
    # einsum without BLAS: small multithreaded BLAS calls stall on a busy machine
    re_in = np.einsum("ab,bk->ak", p, np.cos(ang_b), optimize=False)
    im_in = -np.einsum("ab,bk->ak", p, np.sin(ang_b), optimize=False)
    ca, sa = np.cos(ang_a), np.sin(ang_a)
    re = _pairwise_rows(ca * re_in + sa * im_in)
    im = _pairwise_rows(ca * im_in - sa * re_in)
    return re + 1j * im


@dataclass(frozen=True)
class _Grid:
    h: float  # mesh
    eta: float  # per-round truncated mass
    upper: float  # composed loss exceeds this with probability <= delta_error / 4
    lower: float  # composed loss is below -lower with probability <= delta_error / 16
    margin: float  # slack around the window (discretisation error + 1)


def _make_grid(groups: Sequence[Group], eps_disc: float, delta_error: float) -> _Grid:
    n_total = sum(n for _, _, n in groups)
    h = eps_disc / math.sqrt(n_total / 2.0 * math.log(12.0 / delta_error))
    return _Grid(
        h=h,
        eta=delta_error / (8.0 * n_total),
        upper=_chernoff_upper(groups, delta_error / 4.0),
        lower=_chernoff_lower(groups, delta_error / 16.0),
        margin=eps_disc + 1.0,
    )


Part = tuple[tuple[int, np.ndarray, float], int]  # ((k_first, pmf, shift), count)


def _candidate_frequencies(parts: Sequence[Part], n_fft: int, h: float) -> np.ndarray | None:
    """Frequencies ``k`` of the length-``n_fft`` DFT that may have ``|G_k| > e^-80``.

    A coarse FFT of length ``M >= 4 max(support)`` samples each ``|F_i|`` at spacing
    ``dw = 2 pi / (M h)``; ``|F_i|`` is Lipschitz with constant ``m1_i = sum_j p_j |t_j - mean|``,
    so every frequency within ``dw/2`` of a coarse sample obeys
    ``|G| <= prod_i (|F_i(sample)| + m1_i dw/2)^{n_i}``.  Frequencies whose bound is
    below ``e^-80`` are certainly negligible; the rest are returned.  ``None`` when a
    full FFT is cheaper.
    """
    longest = max(len(p) for (_, p, _), _ in parts)
    m = _fft.next_fast_len(4 * longest + 1, real=True)
    if 4 * m >= n_fft:
        return None
    dw = 2.0 * np.pi / (m * h)
    bound = np.zeros(m // 2 + 1)
    for (_, pmf, _), n in parts:
        t = np.arange(len(pmf)) * h
        m1 = float(np.sum(pmf * np.abs(t - np.sum(pmf * t))))
        arr = np.zeros(m)
        arr[: len(pmf)] = pmf
        mod = np.abs(_fft.rfft(arr)) + m1 * dw / 2.0
        with np.errstate(divide="ignore"):
            bound += n * np.log(np.minimum(mod, 1.0))
    coarse = np.nonzero(bound > _LOG_F_CUT)[0]
    lo = np.maximum(np.ceil((coarse - 0.5) * n_fft / m), 0).astype(np.int64)
    hi = np.minimum(np.floor((coarse + 0.5) * n_fft / m), n_fft // 2).astype(np.int64)
    count = int(np.sum(np.maximum(hi - lo + 1, 0)))
    work = count * sum(len(p) for (_, p, _), _ in parts)
    if count > n_fft // 16 or work > _DFT_WORK_LIMIT:
        return None
    if count == 0:
        return np.zeros(1, dtype=np.int64)
    return np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(lo, hi, strict=True)]))


def _compose_direction(
    groups: Sequence[Group], direction: str, grid: _Grid, noise_budget: float
) -> tuple[_CurveBase, float]:
    """Compose one ordering; returns its curve and a bound on float round-off in delta.

    The spectra ``F_i`` are needed only where ``G = prod F_i^{n_i}`` is not negligible:
    those frequencies are found with a certified coarse bound and evaluated by a
    direct DFT (or, when that is not cheaper, by a full-length FFT).

    Each float64 spectrum has relative error ~``eps_machine``, so ``G`` has relative
    error ``~N eps_machine`` and the composed masses err by at most
    ``2 N u sum_k |G_k|`` in L1 (``u = 2 eps_machine``).  If that exceeds
    ``noise_budget`` the largest coefficients are recomputed in long double
    (``u = 4 eps_longdouble``) until the rest fits.  Against a long-double reference (N = 10,000,
    q = 1/16, sigma = 0.8) the actual L1 errors were 1.5e-12 and 1.9e-15, against
    bounds of 3.4e-11 and 3e-14.
    """
    h = grid.h
    parts: list[Part] = [(_discretise(s, q, direction, h, grid.eta), n) for s, q, n in groups]
    shift = sum(n * s for (_, _, s), n in parts)
    n_total = sum(n for _, n in parts)
    # window in index space; the composed truncated loss lies in [sum n k_first, sum n k_last]
    k_min = sum(n * k for (k, _, _), n in parts)
    k_max = sum(n * (k + len(p) - 1) for (k, p, _), n in parts)
    k_hi = min(k_max, math.ceil((grid.upper + grid.margin - shift) / h))
    k_lo = max(k_min, math.floor((-grid.lower - grid.margin - shift) / h))
    k_lo = min(k_lo, k_hi - 1)
    width = k_hi - k_lo + 1
    longest = max(len(p) for (_, p, _), _ in parts)
    n_fft = _fft.next_fast_len(max(width, longest + 1), real=True)

    freqs = _candidate_frequencies(parts, n_fft, h)
    if freqs is None:
        freqs = np.arange(n_fft // 2 + 1)
    # log G = sum_i n_i log F_i, accumulated without keeping the spectra
    log_mod = np.zeros(len(freqs))
    phase = np.zeros(len(freqs))
    for (k_first, pmf, _), n in parts:
        if len(freqs) == n_fft // 2 + 1:  # full-length FFT
            arr = np.zeros(n_fft)
            arr[np.arange(k_first, k_first + len(pmf)) % n_fft] = pmf
            spec = _fft.rfft(arr)
        else:
            spec = _dft(pmf, k_first, freqs, n_fft)
        with np.errstate(divide="ignore"):
            log_mod += n * np.log(np.abs(spec))
        phase += n * np.angle(spec)
    keep = log_mod > _LOG_F_CUT
    if not keep.any():
        keep[0] = True
    freqs = freqs[keep]
    mod_g = np.exp(log_mod[keep])
    sum_g = float(mod_g.sum())
    eps64 = float(np.finfo(np.float64).eps)
    per_coef = 4.0 * n_total * eps64  # L1 round-off per unit of |G_k| (float64 spectrum)
    g = np.exp(log_mod[keep] + 1j * phase[keep])
    noise = per_coef * sum_g
    if noise > noise_budget:
        # recompute the largest coefficients in long double until the rest fits
        order = np.argsort(mod_g)  # ascending
        rest = np.cumsum(mod_g[order]) * per_coef <= noise_budget
        fix = np.sort(order[~rest])
        if len(fix) * sum(len(p) for (_, p, _), _ in parts) <= _DFT_WORK_LIMIT:
            log_g = np.zeros(len(fix), dtype=np.clongdouble)
            for (k_first, pmf, _), n in parts:
                log_g += n * np.log(_dft(pmf, k_first, freqs[fix], n_fft, np.longdouble))
            g[fix] = np.exp(log_g).astype(complex)
            eps_ld = float(np.finfo(np.longdouble).eps)
            noise = per_coef * float(mod_g[order[rest]].sum())
            noise += 8.0 * n_total * eps_ld * float(mod_g[fix].sum()) + eps64 * sum_g
    t0 = k_lo * h + shift
    if len(freqs) <= _SPECTRAL_MAX:
        curve = _SpectralCurve(t0, h, width, n_fft, k_lo, freqs, g)
        return curve, noise + 8.0 * eps64 * curve.term_scale
    comp = np.zeros(n_fft // 2 + 1, dtype=complex)
    comp[freqs] = g
    out = np.roll(_fft.irfft(comp, n_fft), -k_lo)[:width]
    return _ArrayCurve(t0, h, out), noise + eps64 * sum_g * math.log2(n_fft)


@dataclass(frozen=True)
class _Profile:
    """Both orderings of a composed ledger and the error terms that bound them.

    ``delta_slack`` is the additive delta error: ``delta_error``, or more when the
    round-off bound exceeds its share.  With no curves (ledger far too lossy for the
    mesh) only the Renyi-DP bound is available; ``gaussian_mu`` marks the closed form.
    """

    groups: tuple[Group, ...]
    curves: tuple[_CurveBase, ...] = ()
    eps_disc: float = 0.0
    delta_slack: float = 0.0
    gaussian_mu: float | None = None

    def epsilon_bounds(self, deltas: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lower, estimate, upper)`` add/remove epsilon at each of ``deltas``.

        ``upper`` is also capped by the Renyi-DP bound (valid for both orderings),
        which only matters when round-off swamps a tiny delta.
        """
        d = np.atleast_1d(np.asarray(deltas, dtype=float))
        if self.gaussian_mu is not None:  # closed form; +-1e-9 (1 + eps) covers round-off
            e = np.array([_gaussian_epsilon(self.gaussian_mu, float(x)) for x in d])
            pad = 1e-9 * (1.0 + e)
            return np.maximum(e - pad, 0.0), e, np.where(e > 0.0, e + pad, 0.0)
        rdp = np.array([_rdp_epsilon(self.groups, float(x)) for x in d])
        if not self.curves:
            return np.zeros(len(d)), rdp.copy(), rdp
        de, ed = self.delta_slack, self.eps_disc
        lo = np.zeros(len(d))
        est = np.zeros(len(d))
        up = np.zeros(len(d))
        for c in self.curves:
            lo = np.maximum(lo, c.epsilon(d + de) - ed)
            est = np.maximum(est, c.epsilon(d))
            u = np.where(d > de, c.epsilon(np.maximum(d - de, 0.0)) + ed, np.inf)
            up = np.maximum(up, u)
        up = np.minimum(up, rdp)
        est = np.minimum(est, up)
        return np.minimum(lo, est), est, up

    def delta_upper(self, eps: np.ndarray) -> np.ndarray:
        """Certified upper bound on the larger of the two ``delta(eps)`` curves."""
        eps = np.asarray(eps, dtype=float)
        if self.gaussian_mu is not None:
            return _gaussian_delta(self.gaussian_mu, eps)
        out = np.zeros(eps.shape)
        for c in self.curves:
            out = np.maximum(out, c.delta(eps - self.eps_disc) + self.delta_slack)
        return np.minimum(out, 1.0)


def _groups(events: Iterable[PrivacyEvent]) -> tuple[Group, ...]:
    """Aggregate counts per distinct ``(sigma, q)`` (composition is commutative)."""
    acc: dict[tuple[float, float], int] = {}
    for ev in events:
        key = (ev.noise_multiplier, ev.sampling_rate)
        acc[key] = acc.get(key, 0) + ev.count
    return tuple((s, q, n) for (s, q), n in sorted(acc.items()))


def _merge_gaussians(groups: Sequence[Group]) -> tuple[Group, ...]:
    """Replace all ``q = 1`` groups by one Gaussian round with ``1/s^2 = sum n_i/s_i^2``."""
    inv = sum(n / (s * s) for s, q, n in groups if q == 1.0)
    out = [(s, q, n) for s, q, n in groups if q < 1.0]
    if inv > 0.0:
        out.append((1.0 / math.sqrt(inv), 1.0, 1))
    return tuple(out)


@functools.lru_cache(maxsize=6)
def _profile(
    groups: tuple[Group, ...], eps_disc: float, delta_error: float, max_grid_points: int
) -> _Profile:
    """Compose a ledger (aggregated by ``_groups``) into both hockey-stick curves."""
    if all(q == 1.0 for _, q, _ in groups):
        return _Profile(groups, gaussian_mu=math.sqrt(sum(n / (s * s) for s, _, n in groups)))
    merged = _merge_gaussians(groups)
    grid = _make_grid(merged, eps_disc, delta_error)
    span = (grid.upper + grid.lower + 2.0 * grid.margin) / grid.h
    if span > max_grid_points or grid.upper > 700.0:
        # privacy loss far too large to resolve with this mesh: report the Renyi-DP
        # bound, valid (if looser) for both orderings
        return _Profile(groups)
    budget = 0.25 * (1.0 - _ANALYTIC_SHARE) * delta_error
    remove, noise_r = _compose_direction(merged, "remove", grid, budget)
    add, noise_a = _compose_direction(merged, "add", grid, budget)
    slack = max(delta_error, _ANALYTIC_SHARE * delta_error + max(noise_r, noise_a))
    return _Profile(groups, (remove, add), eps_disc, slack)


# Ledgers with more distinct (sigma, q) than this are bucketed (see ``_bucket``).
_MAX_GROUPS = 128


def _bucket(groups: tuple[Group, ...], conservative: bool) -> tuple[Group, ...]:
    """Round ``(sigma, q)`` onto a log grid so that at most ``_MAX_GROUPS`` remain.

    ``conservative``: ``sigma`` down and ``q`` up, a pair that dominates each round
    (less noise and more sampling are post-processing-worse), so the composition is an
    upper bound; otherwise the opposite rounding, a lower bound.  The finest relative
    step among 1e-4 ... 0.3 that gives few enough groups is used; the interval
    widens accordingly.
    """
    if len(groups) <= _MAX_GROUPS:
        return groups
    out: dict[tuple[float, float], int] = {}
    for r in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3):
        out = {}
        for s, q, n in groups:
            ls, lq = math.log(s) / r, math.log(q) / r
            if conservative:
                s2 = math.exp(r * math.floor(ls)) * (1.0 - 1e-15)
                q2 = min(1.0, math.exp(r * math.ceil(lq)) * (1.0 + 1e-15))
            else:
                s2 = math.exp(r * math.ceil(ls)) * (1.0 + 1e-15)
                q2 = min(1.0, math.exp(r * math.floor(lq)) * (1.0 - 1e-15))
            out[(s2, q2)] = out.get((s2, q2), 0) + n
        if len(out) <= _MAX_GROUPS:
            break
    return tuple((s, q, n) for (s, q), n in sorted(out.items()))


@dataclass(frozen=True)
class _Bounds:
    """Upper-bound and lower-bound profiles (the same object unless bucketed)."""

    upper: _Profile
    lower: _Profile

    def epsilon_bounds(self, deltas: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.upper is self.lower:
            return self.upper.epsilon_bounds(deltas)
        lo, est, _ = self.lower.epsilon_bounds(deltas)
        up = self.upper.epsilon_bounds(deltas)[2]
        est = np.minimum(est, up)
        return np.minimum(lo, est), est, up


def _bounds(
    events: Sequence[PrivacyEvent], eps_disc: float, delta_error: float, max_grid_points: int
) -> _Bounds:
    groups = _groups(events)
    delta_error = max(delta_error, _DELTA_ERROR_FLOOR)
    up = _profile(_bucket(groups, True), eps_disc, delta_error, max_grid_points)
    if len(groups) <= _MAX_GROUPS:
        return _Bounds(up, up)
    lo = _profile(_bucket(groups, False), eps_disc, delta_error, max_grid_points)
    return _Bounds(up, lo)


# --------------------------------------------------------------------------------------
# the accountant
# --------------------------------------------------------------------------------------


def _as_events(ledger_or_accountant: Any) -> tuple[PrivacyEvent, ...]:
    if isinstance(ledger_or_accountant, FDPAccountant):
        return ledger_or_accountant.ledger
    if isinstance(ledger_or_accountant, PrivacyEvent):
        return (ledger_or_accountant,)
    if isinstance(ledger_or_accountant, (str, bytes, dict)):
        raise ValueError(
            f"ledger_or_accountant={ledger_or_accountant!r}: expected an FDPAccountant or "
            "a sequence of PrivacyEvent"
        )
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


def _appended(ledger: Sequence[PrivacyEvent], event: PrivacyEvent) -> list[PrivacyEvent]:
    """``ledger + [event]``, merged into the last event when ``(sigma, q)`` agree."""
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


class FDPAccountant:
    """Ledger and epsilon of a run of Algorithm 1 (FDP-SGD) or its federated form.

    Each :meth:`compose` records ``count`` rounds of the Poisson-subsampled Gaussian
    mechanism: sensitivity 1 after dividing by the clip norm ``C``, noise multiplier
    ``sigma`` (noise std ``sigma C``), sampling rate ``q``.  By Theorem 5 each round is
    ``T(N(0, s^2), (1-q) N(0, s^2) + q N(1, s^2))``-DP_i^Psi and rounds compose
    (Theorem 3).  :meth:`epsilon` reports the certified upper end of the numerical
    error interval, for add/remove (Definition 6, both orderings of the pair) or
    replacement (Definition 5 via Proposition 1).  See the module docstring for the
    method and its guarantees.

    Parameters
    ----------
    eps_error : float
        Target for ``upper - estimate``, in ``(0, 1]``.  ``0.9 eps_error`` is the
        discretisation error (prv-accountant's ``eps_error``); the rest absorbs the
        effect of ``delta_error``.  Time grows like ``1 / eps_error``.
    delta_error : float
        Relative delta slack, in ``(0, 0.1]``: ``delta_error * delta`` is
        prv-accountant's ``delta_error`` (absolute floor 1e-13).
    max_grid_points : int
        Largest discretisation window; beyond it (astronomical epsilon) only the
        Renyi-DP bound, a valid but looser upper bound, is reported.
    """

    def __init__(
        self,
        eps_error: float = 0.05,
        delta_error: float = 1e-3,
        max_grid_points: int = 2**24,
    ) -> None:
        self._eps_error = _check_eps_error(eps_error)
        delta_error = _check_real("delta_error", delta_error)
        if not 0.0 < delta_error <= 0.1:
            raise ValueError(f"delta_error={delta_error!r}: must be in (0, 0.1]")
        self._delta_error = delta_error
        if (
            isinstance(max_grid_points, bool)
            or not isinstance(max_grid_points, (int, np.integer))
            or max_grid_points < 1024
        ):
            raise ValueError(f"max_grid_points={max_grid_points!r}: must be an integer >= 1024")
        self._max_grid_points = int(max_grid_points)
        self._ledger: list[PrivacyEvent] = []

    # ------------------------------------------------------------------------- ledger
    @property
    def eps_error(self) -> float:
        """Target for ``upper - estimate``."""
        return self._eps_error

    @property
    def delta_error(self) -> float:
        """Relative delta slack."""
        return self._delta_error

    @property
    def ledger(self) -> tuple[PrivacyEvent, ...]:
        """Immutable events; consecutive events with equal ``(sigma, q)`` are merged."""
        return tuple(self._ledger)

    @property
    def rounds(self) -> int:
        """Total number of composed rounds."""
        return sum(ev.count for ev in self._ledger)

    def compose(self, noise_multiplier: float, sampling_rate: float, count: int = 1) -> None:
        """Record ``count`` rounds with noise multiplier ``sigma`` and sampling rate ``q``."""
        event = PrivacyEvent(noise_multiplier, sampling_rate, count)
        self._ledger = _appended(self._ledger, event)

    # ------------------------------------------------------------------------- epsilon
    def _profile_for(self, events: Sequence[PrivacyEvent], delta_abs_error: float) -> _Bounds:
        eps_disc = _DISC_SHARE * self._eps_error
        return _bounds(events, eps_disc, delta_abs_error, self._max_grid_points)

    def _bound(self, events: Sequence[PrivacyEvent], delta: float, relation: str) -> EpsilonBound:
        delta = _check_delta(delta)
        relation = _check_relation(relation)
        if not events:
            return EpsilonBound(0.0, 0.0, 0.0, delta, relation)
        if relation == "replacement":
            return self._replacement(events, delta)
        prof = self._profile_for(events, self._delta_error * delta)
        lo, est, up = prof.epsilon_bounds(delta)
        return EpsilonBound(float(lo[0]), float(est[0]), float(up[0]), delta, relation)

    def _replacement(self, events: Sequence[PrivacyEvent], delta_r: float) -> EpsilonBound:
        """Proposition 1 in (eps, delta) form, optimised over the add/remove delta.

        ``upper = 2 eps_up(d)`` for the largest ``d`` found (log grids) with
        ``d (1 + exp(eps_up(d))) <= delta_r``, ``eps_up`` being the certified
        add/remove upper bound (capped by Renyi DP).  The search starts at the fixed
        point of the Renyi-DP bound, which is feasible by construction, so the result
        is always finite.  ``estimate`` does the same with the estimate curve;
        ``lower = 2 lower_ar(delta_r / 2)`` (feasible ``d`` are below ``delta_r / 2``
        and epsilon decreases in delta).
        """
        rel = self._delta_error
        half = delta_r / 2.0
        lower = 2.0 * float(self._profile_for(events, rel * half).epsilon_bounds(half)[0][0])
        groups = _bucket(_groups(events), True)
        # Renyi-DP fixed point d = delta_r / (1 + e^{eps_rdp(d)}): a feasible start
        d_lo = half
        for _ in range(200):
            e = _rdp_epsilon(groups, d_lo) if any(q < 1.0 for _, q, _ in groups) else None
            if e is None:  # Gaussian: the closed form is exact and cheap
                e = _gaussian_epsilon(math.sqrt(sum(n / (s * s) for s, _, n in groups)), d_lo)
            d_new = delta_r / (1.0 + math.exp(min(e, 700.0)))
            if d_new >= d_lo * (1.0 - 1e-12):
                break
            d_lo = d_new
        d_lo = max(min(d_lo, half), 1e-300)
        prof = self._profile_for(events, rel * d_lo)
        while d_lo > 1e-300:  # make sure the start is feasible (upper <= Renyi DP)
            e_lo = float(prof.epsilon_bounds(d_lo)[2][0])
            if d_lo * (1.0 + math.exp(min(e_lo, 700.0))) <= delta_r:
                break
            d_lo *= 0.99

        def best_pair(which: int) -> float:
            grid = np.geomspace(d_lo, half, 96)
            best = math.inf
            for _ in range(2):  # coarse grid, then a fine grid in the last feasible cell
                e = prof.epsilon_bounds(grid)[which]
                ok = grid * (1.0 + np.exp(np.minimum(e, 700.0))) <= delta_r
                if not ok.any():
                    return best
                i = int(np.nonzero(ok)[0][-1])
                best = min(best, float(np.min(e[ok])))
                if i + 1 == len(grid):
                    return best
                grid = np.geomspace(grid[i], grid[i + 1], 32)
            return best

        est_r, up_r = 2.0 * best_pair(1), 2.0 * best_pair(2)
        est_r = min(est_r, up_r)
        return EpsilonBound(min(lower, est_r), est_r, up_r, delta_r, "replacement")

    def epsilon_bound(self, delta: float, relation: str = "add-remove") -> EpsilonBound:
        """Epsilon of the ledger at ``delta`` with its numerical error interval.

        Parameters
        ----------
        delta : float
            In ``(0, 1)``.
        relation : {"add-remove", "replacement"}
            Definition 6 (both orderings of the dominating pair, the maximum is
            reported) or Definition 5 (via Proposition 1, see the module docstring).
        """
        return self._bound(self._ledger, delta, relation)

    def epsilon(self, delta: float, relation: str = "add-remove") -> float:
        """Certified upper bound on epsilon at ``delta``: the number to print."""
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
        """Whether ``count`` more rounds would take the upper epsilon above ``max_epsilon``.

        Does not modify the ledger.
        """
        max_epsilon = _check_real("max_epsilon", max_epsilon)
        if max_epsilon < 0:
            raise ValueError(f"max_epsilon={max_epsilon!r}: must be >= 0")
        events = _appended(self._ledger, PrivacyEvent(noise_multiplier, sampling_rate, count))
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
        """Compose ``count`` rounds if the upper epsilon stays within ``max_epsilon``.

        Returns the new upper epsilon.

        Raises
        ------
        PrivacyBudgetExhausted
            Carrying the epsilon already spent; the ledger is left unchanged.
        """
        max_epsilon = _check_real("max_epsilon", max_epsilon)
        if max_epsilon < 0:
            raise ValueError(f"max_epsilon={max_epsilon!r}: must be >= 0")
        new_events = _appended(self._ledger, PrivacyEvent(noise_multiplier, sampling_rate, count))
        new_eps = self._bound(new_events, delta, relation).upper
        if new_eps > max_epsilon:
            spent = self._bound(self._ledger, delta, relation).upper
            raise PrivacyBudgetExhausted(spent, max_epsilon, delta, new_eps)
        self._ledger = new_events
        return new_eps

    # ------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: format version, precision knobs and the ledger."""
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
        """Replace the ledger by the one in ``state``; nothing changes on error.

        The stored precision knobs are validated but the accountant keeps its own:
        they change how tightly epsilon is reported, not what was spent.

        Raises
        ------
        ValueError
            If ``state`` is not a dict of the format written by :meth:`state_dict`.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state={type(state).__name__}: must be a dict")
        missing = {"version", "ledger"} - set(state)
        if missing:
            raise ValueError(f"state: missing keys {sorted(missing)}")
        unknown = set(state) - {"version", "ledger", "eps_error", "delta_error"}
        if unknown:
            raise ValueError(f"state: unknown keys {sorted(unknown)}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(
                f"state version={state['version']!r}: unsupported (expected {_STATE_VERSION})"
            )
        if "eps_error" in state:
            _check_eps_error(state["eps_error"], "state eps_error")
        if "delta_error" in state:
            _check_real("state delta_error", state["delta_error"])
        ledger = state["ledger"]
        if not isinstance(ledger, list):
            raise ValueError(f"state ledger={type(ledger).__name__}: must be a list")
        events: list[PrivacyEvent] = []
        fields = {"noise_multiplier", "sampling_rate", "count"}
        for i, item in enumerate(ledger):
            if not isinstance(item, dict) or set(item) != fields:
                raise ValueError(
                    f"state ledger[{i}]={item!r}: expected a dict with keys "
                    "noise_multiplier, sampling_rate, count"
                )
            try:
                ev = PrivacyEvent(item["noise_multiplier"], item["sampling_rate"], item["count"])
            except ValueError as err:
                raise ValueError(f"state ledger[{i}]: {err}") from None
            events = _appended(events, ev)
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
    """Smallest noise multiplier (to ``rtol``) whose *upper* epsilon is ``<= target``.

    Bisection on ``log sigma`` over the certified upper bound of
    :func:`epsilon_for`: the returned ``sigma`` always satisfies
    ``epsilon_for(sigma, q, rounds, delta, relation, eps_error).upper <= target_epsilon``
    (it never overshoots), and ``sigma / (1 + rtol)`` does not (up to the
    bisection's bracketing).  With the default ``rtol = 1e-3`` the epsilon reached
    is typically within 0.1% of the target.

    Raises
    ------
    ValueError
        On invalid input, or when no ``sigma <= max_noise_multiplier`` reaches the
        target (for ``q < 1`` the upper bound never drops below about
        ``0.9 eps_error``).
    """
    target = _check_real("target_epsilon", target_epsilon)
    if not (target > 0 and math.isfinite(target)):
        raise ValueError(f"target_epsilon={target_epsilon!r}: must be finite and > 0")
    q = _check_rate(sampling_rate)
    n = _check_count(rounds, "rounds")
    delta = _check_delta(delta)
    relation = _check_relation(relation)
    eps_error = _check_eps_error(eps_error)
    rtol = _check_real("rtol", rtol)
    if not 0.0 < rtol < 1.0:
        raise ValueError(f"rtol={rtol!r}: must be in (0, 1)")
    max_sigma = _check_sigma(max_noise_multiplier, "max_noise_multiplier")

    def eps(sigma: float) -> float:
        return epsilon_for(sigma, q, n, delta, relation, eps_error).upper

    hi = 1.0
    while eps(hi) > target:
        hi *= 2.0
        if hi > max_sigma:
            raise ValueError(
                f"target_epsilon={target!r}: unreachable with noise_multiplier <= "
                f"{max_sigma:g} (sampling_rate={q}, rounds={n}, delta={delta}, "
                f"eps_error={eps_error})"
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


def _prv_add_ordering(q: float, sigma: float) -> Any:
    """prv-accountant ``PrivacyRandomVariable`` of the add ordering, ``log(P/Q)`` under ``P``.

    ``CDF(t) = Pr_P[-log(Q/P)(w) <= t] = Phi(-w(-t) / sigma)`` with ``w`` the inverse of
    the loss (``-inf`` beyond the support end ``-log(1-q)``).
    """
    from prv_accountant.privacy_random_variables import (
        PoissonSubsampledGaussianMechanism,
        PrivacyRandomVariable,
    )

    q = _check_rate(q)
    sigma = _check_sigma(sigma)

    class _AddOrdering(PrivacyRandomVariable):  # type: ignore[misc]
        def __init__(self) -> None:
            self._remove = PoissonSubsampledGaussianMechanism(q, sigma)

        def cdf(self, t: Any) -> Any:
            w = _loss_inv(-np.asarray(t, dtype=float), sigma, q)
            return special.ndtr(-w / sigma)

        def rdp(self, alpha: float) -> float:  # an upper bound (Mironov et al.)
            return float(self._remove.rdp(alpha))

    return _AddOrdering()


def epsilon_prv_accountant(
    ledger_or_accountant: Any, delta: float, eps_error: float = 0.1
) -> EpsilonBound:
    """Add/remove epsilon computed by prv-accountant 0.2.0 itself (slow reference path).

    The remove ordering is prv-accountant's ``PoissonSubsampledGaussianMechanism``
    (``GaussianMechanism`` for ``q = 1``); the add ordering is a
    ``PrivacyRandomVariable`` defined here (CDF of ``log(P/Q)`` under ``P``; its Renyi
    moments, used only to size the domain, are the remove ones, an upper bound by
    Mironov et al.).  Each ordering is composed by ``PRVAccountant`` with
    ``delta_error = delta / 1000`` and the larger ``(lower, estimate, upper)`` is
    returned.  Inputs are validated here (prv-accountant accepts ``q = 1.5`` or
    ``sigma = -1`` silently).  Meant for cross-checks: it takes seconds where
    :meth:`FDPAccountant.epsilon_bound` takes milliseconds.
    """
    import warnings

    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import (
        GaussianMechanism,
        PoissonSubsampledGaussianMechanism,
    )

    delta = _check_delta(delta)
    eps_error = _check_eps_error(eps_error)
    groups = _groups(_as_events(ledger_or_accountant))
    if not groups:
        return EpsilonBound(0.0, 0.0, 0.0, delta, "add-remove")
    counts = [n for _, _, n in groups]
    out = np.zeros(3)
    for ordering in ("remove", "add"):
        prvs = []
        for s, q, _ in groups:
            if q == 1.0:
                prvs.append(GaussianMechanism(s))
            elif ordering == "remove":
                prvs.append(PoissonSubsampledGaussianMechanism(q, s))
            else:
                prvs.append(_prv_add_ordering(q, s))
        if len(prvs) != len(counts):  # prv-accountant raises an empty ValueError
            raise ValueError("internal error: one PRV per ledger group expected")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            acc = PRVAccountant(
                prvs=prvs,
                max_self_compositions=counts,
                eps_error=eps_error,
                delta_error=delta / 1000.0,
            )
            res = acc.compute_epsilon(delta, counts)
        out = np.maximum(out, np.asarray(res, dtype=float))
    lo, est, up = (max(0.0, float(x)) for x in out)
    return EpsilonBound(lo, est, up, delta, "add-remove")


# --------------------------------------------------------------------------------------
# trade-off function and attribute inference (Theorem 4)
# --------------------------------------------------------------------------------------


def _default_alphas() -> np.ndarray:
    return np.unique(
        np.concatenate([[0.0], np.geomspace(1e-6, 1e-2, 200), np.linspace(0.01, 1.0, 400)])
    )


def _check_alphas(alphas: Any) -> np.ndarray:
    try:
        a = np.asarray(alphas, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"alphas={alphas!r}: must be an array of numbers in [0, 1]") from None
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"alphas with shape {a.shape}: must be a non-empty 1-D array")
    if not np.all(np.isfinite(a)) or a.min() < 0.0 or a.max() > 1.0:
        bad = a[~(np.isfinite(a) & (a >= 0.0) & (a <= 1.0))][0]
        raise ValueError(f"alphas: value {bad!r} is not in [0, 1]")
    return a


def tradeoff_curve(
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    *,
    eps_error: float | None = None,
    delta_error: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """Composed add/remove trade-off function, as a certified lower bound.

    Returns ``(alphas, betas)`` with ``betas[i] <= f(alphas[i])`` (type I error
    ``alpha``, type II error ``beta``), where ``f`` is the largest convex function
    below both ``T(P^T, Q^T)`` (Theorem 5) and its inverse ``T(Q^T, P^T)``, the two
    orderings Definition 6 requires.  Computed as
    ``max(0, max_eps [1 - delta_up(eps) - e^eps alpha])`` over a grid of ``eps``
    (Dong, Roth & Su 2022, Prop. 2.12), ``delta_up`` being the certified upper bound
    on the larger of the two hockey-stick curves: every term is a line below ``f``,
    so the result is a convex lower bound on ``f`` and ``1 - beta`` is an upper bound
    on attack success (Theorem 4).  For a ledger of ``q = 1`` rounds the exact
    ``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)`` is returned.

    Parameters
    ----------
    ledger_or_accountant : FDPAccountant or sequence of PrivacyEvent
    alphas : array, optional
        Type I errors in ``[0, 1]``; default: 600 points, log-spaced below 0.01.
    eps_error : float, optional
        Discretisation target (the accountant's when one is given, else 0.05).
    delta_error : float
        Absolute delta slack of the curve: adds about this much to ``1 - beta``.
    """
    events = _as_events(ledger_or_accountant)
    if eps_error is None:
        acc = ledger_or_accountant
        eps_error = acc.eps_error if isinstance(acc, FDPAccountant) else 0.05
    eps_error = _check_eps_error(eps_error)
    delta_error = _check_real("delta_error", delta_error)
    if not _DELTA_ERROR_FLOOR <= delta_error <= 1e-3:
        raise ValueError(f"delta_error={delta_error!r}: must be in [{_DELTA_ERROR_FLOOR}, 1e-3]")
    a = _default_alphas() if alphas is None else _check_alphas(alphas)
    if not events:
        return a, 1.0 - a
    prof = _bounds(events, _DISC_SHARE * eps_error, delta_error, 2**24).upper
    if prof.gaussian_mu is not None:
        with np.errstate(divide="ignore"):
            beta = special.ndtr(special.ndtri(1.0 - a) - prof.gaussian_mu)
        return a, np.clip(beta, 0.0, 1.0 - a)
    if not prof.curves:
        raise ValueError("privacy loss too large to resolve a trade-off curve (too many rounds)")
    t_lo = min(c.t_first for c in prof.curves) + prof.eps_disc
    t_hi = max(c.t_last for c in prof.curves) + prof.eps_disc
    eps = np.linspace(max(t_lo, -30.0), t_hi, 6000)
    dup = prof.delta_upper(eps)
    use = dup < 1.0
    eps, dup = eps[use], dup[use]
    beta = np.zeros(len(a))
    for s in range(0, len(a), 256):
        lines = 1.0 - dup[None, :] - np.exp(eps)[None, :] * a[s : s + 256, None]
        beta[s : s + 256] = np.max(lines, axis=1, initial=0.0)
    return a, np.clip(beta, 0.0, 1.0 - a)


def attribute_inference_bound(ledger_or_accountant: Any, ball: float, **kwargs: Any) -> float:
    """Upper bound on attribute-inference success, ``1 - f(Ball)`` (Theorem 4).

    ``ball`` is ``Ball(X, u, d, rho)`` of Definition 8: the best success rate of a
    guess that does not see the model, in ``[0, 1]``.  ``f`` is the certified lower
    bound of :func:`tradeoff_curve` (convex, as Theorem 4 requires), so the result is
    an upper bound, in ``[ball, 1]``.  ``kwargs`` go to :func:`tradeoff_curve`.
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
    """Write :func:`tradeoff_curve` to ``path`` as CSV with columns ``alpha,beta``."""
    a, b = tradeoff_curve(ledger_or_accountant, alphas, **kwargs)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["alpha", "beta"])
        for x, y in zip(a, b, strict=True):
            writer.writerow([repr(float(x)), repr(float(y))])


def plot_tradeoff(
    path: str | os.PathLike[str],
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    *,
    title: str | None = None,
    **kwargs: Any,
) -> None:
    """Plot :func:`tradeoff_curve` (and the ``beta = 1 - alpha`` line) to a PNG file.

    Uses matplotlib's object API with the Agg canvas: no pyplot, no global backend
    change.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    a, b = tradeoff_curve(ledger_or_accountant, alphas, **kwargs)
    fig = Figure(figsize=(4.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(a, b, label="f (certified lower bound)")
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
    fig.savefig(path, dpi=120, format="png")
