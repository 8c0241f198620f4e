"""Numerical composition of a privacy ledger (Theorem 3) with certified error terms.

Mechanism
---------
A ledger of Poisson-subsampled Gaussian rounds, each dominated by Theorem 5's pair
``P = N(0, s^2)``, ``Q = (1-q) N(0, s^2) + q N(1, s^2)`` (sensitivity: the clip norm),
composes adaptively (Theorem 3) to ``T(P_1 x ... x P_T, Q_1 x ... x Q_T)``.  Both
orderings of the add/remove relation (Definition 6) are composed; the larger
epsilon is reported.  A round with participation ``p < 1`` (Poisson device
sampling, the draw known to the adversary) is the mixture ``p (Q, P) + (1-p) (P, P)``
with the branch revealed: its privacy loss is the subsampled Gaussian's with
probability ``p`` and 0 otherwise (:func:`~fedfdp.accounting.prv.discretise`).

Numerical method: privacy random variables (Gopi, Lee & Wutschitz, NeurIPS 2021)
--------------------------------------------------------------------------------
This follows prv-accountant 0.2.0 (same PRV, mesh rule, error theorem), re-implemented
for speed and extended with the add direction:

1. For each direction and distinct ``(sigma, q, p)`` the PRV is truncated to an interval
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
distinct ``(sigma, q, p)`` are rounded onto a log grid (``sigma`` down, ``q`` and ``p`` up
for the upper bound, the reverse for the lower), which keeps both bounds valid.

Bounded memory and time: see :data:`MEMORY_LIMIT_BYTES`.  Every size is checked
before it is allocated; a ledger that does not fit is composed on a coarser mesh
(larger ``eps_disc``, the same certificate) or bounded by Renyi DP, and
``delta >= 1 - prod (1 - p_i q_i)^{n_i}`` (total variation) gives ``epsilon = 0``.

A ledger of ``q = 1``, ``p = 1`` rounds only is the Gaussian mechanism with
``mu = sqrt(sum_i n_i / sigma_i^2)``, solved in closed form:
``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import fft as _fft

from fedfdp.accounting.curves import ArrayCurve, CurveBase, SpectralCurve
from fedfdp.accounting.protocol import Repeated
from fedfdp.accounting.prv import (
    DiscretisationError,
    Group,
    GroupLike,
    as_group,
    chernoff_lower,
    chernoff_upper,
    discretise,
    gaussian_delta,
    gaussian_epsilon,
    rdp_delta,
    rdp_epsilon,
    support_length,
    tv_bound,
)

# Share of ``eps_error`` given to the discretisation; the rest absorbs the effect of
# ``delta_error`` on the interval.
DISC_SHARE = 0.9
# Smallest absolute delta_error used (keeps the mesh finite for tiny deltas).
DELTA_ERROR_FLOOR = 1e-13
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

#: Memory limit of the accountant's numerical arrays, in bytes (1 GiB).  Every array
#: whose size grows with ``1/sigma``, the number of rounds, ``1/delta``, ``1/eps_error``
#: or the number of ledger groups is sized against it: the composition window and FFT
#: length (3/4 of it, ``_BYTES_PER_POINT`` per point), the discretised supports, the
#: direct DFTs and the cell masses (blocked), the Renyi-moment quadrature (closed
#: form beyond ``prv._MOMENT_GRID_MAX`` points) and the cache of composed profiles
#: (1/8 of it).
#: A ledger that does not fit at the requested precision is composed on a coarser mesh
#: (a wider but still certified interval) or, failing that, bounded by Renyi DP.
MEMORY_LIMIT_BYTES = 2**30
# Peak bytes per point of the FFT length in the full-FFT path (both orderings, the
# first one's curve kept while the second is composed); measured about 70 with
# tracemalloc, rounded up.
_BYTES_PER_POINT = 96
# Largest FFT length / composition window / summed support (points).
_MAX_POINTS = (3 * MEMORY_LIMIT_BYTES // 4) // _BYTES_PER_POINT
# Largest (number of spectra x FFT length) of one composition, a bound on its time
# (about 2-4 s on two cores).
_FFT_WORK_LIMIT = 2**27
# Elements per block of a direct DFT's matrices (memory of ``_dft``).
_DFT_BLOCK_ELEMENTS = 2**20
# At most this many coarsening retries before the Renyi-DP bound is used.
_MAX_COARSEN = 4
# Largest window whatever max_grid_points says: keeps the exact integer angle
# reductions (index x frequency < n^2 / 2) inside int64.
_MAX_SPAN = 2**30


class _TooLarge(Exception):
    """The composition needs ``factor`` times more points than the limits allow."""

    def __init__(self, factor: float) -> None:
        super().__init__(factor)
        self.factor = float(factor)


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
    accuracy is ~1e-18 (a float64 FFT: ~2e-16).  Frequencies are processed in blocks
    so that the matrices stay below ``_DFT_BLOCK_ELEMENTS`` elements each (column by
    column the result does not depend on the blocking).
    """
    s = len(pmf)
    b = math.ceil(math.sqrt(s))
    a = -(-s // b)
    block = max(1, _DFT_BLOCK_ELEMENTS // (a + b))
    if len(freqs) > block:
        return np.concatenate(
            [_dft(pmf, k_first, freqs[i : i + block], n, dtype) for i in range(0, len(freqs), block)]
        )
    flat: np.ndarray = np.zeros(a * b, dtype=dtype)
    flat[:s] = pmf
    p = flat.reshape(a, b)
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
    n_total = sum(g.rounds for g in groups)
    h = eps_disc / math.sqrt(n_total / 2.0 * math.log(12.0 / delta_error))
    return _Grid(
        h=h,
        eta=delta_error / (8.0 * n_total),
        upper=chernoff_upper(groups, delta_error / 4.0),
        lower=chernoff_lower(groups, delta_error / 16.0),
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
    if count > n_fft // 16 or work > _DFT_WORK_LIMIT or count > _MAX_POINTS // 16:
        return None
    if count == 0:
        return np.zeros(1, dtype=np.int64)
    return np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(lo, hi, strict=True)]))


def _compose_direction(
    groups: Sequence[Group],
    direction: str,
    grid: _Grid,
    noise_budget: float,
    max_points: int = _MAX_POINTS,
) -> tuple[CurveBase, float]:
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

    Raises :class:`_TooLarge` before allocating arrays of the FFT length when that
    length exceeds ``max_points`` or its work exceeds ``_FFT_WORK_LIMIT``.
    """
    h = grid.h
    parts: list[Part] = [
        (discretise(g.sigma, g.q, direction, h, grid.eta, g.p), g.rounds) for g in groups
    ]
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

    n_parts = len(parts)

    def check_full() -> None:  # before any array of length n_fft is allocated
        factor = max(n_fft / max_points, n_parts * n_fft / _FFT_WORK_LIMIT)
        if factor > 1.0:
            raise _TooLarge(factor)

    candidates = _candidate_frequencies(parts, n_fft, h)
    full = candidates is None
    if candidates is None:
        check_full()
        freqs = np.arange(n_fft // 2 + 1)
    else:
        freqs = candidates
    # log G = sum_i n_i log F_i, accumulated without keeping the spectra
    log_mod = np.zeros(len(freqs))
    phase = np.zeros(len(freqs))
    for (k_first, pmf, _), n in parts:
        if len(freqs) == n_fft // 2 + 1:  # full-length FFT
            arr = np.zeros(n_fft)
            arr[np.arange(k_first, k_first + len(pmf)) % n_fft] = pmf
            spec = _fft.rfft(arr)
            del arr
        else:
            spec = _dft(pmf, k_first, freqs, n_fft)
        tmp = np.abs(spec)
        with np.errstate(divide="ignore"):
            np.log(tmp, out=tmp)
        tmp *= n
        log_mod += tmp
        tmp = np.angle(spec)
        del spec
        tmp *= n
        phase += tmp
        del tmp
    keep = log_mod > _LOG_F_CUT
    if not keep.any():
        keep[0] = True
    if not full and int(np.count_nonzero(keep)) > _SPECTRAL_MAX:
        check_full()  # the masses will need an inverse FFT of length n_fft
    freqs = freqs[keep]
    mod_g = np.exp(log_mod[keep])
    sum_g = float(mod_g.sum())
    eps64 = float(np.finfo(np.float64).eps)
    per_coef = 4.0 * n_total * eps64  # L1 round-off per unit of |G_k| (float64 spectrum)
    g = np.exp(log_mod[keep] + 1j * phase[keep])
    del log_mod, phase, keep
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
        curve = SpectralCurve(t0, h, width, n_fft, k_lo, freqs, g)
        return curve, noise + 8.0 * eps64 * curve.term_scale
    del parts, mod_g
    comp = np.zeros(n_fft // 2 + 1, dtype=complex)
    comp[freqs] = g
    del g, freqs
    full_pmf = _fft.irfft(comp, n_fft)
    del comp
    # np.roll(full_pmf, -k_lo)[:width] without a second array of length n_fft
    start = k_lo % n_fft
    out = full_pmf[start : start + width]
    out = np.concatenate([out, full_pmf[: width - len(out)]]) if len(out) < width else out.copy()
    del full_pmf
    return ArrayCurve(t0, h, out), noise + eps64 * sum_g * math.log2(n_fft)


@dataclass(frozen=True)
class _Profile:
    """Both orderings of a composed ledger and the error terms that bound them.

    ``delta_slack`` is the additive delta error: ``delta_error``, or more when the
    round-off bound exceeds its share.  With no curves (ledger far too lossy for the
    mesh or for the memory limit) only the Renyi-DP bound is available;
    ``gaussian_mu`` marks the closed form.  ``eps_disc`` is the discretisation error
    actually used (larger than requested when the mesh had to be coarsened).
    Every upper bound is also capped by the total-variation bound
    (:func:`~fedfdp.accounting.prv.tv_bound`): ``epsilon = 0`` once ``delta`` exceeds it.
    """

    groups: tuple[Group, ...]
    curves: tuple[CurveBase, ...] = ()
    eps_disc: float = 0.0
    delta_slack: float = 0.0
    gaussian_mu: float | None = None

    @functools.cached_property
    def tv(self) -> float:
        return tv_bound(self.groups)

    @property
    def nbytes(self) -> int:
        """Memory held by the curves' arrays."""
        return sum(
            int(getattr(c, "d1", np.empty(0)).nbytes + getattr(c, "d2", np.empty(0)).nbytes)
            for c in self.curves
        )

    def epsilon_bounds(self, deltas: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lower, estimate, upper)`` add/remove epsilon at each of ``deltas``.

        ``upper`` is also capped by the Renyi-DP bound (valid for both orderings),
        which only matters when round-off swamps a tiny delta.
        """
        d = np.atleast_1d(np.asarray(deltas, dtype=float))
        if self.gaussian_mu is not None:  # closed form; +-1e-9 (1 + eps) covers round-off
            e = np.array([gaussian_epsilon(self.gaussian_mu, float(x)) for x in d])
            with np.errstate(invalid="ignore"):
                pad = 1e-9 * (1.0 + e)
                lo = np.where(np.isfinite(e), np.maximum(e - pad, 0.0), e)
            return lo, e, np.where(e > 0.0, e + pad, 0.0)
        rdp = np.array([rdp_epsilon(self.groups, float(x)) for x in d])
        free = d >= self.tv  # no round touches the record with probability >= 1 - delta
        if not self.curves:
            up = np.where(free, 0.0, rdp)
            return np.zeros(len(d)), up.copy(), up
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
        if free.any():
            up = np.where(free, 0.0, up)
        est = np.minimum(est, up)
        return np.minimum(lo, est), est, up

    def delta_upper(self, eps: np.ndarray) -> np.ndarray:
        """Certified upper bound on the larger of the two ``delta(eps)`` curves."""
        eps = np.asarray(eps, dtype=float)
        if self.gaussian_mu is not None:
            return gaussian_delta(self.gaussian_mu, eps)
        if not self.curves:
            out = rdp_delta(self.groups, eps)
        else:
            out = np.zeros(eps.shape)
            for c in self.curves:
                out = np.maximum(out, c.delta(eps - self.eps_disc) + self.delta_slack)
        out = np.where(eps >= 0.0, np.minimum(out, self.tv), out)
        return np.minimum(out, 1.0)


def ledger_groups(events: Iterable[Repeated]) -> tuple[Group, ...]:
    """Aggregate counts per distinct ``(sigma, q, participation)`` (composition is
    commutative).
    """
    acc: dict[tuple[float, float, float], int] = {}
    for ev in events:
        key = (ev.noise_multiplier, ev.sampling_rate, ev.participation)
        acc[key] = acc.get(key, 0) + ev.count
    return tuple(Group(s, q, n, p) for (s, q, p), n in sorted(acc.items()))


def _merge_gaussians(groups: Sequence[Group]) -> tuple[Group, ...]:
    """Replace all ``q = 1``, ``p = 1`` groups by one Gaussian round with
    ``1/s^2 = sum n_i/s_i^2`` (a group with participation ``p < 1`` is a mixture, not a
    Gaussian mechanism, and stays as it is).
    """
    gauss = [g for g in groups if g.q == 1.0 and g.p == 1.0]
    out = [g for g in groups if not (g.q == 1.0 and g.p == 1.0)]
    inv = sum(group_precision(g) for g in gauss)
    if inv > 0.0:
        out.append(Group(1.0 / math.sqrt(inv), 1.0, 1))
    return tuple(out)


def group_precision(g: Group) -> float:
    """``rounds / sigma^2`` of a Gaussian group (``inf`` when ``sigma^2`` underflows)."""
    s2 = g.sigma * g.sigma
    return g.rounds / s2 if s2 > 0.0 else math.inf


class _ProfileCache:
    """LRU cache of composed profiles, bounded in entries and in bytes held.

    A profile holding more than the byte budget is returned but not kept.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._data: OrderedDict[Any, _Profile] = OrderedDict()

    def get(self, key: Any) -> _Profile | None:
        prof = self._data.get(key)
        if prof is not None:
            self._data.move_to_end(key)
        return prof

    def put(self, key: Any, prof: _Profile) -> None:
        if prof.nbytes > self.max_bytes:
            return
        self._data[key] = prof
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries or (
            sum(p.nbytes for p in self._data.values()) > self.max_bytes
        ):
            self._data.popitem(last=False)

    def clear(self) -> None:
        self._data.clear()


_PROFILE_CACHE = _ProfileCache(6, MEMORY_LIMIT_BYTES // 8)


class _CachedProfile:
    """``_profile(groups, eps_disc, delta_error, max_grid_points)``: compose a ledger
    (aggregated by ``ledger_groups``) into both hockey-stick curves.

    ``groups`` holds :class:`~fedfdp.accounting.prv.Group` or plain ``(sigma, q, rounds)``
    tuples (participation 1).  Results are cached (:class:`_ProfileCache`);
    ``cache_clear()`` empties the cache, like a ``functools`` cache.
    """

    def __call__(
        self, groups: Sequence[GroupLike], eps_disc: float, delta_error: float, max_grid_points: int
    ) -> _Profile:
        key = (tuple(as_group(g) for g in groups), eps_disc, delta_error, max_grid_points)
        prof = _PROFILE_CACHE.get(key)
        if prof is None:
            prof = _compose_profile(*key)
            _PROFILE_CACHE.put(key, prof)
        return prof

    def cache_clear(self) -> None:
        _PROFILE_CACHE.clear()


_profile = _CachedProfile()


def _compose_profile(
    groups: tuple[Group, ...], eps_disc: float, delta_error: float, max_grid_points: int
) -> _Profile:
    """:func:`_profile` without the cache.

    The mesh follows from ``eps_disc``; when the window, the summed supports or the
    FFT would exceed ``min(max_grid_points, _MAX_POINTS)`` points (or the FFT work
    ``_FFT_WORK_LIMIT``), ``eps_disc`` is scaled up by the excess and the ledger is
    composed again on the coarser mesh (the same certificate with a larger
    discretisation error), at most ``_MAX_COARSEN`` times; after that, or when the
    composed loss exceeds 700 (beyond the float range of ``e^eps``), only the
    Renyi-DP bound is reported.
    """
    if all(g.q == 1.0 and g.p == 1.0 for g in groups):
        return _Profile(groups, gaussian_mu=math.sqrt(sum(group_precision(g) for g in groups)))
    merged = _merge_gaussians(groups)
    limit = min(max_grid_points, _MAX_POINTS)
    span_limit = min(max_grid_points, _MAX_SPAN)
    for _ in range(_MAX_COARSEN + 1):
        grid = _make_grid(merged, eps_disc, delta_error)
        if not grid.upper <= 700.0:
            # privacy loss far too large to resolve: report the Renyi-DP bound, valid
            # (if looser) for both orderings
            return _Profile(groups)
        # the window bounds the integer arithmetic of the spectral curves; the
        # supports and (in _compose_direction) the FFT length bound the memory
        span = (grid.upper + grid.lower + 2.0 * grid.margin) / grid.h
        supports = [
            support_length(g.sigma, g.q, d, grid.h, grid.eta) for g in merged for d in ("remove", "add")
        ]
        factor = max(span / span_limit, max(supports) / limit, sum(supports) / (2 * limit))
        if factor <= 1.0:
            try:
                budget = 0.25 * (1.0 - _ANALYTIC_SHARE) * delta_error
                remove, noise_r = _compose_direction(merged, "remove", grid, budget, limit)
                add, noise_a = _compose_direction(merged, "add", grid, budget, limit)
            except _TooLarge as exc:
                factor = exc.factor
            except DiscretisationError:
                return _Profile(groups)
            else:
                slack = max(delta_error, _ANALYTIC_SHARE * delta_error + max(noise_r, noise_a))
                return _Profile(groups, (remove, add), eps_disc, slack)
        if not math.isfinite(factor):
            break
        eps_disc *= 1.05 * factor
    return _Profile(groups)


# Ledgers with more distinct (sigma, q, participation) than this are bucketed (see ``bucket_groups``).
_MAX_GROUPS = 128


def bucket_groups(groups: tuple[Group, ...], conservative: bool) -> tuple[Group, ...]:
    """Round ``(sigma, q, p)`` onto a log grid so that at most ``_MAX_GROUPS`` remain.

    ``conservative``: ``sigma`` down, ``q`` and the participation ``p`` up, a pair
    that dominates each round (less noise, more sampling, and a larger chance of
    touching the record are post-processing-worse: the ``p`` pair is obtained from the
    ``p' > p`` pair by replacing a touching round's output, with probability
    ``1 - p/p'``, by a fresh draw of ``P`` labelled "not touched"), so the
    composition is an upper bound; otherwise the opposite rounding, a lower bound.
    The finest relative step among 1e-4 ... 0.3 that gives few enough groups is
    used; the interval widens accordingly.
    """
    if len(groups) <= _MAX_GROUPS:
        return groups
    out: dict[tuple[float, float, float], int] = {}
    for r in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3):
        out = {}
        for g in groups:
            s, q, n, p = as_group(g)
            ls, lq, lp = math.log(s) / r, math.log(q) / r, math.log(p) / r
            if conservative:
                s2 = math.exp(r * math.floor(ls)) * (1.0 - 1e-15)
                q2 = min(1.0, math.exp(r * math.ceil(lq)) * (1.0 + 1e-15))
                p2 = min(1.0, math.exp(r * math.ceil(lp)) * (1.0 + 1e-15))
            else:
                s2 = math.exp(r * math.ceil(ls)) * (1.0 + 1e-15)
                q2 = min(1.0, math.exp(r * math.floor(lq)) * (1.0 - 1e-15))
                p2 = min(1.0, math.exp(r * math.floor(lp)) * (1.0 - 1e-15))
            out[(s2, q2, p2)] = out.get((s2, q2, p2), 0) + n
        if len(out) <= _MAX_GROUPS:
            break
    return tuple(Group(s, q, n, p) for (s, q, p), n in sorted(out.items()))


@dataclass(frozen=True)
class Bounds:
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


def compose_bounds(
    events: Sequence[Repeated], eps_disc: float, delta_error: float, max_grid_points: int
) -> Bounds:
    groups = ledger_groups(events)
    delta_error = max(delta_error, DELTA_ERROR_FLOOR)
    up = _profile(bucket_groups(groups, True), eps_disc, delta_error, max_grid_points)
    if len(groups) <= _MAX_GROUPS:
        return Bounds(up, up)
    lo = _profile(bucket_groups(groups, False), eps_disc, delta_error, max_grid_points)
    return Bounds(up, lo)
