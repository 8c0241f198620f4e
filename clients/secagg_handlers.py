"""The ClientApp's four secure-aggregation stages (``train.sa_setup`` … ``train.sa_unmask``).

One SuperNode is one SecAgg+ party (:mod:`fedfdp.secagg.session`). Its
:class:`~fedfdp.secagg.ClientSession` lives in the node's own ``Context.state``
between the stages (:meth:`~fedfdp.secagg.ClientSession.export_state`; on Flower's
simulation engine and on a SuperNode the context never leaves the node).

``sa_collect`` runs the same device contribution as a plain round
(:meth:`clients.node_runtime.NodeRuntime.train`: the clipped private sum over the
devices' secret Poisson batches, the unclipped public sum over independent public
batches), then encodes the private sum, adds the node's discrete Gaussian share from
its OS CSPRNG (:func:`fedfdp.secagg.party.noisy_contribution`) and masks it. The reply
carries the masked ``uint32`` vector, the public sum in the clear (disclosed by
design), the public count and loss — never the private sum, its batch size or the
count of vectors within ``C``.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from clients.node_runtime import NodeRuntime
from fedfdp import protocol as P
from fedfdp.secagg import ClientSession, CollectRequest, KeysRequest, SetupRequest, UnmaskRequest
from fedfdp.secagg.party import noisy_contribution
from fedfdp.secagg.wire import MASKED, SECAGG, from_wire, to_wire

#: Where a node keeps its session in ``Context.state``.
STATE = "fedfdp.secagg"


def _record(msg: Message) -> ConfigRecord:
    return msg.content.config_records[SECAGG]


def _save(context: Context, session: ClientSession | None) -> None:
    if session is None or session.finished:
        if STATE in context.state:
            del context.state[STATE]
        return
    context.state[STATE] = ConfigRecord({"session": session.export_state()})


def _load(context: Context) -> ClientSession:
    if STATE not in context.state:
        raise RuntimeError(f"node {context.node_id}: no secure-aggregation session (sa_setup first)")
    raw = context.state.config_records[STATE]["session"]
    if not isinstance(raw, bytes):
        raise RuntimeError(f"node {context.node_id}: unreadable secure-aggregation session")
    return ClientSession.restore(raw)


def _reply(msg: Message, wire: dict[str, str | bytes], **records: ArrayRecord | MetricRecord) -> Message:
    content = RecordDict({SECAGG: ConfigRecord(dict(wire))})
    for name, rec in records.items():
        content[name] = rec
    return Message(content, reply_to=msg)


def sa_setup(msg: Message, context: Context) -> Message:
    """Stage 0: a fresh session (any earlier one of this node is dropped), two key pairs."""
    _save(context, None)
    session = ClientSession(int(context.node_id))
    reply = session.setup(from_wire(SetupRequest, _record(msg)))
    _save(context, session)
    return _reply(msg, to_wire(reply))


def sa_keys(msg: Message, context: Context) -> Message:
    """Stage 1: share the seed and the mask key with the neighbours, encrypted."""
    session = _load(context)
    try:
        reply = session.share_keys(from_wire(KeysRequest, _record(msg)))
    finally:
        _save(context, session)
    return _reply(msg, to_wire(reply))


def flat_private(model: torch.nn.Module, private: dict[str, torch.Tensor] | None) -> np.ndarray:
    """The private sum as one float64 vector in the model's parameter order (zeros when
    the node has none this round: its noise share is still added).
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if private is None:
        return np.zeros(sum(int(p.numel()) for _, p in params), dtype=np.float64)
    return np.concatenate([private[n].detach().double().reshape(-1).numpy() for n, _ in params])


def sa_collect(msg: Message, context: Context, runtime: NodeRuntime) -> Message:
    """Stage 2: the round's device contribution; the private sum encoded, noised, masked
    (``runtime``: the node's records, model and parts).
    """
    session = _load(context)
    try:
        rec = _record(msg)
        request = from_wire(CollectRequest, rec)
        scale, local_sigma = float(str(rec["scale"])), float(str(rec["local-sigma"]))
        config = msg.content.config_records[P.CONFIG]
        order = P.TrainInstruction.from_config(config)
        state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
        private, public, metrics = runtime.train(state, config)
        x = flat_private(runtime.model, private)
        values = noisy_contribution(x, clip=order.clipping_norm, scale=scale, local_sigma=local_sigma)
        del x, private
        reply = session.collect(request, values)
    finally:
        _save(context, session)
    out: dict[str, ArrayRecord | MetricRecord] = {MASKED: ArrayRecord({MASKED: Array(reply.masked)}),
           P.METRICS: MetricRecord({P.PUBLIC_COUNT: metrics[P.PUBLIC_COUNT],
                                    P.PUBLIC_LOSS_SUM: metrics[P.PUBLIC_LOSS_SUM]})}
    if public is not None:
        out[P.PUBLIC] = ArrayRecord(public)
    return _reply(msg, to_wire(reply), **out)


def sa_unmask(msg: Message, context: Context) -> Message:
    """Stage 3: the shares asked for, once; the session is then wiped."""
    session = _load(context)
    try:
        reply = session.unmask(from_wire(UnmaskRequest, _record(msg)))
    finally:
        _save(context, None)
    return _reply(msg, to_wire(reply))
