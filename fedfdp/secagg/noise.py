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

Fixed work (a timing side channel)
----------------------------------
Under secure aggregation the server sees when each party's reply arrives. A rejection
sampler whose running time depends on the values it draws leaks them (Jin et al.,
"Are we there yet? Timing and floating-point attacks on differential privacy
systems", IEEE S&P 2022): here the loops of CKS Algorithms 1-3 run longer for larger
``|Y|`` and for larger ``γ``. So every step works on arrays of **public** sizes:

* a block of ``b`` draws runs a public number ``m`` of independent candidate trials,
  the smallest for which ``Bin(m, p) >= b`` except with probability
  :data:`STEP_FAILURE` (Chernoff; ``p`` a closed-form lower bound on a trial's success
  probability), and keeps the first ``b`` successes by position;
* each step ``K`` of a von Neumann loop draws for the running candidates padded to a
  public count (a draw is still running at step ``K`` with probability at most
  ``1/(K-1)!``);
* the geometric counts (CKS's ``V``, and ``⌊γ⌋`` of the acceptance, drawn as
  ``[G >= ⌊γ⌋]``) are the runs of a public number of ``Bernoulli(exp(-1))`` draws;
* undecided comparisons (probability about ``2⁻³¹`` each) read their extra words
  from a reserve of :data:`RESERVE_WORDS` drawn with every block.

If a secret count ever exceeds its public size (probability at most
:func:`work_failure_bound`, below ``2⁻⁶⁰`` per call at ``d = 10⁵``), the step does the
extra work and **the law stays exact**: candidates are i.i.d. trials and a trial's
outcome never depends on the public sizes, so the first ``b`` successes are i.i.d.
``N_Z(0, σ²)`` whichever trials they are; only the running time then shows that the
rare event happened. What remains value-dependent is the Python work of an exact
refinement (a few µs, about ``2⁻¹⁰`` per ``10⁵`` draws, for an event nearly independent
of the values) and numpy's own data-dependent costs (``flatnonzero``, fancy indexing).
``benchmarks/reply_timing.py`` measures the time against the magnitude of the draws.

Cost (CPU time, measured on the shared 2-core development machine): 110-120 ms for
``d = 10⁵`` draws at ``σ = 4`` and at ``σ = 10⁵``, against 70-80 ms for the sampler
whose work followed the values (1.5×), a quarter of it reading ``os.urandom``; a call
for a handful of draws costs a few ms (the public steps are Python loops).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from fedfdp.binomial_tails import trials_for, upper_count
from fedfdp.entropy import BitStream, OSBits
from fedfdp.validate import count

__all__ = [
    "MAX_VARIANCE",
    "MIN_VARIANCE",
    "RESERVE_WORDS",
    "STEP_FAILURE",
    "as_variance",
    "discrete_gaussian_variance",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_reference",
    "sample_discrete_laplace",
    "work_failure_bound",
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
_MARGIN = 1.0 - 1e-9  # relative margin on the success probabilities computed in float64
_EXP_MINUS_ONE_FAILS = 0.6321  # below P(Bernoulli(exp(-1)) = 0) = 1 - e⁻¹ = 0.63212...

#: The probability allowed, per public count the sampler relies on, that the secret
#: count it stands for exceeds it (the work then grows, the law stays exact).
STEP_FAILURE = 2.0**-80
#: Words set aside per block for exact refinements (each needed with probability about
#: ``2⁻³¹`` per comparison), so that the words a call reads stay a public count.
RESERVE_WORDS = 16

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
    """Random words from a bit stream: 64-bit, 32-bit halves, single bits, and a reserve.

    The vectorised sampler asks for public amounts only (:meth:`take`, :meth:`take32`,
    :meth:`bits`); the rare exact refinements read single words (:meth:`one`) from a
    reserve of :data:`RESERVE_WORDS` words drawn with each block (:meth:`refill`), so the
    words a call reads stay a public count unless more refinements than that are needed.
    """

    def __init__(self, stream: BitStream) -> None:
        self._stream = stream
        self._reserve: list[int] = []

    def take(self, n: int) -> np.ndarray:
        return self._stream.words(n) if n > 0 else np.empty(0, dtype=np.uint64)

    def take32(self, n: int) -> np.ndarray:
        return self.take((n + 1) // 2).view(np.uint32)[:n]

    def bits(self, n: int) -> np.ndarray:
        raw = self.take((n + 63) // 64).view(np.uint8)
        return np.unpackbits(raw)[:n].astype(bool)

    def refill(self, n: int) -> None:
        """Set aside ``n`` fresh words for :meth:`one` (the unused ones are dropped)."""
        self._reserve = [int(w) for w in self.take(n)][::-1]

    def one(self) -> int:
        if self._reserve:
            return self._reserve.pop()
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


@lru_cache(maxsize=256)
def _alive_sizes(m: int, beta: float) -> tuple[int, ...]:
    """The public sizes of the von Neumann loop's steps ``K = 2, 3, ...`` for ``m`` draws.

    A draw is still running at step ``K`` only if ``A_1, ..., A_{K-1}`` all succeeded:
    probability ``Π_{i<K} f/i <= 1/(K-1)!`` whatever ``f ∈ [0, 1]``; the size of step
    ``K`` is the count the running draws exceed with probability at most ``beta``
    (:data:`STEP_FAILURE`; :func:`~fedfdp.binomial_tails.upper_count`), and the steps
    end where that count is 0.
    """
    sizes: list[int] = []
    k = 2
    while True:
        size = upper_count(m, math.exp(-math.lgamma(k)), beta)
        if size == 0:
            return tuple(sizes)
        sizes.append(size)
        k += 1


def _von_neumann(first: np.ndarray, step: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
    """CKS Algorithm 1's loop with a public amount of work: ``Bernoulli(exp(-f_i))`` from
    ``first`` (the draws ``A_1``) and ``step(K, rows)`` (``A_K ~ Bernoulli(f/K)`` for each
    of ``rows``); the draw stops at its first failure and is 1 iff that ``K`` is odd.

    Step ``K`` draws for the running draws padded to the public size of
    :func:`_alive_sizes` (the padding's outcomes are discarded); a draw still running
    after the last public step (probability at most :data:`STEP_FAILURE` per step) is
    finished by the same loop without padding, so the law is exactly CKS's.
    """
    odd = ~first  # stopped at K = 1
    alive = first.copy()
    sizes = _alive_sizes(first.size, STEP_FAILURE)
    k = 2
    while True:
        idx = np.flatnonzero(alive)
        public = sizes[k - 2] if k - 2 < len(sizes) else 0
        if public == 0 and not idx.size:
            return odd
        rows = np.zeros(max(public, idx.size), dtype=np.int64)
        rows[: idx.size] = idx
        stop = idx[~step(k, rows)[: idx.size]]
        if k % 2:
            odd[stop] = True
        alive[stop] = False
        k += 1


def _bernoulli_exp_fraction(words: _Words, f: np.ndarray, err: np.ndarray, exact: ExactRatio) -> np.ndarray:
    """Exact ``Bernoulli(exp(-f_i))`` for ``f_i ∈ [0, 1]`` (CKS Algorithm 1, von Neumann),
    with a public amount of work (:func:`_von_neumann`).

    ``|f̂_i - f_i| <= err_i``; ``exact(i)`` is ``f_i`` as ``(num, den)``.
    """

    def step(k: int, rows: np.ndarray) -> np.ndarray:
        x = f[rows] / k

        def exact_k(j: int) -> tuple[int, int]:
            num, den = exact(int(rows[j]))
            return num, den * k

        return _bernoulli(words, x, err[rows] / k + 2.0 * _UNIT * x, exact_k)

    return _von_neumann(_bernoulli(words, f, err + 2.0 * _UNIT * f, exact), step)


def _bernoulli_exp_minus_one(words: _Words, n: int) -> np.ndarray:
    """``n`` exact ``Bernoulli(exp(-1))`` draws (CKS Algorithm 1 with ``γ = 1``), with a
    public amount of work.

    ``A_1 ~ Bernoulli(1)`` always succeeds; each ``A_K = [U < 1/K]`` is decided in
    integers from 32 random bits ``W``: with ``m = ⌊2³²/K⌋``, ``W < m`` means ``U < 1/K``
    and ``W > m`` means ``U > 1/K``; ``W = m`` is refined exactly.
    """

    def step(k: int, rows: np.ndarray) -> np.ndarray:
        w = words.take32(rows.size)
        m = (1 << 32) // k
        a = w < np.uint32(m)
        for i in np.flatnonzero(w == np.uint32(m)):
            a[i] = _uniform_below(int(w[i]), 32, 1, k, words)
        return a

    return _von_neumann(np.ones(n, dtype=bool), step)


def _geometric(words: _Words, n: int) -> np.ndarray:
    """``n`` independent draws of ``G`` with ``P(G >= k) = e^{-k}`` (the successes of
    ``Bernoulli(exp(-1))`` before the first failure; CKS Algorithm 2's ``V``), with a
    public amount of work.

    A public number of ``Bernoulli(exp(-1))`` draws (enough for ``n`` failures except with
    probability :data:`STEP_FAILURE`) is cut at its failures; the runs of successes
    between them are independent geometric draws (renewal). Too few failures: more
    draws are appended, so the law is exact.
    """
    if n == 0:
        return np.empty(0, dtype=np.int64)
    length = trials_for(n, _EXP_MINUS_ONE_FAILS, STEP_FAILURE)
    fails = np.flatnonzero(~_bernoulli_exp_minus_one(words, length))
    while fails.size < n:  # probability <= STEP_FAILURE
        more = _bernoulli_exp_minus_one(words, n)
        fails = np.concatenate([fails, length + np.flatnonzero(~more)])
        length += n
    ends = fails[:n]
    return (np.diff(ends, prepend=-1) - 1).astype(np.int64)


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


def _laplace_trials(words: _Words, t: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``m`` independent trials of CKS Algorithm 2 (discrete Laplace of scale ``t``), as
    ``(value, success)``: a successful trial's value is an exact draw of
    ``P(x) ∝ exp(-|x|/t)``.

    A trial reads one 64-bit word ``W``: ``U = W mod t`` is uniform on ``{0..t-1}`` given
    ``W`` below the largest multiple of ``t`` (otherwise the trial fails, probability
    below ``t/2⁶⁴``, where Algorithm 2 would redraw); ``U`` is kept with probability
    ``exp(-U/t)``; ``V`` is geometric (:func:`_geometric`); ``X = U + tV``; a fair sign
    ``B``; the trial fails if ``B = 1`` and ``X = 0``. Every step runs on all ``m`` trials.
    """
    w = words.take(m)
    ok = np.ones(m, dtype=bool)
    limit = _TWO64 - _TWO64 % t  # multiples of t below 2⁶⁴
    if limit < _TWO64:
        ok &= w < np.uint64(limit)
    u = (w % np.uint64(t)).astype(np.int64)
    f = u.astype(np.float64) / t  # u, t < 2⁵³: one rounding

    def exact(i: int) -> tuple[int, int]:
        return int(u[i]), t

    ok &= _bernoulli_exp_fraction(words, f, 2.0 * _UNIT * f, exact)
    v = _geometric(words, m)
    if v.size and int(v.max()) > (2**62) // t:  # probability < exp(-2^12): never
        raise RuntimeError("discrete Laplace draw out of int64 range")
    x = u + t * v
    negative = words.bits(m)
    ok &= ~(negative & (x == 0))
    return np.where(negative, -x, x), ok


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


def _gaussian_acceptance(words: _Words, y: np.ndarray, a: int, b: int, t: int, s2f: float) -> np.ndarray:
    """Exact ``Bernoulli(exp(-γ_i))``, ``γ_i = (|y_i| - σ²/t)²/(2σ²)``, ``σ² = a/b``
    (CKS Algorithm 3's acceptance), with a public amount of work.

    ``exp(-γ) = exp(-⌊γ⌋)·exp(-(γ - ⌊γ⌋))``: the first factor is ``[G >= ⌊γ⌋]`` for a
    geometric ``G`` (:func:`_geometric`, ``P(G >= k) = e^{-k}``), the second the von
    Neumann draw of the fraction; both run on every candidate. A candidate whose
    ``⌊γ⌋`` is not certain from the float (or whose ``|y|`` is beyond float64's exact
    integers) is drawn by the scalar exact algorithm instead (probability about
    ``2⁻⁴⁰`` per candidate at ``σ`` below ``2⁴⁰``).
    """
    ay = np.abs(y)
    gamma, err = _acceptance_exponent(ay.astype(np.float64), s2f, t)
    whole = np.floor(np.maximum(gamma - err, 0.0))
    slow = (ay >= _EXACT_INT) | (whole != np.floor(gamma + err)) | ~np.isfinite(gamma)
    whole = np.where(slow, 0.0, whole)
    frac = np.where(slow, 0.0, np.clip(gamma - whole, 0.0, 1.0))  # exact (Sterbenz) for whole >= 1
    err = np.where(slow, 0.0, err)

    def exact(i: int) -> Fraction:
        return Fraction((int(ay[i]) * b * t - a) ** 2, 2 * a * b * t * t)

    def exact_frac(i: int) -> tuple[int, int]:
        rest = exact(i) if slow[i] else exact(i) - int(whole[i])
        rest = rest - math.floor(rest)
        return rest.numerator, rest.denominator

    g = _geometric(words, y.size)
    accept = (g >= whole) & _bernoulli_exp_fraction(words, frac, err, exact_frac)
    for i in np.flatnonzero(slow):
        accept[i] = _scalar_bernoulli_exp(exact(int(i)), words)
    return accept


def _laplace_success(t: int) -> float:
    """A lower bound on the probability that one trial of :func:`_laplace_trials`
    succeeds: ``P(W < limit)·P(keep U)·P(not (B = 1 and X = 0))`` with
    ``P(keep U) = (1 - e⁻¹)/(t(1 - e^{-1/t}))`` and, given ``U`` kept,
    ``P(X = 0) = 1 - e^{-1/t}``.
    """
    limit = _TWO64 - _TWO64 % t
    lam = -math.expm1(-1.0 / t)  # 1 - e^{-1/t}
    keep = -math.expm1(-1.0) / (t * lam)
    return (limit / _TWO64) * min(keep, 1.0) * (1.0 - lam / 2.0) * _MARGIN


def _gaussian_success(s2f: float, t: int) -> float:
    """A lower bound on the probability that one Laplace trial is accepted as a discrete
    Gaussian draw: :func:`_laplace_success` times
    ``Σ_y L(y)·exp(-(|y| - σ²/t)²/(2σ²)) = C_L·e^{-σ²/(2t²)}·Σ_y e^{-y²/(2σ²)}`` with
    ``C_L = (1 - e^{-1/t})/(1 + e^{-1/t})``, and ``Σ_y e^{-y²/(2σ²)} >= max(√(2π)σ,
    1 + 2e^{-1/(2σ²)})`` (Poisson summation; the terms at 0 and ±1).
    """
    lam = -math.expm1(-1.0 / t)
    c_l = lam / (2.0 - lam)
    total = max(math.sqrt(2.0 * math.pi * s2f), 1.0 + 2.0 * math.exp(-0.5 / s2f))
    return _laplace_success(t) * c_l * math.exp(-s2f / (2.0 * t * t)) * total * _MARGIN


def _draws(words: _Words, size: int, success: float, trials: Callable[[int], tuple[np.ndarray, np.ndarray]],
           ) -> np.ndarray:
    """``size`` draws from blocks of a public number of independent ``trials`` each
    (enough successes for the block except with probability :data:`STEP_FAILURE`;
    :func:`~fedfdp.binomial_tails.trials_for` at the lower bound ``success`` on a
    trial's success probability). The first successes by position are kept: i.i.d. from
    the target, whichever they are. A block short of successes draws more trials.
    """
    parts: list[np.ndarray] = []
    for start in range(0, size, _BLOCK):
        need = min(_BLOCK, size - start)
        words.refill(RESERVE_WORDS)
        m = trials_for(need, success, STEP_FAILURE)
        while need > 0:
            y, ok = trials(m)
            got = y[ok][:need]
            parts.append(got)
            need -= got.size
            m = trials_for(need, success, STEP_FAILURE) if need else 0
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def sample_discrete_laplace(scale: int, size: int, stream: BitStream | None = None) -> np.ndarray:
    """``size`` exact draws of the discrete Laplace ``P(x) ∝ exp(-|x|/scale)`` on ``Z``
    (CKS Algorithm 2), as ``int64``, with a public amount of work (module docstring).

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
    t = int(scale)
    words = _Words(stream if stream is not None else OSBits())
    return _draws(words, size, _laplace_success(t), lambda m: _laplace_trials(words, t, m))


def sample_discrete_gaussian(variance: Any, size: int, stream: BitStream | None = None) -> np.ndarray:
    """``size`` independent exact draws of ``N_Z(0, σ²)`` as ``int64`` (CKS Algorithm 3),
    with a public amount of work: the words read and the sizes of the arrays worked on
    depend on ``σ²`` and ``size`` only, except with probability at most
    :func:`work_failure_bound` (module docstring, "Fixed work").

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

    def trials(m: int) -> tuple[np.ndarray, np.ndarray]:
        y, ok = _laplace_trials(words, t, m)
        return y, ok & _gaussian_acceptance(words, y, a, b, t, s2f)

    return _draws(words, size, _gaussian_success(s2f, t), trials)


def work_failure_bound(variance: Any, size: int) -> float:
    """An upper bound on the probability that one :func:`sample_discrete_gaussian` call
    does more than its public amount of work: :data:`STEP_FAILURE` times the number of
    public counts the call relies on (per block: the trials, and each public step of
    its von Neumann loops and geometric pools).
    """
    s2 = as_variance(variance)
    size = count("size", size, 0)
    t = math.isqrt(s2.numerator // s2.denominator) + 1
    success = _gaussian_success(float(s2), t)
    steps = 0
    for start in range(0, size, _BLOCK):
        m = trials_for(min(_BLOCK, size - start), success, STEP_FAILURE)
        pool = trials_for(m, _EXP_MINUS_ONE_FAILS, STEP_FAILURE)
        steps += 1 + 2 * len(_alive_sizes(m, STEP_FAILURE)) + 2 * (1 + len(_alive_sizes(pool, STEP_FAILURE)))
    return steps * STEP_FAILURE


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
