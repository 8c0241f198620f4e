"""Exact discrete Gaussian noise for the distributed mechanism of secure aggregation.

Mechanism
---------
Each SecAgg party adds ``N_Z(0, σ²)`` per coordinate to its scaled, randomly
rounded, clipped private sum, where the discrete Gaussian ``N_Z(μ, σ²)`` puts mass
``exp(-(x - μ)²/(2σ²)) / Σ_{y∈Z} exp(-(y - μ)²/(2σ²))`` on each integer ``x``
(Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy",
NeurIPS 2020; CKS below). The privacy of the *sum* of the honest parties' noises is
accounted in :mod:`fedfdp.accounting.distributed` (sensitivity ``s + √d`` in integer
units under add/remove of one record; proof in ``docs/secagg_accounting.md``); this
module only draws the noise, exactly.

The algorithm (CKS Algorithms 1-3)
----------------------------------
* ``Bernoulli(exp(-γ))`` for rational ``γ ∈ [0, 1]`` (CKS Alg. 1, von Neumann):
  draw ``A_K ~ Bernoulli(γ/K)`` for ``K = 1, 2, ...`` until the first failure;
  return 1 iff that ``K`` is odd. For ``γ > 1``: ``⌊γ⌋`` draws of
  ``Bernoulli(exp(-1))`` and one of ``Bernoulli(exp(-(γ - ⌊γ⌋)))``, all must succeed.
* the discrete Laplace ``P(x) ∝ exp(-|x|/t)`` for an integer ``t >= 1`` (CKS
  Alg. 2): ``U`` uniform on ``{0..t-1}``, kept with probability ``exp(-U/t)``;
  ``V`` = number of successes of ``Bernoulli(exp(-1))`` before the first failure;
  ``X = U + tV``; a fair sign ``B``; restart if ``B = 1`` and ``X = 0``.
* the discrete Gaussian (CKS Alg. 3): ``t = ⌊σ⌋ + 1``; a discrete Laplace ``Y`` of
  scale ``t``, accepted with probability ``exp(-(|Y| - σ²/t)² / (2σ²))``.
  (``exp(-|y|/t) · exp(-(|y| - σ²/t)²/(2σ²)) = exp(-y²/(2σ²) - σ²/(2t²))``, so
  the accepted ``Y`` is exactly ``N_Z(0, σ²)`` for any ``t > 0``.)

Why the vectorised version is exact
-----------------------------------
Every random decision above is ``Bernoulli(x)`` for a number ``x`` that is known
exactly as a ratio of integers ``num/den`` (``f/K`` with ``f = γ - ⌊γ⌋``, ``U/(tK)``,
``1/K``; for the acceptance step ``γ = (|Y|·b·t - a)² / (2·a·b·t²)`` with
``σ² = a/b``). A draw is decided by one uniform ``U ∈ [0, 1)`` whose first 32 bits
``W`` come from the bit stream: ``Bernoulli(x) = [U < x]``. For ``x = 1/K`` the
comparison is in integers (``W`` against ``⌊2³²/K⌋``). Otherwise batches of draws are
compared in float64 against ``x̂``, a float approximation of ``x`` with a *rigorous*
error bound ``e`` (IEEE-754 ``+ − × ÷`` are correctly rounded, so the bound follows
from a forward error analysis: ``2⁻⁴⁶(γ̂ + |Δ̂|/t + 1)`` for ``γ``, see
:func:`_acceptance_exponent`, and a few units of roundoff for the ratios). When
``[W/2³², (W+1)/2³²)`` lies entirely below ``x̂ - e`` (or entirely above ``x̂ + e``)
the outcome is certain; otherwise (probability about ``2⁻³¹`` per draw) the same
``U`` is compared with ``num/den`` in exact integer arithmetic, extending ``U`` by
fresh 64-bit words until the comparison is decided (:func:`_uniform_below`). When
``⌊γ⌋`` itself is uncertain, that element's whole ``Bernoulli(exp(-γ))`` is drawn by
the scalar exact algorithm on Python integers (:class:`fractions.Fraction`). The
uniform ``U`` of the discrete Laplace is drawn by rejection from 64-bit words, the
sign from single bits. So every output has exactly the CKS distribution; floats only
decide which path a draw takes.

Representing ``σ²``
-------------------
``σ²`` is a rational number (:func:`as_variance`): an ``int``, a
:class:`fractions.Fraction`, or a float, which is converted **exactly**
(``Fraction(x)``: every finite double is a dyadic rational ``m·2^e``), so
``variance=0.25`` is exactly ``1/4`` and ``variance=σ_loc**2`` is the double
nearest to ``σ_loc²``, sampled exactly. ``σ²`` must lie in ``[2⁻³⁰, 2⁸⁰]``.

Randomness
----------
The bits come from a :class:`~fedfdp.entropy.BitStream`: by default the party's OS
CSPRNG (:class:`~fedfdp.entropy.OSBits`, ``os.urandom``), never a configured seed;
tests may pass a :class:`~fedfdp.entropy.SeededBits` stream.

Cost (measured on the shared 2-core development machine): 65-80 ms for ``d = 10⁵``
draws at ``σ`` from 4 to ``3.5·10⁵``, about half of it reading ``os.urandom``
(``docs/secagg_accounting.md`` §7.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from fedfdp.entropy import BitStream, OSBits
from fedfdp.validate import count

__all__ = [
    "MAX_VARIANCE",
    "MIN_VARIANCE",
    "as_variance",
    "discrete_gaussian_variance",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_reference",
    "sample_discrete_laplace",
]

#: Smallest and largest ``σ²`` the sampler accepts.
MIN_VARIANCE = Fraction(1, 2**30)
MAX_VARIANCE = Fraction(2**80)

_TWO64 = 1 << 64
_UNIT = 2.0**-53  # unit roundoff of float64
# forming u ± slack and x̂ ∓ e in float64 rounds twice (≤ 2⁻⁵³ each): 2⁻⁵⁰ covers it
_ROUND_SLACK = 2.0**-50
_GAMMA_ERR = 2.0**-46  # relative margin on the acceptance exponent (≈ 20x the analysis)
_EXACT_INT = 2.0**52  # |Y| below this is exact in float64 with room to spare
_BLOCK = 1 << 16  # draws per block (keeps the working arrays in cache)

ExactRatio = Callable[[int], tuple[int, int]]


def as_variance(value: Any) -> Fraction:
    """``σ²`` as an exact :class:`~fractions.Fraction` (a float converts exactly).

    Raises
    ------
    ValueError
        If ``value`` is not a finite real in ``[MIN_VARIANCE, MAX_VARIANCE]``.
    """
    if isinstance(value, bool):
        raise ValueError(f"variance={value!r}: must be a real number")
    if isinstance(value, Fraction):
        v = value
    elif isinstance(value, int | np.integer):
        v = Fraction(int(value))
    elif isinstance(value, float | np.floating):
        if not math.isfinite(float(value)):
            raise ValueError(f"variance={value!r}: must be finite")
        v = Fraction(float(value))
    else:
        raise ValueError(f"variance={value!r}: must be an int, a float or a Fraction")
    if not MIN_VARIANCE <= v <= MAX_VARIANCE:
        raise ValueError(f"variance={value!r}: must be in [2^-30, 2^80]")
    return v


class _Words:
    """Random words from a bit stream: 64-bit, 32-bit halves, single bits."""

    def __init__(self, stream: BitStream) -> None:
        self._stream = stream

    def take(self, n: int) -> np.ndarray:
        return self._stream.words(n) if n > 0 else np.empty(0, dtype=np.uint64)

    def take32(self, n: int) -> np.ndarray:
        return self.take((n + 1) // 2).view(np.uint32)[:n]

    def bits(self, n: int) -> np.ndarray:
        raw = self.take((n + 63) // 64).view(np.uint8)
        return np.unpackbits(raw)[:n].astype(bool)

    def one(self) -> int:
        return int(self._stream.words(1)[0])


def _uniform_below(prefix: int, bits: int, num: int, den: int, words: _Words) -> bool:
    """Whether ``U < num/den`` for ``U`` uniform on ``[prefix/2^bits, (prefix+1)/2^bits)``.

    Exact: integers only; ``U`` is refined by fresh 64-bit words until decided
    (each refinement decides with probability ``1 - 2⁻⁶⁴`` or better).
    """
    while True:
        target = num << bits
        if (prefix + 1) * den <= target:
            return True
        if prefix * den >= target:
            return False
        prefix = (prefix << 64) | words.one()
        bits += 64


def _bernoulli(words: _Words, x: np.ndarray, err: np.ndarray, exact: ExactRatio) -> np.ndarray:
    """Exact ``Bernoulli(x_i)`` draws, where ``|x̂_i - x_i| <= err_i`` and
    ``exact(i)`` returns ``x_i`` as ``(num, den)``.

    Each draw reads 32 random bits ``W``: ``U ∈ [W/2³², (W+1)/2³²)``; ``u = W·2⁻³²``
    is exact in float64, and ``2⁻⁵⁰`` covers the roundings of ``u ± slack`` and
    ``x̂ ∓ err``. Undecided draws (probability about ``2⁻³¹``) are refined exactly.
    """
    w = words.take32(x.size)
    u = w.astype(np.float64) * 2.0**-32
    yes = u + (2.0**-32 + _ROUND_SLACK) < x - err
    no = u - _ROUND_SLACK >= x + err
    out = yes.copy()
    for i in np.flatnonzero(~(yes | no)):
        num, den = exact(int(i))
        out[i] = _uniform_below(int(w[i]), 32, num, den, words)
    return out


def _bernoulli_exp_fraction(words: _Words, f: np.ndarray, err: np.ndarray, exact: ExactRatio) -> np.ndarray:
    """Exact ``Bernoulli(exp(-f_i))`` for ``f_i ∈ [0, 1]`` (CKS Algorithm 1, von Neumann).

    ``|f̂_i - f_i| <= err_i``; ``exact(i)`` is ``f_i`` as ``(num, den)``.
    """
    # K = 1: A_1 ~ Bernoulli(f)
    a = _bernoulli(words, f, err + 2.0 * _UNIT * f, exact)
    odd = ~a  # stopped at K = 1
    idx = np.flatnonzero(a)
    k = 2
    while idx.size:
        x = f[idx] / k
        e = err[idx] / k + 2.0 * _UNIT * x

        def exact_k(j: int, idx: np.ndarray = idx, k: int = k) -> tuple[int, int]:
            num, den = exact(int(idx[j]))
            return num, den * k

        a = _bernoulli(words, x, e, exact_k)
        if k % 2:
            odd[idx[~a]] = True
        idx = idx[a]
        k += 1
    return odd


def _bernoulli_exp_minus_one(words: _Words, n: int) -> np.ndarray:
    """``n`` exact ``Bernoulli(exp(-1))`` draws (CKS Algorithm 1 with ``γ = 1``).

    ``A_1 ~ Bernoulli(1)`` always succeeds, so the loop starts at ``K = 2``; each
    ``A_K = [U < 1/K]`` is decided in integers from 32 random bits ``W``: with
    ``m = ⌊2³²/K⌋``, ``W < m`` means ``U < 1/K`` and ``W > m`` means ``U > 1/K``;
    ``W = m`` is refined exactly.
    """
    odd = np.zeros(n, dtype=bool)
    idx: np.ndarray | None = None  # None: every draw is still running
    k = 2
    while idx is None or idx.size:
        size = n if idx is None else idx.size
        w = words.take32(size)
        m = (1 << 32) // k
        a = w < np.uint32(m)
        for i in np.flatnonzero(w == np.uint32(m)):
            a[i] = _uniform_below(int(w[i]), 32, 1, k, words)
        if k % 2:
            stopped = np.flatnonzero(~a) if idx is None else idx[~a]
            odd[stopped] = True
        idx = np.flatnonzero(a) if idx is None else idx[a]
        k += 1
    return odd


def _scalar_bernoulli_exp(gamma: Fraction, words: _Words) -> bool:
    """One exact ``Bernoulli(exp(-γ))`` for a rational ``γ >= 0`` (CKS Algorithm 1)."""

    def frac_draw(f: Fraction) -> bool:
        k = 1
        while _uniform_below(words.one(), 64, f.numerator, f.denominator * k, words):
            k += 1
        return k % 2 == 1

    whole = math.floor(gamma)
    for _ in range(whole):
        if not frac_draw(Fraction(1)):
            return False
    return frac_draw(gamma - whole)


def _uniform_ints(words: _Words, t: int, n: int) -> np.ndarray:
    """``n`` exact uniform draws from ``{0, ..., t-1}`` (rejection of the top partial block)."""
    w = words.take(n)
    limit = _TWO64 - _TWO64 % t  # multiples of t below 2⁶⁴
    if limit < _TWO64:
        bad = np.flatnonzero(w >= np.uint64(limit))
        while bad.size:  # probability t/2⁶⁴ per draw
            w[bad] = words.take(bad.size)
            bad = bad[w[bad] >= np.uint64(limit)]
    return (w % np.uint64(t)).astype(np.int64)


def _laplace(words: _Words, t: int, n: int) -> np.ndarray:
    """``n`` draws of the discrete Laplace ``P(x) ∝ exp(-|x|/t)`` (CKS Algorithm 2).

    Candidates are drawn in batches somewhat larger than needed (a draw is kept with
    probability about 0.6); the first ``n`` kept ones are returned: kept candidates are
    i.i.d. from the target, and which ones are returned depends only on positions.
    """
    parts: list[np.ndarray] = []
    need = n
    while need > 0:
        m = int(need / 0.55) + 16
        u = _uniform_ints(words, t, m)
        f = u.astype(np.float64) / t  # u, t < 2⁵³: one rounding

        def exact(i: int, u: np.ndarray = u) -> tuple[int, int]:
            return int(u[i]), t

        keep = _bernoulli_exp_fraction(words, f, 2.0 * _UNIT * f, exact)
        u = u[keep]
        v = np.zeros(u.size, dtype=np.int64)
        alive = np.arange(u.size)
        while alive.size:
            a = _bernoulli_exp_minus_one(words, alive.size)
            v[alive[a]] += 1
            alive = alive[a]
        if v.size and int(v.max()) > (2**62) // t:  # probability < exp(-2^20): never
            raise RuntimeError("discrete Laplace draw out of int64 range")
        x = u + t * v
        negative = words.bits(u.size)
        ok = ~(negative & (x == 0))
        got = np.where(negative[ok], -x[ok], x[ok])[:need]
        parts.append(got)
        need -= got.size
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _acceptance_exponent(y: np.ndarray, s2: float, t: int) -> tuple[np.ndarray, np.ndarray]:
    """``γ̂ = (|y| - σ²/t)² / (2σ²)`` in float64 and a rigorous bound on ``|γ̂ - γ|``.

    Forward error analysis (``u = 2⁻⁵³``, ``ŝ2 = σ²(1 + e₁)``, ``|e₁| <= u``; ``|y|`` and
    ``t`` exact): ``ĉ = fl(ŝ2/t)`` is within ``2.01u·c`` of ``c = σ²/t``; ``Δ̂ = fl(|y| - ĉ)``
    within ``2.01u·c + u|Δ|`` of ``Δ = |y| - c``; squaring and dividing by ``2ŝ2`` add
    ``3u`` relative. With ``c/σ² = 1/t`` and ``Δ²/σ² = 2γ`` this gives
    ``|γ̂ - γ| <= 5.1u·γ + 2.01u·|Δ|/t + O(u²)``. The bound returned,
    ``2⁻⁴⁶ (γ̂ + |Δ̂|/t + 1)``, is over 20 times that.
    """
    c = s2 / t
    diff = np.abs(y) - c
    gamma = diff * diff / (2.0 * s2)
    err = _GAMMA_ERR * (gamma + np.abs(diff) / t + 1.0)
    return gamma, err


def _bernoulli_exp(
    words: _Words, gamma: np.ndarray, err: np.ndarray, exact: Callable[[int], Fraction], unsafe: np.ndarray
) -> np.ndarray:
    """Exact ``Bernoulli(exp(-γ_i))``; ``|γ̂_i - γ_i| <= err_i``, ``exact(i)`` is ``γ_i``.

    Elements whose ``⌊γ⌋`` is not certain from the float (or flagged ``unsafe``) are
    drawn by the scalar exact algorithm.
    """
    out = np.zeros(gamma.size, dtype=bool)
    whole_lo = np.floor(np.maximum(gamma - err, 0.0))
    whole_hi = np.floor(gamma + err)
    slow = unsafe | (whole_lo != whole_hi) | ~np.isfinite(gamma)
    for i in np.flatnonzero(slow):
        out[i] = _scalar_bernoulli_exp(exact(int(i)), words)
    fast = np.flatnonzero(~slow)
    if not fast.size:
        return out
    whole = whole_lo[fast]
    frac = gamma[fast] - whole  # exact (Sterbenz) for whole >= 1; identity for whole = 0
    frac = np.clip(frac, 0.0, 1.0)

    def exact_frac(j: int) -> tuple[int, int]:
        g = exact(int(fast[j]))
        rest = g - math.floor(g)
        return rest.numerator, rest.denominator

    ok = _bernoulli_exp_fraction(words, frac, err[fast], exact_frac)
    need = whole.astype(np.int64)
    alive = np.flatnonzero(ok & (need > 0))
    step = 0
    while alive.size:
        a = _bernoulli_exp_minus_one(words, alive.size)
        ok[alive[~a]] = False
        alive = alive[a]
        step += 1
        alive = alive[need[alive] > step]
    out[fast] = ok
    return out


def sample_discrete_laplace(scale: int, size: int, stream: BitStream | None = None) -> np.ndarray:
    """``size`` exact draws of the discrete Laplace ``P(x) ∝ exp(-|x|/scale)`` on ``Z``
    (CKS Algorithm 2), as ``int64``.

    Parameters
    ----------
    scale : int
        ``t >= 1``, at most ``2⁵⁰``.
    size : int
        Number of draws, ``>= 0``.
    stream : BitStream, optional
        Source of random bits; default the OS CSPRNG.
    """
    if isinstance(scale, bool) or not isinstance(scale, int | np.integer) or not 1 <= scale <= 2**50:
        raise ValueError(f"scale={scale!r}: must be an integer in [1, 2^50]")
    size = count("size", size, 0)
    return _laplace(_Words(stream if stream is not None else OSBits()), int(scale), size)


def sample_discrete_gaussian(variance: Any, size: int, stream: BitStream | None = None) -> np.ndarray:
    """``size`` independent exact draws of ``N_Z(0, σ²)`` as ``int64`` (CKS Algorithm 3).

    Parameters
    ----------
    variance : int, float or Fraction
        ``σ²`` (not ``σ``), converted exactly by :func:`as_variance`.
    size : int
        Number of draws, ``>= 0``.
    stream : BitStream, optional
        Source of random bits; default the OS CSPRNG (:class:`~fedfdp.entropy.OSBits`).

    Notes
    -----
    The distribution is exact (module docstring): floats only choose between a fast
    decision and an exact integer one. Mechanism use: each SecAgg party adds one
    draw per coordinate; the sum over the honest parties is accounted by
    :mod:`fedfdp.accounting.distributed` (add/remove of one record, L2 sensitivity
    ``s + √d`` in integer units).

    Examples
    --------
    >>> from fedfdp.entropy import SeededBits
    >>> import numpy as np
    >>> x = sample_discrete_gaussian(16, 5, SeededBits(np.random.SeedSequence(1)))
    >>> x.dtype, x.shape
    (dtype('int64'), (5,))
    """
    s2 = as_variance(variance)
    size = count("size", size, 0)
    words = _Words(stream if stream is not None else OSBits())
    a, b = s2.numerator, s2.denominator
    t = math.isqrt(a // b) + 1  # ⌊σ⌋ + 1, exactly
    s2f = float(s2)  # correctly rounded
    blocks = [_dg_block(words, min(_BLOCK, size - i), a, b, t, s2f) for i in range(0, size, _BLOCK)]
    return np.concatenate(blocks) if blocks else np.empty(0, dtype=np.int64)


def _dg_block(words: _Words, size: int, a: int, b: int, t: int, s2f: float) -> np.ndarray:
    """``size`` draws of ``N_Z(0, a/b)`` (CKS Algorithm 3), ``t = ⌊σ⌋ + 1``, ``s2f = fl(a/b)``."""
    parts: list[np.ndarray] = []
    need = size
    while need > 0:
        # a Laplace candidate is accepted with probability >= about 0.6; the first
        # ``need`` accepted ones are kept (i.i.d. N_Z(0, σ²), chosen by position only)
        y = _laplace(words, t, int(need / 0.6) + 16)
        ay = np.abs(y)
        gamma, err = _acceptance_exponent(ay.astype(np.float64), s2f, t)

        def exact(i: int, ay: np.ndarray = ay) -> Fraction:
            return Fraction((int(ay[i]) * b * t - a) ** 2, 2 * a * b * t * t)

        accept = _bernoulli_exp(words, gamma, err, exact, ay >= _EXACT_INT)
        got = y[accept][:need]
        parts.append(got)
        need -= got.size
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def sample_discrete_gaussian_reference(
    variance: Any, size: int, stream: BitStream | None = None
) -> np.ndarray:
    """The same distribution as :func:`sample_discrete_gaussian`, one draw at a time in
    exact rational arithmetic only (CKS Algorithms 1-3 on Python integers and
    :class:`~fractions.Fraction`, no floats): the slow reference, and the code path the
    vectorised sampler falls back to when a float comparison is undecided.
    About 50-80 µs per draw.
    """
    s2 = as_variance(variance)
    size = count("size", size, 0)
    words = _Words(stream if stream is not None else OSBits())
    t = math.isqrt(s2.numerator // s2.denominator) + 1
    out = np.empty(size, dtype=np.int64)
    for i in range(size):
        while True:
            y = _scalar_laplace(t, words)
            if _scalar_bernoulli_exp((abs(y) - s2 / t) ** 2 / (2 * s2), words):
                out[i] = y
                break
    return out


def _scalar_laplace(t: int, words: _Words) -> int:
    """One discrete Laplace draw of scale ``t`` (CKS Algorithm 2), exact."""
    limit = _TWO64 - _TWO64 % t
    while True:
        w = words.one()
        while w >= limit:
            w = words.one()
        u = w % t
        if not _scalar_bernoulli_exp(Fraction(u, t), words):
            continue
        v = 0
        while _scalar_bernoulli_exp(Fraction(1), words):
            v += 1
        x = u + t * v
        negative = bool(words.one() >> 63)
        if negative and x == 0:
            continue
        return -x if negative else x


def discrete_gaussian_variance(variance: Any) -> float:
    """``Var N_Z(0, σ²)`` by direct normalised summation over ``|x| <= 40σ + 10``
    (the omitted mass is below ``e^-800``). ``N_Z(0, 1/4)`` has variance ``≈ 0.2153``,
    not ``0.25``; from ``σ ≈ 1`` on the two agree to ``10⁻⁷``.
    """
    s2 = float(as_variance(variance))
    half = math.ceil(40.0 * math.sqrt(s2)) + 10
    x = np.arange(-half, half + 1, dtype=np.float64)
    w = np.exp(-x * x / (2.0 * s2))
    return float((w * x * x).sum() / w.sum())
