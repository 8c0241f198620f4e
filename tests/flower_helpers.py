"""Drive the real ClientApp/strategy code paths without a Flower runtime (mock replies)."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from clients.client_app import handle_train
from fedfdp import protocol as P
from fedfdp.config import Config
from fedfdp.data import load_dataset
from strategies.fdp_strategy import FDPStrategy


def set_identity() -> None:
    """Messages need a run/node/task identity; give them test values."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


def node_context(cfg: Config, node: int) -> Context:
    """Context of the node serving partition ``node`` (one device per node)."""
    return Context(
        run_id=1,
        node_id=node,
        node_config={"partition-id": node, "num-partitions": cfg.data.num_devices},
        state=RecordDict(),
        run_config={},
    )


def registered_strategy(cfg: Config) -> FDPStrategy:
    """A strategy whose registry holds one node per device (node id = device id)."""
    set_identity()
    data = load_dataset(cfg.data)
    strat = FDPStrategy(cfg, data)
    strat.registry = {d: ([d], [len(dev)]) for d, dev in enumerate(data.devices)}
    strat.resolve()
    return strat


def client_reply(cfg: Config, msg: Message) -> Message:
    """The real client computation for one train message."""
    node = msg.metadata.dst_node_id
    state = msg.content[P.ARRAYS].to_torch_state_dict()
    private, public, metrics = handle_train(cfg, node_context(cfg, node), state, msg.content[P.CONFIG])
    content = RecordDict({P.METRICS: MetricRecord(metrics)})
    if private is not None:
        content[P.PRIVATE] = ArrayRecord(private)
    if public is not None:
        content[P.PUBLIC] = ArrayRecord(public)
    return Message(content, reply_to=msg)


def train_messages(strat: FDPStrategy, round_: int) -> list[Message]:
    """Messages the strategy sends in ``round_``."""
    arrays = ArrayRecord(strat.model.state_dict())
    return list(strat.configure_train(round_, arrays, ConfigRecord(), grid=None))  # type: ignore[arg-type]


class InProcessGrid:
    """A Grid stand-in that delivers messages to the real ClientApp handlers in-process.

    ``tamper(node, message, reply) -> reply or None`` may rewrite or drop replies.
    """

    def __init__(self, cfg: Config, tamper=None) -> None:
        from clients.client_app import handle_query

        set_identity()
        self.cfg = cfg
        self.tamper = tamper
        self._query = handle_query

    def get_node_ids(self):
        return list(range(self.cfg.data.num_devices))

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "query":
                info = self._query(self.cfg, node_context(self.cfg, node))
                reply = Message(RecordDict({P.METRICS: MetricRecord(info)}), reply_to=msg)
            else:
                reply = client_reply(self.cfg, msg)
            if self.tamper is not None:
                reply = self.tamper(node, msg, reply)
            if reply is not None:
                out.append(reply)
        return out
