"""Many devices per SuperNode: the same run on one node per device and on fewer nodes.

A node serves every device of its partition (device ``d`` on partition
``d mod P``) in one call per round; the sampling plan, the accounting and the
ledger must not depend on how the devices are packed into SuperNodes. With the
reproducible opt-in (``reproducible-noise = true``: every secret stream from the
seed, per device), the same configuration run on 5 nodes (one per device) and
on 2 or 1 nodes (several devices each) must write the same ledger, the same
normaliser and ε per round, and end at the same model up to the order of float
summation. Messages go through the real ClientApp (:func:`clients.client_app.make_client_app`,
with its per-process node cache) and the real strategy.

Also here: the ClientApp's per-process cache (built once, rebuilt when the
configuration, the node or a site file changes) and sites with several devices'
files (``device-ids`` in the node config).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import Message, RecordDict, UserConfig

from clients import client_app
from clients.node_runtime import NodeCache, node_records
from fedfdp import protocol as P
from fedfdp.algorithm import run_centralised
from fedfdp.config import load_config
from fedfdp.contribution import trainable
from fedfdp.data import load_dataset
from fedfdp.run_plan import build_plan
from strategies.fdp_strategy import FDPStrategy, NodeChoice
from strategies.transport import exchange
from tests.flower_helpers import InProcessGrid, node_context, node_runtime_for, registered_strategy
from tests.mechanism_helpers import ledger_doc
from tests.site_tables import DECLARED, PHONES


class PackedGrid(InProcessGrid):
    """Delivers messages to the real ClientApp of ``partitions`` nodes (node id =
    partition id; partition ``k`` serves devices ``d`` with ``d mod P = k``)."""

    def __init__(self, cfg, partitions: int, **kwargs) -> None:
        super().__init__(cfg, **kwargs)
        self.partitions = partitions
        self.app = client_app.make_client_app(cfg.to_flat())
        self.sent: list[int] = []  # messages per exchange

    def get_node_ids(self) -> list[int]:
        return list(range(self.partitions))

    def push_messages(self, messages):
        messages = list(messages)
        self.sent.append(len(messages))
        return super().push_messages(messages)

    def answer(self, msg):
        return self.app(msg, node_context(self.cfg, msg.metadata.dst_node_id, self.partitions))


MODES: dict[str, dict[str, object]] = {
    "record, every device": {},
    "record, 2 of 5 devices": {"clients-per-round": 2},
    "record, Poisson devices": {"device-sampling-rate": 0.5},
    "device unit, Poisson devices": {"privacy-unit": "device", "device-sampling-rate": 0.5},
}


def _run(cfg_map, tmp_path, name, partitions):
    cfg = load_config({**cfg_map, "out-dir": str(tmp_path / name)})
    data = load_dataset(cfg.data)
    strat = FDPStrategy(build_plan(cfg, data), node_choice=NodeChoice.DEVICES)
    grid = PackedGrid(cfg, partitions)
    strat.start(grid)
    return strat, grid


@pytest.mark.parametrize("name", list(MODES))
@pytest.mark.parametrize("mode", ["fdp", "dp"])
def test_packing_devices_into_fewer_nodes_changes_nothing(name, mode, tmp_path):
    """5 devices, 4 rounds on 5, 2 and 1 SuperNodes, and the centralised engine:
    the same ledger, normalisers and ε per round, the same final model."""
    cfg_map = {
        "mode": mode, "num-devices": 5, "records-per-device": 30, "noise-multiplier": 1.2,
        "sampling-rate": 0.3, "public-batch-size": 12, "num-rounds": 4, "seed": 7,
        "reproducible-noise": True, "progress": False, "model": "mlp", "hidden-size": 8, **MODES[name],
    }
    runs = {p: _run(cfg_map, tmp_path, f"p{p}", p) for p in (5, 2, 1)}
    _, central_rows = run_centralised(load_config({**cfg_map, "out-dir": str(tmp_path / "central")}))
    ledgers = {k: ledger_doc(tmp_path / k)
               for k in ("p5", "p2", "p1", "central")}
    reference, _ = runs[5]
    for p, (strat, grid) in runs.items():
        assert len(strat.registry) == p
        assert max(grid.sent[1:]) <= p  # one message per node and round, whatever its devices
        assert len(strat.rows) == 4
        for a, b, c in zip(strat.rows, reference.rows, central_rows, strict=True):
            assert a["epsilon"] == b["epsilon"] == c["epsilon"]
            np.testing.assert_allclose(a["normaliser"], b["normaliser"], rtol=1e-12)
            np.testing.assert_allclose(a["normaliser"], c["normaliser"], rtol=1e-12)
        # the same mechanism and charges, entry for entry (the hash chains are identical)
        assert ledgers[f"p{p}"]["entries"] == ledgers["central"]["entries"]
        for x, y in zip(trainable(strat.model), trainable(reference.model), strict=True):
            torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-4, atol=1e-6)
    # and the same as the one-node-per-device strategy of the existing equivalence tests
    classic = load_config({**cfg_map, "out-dir": str(tmp_path / "classic")})
    one_per_device = registered_strategy(classic)
    one_per_device.registry = {}
    one_per_device.start(InProcessGrid(classic))
    for x, y in zip(trainable(one_per_device.model), trainable(reference.model), strict=True):
        torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-4, atol=1e-6)
    central_model = trainable(run_centralised(load_config({**cfg_map, "out-dir": ""}))[0])
    for x, y in zip(trainable(reference.model), central_model, strict=True):
        torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-4, atol=1e-6)


def test_clients_per_round_chooses_supernodes_in_a_deployment(tmp_path):
    """``node_choice="supernodes"`` (a deployment's default): ``clients-per-round = 1``
    on 2 SuperNodes asks one node, with all its devices; ``"devices"`` asks one device."""
    base = {"num-devices": 6, "records-per-device": 20, "noise-multiplier": 1.0,
            "num-rounds": 1, "clients-per-round": 1, "progress": False, "reproducible-noise": True}
    cfg = load_config(base)
    data = load_dataset(cfg.data)
    asked = {}
    for choice in ("supernodes", "devices"):
        strat = FDPStrategy(build_plan(cfg, data), node_choice=choice)
        grid = PackedGrid(cfg, 2)
        strat.start(grid)
        assert strat.rows[0]["asked"] == 1  # one SuperNode asked either way
        asked[choice] = sorted(d for node in strat.orders.asked.values() for d in node.devices)
    assert asked["supernodes"] in ([0, 2, 4], [1, 3, 5])
    assert len(asked["devices"]) == 1
    with pytest.raises(ValueError, match="node_choice='sites'"):
        FDPStrategy(build_plan(cfg, data), node_choice="sites")


# ------------------------------------------------------------------ the per-process cache
def test_node_runtime_is_built_once_per_configuration_and_node():
    cache = NodeCache()
    cfg = load_config({"num-devices": 4, "records-per-device": 20, "progress": False})
    run = cfg.to_flat()
    ctx0, ctx1 = node_context(cfg, 0, 2).node_config, node_context(cfg, 1, 2).node_config
    a = cache.runtime(run, ctx0)
    assert cache.runtime(run, ctx0) is a
    assert cache.runtime(dict(run), dict(ctx0)) is a  # an equal run config and node config: the same runtime
    b = cache.runtime(run, ctx1)
    assert b is not a and sorted(b.records.devices) == [1, 3] and sorted(a.records.devices) == [0, 2]
    other = load_config({"num-devices": 4, "records-per-device": 20, "progress": False, "seed": 5})
    assert cache.runtime(other.to_flat(), ctx0) is not a
    # beyond its capacity the least recently used runtime is dropped and built again
    small = NodeCache(size=1, limit=1)
    first = small.runtime(run, ctx0)
    small.runtime(run, ctx1)
    assert small.runtime(run, ctx0) is not first
    # a process serving every node of a run (num-partitions = 2) keeps each one's runtime
    per_node = NodeCache(size=1)
    first, second = per_node.runtime(run, ctx0), per_node.runtime(run, ctx1)
    assert per_node.capacity() == 2
    assert per_node.runtime(run, ctx0) is first and per_node.runtime(run, ctx1) is second
    with pytest.raises(ValueError, match="size=0"):
        NodeCache(size=0)
    with pytest.raises(ValueError, match="limit=1"):
        NodeCache(size=2, limit=1)


def test_cached_runtime_gives_the_same_reply_as_a_fresh_build():
    """Round 2 on a cached runtime (model reloaded, streams per round) equals a fresh
    build; with OS entropy the private sums of two calls differ (fresh coins)."""
    cfg = load_config({"num-devices": 4, "records-per-device": 30, "progress": False, "noise-multiplier": 1.0,
                       "reproducible-noise": True, "model": "mlp", "hidden-size": 8})
    strat = registered_strategy(cfg)
    ctx = node_context(cfg, 1)
    runtime = NodeCache().runtime(cfg.to_flat(), ctx.node_config)
    for r in (1, 2):
        msg = next(m for m in _train(strat, r) if m.metadata.dst_node_id == 1)
        state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
        config = msg.content.config_records[P.CONFIG]
        cached = runtime.train(state, config)
        fresh = node_runtime_for(cfg, runtime.records).train(state, config)
        for got, want in ((cached[0], fresh[0]), (cached[1], fresh[1])):  # private, public sums
            assert got is not None and want is not None
            for k in got:
                assert torch.equal(got[k], want[k])
        strat.collect(r, [])  # finish the round (no replies) so that the next can begin


def _train(strat, r):
    from flwr.app import ArrayRecord, ConfigRecord

    return list(strat.configure_train(r, ArrayRecord(strat.model.state_dict()), ConfigRecord(), None))


# ------------------------------------------------------------------ a site with several devices
def _node_cfg(folder):
    return load_config({**DECLARED, "data-location": "node", "num-devices": len(PHONES),
                        "test-path": str(folder / "heldout.csv"), "public-batch-size": 16,
                        "sampling-rate": 0.2, "noise-multiplier": 1.0, "num-rounds": 2,
                        "progress": False})


def _ctx(cfg, node_config):
    from flwr.app import Context

    return Context(run_id=1, node_id=0, node_config=node_config, state=RecordDict(), run_config={})


def test_a_site_serves_several_devices_files(sites):
    folder, _ = sites  # the folder of site files
    cfg = _node_cfg(folder)
    sizes = [len(pd.read_csv(folder / f"site-{k}.csv")) for k in range(3)]
    listed = node_records(
        cfg.data, {"device-ids": "0,2", "data-path": f"{folder}/site-0.csv,{folder}/site-2.csv"})
    templated = node_records(cfg.data, {"device-ids": "2,0", "data-path": f"{folder}/site-{{device}}.csv"})
    for records in (listed, templated):
        info = client_app.handle_query(records)
        assert info[P.DEVICE_IDS] == [0, 2] and info[P.DEVICE_SIZES] == [sizes[0], sizes[2]]
    bad = [
        ({"device-ids": "0,2", "data-path": f"{folder}/site-0.csv"}, "need one file per device"),
        ({"device-ids": "0,0", "data-path": f"{folder}/site-{{device}}.csv"}, "need distinct device numbers"),
        ({"device-ids": "0,3", "data-path": f"{folder}/site-{{device}}.csv"}, r"in 0\.\.2"),
        ({"device-ids": "a", "data-path": f"{folder}/site-0.csv"}, "comma-separated integers"),
    ]
    for node_config, fragment in bad:
        with pytest.raises(ValueError, match=fragment):
            node_records(cfg.data, node_config)


class SiteGrid(InProcessGrid):
    """Delivers messages to the real ClientApp of nodes with the given node configs."""

    def __init__(self, cfg, nodes) -> None:
        super().__init__(cfg)
        self.nodes, self.app = nodes, client_app.make_client_app(cfg.to_flat())

    def get_node_ids(self):
        return list(self.nodes)

    def answer(self, msg):
        return self.app(msg, _ctx(self.cfg, self.nodes[msg.metadata.dst_node_id]))


def test_two_sites_with_three_devices_train_like_three_sites(sites, tmp_path):
    """One SuperNode holding devices 0 and 2, another holding device 1: the same
    N, the same ledger and ε per round as three one-device sites (site data is a
    deployment: OS entropy only, so the models differ by their noise)."""
    folder, _ = sites  # the folder of site files
    base = {**DECLARED, "data-location": "node", "num-devices": 3, "test-path": str(folder / "heldout.csv"),
            "public-batch-size": 16, "sampling-rate": 0.2, "noise-multiplier": 1.0,
            "num-rounds": 2, "progress": False, "seed": 3}
    layouts = {
        "three": {k: {"partition-id": k, "num-partitions": 3, "data-path": f"{folder}/site-{k}.csv"}
                  for k in range(3)},
        "two": {0: {"device-ids": "0,2", "data-path": f"{folder}/site-{{device}}.csv"},
                1: {"device-ids": "1", "data-path": f"{folder}/site-1.csv"}},
    }
    results = {}
    for name, nodes in layouts.items():
        cfg = load_config({**base, "out-dir": str(tmp_path / name)})
        from fedfdp.data import load_server_data

        strat = FDPStrategy(build_plan(cfg, load_server_data(cfg.data)))
        strat.start(SiteGrid(cfg, nodes))
        results[name] = strat
    a, b = results["three"], results["two"]
    assert [r["epsilon"] for r in a.rows] == [r["epsilon"] for r in b.rows]
    assert [r["asked"] for r in b.rows] == [2, 2]
    assert a.num_records == b.num_records and len(b.registry) == 2
    la, lb = (ledger_doc(tmp_path / n) for n in ("three", "two"))
    assert la["entries"] == lb["entries"]  # the same mechanism and charges: identical hash chains


# ------------------------------------------------------------------ the strategy's polling
class _SlowGrid(InProcessGrid):
    """A Grid whose (empty) replies can be pulled only from the ``delay_polls``-th poll on."""

    def __init__(self, delay_polls: int) -> None:
        super().__init__(load_config({"num-devices": 2, "progress": False}))
        self.delay = delay_polls
        self.polls = 0

    def answer(self, msg):
        return Message(RecordDict(), reply_to=msg)

    def pull_messages(self, message_ids):
        self.polls += 1
        return [] if self.polls < self.delay else super().pull_messages(message_ids)


def test_exchange_polls_until_every_reply_or_the_timeout():
    grid = _SlowGrid(delay_polls=4)
    msgs = [Message(RecordDict(), message_type="query", dst_node_id=n) for n in (1, 2)]
    replies = exchange(grid, msgs, timeout=5.0)
    assert len(replies) == 2 and grid.polls == 4
    assert {r.metadata.reply_to_message_id for r in replies} == {m.metadata.message_id for m in msgs}
    slow = _SlowGrid(delay_polls=10**9)
    msgs = [Message(RecordDict(), message_type="query", dst_node_id=n) for n in (1, 2)]
    assert exchange(slow, msgs, timeout=0.2) == []


# ------------------------------------------------------------------ fedfdp run's simulation apps
def test_simulation_apps_accept_the_reproducible_opt_in_only_on_the_simulation_runtime():
    """``fedfdp run``'s ServerApp refuses any grid but the Simulation Runtime's;
    its ClientApp takes ``reproducible-noise`` from the run config, which the
    deployment ClientApp refuses."""
    from flwr.app import Context

    from fedfdp.config import ConfigError
    from strategies.server_app import simulation_app

    run_config: UserConfig = {"reproducible-noise": True, "num-devices": 2, "progress": False}
    ctx = Context(run_id=1, node_id=0, node_config={"partition-id": 0, "num-partitions": 2},
                  state=RecordDict(), run_config=run_config)
    with pytest.raises(ConfigError, match="runs only on Flower's Simulation Runtime"):
        simulation_app(InProcessGrid(load_config(run_config)), ctx)
    query = Message(RecordDict(), message_type="query", dst_node_id=0)
    reply = client_app.simulation_app(query, ctx)
    assert reply.content[P.METRICS][P.DEVICE_IDS] == [0]
    with pytest.raises(ConfigError, match="refused by a ClientApp reading Flower's run config"):
        client_app.app(query, ctx)
