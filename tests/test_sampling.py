"""Samplers: Poisson rate, uniform public batches, independent streams (statistical, stated tolerances)."""

import numpy as np
import pytest
from scipy import stats

from fedfdp.sampling import (
    DeviceStreams,
    ServerStreams,
    allocate_public_batch,
    poisson_sample,
    uniform_sample,
)


def test_poisson_inclusion_rate():
    """200 rounds x 500 records at q = 0.05: the inclusion count is Binomial(1e5, q);
    accept within 5 standard deviations (false alarm < 1e-6)."""
    q, n, rounds = 0.05, 500, 200
    total = sum(len(poisson_sample(n, q, DeviceStreams.for_round(0, r, 3).private)) for r in range(rounds))
    mean, sd = q * n * rounds, np.sqrt(n * rounds * q * (1 - q))
    assert abs(total - mean) < 5 * sd


def test_poisson_sizes_vary_and_can_be_empty():
    sizes = [len(poisson_sample(20, 0.05, DeviceStreams.for_round(1, r, 0).private)) for r in range(300)]
    assert 0 in sizes and len(set(sizes)) > 2
    # P(empty) = 0.95^20 = 0.358; 300 draws: within 5 s.d.
    p0 = 0.95**20
    assert abs(sizes.count(0) - 300 * p0) < 5 * np.sqrt(300 * p0 * (1 - p0))


def test_private_and_public_streams_are_independent():
    """Chi-square test of independence between 'record 0 in the private batch' and
    'record 0 in the public batch' over 4000 rounds (q = m/n = 0.5); p > 1e-4."""
    table = np.zeros((2, 2))
    for r in range(4000):
        s = DeviceStreams.for_round(11, r, 2)
        a = 0 in poisson_sample(10, 0.5, s.private)
        b = 0 in uniform_sample(10, 5, s.public)
        table[int(a), int(b)] += 1
    assert stats.chi2_contingency(table)[1] > 1e-4


def test_streams_are_reproducible_and_distinct():
    a = DeviceStreams.for_round(5, 2, 1)
    b = DeviceStreams.for_round(5, 2, 1)
    assert np.array_equal(a.private.random(10), b.private.random(10))
    c = DeviceStreams.for_round(5, 2, 1)
    assert not np.array_equal(c.private.random(10), c.public.random(10))
    d = DeviceStreams.for_round(5, 3, 1)
    assert not np.array_equal(DeviceStreams.for_round(5, 2, 1).private.random(10), d.private.random(10))
    s = ServerStreams.for_round(5, 2)
    assert s.noise.initial_seed() != DeviceStreams.for_round(5, 2, 1).private_padding.initial_seed()


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
        srv = ServerStreams.for_round(0, r)
        alloc = allocate_public_batch(sizes, 6, srv.sampling)
        assert alloc.sum() == 6 and (alloc <= sizes).all()
        for dev, (off, c) in enumerate(zip(offsets, alloc, strict=True)):
            idx = uniform_sample(int(sizes[dev]), int(c), DeviceStreams.for_round(0, r, dev).public)
            counts[off + idx] += 1
    expected = np.full(sizes.sum(), rounds * 6 / 20)
    assert stats.chisquare(counts, expected).pvalue > 1e-4


def test_bad_sampling_inputs():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="sampling-rate=1.5"):
        poisson_sample(10, 1.5, rng)
    with pytest.raises(ValueError, match="public-batch-size=30"):
        allocate_public_batch(np.array([10, 10]), 30, rng)
    with pytest.raises(ValueError, match="seed=-1"):
        DeviceStreams.for_round(-1, 1, 0)
