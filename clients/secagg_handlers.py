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
carries the masked ``uint32`` vector and, beside it, the public sum in the clear as one
flat ``float32`` vector (disclosed by design; :mod:`fedfdp.secagg.wire`), the public
count and loss — never the private sum, its batch size or the
count of vectors within ``C``.

What a node trusts from outside the server — its long-term signing key, the roster of
the parties' keys and the smallest survivor set it unmasks for — is built in one place,
:func:`node_trust`, from its policy (the policy's ``roster``, the key in its
``node-state`` directory, ``min-honest-shares + max-colluders``). The session then
refuses swapped keys, sybils, inconsistent survivor sets or models and partial sums
(:class:`~fedfdp.secagg.ClientSession`). ``sa_unmask`` carries two exchanges: the
consistency check (:class:`~fedfdp.secagg.messages.ConfirmRequest`, signed) and the
unmask.

A node with its own policy (node config ``node-policy``: :class:`clients.node_runtime.NodeGuard`)
checks the setup's threshold and, in ``sa_collect``, the requested ``σ_loc`` and charges
its own ledger before it trains, encodes or masks anything; a refusal is an error reply
whose reason the server logs (the node drops out of the round).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from clients.node_runtime import NodeGuard, NodeRuntime
from clients.records import find_record, get_record
from fedfdp import protocol as P
from fedfdp.secagg import ClientSession, CollectRequest, KeysRequest, SetupRequest, UnmaskRequest
from fedfdp.secagg.identity import SIGNING_KEY_FILE, NodeTrust, Roster, SigningKey, round_digest
from fedfdp.secagg.messages import ConfirmRequest
from fedfdp.secagg.party import noisy_contribution
from fedfdp.secagg.wire import MASKED, PUBLIC_SUM, SECAGG, from_wire, pack_public, to_wire

#: Where a node keeps its session in ``Context.state``.
STATE = "fedfdp.secagg"
#: Where a node keeps what outlives a round in ``Context.state``: the last round it
#: unmasked (a setup for a round not after it is a replay), and, without a policy, the
#: signing key it drew for the run.
NODE = "fedfdp.secagg.node"
#: The smallest survivor set a node without a policy unmasks for (the protocol's minimum).
MIN_SURVIVORS = 3


def node_trust(context: Context, guard: NodeGuard | None) -> NodeTrust:
    """What the node trusts from outside the server: the entry point of a node's policy
    into secure aggregation (:class:`fedfdp.secagg.identity.NodeTrust`).

    With a policy that names a ``roster``: that roster, the node's long-term signing key
    in its ``node-state`` directory (created there from the OS CSPRNG on first use; its
    public key must be on the roster), and the floor ``min-honest-shares +
    max-colluders``. Without a roster (no policy, or a policy without one) the node
    cannot tell sybils or swapped keys from parties (``NodeTrust.roster`` is None): it
    signs with a key it drew for the run and keeps in its ``Context.state``; the graph,
    consistency and survivor checks still hold.

    Raises
    ------
    ValueError
        One line: an unreadable roster or key, or a key that is not on the roster.
    """
    floor = MIN_SURVIVORS
    if guard is not None:
        policy = guard.policy
        floor = max(MIN_SURVIVORS, policy.min_honest_shares + policy.max_colluders)
        if policy.roster is not None:
            path = guard.ledger.state_dir / SIGNING_KEY_FILE
            key = SigningKey.load_or_create(path)
            roster = Roster.from_file(policy.roster)
            if key.public not in roster:
                raise ValueError(f"node {context.node_id}: its signing key {str(path)!r} is not on the "
                                 f"roster {str(policy.roster)!r}")
            return NodeTrust(key, roster, floor)
    record = find_record(context.state, NODE, ConfigRecord)
    raw = record.get("signing-key") if record is not None else None
    key = SigningKey.from_bytes(raw) if isinstance(raw, bytes) else SigningKey.generate()
    _remember(context, **{"signing-key": key.to_bytes()})
    return NodeTrust(key, None, floor)


def _remember(context: Context, **values: bytes | str) -> None:
    record = find_record(context.state, NODE, ConfigRecord)
    context.state[NODE] = ConfigRecord({**(dict(record) if record is not None else {}), **values})


def _last_unmasked(context: Context) -> int:
    """The last round this node unmasked in this run (``-1``: none)."""
    record = find_record(context.state, NODE, ConfigRecord)
    if record is None or str(record.get("run", "")) != str(context.run_id):
        return -1
    return int(str(record.get("unmasked", -1)))


def received_digest(state: Mapping[str, torch.Tensor], *, clipping_norm: float, scale: float,
                    local_sigma: float) -> bytes:
    """The digest a node signs of the model and parameters it received (the server computes
    the same over what it sent: :func:`fedfdp.secagg.identity.round_digest`). ``state``:
    the received ``ArrayRecord`` as a torch state dict (``to_torch_state_dict``: each
    tensor shares the memory, dtype and shape of the array it was decoded into, so the
    arrays are decoded once for the digest and the training).
    """
    return round_digest({name: t.numpy() for name, t in state.items()}, clipping_norm=clipping_norm,
                        scale=scale, local_sigma=local_sigma)


def _record(msg: Message) -> ConfigRecord:
    return get_record(msg.content, SECAGG, ConfigRecord)


#: Sessions a process keeps as objects beside the state it wrote to their nodes'
#: contexts (a process may serve many virtual nodes), least recently saved dropped beyond.
SESSION_CACHE_SIZE = 1024
_sessions: OrderedDict[tuple[int, int], tuple[bytes, ClientSession]] = OrderedDict()
_sessions_lock = threading.Lock()


def _save(context: Context, session: ClientSession | None) -> None:
    """Write the session to the node's ``Context.state`` (the authoritative copy) and keep
    the object with the bytes written, so that the next stage need not parse them again.
    """
    key = (int(context.run_id), int(context.node_id))
    with _sessions_lock:
        _sessions.pop(key, None)
    if session is None or session.finished:
        if STATE in context.state:
            del context.state[STATE]
        return
    raw = session.export_state()
    context.state[STATE] = ConfigRecord({"session": raw})
    with _sessions_lock:
        _sessions[key] = (raw, session)
        while len(_sessions) > SESSION_CACHE_SIZE:
            _sessions.popitem(last=False)


def _load(context: Context) -> ClientSession:
    """The session in the node's ``Context.state``: the object :func:`_save` kept when the
    state holds exactly the bytes it wrote (taken out of the cache: one stage owns it),
    else restored from the state.
    """
    if STATE not in context.state:
        raise RuntimeError(f"node {context.node_id}: no secure-aggregation session (sa_setup first)")
    raw = get_record(context.state, STATE, ConfigRecord)["session"]
    if not isinstance(raw, bytes):
        raise RuntimeError(f"node {context.node_id}: unreadable secure-aggregation session")
    with _sessions_lock:
        kept = _sessions.pop((int(context.run_id), int(context.node_id)), None)
    if kept is not None and kept[0] == raw:
        return kept[1]
    return ClientSession.restore(raw)


def _reply(msg: Message, wire: dict[str, str | bytes], **records: ArrayRecord | MetricRecord) -> Message:
    content = RecordDict({SECAGG: ConfigRecord(dict(wire))})
    for name, rec in records.items():
        content[name] = rec
    return Message(content, reply_to=msg)


def sa_setup(msg: Message, context: Context, guard: NodeGuard | None = None) -> Message:
    """Stage 0: a fresh session (any earlier one of this node is dropped), two key pairs
    (``guard``: the node's own policy refuses a threshold its colluders could meet).
    """
    _save(context, None)
    session = ClientSession(int(context.node_id), node_trust(context, guard), run=int(context.run_id),
                            after_round=_last_unmasked(context))
    request = from_wire(SetupRequest, _record(msg))
    if guard is not None:
        guard.check_setup(request.threshold)
    reply = session.setup(request)
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
        config = get_record(msg.content, P.CONFIG, ConfigRecord)
        order = P.TrainInstruction.from_config(config)
        state = get_record(msg.content, P.ARRAYS, ArrayRecord).to_torch_state_dict()
        digest = received_digest(state, clipping_norm=order.clipping_norm, scale=scale,
                                 local_sigma=local_sigma)
        if runtime.guard is not None:  # the node's own check and charge, write-ahead (clients.node_runtime)
            runtime.guard.charge_secagg(int(context.run_id), order, local_sigma=local_sigma, scale=scale,
                                        dimension=runtime.dimension)
        private, public, metrics = runtime.train(state, config)
        x = flat_private(runtime.model, private)
        values = noisy_contribution(x, clip=order.clipping_norm, scale=scale, local_sigma=local_sigma)
        del x, private
        reply = session.collect(request, values, digest)
    finally:
        _save(context, session)
    arrays = {MASKED: Array(reply.masked)}
    if public is not None:  # one flat float32 vector beside the masked one (fedfdp.secagg.wire)
        names = [n for n, p in runtime.model.named_parameters() if p.requires_grad]
        arrays[PUBLIC_SUM] = Array(pack_public({n: public[n].detach().cpu().numpy() for n in names}, names))
    out: dict[str, ArrayRecord | MetricRecord] = {MASKED: ArrayRecord(arrays),
           P.METRICS: MetricRecord({P.PUBLIC_COUNT: metrics[P.PUBLIC_COUNT],
                                    P.PUBLIC_LOSS_SUM: metrics[P.PUBLIC_LOSS_SUM]})}
    return _reply(msg, to_wire(reply), **out)


def sa_unmask(msg: Message, context: Context) -> Message:
    """Stage 3: first the consistency check (sign the survivor set, the dead set and the
    digest of what it received), then the shares asked for, once; the session is then wiped.
    """
    session = _load(context)
    record = _record(msg)
    if record.get("type") == ConfirmRequest.__name__:
        try:
            confirmed = session.confirm(from_wire(ConfirmRequest, record))
        finally:
            _save(context, session)
        return _reply(msg, to_wire(confirmed))
    try:
        reply = session.unmask(from_wire(UnmaskRequest, record))
        _remember(context, run=str(context.run_id), unmasked=str(reply.round))
    finally:
        _save(context, None)
    return _reply(msg, to_wire(reply))
