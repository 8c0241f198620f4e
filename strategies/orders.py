"""The train instructions of a round, and what each node was asked.

:class:`TrainOrders` turns the round the engine began (:class:`fedfdp.round_engine.RoundState`:
its phase, attempt, the sampling plan's draw and ``C``) into one
:class:`~fedfdp.protocol.TrainInstruction` message per node with work — its devices,
their public counts and private flags, never a seed or a secret — and remembers what
each node was asked (its devices, the bound on its private records, its public count),
against which its reply is checked. The plain round and the secure-aggregation round
driver share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from fedfdp import protocol as P
from fedfdp.round_engine import RoundEngine, RoundState


@dataclass(frozen=True)
class Asked:
    """What one node was asked in the round in flight."""

    devices: tuple[int, ...]
    record_bound: int
    public_count: int


class TrainOrders:
    """The instructions of each round of ``engine`` (module docstring).

    Parameters
    ----------
    engine : RoundEngine
    owners : sequence of int
        The node serving each device, by device id (default: the sampling plan's nodes).
    """

    def __init__(self, engine: RoundEngine, owners: Sequence[int] = ()) -> None:
        self.engine = engine
        self.owners = list(owners) or [int(n) for n in engine.sampling.device_nodes]
        self.asked: dict[int, Asked] = {}
        self.round: int | None = None

    def messages(self, server_round: int, state: RoundState, arrays: ArrayRecord,
                 config: ConfigRecord) -> list[Message]:
        """One train message per node with work in the round ``state`` began."""
        sampling, mechanism = self.engine.sampling, self.engine.mechanism
        plan = state.plan
        by_node: dict[int, list[int]] = {}
        for d in plan.asked().tolist():
            by_node.setdefault(self.owners[d], []).append(d)
        self.asked = {}
        self.round = server_round
        messages = []
        for node, devices in by_node.items():
            idx = np.asarray(devices, dtype=np.int64)
            order = P.TrainInstruction(
                round=server_round,
                attempt=state.attempt,
                phase=state.phase.name,
                unit=mechanism.unit,
                sampling_rate=mechanism.sampling.sampling_rate,
                clipping_norm=state.clipping_norm,
                device_ids=tuple(devices),
                public_counts=tuple(plan.public_counts[idx].tolist()),
                private_flags=tuple(plan.private[idx].tolist()),
            )
            self.asked[node] = Asked(tuple(devices), sampling.record_bound(plan, devices),
                                     sum(order.public_counts))
            cfg_rec = ConfigRecord(dict(config))
            cfg_rec.update(order.to_config())
            content = RecordDict({P.ARRAYS: arrays, P.CONFIG: cfg_rec})
            messages.append(Message(content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def of(self, node: int) -> Asked:
        """What ``node`` was asked this round (:class:`~fedfdp.protocol.InvalidReply` if nothing)."""
        if node not in self.asked:
            raise P.InvalidReply("reply from a node that was not asked this round")
        return self.asked[node]
