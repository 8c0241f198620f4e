"""Poisson device sampling and the device-level privacy unit."""

import itertools

import numpy as np
import torch
from scipy import stats

from fedfdp import protocol as P
from fedfdp.accounting import FDPAccountant
from fedfdp.algorithm import build_decomposition, build_model_for
from fedfdp.budget import plan_privacy
from fedfdp.config import load_config
from fedfdp.contribution import device_contribution
from fedfdp.data import load_dataset
from fedfdp.modes import PHASES
from fedfdp.sampling import DeviceStreams
from tests.flower_helpers import InProcessGrid, registered_strategy, train_messages

BASE = {"num-devices": 40, "records-per-device": 12, "noise-multiplier": 1.0, "target-epsilon": 0,
        "sampling-rate": 0.5, "public-batch-size": 30, "progress": False, "hidden-size": 8}


def _flags(cfg, rounds):
    strat = registered_strategy(cfg)
    priv, pub = [], []
    for r in range(1, rounds + 1):
        seen = {}
        for msg in train_messages(strat, r):
            c = msg.content[P.CONFIG]
            for d, f, k in zip(c[P.DEVICE_IDS], c[P.PRIVATE_FLAGS], c[P.PUBLIC_COUNTS], strict=True):
                seen[d] = (f, k)
        priv.append([seen.get(d, (0, 0))[0] for d in range(40)])
        pub.append([int(seen.get(d, (0, 0))[1] > 0) for d in range(40)])
    return np.array(priv), np.array(pub)


def test_poisson_device_sampling_rate_and_accounting():
    """200 rounds x 40 devices at p = 0.3: the number of private draws is
    Binomial(8000, 0.3); accept within 5 s.d. Accounting uses p·q."""
    cfg = load_config({**BASE, "device-sampling-rate": 0.3})
    priv, _ = _flags(cfg, 200)
    n = priv.size
    assert abs(priv.sum() - 0.3 * n) < 5 * np.sqrt(n * 0.3 * 0.7)
    plan = plan_privacy(cfg, 480)
    assert plan.sampling_rate == 0.3 * 0.5
    amplified, plain = FDPAccountant(), FDPAccountant()
    amplified.compose(1.0, plan.sampling_rate, 50)
    plain.compose(1.0, 0.5, 50)
    assert amplified.epsilon(1e-5) < plain.epsilon(1e-5)  # device sampling amplifies


def test_device_unit_public_sample_independent_of_private_sample():
    """Device unit: private and public device samples are independent draws
    (chi-square on device 0's two indicators over 600 rounds, p > 1e-4)."""
    cfg = load_config({**BASE, "privacy-unit": "device", "device-sampling-rate": 0.5})
    priv, pub = _flags(cfg, 600)
    table = np.zeros((2, 2))
    for a, b in zip(priv[:, 0], pub[:, 0], strict=True):
        table[a, b] += 1
    assert stats.chi2_contingency(table)[1] > 1e-4
    assert plan_privacy(cfg, 480).sampling_rate == 0.5


def test_device_contribution_is_clipped_as_a_whole():
    cfg = load_config({**BASE, "num-devices": 2, "records-per-device": 200, "sampling-rate": 1.0})
    data = load_dataset(cfg.data)
    model = build_model_for(cfg, data)
    dec = build_decomposition(cfg, data)
    for phase in (PHASES["fdp"], PHASES["dp"]):
        out = device_contribution(model, dec, phase, data.devices[0].x, data.devices[0].y,
                                  sampling_rate=1.0, clipping_norm=0.01, public_count=0,
                                  streams=DeviceStreams.for_round(0, 1, 0), unit="device")
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in out.private_sum))
        assert norm <= 0.01 * (1 + 1e-6)
        assert norm > 0.009  # the device mean gradient is much larger than C: clipped to C
    skipped = device_contribution(model, dec, PHASES["fdp"], data.devices[0].x, data.devices[0].y,
                                  sampling_rate=1.0, clipping_norm=0.01, public_count=3,
                                  streams=DeviceStreams.for_round(0, 1, 0), private=False)
    assert all((g == 0).all() for g in skipped.private_sum) and skipped.public_count == 3


def test_device_unit_runs_end_to_end():
    cfg = load_config({**BASE, "num-devices": 6, "privacy-unit": "device", "device-sampling-rate": 0.5,
                       "num-rounds": 4})
    strat = registered_strategy(cfg)
    strat.registry = {}
    rows = strat.start(InProcessGrid(cfg))
    eps = [r["epsilon"] for r in rows]
    assert len(rows) == 4 and all(b > a for a, b in itertools.pairwise(eps))
    assert all(r["rejected"] == 0 for r in rows)
