"""Drive the real ClientApp and strategy code paths in one process, without Ray.

Flower's simulation engine starts Ray and a SuperLink; for tests and for the
privacy audit (``fedfdp audit``) that is heavy and hides the messages. The
helpers here deliver :class:`flwr.app.Message` objects straight to the real
client handlers (:func:`clients.client_app.handle_train`,
:func:`clients.client_app.handle_query`) and back to the real
:class:`~strategies.fdp_strategy.FDPStrategy`, so every byte the server sees
comes from the same code a deployment runs.

``serving(data)`` makes the client handlers read an explicit
:class:`~fedfdp.data.FederatedData` instead of the dataset the configuration
names (the audit's canary datasets are built in memory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import clients.client_app as client_app
from fedfdp import protocol as P
from fedfdp.config import Config
from fedfdp.data import FederatedData, load_dataset
from strategies.fdp_strategy import FDPStrategy

Tamper = Callable[[int, Message, Message], Message | None]


def set_identity() -> None:
    """Messages need a run/node/task identity; give them fixed in-process values."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


def node_context(cfg: Config, node: int, num_partitions: int | None = None) -> Context:
    """Context of the node serving partition ``node`` of ``num_partitions``
    (default: one device per node, ``num-devices`` partitions)."""
    parts = cfg.data.num_devices if num_partitions is None else num_partitions
    return Context(
        run_id=1,
        node_id=node,
        node_config={"partition-id": node, "num-partitions": parts},
        state=RecordDict(),
        run_config={},
    )


@contextlib.contextmanager
def serving(data: FederatedData | None) -> Iterator[None]:
    """Within the block the client handlers read ``data`` (``None``: the
    configured dataset, i.e. no change)."""
    if data is None:
        yield
        return
    original = client_app.load_dataset
    client_app.load_dataset = lambda _cfg: data  # type: ignore[assignment]
    try:
        yield
    finally:
        client_app.load_dataset = original  # type: ignore[assignment]


def registered_strategy(cfg: Config, data: FederatedData | None = None) -> FDPStrategy:
    """A resolved strategy whose registry holds one node per device (node id = device id)."""
    set_identity()
    data = load_dataset(cfg.data) if data is None else data
    strat = FDPStrategy(cfg, data)
    strat.registry = {d: ([d], [len(dev)]) for d, dev in enumerate(data.devices)}
    strat.resolve()
    return strat


def client_reply(cfg: Config, msg: Message, *, num_partitions: int | None = None) -> Message:
    """The real client computation for one train message."""
    node = msg.metadata.dst_node_id
    state = msg.content[P.ARRAYS].to_torch_state_dict()
    context = node_context(cfg, node, num_partitions)
    private, public, metrics = client_app.handle_train(cfg, context, state, msg.content[P.CONFIG])
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
        Serve these records instead of the configured dataset (see :func:`serving`).
    """

    def __init__(self, cfg: Config, tamper: Tamper | None = None, data: FederatedData | None = None) -> None:
        set_identity()
        self.cfg = cfg
        self.tamper = tamper
        self.data = data

    def get_node_ids(self) -> list[int]:
        return list(range(self.cfg.data.num_devices))

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        out = []
        with serving(self.data):
            for msg in messages:
                node = msg.metadata.dst_node_id
                if msg.metadata.message_type == "query":
                    info = client_app.handle_query(self.cfg, node_context(self.cfg, node))
                    reply = Message(RecordDict({P.METRICS: MetricRecord(info)}), reply_to=msg)
                else:
                    reply = client_reply(self.cfg, msg)
                if self.tamper is not None:
                    reply = self.tamper(node, msg, reply)
                if reply is not None:
                    out.append(reply)
        return out
