"""Test-only ClientApp: ``fedfdp run``'s simulation ClientApp, with chosen SuperNodes
dropping out of the secure-aggregation collect stage.

Staged into a simulation app by ``tests/test_secagg_run.py`` in place of
``clients.client_app:simulation_app``, so the production ClientApp has no switch.
Every message goes to the real ClientApp; a node whose ``partition-id`` is in
:data:`DROP_AT_COLLECT` raises in ``train.sa_collect`` (Flower sends the server an
error reply: the node is a dropout).
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients.client_app import make_client_app

#: Partitions whose SuperNode fails the collect stage.
DROP_AT_COLLECT = frozenset({2})

_real = make_client_app(simulation=True)
app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    return _real(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _real(msg, context)


@app.train("sa_setup")
def sa_setup(msg: Message, context: Context) -> Message:
    return _real(msg, context)


@app.train("sa_keys")
def sa_keys(msg: Message, context: Context) -> Message:
    return _real(msg, context)


@app.train("sa_collect")
def sa_collect(msg: Message, context: Context) -> Message:
    if int(context.node_config["partition-id"]) in DROP_AT_COLLECT:
        raise RuntimeError("this SuperNode drops out in the collect stage")
    return _real(msg, context)


@app.train("sa_unmask")
def sa_unmask(msg: Message, context: Context) -> Message:
    return _real(msg, context)
