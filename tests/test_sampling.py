"""Samplers: Poisson rate, uniform public batches, independent streams (statistical, stated tolerances)."""

import numpy as np
import pytest
from scipy import stats

from fedfdp.entropy import OSBits, SeededEntropy, SystemEntropy
from fedfdp.sampling import (
    PublicStreams,
    allocate_public_batch,
    poisson_sample,
    server_public_rng,
    uniform_sample,
)


def test_poisson_inclusion_rate():
    """200 rounds x 500 records at q = 0.05: the inclusion count is Binomial(1e5, q);
    accept within 5 standard deviations (false alarm < 1e-6)."""
    q, n, rounds = 0.05, 500, 200
    total = sum(len(poisson_sample(n, q, OSBits())) for _ in range(rounds))
    mean, sd = q * n * rounds, np.sqrt(n * rounds * q * (1 - q))
    assert abs(total - mean) < 5 * sd


def test_poisson_sizes_vary_and_can_be_empty():
    sizes = [len(poisson_sample(20, 0.05, SystemEntropy().device(r, 0, 0).coins)) for r in range(300)]
    assert 0 in sizes and len(set(sizes)) > 2
    # P(empty) = 0.95^20 = 0.358; 300 draws: within 5 s.d.
    p0 = 0.95**20
    assert abs(sizes.count(0) - 300 * p0) < 5 * np.sqrt(300 * p0 * (1 - p0))


def test_private_and_public_streams_are_independent():
    """Chi-square test of independence between 'record 0 in the private batch' and
    'record 0 in the public batch' over 4000 rounds (q = m/n = 0.5); p > 1e-4."""
    table = np.zeros((2, 2))
    for r in range(4000):
        a = 0 in poisson_sample(10, 0.5, SystemEntropy().device(r, 2, 0).coins)
        b = 0 in uniform_sample(10, 5, PublicStreams.for_device(11, r, 2).sample)
        table[int(a), int(b)] += 1
    assert stats.chi2_contingency(table)[1] > 1e-4


def test_public_streams_are_reproducible_and_distinct():
    a = PublicStreams.for_device(5, 2, 1)
    b = PublicStreams.for_device(5, 2, 1)
    assert np.array_equal(a.sample.random(10), b.sample.random(10))
    d = PublicStreams.for_device(5, 3, 1)
    assert not np.array_equal(PublicStreams.for_device(5, 2, 1).sample.random(10), d.sample.random(10))
    server = server_public_rng(5, 2).random(10)
    assert not np.array_equal(server, PublicStreams.for_device(5, 2, 0).sample.random(10))


def test_secret_streams_never_repeat_and_seeded_ones_only_by_opt_in():
    """OS entropy: two draws for the same (round, device, attempt) differ; the
    seeded (reproducible) source repeats, and differs across purposes, rounds,
    devices and attempts, and from every public stream of the same seed."""
    os_src = SystemEntropy()
    assert not np.array_equal(os_src.device(1, 0, 0).coins.words(4), os_src.device(1, 0, 0).coins.words(4))
    assert not np.array_equal(os_src.noise(1, 0).words(4), os_src.noise(1, 0).words(4))
    seeded = SeededEntropy(5)
    assert np.array_equal(seeded.noise(2, 0).words(4), SeededEntropy(5).noise(2, 0).words(4))
    words = {
        "noise": seeded.noise(2, 0).words(4),
        "noise-attempt": seeded.noise(2, 1).words(4),
        "noise-round": seeded.noise(3, 0).words(4),
        "draw": seeded.device_draw(2, 0).words(4),
        "coins": seeded.device(2, 1, 0).coins.words(4),
        "coins-device": seeded.device(2, 0, 0).coins.words(4),
        "coins-other-seed": SeededEntropy(6).device(2, 1, 0).coins.words(4),
    }
    values = [tuple(v.tolist()) for v in words.values()]
    assert len(set(values)) == len(values)
    public = PublicStreams.for_device(5, 2, 1).sample.bit_generator.random_raw(4)
    assert tuple(public.tolist()) not in set(values)
    with pytest.raises(ValueError, match="seed=-1"):
        SeededEntropy(-1)


def test_uniform_sample():
    rng = np.random.default_rng(0)
    idx = uniform_sample(10, 10, rng)
    assert sorted(idx.tolist()) == list(range(10))
    with pytest.raises(ValueError, match="public batch size 11"):
        uniform_sample(10, 11, rng)


def test_allocation_gives_uniform_subset_of_union():
    """Allocate m = 6 over devices of sizes (2, 5, 13) and sample within devices:
    each of the 20 records must be included with probability 6/20. 6000 rounds;
    chi-square goodness of fit p > 1e-4."""
    sizes = np.array([2, 5, 13])
    counts = np.zeros(sizes.sum())
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rounds = 6000
    for r in range(rounds):
        alloc = allocate_public_batch(sizes, 6, server_public_rng(0, r))
        assert alloc.sum() == 6 and (alloc <= sizes).all()
        for dev, (off, c) in enumerate(zip(offsets, alloc, strict=True)):
            idx = uniform_sample(int(sizes[dev]), int(c), PublicStreams.for_device(0, r, dev).sample)
            counts[off + idx] += 1
    expected = np.full(sizes.sum(), rounds * 6 / 20)
    assert stats.chisquare(counts, expected).pvalue > 1e-4


def test_bad_sampling_inputs():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="sampling-rate=1.5"):
        poisson_sample(10, 1.5, OSBits())
    with pytest.raises(ValueError, match="public-batch-size=30"):
        allocate_public_batch(np.array([10, 10]), 30, rng)
    with pytest.raises(ValueError, match="seed=-1"):
        PublicStreams.for_device(-1, 1, 0)
