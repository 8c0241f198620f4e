"""Secure aggregation wired into Flower: the strategy's four-stage round against the real
ClientApp (in-process Grid: every reply is the real ClientApp's, through
``ClientApp.__call__`` with one persistent ``Context`` per node), and ``fedfdp run`` on
Flower's simulation engine (slow).

What is checked, with independent references:

* the strategy only ever receives masked ``uint32`` vectors and public sums (no private
  array, no count of vectors within C);
* the printed ε equals ``min(route A upper, route B)`` recomputed from the ledger's events
  by :func:`route_a_epsilon` and :func:`route_b_epsilon` directly;
* a round below ``n_min`` survivors aborts: model, optimizer and ledger unchanged;
* with zero private sums the decoded aggregate's variance is
  ``σ²C²(1 + √d/s)²·|U3|/(n_min − t_c)`` (discrete Gaussian variance to ≤ 1e-9 relative
  at these σ_loc) within 5 standard errors of a variance estimate over ``d`` coordinates;
* equal ``seed``s give different noise (secret randomness from the OS CSPRNG);
* resume replays the distributed events.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Error, Message

import clients.secagg_handlers as handlers
from clients.client_app import make_client_app
from fedfdp import protocol as P
from fedfdp.accounting.distributed import (
    DistributedDiscreteGaussian,
    route_a_epsilon,
    route_b_epsilon,
)
from fedfdp.config import Config, ConfigError, load_config
from fedfdp.data import load_dataset
from fedfdp.evaluation import held_out_evaluation
from fedfdp.run_plan import build_plan
from fedfdp.secagg.wire import MASKED, PUBLIC_SUM
from strategies.fdp_strategy import FDPStrategy
from tests.flower_helpers import InProcessGrid, node_context
from tests.mechanism_helpers import written_ledger

#: ``fail(node, message_type) -> True``: that node's handler raises for that message.
Fail = Callable[[int, str], bool]


class ClientAppGrid(InProcessGrid):
    """Every message answered by the real ClientApp (``make_client_app(cfg.to_flat())``) with one
    persistent ``Context`` per node, as a SuperNode keeps it; a raised handler becomes an
    error reply, as Flower sends it. ``seen`` keeps every reply the strategy receives."""

    def __init__(self, cfg: Config, fail: Fail | None = None, partitions: int | None = None) -> None:
        super().__init__(cfg)
        self.app = make_client_app(cfg.to_flat())
        self.fail = fail
        self.partitions = partitions  # SuperNodes, each serving a partition (default: one per device)
        self.contexts: dict[int, Context] = {}
        self.seen: list[tuple[str, int, Message]] = []

    def get_node_ids(self) -> list[int]:
        return list(range(self.partitions or self.cfg.data.num_devices))

    def answer(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        context = self.contexts.setdefault(node, node_context(self.cfg, node, self.partitions))
        try:
            if self.fail is not None and self.fail(node, msg.metadata.message_type):
                raise RuntimeError(f"node {node} fails at {msg.metadata.message_type}")
            reply = self.app(msg, context)
        except Exception as exc:
            reply = Message(error=Error(code=0, reason=str(exc)), reply_to=msg)
        self.seen.append((msg.metadata.message_type, node, reply))
        return reply


def secagg_config(**extra: Any) -> Config:
    base = {
        "dataset": "fleet", "num-devices": 4, "records-per-device": 60, "num-rounds": 3,
        "aggregation": "secagg", "secagg-min-survivors": 3, "progress": False, "round-timeout": 30.0,
        "secagg-timeout": 30.0, "node-wait-timeout": 10.0,
    }
    return load_config({**base, **extra})


def run_strategy(
    cfg: Config, fail: Fail | None = None, evaluate: Any = None
) -> tuple[FDPStrategy, ClientAppGrid, dict[str, Any]]:
    data = load_dataset(cfg.data)
    plan = build_plan(cfg, data, num_devices=len(data.devices),
                      evaluate=evaluate or held_out_evaluation(data.test_x, data.test_y))
    initial = copy.deepcopy(plan.model.state_dict())
    strat = FDPStrategy(plan)
    grid = ClientAppGrid(cfg, fail)
    strat.start(grid, ArrayRecord(plan.model.state_dict()))
    return strat, grid, initial


def printed_from_ledger(events: list[Any], delta: float) -> float:
    """min(route A upper, route B) of the ledger's events, computed directly."""
    assert events and all(isinstance(e, DistributedDiscreteGaussian) for e in events)
    return min(route_a_epsilon(events, delta).upper, route_b_epsilon(events, delta))


# ----------------------------------------------------------------- the round, in-process


def test_secagg_round_trains_and_the_printed_epsilon_is_the_ledgers():
    cfg = secagg_config()
    strat, _grid, initial = run_strategy(cfg)
    assert strat.stop_reason is None
    assert [r["round"] for r in strat.rows] == [1, 2, 3]
    ledger, mechanism = strat.ledger, strat.mechanism
    assert ledger is not None and mechanism is not None
    events = ledger.events()
    assert len(events) == 3
    plan = mechanism.secagg
    assert plan is not None
    assert events[0] == DistributedDiscreteGaussian(plan.local_sigma, 3, plan.scale, plan.dimension,
                                                    cfg.privacy.sampling_rate)
    want = printed_from_ledger(events, mechanism.delta)
    assert strat.rows[-1]["epsilon"] == pytest.approx(want, rel=1e-12)
    assert want <= 2.0  # calibrated to the default target, route A (the smaller) at most 2
    # the model moved (the rounds stepped) and stayed finite
    moved = any(not torch.equal(initial[k], v) for k, v in strat.model.state_dict().items())
    assert moved and all(torch.isfinite(v).all() for v in strat.model.state_dict().values())


def test_the_strategy_receives_only_masked_uint32_vectors_and_public_sums():
    cfg = secagg_config(**{"num-rounds": 2})
    strat, grid, _ = run_strategy(cfg)
    assert strat.mechanism is not None and strat.mechanism.secagg is not None
    d = strat.mechanism.secagg.dimension
    collects = [(node, reply) for kind, node, reply in grid.seen if kind == "train.sa_collect"]
    assert len(collects) == 2 * 4
    for _, reply in collects:
        arrays = reply.content.array_records
        assert set(arrays) == {MASKED}  # no 'private' record
        assert set(arrays[MASKED]) == {MASKED, PUBLIC_SUM}
        masked = arrays[MASKED][MASKED].numpy()
        assert masked.dtype == np.uint32 and masked.shape == (d,)
        public = arrays[MASKED][PUBLIC_SUM].numpy()
        assert public.dtype == np.float32 and public.shape == (d,) and np.isfinite(public).all()
        assert P.UNCLIPPED_COUNT not in reply.content.metric_records[P.METRICS]
    for kind, _, reply in grid.seen:  # no other stage carries arrays at all
        if kind != "train.sa_collect" and not reply.has_error():
            assert kind == "query" or not reply.content.array_records
    # a masked vector looks uniform: its top bit is set about half the time (d coordinates)
    top = np.concatenate([r.content.array_records[MASKED][MASKED].numpy() >> 31 for _, r in collects])
    assert abs(top.mean() - 0.5) < 5 * 0.5 / math.sqrt(top.size)


def test_a_round_below_min_survivors_aborts_leaving_model_and_ledger_unchanged():
    cfg = secagg_config(**{"secagg-min-survivors": 4})
    strat, grid, initial = run_strategy(cfg, fail=lambda node, kind: node == 2 and kind == "train.sa_collect")
    assert strat.stop_reason is not None and "aborted" in strat.stop_reason
    assert strat.ledger is not None
    assert strat.rows == [] and strat.ledger.charges == []
    for k, v in strat.model.state_dict().items():
        assert torch.equal(initial[k], v), k
    # no unmask request was ever sent
    assert not any(kind == "train.sa_unmask" for kind, _, _ in grid.seen)


def test_a_dropout_at_collect_above_min_survivors_is_charged_the_planned_event():
    cfg = secagg_config(**{"num-rounds": 2})
    strat, _grid, _ = run_strategy(cfg, fail=lambda node, kind: node == 1 and kind == "train.sa_collect")
    assert strat.stop_reason is None and len(strat.rows) == 2
    assert [r["replies"] for r in strat.rows] == [3, 3]
    ledger, mechanism = strat.ledger, strat.mechanism
    assert ledger is not None and mechanism is not None
    assert all(e == mechanism.event for e in ledger.events())


def test_the_public_sum_is_packed_as_one_exact_float32_vector():
    """pack_public then unpack_public gives back the float32 sums bit for bit, in the model's
    order; a packed field of another dtype, rank or length is refused in one line naming it."""
    from fedfdp.secagg.errors import MessageError
    from fedfdp.secagg.wire import pack_public, unpack_public

    rng = np.random.default_rng(3)
    shapes = {"0.weight": (5, 58), "0.bias": (5,), "2.weight": (3, 5)}
    sums = {n: rng.standard_normal(s).astype(np.float32) * 1e3 for n, s in shapes.items()}
    flat = pack_public(sums, list(shapes))
    assert flat.dtype == np.float32 and flat.shape == (5 * 58 + 5 + 15,)
    back = unpack_public(flat, shapes)
    assert list(back) == list(shapes)
    assert all(np.array_equal(back[n].view(np.uint32), sums[n].view(np.uint32)) for n in shapes)
    for bad, what in ((flat.astype(np.float64), "float64"), (flat[:-1], "309 coordinates, expected d=310"),
                      (flat.reshape(2, -1), "shape (2, 155)")):
        with pytest.raises(MessageError, match=what.replace("(", r"\(").replace(")", r"\)")) as err:
            unpack_public(bad, shapes)
        assert err.value.field == PUBLIC_SUM and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="'2.weight' missing"):
        pack_public({n: sums[n] for n in list(shapes)[:2]}, list(shapes))


@pytest.mark.parametrize("tamper", ["float64", "short", "nan"])
def test_a_malformed_public_sum_drops_that_node_and_corrupts_nothing(tamper, caplog):
    """Node 2's collect reply carries a bad packed public sum: the server refuses it (one
    logged line naming the field), the node counts as dropped at collect, and the round
    unmasks the other three, charged the planned event, with a finite model."""
    cfg = secagg_config(**{"num-rounds": 1})

    class Tampering(ClientAppGrid):
        def answer(self, msg: Message) -> Message:
            reply = super().answer(msg)
            if msg.metadata.dst_node_id == 2 and msg.metadata.message_type == "train.sa_collect":
                arrays = reply.content.array_records[MASKED]
                flat = arrays[PUBLIC_SUM].numpy()
                bad = {"float64": flat.astype(np.float64), "short": flat[:-1],
                       "nan": np.where(np.arange(flat.size) == 0, np.nan, flat).astype(np.float32)}[tamper]
                arrays[PUBLIC_SUM] = Array(bad)
            return reply

    data = load_dataset(cfg.data)
    plan = build_plan(cfg, data, num_devices=len(data.devices),
                      evaluate=held_out_evaluation(data.test_x, data.test_y))
    strat = FDPStrategy(plan)
    with caplog.at_level("WARNING", logger="fedfdp.server"):
        strat.start(Tampering(cfg), ArrayRecord(plan.model.state_dict()))
    assert strat.stop_reason is None and [r["replies"] for r in strat.rows] == [3]
    refused = [r.getMessage() for r in caplog.records if "rejected the reply of node 2" in r.getMessage()]
    assert len(refused) == 1 and "\n" not in refused[0]
    assert (PUBLIC_SUM in refused[0]) or ("NaN" in refused[0])
    ledger, mechanism = strat.ledger, strat.mechanism
    assert ledger is not None and mechanism is not None
    assert [e == mechanism.event for e in ledger.events()] == [True]
    assert all(torch.isfinite(v).all() for v in strat.model.state_dict().values())


def test_a_dropout_at_unmask_still_decodes():
    cfg = secagg_config(**{"num-rounds": 1})
    strat, _grid, _ = run_strategy(cfg, fail=lambda node, kind: node == 0 and kind == "train.sa_unmask")
    assert strat.ledger is not None
    assert strat.stop_reason is None and len(strat.rows) == 1 and len(strat.ledger.charges) == 1


# ----------------------------------------------------------------- the noise


def _zero_data_totals(cfg: Config, monkeypatch: pytest.MonkeyPatch) -> tuple[list[np.ndarray], Any]:
    """The decoded private sums of every round with every node's private sum zero, read off
    the released models (``mode = "dp"``, no momentum: round ``r`` steps by
    ``−lr·S_r/normaliser``; the run's evaluation hook sees each round's model)."""
    assert cfg.privacy.mode == "dp" and cfg.training.momentum == 0.0 and cfg.training.alpha == 1.0
    monkeypatch.setattr(handlers, "flat_private", lambda model, private: np.zeros(
        sum(p.numel() for p in model.parameters() if p.requires_grad)))
    models: list[np.ndarray] = []

    def flat(state: Any) -> np.ndarray:
        return np.concatenate([t.double().reshape(-1).numpy() for t in state.values()])

    def released(round_: int, model: Any) -> dict[str, float]:
        models.append(flat({n: p.detach() for n, p in model.named_parameters()}))
        return {}

    strat, _, initial = run_strategy(cfg, evaluate=released)
    before = [flat(initial), *models[:-1]]
    lr = cfg.training.learning_rate
    totals = [-(after - b) * row["normaliser"] / lr for b, after, row in zip(before, models, strat.rows,
                                                                               strict=True)]
    return totals, strat


def test_zero_data_aggregate_variance_is_the_calibrated_one(monkeypatch):
    sigma, clip = 0.8, 1.0
    cfg = secagg_config(**{"num-rounds": 2, "noise-multiplier": sigma, "model": "mlp", "hidden-size": 32,
                           "mode": "dp", "momentum": 0.0})
    totals, strat = _zero_data_totals(cfg, monkeypatch)
    plan = strat.mechanism.secagg
    d, s, u3, n_h = plan.dimension, plan.scale, 4, plan.honest_parties
    assert d > 1000
    want = sigma**2 * clip**2 * (1 + math.sqrt(d) / s) ** 2 * u3 / n_h
    for total in totals:
        var = float(np.mean(total**2))  # mean zero by construction (symmetric noise, zero data)
        # the variance of a mean of d squared Gaussians is 2 var²/d
        assert abs(var - want) < 5 * want * math.sqrt(2 / d), (var, want)


def test_equal_seeds_give_different_noise(monkeypatch):
    cfg = secagg_config(**{"num-rounds": 1, "noise-multiplier": 1.0, "mode": "dp", "momentum": 0.0})
    first, _ = _zero_data_totals(cfg, monkeypatch)
    second, _ = _zero_data_totals(cfg, monkeypatch)
    assert cfg.training.seed == 0 and len(first) == len(second) == 1
    assert not np.array_equal(first[0], second[0])


# ----------------------------------------------------------------- refusals


def test_too_few_supernodes_for_min_survivors_is_refused():
    cfg = secagg_config(**{"secagg-min-survivors": 5, "num-devices": 5})
    data = load_dataset(cfg.data)
    strat = FDPStrategy(build_plan(cfg, data, num_devices=5))
    strat.registry = {d: ([d], [len(dev)]) for d, dev in enumerate(data.devices) if d < 4}
    strat.registry[3] = ([3, 4], [len(data.devices[3]), len(data.devices[4])])  # 4 nodes for 5 devices
    strat.resolve()
    from strategies.secagg_round import SecAggRound

    driver = SecAggRound(strat.engine, strat.orders, grid=None, timeout=1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^secagg-min-survivors=5: only 4 SuperNodes"):
        driver.check_parties(len(strat.registry))
    with pytest.raises(ConfigError, match="at least 3 parties"):
        driver.check_parties(2)


def test_a_contribution_request_below_the_noise_floor_is_refused():
    from fedfdp.secagg.party import noisy_contribution

    with pytest.raises(ValueError, match="local_sigma=3.9: below 4.0"):
        noisy_contribution(np.zeros(3), clip=1.0, scale=8.0, local_sigma=3.9)


def test_node_ids_beyond_int64_survive_the_wire():
    from fedfdp.secagg.messages import UnmaskRequest
    from fedfdp.secagg.wire import from_wire, to_wire

    req = UnmaskRequest(3, 2**64 - 1, (2**64 - 1, 2**63 + 5), ())
    wire = to_wire(req)
    assert all(isinstance(v, str | bytes) for v in wire.values())
    assert from_wire(UnmaskRequest, wire) == req


def test_the_wire_form_is_two_entries_and_refuses_a_cut_or_padded_body():
    from fedfdp.secagg.errors import MessageError
    from fedfdp.secagg.messages import KeysReply, SetupReply
    from fedfdp.secagg.wire import BODY, from_wire, to_wire

    reply = SetupReply(7, 2**64 - 1, 3, b"m" * 32, b"e" * 32, b"i" * 32, b"s" * 64)
    wire = to_wire(reply)
    assert set(wire) == {"type", BODY}
    # 3 ints of 8 bytes, four length-prefixed byte strings
    assert len(wire[BODY]) == 3 * 8 + 4 * 4 + 3 * 32 + 64
    assert from_wire(SetupReply, wire) == reply
    keys = KeysReply(7, 5, (1, 2**64 - 2), (b"a" * 102, b"b" * 102))
    assert from_wire(KeysReply, to_wire(keys)) == keys
    body = to_wire(keys)[BODY]
    assert isinstance(body, bytes)
    with pytest.raises(MessageError, match=r"^KeysReply\.ciphertexts: unreadable"):
        from_wire(KeysReply, {"type": "KeysReply", BODY: body[:-1]})
    with pytest.raises(MessageError, match=r"^KeysReply\.body: unreadable \(1 bytes left over\)"):
        from_wire(KeysReply, {"type": "KeysReply", BODY: body + b"x"})
    with pytest.raises(MessageError, match=r"^KeysReply\.body: missing"):
        from_wire(KeysReply, {"type": "KeysReply"})
    with pytest.raises(MessageError, match=r"^SetupReply: the record is a 'KeysReply'"):
        from_wire(SetupReply, to_wire(keys))


def test_context_state_holds_the_session_between_stages():
    cfg = secagg_config(**{"num-rounds": 1})
    _, grid, _ = run_strategy(cfg)
    for ctx in grid.contexts.values():
        assert handlers.STATE not in ctx.state  # wiped after unmask


def test_the_context_state_not_a_kept_object_decides_the_next_stage():
    """A node's state rolled back to what it held after setup (its Context changed behind
    the process's back): the next stage runs from that state and refuses collect, even
    though the process kept the later session object."""
    cfg = secagg_config(**{"num-rounds": 1, "secagg-min-survivors": 3})
    after_setup: dict[int, Any] = {}

    class Rollback(ClientAppGrid):
        def answer(self, msg: Message) -> Message:
            node, kind = msg.metadata.dst_node_id, msg.metadata.message_type
            if node == 0 and kind == "train.sa_collect":
                self.contexts[0].state[handlers.STATE] = after_setup[0]
            reply = super().answer(msg)
            if kind == "train.sa_setup":
                after_setup[node] = self.contexts[node].state.config_records[handlers.STATE]
            return reply

    data = load_dataset(cfg.data)
    strat = FDPStrategy(build_plan(cfg, data, num_devices=len(data.devices)))
    grid = Rollback(cfg)
    strat.start(grid, ArrayRecord(strat.model.state_dict()))
    (reply,) = [r for kind, n, r in grid.seen if n == 0 and kind == "train.sa_collect"]
    assert reply.has_error() and "collect request refused, its session is set up" in str(reply.error.reason)


# ----------------------------------------------------------------- resume


class Crash(RuntimeError):
    pass


def test_resume_replays_the_distributed_events(tmp_path):
    """A session crashes after round 2 was charged and stepped, before its checkpoint; the
    resumed session replays every charge (the distributed accountant's events) and ends
    at the ε of the whole ledger, recomputed by routes A and B directly."""
    cfg = secagg_config(**{"num-rounds": 4, "noise-multiplier": 2.0, "out-dir": str(tmp_path)})

    def crash_at_2(r: int, model: Any) -> dict[str, float]:
        if r == 2:
            raise Crash("after round 2")
        return {}

    with pytest.raises(Crash):
        run_strategy(cfg, evaluate=crash_at_2)
    first = written_ledger(tmp_path)
    assert len(first.charges) == 2
    resumed = load_config({**cfg.to_flat(), "resume": True})
    strat, _, _ = run_strategy(resumed, evaluate=lambda r, m: {})
    ledger = written_ledger(tmp_path)
    events = ledger.events()
    assert all(isinstance(e, DistributedDiscreteGaussian) for e in events)
    assert len(events) >= 4 and [r["round"] for r in strat.rows][-1] == 4
    printed = strat.rows[-1]["epsilon"]
    mechanism = strat.mechanism
    assert mechanism is not None
    assert printed == pytest.approx(printed_from_ledger(events, mechanism.delta), rel=1e-12)
    assert printed >= printed_from_ledger(first.events(), mechanism.delta)
