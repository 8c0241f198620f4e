"""Flower Message-API strategy for feature-DP training (the server half of Algorithm 1).

Per round:

``configure_train``
    picks nodes (all, or ``clients-per-round`` drawn uniformly from the server
    stream — data-independent), splits the uniform public batch of ``m'``
    records over their devices (multivariate hypergeometric on public sizes),
    and sends the global model with ``phase, q, C, seed`` and each node's
    device ids and public counts.
``aggregate_train``
    validates each reply (:func:`fedfdp.protocol.validate_reply`; invalid
    replies are logged with node id and reason and dropped, never touching the
    model or the ledger), sums the private parts, adds ``N(0, σ²C²I)`` once,
    divides by the expected batch size ``q·N_asked``, adds the mean public
    gradient, weights the private part by ``α`` (``fdp``), steps the server
    optimizer and composes one Poisson-subsampled Gaussian event.

:meth:`FDPStrategy.start` runs the rounds: it first waits until nodes covering
every device have registered and learns the device sizes (``N`` is public),
resolves σ/δ (:func:`fedfdp.budget.plan_privacy`), refuses any round that
would exceed ``max-epsilon`` (stopping cleanly with a message naming the ε
spent), evaluates on the held-out split server-side, and writes
``metrics.csv`` after every round.

Accounting with Flower's fixed-count client sampling stays at the record-level
rate ``q``: the choice of nodes is data-independent, so a record is in the
private batch with probability at most ``q`` — a valid upper bound.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from tqdm.auto import tqdm

from fedfdp import protocol as P
from fedfdp.accounting import PrivacyBudgetExhausted
from fedfdp.algorithm import build_model_for, evaluate
from fedfdp.budget import Budget, PrivacyPlan, plan_privacy
from fedfdp.checkpoint import (
    CheckpointMismatch,
    Ledger,
    check_compatible,
    load_checkpoint,
    read_ledger,
    save_checkpoint,
    write_ledger,
)
from fedfdp.config import Config
from fedfdp.contribution import trainable
from fedfdp.data import FederatedData
from fedfdp.modes import Phase, phase_for_round
from fedfdp.outputs import atomic_write, write_config, write_metrics
from fedfdp.sampling import ServerStreams, allocate_public_batch
from fedfdp.update import RoundNoise, apply_gradient, build_optimizer, combine_gradient

log = logging.getLogger("fedfdp.server")

#: The final model's state_dict, written at the end of a run.
MODEL_FILE = "model.pt"

#: Nodes queried per ``send_and_receive`` while registering.
QUERY_BATCH = 100

#: Pause before a node whose query failed (e.g. a SuperNode whose data file is
#: refused) is asked again; every ask starts a ClientApp process on that node.
QUERY_RETRY_SECONDS = 5.0


@dataclass
class _Asked:
    """What the server asked one node in the current round."""

    device_ids: list[int]
    public_counts: list[int]
    private_flags: list[int]
    records: int  # bound on clipped vectors in the private sum (records, or devices)


@dataclass
class RoundState:
    """Bookkeeping of the round in flight."""

    round: int
    phase: Phase
    asked: dict[int, _Asked] = field(default_factory=dict)
    expected_batch_size: float = 0.0
    attempt: int = 0


class FDPStrategy(Strategy):
    """Feature-DP FedSGD: noise once on the aggregate, PRV accounting per round.

    Parameters
    ----------
    cfg : Config
        The validated run configuration.
    data : FederatedData
        Used for the model's shape and the held-out test split only; training
        records stay with the clients.
    """

    def __init__(self, cfg: Config, data: FederatedData) -> None:
        self.cfg = cfg
        self.data = data
        self.model = build_model_for(cfg, data)
        self.params = trainable(self.model)
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.shapes = {n: tuple(p.shape) for n, p in zip(self.names, self.params, strict=True)}
        t = cfg.training
        self.optimizer = build_optimizer(self.params, t.optimizer, t.learning_rate, t.momentum)
        self.registry: dict[int, tuple[list[int], list[int]]] = {}
        self.plan: PrivacyPlan | None = None
        self.budget: Budget | None = None
        self.rows: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self._round: RoundState | None = None
        self._last: dict[str, Any] = {}
        self._attempt = 0
        self._attempt_round: int | None = None
        self._charged_round: int | None = None
        self.ledger = Ledger({}, [])

    # ------------------------------------------------------------------ setup
    @property
    def num_records(self) -> int:
        """``N``: training records over all registered devices."""
        return sum(sum(sizes) for _, sizes in self.registry.values())

    def register_nodes(self, grid: Grid, batch: int = QUERY_BATCH) -> None:
        """Wait until nodes covering every device have registered; learn sizes.

        Nodes register lazily; sampling "over all devices" is only honest once
        all of them are known. Nodes are queried ``batch`` at a time.
        """
        expected = set(range(self.cfg.data.num_devices))
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
                for reply in grid.send_and_receive(msgs, timeout=timeout):
                    node = reply.metadata.src_node_id
                    if reply.has_error():
                        log.warning("node %s: query failed: %s", node, reply.error.reason)
                        retry_at[node] = time.monotonic() + QUERY_RETRY_SECONDS
                        continue
                    info = reply.content[P.METRICS]
                    ids = [int(d) for d in info[P.DEVICE_IDS]]
                    sizes = [int(s) for s in info[P.DEVICE_SIZES]]
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

    def _resolved(self) -> Budget:
        """The budget of the resolved privacy plan; rounds need one."""
        if self.budget is None or self.plan is None:
            raise RuntimeError("FDPStrategy: no privacy plan yet; call resolve() (start() does) first")
        return self.budget

    def resolve(self) -> PrivacyPlan:
        """Resolve σ, δ and the budget from the registered ``N``."""
        self.plan = plan_privacy(self.cfg, self.num_records)
        self.budget = Budget(self.plan)
        return self.plan

    # -------------------------------------------------------- Strategy API
    def summary(self) -> None:
        """Log the privacy-defining settings."""
        p = self.cfg.privacy
        log.info(
            "FDPStrategy: mode=%s q=%s C=%s m'=%s sigma=%s delta=%s max-epsilon=%s",
            p.mode,
            p.sampling_rate,
            p.clipping_norm,
            p.public_batch_size,
            self.plan.noise_multiplier if self.plan else None,
            self.plan.delta if self.plan else None,
            self.plan.max_epsilon if self.plan else None,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Instructions for the nodes taking part in ``server_round``.

        Which devices do private work: all of them; or those of
        ``clients-per-round`` nodes chosen uniformly (data-independent, rate
        ``q`` still accounted); or each device independently with probability
        ``p`` (``device-sampling-rate``; accounted at ``p·q`` or ``p``). The
        public batch is drawn independently of that private draw (Prop. 3,
        here at device level): over all devices for the record unit, over an
        independent Poisson device sample for the device unit.
        """
        p = self.cfg.privacy
        phase = phase_for_round(p.mode, p.public_pretrain_rounds, server_round)
        attempt = self._attempt if self._attempt_round == server_round else 0
        streams = ServerStreams.for_round(self.cfg.run.seed, server_round, attempt)
        devices = [
            (n, d, s) for n in sorted(self.registry) for d, s in zip(*self.registry[n], strict=True)
        ]
        nodes_of = np.array([n for n, _, _ in devices])
        sizes = np.array([s for _, _, s in devices], dtype=np.int64)
        rate = p.device_sampling_rate
        device_unit = p.privacy_unit == "device"
        if rate is not None:
            private_mask = streams.sampling.random(len(devices)) < rate
            public_mask = (
                streams.sampling.random(len(devices)) < rate if device_unit else np.ones(len(devices), bool)
            )
            expected = rate * len(devices) if device_unit else rate * p.sampling_rate * float(sizes.sum())
        else:
            chosen = np.array(sorted(self.registry))
            k = self.cfg.run.clients_per_round
            if 0 < k < len(chosen):
                chosen = np.sort(streams.sampling.choice(chosen, size=k, replace=False))
            private_mask = public_mask = np.isin(nodes_of, chosen)
            expected = p.sampling_rate * float(sizes[private_mask].sum())
        public_sizes = np.where(public_mask, sizes, 0)
        m = min(p.public_batch_size, int(public_sizes.sum())) if phase.public else 0
        counts = allocate_public_batch(public_sizes, m, streams.sampling)
        state = RoundState(server_round, phase, attempt=attempt)
        state.expected_batch_size = expected
        for (node, dev, size), priv, c in zip(devices, private_mask, counts, strict=True):
            if not (priv and phase.has_private) and c == 0:
                continue
            asked = state.asked.setdefault(node, _Asked([], [], [], 0))
            asked.device_ids.append(dev)
            asked.public_counts.append(int(c))
            asked.private_flags.append(int(bool(priv)))
            if priv:
                asked.records += 1 if device_unit else size
        self._round = state
        messages = []
        for node, asked in state.asked.items():
            cfg_rec = ConfigRecord(dict(config))
            cfg_rec.update(
                {
                    P.ROUND: server_round,
                    P.ATTEMPT: attempt,
                    P.PHASE: phase.name,
                    P.UNIT: p.privacy_unit,
                    P.SAMPLING_RATE: p.sampling_rate,
                    P.CLIPPING_NORM: p.clipping_norm,
                    P.SEED: self.cfg.run.seed,
                    P.DEVICE_IDS: asked.device_ids,
                    P.PUBLIC_COUNTS: asked.public_counts,
                    P.PRIVATE_FLAGS: asked.private_flags,
                }
            )
            content = RecordDict({P.ARRAYS: arrays, P.CONFIG: cfg_rec})
            messages.append(Message(content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def _parse(self, reply: Message, state: RoundState) -> P.ValidReply:
        node = reply.metadata.src_node_id
        if node not in state.asked:
            raise P.InvalidReply("reply from a node that was not asked this round")
        if reply.has_error():
            raise P.InvalidReply(f"client error: {reply.error.reason}")
        content = reply.content

        def arrays(key: str) -> dict[str, np.ndarray] | None:
            if key not in content.array_records:
                return None
            return {k: v.numpy() for k, v in content.array_records[key].items()}

        metrics = content.metric_records.get(P.METRICS)
        asked = state.asked[node]
        return P.validate_reply(
            private=arrays(P.PRIVATE),
            public=arrays(P.PUBLIC),
            metrics=dict(metrics) if metrics is not None else None,
            expected=self.shapes,
            want_private=state.phase.has_private,
            want_public=state.phase.public,
            clipping_norm=self.cfg.privacy.clipping_norm if state.phase.clip else None,
            max_private_records=asked.records,
            public_count_asked=sum(asked.public_counts),
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Noise once, normalise by ``q·N``, step, compose one privacy event."""
        state = self._round
        if state is None or state.round != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) without configure_train")
        valid: list[P.ValidReply] = []
        seen: set[int] = set()
        rejected = 0
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in state.asked and reply.has_error():
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
        phase = state.phase
        noise = None
        if phase.noise:
            sigma = self._resolved().plan.noise_multiplier
            if sigma is None:
                raise RuntimeError(f"round {server_round}: a private round without a noise multiplier")
            noise = RoundNoise(
                sigma,
                self.cfg.privacy.clipping_norm,
                ServerStreams.for_round(self.cfg.run.seed, server_round, state.attempt).noise,
            )

        def tensors(arrs: list[np.ndarray]) -> list[torch.Tensor]:
            return [torch.from_numpy(np.array(a, dtype=np.float32)) for a in arrs]

        public_count = sum(v.public_count for v in valid)
        grad, _ = combine_gradient(
            phase,
            [tensors(v.private) for v in valid if v.private is not None],
            [tensors(v.public) for v in valid if v.public is not None],
            public_count,
            shapes=[torch.Size(s) for s in self.shapes.values()],
            expected_batch_size=state.expected_batch_size,
            alpha=self.cfg.training.alpha,
            noise=noise,
        )
        apply_gradient(self.params, self.optimizer, grad)
        budget = self._resolved()
        if phase.noise and self._charged_round != server_round:
            self.charge(server_round)  # direct use without start(): compose now
        self._charged_round = None
        epsilon = budget.epsilon()
        pub_loss = sum(v.public_loss_sum for v in valid) / public_count if public_count else float("nan")
        self._last = {
            "epsilon": epsilon,
            "public_loss": pub_loss,
            "replies": len(valid),
            "rejected": rejected,
            "asked": len(state.asked),
            "missing": len(state.asked) - len(valid) - rejected,
        }
        self._round = None
        metrics = MetricRecord(
            {
                "epsilon": epsilon,
                "replies": len(valid),
                "rejected": rejected,
                "public-loss": pub_loss if public_count else 0.0,
            }
        )
        return ArrayRecord(self.model.state_dict()), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No client-side evaluation: metrics on private training data are
        outside the guarantee. Evaluation is server-side on held-out data."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None

    # ---------------------------------------------------------------- loop
    def charge(self, server_round: int) -> None:
        """Compose the privacy event of a private round and, with an output
        directory, write the ledger to disk — before the round draws its batches
        and noise (write-ahead; see :mod:`fedfdp.checkpoint`)."""
        budget = self._resolved()
        attempt = self.ledger.attempts(server_round)
        budget.spend()
        self.ledger.charges.append([server_round, attempt])
        self.ledger.accountant = budget.accountant.state_dict()
        if self.cfg.run.out_dir:
            write_ledger(self.cfg.run.out_dir, self.ledger)
        self._attempt, self._attempt_round = attempt, server_round
        self._charged_round = server_round

    def _resume(self) -> int:
        """Restore state from ``out-dir``; return the first round to run."""
        out = self.cfg.run.out_dir
        ckpt = load_checkpoint(out) if out else None
        ledger = read_ledger(out) if out else None
        if not self.cfg.run.resume:
            if ckpt is not None or ledger is not None:
                raise CheckpointMismatch(
                    f"out-dir={out!r} already holds a run (checkpoint or privacy ledger): resume it "
                    "(fedfdp run --resume DIR, or resume=true) or choose another output directory"
                )
            return 1
        if ckpt is None and ledger is None:
            raise CheckpointMismatch(f"resume=true but out-dir={out!r} holds no checkpoint or ledger")
        saved = ckpt["config"] if ckpt is not None else None
        if saved is not None:
            check_compatible(saved, self.cfg.to_flat())
            if ckpt["num-records"] != self.num_records:
                raise CheckpointMismatch(
                    f"checkpoint has N={ckpt['num-records']} training records, the nodes now hold "
                    f"{self.num_records}: different data, refusing to resume"
                )
        if ledger is not None:
            self._resolved().accountant.load_state_dict(ledger.accountant)
            self.ledger = ledger
        if ckpt is None:
            return 1
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.rows = list(ckpt["rows"])
        log.warning(
            "resuming %s after round %d: epsilon so far %.4g (%d charges in the ledger)",
            out, ckpt["round"], self.budget.epsilon() if self.budget else 0.0, len(self.ledger.charges),
        )
        return int(ckpt["round"]) + 1

    def _checkpoint(self, round_: int) -> None:
        out = self.cfg.run.out_dir
        save_checkpoint(
            out,
            {
                "round": round_,
                "config": self.cfg.to_flat(),
                "num-records": self.num_records,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rows": self.rows,
            },
        )

    def start(  # type: ignore[override]
        self, grid: Grid, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Run all rounds; return the per-round records (also in ``metrics.csv``)."""
        cfg = self.cfg
        timeout = cfg.run.round_timeout if timeout is None else timeout
        self.register_nodes(grid)
        plan = self.resolve()
        self.summary()
        out = cfg.run.out_dir
        first = self._resume()
        if out and first == 1:
            write_config(
                out,
                cfg.to_flat(),
                {
                    "noise-multiplier": plan.noise_multiplier,
                    "delta": plan.delta,
                    "num-records": self.num_records,
                    "private-rounds": plan.private_rounds,
                    "max-epsilon": plan.max_epsilon,
                    "relation": plan.relation,
                    "num-nodes": len(self.registry),
                },
            )
        total = cfg.training.num_rounds
        bar = tqdm(
            total=total,
            initial=first - 1,
            desc=f"fedfdp {cfg.privacy.mode}",
            unit="round",
            disable=not cfg.run.progress,
            leave=True,
        )
        p = cfg.privacy
        try:
            for r in range(first, total + 1):
                phase = phase_for_round(p.mode, p.public_pretrain_rounds, r)
                if phase.noise:
                    try:
                        self._resolved().check()
                    except PrivacyBudgetExhausted as exc:
                        self.stop_reason = f"stopped before round {r}: {exc}"
                        log.warning(self.stop_reason)
                        bar.write(self.stop_reason)
                        break
                    self.charge(r)
                arrays = ArrayRecord(self.model.state_dict())
                replies = grid.send_and_receive(
                    self.configure_train(r, arrays, ConfigRecord(), grid), timeout=timeout
                )
                self.aggregate_train(r, replies)
                acc = loss = float("nan")
                if r % cfg.run.eval_every == 0 or r == total:
                    acc, loss = evaluate(self.model, self.data.test_x, self.data.test_y)
                row = {
                    "round": r,
                    "phase": phase.name,
                    "epsilon": self._last["epsilon"],
                    "delta": plan.delta,
                    "relation": plan.relation,
                    "accuracy": acc,
                    "loss": loss,
                    "public_loss": self._last["public_loss"],
                    "replies": self._last["replies"],
                    "rejected": self._last["rejected"],
                    "asked": self._last["asked"],
                    "missing": self._last["missing"],
                    "noise_multiplier": plan.noise_multiplier if phase.noise else 0.0,
                }
                self.rows.append(row)
                if out:
                    every = cfg.run.checkpoint_every
                    if every and (r % every == 0 or r == total):
                        self._checkpoint(r)
                    write_metrics(out, self.rows)
                bar.update(1)
                bar.set_postfix(eps=f"{row['epsilon']:.3g}", acc=f"{acc:.3f}")
        finally:
            bar.close()
        if out:
            buf = io.BytesIO()
            torch.save(self.model.state_dict(), buf)
            atomic_write(Path(out) / MODEL_FILE, buf.getvalue())
        return self.rows
