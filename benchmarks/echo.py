"""The ClientApp of the speed benchmarks: FDP messages go to fedfdp's ClientApp,
every other train message is echoed (bare FedAvg, the Flower baseline)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fdp_or_echo(fdp: Callable[[Any, Any], Any]) -> Any:
    """A Flower ``ClientApp``: queries and FDP train messages (those whose config
    names a phase) to ``fdp(msg, context)``; other train messages answered with
    the received arrays (a FedAvg client that only echoes the model)."""
    from flwr.app import Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from fedfdp import protocol as P

    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return fdp(msg, context)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        config = msg.content.config_records.get(P.CONFIG)
        if config is not None and P.PHASE in config:
            return fdp(msg, context)
        content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})})
        return Message(content, reply_to=msg)

    return app
