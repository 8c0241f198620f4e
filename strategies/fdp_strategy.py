"""Flower Message-API strategy for feature-DP training (the server half of Algorithm 1).

The privacy-deciding work is :class:`fedfdp.server.FDPServer`'s (the same
server half the centralised engine runs); this module is its Flower transport:

``configure_train``
    :meth:`FDPServer.begin_round` — phase, budget check and write-ahead charge,
    then the sampling plan's draw (:mod:`fedfdp.sampling_plan`) — and one
    :class:`~fedfdp.protocol.TrainInstruction` per node with work: its devices,
    their public counts and private flags. The instruction carries no seed and
    no secret.
``aggregate_train``
    validates each reply (:func:`fedfdp.protocol.validate_reply`; invalid
    replies are logged with node id and reason and dropped, never touching the
    model or the ledger), then :meth:`FDPServer.finish_round`: noise once from
    the server's secret stream, divide by the plan's normaliser, add the public
    gradient, step.

With ``aggregation = "secagg"`` a private round is instead one secure-aggregation
round of four stages (:class:`strategies.secagg_round.SecAggRound`): the server only
ever holds masked vectors and their sum, adds no noise, and charges the round after
the collect stage (an aborted round is never charged).

:meth:`FDPStrategy.start` runs the rounds: it first waits until nodes covering
every device have registered and learns the device sizes (``N`` is public),
resolves σ/δ, and hands the loop to :meth:`FDPServer.run` (budget stop,
server-side evaluation on held-out data, ``metrics.csv``, checkpoints).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedfdp import protocol as P
from fedfdp.config import Aggregation, Config, ConfigError
from fedfdp.ledger import Ledger
from fedfdp.mechanism import Budget, ResolvedMechanism
from fedfdp.server import EvaluateFn, FDPServer, RoundOutcome, RoundState, RoundStats, ServerParts

log = logging.getLogger("fedfdp.server")

#: Nodes queried per ``send_and_receive`` while registering.
QUERY_BATCH = 100

#: Pause before a node whose query failed (e.g. a SuperNode whose data file is
#: refused) is asked again; every ask starts a ClientApp process on that node.
QUERY_RETRY_SECONDS = 5.0

#: Replies are polled from the Grid first after this many seconds, then at
#: intervals growing by half up to :data:`POLL_MAX_SECONDS` (back to the first
#: after each reply); after :data:`POLL_FAST_SECONDS` of waiting, up to
#: :data:`POLL_SLOW_SECONDS`. Flower's own ``send_and_receive`` sleeps 0.1 s
#: (simulation) or 3 s (deployment) between polls, which is most of a short round.
POLL_MIN_SECONDS = 0.002
POLL_MAX_SECONDS = 0.01
POLL_FAST_SECONDS = 2.0
POLL_SLOW_SECONDS = 0.2

#: ``node_choice`` values: what ``clients-per-round`` chooses among.
NODE_CHOICES = ("supernodes", "devices")


def exchange(grid: Grid, messages: list[Message], timeout: float | None) -> list[Message]:
    """Send ``messages`` and collect their replies until all arrived or
    ``timeout`` seconds passed (Flower's ``Grid.send_and_receive`` contract),
    polling the Grid at short intervals.
    """
    pending = set(grid.push_messages(messages))
    start = time.monotonic()
    end = None if timeout is None else start + timeout
    replies: list[Message] = []
    pause = POLL_MIN_SECONDS
    while pending:
        got = list(grid.pull_messages(pending))
        if got:
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            pause = POLL_MIN_SECONDS
            continue
        now = time.monotonic()
        if end is not None and now >= end:
            break
        time.sleep(pause if end is None else max(0.0, min(pause, end - now)))
        cap = POLL_MAX_SECONDS if now - start < POLL_FAST_SECONDS else POLL_SLOW_SECONDS
        pause = min(pause * 1.5, cap)
    return replies


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
    the sampling plan's event (Theorem 5). The privacy-deciding work is
    :class:`fedfdp.server.FDPServer`'s.

    Parameters
    ----------
    model : torch.nn.Module
        Your global model; ``start``'s ``initial_arrays`` are loaded into it.
    cfg : Config
        The validated configuration: its ``privacy`` section defines the
        guarantee (``num-rounds`` included), ``training`` the optimiser.
    num_devices : int, optional
        Devices the nodes serve, numbered ``0 .. num_devices − 1`` (default
        ``cfg.data.num_devices``); the strategy waits until all registered.
    evaluate_fn : callable, optional
        ``evaluate_fn(round, model) -> metrics`` on held-out data, on the torch model
        (:data:`fedfdp.server.EvaluateFn`); ``start``'s Flower-style ``evaluate_fn``
        on arrays replaces it.
    parts : ServerParts, optional
        The server's privacy-deciding components (defaults: a normal run).
    node_choice : {"supernodes", "devices"}
        What ``clients-per-round = k`` chooses among: ``k`` SuperNodes (each
        with all its devices; a deployment, where a site decides which devices
        it serves), or ``k`` devices whatever SuperNode serves them (a
        simulation, whose virtual SuperNodes are only transport: the sampling
        plan is then the centralised engine's, one node per device). Every
        other sampling mode draws devices and is the same either way.

    Examples
    --------
    In a ServerApp (see ``examples/fdp-app/``)::

        strategy = FDPStrategy(Net(), Config(privacy=PrivacyConfig(target_epsilon=2.0, num_rounds=20)),
                               num_devices=3)
        result = strategy.start(grid, ArrayRecord(Net().state_dict()), num_rounds=20,
                                evaluate_fn=central_evaluation)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: Config,
        *,
        num_devices: int | None = None,
        parts: ServerParts | None = None,
        node_choice: str = "supernodes",
        evaluate_fn: EvaluateFn | None = None,
    ) -> None:
        if not isinstance(cfg, Config):
            raise TypeError(f"cfg={type(cfg).__name__}: must be a fedfdp Config (load_config or Config(...))")
        self.cfg = cfg
        self.num_devices = cfg.data.num_devices if num_devices is None else int(num_devices)
        if self.num_devices < 1:
            raise ValueError(
                f"num_devices={self.num_devices}: must be >= 1 (num-devices = 0 means one device per "
                "value of device-column: pass cfg through fedfdp.data.resolve_devices first)"
            )
        if node_choice not in NODE_CHOICES:
            raise ValueError(f"node_choice={node_choice!r}: must be one of {', '.join(NODE_CHOICES)}")
        self.node_choice = node_choice
        self.server = FDPServer(cfg, model, parts=parts, evaluate_fn=evaluate_fn)
        self.registry: dict[int, tuple[list[int], list[int]]] = {}
        self._asked: dict[int, tuple[list[int], int, int]] = {}  # node -> (devices, bound, public count)
        self.device_nodes: list[int] = []  # the SuperNode serving each device (after resolve)
        self._round: int | None = None

    # ------------------------------------------------------------------ state
    @property
    def model(self) -> torch.nn.Module:
        """The global model (:attr:`FDPServer.model`)."""
        return self.server.model

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The model's trainable parameters, in order."""
        return self.server.params

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every trainable parameter, by name."""
        return self.server.shapes

    @property
    def plan(self) -> ResolvedMechanism | None:
        """The resolved mechanism (:attr:`FDPServer.mechanism`)."""
        return self.server.mechanism

    @property
    def budget(self) -> Budget | None:
        """The guard of the run's privacy budget (None before the mechanism is resolved)."""
        return self.server.budget

    @property
    def ledger(self) -> Ledger | None:
        """The run's privacy ledger (None before the mechanism is resolved)."""
        return self.server.ledger

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row of metrics per round completed so far (checkpointed rows included)."""
        return self.server.rows

    @property
    def round_in_flight(self) -> RoundState | None:
        """The round between :meth:`configure_train` and :meth:`collect` (its phase,
        attempt, sampling and ``C``), None between rounds.
        """
        return self.server.current

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped early (budget exhausted, a round aborted), else None."""
        return self.server.stop_reason

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
        deadline = time.monotonic() + self.cfg.run.node_wait_timeout
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
                    f"after node-wait-timeout={self.cfg.run.node_wait_timeout}s"
                )
            time.sleep(0.2)

    def resolve(self) -> ResolvedMechanism:
        """Build the sampling plan over the registered devices (in device-id
        order, with the node serving each, or each device its own node with
        ``node_choice="devices"``) and resolve σ, δ and the budget.
        """
        devices = sorted(
            (d, node, size) for node, (ids, sizes) in self.registry.items()
            for d, size in zip(ids, sizes, strict=True)
        )
        if [d for d, _, _ in devices] != list(range(len(devices))):
            raise RuntimeError(f"registered devices {[d for d, _, _ in devices][:10]}...: expected 0..D-1")
        self.device_nodes = [n for _, n, _ in devices]
        labels = [d for d, _, _ in devices] if self.node_choice == "devices" else self.device_nodes
        return self.server.resolve([s for _, _, s in devices], labels)

    # -------------------------------------------------------- Strategy API
    def summary(self) -> None:
        """Log the privacy-defining settings."""
        p, plan = self.cfg.privacy, self.plan
        log.info(
            "FDPStrategy: mode=%s q=%s C=%s m'=%s sigma=%s delta=%s max-epsilon=%s",
            p.mode, p.sampling_rate, p.clipping_norm, p.public_batch_size,
            plan.noise_multiplier if plan else None, plan.delta if plan else None,
            plan.max_epsilon if plan else None,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Instructions for the nodes with work in ``server_round`` (module docstring).

        Raises :class:`~fedfdp.accounting.PrivacyBudgetExhausted` (nothing
        charged) when the round would exceed the budget.
        """
        state = self.server.begin_round(server_round)
        return self.instructions(server_round, state, arrays, config)

    def instructions(
        self, server_round: int, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """One train message per node with work in the round ``state`` begun: its devices,
        their public counts and private flags (no seed, no secret).
        """
        sampling = self.server.sampling
        if sampling is None:  # begin_round checked it
            raise RuntimeError("no sampling plan")
        plan = state.plan
        by_node: dict[int, list[int]] = {}
        owners = self.device_nodes or [int(n) for n in sampling.device_nodes]
        for d in plan.asked().tolist():
            by_node.setdefault(owners[d], []).append(d)
        self._asked = {}
        self._round = server_round
        p = self.cfg.privacy
        messages = []
        for node, devices in by_node.items():
            idx = np.asarray(devices, dtype=np.int64)
            order = P.TrainInstruction(
                round=server_round,
                attempt=state.attempt,
                phase=state.phase.name,
                unit=p.privacy_unit,
                sampling_rate=p.sampling_rate,
                clipping_norm=state.clipping_norm,
                device_ids=tuple(devices),
                public_counts=tuple(plan.public_counts[idx].tolist()),
                private_flags=tuple(plan.private[idx].tolist()),
            )
            self._asked[node] = (devices, sampling.record_bound(plan, devices), sum(order.public_counts))
            cfg_rec = ConfigRecord(dict(config))
            cfg_rec.update(order.to_config())
            content = RecordDict({P.ARRAYS: arrays, P.CONFIG: cfg_rec})
            messages.append(Message(content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def asked_public_count(self, node: int) -> int:
        """The public batch size allocated to ``node`` in the round in flight."""
        if node not in self._asked:
            raise P.InvalidReply("reply from a node that was not asked this round")
        return self._asked[node][2]

    def _parse(self, reply: Message) -> P.ValidReply:
        node = reply.metadata.src_node_id
        if node not in self._asked:
            raise P.InvalidReply("reply from a node that was not asked this round")
        if reply.has_error():
            raise P.InvalidReply(f"client error: {reply.error.reason}")
        content = reply.content

        def arrays(key: str) -> dict[str, np.ndarray] | None:
            if key not in content.array_records:
                return None
            return {k: v.numpy() for k, v in content.array_records[key].items()}

        metrics = content.metric_records.get(P.METRICS)
        _, bound, public_count = self._asked[node]
        current = self.server.current
        if current is None:
            raise RuntimeError("a reply without a round in flight")
        phase = current.phase
        return P.validate_reply(
            private=arrays(P.PRIVATE),
            public=arrays(P.PUBLIC),
            metrics=_scalars(metrics) if metrics is not None else None,
            expected=self.shapes,
            want_private=phase.has_private,
            want_public=phase.public,
            clipping_norm=current.clipping_norm if phase.clip else None,
            max_private_records=bound,
            public_count_asked=public_count,
        )

    def collect(self, server_round: int, replies: Iterable[Message]) -> RoundOutcome:
        """Validate the replies and finish the round (:meth:`FDPServer.finish_round`)."""
        if self._round != server_round or self.server.current is None:
            raise RuntimeError(f"aggregate_train({server_round}) without configure_train")
        valid: list[P.ValidReply] = []
        seen: set[int] = set()
        rejected = 0
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in self._asked and reply.has_error():
                # Flower answers for a node it lost ("node unavailable") from the
                # SuperLink's own id: the node is missing, not misbehaving.
                log.warning("round %d: a node did not reply: %s", server_round, reply.error.reason)
                continue
            try:
                if node in seen:
                    raise P.InvalidReply("duplicate reply")
                seen.add(node)
                valid.append(self._parse(reply))
            except (P.InvalidReply, KeyError, TypeError, ValueError) as exc:
                rejected += 1
                log.warning("round %d: rejected reply from node %s: %s", server_round, node, exc)

        def tensors(arrs: list[np.ndarray]) -> list[torch.Tensor]:
            return [torch.from_numpy(np.array(a, dtype=np.float32)) for a in arrs]

        outcome = self.server.finish_round(
            [tensors(v.private) for v in valid if v.private is not None],
            [tensors(v.public) for v in valid if v.public is not None],
            sum(v.public_count for v in valid),
            sum(v.public_loss_sum for v in valid),
            RoundStats(replies=len(valid), rejected=rejected, asked=len(self._asked)),
            unclipped=sum(v.unclipped for v in valid),
        )
        self._round = None
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
        to :meth:`FDPServer.run` (budget stop, ``metrics.csv``, checkpoints).

        Parameters
        ----------
        initial_arrays
            Loaded into the model before round 1 (ignored on resume: the
            checkpoint's model is restored instead).
        num_rounds
            Must equal the privacy plan's ``num-rounds`` (a privacy-defining
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
        p = self.cfg.privacy
        if num_rounds is not None and num_rounds != p.num_rounds:
            raise ConfigError(
                f"num_rounds={num_rounds}: the privacy plan has num-rounds={p.num_rounds} (a "
                "privacy-defining setting); pass the same number or change the configuration"
            )
        if initial_arrays is not None:
            self.model.load_state_dict(initial_arrays.to_torch_state_dict())
        timeout = self.cfg.run.round_timeout if timeout is None else timeout
        if evaluate_fn is not None:
            def evaluate(r: int, model: torch.nn.Module) -> dict[str, float] | None:
                res = evaluate_fn(r, ArrayRecord(model.state_dict()))
                return None if res is None else {k: float(v) for k, v in _scalars(res).items()}

            self.server.evaluate_fn = evaluate
        self.register_nodes(grid)
        self.resolve()
        self.summary()
        result = Result()

        secagg = None
        if self.cfg.privacy.aggregation is Aggregation.SECAGG:
            from strategies.secagg_round import SecAggRound  # the secure-aggregation round driver

            secagg = SecAggRound(self, grid)
            secagg.check_parties(len(self.registry))

        def step(r: int) -> RoundOutcome:
            arrays = ArrayRecord(self.model.state_dict())
            mechanism = self.server.mechanism
            if secagg is not None and mechanism is not None and mechanism.phase(r).noise:
                outcome = secagg.run(r, arrays, train_config or ConfigRecord())
                s = outcome.stats
                result.train_metrics_clientapp[r] = MetricRecord(
                    {"epsilon": outcome.epsilon, "replies": s.replies, "rejected": s.rejected}
                )
                return outcome
            messages = self.configure_train(r, arrays, train_config or ConfigRecord(), grid)
            outcome = self.collect(r, exchange(grid, list(messages), timeout))
            s = outcome.stats
            result.train_metrics_clientapp[r] = MetricRecord(
                {"epsilon": outcome.epsilon, "replies": s.replies, "rejected": s.rejected}
            )
            return outcome

        rows = self.server.run(step, resolved={"num-nodes": len(self.registry)})
        for row in rows:
            values = {k: float(v) for k, v in row.items()
                      if k in ("accuracy", "loss") and v == v}  # evaluated rounds only
            if values:
                result.evaluate_metrics_serverapp[int(row["round"])] = MetricRecord(dict(values))
        result.arrays = ArrayRecord(self.model.state_dict())
        return result
