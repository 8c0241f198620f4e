"""Poisson device sampling and the device-level privacy unit through the real
client and strategy: draw rates, independence of the public device sample,
the per-device clip, and what the accountant is charged."""

import itertools

import numpy as np
import torch
from scipy import stats

from fedfdp import protocol as P
from fedfdp.accounting import FDPAccountant, SubsampledGaussian
from fedfdp.config import Mode, PrivacyUnit, load_config
from fedfdp.contribution import DeviceTask, RoundSettings, node_contribution
from fedfdp.data import load_dataset
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.run_plan import feature_map_for
from tests.flower_helpers import InProcessGrid, registered_strategy, train_messages
from tests.mechanism_helpers import resolve

BASE = {"num-devices": 40, "records-per-device": 12, "noise-multiplier": 1.0,
        "sampling-rate": 0.5, "public-batch-size": 30, "progress": False}


def _flags(cfg, rounds):
    strat = registered_strategy(cfg)
    priv, pub = [], []
    for r in range(1, rounds + 1):
        seen = {}
        for msg in train_messages(strat, r):
            c = P.TrainInstruction.from_config(msg.content.config_records[P.CONFIG])
            for d, f, k in zip(c.device_ids, c.private_flags, c.public_counts, strict=True):
                seen[d] = (int(f), k)  # the flag as sent: 0 or 1
        priv.append([seen.get(d, (0, 0))[0] for d in range(40)])
        pub.append([int(seen.get(d, (0, 0))[1] > 0) for d in range(40)])
    return np.array(priv), np.array(pub)


def test_poisson_device_sampling_rate_and_accounting():
    """200 rounds x 40 devices at p = 0.3: the number of private draws is
    Binomial(8000, 0.3); accept within 5 s.d. The record unit is charged the
    participation mixture (rate q, participation p) — never rate p·q, which
    ignores that device-mates reveal the draw."""
    cfg = load_config({**BASE, "device-sampling-rate": 0.3})
    priv, _ = _flags(cfg, 200)
    n = priv.size
    assert abs(priv.sum() - 0.3 * n) < 5 * np.sqrt(n * 0.3 * 0.7)
    plan = resolve(cfg, 480)
    assert (plan.sampling_rate, plan.participation) == (0.5, 0.3)
    mixture, plain, product = FDPAccountant(), FDPAccountant(), FDPAccountant()
    mixture.compose(SubsampledGaussian(1.0, 0.5, participation=0.3), 50)
    plain.compose(SubsampledGaussian(1.0, 0.5), 50)
    product.compose(SubsampledGaussian(1.0, 0.3 * 0.5), 50)
    # the exact mixture sits between the invalid p·q amplification and no amplification
    assert product.epsilon(1e-5) < mixture.epsilon(1e-5) < plain.epsilon(1e-5)


def test_device_unit_public_sample_independent_of_private_sample():
    """Device unit: private and public device samples are independent draws
    (chi-square on device 0's two indicators over 600 rounds, p > 1e-4)."""
    cfg = load_config({**BASE, "privacy-unit": "device", "device-sampling-rate": 0.5})
    priv, pub = _flags(cfg, 600)
    table = np.zeros((2, 2))
    for a, b in zip(priv[:, 0], pub[:, 0], strict=True):
        table[a, b] += 1
    assert stats.chi2_contingency(table)[1] > 1e-4
    plan = resolve(cfg, 480, devices=cfg.data.num_devices)
    assert (plan.sampling_rate, plan.participation) == (0.5, 1.0)


def test_device_contribution_is_clipped_as_a_whole():
    cfg = load_config({**BASE, "num-devices": 2, "records-per-device": 200, "sampling-rate": 1.0})
    data = load_dataset(cfg.data)
    model = build_model_for(cfg.training, data)
    dec = feature_map_for(cfg, data)
    dev = data.devices[0]
    for phase in (PHASES[Mode.FDP], PHASES[Mode.DP]):
        settings = RoundSettings(1, 0, phase, sampling_rate=1.0, clipping_norm=0.01, unit=PrivacyUnit.DEVICE)
        out = node_contribution(model, dec, settings, [DeviceTask(0, dev.x, dev.y, True, 0)])
        assert out.private_sum is not None
        zero = torch.zeros((), dtype=torch.float64)
        norm = torch.sqrt(sum(((g.double() ** 2).sum() for g in out.private_sum), zero))
        assert norm <= 0.01 * (1 + 1e-6)
        assert norm > 0.009  # the device mean gradient is much larger than C: clipped to C
    settings = RoundSettings(1, 0, PHASES[Mode.FDP], sampling_rate=1.0, clipping_norm=0.01)
    skipped = node_contribution(model, dec, settings, [DeviceTask(0, dev.x, dev.y, False, 3)])
    assert skipped.private_sum is not None
    assert all((g == 0).all() for g in skipped.private_sum) and skipped.public_count == 3


def test_record_unit_node_sum_equals_sum_of_per_device_clipped_sums():
    """A node's record-unit private sum is one clipped sum over the union of its
    devices' batches: equal to the per-device sums added (q = 1, so the
    batches are the whole devices)."""
    cfg = load_config({**BASE, "num-devices": 3, "records-per-device": 20, "sampling-rate": 1.0})
    data = load_dataset(cfg.data)
    model = build_model_for(cfg.training, data)
    dec = feature_map_for(cfg, data)
    settings = RoundSettings(1, 0, PHASES[Mode.DP], sampling_rate=1.0, clipping_norm=0.05)
    tasks = [DeviceTask(d, dev.x, dev.y, True, 0) for d, dev in enumerate(data.devices)]
    union = node_contribution(model, dec, settings, tasks).private_sum
    assert union is not None
    parts = []
    for t in tasks:
        part = node_contribution(model, dec, settings, [t]).private_sum
        assert part is not None
        parts.append(part)
    for u, *ps in zip(union, *parts, strict=True):
        torch.testing.assert_close(u, sum(ps), rtol=1e-5, atol=1e-6)


def test_device_unit_runs_end_to_end():
    cfg = load_config({**BASE, "num-devices": 6, "privacy-unit": "device", "device-sampling-rate": 0.5,
                       "num-rounds": 4})
    strat = registered_strategy(cfg)
    strat.registry = {}
    strat.start(InProcessGrid(cfg))
    rows = strat.rows
    eps = [r["epsilon"] for r in rows]
    assert len(rows) == 4 and all(b > a for a, b in itertools.pairwise(eps))
    assert all(r["rejected"] == 0 for r in rows)
