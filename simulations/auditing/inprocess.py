"""Drive the real ClientApp and strategy code paths in one process, without Ray.

Flower's simulation engine starts Ray and a SuperLink; for tests and for the
privacy audit (``fedfdp audit``) that is heavy and hides the messages. The
helpers here deliver :class:`flwr.app.Message` objects straight to the real
client handlers (:func:`clients.client_app.handle_train`,
:func:`clients.client_app.handle_query`) and back to the real
:class:`~strategies.fdp_strategy.FDPStrategy`, so every byte the server sees
comes from the same code a deployment runs.

The handlers take the node's records explicitly
(:class:`clients.client_app.NodeRecords`); :func:`node_records_for` builds
them from the configured dataset or from an explicit
:class:`~fedfdp.data.FederatedData` (the audit's canary datasets are built in
memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import clients.client_app as client_app
from fedfdp import protocol as P
from fedfdp.config import Config
from fedfdp.contribution import ClientParts
from fedfdp.data import FederatedData, load_dataset
from fedfdp.models import build_model_for
from fedfdp.parts import server_parts_for
from fedfdp.server import ServerParts, held_out_evaluation
from strategies.fdp_strategy import FDPStrategy

Tamper = Callable[[int, Message, Message], Message | None]


def set_identity() -> None:
    """Messages need a run/node/task identity; give them fixed in-process values."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


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
) -> client_app.NodeRecords:
    """The records node ``node`` serves: partition ``node`` of ``num_partitions``
    (default: one device per node) of ``data``; without ``data``, what the real
    ClientApp reads for that node (:func:`clients.client_app.node_records`)."""
    if data is not None:
        parts = cfg.data.num_devices if num_partitions is None else num_partitions
        return client_app.NodeRecords.partition_of(data, node, parts)
    return client_app.node_records(cfg, node_context(cfg, node, num_partitions, node_config))


def registered_strategy(
    cfg: Config, data: FederatedData | None = None, parts: ServerParts | None = None
) -> FDPStrategy:
    """A resolved strategy whose registry holds one node per device (node id = device id)."""
    set_identity()
    data = load_dataset(cfg.data) if data is None else data
    parts = parts if parts is not None else server_parts_for(cfg, data)
    strat = FDPStrategy(build_model_for(cfg, data), cfg, num_devices=len(data.devices), parts=parts)
    strat.server.evaluate_fn = held_out_evaluation(data.test_x, data.test_y)
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
    state = msg.content[P.ARRAYS].to_torch_state_dict()
    private, public, metrics = client_app.handle_train(cfg, records, state, msg.content[P.CONFIG], parts)
    return client_app.reply_message(msg, private, public, metrics)


def train_messages(strat: FDPStrategy, round_: int) -> list[Message]:
    """Messages the strategy sends in ``round_``."""
    arrays = ArrayRecord(strat.model.state_dict())
    return list(strat.configure_train(round_, arrays, ConfigRecord(), grid=None))  # type: ignore[arg-type]


class InProcessGrid:
    """A Grid stand-in that delivers messages to the real ClientApp handlers in-process.

    Parameters
    ----------
    cfg : Config
    tamper : callable, optional
        ``tamper(node, message, reply) -> reply or None`` may rewrite or drop replies.
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

    def records(self, node: int) -> client_app.NodeRecords:
        """The records node ``node`` serves."""
        return node_records_for(self.cfg, node, self.data, node_config=self.node_configs.get(node))

    def get_node_ids(self) -> list[int]:
        return list(range(self.cfg.data.num_devices))

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        out = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            records = self.records(node)
            if msg.metadata.message_type == "query":
                info = client_app.handle_query(records)
                reply = Message(RecordDict({P.METRICS: MetricRecord(info)}), reply_to=msg)
            else:
                state = msg.content[P.ARRAYS].to_torch_state_dict()
                result = client_app.handle_train(self.cfg, records, state, msg.content[P.CONFIG], self.parts)
                reply = client_app.reply_message(msg, *result)
            if self.tamper is not None:
                reply = self.tamper(node, msg, reply)
            if reply is not None:
                out.append(reply)
        return out
