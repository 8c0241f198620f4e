"""Flower Message-API strategy for feature-DP training (the server half of Algorithm 1).

The privacy-deciding work is the round engine's
(:class:`fedfdp.round_engine.RoundEngine`, the same server half the centralised engine
runs, built by the run plan once the device sizes are known); this module is its Flower
transport:

``configure_train``
    :meth:`RoundEngine.begin_round` — phase, budget check and write-ahead charge,
    then the sampling plan's draw (:mod:`fedfdp.sampling_plan`) — and one
    :class:`~fedfdp.protocol.TrainInstruction` per node with work
    (:class:`strategies.orders.TrainOrders`): its devices, their public counts and
    private flags. The instruction carries no seed and no secret.
``aggregate_train``
    validates each reply (:func:`fedfdp.protocol.validate_reply`; invalid
    replies are logged with node id and reason and dropped, never touching the
    model or the ledger), then :meth:`RoundEngine.finish_round`: noise once from
    the server's secret stream, divide by the plan's normaliser, add the public
    gradient, step.

With ``aggregation = "secagg"`` a private round is instead one secure-aggregation
round of four stages (:class:`strategies.secagg_round.SecAggRound`): the server only
ever holds masked vectors and their sum, adds no noise, and charges the round after
the collect stage (an aborted round is never charged).

:meth:`FDPStrategy.start` runs the rounds: it first waits until nodes covering
every device have registered and learns the device sizes (``N`` is public),
resolves σ/δ (:meth:`fedfdp.run_plan.RunPlan.engine`), and hands the rounds to the run
loop (:class:`fedfdp.run_loop.RunLoop`: budget stop, server-side evaluation on held-out
data, ``metrics.csv``, checkpoints).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from clients.records import find_record
from fedfdp import protocol as P
from fedfdp.config import ConfigError
from fedfdp.evaluation import EvaluateFn
from fedfdp.ledger import Ledger
from fedfdp.mechanism import ResolvedMechanism
from fedfdp.round_engine import RoundEngine, RoundOutcome, RoundState, RoundStats
from fedfdp.run_loop import RunLoop
from fedfdp.run_plan import RunPlan
from strategies.orders import TrainOrders
from strategies.secagg_round import SecAggRound
from strategies.transport import exchange

log = logging.getLogger("fedfdp.server")

#: Nodes queried per ``send_and_receive`` while registering.
QUERY_BATCH = 100

#: Pause before a node whose query failed (e.g. a SuperNode whose data file is
#: refused) is asked again; every ask starts a ClientApp process on that node.
QUERY_RETRY_SECONDS = 5.0


class NodeChoice(StrEnum):
    """What ``clients-per-round = k`` chooses among: ``k`` SuperNodes (each with all its
    devices; a deployment, where a site decides which devices it serves), or ``k``
    devices whatever SuperNode serves them (a simulation, whose virtual SuperNodes are
    only transport: the sampling plan is then the centralised engine's, one node per
    device). Every other sampling mode draws devices and is the same either way.
    """

    SUPERNODES = "supernodes"
    DEVICES = "devices"


def _int_list(value: Any) -> list[int]:
    """A list of integers from a record value; ``ValueError`` for anything else."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"expected a list of integers, got {type(value).__name__}")
    return value


def _scalars(record: Any) -> dict[str, float | int]:
    """A metric record's scalar entries, types kept (a list is no metric of a round: a
    reply that needs one there is then refused as missing it).
    """
    return {k: v for k, v in record.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class FDPStrategy(Strategy):
    """Feature-DP FedSGD on Flower: noise once on the aggregate, PRV accounting per round.

    Each round is one step of Algorithm 1 over the union of the nodes' devices:
    the nodes send sums of per-record private gradients clipped to ``C``
    (sensitivity ``C`` per record, add/remove, Def. 6) and unclipped public
    sums; the server adds ``N(0, σ²C²I)`` once from its own CSPRNG and charges
    the sampling plan's event (Theorem 5). The privacy-deciding work is the round
    engine's (:class:`fedfdp.round_engine.RoundEngine`, built by the plan once the
    device sizes are known); this class is its Flower transport.

    Parameters
    ----------
    plan : RunPlan
        The run's plan (:func:`fedfdp.build_plan`): your global model (``start``'s
        ``initial_arrays`` are loaded into it), the number of devices the nodes serve
        (numbered ``0 .. num_devices − 1``; the strategy waits until all registered),
        the server's components, held-out evaluation and the run directory.
    node_choice : NodeChoice
        What ``clients-per-round = k`` chooses among (:class:`NodeChoice`).
    evaluate_fn : callable, optional
        ``evaluate_fn(round, model) -> metrics`` on held-out data, on the torch model
        (:data:`fedfdp.evaluation.EvaluateFn`; default: the plan's); ``start``'s
        Flower-style ``evaluate_fn`` on arrays replaces it.

    Examples
    --------
    In a ServerApp (see ``examples/fdp-app/``)::

        cfg = Config(privacy=PrivacyConfig(target_epsilon=2.0, num_rounds=20))
        strategy = FDPStrategy(build_plan(cfg, model=Net(), num_devices=3))
        result = strategy.start(grid, ArrayRecord(strategy.model.state_dict()), num_rounds=20,
                                evaluate_fn=central_evaluation)
    """

    def __init__(
        self,
        plan: RunPlan,
        *,
        node_choice: NodeChoice | str = NodeChoice.SUPERNODES,
        evaluate_fn: EvaluateFn | None = None,
    ) -> None:
        if not isinstance(plan, RunPlan):
            raise TypeError(f"plan={type(plan).__name__}: must be a fedfdp RunPlan "
                            "(fedfdp.build_plan(cfg, ...))")
        try:
            self.node_choice = NodeChoice(node_choice)
        except ValueError:
            raise ValueError(f"node_choice={node_choice!r}: must be one of "
                             f"{', '.join(c.value for c in NodeChoice)}") from None
        self.plan = plan
        self.num_devices = plan.num_devices
        self.evaluate_fn = evaluate_fn if evaluate_fn is not None else plan.evaluate
        self.registry: dict[int, tuple[list[int], list[int]]] = {}
        self.device_nodes: list[int] = []  # the SuperNode serving each device (after resolve)
        self._engine: RoundEngine | None = None
        self._orders: TrainOrders | None = None
        self._loop: RunLoop | None = None

    # ------------------------------------------------------------------ state
    @property
    def model(self) -> torch.nn.Module:
        """The global model."""
        return self.plan.model

    @property
    def engine(self) -> RoundEngine:
        """The round engine (after :meth:`resolve`)."""
        if self._engine is None:
            raise RuntimeError("FDPStrategy: no round engine yet (start(), or register nodes and resolve())")
        return self._engine

    @property
    def mechanism(self) -> ResolvedMechanism | None:
        """The resolved mechanism (None before :meth:`resolve`)."""
        return self._engine.mechanism if self._engine is not None else None

    @property
    def ledger(self) -> Ledger | None:
        """The run's privacy ledger (None before the mechanism is resolved)."""
        return self._engine.ledger if self._engine is not None else None

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row of metrics per round completed so far (checkpointed rows included)."""
        return self._loop.rows if self._loop is not None else []

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped early (budget exhausted, a round aborted), else None."""
        return self._loop.stop_reason if self._loop is not None else None

    @property
    def num_records(self) -> int:
        """``N``: training records over all registered devices."""
        return sum(sum(sizes) for _, sizes in self.registry.values())

    # ------------------------------------------------------------------ setup
    def register_nodes(self, grid: Grid, batch: int = QUERY_BATCH) -> None:
        """Wait until nodes covering every device have registered; learn sizes.

        Nodes register lazily; sampling "over all devices" is only honest once
        all of them are known. Nodes are queried ``batch`` at a time.
        """
        expected = set(range(self.num_devices))
        wait = self.plan.settings.node_wait_timeout
        deadline = time.monotonic() + wait
        owner: dict[int, int] = {d: n for n, (ids, _) in self.registry.items() for d in ids}
        retry_at: dict[int, float] = {}  # a node whose query failed is asked again after a pause
        while True:
            now = time.monotonic()
            new = [n for n in grid.get_node_ids() if n not in self.registry and retry_at.get(n, 0.0) <= now]
            # Flower's grid slows down with many messages in flight: one batch of
            # 1000 queries took ~94 s (> the old fixed 60 s timeout, after which
            # every node was queried again); batches of 100 took ~43 s in all.
            for start in range(0, len(new), batch):
                msgs = [
                    Message(RecordDict(), message_type=MessageType.QUERY, dst_node_id=n)
                    for n in new[start : start + batch]
                ]
                timeout = max(1.0, deadline - time.monotonic())
                for reply in exchange(grid, msgs, timeout):
                    node = reply.metadata.src_node_id
                    if reply.has_error():
                        log.warning("node %s: query failed: %s", node, reply.error.reason)
                        retry_at[node] = time.monotonic() + QUERY_RETRY_SECONDS
                        continue
                    info = reply.content[P.METRICS]
                    ids = [int(d) for d in _int_list(info[P.DEVICE_IDS])]
                    sizes = [int(s) for s in _int_list(info[P.DEVICE_SIZES])]
                    for d in ids:
                        if d in owner and owner[d] != node:
                            raise RuntimeError(
                                f"device {d} claimed by nodes {owner[d]} and {node}: "
                                "check partition-id/num-partitions"
                            )
                        owner[d] = node
                    self.registry[node] = (ids, sizes)
            if expected <= set(owner):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(set(owner) & expected)} of {len(expected)} devices registered "
                    f"after node-wait-timeout={wait}s"
                )
            time.sleep(0.2)

    def resolve(self) -> ResolvedMechanism:
        """Build the round engine over the registered devices (in device-id order, with
        the node serving each, or each device its own node with
        ``node_choice="devices"``): the sampling plan, σ, δ and the budget
        (:meth:`fedfdp.run_plan.RunPlan.engine`).
        """
        devices = sorted(
            (d, node, size) for node, (ids, sizes) in self.registry.items()
            for d, size in zip(ids, sizes, strict=True)
        )
        if [d for d, _, _ in devices] != list(range(len(devices))):
            raise RuntimeError(f"registered devices {[d for d, _, _ in devices][:10]}...: expected 0..D-1")
        self.device_nodes = [n for _, n, _ in devices]
        labels = [d for d, _, _ in devices] if self.node_choice is NodeChoice.DEVICES else self.device_nodes
        self._engine = self.plan.engine([s for _, _, s in devices], labels)
        self._orders = TrainOrders(self._engine, self.device_nodes)
        self._loop = RunLoop(self.plan, self._engine, evaluate=self.evaluate_fn)
        return self._engine.mechanism

    @property
    def orders(self) -> TrainOrders:
        """The train instructions of the round in flight and what each node was asked."""
        if self._orders is None:
            raise RuntimeError("FDPStrategy: no round engine yet (start(), or register nodes and resolve())")
        return self._orders

    # -------------------------------------------------------- Strategy API
    def summary(self) -> None:
        """Log the privacy-defining settings (the resolved mechanism's)."""
        m = self.mechanism
        if m is None:
            log.info("FDPStrategy: no mechanism resolved yet")
            return
        log.info(
            "FDPStrategy: mode=%s q=%s C=%s m'=%s sigma=%s delta=%s max-epsilon=%s",
            m.mode, m.sampling.sampling_rate, m.clipping.norm, m.sampling.public_batch_size,
            m.noise_multiplier, m.delta, m.max_epsilon,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Instructions for the nodes with work in ``server_round`` (module docstring):
        the engine begins the round (budget check, write-ahead charge, the sampling
        plan's draw), then one :class:`~fedfdp.protocol.TrainInstruction` per node.

        Raises :class:`~fedfdp.accounting.PrivacyBudgetExhausted` (nothing
        charged) when the round would exceed the budget.
        """
        state = self.engine.begin_round(server_round)
        return self.orders.messages(server_round, state, arrays, config)

    def _parse(self, reply: Message, state: RoundState) -> P.ValidReply:
        node = reply.metadata.src_node_id
        asked = self.orders.of(node)
        if reply.has_error():
            raise P.InvalidReply(f"client error: {reply.error.reason}")
        content = reply.content

        def arrays(key: str) -> dict[str, np.ndarray] | None:
            found = find_record(content, key, ArrayRecord)
            return None if found is None else {k: v.numpy() for k, v in found.items()}

        metrics = find_record(content, P.METRICS, MetricRecord)
        phase = state.phase
        return P.validate_reply(
            private=arrays(P.PRIVATE),
            public=arrays(P.PUBLIC),
            metrics=_scalars(metrics) if metrics is not None else None,
            expected=self.engine.shapes,
            want_private=phase.has_private,
            want_public=phase.public,
            clipping_norm=state.clipping_norm if phase.clip else None,
            max_private_records=asked.record_bound,
            public_count_asked=asked.public_count,
        )

    def collect(self, server_round: int, replies: Iterable[Message]) -> RoundOutcome:
        """Validate the replies and finish the round (:meth:`RoundEngine.finish_round`)."""
        state = self.engine.in_flight
        if self.orders.round != server_round or state is None:
            raise RuntimeError(f"aggregate_train({server_round}) without configure_train")
        valid: list[P.ValidReply] = []
        seen: set[int] = set()
        rejected = 0
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in self.orders.asked and reply.has_error():
                # Flower answers for a node it lost ("node unavailable") from the
                # SuperLink's own id: the node is missing, not misbehaving.
                log.warning("round %d: a node did not reply: %s", server_round, reply.error.reason)
                continue
            try:
                if node in seen:
                    raise P.InvalidReply("duplicate reply")
                seen.add(node)
                valid.append(self._parse(reply, state))
            except (P.InvalidReply, KeyError, TypeError, ValueError) as exc:
                rejected += 1
                log.warning("round %d: rejected reply from node %s: %s", server_round, node, exc)

        def tensors(arrs: list[np.ndarray]) -> list[torch.Tensor]:
            return [torch.from_numpy(np.array(a, dtype=np.float32)) for a in arrs]

        outcome = self.engine.finish_round(
            [tensors(v.private) for v in valid if v.private is not None],
            [tensors(v.public) for v in valid if v.public is not None],
            sum(v.public_count for v in valid),
            sum(v.public_loss_sum for v in valid),
            RoundStats(replies=len(valid), rejected=rejected, asked=len(self.orders.asked)),
            unclipped=sum(v.unclipped for v in valid),
        )
        self.orders.round = None
        return outcome

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Noise once, normalise, step (:meth:`collect`); the new model and metrics."""
        outcome = self.collect(server_round, replies)
        s = outcome.stats
        public_loss = outcome.public_loss if outcome.public_loss == outcome.public_loss else 0.0
        metrics = MetricRecord({
            "epsilon": outcome.epsilon,
            "replies": s.replies,
            "rejected": s.rejected,
            "public-loss": public_loss,
        })
        return ArrayRecord(self.model.state_dict()), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No client-side evaluation: metrics on private training data are
        outside the guarantee. Evaluation is server-side on held-out data.
        """
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None

    # ---------------------------------------------------------------- loop
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run every round (Flower's ``Strategy.start`` contract).

        Waits until nodes covering every device have registered (learning the
        public device sizes and ``N``), resolves σ and δ, then hands the rounds
        to the run loop (:class:`fedfdp.run_loop.RunLoop`: budget stop,
        ``metrics.csv``, checkpoints).

        Parameters
        ----------
        initial_arrays
            Loaded into the model before round 1 (ignored on resume: the
            checkpoint's model is restored instead).
        num_rounds
            Must equal the plan's ``num-rounds`` (a privacy-defining
            setting); default: that value.
        timeout
            Seconds to wait for each round's replies (default ``round-timeout``).
        train_config
            Extra keys sent with every train instruction.
        evaluate_config
            Unused: there is no client-side evaluation (metrics on private
            training data are outside the guarantee).
        evaluate_fn
            ``evaluate_fn(round, arrays) -> MetricRecord``: server-side
            evaluation on held-out data after every ``eval-every`` rounds;
            ``accuracy`` and ``loss`` fill those columns of ``metrics.csv``.

        Returns
        -------
        Result
            The final arrays, ε and reply counts per round
            (``train_metrics_clientapp``) and the server-side evaluations.
        """
        planned = self.plan.num_rounds
        if num_rounds is not None and num_rounds != planned:
            raise ConfigError(
                f"num_rounds={num_rounds}: the privacy plan has num-rounds={planned} (a "
                "privacy-defining setting); pass the same number or change the configuration"
            )
        if initial_arrays is not None:
            self.model.load_state_dict(initial_arrays.to_torch_state_dict())
        timeout = self.plan.settings.round_timeout if timeout is None else timeout
        if evaluate_fn is not None:
            def evaluate(r: int, model: torch.nn.Module) -> dict[str, float] | None:
                res = evaluate_fn(r, ArrayRecord(model.state_dict()))
                return None if res is None else {k: float(v) for k, v in _scalars(res).items()}

            self.evaluate_fn = evaluate
        self.register_nodes(grid)
        self.resolve()
        self.summary()
        engine, loop = self.engine, self._loop
        if loop is None:  # pragma: no cover - resolve built it
            raise RuntimeError("no run loop")
        result = Result()

        secagg = None
        if engine.mechanism.secagg is not None:  # the secure-aggregation round driver
            secagg = SecAggRound(engine, self.orders, grid, self.plan.settings.secagg_timeout)
            secagg.check_parties(len(self.registry))

        def step(r: int) -> RoundOutcome:
            arrays = ArrayRecord(self.model.state_dict())
            if secagg is not None and engine.mechanism.phase(r).noise:
                outcome = secagg.run(r, arrays, train_config or ConfigRecord())
            else:
                messages = self.configure_train(r, arrays, train_config or ConfigRecord(), grid)
                outcome = self.collect(r, exchange(grid, list(messages), timeout))
            s = outcome.stats
            result.train_metrics_clientapp[r] = MetricRecord(
                {"epsilon": outcome.epsilon, "replies": s.replies, "rejected": s.rejected}
            )
            return outcome

        rows = loop.run(step, resolved={"num-nodes": len(self.registry)})
        for row in rows:
            values = {k: float(v) for k, v in row.items()
                      if k in ("accuracy", "loss") and v == v}  # evaluated rounds only
            if values:
                result.evaluate_metrics_serverapp[int(row["round"])] = MetricRecord(dict(values))
        result.arrays = ArrayRecord(self.model.state_dict())
        return result
