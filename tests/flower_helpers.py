"""Drive the real ClientApp and strategy code paths in one process, without a Flower runtime.

Flower's simulation engine starts Ray and a SuperLink; for most tests that is
heavy and hides the messages. :class:`InProcessGrid` is a real
:class:`flwr.serverapp.Grid`: the strategy pushes its messages and polls for
replies through ``push_messages``/``pull_messages`` exactly as on a SuperLink
(:func:`strategies.transport.exchange`), and each pushed message is answered
at once by the real client handlers (:meth:`clients.node_runtime.NodeRuntime.train`,
:func:`clients.client_app.handle_query`), so every byte the server sees comes
from the code a deployment runs. A reply that a tamper function drops never
arrives: the strategy waits for it until its round timeout, as it would for a
lost node.

The handlers take the node's records explicitly
(:class:`clients.node_runtime.NodeRecords`); :func:`node_records_for` builds
them from the configured dataset or from an explicit
:class:`~fedfdp.data.FederatedData`, and :func:`node_runtime_for` the node's runtime
(its records and the plan :func:`fedfdp.run_plan.build_node_plan` makes of them).

``set_identity`` and ``train_messages`` are the privacy audit's own
(:mod:`simulations.auditing.inprocess`), re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any
from uuid import uuid4

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

import clients.client_app as client_app
from clients.client_app import reply_message
from clients.node_runtime import NodeRecords, NodeRuntime, node_records
from fedfdp import protocol as P
from fedfdp.config import Config
from fedfdp.contribution import ClientParts
from fedfdp.data import FederatedData, load_dataset
from fedfdp.round_engine import ServerParts
from fedfdp.run_plan import build_node_plan, build_plan
from simulations.auditing.inprocess import set_identity, train_messages
from strategies.fdp_strategy import FDPStrategy

__all__ = [
    "InProcessGrid",
    "client_reply",
    "node_context",
    "node_records_for",
    "node_runtime_for",
    "registered_strategy",
    "reply_message",
    "set_identity",
    "train_messages",
]

Tamper = Callable[[int, Message, Message], Message | None]


def node_context(
    cfg: Config, node: int, num_partitions: int | None = None, node_config: Mapping[str, Any] | None = None
) -> Context:
    """Context of the node serving partition ``node`` of ``num_partitions``
    (default: one device per node, ``num-devices`` partitions), with extra
    ``node_config`` keys (e.g. a SuperNode's own ``data-path``)."""
    parts = cfg.data.num_devices if num_partitions is None else num_partitions
    return Context(
        run_id=1,
        node_id=node,
        node_config={"partition-id": node, "num-partitions": parts, **(node_config or {})},
        state=RecordDict(),
        run_config={},
    )


def node_records_for(
    cfg: Config,
    node: int,
    data: FederatedData | None = None,
    num_partitions: int | None = None,
    node_config: Mapping[str, Any] | None = None,
) -> NodeRecords:
    """The records node ``node`` serves: partition ``node`` of ``num_partitions``
    (default: one device per node) of ``data``; without ``data``, what the real
    ClientApp reads for that node (:func:`clients.node_runtime.node_records`)."""
    if data is not None:
        parts = cfg.data.num_devices if num_partitions is None else num_partitions
        return NodeRecords.partition_of(data, node, parts)
    return node_records(cfg.data, node_context(cfg, node, num_partitions, node_config).node_config)


def node_runtime_for(cfg: Config, records: NodeRecords, parts: ClientParts | None = None) -> NodeRuntime:
    """A node's runtime over ``records``, built afresh (the ClientApp keeps one per run)."""
    return NodeRuntime(records, build_node_plan(cfg, records.data, parts))


def registered_strategy(
    cfg: Config, data: FederatedData | None = None, parts: ServerParts | None = None
) -> FDPStrategy:
    """A resolved strategy whose registry holds one node per device (node id = device id)."""
    set_identity()
    data = load_dataset(cfg.data) if data is None else data
    strat = FDPStrategy(build_plan(cfg, data, server_parts=parts, num_devices=len(data.devices)))
    strat.registry = {d: ([d], [len(dev)]) for d, dev in enumerate(data.devices)}
    strat.resolve()
    return strat


def client_reply(
    cfg: Config,
    msg: Message,
    *,
    num_partitions: int | None = None,
    data: FederatedData | None = None,
    parts: ClientParts | None = None,
) -> Message:
    """The real client computation for one train message."""
    records = node_records_for(cfg, msg.metadata.dst_node_id, data, num_partitions)
    state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
    runtime = node_runtime_for(cfg, records, parts)
    private, public, metrics = runtime.train(state, msg.content.config_records[P.CONFIG])
    return reply_message(msg, private, public, metrics)


def assign_message_id(msg: Message) -> str:
    """Give ``msg`` a fresh message id, as a SuperLink does when a message is
    pushed (Flower's ``Metadata`` has no public setter: its own grids write the
    field the same way); replies made with ``reply_to=msg`` then carry it."""
    msg_id = str(uuid4())
    msg.metadata.__dict__["_message_id"] = msg_id
    return msg_id


class InProcessGrid(Grid):
    """A :class:`flwr.serverapp.Grid` whose nodes are the real ClientApp handlers, in-process.

    ``push_messages`` hands each message to :meth:`answer` at once and keeps
    the reply until ``pull_messages`` asks for it. Subclasses change
    :meth:`answer` (what a node replies) or :meth:`get_node_ids` (which nodes
    exist).

    Parameters
    ----------
    cfg : Config
    tamper : callable, optional
        ``tamper(node, message, reply) -> reply or None`` may rewrite or drop
        replies (a dropped reply never arrives).
    data : FederatedData, optional
        Serve these records instead of the configured dataset.
    node_configs : mapping of node -> node config, optional
        Extra node-config keys per node (e.g. each SuperNode's ``data-path``).
    parts : ClientParts, optional
        The nodes' components (default: as the configuration says).
    """

    def __init__(
        self,
        cfg: Config,
        tamper: Tamper | None = None,
        data: FederatedData | None = None,
        node_configs: Mapping[int, Mapping[str, Any]] | None = None,
        parts: ClientParts | None = None,
    ) -> None:
        set_identity()
        self.cfg = cfg
        self.tamper = tamper
        self.data = data
        self.node_configs = dict(node_configs or {})
        self.parts = parts
        self.replies: dict[str, Message] = {}
        self._run: Any = None

    # ---------------------------------------------------------------- the nodes
    def records(self, node: int) -> NodeRecords:
        """The records node ``node`` serves."""
        return node_records_for(self.cfg, node, self.data, node_config=self.node_configs.get(node))

    def answer(self, msg: Message) -> Message:
        """Node ``msg.metadata.dst_node_id``'s reply to ``msg`` (the real handlers)."""
        records = self.records(msg.metadata.dst_node_id)
        if msg.metadata.message_type == "query":
            info = MetricRecord(client_app.handle_query(records))
            return Message(RecordDict({P.METRICS: info}), reply_to=msg)
        state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
        runtime = node_runtime_for(self.cfg, records, self.parts)
        return reply_message(msg, *runtime.train(state, msg.content.config_records[P.CONFIG]))

    # ---------------------------------------------------------------- Grid API
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        if self._run is None:
            raise RuntimeError("InProcessGrid: no run set")
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(range(self.cfg.data.num_devices))

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg_id = assign_message_id(msg)
            answer = self.answer(msg)
            reply = answer if self.tamper is None else self.tamper(msg.metadata.dst_node_id, msg, answer)
            if reply is not None:
                self.replies[msg_id] = reply
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The asked-for replies that arrived, in the order their messages were pushed
        (the strategy sums replies in the order it receives them: a fixed order keeps
        reproducible runs bitwise equal)."""
        wanted = set(message_ids)
        ready = [i for i in self.replies if i in wanted]
        return [self.replies.pop(i) for i in ready]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Every reply that arrives (all were answered when pushed)."""
        return self.pull_messages(self.push_messages(messages))
