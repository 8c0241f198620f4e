"""Test-only ClientApp for the secure-aggregation deployment tests (tests/test_secagg_deploy.py):
the real fedfdp ClientApp, with a SuperNode that stops inside a chosen stage so that the
test can kill it there.

Staged by :func:`tests.deploy_helpers.stage_app` as the ClientApp of a test-only Flower App,
so the production ClientApp has no switch. Every message goes to the real ClientApp
(:func:`clients.client_app.make_client_app`). A SuperNode started with
``--node-config "... hang-at='sa_collect' marker-dir='/path'"`` (or ``'sa_unmask'``), on
receiving that stage's message, writes ``/path/<stage>-p<partition-id>`` (the pid of the
ClientApp process handling it) and then sleeps instead of answering: the test sees the file
and kills the SuperNode (SIGKILL), which is then a node lost inside that stage. With
``hang-when='after'`` (default ``'before'``) the node first computes its whole reply (for
``sa_collect``: its policy's write-ahead charge, training, the masked vector) and hangs
before returning it: a node that dies after charging itself, its masked vector never sent.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients.client_app import make_client_app

#: How long a hung handler sleeps (the test kills it long before).
HANG_SECONDS = 600.0

_real = make_client_app()
app = ClientApp()


def _maybe_hang(stage: str, context: Context, when: str = "before") -> None:
    """Write the marker and sleep when this node is told to hang at ``stage``, ``when``
    (``before`` or ``after`` computing its reply: node config ``hang-when``)."""
    if str(context.node_config.get("hang-at", "")) != stage:
        return
    if str(context.node_config.get("hang-when", "before")) != when:
        return
    folder = Path(str(context.node_config["marker-dir"]))
    partition = int(context.node_config["partition-id"])
    marker = folder / f"{stage}-p{partition}"
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(str(os.getpid()))
    tmp.replace(marker)  # appears whole
    time.sleep(HANG_SECONDS)


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
    _maybe_hang("sa_collect", context)
    reply = _real(msg, context)
    _maybe_hang("sa_collect", context, "after")
    return reply


@app.train("sa_unmask")
def sa_unmask(msg: Message, context: Context) -> Message:
    _maybe_hang("sa_unmask", context)
    return _real(msg, context)
