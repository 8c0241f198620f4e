"""The server's driver of one secure-aggregation round on Flower's Message API.

``aggregation = "secagg"``: every private round is one SecAgg+ round over the
SuperNodes with work (each SuperNode one party), in four ``train`` messages
(:data:`fedfdp.secagg.wire.STAGES`, handled by :mod:`clients.secagg_handlers`):

1. ``sa_setup`` → public keys (U1); 2. ``sa_keys`` → encrypted shares (U2);
3. ``sa_collect`` (with the model and the round's train instruction) → each node's
   *masked* ``uint32`` vector of its noisy, encoded private sum, and beside it its
   public sum in the clear, one flat ``float32`` vector (U3; :mod:`fedfdp.secagg.wire`);
4. if ``|U3| ≥ n_min`` and U3's neighbour graph is connected: ``sa_unmask`` with a
   :class:`~fedfdp.secagg.messages.ConfirmRequest` → every survivor's signature of U3,
   the dead set and the digest of the model and parameters it received (the server
   checks them against the digest of what it sent);
5. then the round is **charged** (budget check, the event written durably to the
   ledger: :meth:`fedfdp.round_engine.RoundEngine.charge_round`), and only then
   ``sa_unmask`` → shares; the server removes the masks, decodes the noisy sum
   (:func:`fedfdp.secagg.decode`) and steps (:meth:`~fedfdp.round_engine.RoundEngine.finish_round`,
   which adds no noise under secure aggregation).

The charge is always the resolved event, ``n_h = n_min − t_c`` honest parties
(:mod:`fedfdp.secagg.plan`): an upper bound for every round that unmasks, whatever the
realised survivors (``docs/secagg_accounting.md`` §5: charging the realised count is
valid only if who survives cannot depend on the data or on earlier outputs, which a
timeout does not guarantee).

Below ``n_min`` survivors, when a stage leaves a node with fewer than ``t`` live
holders of its shares, when the survivors' graph is disconnected (unmasking would
release partial sums) or when a survivor does not confirm, the round **aborts**: no
request for shares is sent, the masked vectors stay one-time pads, the model, the
optimizer and the ledger are unchanged
(:meth:`~fedfdp.round_engine.RoundEngine.abort_round`). The round is tried again, up to
:data:`ROUND_TRIES` times; then the run stops (:class:`fedfdp.round_engine.RoundAborted`).
A round whose unmask stage fails after the charge stays charged and makes no step.

The server never holds a node's private sum: a collect reply's arrays are the masked
vector and the public sum; the session keeps only the running sum of masked vectors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from clients.records import find_record, get_record
from fedfdp import protocol as P
from fedfdp.config import ConfigError
from fedfdp.round_engine import RoundAborted, RoundEngine, RoundOutcome, RoundStats
from fedfdp.secagg import (
    CollectReply,
    ConsistencyError,
    MessageError,
    ReconstructionError,
    ServerSession,
    Stage,
    ThresholdError,
    TooFewSurvivors,
    decode,
)
from fedfdp.secagg.identity import round_digest
from fedfdp.secagg.plan import SecAggPlan
from fedfdp.secagg.wire import MASKED, PUBLIC_SUM, REPLY_TO, SECAGG, from_wire, to_wire, unpack_public
from strategies.orders import TrainOrders
from strategies.transport import exchange

log = logging.getLogger("fedfdp.server")

#: Tries of a round that aborts (too few survivors) before the run stops.
ROUND_TRIES = 3


class _Aborted(Exception):
    """A stage left too few survivors (or holders): the round aborts, uncharged."""


class SecAggRound:
    """Runs the private rounds of ``engine`` by secure aggregation on ``grid``
    (module docstring).

    Parameters
    ----------
    engine : RoundEngine
        The round engine (its mechanism holds the secure-aggregation plan).
    orders : TrainOrders
        The round's train instructions and what each node was asked.
    grid : Grid
    timeout : float
        Seconds each stage waits for replies (``secagg-timeout``).
    keep_replies : bool
        Keep every reply the server received in :attr:`received` (tests inspect what
        the server holds).
    """

    def __init__(self, engine: RoundEngine, orders: TrainOrders, grid: Grid, timeout: float, *,
                 keep_replies: bool = False) -> None:
        self.engine = engine
        self.orders = orders
        self.grid = grid
        self.timeout = timeout
        self.keep_replies = keep_replies
        self.received: list[tuple[str, int, Message]] = []

    # ---------------------------------------------------------------- checks
    def plan(self) -> SecAggPlan:
        """The resolved mechanism's secure-aggregation plan."""
        secagg = self.engine.mechanism.secagg
        if secagg is None:
            raise RuntimeError("SecAggRound: the resolved mechanism has no secure-aggregation plan")
        return secagg

    def check_parties(self, parties: int) -> None:
        """Refuse (one line) a run whose SuperNodes cannot meet ``n_min`` or are fewer than 3."""
        plan = self.plan()
        if parties < 3:
            raise ConfigError(f"aggregation='secagg' with {parties} SuperNodes: secure aggregation needs at "
                              "least 3 parties (fedfdp run --supernodes N)")
        if parties < plan.min_survivors:
            raise ConfigError(f"secagg-min-survivors={plan.min_survivors}: only {parties} SuperNodes take "
                              "part, so no round could unmask (fedfdp run --supernodes N)")

    # ---------------------------------------------------------------- a round
    def run(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord) -> RoundOutcome:
        """Round ``server_round``, tried up to :data:`ROUND_TRIES` times while it aborts.

        Raises
        ------
        RoundAborted
            Every try aborted (nothing charged, no step).
        """
        for attempt in range(1, ROUND_TRIES + 1):
            outcome = self.try_round(server_round, arrays, config)
            if outcome is not None:
                return outcome
            log.warning("round %d: secure aggregation aborted (try %d of %d)", server_round, attempt,
                        ROUND_TRIES)
        raise RoundAborted(f"round {server_round}: secure aggregation aborted {ROUND_TRIES} times (too few "
                           "survivors); nothing charged")

    def try_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord) -> RoundOutcome | None:
        """One try: the round's outcome, or None when it aborted (uncharged, no step)."""
        server = self.engine
        plan = self.plan()
        state = server.begin_round(server_round, charge=False)
        messages = self.orders.messages(server_round, state, arrays, config)
        train = {m.metadata.dst_node_id: m for m in messages}
        nodes = sorted(train)
        try:
            self.check_parties(len(nodes))
            session = ServerSession(server_round, nodes, plan.dimension, neighbours=plan.neighbours,
                                    threshold=plan.threshold, min_survivors=plan.min_survivors)
        except (ConfigError, ValueError) as exc:
            server.abort_round()
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"aggregation='secagg' with {len(nodes)} SuperNodes: {exc}") from None
        asked = len(nodes)
        try:
            setup = self._stage(Stage.SETUP, session.setup_requests())
            keys_req = self._receive(session.receive_setup, setup)
            keys = self._stage(Stage.SHARE_KEYS, keys_req)
            collect_req = self._receive(session.receive_keys, keys)
            extra = {"scale": plan.scale, "local-sigma": plan.local_sigma}
            public: dict[int, P.ValidReply] = {}

            def parse_public(node: int, reply: Message) -> None:
                public[node] = self._public(node, reply)

            collected = self._stage(Stage.COLLECT, collect_req, extra=extra,
                                    content={n: train[n].content for n in collect_req}, check=parse_public)
            confirm_req = self._receive(session.receive_collect, collected)
            confirms = self._stage(Stage.UNMASK, confirm_req)
            digest = round_digest({name: a.numpy() for name, a in arrays.items()},
                                  clipping_norm=state.clipping_norm, scale=plan.scale,
                                  local_sigma=plan.local_sigma)
            unmask_req = self._receive(lambda replies: session.receive_confirm(replies, digest), confirms)
        except _Aborted as exc:
            log.warning("round %d: %s; no unmask, no step, nothing charged", server_round, exc)
            server.abort_round(RoundStats(replies=0, rejected=0, asked=asked))
            return None
        u3 = sorted(session.u3)
        stats = RoundStats(replies=len(u3), rejected=0, asked=asked)
        server.charge_round()  # write-ahead: before anything of the round is released
        try:
            shares = self._stage(Stage.UNMASK, unmask_req)
            result = self._receive(session.receive_unmask, shares)
        except _Aborted as exc:
            log.warning("round %d: unmask failed after the charge (%s): charged, no step", server_round, exc)
            return server.abort_round(stats)
        total = decode(result.total, clip=state.clipping_norm, scale=plan.scale)
        del result
        private = self._tensors(total)
        valid = [public[n] for n in u3 if n in public]
        return server.finish_round(
            [private],
            [[torch.from_numpy(np.array(a, dtype=np.float32)) for a in v.public] for v in valid
             if v.public is not None],
            sum(v.public_count for v in valid),
            sum(v.public_loss_sum for v in valid),
            stats,
        )

    # ---------------------------------------------------------------- helpers
    def _tensors(self, flat: np.ndarray) -> list[torch.Tensor]:
        out, at = [], 0
        for shape in self.engine.shapes.values():
            size = int(np.prod(shape)) if shape else 1
            out.append(torch.from_numpy(np.array(flat[at : at + size], dtype=np.float32).reshape(shape)))
            at += size
        if at != flat.size:
            raise RuntimeError(f"decoded sum of {flat.size} coordinates for {at} parameters")
        return out

    def _public(self, node: int, reply: Message) -> P.ValidReply:
        """The collect reply's public part, checked as a plain reply's (no private arrays)."""
        current = self.engine.in_flight
        if current is None:  # pragma: no cover - a round is in flight
            raise RuntimeError("no round in flight")
        content = reply.content
        arrays = get_record(content, MASKED, ArrayRecord)
        pub = unpack_public(arrays[PUBLIC_SUM].numpy(), self.engine.shapes) if PUBLIC_SUM in arrays else None
        metrics = find_record(content, P.METRICS, MetricRecord)
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float)} if metrics else None
        return P.validate_reply(
            private=None, public=pub, metrics=scalars, expected=self.engine.shapes, want_private=False,
            want_public=current.phase.public, clipping_norm=None, max_private_records=0,
            public_count_asked=self.orders.of(node).public_count,
        )

    def _stage(
        self,
        stage: Stage,
        requests: Mapping[int, Any],
        *,
        extra: Mapping[str, float] | None = None,
        content: Mapping[int, RecordDict] | None = None,
        check: Callable[[int, Message], None] | None = None,
    ) -> dict[int, Any]:
        """Send one stage's requests; the parsed replies by node (an error reply, a malformed
        or unexpected one is a dropout, logged).
        """
        kinds = {type(r) for r in requests.values()}
        if len(kinds) > 1:  # pragma: no cover - the session sends one kind per exchange
            raise RuntimeError(f"{stage.action}: requests of several kinds {kinds}")
        cls = REPLY_TO[kinds.pop()] if kinds else CollectReply
        messages = []
        for node, request in requests.items():
            body = RecordDict(dict(content[node]) if content is not None else {})
            body[SECAGG] = ConfigRecord({**to_wire(request), **(extra or {})})
            messages.append(Message(body, message_type=stage.message_type, dst_node_id=node))
        got: dict[int, Any] = {}
        for reply in exchange(self.grid, messages, self.timeout):
            node = reply.metadata.src_node_id
            if self.keep_replies:
                self.received.append((stage.action, node, reply))
            if node not in requests or node in got:
                log.warning("%s: dropped a reply from node %s (not asked, or a duplicate)", stage.action,
                            node)
                continue
            if reply.has_error():
                log.warning("%s: node %s dropped out: %s", stage.action, node, reply.error.reason)
                continue
            try:
                masked = None
                if cls is CollectReply:
                    masked = get_record(reply.content, MASKED, ArrayRecord)[MASKED].numpy()
                got[node] = from_wire(cls, get_record(reply.content, SECAGG, ConfigRecord), masked)
                if check is not None:
                    check(node, reply)
            except (KeyError, TypeError, ValueError, MessageError, P.InvalidReply) as exc:
                got.pop(node, None)
                log.warning("%s: rejected the reply of node %s: %s", stage.action, node, exc)
        return got

    @staticmethod
    def _receive(receive: Callable[[list[Any]], Any], replies: dict[int, Any]) -> Any:
        """``receive(replies)``, dropping a reply the session refuses as malformed
        (:class:`MessageError` naming its node); survivor and threshold failures abort.
        """
        replies = dict(replies)
        while True:
            try:
                return receive(list(replies.values()))
            except MessageError as exc:
                if exc.node_id is None or exc.node_id not in replies:
                    raise
                log.warning("dropped the reply of node %s: %s", exc.node_id, exc)
                del replies[exc.node_id]
            except (TooFewSurvivors, ThresholdError, ConsistencyError, ReconstructionError) as exc:
                raise _Aborted(str(exc)) from None
