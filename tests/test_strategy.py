"""Strategy aggregation with mock replies (no simulation): noise once, q·N, α, budget, bad replies."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict

from fedfdp import protocol as P
from fedfdp.accounting import FDPAccountant
from fedfdp.config import load_config
from tests.flower_helpers import InProcessGrid, registered_strategy, train_messages
from tests.mechanism_helpers import fdp_event
from tests.test_mechanisms import variance_matches

BASE = {
    "num-devices": 5,
    "model": "mlp",
    "records-per-device": 50,
    "sampling-rate": 0.1,
    "public-batch-size": 30,
    "noise-multiplier": 0.8,
    "clipping-norm": 0.25,
    "learning-rate": 1.0,
    "momentum": 0.0,
    "alpha": 3.0,
    "seed": 1,
    "progress": False,
    "hidden-size": 32,
}


def _reply(msg, private=None, public=None, metrics=None):
    content = RecordDict({P.METRICS: MetricRecord(metrics or {})})
    if private is not None:
        content[P.PRIVATE] = ArrayRecord({k: torch.as_tensor(v) for k, v in private.items()})
    if public is not None:
        content[P.PUBLIC] = ArrayRecord({k: torch.as_tensor(v) for k, v in public.items()})
    return Message(content, reply_to=msg)


def test_noise_once_normalised_by_expected_batch_and_alpha():
    """Known private sums P_k and public sums U_k: recover the noise
    Z = (g - ΣU/Σc)·qN/α - ΣP from the SGD step (lr 1, no momentum) and test that it
    is N(0, σ²C²) per coordinate (chi-square at 1e-6; mean within 5 s.e.)."""
    cfg = load_config(BASE)
    strat = registered_strategy(cfg)
    before = [p.detach().clone() for p in strat.model.parameters()]
    msgs = train_messages(strat, 2)  # round 2: any round works
    rng = np.random.default_rng(0)
    shapes = strat.engine.shapes
    priv_total = {k: np.zeros(s) for k, s in shapes.items()}
    pub_total = {k: np.zeros(s) for k, s in shapes.items()}
    replies, count = [], 0
    for msg in msgs:
        c = sum(P.TrainInstruction.from_config(msg.content.config_records[P.CONFIG]).public_counts)
        priv = {k: (rng.normal(size=s) * 1e-3).astype(np.float32) for k, s in shapes.items()}
        pub = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        for k in shapes:
            priv_total[k] += priv[k]
            pub_total[k] += pub[k]
        count += c
        metrics = {P.PUBLIC_COUNT: c, P.PUBLIC_LOSS_SUM: 1.0, P.UNCLIPPED_COUNT: 0}
        replies.append(_reply(msg, priv, pub, metrics))
    strat.aggregate_train(2, replies)
    qN = 0.1 * strat.num_records
    parts = []
    for name, p, b in zip(shapes, strat.model.parameters(), before, strict=True):
        g = (b - p.detach()).double().numpy()
        parts.append(((g - pub_total[name] / count) * qN / 3.0 - priv_total[name]).ravel())
    z = np.concatenate(parts)
    std = 0.8 * 0.25
    assert z.size > 1000
    assert variance_matches(z, std)
    assert not variance_matches(z, std * np.sqrt(len(replies)))  # noise added once, not per reply
    assert abs(z.mean()) < 5 * std / np.sqrt(z.size)
    assert strat.ledger is not None and len(strat.ledger.charges) == 1  # one event charged


def test_budget_refusal_stops_cleanly(tmp_path):
    cfg = load_config({**BASE, "num-rounds": 50, "max-epsilon": 2.0, "out-dir": str(tmp_path)})
    strat = registered_strategy(cfg)
    strat.registry = {}
    strat.start(InProcessGrid(cfg))
    rows = strat.rows
    assert 0 < len(rows) < 50
    assert rows[-1]["epsilon"] <= 2.0
    assert strat.stop_reason is not None and "2" in strat.stop_reason
    # one more round would have exceeded the cap: the ledger replayed by a fresh accountant
    acc = FDPAccountant()
    assert strat.ledger is not None
    for event in strat.ledger.events():
        acc.compose(fdp_event(event))
    m = strat.mechanism
    assert m is not None
    assert acc.would_exceed(fdp_event(m.event), max_epsilon=2.0, delta=m.delta)
    assert (tmp_path / "metrics.csv").is_file()


def _tamper_factory(kind):
    def tamper(node, msg, reply):
        if node != 2 or P.PRIVATE not in reply.content.array_records:
            return reply  # only node 2's train replies are corrupted
        if kind == "error":
            return Message(Error(code=1, reason="boom"), reply_to=msg)
        priv = {k: v.numpy().copy() for k, v in reply.content[P.PRIVATE].items()}
        key = next(iter(priv))
        if kind == "nan":
            priv[key][...] = np.nan
        elif kind == "inf":
            priv[key].flat[0] = np.inf
        elif kind == "shape":
            priv[key] = priv[key][..., :1]
        elif kind == "dtype":
            priv[key] = priv[key].astype(np.int64)
        elif kind == "missing":
            del priv[key]
        elif kind == "extra":
            priv["bogus"] = np.zeros(3, dtype=np.float32)
        elif kind == "norm":
            priv[key] = priv[key] + 1e6
        reply.content[P.PRIVATE] = ArrayRecord({k: torch.as_tensor(v) for k, v in priv.items()})
        return reply

    return tamper


@pytest.mark.parametrize("kind", ["nan", "inf", "shape", "dtype", "missing", "extra", "norm", "error"])
def test_bad_reply_is_rejected_and_changes_nothing(kind):
    """A run with one corrupted reply per round equals a run where that node's reply
    never arrived: model and ledger identical, the noise still added."""
    # same secret streams in both runs: the reproducible mode (an explicit opt-in); the
    # round timeout bounds the wait for the reply that never arrives
    cfg = load_config({**BASE, "num-rounds": 2, "reproducible-noise": True, "round-timeout": 0.5})
    bad = registered_strategy(cfg)
    bad.registry = {}
    bad.start(InProcessGrid(cfg, tamper=_tamper_factory(kind)))
    dropped = registered_strategy(cfg)
    dropped.registry = {}
    dropped.start(
        InProcessGrid(
            cfg, tamper=lambda n, m, r: None if n == 2 and m.metadata.message_type == "train" else r
        )
    )
    for a, b in zip(bad.model.parameters(), dropped.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert bad.rows[-1]["rejected"] == 1 and bad.rows[-1]["replies"] == 4
    assert bad.ledger is not None and dropped.ledger is not None
    assert bad.ledger.to_dict() == dropped.ledger.to_dict()
