"""Hockey-stick curves ``delta~(eps)`` of a discrete composed privacy random variable.

Mechanism
---------
The composed privacy loss of a ledger of Poisson-subsampled Gaussian rounds
(Theorems 5 and 3), discretised on the mesh ``t_i = t0 + i h`` by
:mod:`fedfdp.accounting.composition`, for one ordering of the add/remove pair
(Definition 6).

Method
------
``delta~(eps) = sum_{t_j > eps} c_j (1 - e^{eps - t_j})`` is evaluated, and inverted
to ``eps~(delta)``, from tail sums: either of the composed masses themselves
(:class:`ArrayCurve`, after an inverse FFT) or directly from the few Fourier
coefficients that matter (:class:`SpectralCurve`, geometric sums without an
inverse FFT).  Both are exact for the discrete distribution; the discretisation
and truncation errors are added by the caller.
"""

from __future__ import annotations

import numpy as np


class CurveBase:
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


class ArrayCurve(CurveBase):
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


class SpectralCurve(CurveBase):
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
