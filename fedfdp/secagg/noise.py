"""Exact discrete Gaussian noise for the distributed mechanism of secure aggregation.

Mechanism
---------
Each SecAgg party adds ``N_Z(0, σ²)`` per coordinate to its scaled, randomly
rounded, clipped private sum, where the discrete Gaussian ``N_Z(0, σ²)`` puts mass
``exp(-x²/(2σ²)) / Σ_{y∈Z} exp(-y²/(2σ²))`` on each integer ``x`` (Canonne, Kamath &
Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020; CKS below).
The privacy of the *sum* of the honest parties' noises is accounted in
:mod:`fedfdp.accounting.distributed` (sensitivity ``s + √d`` in integer units under
add/remove of one record; proof in ``docs/secagg_accounting.md``); this module only
draws the noise, exactly.

The algorithm: blocks, one rejection step
-----------------------------------------
Write ``λ = 1/(2σ²)``, a block width ``w = 2^m`` (``σ/w ∈ [16, 32)``, ``w = 1`` for
``σ < 32``) and ``Λ = λw²``. A *trial* draws

* a magnitude block ``j >= 0`` with probability ``e^{-Λj²}/S``, ``S = Σ_{j>=0}
  e^{-Λj²}``, by inversion of a uniform ``U`` against the block CDF ``F_j``;
* ``u`` uniform on ``{0, ..., w-1}`` and a fair sign; ``y = jw + u``;

and is accepted with probability ``e^{-Γ}``, ``Γ = λ(y² - (jw)²) = Λ·v(2j + v)``,
``v = u/w``, and rejected if the sign is negative and ``y = 0``. An accepted trial
has ``P(y) ∝ e^{-Λj²}·e^{-Γ} = e^{-λy²}`` on ``y >= 0`` and the sign rule halves the
weight of ``0``, so it is exactly ``N_Z(0, σ²)``; a trial succeeds with probability
``θ/(2wS)``, ``θ = Σ_y e^{-λy²} >= √(2π)σ`` (about 0.97 for ``σ >= 32``), against
about 0.45 for CKS's discrete-Laplace proposal (CKS Algorithm 3).

Why it is exact, and where floats are not
-----------------------------------------
No acceptance or selection decision uses floating point; every one is a comparison
of integers that is either certain or resolved exactly:

* **The block.** ``F_j`` is transcendental; the table holds integers
  ``lo_j <= F_j·2⁶⁴ <= hi_j`` computed once per ``σ²`` in Python integer arithmetic
  with directed rounding (``e^{-x}`` by its alternating Taylor series, whose even and
  odd partial sums bracket it; ``S`` with a geometric bound on the tail beyond the
  table). ``U`` lies in ``[W, W+1)/2⁶⁴`` for a 64-bit word ``W``; the block is
  certain unless ``lo_j <= W < hi_j`` for some ``j`` (probability about ``2⁻⁵⁴``),
  and then ``U`` is extended by further words and compared with ``F_j`` bounded to
  as many bits (:func:`_refine_block`). A table of the top 16 bits of ``W`` gives
  the block with one comparison; the few cells holding several boundaries (the far
  tail) use a search.
* **The acceptance** ``e^{-Γ} = e^{-Γ₀}·e^{-(Γ - Γ₀)}`` with ``Γ₀ = G/2³²`` an
  integer lower bound computed in ``uint64`` (``Λ`` rounded down to ``L/2^s``, ``v``
  to its top ``h`` bits, the product floored), so that ``0 <= Γ - Γ₀ <= Δ`` for a
  public ``Δ`` (``2⁻³²`` to ``2⁻¹⁶``, :func:`_plan`). ``Bernoulli(e^{-Γ₀})`` is von
  Neumann's (CKS Algorithm 1: ``A_K ~ Bernoulli(Γ₀/K)`` until the first failure,
  1 iff it is at an odd ``K``) with ``A_1 = [W₁ < G]`` exact for a 32-bit ``W₁``
  and ``A_K`` for ``K >= 2`` certain unless ``KW < G < K(W+1)`` (probability
  ``<= 2⁻³²``, then :func:`_uniform_below` in integers). ``Bernoulli(e^{-(Γ-Γ₀)})``
  is 1 when its first uniform is ``>= Δ`` (certain from a 32-bit word); otherwise
  (probability ``<= Δ``) ``Γ - Γ₀`` is formed as an exact
  :class:`~fractions.Fraction` and the draw finished exactly
  (:func:`_bernoulli_exp_prefix`). ``Γ₀ < 1`` in every block of the table
  (``Λ(2J - 1) < 1``).
* **The tail** (blocks ``j >= J``, ``J`` covering ``|y|`` up to about ``16σ``-``20σ``,
  :data:`TABLE_COVER`, probability below ``e^{-128}``) is drawn by scalar exact code: ``j = J + g`` with
  ``g`` geometric of ratio ``e^{-2ΛJ}`` accepted with ``e^{-Λg²}``, and ``Γ`` accepted
  by CKS Algorithm 1 on Python integers (:func:`_scalar_bernoulli_exp`).

Representing ``σ²``
-------------------
``σ²`` is a rational number (:func:`as_variance`): an ``int``, a
:class:`fractions.Fraction`, or a float, which is converted **exactly**
(``Fraction(x)``: every finite double is a dyadic rational ``m·2^e``), so
``variance=0.25`` is exactly ``1/4`` and ``variance=σ_loc**2`` is the double
nearest to ``σ_loc²``, sampled exactly. ``σ²`` must lie in ``[2⁻³⁰, 2⁸⁰]``.

Randomness
----------
One call reads :data:`~fedfdp.secagg.keystream.KEY_WORDS` words from its
:class:`~fedfdp.entropy.BitStream` (by default the party's OS CSPRNG,
:class:`~fedfdp.entropy.OSBits`; under ``reproducible-noise`` the seeded stream) as
the key of an AES-256-CTR :class:`~fedfdp.secagg.keystream.Keystream`; the trials
read lane 0 and the exact refinements lane 1 of it. A
:class:`~fedfdp.secagg.keystream.Keystream` passed as the stream is used as is.

Fixed work (a timing side channel)
----------------------------------
Under secure aggregation the server sees when each party's reply arrives; a sampler
whose running time follows the values it draws leaks them (Jin et al., "Are we there
yet? Timing and floating-point attacks on differential privacy systems", IEEE S&P
2022). So every array has a **public** size, a function of ``σ²`` and the number of
draws only:

* a block of ``b`` draws runs ``m`` trials, the smallest ``m`` with ``Bin(m, p) >= b``
  except with probability :data:`STEP_FAILURE` (Chernoff,
  :func:`~fedfdp.binomial_tails.trials_for`; ``p`` a lower bound on ``θ/(2wS)``),
  and keeps the first ``b`` successes by position;
* the trials whose 16-bit cell holds several boundaries are searched in an array
  padded to a public count; step ``K >= 2`` of the von Neumann loop runs on the
  running trials padded to a public count (a trial is still running with
  probability at most ``E[Γ₀]·Γ_max^{K-2}/(K-1)!``); the exact completions of the
  second factor run a public number of times (padding with a dummy);
* all counts by :func:`~fedfdp.binomial_tails.upper_count` at :data:`STEP_FAILURE`.

Lane 0 of the keystream thus yields the same number of words for every call of a
given ``(σ², size)``. If a secret count exceeds its public size (probability at most
:func:`work_failure_bound`, below ``2⁻⁶⁰`` per call at ``d = 10⁵``) the step does the
extra work and **the law stays exact**: trials are i.i.d. and a trial's outcome never
depends on the public sizes, so the first ``b`` successes are i.i.d. ``N_Z(0, σ²)``
whichever trials they are; only the running time then shows that the rare event
happened. What remains outside the bound: the exact refinements of an undecided
block or von Neumann comparison and the far tail (each about ``2⁻³²`` per
comparison or rarer, reading lane 1, a few µs of Python), numpy's own
value-dependent costs (compaction, fancy indexing) and, in the late von Neumann steps
that run on Python integers, whether a running row's trial goes on (one list append).
``benchmarks/reply_timing.py`` measures time against the magnitude of the draws;
``benchmarks/sampler.py`` the cost.

Cost (``benchmarks/sampler.py``, ``docs/performance.md``; 2 cores): ``10⁶`` draws at
``σ² = 10⁸`` in about 45 ms with nothing else running, 3.7 times numpy's continuous
``normal`` (0.17 s and 3.1-4.2 times at load average 10-11; medians of 15 interleaved
repetitions); three keystream words per trial and about 1.03 trials per draw. The per-``σ²`` table (two
certified exponentials, then ``J <= 650`` products with directed rounding, and the
16-bit cells: 10-30 ms) is built on the first call and cached.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from fedfdp.binomial_tails import trials_for, upper_count
from fedfdp.entropy import BitStream, OSBits
from fedfdp.secagg.keystream import Keystream
from fedfdp.validate import count

__all__ = [
    "MAX_VARIANCE",
    "MIN_VARIANCE",
    "STEP_FAILURE",
    "TABLE_COVER",
    "as_variance",
    "discrete_gaussian_variance",
    "sample_discrete_gaussian",
    "work_failure_bound",
]

#: Smallest and largest ``σ²`` the sampler accepts.
MIN_VARIANCE = Fraction(1, 2**30)
MAX_VARIANCE = Fraction(2**80)

#: The block table covers ``|y|`` up to about this many ``σ`` (or ``σ²/w >= 16σ``
#: where ``Γ₀ < 1`` needs fewer blocks); beyond is the exact scalar tail (mass below
#: ``e^{-128}`` at the default). Any value ``>= 0`` gives the same law.
TABLE_COVER = 20.0

#: The probability allowed, per public count the sampler relies on, that the secret
#: count it stands for exceeds it (the work then grows, the law stays exact).
STEP_FAILURE = 2.0**-80

_TWO64 = 1 << 64
_MAX64 = _TWO64 - 1
_CELL_BITS = 16  # the block table's first level: the top 16 bits of W
_CELL_SHIFT = 64 - _CELL_BITS
_HEAD = 17  # bits of v = u/w that enter Γ₀ (s = 64 - 2h bits of Λ)
_TABLE_GUARD = 48  # extra bits carried while the block table is computed
_BLOCK = 1 << 18  # draws per block
_MARGIN = 1.0 - 1e-9  # relative margin on probabilities evaluated in float64
#: A von Neumann step with at most this many rows runs on Python integers, not arrays
#: (:func:`_von_neumann`): the same words, rows and decisions, without array overheads.
_SCALAR_ROWS = 32


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


# --------------------------------------------------------------------------- exact scalars


def _uniform_below(prefix: int, bits: int, num: int, den: int, words: Keystream) -> bool:
    """Whether ``U < num/den`` for ``U`` uniform on ``[prefix/2^bits, (prefix+1)/2^bits)``.

    Exact: integers only; ``U`` is refined by fresh 64-bit words until decided.
    """
    while True:
        target = num << bits
        if (prefix + 1) * den <= target:
            return True
        if prefix * den >= target:
            return False
        prefix = (prefix << 64) | words.one()
        bits += 64


def _bernoulli_exp_prefix(prefix: int, bits: int, x: Fraction, words: Keystream) -> bool:
    """``Bernoulli(e^{-x})`` for rational ``x ∈ [0, 1]`` (CKS Algorithm 1), the first
    uniform being ``[prefix/2^bits, (prefix+1)/2^bits)`` refined as needed.
    """
    if not _uniform_below(prefix, bits, x.numerator, x.denominator, words):
        return True
    k = 2
    while _uniform_below(words.one(), 64, x.numerator, x.denominator * k, words):
        k += 1
    return k % 2 == 1


def _scalar_bernoulli_exp(gamma: Fraction, words: Keystream) -> bool:
    """One exact ``Bernoulli(e^{-γ})`` for a rational ``γ >= 0`` (CKS Algorithm 1:
    ``⌊γ⌋`` draws of ``Bernoulli(e^{-1})`` and one of ``Bernoulli(e^{-(γ-⌊γ⌋)})``).
    """
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _bernoulli_exp_prefix(words.one(), 64, Fraction(1), words):
            return False
    return _bernoulli_exp_prefix(words.one(), 64, gamma - whole, words)


def _exp_neg_fraction(p: int, q: int, prec: int) -> tuple[int, int]:
    """Integers ``lo <= e^{-p/q}·2^prec <= hi`` for ``0 <= p <= q``.

    The Taylor series of ``e^{-f}``, ``f <= 1``, alternates with decreasing terms, so
    its even partial sums are upper bounds and its odd ones lower bounds; each term is
    carried rounded up and rounded down.
    """
    one = 1 << prec
    t_up = t_dn = one
    s_up = s_dn = one
    hi, lo = one, 0
    k, tail = 0, 0
    while tail < 2:
        k += 1
        t_up = -(-(t_up * p) // (q * k))
        t_dn = (t_dn * p) // (q * k)
        if k % 2:
            s_up, s_dn = s_up - t_dn, s_dn - t_up
            lo = max(lo, s_dn)
        else:
            s_up, s_dn = s_up + t_up, s_dn + t_dn
            hi = min(hi, s_up)
        if t_up <= 1:
            tail += 1
    return max(lo, 0), hi


@lru_cache(maxsize=16)
def _exp_neg_one(prec: int) -> tuple[int, int]:
    """:func:`_exp_neg_fraction` of ``e^{-1}``."""
    return _exp_neg_fraction(1, 1, prec)


def _exp_neg(x: Fraction, prec: int) -> tuple[int, int]:
    """Integers ``lo <= e^{-x}·2^prec <= hi`` for a rational ``x >= 0``."""
    whole, rest = divmod(x.numerator, x.denominator)
    if whole > prec:  # e^{-x}·2^prec < (2/e)^prec < 1
        return 0, 1
    g = prec + 16
    lo, hi = _exp_neg_fraction(rest, x.denominator, g)
    if whole:
        elo, ehi = _exp_neg_one(g)
        shift = g * whole
        lo = (lo * elo**whole) >> shift
        hi = -(-(hi * ehi**whole) >> shift)
    return lo >> 16, -(-hi >> 16)


# --------------------------------------------------------------------------- the plan


@lru_cache(maxsize=64)
def _weights(a: int, b: int, m: int, blocks: int, prec: int) -> tuple[list[int], list[int], int, int]:
    """Integer bounds ``lo_j <= e^{-Λj²}·2^prec <= hi_j`` for ``j < blocks``, and
    ``(lo, hi)`` bounds of the tail ``2^prec·Σ_{j>=J} e^{-Λj²}``, for ``Λ = w²b/(2a)``,
    ``w = 2^m``, ``J = blocks``: the terms ``J <= j < K`` summed, where beyond ``K``
    (``e^{-ΛK²} < 2^-(prec+8)``) the rest is below ``e^{-ΛK²}/(1 - e^{-2ΛK})``.

    The terms by the recurrence ``e^{-Λ(j+1)²} = e^{-Λj²}·r_j``, ``r_j = e^{-Λ(2j+1)}``,
    ``r_{j+1} = r_j·e^{-2Λ}``, from bounds of ``e^{-Λ}`` and ``e^{-2Λ}``, each product
    rounded down in the lower chain and up in the upper one.
    """
    lam = Fraction(b << (2 * m), 2 * a)
    end = max(blocks, math.isqrt(math.ceil((prec + 8) * 0.7 / lam)) + 1)
    r_lo, r_hi = _exp_neg(lam, prec)
    e_lo, e_hi = _exp_neg(2 * lam, prec)
    t_lo = t_hi = 1 << prec
    lo, hi = [], []
    for _ in range(end):
        lo.append(t_lo)
        hi.append(t_hi)
        t_lo, t_hi = (t_lo * r_lo) >> prec, -(-(t_hi * r_hi) >> prec)
        r_lo, r_hi = (r_lo * e_lo) >> prec, -(-(r_hi * e_hi) >> prec)
    t_hi = _exp_neg(lam * end * end, prec)[1]
    gap = (1 << prec) - _exp_neg(2 * lam * end, prec)[1]
    rest = -(-(t_hi << prec) // gap)
    return lo[:blocks], hi[:blocks], sum(lo[blocks:]), sum(hi[blocks:]) + rest


@lru_cache(maxsize=64)
def _cdf_bounds(a: int, b: int, m: int, blocks: int, prec: int) -> tuple[list[int], list[int]]:
    """Integers ``lo_j <= F_j·2^prec <= hi_j`` (``hi_j <= 2^prec``) for the block CDF
    ``F_j = Σ_{i<=j} e^{-Λi²} / S``, ``j < blocks`` (:func:`_weights`).
    """
    w_lo, w_hi, t_lo, t_hi = _weights(a, b, m, blocks, prec + _TABLE_GUARD)
    s_lo, s_hi = sum(w_lo) + t_lo, sum(w_hi) + t_hi
    lo, hi, c_lo, c_hi = [], [], 0, 0
    for wl, wh in zip(w_lo, w_hi, strict=True):
        c_lo, c_hi = c_lo + wl, c_hi + wh
        lo.append((c_lo << prec) // s_hi)
        hi.append(min(-(-(c_hi << prec) // s_lo), 1 << prec))
    return lo, hi


@dataclass(frozen=True)
class _Plan:
    """Everything public a call needs for one ``σ² = a/b`` (see the module docstring)."""

    a: int
    b: int
    m: int  # w = 2^m
    blocks: int  # J
    lam: Fraction  # Λ = λw²
    head: int  # h
    lam_int: int  # L = ⌊Λ·2^s⌋, s = 64 - 2h
    corr: int  # ⌈Δ·2³²⌉
    lo: np.ndarray
    hi: np.ndarray
    cell_base: np.ndarray
    cell_lo: np.ndarray
    cell_hi: np.ndarray
    cell_complex: np.ndarray
    p_complex: float
    success: float
    steps: tuple[float, ...]  # survival bound of von Neumann step K = 2, 3, ...


@lru_cache(maxsize=64)
def _plan(a: int, b: int, cover: float) -> _Plan:
    """The public plan of ``σ² = a/b``: ``w``, the table, the bounds of the work."""
    m = 0
    while (32 << m) ** 2 * b <= a:  # σ >= 32·2^m: widen (σ/w ends in [16, 32))
        m += 1
    lam = Fraction(b << (2 * m), 2 * a)
    s2f = a / b
    sigma = math.sqrt(s2f)
    blocks = math.ceil(cover * sigma / (1 << m)) + 2
    if m:
        blocks = min(blocks, (math.ceil(1 / lam) + 1) // 2)  # largest J with Λ(2J-1) < 1
        while lam * (2 * blocks - 1) >= 1:
            blocks -= 1
    head = min(m, _HEAD)
    s = 64 - 2 * head
    lam_int = math.floor(lam * (1 << s)) if m else 0
    if m:
        delta = (lam - Fraction(lam_int, 1 << s)) * (2 * blocks - 1) + Fraction(1, 1 << 32)
        if head < m:
            delta += Fraction(lam_int, 1 << s) * Fraction(2 * blocks, 1 << head)
        corr = math.ceil(delta * (1 << 32))  # below 2^17: Δ < 2^-15
    else:
        corr = 0
    lo_l, hi_l = _cdf_bounds(a, b, m, blocks, 64)
    lo = np.array(lo_l, dtype=np.uint64)
    hi = np.array([min(h, _MAX64) for h in hi_l], dtype=np.uint64)
    # the first level: per cell of W's top bits, the blocks whose [lo, hi] meets it
    starts = np.arange(1 << _CELL_BITS, dtype=np.uint64) << np.uint64(_CELL_SHIFT)
    ends = starts + np.uint64((1 << _CELL_SHIFT) - 1)
    first = np.searchsorted(hi, starts, side="left")  # hi_j < start for j < first
    last = np.searchsorted(lo, ends, side="right")  # lo_j <= end for j < last
    meets = last - first
    inner = np.zeros(meets.size, dtype=bool)
    one = np.flatnonzero(meets == 1)
    inner[one] = (lo[first[one]] >= starts[one]) & (hi[first[one]] <= ends[one])
    complex_ = (meets > 1) | ((meets == 1) & ~inner)
    complex_[-1] = True
    cell_lo = np.full(meets.size, _MAX64, dtype=np.uint64)
    cell_hi = np.full(meets.size, _MAX64, dtype=np.uint64)
    simple_one = (meets == 1) & ~complex_
    cell_lo[simple_one] = lo[first[simple_one]]
    cell_hi[simple_one] = hi[first[simple_one]]
    # work bounds (float64 with margins: they bound the work, not the law)
    p = 64 + _TABLE_GUARD
    w_lo, w_hi, _, tail = _weights(a, b, m, blocks, p)
    total_hi = (sum(w_hi) + tail) / 2.0**p
    total_lo = sum(w_lo) / 2.0**p
    theta = max(math.sqrt(2.0 * math.pi * s2f), 1.0)
    success = min(1.0, theta / (2.0 * (1 << m) * total_hi)) * _MARGIN
    mean_j = (sum(j * h for j, h in enumerate(w_hi)) + (blocks - 1) * tail) / 2.0**p / total_lo
    mean_f = min(1.0, float(lam) * (mean_j + 1.0 / 3.0) / _MARGIN) if m else 0.0
    f_max = min(1.0, float(lam * (2 * blocks - 1)) / _MARGIN) if m else 0.0
    steps: list[float] = []
    k = 2
    while mean_f > 0.0:
        prob = mean_f * f_max ** (k - 2) / math.factorial(k - 1)
        if prob < 1e-300:
            break
        steps.append(min(1.0, prob / _MARGIN))
        k += 1
    return _Plan(
        a=a, b=b, m=m, blocks=blocks, lam=lam, head=head, lam_int=lam_int, corr=corr,
        lo=lo, hi=hi, cell_base=first.astype(np.int64), cell_lo=cell_lo, cell_hi=cell_hi,
        cell_complex=complex_, p_complex=float(complex_.sum()) / (1 << _CELL_BITS),
        success=success, steps=tuple(steps),
    )


def _step_sizes(plan: _Plan, trials: int) -> list[int]:
    """Public sizes of von Neumann steps ``K = 2, 3, ...`` for ``trials`` trials."""
    sizes = []
    for prob in plan.steps:
        size = upper_count(trials, prob, STEP_FAILURE)
        if size == 0:
            break
        sizes.append(size)
    return sizes


# --------------------------------------------------------------------------- exact slow paths


def _refine_block(plan: _Plan, prefix: int, side: Keystream) -> int:
    """The block of ``U ∈ [prefix/2⁶⁴, (prefix+1)/2⁶⁴)``: the smallest ``j`` with
    ``U < F_j`` (``J`` for the tail), extending ``U`` and the bounds of ``F`` by 64
    bits at a time until certain.
    """
    bits = 64
    while True:
        lo, hi = _cdf_bounds(plan.a, plan.b, plan.m, plan.blocks, bits)
        k = bisect_right(lo, prefix)  # prefix < lo_k: U < F_k
        if k == 0 or prefix >= hi[k - 1]:  # U >= F_{k-1}
            return k
        prefix = (prefix << 64) | side.one()
        bits += 64


def _tail_block(plan: _Plan, side: Keystream) -> int:
    """A block ``j >= J`` with probability ``∝ e^{-Λj²}``: ``j = J + g``, ``g`` geometric
    with ratio ``e^{-2ΛJ}`` (a run of ``Bernoulli(e^{-2ΛJ})`` successes), accepted with
    ``e^{-Λg²}`` (``e^{-Λ(J+g)²} ∝ e^{-2ΛJg}·e^{-Λg²}``).
    """
    ratio = 2 * plan.lam * plan.blocks
    while True:
        g = 0
        while _scalar_bernoulli_exp(ratio, side):
            g += 1
        if _scalar_bernoulli_exp(plan.lam * g * g, side):
            return plan.blocks + g


def _exponent(plan: _Plan, block: int, u: int) -> Fraction:
    """``Γ = Λ·v(2j + v)``, ``v = u/w``, exactly."""
    w = 1 << plan.m
    return plan.lam * Fraction(u * (2 * block * w + u), w * w)


# --------------------------------------------------------------------------- the trials


def _trials(plan: _Plan, main: Keystream, side: Keystream, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` independent trials as ``(value, success)`` (module docstring)."""
    raw = main.words(3 * n)
    wb, ws, wv = raw[:n], raw[n : 2 * n], raw[2 * n :]
    # the block: the first level, then the padded search of complex cells
    cell = (wb >> np.uint64(_CELL_SHIFT)).astype(np.int64)
    hi_c = plan.cell_hi[cell]
    block = plan.cell_base[cell] + (wb >= hi_c)
    slow = (wb >= plan.cell_lo[cell]) & (wb < hi_c)
    cx = np.flatnonzero(plan.cell_complex[cell])
    rows = np.zeros(max(upper_count(n, plan.p_complex, STEP_FAILURE), cx.size), dtype=np.int64)
    rows[: cx.size] = cx
    w_c = wb[rows]
    k = np.searchsorted(plan.lo, w_c, side="right")
    prev = plan.hi[np.maximum(k - 1, 0)]
    sure = (k == 0) | ((w_c >= prev) & (w_c != np.uint64(_MAX64)))
    block[cx] = k[: cx.size]
    slow[cx] = ~sure[: cx.size]
    slow |= block >= plan.blocks
    # the magnitude within the block; the sign as 0 or -1 (arithmetic shift)
    u = ws & np.uint64((1 << plan.m) - 1)
    sign = ws.view(np.int64) >> np.int64(63)
    # Γ₀ = G/2³² <= Γ, and von Neumann's A_1 = [W₁ < G]
    jb = np.minimum(block, plan.blocks - 1).view(np.uint64)
    if plan.m:
        uh = u >> np.uint64(plan.m - plan.head) if plan.head < plan.m else u
        big_g = (np.uint64(plan.lam_int) * (uh * ((jb << np.uint64(plan.head + 1)) + uh))) >> np.uint64(32)
    else:
        big_g = np.zeros(n, dtype=np.uint64)
    halves = wv.view(np.uint32)  # little-endian: the low half of each word first
    w1, wc = halves[0::2], halves[1::2]
    accept = _von_neumann(plan, main, side, big_g, w1 < big_g)
    # the second factor e^{-(Γ - Γ₀)}: certain unless its first uniform is below Δ
    rare = np.flatnonzero(wc < np.uint32(plan.corr))
    public = upper_count(n, plan.corr / 2.0**32, STEP_FAILURE)
    for i in rare.tolist():
        if not slow[i]:
            x = _exponent(plan, int(block[i]), int(u[i])) - Fraction(int(big_g[i]), 1 << 32)
            accept[i] &= _bernoulli_exp_prefix(int(wc[i]), 32, x, side)
    for _ in range(public - rare.size):  # the same work on a dummy, discarded
        x = _exponent(plan, int(jb[0]), int(u[0])) - Fraction(int(big_g[0]), 1 << 32)
        _bernoulli_exp_prefix(int(wc[0]), 32, x, side)
    # the exact slow paths: undecided blocks, the tail
    values = (block << np.int64(plan.m)) + u.view(np.int64)
    for i in np.flatnonzero(slow).tolist():
        j = _refine_block(plan, int(wb[i]), side)
        if j >= plan.blocks:
            j = _tail_block(plan, side)
        value = (j << plan.m) + int(u[i])
        if value >= 2**62:  # probability < e^{-2^100}: never
            raise RuntimeError("discrete Gaussian draw out of int64 range")
        values[i] = value
        accept[i] = _scalar_bernoulli_exp(_exponent(plan, j, int(u[i])), side)
    accept &= (values != 0) | (sign == 0)
    return (values ^ sign) - sign, accept


def _von_neumann(plan: _Plan, main: Keystream, side: Keystream, big_g: np.ndarray, first: np.ndarray,
                 ) -> np.ndarray:
    """``Bernoulli(e^{-G/2³²})`` per trial (CKS Algorithm 1) from ``first`` (``A_1``):
    step ``K`` draws ``A_K = [U_K < G/(K·2³²)]`` for the running trials padded to a
    public count, from 32-bit words; a comparison that the word leaves undecided
    (``KW < G < K(W+1)``) is refined exactly. A trial still running after the last
    public step is finished by the same loop without padding, so the law is exact.

    The steps run on arrays while they hold more than :data:`_SCALAR_ROWS` rows, then
    on Python integers (the late steps hold a few rows each; an array operation there
    costs more than the rows' arithmetic): the same words in the same order, the same
    rows padded to the same public counts, the same decisions.
    """
    odd = ~first
    alive = first.copy()
    sizes = _step_sizes(plan, first.size)
    # the public steps' words in one read: the same words in the same order as read step
    # by step (a step that runs more trials than its public count reads on from ``main``)
    ahead = main.words(sum((size + 1) // 2 for size in sizes))
    halves = ahead.view(np.uint32).astype(np.uint64)  # little-endian: each word's low half first
    used = 0
    k = 2
    while True:
        idx = np.flatnonzero(alive)
        public = sizes[k - 2] if k - 2 < len(sizes) else 0
        if public == 0 and not idx.size:
            return odd
        if max(public, idx.size) <= _SCALAR_ROWS:
            break
        rows = np.zeros(max(public, idx.size), dtype=np.int64)
        rows[: idx.size] = idx
        need = (rows.size + 1) // 2
        if used + need <= ahead.size:
            w = halves[2 * used : 2 * used + rows.size]
        else:
            more = main.words(used + need - max(used, ahead.size))
            w = np.concatenate([ahead[used:], more]).view(np.uint32)[: rows.size].astype(np.uint64)
        used += need
        g = big_g[rows]
        kk = np.uint64(k)
        wk = w * kk
        yes = wk + kk <= g
        unsure = ~yes & (wk < g)
        for i in np.flatnonzero(unsure[: idx.size]).tolist():
            yes[i] = _uniform_below(int(w[i]), 32, int(g[i]), k << 32, side)
        stop = idx[~yes[: idx.size]]
        if k % 2:
            odd[stop] = True
        alive[stop] = False
        k += 1
    # the late steps on Python integers (the loop above, row for row)
    live = idx.tolist()
    gs = [int(x) for x in big_g[live]] if live else []
    g0 = int(big_g[0])
    left = halves[2 * min(used, ahead.size):].tolist()  # the unread public halves
    at = 0  # the next of ``left`` (two per word)
    while True:
        public = sizes[k - 2] if k - 2 < len(sizes) else 0
        if public == 0 and not live:
            return odd
        count = max(public, len(live))
        need = (count + 1) // 2
        if at + 2 * need > len(left):  # beyond the public words: read on, as above
            extra = main.words(need - (len(left) - at) // 2)
            left = left[at:] + extra.view(np.uint32).tolist()
            at = 0
        words = left[at : at + count]
        at += 2 * need
        keep_live: list[int] = []
        keep_g: list[int] = []
        for r in range(count):
            gr = gs[r] if r < len(live) else g0
            wr = words[r] * k
            accepted = wr + k <= gr
            undecided = not accepted and wr < gr
            if r >= len(live):
                continue  # a padding row: the same arithmetic, discarded
            if undecided:
                accepted = _uniform_below(words[r], 32, gr, k << 32, side)
            if accepted:
                keep_live.append(live[r])
                keep_g.append(gr)
            elif k % 2:
                odd[live[r]] = True
        live, gs = keep_live, keep_g
        k += 1


def _keystream(stream: BitStream | None) -> Keystream:
    if isinstance(stream, Keystream):
        return stream
    return Keystream(stream if stream is not None else OSBits())


def sample_discrete_gaussian(variance: Any, size: int, stream: BitStream | None = None) -> np.ndarray:
    """``size`` independent exact draws of ``N_Z(0, σ²)`` as ``int64``, with a public
    amount of work: the keystream words of the trials and the sizes of the arrays
    worked on depend on ``σ²`` and ``size`` only, except with probability at most
    :func:`work_failure_bound` (module docstring, "Fixed work").

    Parameters
    ----------
    variance : int, float or Fraction
        ``σ²`` (not ``σ``), converted exactly by :func:`as_variance`.
    size : int
        Number of draws, ``>= 0``.
    stream : BitStream, optional
        The secret bits that key the AES-CTR keystream (4 words read); default the
        OS CSPRNG (:class:`~fedfdp.entropy.OSBits`). A
        :class:`~fedfdp.secagg.keystream.Keystream` is used directly.

    Notes
    -----
    The distribution is exact (module docstring): every decision is an integer
    comparison, certain or refined exactly. Mechanism use: each SecAgg party adds one
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
    main = _keystream(stream)
    side = main.lane(1)
    plan = _plan(s2.numerator, s2.denominator, TABLE_COVER)
    parts: list[np.ndarray] = []
    for start in range(0, size, _BLOCK):
        need = min(_BLOCK, size - start)
        m = trials_for(need, plan.success, STEP_FAILURE)
        while need > 0:
            y, ok = _trials(plan, main, side, m)
            got = y[ok][:need]
            parts.append(got)
            need -= got.size
            m = trials_for(need, plan.success, STEP_FAILURE) if need else 0
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def work_failure_bound(variance: Any, size: int) -> float:
    """An upper bound on the probability that one :func:`sample_discrete_gaussian` call
    does more than its public amount of work: :data:`STEP_FAILURE` times the number of
    public counts the call relies on (per block: the trials, the searched cells, each
    von Neumann step and the exact completions).
    """
    s2 = as_variance(variance)
    size = count("size", size, 0)
    plan = _plan(s2.numerator, s2.denominator, TABLE_COVER)
    counts = 0
    for start in range(0, size, _BLOCK):
        m = trials_for(min(_BLOCK, size - start), plan.success, STEP_FAILURE)
        counts += 3 + len(_step_sizes(plan, m))
    return counts * STEP_FAILURE


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
