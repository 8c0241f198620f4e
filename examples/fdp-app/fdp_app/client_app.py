"""ClientApp: each SuperNode is one device and answers with fedfdp's two handlers."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients import fdp_query, fdp_train
from fdp_app.task import FEATURE_MAP, Net, load_partition

app = ClientApp()


def _devices(context: Context):
    node = context.node_config
    return load_partition(int(node["partition-id"]), int(node["num-partitions"]))


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Registration: this node's device and its (public) record count."""
    return fdp_query(msg, _devices(context))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round: clipped private sum over a Poisson batch, public sum over a public batch."""
    return fdp_train(msg, Net(), FEATURE_MAP, _devices(context), public_seed=int(context.run_config["seed"]))
