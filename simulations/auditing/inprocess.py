"""One round of the real strategy in this process: the audit's driver.

The privacy audit (``fedfdp audit``, :mod:`simulations.auditing.canaries`,
:mod:`simulations.auditing.corrdp`) runs thousands of single rounds of the real
:class:`~strategies.fdp_strategy.FDPStrategy` and the real client handler
(:func:`node_train`: :meth:`clients.node_runtime.NodeRuntime.train`) with crafted canary datasets built in
memory. Starting Flower's runtime (Ray and a SuperLink) per trial would be
heavy and would hide the messages, so the audit builds the round's messages
here and hands them to the handler itself:

:func:`set_identity`
    the run/node/task identity every :class:`flwr.app.Message` needs, fixed
    in-process values;
:func:`train_messages`
    the messages the strategy sends in a round (its ``configure_train``: the
    phase, the budget check and the write-ahead charge, the sampling plan's
    draw), without a Grid;
:func:`node_train`
    a node's answer to one train instruction on given records (a node runtime built
    afresh from the configuration, with injected components).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message

from clients.flower_adapter import set_task_identity
from clients.node_runtime import MetricValues, NodeRecords, NodeRuntime
from fedfdp.config import Config
from fedfdp.contribution import ClientParts
from fedfdp.run_plan import build_node_plan
from strategies.fdp_strategy import FDPStrategy

Arrays = dict[str, torch.Tensor] | None


def set_identity() -> None:
    """Messages need a run/node/task identity; give them fixed in-process values."""
    set_task_identity(run_id=1, node_id=0, task_id=1)


def train_messages(strat: FDPStrategy, round_: int) -> list[Message]:
    """Messages the strategy sends in ``round_`` (``configure_train`` does not use its Grid)."""
    arrays = ArrayRecord(strat.model.state_dict())
    return list(strat.configure_train(round_, arrays, ConfigRecord(), grid=None))  # type: ignore[arg-type]


def node_train(
    cfg: Config,
    records: NodeRecords,
    state: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    parts: ClientParts | None = None,
) -> tuple[Arrays, Arrays, dict[str, MetricValues]]:
    """The real node's answer on ``records`` to one train instruction: (private sums,
    public sums, metrics), from a node runtime built afresh (``parts``: injected node
    components; default the mode's, secret entropy as ``cfg`` asks).
    """
    return NodeRuntime(records, build_node_plan(cfg, records.data, parts)).train(state, config)
