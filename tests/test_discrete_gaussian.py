"""The exact discrete Gaussian sampler of fedfdp.secagg.noise, against the N_Z pmf.

The reference pmf is computed here, independently, by direct normalised summation of
``exp(-x²/(2σ²))`` over ``|x| <= 40σ + 10`` (the omitted mass is below ``e^-800``).
Statistical tests use seeded bit streams (deterministic runs of a sampler whose
distribution does not depend on where its bits come from) at a stated significance:

* χ² goodness of fit, bins with expected count < 5 merged into the tails, p > 1e-3;
* a Kolmogorov–Smirnov distance against the exact CDF below the Dvoretzky–Kiefer–
  Wolfowitz–Massart bound ``√(ln(2/α)/(2n))`` at α = 1e-3 (valid for discrete laws);
* moments within 5 standard errors.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from fedfdp.entropy import OSBits, SeededBits
from fedfdp.secagg.keystream import KEY_WORDS, Keystream
from fedfdp.secagg.noise import (
    as_variance,
    discrete_gaussian_variance,
    sample_discrete_gaussian,
)

ALPHA = 1e-3


def stream(seed: int) -> SeededBits:
    return SeededBits(np.random.SeedSequence(seed))


def ref_pmf(weight_exponent, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Support ``-half..half`` and the normalised pmf ∝ ``exp(weight_exponent(x))``."""
    x = np.arange(-half, half + 1)
    logw = np.array([weight_exponent(int(v)) for v in x], dtype=np.float64)
    w = np.exp(logw - logw.max())
    return x, w / w.sum()


def dg_pmf(sigma2: float) -> tuple[np.ndarray, np.ndarray]:
    half = math.ceil(40 * math.sqrt(sigma2)) + 10
    return ref_pmf(lambda v: -v * v / (2.0 * sigma2), half)


def chi2_pvalue(samples: np.ndarray, x: np.ndarray, pmf: np.ndarray) -> float:
    """χ² p-value of ``samples`` against ``pmf`` on ``x`` (tails merged to expected >= 5)."""
    n = samples.size
    counts = np.zeros(x.size)
    idx = samples - x[0]
    assert idx.min() >= 0 and idx.max() < x.size
    np.add.at(counts, idx, 1)
    expected = pmf * n
    # merge from both ends until each merged bin expects >= 5
    lo = int(np.argmax(np.cumsum(expected) >= 5))
    hi = x.size - 1 - int(np.argmax(np.cumsum(expected[::-1]) >= 5))
    obs = np.concatenate([[counts[: lo + 1].sum()], counts[lo + 1 : hi], [counts[hi:].sum()]])
    exp = np.concatenate([[expected[: lo + 1].sum()], expected[lo + 1 : hi], [expected[hi:].sum()]])
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(stat, obs.size - 1))


def ks_distance(samples: np.ndarray, x: np.ndarray, pmf: np.ndarray) -> float:
    """``sup_x |F_n(x) - F(x)|`` on the integers."""
    counts = np.zeros(x.size)
    np.add.at(counts, samples - x[0], 1)
    return float(np.abs(np.cumsum(counts) / samples.size - np.cumsum(pmf)).max())


@pytest.mark.parametrize("sigma", [0.5, 1.0, 4.0, 20.0])
def test_goodness_of_fit(sigma: float) -> None:
    n = 200_000
    samples = sample_discrete_gaussian(sigma * sigma, n, stream(int(sigma * 1000)))
    assert samples.dtype == np.int64 and samples.shape == (n,)
    x, pmf = dg_pmf(sigma * sigma)
    assert chi2_pvalue(samples, x, pmf) > ALPHA
    assert ks_distance(samples, x, pmf) < math.sqrt(math.log(2 / ALPHA) / (2 * n))


def test_goodness_of_fit_rejects_a_wrong_variance() -> None:
    """The same tests have power: σ = 4 samples against the σ = 4.2 pmf fail both."""
    n = 200_000
    samples = sample_discrete_gaussian(16, n, stream(7))
    x, pmf = dg_pmf(4.2**2)
    assert chi2_pvalue(samples, x, pmf) < ALPHA
    assert ks_distance(samples, x, pmf) > math.sqrt(math.log(2 / ALPHA) / (2 * n))


def test_rational_variance_is_exact() -> None:
    """σ² = 7/3 (no float equals it): fit against the pmf of 7/3 and against nothing else."""
    n = 200_000
    samples = sample_discrete_gaussian(Fraction(7, 3), n, stream(11))
    x, pmf = dg_pmf(7 / 3)
    assert chi2_pvalue(samples, x, pmf) > ALPHA


def test_variance_of_quarter_is_not_a_quarter() -> None:
    """Var N_Z(0, 1/4) ≈ 0.215 (not 0.25): the reference, the helper and the samples agree."""
    x, pmf = dg_pmf(0.25)
    var = float((pmf * x * x).sum())
    assert abs(var - 0.2153) < 5e-4 and var < 0.25
    assert abs(discrete_gaussian_variance(0.25) - var) < 1e-12
    n = 400_000
    samples = sample_discrete_gaussian(0.25, n, stream(3)).astype(np.float64)
    fourth = float((pmf * x**4).sum())
    se = math.sqrt((fourth - var**2) / n)
    assert abs(float((samples**2).mean()) - var) < 5 * se
    assert abs(float((samples**2).mean()) - 0.25) > 20 * se  # 0.25 is rejected


def test_sum_of_client_noises_has_the_summed_variance() -> None:
    """n = 10 clients, d = 1e5 coordinates: the per-coordinate sample variance of the
    sum is within 1 ± 3√(2/d) of n·Var N_Z(0, σ²) (σ = 4; Var from the reference pmf)."""
    n_clients, d, sigma2 = 10, 100_000, 16.0
    x, pmf = dg_pmf(sigma2)
    var = float((pmf * x * x).sum())
    total = np.zeros(d, dtype=np.int64)
    for i in range(n_clients):
        total += sample_discrete_gaussian(sigma2, d, stream(100 + i))
    ratio = float((total.astype(np.float64) ** 2).mean()) / (n_clients * var)
    assert abs(ratio - 1.0) < 3 * math.sqrt(2 / d)


def test_large_sigma_moments() -> None:
    """σ = 10⁵ (σ_loc's size at s ≈ 1000√d): mean and variance within 5 s.e. of 0 and σ²."""
    n, sigma2 = 200_000, 1e10
    samples = sample_discrete_gaussian(sigma2, n, stream(5)).astype(np.float64)
    assert abs(samples.mean()) < 5 * math.sqrt(sigma2 / n)
    assert abs(samples.var() / sigma2 - 1.0) < 5 * math.sqrt(2 / n)


def test_goodness_of_fit_at_variance_1e8() -> None:
    """σ² = 10⁸ (σ = 10⁴: blocks of width 512, the two-factor acceptance): χ² on bins of
    width 250 of the exact pmf (tails merged) and the DKW–KS bound, 200 000 draws."""
    n, sigma2 = 200_000, 1e8
    samples = sample_discrete_gaussian(sigma2, n, stream(8))
    half = 40 * 10_000 + 10
    x = np.arange(-half, half + 1)
    pmf = np.exp(-(x.astype(np.float64) ** 2) / (2.0 * sigma2))
    pmf /= pmf.sum()
    bins = (x + half) // 250
    binned = np.bincount(bins, weights=pmf)
    assert chi2_pvalue((samples + half) // 250, np.arange(binned.size), binned) > ALPHA
    assert ks_distance(samples, x, pmf) < math.sqrt(math.log(2 / ALPHA) / (2 * n))


@pytest.mark.parametrize(("sigma2", "cover", "edge"), [(16, 1.0, 6), (62_500, 2.5, 648)])
def test_the_exact_tail_beyond_the_table(monkeypatch: pytest.MonkeyPatch, sigma2: float, cover: float,
                                         edge: int) -> None:
    """With the block table cut at ``cover``·σ (its edge ``Jw = (⌈cover·σ/w⌉ + 2)·w``: 6
    for σ = 4, w = 1; 648 for σ = 250, w = 8), 1-13 % of the trials fall beyond it and
    are drawn by the exact scalar tail (geometric blocks, rational acceptance): the draws
    still fit N_Z(0, σ²) (χ² and KS), and values beyond the edge appear."""
    from fedfdp.secagg import noise

    monkeypatch.setattr(noise, "TABLE_COVER", cover)
    n = 40_000
    samples = sample_discrete_gaussian(sigma2, n, stream(31))
    x, pmf = dg_pmf(sigma2)
    assert chi2_pvalue(samples, x, pmf) > ALPHA
    assert ks_distance(samples, x, pmf) < math.sqrt(math.log(2 / ALPHA) / (2 * n))
    assert np.abs(samples).max() >= edge


class PlantedKeystream(Keystream):
    """A keystream whose first trial has block word ``block_word`` and a positive sign."""

    def __init__(self, seed: int, block_word: int) -> None:
        super().__init__(stream(seed))
        self.block_word = block_word
        self.planted = False

    def words(self, n: int) -> np.ndarray:
        out = super().words(n)
        if not self.planted:
            self.planted = True
            out = out.copy()
            out[0] = np.uint64(self.block_word)
            out[n // 3] &= np.uint64((1 << 63) - 1)
        return out


@pytest.mark.parametrize("seed", range(6))
def test_an_undecided_block_is_refined_exactly(seed: int) -> None:
    """σ² = 16 (w = 1, so the block is |y| and every trial in the table is accepted): a
    first trial whose 64-bit word is ``⌊F_0·2⁶⁴⌋``, ``F_0 = P(|y| = 0 block) = 1/S``, is
    undecided by the table; the sampler must extend ``U`` by the first word ``X`` of the
    refinement lane and return ``0`` iff ``U = (W·2⁶⁴ + X)/2¹²⁸ < F_0``. ``S = Σ_{j>=0}
    e^{-j²/32}`` is computed here with :mod:`decimal` (correctly rounded ``exp``, 60
    digits)."""
    import decimal

    ctx = decimal.Context(prec=60)
    total = sum((ctx.exp(ctx.divide(decimal.Decimal(-j * j), decimal.Decimal(32))) for j in range(200)),
                decimal.Decimal(0))
    f0 = ctx.divide(decimal.Decimal(1), total)
    w = int(ctx.multiply(f0, decimal.Decimal(2**64)).to_integral_value(rounding=decimal.ROUND_FLOOR))
    x = Keystream(stream(seed)).lane(1).one()
    u_lo = ctx.divide(decimal.Decimal((w << 64) + x), decimal.Decimal(2**128))
    u_hi = ctx.divide(decimal.Decimal((w << 64) + x + 1), decimal.Decimal(2**128))
    assert u_hi <= f0 or u_lo >= f0  # one more word decides (else probability 2^-64)
    first = int(sample_discrete_gaussian(16, 3, PlantedKeystream(seed, w))[0])
    assert first == (0 if u_hi <= f0 else 1)


def test_the_extremes_of_the_accepted_range() -> None:
    """σ² = 2⁻³⁰: every draw is 0 (P(x ≠ 0) < e^{-2^29}); σ² = 2⁸⁰: mean and variance
    within 5 standard errors of 0 and σ² (20 000 draws)."""
    from fedfdp.secagg.noise import MAX_VARIANCE, MIN_VARIANCE

    assert not sample_discrete_gaussian(MIN_VARIANCE, 1000, stream(2)).any()
    n, sigma2 = 20_000, float(MAX_VARIANCE)
    samples = sample_discrete_gaussian(MAX_VARIANCE, n, stream(4)).astype(np.float64)
    assert abs(samples.mean()) < 5 * math.sqrt(sigma2 / n)
    assert abs(samples.var() / sigma2 - 1.0) < 5 * math.sqrt(2 / n)


def test_float_variance_is_converted_exactly() -> None:
    assert as_variance(0.1) == Fraction(0.1) != Fraction(1, 10)
    assert as_variance(Fraction(7, 3)) == Fraction(7, 3)
    assert as_variance(16) == 16


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1", 2.0**90])
def test_bad_variance_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="variance"):
        sample_discrete_gaussian(bad, 3, stream(0))


def test_bad_size_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        sample_discrete_gaussian(1.0, -1, stream(0))


def test_default_stream_is_the_os_csprng() -> None:
    """Without a stream the draws come from the OS CSPRNG: two calls differ, and an
    explicit OSBits stream works the same way."""
    a = sample_discrete_gaussian(1e6, 1000)
    b = sample_discrete_gaussian(1e6, 1000)
    c = sample_discrete_gaussian(1e6, 1000, OSBits())
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_seeded_stream_is_reproducible() -> None:
    a = sample_discrete_gaussian(16, 1000, stream(42))
    b = sample_discrete_gaussian(16, 1000, stream(42))
    assert np.array_equal(a, b)
    assert sample_discrete_gaussian(16, 0, stream(1)).shape == (0,)


class CountingBits:
    """A seeded stream that counts the words read."""

    def __init__(self, seed: int) -> None:
        self.inner = stream(seed)
        self.read = 0

    def words(self, n: int) -> np.ndarray:
        self.read += n
        return self.inner.words(n)


def lane_words(variance: object, size: int, seed: int) -> tuple[int, np.ndarray]:
    """The words a call drew from its keystream's lane 0 (its work, in words), and the draws."""
    keys = Keystream(stream(seed))
    x = sample_discrete_gaussian(variance, size, keys)
    return keys.generated, x


def test_a_call_reads_one_key_from_its_stream() -> None:
    """The party's stream is read once, for the AES key: 4 words whatever σ² and size."""
    for variance, size in [(0.25, 1), (1e8, 5_000)]:
        bits = CountingBits(3)
        sample_discrete_gaussian(variance, size, bits)
        assert bits.read == KEY_WORDS


@pytest.mark.parametrize(("variance", "size"),
                         [(0.25, 1), (16, 3_000), (1e10, 3_000), (16, 70_000), (1e8, 20_000)])
def test_words_drawn_per_call_are_a_public_count(variance: float, size: int) -> None:
    """Fixed work: 12 calls with different draws take the same number of keystream words,
    though the magnitude of what they drew (Σ|x|) varies; another size takes another count."""
    reads, magnitudes = set(), []
    for seed in range(12):
        read, x = lane_words(variance, size, 1000 + seed)
        reads.add(read)
        magnitudes.append(int(np.abs(x).sum()))
    assert len(reads) == 1
    assert size == 1 or len(set(magnitudes)) > 1
    assert lane_words(variance, size + 1000, 1)[0] != next(iter(reads))


def test_a_large_draw_costs_no_more_words_than_a_small_one() -> None:
    """The words drawn do not follow the values: one draw at σ = 4, over 200 calls, takes
    the same count whether it came out 0 or beyond 3σ."""
    reads: dict[bool, set[int]] = {True: set(), False: set()}
    for seed in range(200):
        read, (x,) = lane_words(16, 1, 5000 + seed)
        reads[abs(int(x)) >= 6].add(read)
    assert reads[True] and reads[False] and reads[True] == reads[False] and len(reads[True]) == 1


def test_the_work_failure_bound_is_negligible() -> None:
    """At d = 10⁵ the probability that a call exceeds its public amount of work is
    below 2⁻⁶⁰ (each public count is exceeded with probability at most 2⁻⁸⁰)."""
    from fedfdp.secagg.noise import STEP_FAILURE, work_failure_bound

    assert STEP_FAILURE <= 2.0**-80
    for variance in (0.25, 16, 1e10):
        assert 0 < work_failure_bound(variance, 100_000) < 2.0**-60


@pytest.mark.parametrize("sigma2", [6.25, 62_500])
def test_the_law_stays_exact_when_the_public_counts_are_exceeded(monkeypatch: pytest.MonkeyPatch,
                                                                 sigma2: float) -> None:
    """With the tail allowed per public count raised to 0.99 (each public count is then
    about the mean), the secret counts exceed their public sizes about half the time
    (more trials, longer von Neumann loops, more exact completions): the draws still fit
    N_Z(0, σ²) (χ² and KS as above), and the words drawn now vary."""
    from fedfdp.secagg import noise

    monkeypatch.setattr(noise, "STEP_FAILURE", 0.99)
    n = 100_000
    samples = sample_discrete_gaussian(sigma2, n, stream(77))
    x, pmf = dg_pmf(sigma2)
    assert chi2_pvalue(samples, x, pmf) > ALPHA
    assert ks_distance(samples, x, pmf) < math.sqrt(math.log(2 / ALPHA) / (2 * n))
    reads = {lane_words(sigma2, 2_000, seed)[0] for seed in range(8)}
    assert len(reads) > 1


@pytest.mark.parametrize("failure", [2.0**-80, 0.99])
@pytest.mark.parametrize("variance", [0.3, 16, 5.2e6, 1e10])
def test_the_scalar_steps_equal_the_array_steps(monkeypatch: pytest.MonkeyPatch, failure: float,
                                                variance: float) -> None:
    """The late von Neumann steps run on Python integers (``_SCALAR_ROWS``); every step
    on arrays (``_SCALAR_ROWS = -1``) is the reference: the same draws and the same
    keystream words read, for each of 6 seeds and 4 sizes, also with public counts near
    their means (``STEP_FAILURE = 0.99``: running trials often exceed them, so the late
    steps read words beyond the ones read ahead)."""
    from fedfdp.secagg import noise

    monkeypatch.setattr(noise, "STEP_FAILURE", failure)
    for size in (1, 7, 295, 3_000):
        for seed in range(6):
            got = lane_words(variance, size, 900 + seed)
            with monkeypatch.context() as m:
                m.setattr(noise, "_SCALAR_ROWS", -1)
                want = lane_words(variance, size, 900 + seed)
            assert got[0] == want[0]
            assert np.array_equal(got[1], want[1])
