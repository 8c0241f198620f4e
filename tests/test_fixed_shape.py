"""A node's private work has a public shape (fedfdp.contribution, ``BatchShape.PUBLIC``).

Under secure aggregation the server times each node's reply; the private batch is then
processed in :func:`~fedfdp.contribution.batch_slots` rows whatever its realised size.
Properties checked here, each against an independent reference:

* the slot count is a function of public quantities only, and a Poisson batch exceeds
  it with probability at most 2⁻⁸⁰ (scipy's binomial tail, not the Chernoff bound the
  code uses);
* the clipped private sum with padding is the unpadded one: bit for bit with the
  per-record loop engine (record unit), to float32 rounding otherwise (the longer
  reductions of ghost clipping and of the device unit's plain backward add their terms
  in another order: within 1e-5 of the largest coordinate); padding rows of any finite
  content contribute exactly zero;
* the rows the aggregator receives do not depend on the secret coins (an aggregator
  injected through ``ClientParts``, the seam a normal run uses, records them);
* a batch beyond its slots is processed whole (nothing truncated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from fedfdp.clipping import ClipMethod
from fedfdp.config.choices import Mode, PrivacyUnit
from fedfdp.contribution import (
    SLOT_OVERFLOW,
    BatchShape,
    ClientParts,
    DeviceTask,
    PrivateBatch,
    PrivateSum,
    RoundSettings,
    batch_slots,
    clipped_private_sum,
    node_contribution,
    public_shape,
)
from fedfdp.entropy import SeededEntropy
from fedfdp.losses import FeatureMap
from fedfdp.modes import PHASES


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


FMAP = FeatureMap.columns(["a", "b", "c", "d"], private=["d"], view="gaussian")


def tasks(sizes: tuple[int, ...] = (40, 25, 60)) -> list[DeviceTask]:
    rng = np.random.default_rng(3)
    return [DeviceTask(d, rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n), True, 0)
            for d, n in enumerate(sizes)]


def settings(unit: PrivacyUnit = PrivacyUnit.RECORD, method: ClipMethod = ClipMethod.LOOP,
             rate: float = 0.2, round_: int = 1) -> RoundSettings:
    return RoundSettings(round=round_, attempt=0, phase=PHASES[Mode.FDP], sampling_rate=rate,
                         clipping_norm=0.5, unit=unit, clip_method=method)


def flat(grads: list[torch.Tensor] | None) -> torch.Tensor:
    assert grads is not None
    return torch.cat([g.reshape(-1) for g in grads])


@pytest.mark.parametrize(("n", "q"), [(1, 0.5), (16, 0.05), (1000, 0.05), (5000, 0.01), (20000, 0.3)])
def test_a_poisson_batch_exceeds_its_slots_with_probability_below_2_to_minus_80(n: int, q: float) -> None:
    slots = batch_slots(n, q)
    assert 0 < slots <= n and slots >= n * q
    assert stats.binom.sf(slots, n, q) <= SLOT_OVERFLOW <= 2.0**-80
    assert batch_slots(n, q) == slots  # a function of (n, q): nothing else goes in


@pytest.mark.parametrize("round_", [1, 2, 3])
def test_the_padded_sum_is_the_unpadded_one_bit_for_bit_with_the_loop_engine(round_: int) -> None:
    s = settings(PrivacyUnit.RECORD, ClipMethod.LOOP, round_=round_)
    plain = node_contribution(model(), FMAP, s, tasks(), ClientParts(secrets=SeededEntropy(5)))
    padded = node_contribution(model(), FMAP, s, tasks(),
                               ClientParts(secrets=SeededEntropy(5), shape=BatchShape.PUBLIC))
    assert torch.equal(flat(plain.private_sum), flat(padded.private_sum))
    assert plain.unclipped_count == padded.unclipped_count


@pytest.mark.parametrize(("unit", "method"), [(PrivacyUnit.RECORD, ClipMethod.AUTO),
                                              (PrivacyUnit.DEVICE, ClipMethod.LOOP),
                                              (PrivacyUnit.DEVICE, ClipMethod.AUTO)])
def test_the_padded_sum_matches_to_float_rounding_otherwise(unit: PrivacyUnit, method: ClipMethod) -> None:
    s = settings(unit, method)
    plain = node_contribution(model(), FMAP, s, tasks(), ClientParts(secrets=SeededEntropy(8)))
    padded = node_contribution(model(), FMAP, s, tasks(),
                               ClientParts(secrets=SeededEntropy(8), shape=BatchShape.PUBLIC))
    a, b = flat(plain.private_sum), flat(padded.private_sum)
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    assert plain.unclipped_count == padded.unclipped_count


def wild(batch: PrivateBatch, rows: int) -> PrivateBatch:
    """``batch`` padded to ``rows`` with large finite records and labels (not zeros)."""
    extra = rows - len(batch.y)
    x = torch.cat([batch.x, torch.full((extra, batch.x.shape[1]), 1e3)])
    y = torch.cat([batch.y, torch.full((extra,), 2, dtype=batch.y.dtype)])
    return replace(batch, x=x, y=y, sampled=len(batch.y))


def test_padding_rows_of_any_finite_content_contribute_exactly_zero() -> None:
    rng = np.random.default_rng(1)
    x = torch.as_tensor(rng.normal(size=(7, 4)).astype(np.float32))
    y = torch.as_tensor(rng.integers(0, 3, 7))
    gen = torch.Generator().manual_seed(0)
    batch = PrivateBatch(x, y, gen, device_size=50)
    s = settings(PrivacyUnit.RECORD, ClipMethod.LOOP)
    plain = clipped_private_sum(model(), FMAP, s, [replace(batch, padding=torch.Generator().manual_seed(0))])
    padded = clipped_private_sum(model(), FMAP, s, [wild(batch, 30)])
    assert torch.equal(flat(plain.grads), flat(padded.grads))
    assert plain.unclipped == padded.unclipped  # padding rows (norm 0) are not counted


class Recorder:
    """An aggregator that records the rows it is handed, then aggregates honestly."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.sampled: list[int] = []

    def __call__(self, model: nn.Module, decomposition: FeatureMap, settings: RoundSettings,
                 batches: Sequence[PrivateBatch]) -> PrivateSum:
        self.rows.append(sum(len(b.y) for b in batches))
        self.sampled.append(sum(b.size for b in batches))
        return clipped_private_sum(model, decomposition, settings, batches)


@pytest.mark.parametrize("unit", [PrivacyUnit.RECORD, PrivacyUnit.DEVICE])
def test_the_rows_worked_on_do_not_depend_on_the_secret_coins(unit: PrivacyUnit) -> None:
    """30 secret seeds: the realised batch varies, the rows processed do not, and they
    are the public slot count (record unit: of the node's records asked)."""
    recorder = Recorder()
    for seed in range(30):
        parts = ClientParts(secrets=SeededEntropy(seed), aggregate=recorder, shape=BatchShape.PUBLIC)
        node_contribution(model(), FMAP, settings(unit, ClipMethod.AUTO), tasks(), parts)
    assert len(set(recorder.sampled)) > 5
    assert len(set(recorder.rows)) == 1
    want = (batch_slots(125, 0.2) if unit is PrivacyUnit.RECORD
            else sum(batch_slots(n, 0.2) for n in (40, 25, 60)))
    assert recorder.rows[0] == want


def test_the_realised_shape_is_unchanged_by_default() -> None:
    recorder = Recorder()
    for seed in range(10):
        node_contribution(model(), FMAP, settings(), tasks(), ClientParts(secrets=SeededEntropy(seed),
                                                                         aggregate=recorder))
    assert recorder.rows == recorder.sampled and len(set(recorder.rows)) > 1


@pytest.mark.parametrize("unit", [PrivacyUnit.RECORD, PrivacyUnit.DEVICE])
def test_a_batch_beyond_its_slots_is_processed_whole(unit: PrivacyUnit) -> None:
    """A sample larger than the slot count of its device (here: the whole device, drawn
    at a tiny rate) is laid out in a multiple of the slot count, every sampled row kept."""
    rng = np.random.default_rng(2)
    x = torch.as_tensor(rng.normal(size=(40, 4)).astype(np.float32))
    y = torch.as_tensor(rng.integers(0, 3, 40))
    batch = PrivateBatch(x, y, torch.Generator().manual_seed(4), device_size=2000)
    rate = 0.001
    slots = batch_slots(2000, rate)
    assert slots < 40
    (padded, *rest) = public_shape([batch], unit, rate)
    total = len(padded.y) + sum(len(b.y) for b in rest)
    assert total % slots == 0 and total >= 40 and total - 40 < slots
    s = settings(unit, ClipMethod.LOOP, rate=rate)
    plain = clipped_private_sum(model(), FMAP, s, [replace(batch, padding=torch.Generator().manual_seed(4))])
    again = clipped_private_sum(model(), FMAP, s, [padded, *rest])
    a, b = flat(plain.grads), flat(again.grads)
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())


@pytest.mark.parametrize(("aggregation", "shape"),
                         [("plain", BatchShape.REALISED), ("secagg", BatchShape.PUBLIC)])
def test_a_secure_aggregation_node_lays_out_its_batch_in_public_slots(aggregation: str,
                                                                     shape: BatchShape) -> None:
    """The node runtime a SuperNode builds from Flower's run config: under secure
    aggregation (the server times the replies) its parts have the public shape."""
    from clients.node_runtime import NodeCache
    from fedfdp.config import load_config
    from tests.flower_helpers import node_context

    keys = {"num-devices": 4, "records-per-device": 20, "progress": False, "aggregation": aggregation}
    if aggregation == "secagg":
        keys |= {"secagg-min-survivors": 3, "mode": "dp", "noise-multiplier": 1.0}
    cfg = load_config(keys)
    runtime = NodeCache().runtime(cfg.to_flat(), node_context(cfg, 0, 2).node_config)
    assert runtime.plan.parts.shape is shape
