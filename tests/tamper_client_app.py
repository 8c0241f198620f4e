"""Test-only ClientApp: the real fedfdp client, with a corrupted reply on chosen nodes.

Used by ``tests/test_deploy.py`` as the ClientApp of a separate, test-only
Flower App (:func:`tests.deploy_helpers.stage_app` copies this file to the
app's root and names ``tamper_client_app:app`` as its ClientApp), so that the
production ClientApp has no tamper switch.

Every message goes through the real ClientApp (:data:`clients.client_app.app`).
A SuperNode started with ``--node-config "... tamper=\\"nan\\""`` then replaces
every private array of its train replies with NaN before sending — a reply
the server must reject (:func:`fedfdp.protocol.validate_reply`).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from clients.client_app import make_client_app
from fedfdp import protocol as P

_real = make_client_app()
app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    return _real(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    reply = _real(msg, context)
    kind = str(context.node_config.get("tamper", ""))
    if kind and not reply.has_error() and P.PRIVATE in reply.content.array_records:
        if kind != "nan":
            raise ValueError(f"tamper={kind!r}: unknown (known: nan)")
        private = reply.content.array_records[P.PRIVATE].to_torch_state_dict()
        nan = {k: torch.full_like(v, float("nan")) for k, v in private.items()}
        reply.content[P.PRIVATE] = ArrayRecord(nan)
    return reply
