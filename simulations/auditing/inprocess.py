"""One round of the real strategy in this process: the audit's driver.

The privacy audit (``fedfdp audit``, :mod:`simulations.auditing.canaries`,
:mod:`simulations.auditing.corrdp`) runs thousands of single rounds of the real
:class:`~strategies.fdp_strategy.FDPStrategy` and the real client handler
(:func:`clients.client_app.handle_train`) with crafted canary datasets built in
memory. Starting Flower's runtime (Ray and a SuperLink) per trial would be
heavy and would hide the messages, so the audit builds the round's messages
here and hands them to the handler itself:

:func:`set_identity`
    the run/node/task identity every :class:`flwr.app.Message` needs, fixed
    in-process values;
:func:`train_messages`
    the messages the strategy sends in a round (its ``configure_train``: the
    phase, the budget check and the write-ahead charge, the sampling plan's
    draw), without a Grid.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Message

from clients.flower_adapter import set_task_identity
from strategies.fdp_strategy import FDPStrategy


def set_identity() -> None:
    """Messages need a run/node/task identity; give them fixed in-process values."""
    set_task_identity(run_id=1, node_id=0, task_id=1)


def train_messages(strat: FDPStrategy, round_: int) -> list[Message]:
    """Messages the strategy sends in ``round_`` (``configure_train`` does not use its Grid)."""
    arrays = ArrayRecord(strat.model.state_dict())
    return list(strat.configure_train(round_, arrays, ConfigRecord(), grid=None))  # type: ignore[arg-type]
