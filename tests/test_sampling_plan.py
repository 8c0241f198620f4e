"""The sampling plan: per mode, who is drawn (statistical tests with stated
tolerances), the normaliser, and the event charged — closed forms written here."""

import numpy as np
import pytest
from scipy import stats

from fedfdp.config import ConfigError, Mode, load_config
from fedfdp.entropy import OSBits, SeededEntropy
from fedfdp.mechanism import sampling_settings
from fedfdp.modes import PHASES
from fedfdp.sampling import server_public_rng
from fedfdp.sampling_plan import SamplingPlan, SamplingSettings, Subsampling
from tests.mechanism_helpers import resolve

SIZES = (12, 7, 30, 1, 9, 16)
N = sum(SIZES)
FDP = PHASES[Mode.FDP]


def _plan(**kw):
    return SamplingPlan(SamplingSettings(**{"sampling_rate": 0.2, "public_batch_size": 10, **kw}), SIZES)


@pytest.mark.parametrize(
    ("settings", "event", "normaliser"),
    [
        ({}, Subsampling(0.2, 1.0), 0.2 * N),
        ({"device_sampling_rate": 0.5}, Subsampling(0.2, 0.5), 0.5 * 0.2 * N),
        ({"device_sampling_rate": 0.5, "unit": "device"}, Subsampling(0.5, 1.0), 0.5 * len(SIZES)),
    ],
)
def test_event_and_normaliser_per_mode(settings, event, normaliser):
    plan = _plan(**settings)
    assert plan.subsampling == event
    r = plan.round(FDP, server_public_rng(0, 1), OSBits())
    assert r.normaliser == pytest.approx(normaliser)
    assert r.public_counts.sum() == 10


def test_fixed_count_of_nodes_normalises_by_the_chosen_records():
    """k = 2 of 6 nodes (one device each): the chosen devices do all the work,
    the normaliser is q times their records, the event stays at rate q."""
    plan = _plan(nodes_per_round=2)
    assert plan.subsampling == Subsampling(0.2, 1.0)
    for r in range(20):
        rp = plan.round(FDP, server_public_rng(3, r), OSBits())
        chosen = np.flatnonzero(rp.private)
        assert len(chosen) == 2
        assert rp.normaliser == pytest.approx(0.2 * sum(SIZES[d] for d in chosen))
        assert set(np.flatnonzero(rp.public_counts)) <= set(chosen)


def test_node_choice_is_public_device_draw_is_secret():
    """The fixed-count node choice depends on the public stream only; the
    Poisson device draw on the server's secret stream only."""
    plan = _plan(nodes_per_round=3)
    a = plan.round(FDP, server_public_rng(9, 4), OSBits()).private
    b = plan.round(FDP, server_public_rng(9, 4), OSBits()).private
    assert np.array_equal(a, b)
    poisson = _plan(device_sampling_rate=0.5)
    draws = {tuple(poisson.round(FDP, server_public_rng(9, 4), OSBits()).private) for _ in range(30)}
    assert len(draws) > 1  # same public stream, fresh secret draws
    same = {tuple(poisson.round(FDP, server_public_rng(r, r), SeededEntropy(1).device_draw(4, 0)).private)
            for r in range(10)}
    assert len(same) == 1  # the seeded secret stream decides it, not the public one


def test_poisson_device_draw_rate():
    """4000 rounds x 6 devices at p = 0.3: Binomial(24000, 0.3); within 5 s.d."""
    plan = _plan(device_sampling_rate=0.3)
    total = sum(int(plan.round(FDP, server_public_rng(0, r), OSBits()).private.sum()) for r in range(4000))
    n = 4000 * len(SIZES)
    assert abs(total - 0.3 * n) < 5 * np.sqrt(n * 0.3 * 0.7)


def test_device_unit_public_sample_is_independent_of_the_private_draw():
    """Device 0's private and public indicators over 3000 rounds at p = 0.5:
    chi-square test of independence, p > 1e-4."""
    plan = _plan(device_sampling_rate=0.5, unit="device", public_batch_size=5)
    table = np.zeros((2, 2))
    for r in range(3000):
        rp = plan.round(FDP, server_public_rng(0, r), OSBits())
        table[int(rp.private[0]), int(rp.public_counts[0] > 0)] += 1
    assert stats.chi2_contingency(table)[1] > 1e-4


def test_public_phase_asks_no_private_work_and_bounds_follow_the_draw():
    plan = _plan(device_sampling_rate=0.5, unit="device")
    rp = plan.round(PHASES[Mode.PUBLIC], server_public_rng(0, 1), OSBits())
    assert not rp.private.any() and rp.public_counts.sum() == 10
    rp = _plan().round(FDP, server_public_rng(0, 1), OSBits())
    assert plan.record_bound(rp, [0, 2]) == 2  # device unit: one clipped vector per device
    assert _plan().record_bound(rp, [0, 2]) == 12 + 30


def test_nodes_are_ordered_by_their_smallest_device_not_by_transport_ids():
    """The same devices on nodes with other ids get the same choice."""
    s = SamplingSettings(0.2, nodes_per_round=1, public_batch_size=0)
    a = SamplingPlan(s, SIZES, (7, 7, 3, 3, 9, 9))
    b = SamplingPlan(s, SIZES, (900, 900, 12, 12, 5, 5))
    for r in range(10):
        ra = a.round(FDP, server_public_rng(1, r), OSBits()).private
        rb = b.round(FDP, server_public_rng(1, r), OSBits()).private
        assert np.array_equal(ra, rb)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"sampling_rate": 0.0}, "sampling-rate=0.0"),
        ({"device_sampling_rate": 1.5}, "device-sampling-rate=1.5"),
        ({"unit": "device"}, "needs device-sampling-rate"),
        ({"unit": "site"}, "privacy-unit='site'"),
        ({"nodes_per_round": 2, "device_sampling_rate": 0.5}, "not both"),
    ],
)
def test_bad_settings_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingSettings(**{"sampling_rate": 0.2, **kw})


def test_privacy_plan_takes_the_event_from_the_sampling_settings():
    cfg = load_config({"device-sampling-rate": 0.2, "noise-multiplier": 1.0})
    assert sampling_settings(cfg).subsampling == Subsampling(0.05, 0.2)
    plan = resolve(cfg, 1000)
    assert (plan.sampling_rate, plan.participation) == (0.05, 0.2)
    dev = load_config({"device-sampling-rate": 0.2, "privacy-unit": "device", "noise-multiplier": 1.0})
    plan = resolve(dev, 1000, devices=10)
    assert (plan.sampling_rate, plan.participation) == (0.2, 1.0)
    with pytest.raises(ConfigError, match="not both"):
        load_config({"device-sampling-rate": 0.2, "clients-per-round": 3})
