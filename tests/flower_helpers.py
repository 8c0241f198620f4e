"""Drive the real ClientApp/strategy code paths without a Flower runtime.

The helpers live in :mod:`simulations.auditing.inprocess` (the privacy audit uses them
too); this module re-exports them for the tests.
"""

from clients.client_app import reply_message
from simulations.auditing.inprocess import (
    InProcessGrid,
    client_reply,
    node_context,
    node_records_for,
    registered_strategy,
    set_identity,
    train_messages,
)

__all__ = [
    "InProcessGrid",
    "client_reply",
    "node_context",
    "node_records_for",
    "registered_strategy",
    "reply_message",
    "set_identity",
    "train_messages",
]
