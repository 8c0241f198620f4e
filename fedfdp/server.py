"""The server half of a run, for every engine: plans, noise, budget, ledger, outputs.

:class:`FDPServer` holds the global model and optimizer, the sampling plan
(:mod:`fedfdp.sampling_plan`), the privacy plan and budget
(:mod:`fedfdp.budget`), the write-ahead ledger and checkpoints
(:mod:`fedfdp.checkpoint`) and the run's outputs. The Flower strategy
(:mod:`strategies.fdp_strategy`) and the centralised engine
(:mod:`fedfdp.algorithm`) both drive it; they differ only in how a round's
contributions are computed (messages to SuperNodes, or one local call).

Per round (:meth:`FDPServer.begin_round`, then :meth:`FDPServer.finish_round`):

1. the phase of the round (:mod:`fedfdp.modes`); for a private round the
   budget is checked (:class:`~fedfdp.accounting.PrivacyBudgetExhausted` if it
   would be exceeded) and the round is **charged and the ledger written
   before** any batch or noise is drawn;
2. the sampling plan draws who does what (public stream for node choice and
   public batch, the server's secret stream for Poisson device draws);
3. the engine collects the nodes' contributions;
4. the server adds ``N(0, σ²C²I)`` once, from its secret stream, divides by the
   plan's normaliser, adds the public gradient and steps the optimizer
   (:mod:`fedfdp.update`).

The components that decide privacy are injected through :class:`ServerParts`
(secret entropy, the noise mechanism, the sampling plan, the accounting, the
projection of the model after a step); a normal run uses the defaults — or, for
``mode = "corrdp"``, the CorrDP parts of :func:`fedfdp.parts.server_parts_for` —
and the audit swaps one of them for a planted bug.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from fedfdp.accounting import PrivacyBudgetExhausted
from fedfdp.budget import (
    FDP_ACCOUNTING,
    Accounting,
    Budget,
    PrivacyPlan,
    plan_with_clipping,
    sampling_settings,
)
from fedfdp.checkpoint import (
    CHECKPOINT_FILE,
    LEDGER_FILE,
    Charge,
    CheckpointMismatch,
    ExpectedEvent,
    Ledger,
    LedgerSummary,
    check_compatible,
    load_checkpoint,
    read_ledger,
    save_checkpoint,
    verify_ledger,
    write_ledger,
)
from fedfdp.config import Config
from fedfdp.contribution import trainable
from fedfdp.entropy import REPRODUCIBLE_WARNING, SecretSource, noise_source, run_secrets
from fedfdp.evaluation import held_out_metrics
from fedfdp.mechanisms import GaussianSumMechanism
from fedfdp.modes import Phase, phase_for_round
from fedfdp.outputs import CONFIG_FILE, METRICS_FILE, atomic_write, write_config, write_metrics
from fedfdp.quantile_clipping import adapt_clipping_norm
from fedfdp.sampling import server_public_rng
from fedfdp.sampling_plan import RoundPlan, SamplingPlan, SamplingSettings
from fedfdp.update import RoundNoise, apply_gradient, build_optimizer, combine_gradient

log = logging.getLogger("fedfdp.server")

#: The final model's state_dict, written at the end of a run.
MODEL_FILE = "model.pt"
#: Files that mark a directory as holding a run.
RUN_FILES = (CONFIG_FILE, METRICS_FILE, LEDGER_FILE, CHECKPOINT_FILE, MODEL_FILE)
@dataclass(frozen=True)
class ServerParts:
    """The server's privacy-deciding components (defaults: a normal run).

    Attributes
    ----------
    secrets : SecretSource or None
        Noise and device draws; None: what the configuration asks for
        (:func:`run_secrets`).
    mechanism : callable
        ``mechanism(σ, C)`` → the noise mechanism of a private round.
    sampling_plan : callable
        ``sampling_plan(settings, device_sizes, device_nodes)`` → the
        :class:`~fedfdp.sampling_plan.SamplingPlan`; its ``event`` is what
        the accountant is charged.
    accounting : Accounting
        The accountant, the calibration of σ, the relation and column of the ε
        (:class:`fedfdp.budget.Accounting`).
    project : callable or None
        ``project(model)`` in place after every step and when the plan is resolved
        (post-processing onto the parameter set Θ, e.g. CorrDP-SGD's weight bound).
    """

    secrets: SecretSource | None = None
    mechanism: Callable[[float, float], GaussianSumMechanism] = GaussianSumMechanism
    sampling_plan: Callable[[SamplingSettings, Sequence[int], Sequence[int]], SamplingPlan] = SamplingPlan
    accounting: Accounting = FDP_ACCOUNTING
    project: Callable[[nn.Module], None] | None = None


@dataclass
class RoundState:
    """The round in flight."""

    round: int
    phase: Phase
    attempt: int
    plan: RoundPlan
    clipping_norm: float


@dataclass
class RoundStats:
    """What an engine reports of a round's replies."""

    replies: int = 1
    rejected: int = 0
    asked: int = 1

    @property
    def missing(self) -> int:
        return self.asked - self.replies - self.rejected


@dataclass
class RoundOutcome:
    """The server's result of a round."""

    epsilon: float
    public_loss: float
    stats: RoundStats = field(default_factory=RoundStats)
    normaliser: float = float("nan")
    clipping_norm: float = float("nan")
    #: The ε columns of the round's row (``epsilon`` empty for a CorrDP ε: :class:`Accounting`).
    epsilons: dict[str, Any] | None = None


def occupied(out: str | Path) -> list[str]:
    """The run files already in ``out``."""
    return [f for f in RUN_FILES if (Path(out) / f).exists()]


#: ``evaluate_fn(round, model) -> metrics``: server-side evaluation on held-out
#: data (``accuracy`` and ``loss`` fill those columns of ``metrics.csv``; other
#: keys become columns too). Never on private training data.
EvaluateFn = Callable[[int, nn.Module], Mapping[str, float] | None]


def held_out_evaluation(x: Any, y: Any) -> EvaluateFn:
    """An ``evaluate_fn`` reporting accuracy, balanced accuracy, AUC (binary) and
    log loss on ``(x, y)`` (:func:`fedfdp.evaluation.held_out_metrics`)."""

    def evaluate_fn(round_: int, model: nn.Module) -> dict[str, float]:
        return held_out_metrics(model, x, y)

    return evaluate_fn


class FDPServer:
    """The server half of a run, for any ``torch.nn.Module`` (module docstring).

    Adds ``N(0, σ²C²I)`` once per private round to the sum of the nodes'
    clipped private sums (sensitivity ``C`` per record under add/remove,
    Def. 6), divides by the sampling plan's data-independent normaliser and
    charges the plan's event (Theorem 5; the participation mixture under
    Poisson device sampling) — written to the ledger before the round draws
    anything.

    Parameters
    ----------
    cfg : Config
        The validated configuration (its ``privacy`` section defines the guarantee).
    model : torch.nn.Module
        The global model (any module the clipping engine supports; its
        trainable parameters are what a round updates).
    evaluate_fn : callable, optional
        ``evaluate_fn(round, model) -> {"accuracy": ..., "loss": ..., ...}`` on
        held-out data, every ``eval-every`` rounds and after the last.
    parts : ServerParts, optional
        The privacy-deciding components (defaults: a normal run).

    Examples
    --------
    >>> import torch
    >>> from fedfdp import Config, FDPServer, PrivacyConfig
    >>> cfg = Config(privacy=PrivacyConfig(noise_multiplier=1.0, target_epsilon=None, num_rounds=5))
    >>> server = FDPServer(cfg, torch.nn.Linear(4, 2))
    >>> plan = server.resolve([100, 80, 120])   # public device sizes
    >>> round(plan.noise_multiplier, 2), plan.sampling_rate
    (1.0, 0.05)
    """

    def __init__(
        self,
        cfg: Config,
        model: nn.Module,
        *,
        evaluate_fn: EvaluateFn | None = None,
        parts: ServerParts | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model={type(model).__name__}: must be a torch.nn.Module")
        self.cfg = cfg
        self.evaluate_fn = evaluate_fn
        self.parts = parts if parts is not None else ServerParts()
        self.secrets = self.parts.secrets if self.parts.secrets is not None else run_secrets(cfg)
        self.model = model
        self.params = trainable(self.model)
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.shapes = {n: tuple(p.shape) for n, p in zip(self.names, self.params, strict=True)}
        t = cfg.training
        self.optimizer = build_optimizer(self.params, t.optimizer, t.learning_rate, t.momentum)
        self.sampling: SamplingPlan | None = None
        self.plan: PrivacyPlan | None = None
        self.budget: Budget | None = None
        self.ledger = Ledger(self.parts.accounting.new().state_dict(), [])
        self.rows: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.current: RoundState | None = None
        #: ``C`` of the next private round (moves with adaptive clipping).
        self.clipping_norm = float(cfg.privacy.clipping_norm)
        #: ``γ`` of adaptive clipping, 0 for a fixed ``C`` (set by :meth:`resolve`).
        self.clipping_quantile = 0.0

    # ---------------------------------------------------------------- setup
    def resolve(self, device_sizes: Sequence[int], device_nodes: Sequence[int] = ()) -> PrivacyPlan:
        """Build the sampling plan over the (public) device sizes and resolve σ,
        δ and the budget for the event it charges."""
        self.sampling = self.parts.sampling_plan(sampling_settings(self.cfg), device_sizes, device_nodes)
        accounting = self.parts.accounting
        num_params = sum(int(t.numel()) for t in self.params)
        plan, self.clipping_quantile = plan_with_clipping(
            self.cfg, self.sampling.num_records, num_params, len(self.sampling.device_sizes),
            event=self.sampling.event, accounting=accounting,
        )
        self.plan = plan
        self.budget = Budget(plan, accounting.new())
        if self.parts.project is not None:
            self.parts.project(self.model)  # the initial model in Θ (post-processing: no cost)
        return self.plan

    @property
    def num_records(self) -> int:
        """``N`` (0 before :meth:`resolve`)."""
        return self.sampling.num_records if self.sampling is not None else 0

    def _ready(self) -> tuple[SamplingPlan, PrivacyPlan, Budget]:
        if self.sampling is None or self.plan is None or self.budget is None:
            raise RuntimeError("FDPServer: no privacy plan yet; call resolve() first")
        return self.sampling, self.plan, self.budget

    def expected_event(self) -> ExpectedEvent | None:
        """The ``(σ, q, participation)`` every charge of this plan carries."""
        _, plan, _ = self._ready()
        if not plan.private or plan.noise_multiplier is None:
            return None
        return ExpectedEvent(plan.accounted_noise_multiplier, plan.sampling_rate, plan.participation)

    # ---------------------------------------------------------------- rounds
    def charge(self, round_: int) -> int:
        """Compose the round's event and, with an output directory, write the
        ledger durably — before the round draws its batches and noise. Returns
        the attempt number (how often the round was charged before)."""
        _, plan, budget = self._ready()
        if plan.noise_multiplier is None:
            raise RuntimeError(f"round {round_}: a private round without a noise multiplier")
        attempt = self.ledger.attempts(round_)
        budget.spend()
        self.ledger.charges.append(
            Charge(round_, attempt, plan.accounted_noise_multiplier, plan.sampling_rate, plan.participation)
        )
        self.ledger.accountant = budget.accountant.state_dict()
        if self.cfg.run.out_dir:
            write_ledger(self.cfg.run.out_dir, self.ledger)
        return attempt

    def begin_round(self, round_: int) -> RoundState:
        """Phase, budget check and write-ahead charge, then the round's sampling.

        Raises
        ------
        PrivacyBudgetExhausted
            The round would take ε above the cap; nothing was charged.
        """
        sampling, _, budget = self._ready()
        p = self.cfg.privacy
        phase = phase_for_round(p.mode, p.public_pretrain_rounds, round_)
        attempt = 0
        if phase.noise:
            budget.check()
            attempt = self.charge(round_)
        public_rng = server_public_rng(self.cfg.training.seed, round_)
        plan = sampling.round(phase, public_rng, self.secrets.device_draw(round_, attempt))
        self.current = RoundState(round_, phase, attempt, plan, self.clipping_norm)
        return self.current

    def finish_round(
        self,
        private_sums: Sequence[Sequence[torch.Tensor]],
        public_sums: Sequence[Sequence[torch.Tensor]],
        public_count: int,
        public_loss_sum: float,
        stats: RoundStats | None = None,
        *,
        unclipped: int = 0,
    ) -> RoundOutcome:
        """Noise once, normalise, step (module docstring); returns ε so far.

        ``unclipped`` is the nodes' total count of clipped vectors already
        within ``C`` (adaptive clipping; ignored with a fixed ``C``).
        """
        state = self.current
        if state is None:
            raise RuntimeError("finish_round without begin_round")
        _, plan, budget = self._ready()
        noise = None
        if state.phase.noise:
            if plan.noise_multiplier is None:
                raise RuntimeError(f"round {state.round}: a private round without a noise multiplier")
            mechanism = self.parts.mechanism(plan.noise_multiplier, state.clipping_norm)
            noise = RoundNoise(mechanism, self.secrets.noise(state.round, state.attempt))
        grad, _ = combine_gradient(
            state.phase,
            private_sums,
            public_sums,
            public_count,
            shapes=[torch.Size(s) for s in self.shapes.values()],
            expected_batch_size=state.plan.normaliser,
            alpha=self.cfg.training.alpha,
            noise=noise,
        )
        apply_gradient(self.params, self.optimizer, grad)
        if self.parts.project is not None:
            self.parts.project(self.model)
        if noise is not None and plan.count_noise is not None and self.clipping_quantile > 0:
            self.clipping_norm = adapt_clipping_norm(
                state.clipping_norm, unclipped, plan.count_noise, state.plan.normaliser,
                self.clipping_quantile, self.cfg.privacy.clipping_learning_rate, noise.stream,
            )
        self.current = None
        public_loss = public_loss_sum / public_count if public_count else float("nan")
        epsilons = self.parts.accounting.columns(budget.epsilon())
        return RoundOutcome(
            epsilons["epsilon"], public_loss, stats or RoundStats(), state.plan.normaliser,
            state.clipping_norm, epsilons,
        )

    # ---------------------------------------------------------------- a whole run
    def resume(self) -> int:
        """Check the output directory and restore a run from it; return the
        first round to run. Refuses (:class:`CheckpointMismatch`) an occupied
        directory without ``resume``, and any checkpoint or ledger that does not
        match the configuration, the data or each other."""
        out = self.cfg.run.out_dir
        if not out:
            return 1
        ckpt, ledger = verify_resume(out, self.cfg, self)
        if ledger is not None:
            _, _, budget = self._ready()
            budget.accountant.load_state_dict(ledger.accountant)
            self.ledger = ledger
        if ckpt is None:
            return 1
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.rows = list(ckpt["rows"])
        self.clipping_norm = float(ckpt.get("clipping-norm", self.cfg.privacy.clipping_norm))
        log.warning(
            "resuming %s after round %d: epsilon so far %.4g (%d charges in the ledger)",
            out, ckpt["round"], self.budget.epsilon() if self.budget else 0.0, len(self.ledger.charges),
        )
        return int(ckpt["round"]) + 1

    def checkpoint(self, round_: int) -> None:
        """Write ``checkpoint.pt`` after ``round_`` (with the ledger's summary)."""
        save_checkpoint(
            self.cfg.run.out_dir,
            {
                "round": round_,
                "config": self.cfg.to_flat(),
                "num-records": self.num_records,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rows": self.rows,
                "ledger": self.ledger.summary().as_dict(),
                "clipping-norm": self.clipping_norm,
            },
        )

    def resolved_values(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``[resolved]`` table of ``config.toml``."""
        _, plan, _ = self._ready()
        values = {
            "noise-multiplier": plan.noise_multiplier,
            "accounted-noise-multiplier": plan.accounted_noise_multiplier,
            "delta": plan.delta,
            "num-records": self.num_records,
            "private-rounds": plan.private_rounds,
            "max-epsilon": plan.max_epsilon,
            "relation": plan.relation,
            **self.parts.accounting.resolved,
            "accounted-rate": plan.sampling_rate,
            "accounted-participation": plan.participation,
            "noise-source": noise_source(self.cfg),
        }
        if plan.count_noise is not None:
            values["clipping-count-std"] = plan.count_noise
        if plan.count_noise is not None or self.cfg.privacy.clipping_quantile is None:
            values["clipping-quantile"] = self.clipping_quantile  # what "auto" chose (0: fixed C)
        if self.cfg.privacy.reproducible_noise:
            values["warning"] = REPRODUCIBLE_WARNING
        return {**values, **(extra or {})}

    def run(self, step: Callable[[int], RoundOutcome], *, resolved: dict[str, Any] | None = None) -> list[
        dict[str, Any]
    ]:
        """Run every round with ``step(round) -> RoundOutcome`` (which calls
        :meth:`begin_round` and :meth:`finish_round`); evaluate server-side,
        write metrics, checkpoints and the final model. Stops cleanly before a
        round that would exceed ``max-epsilon``."""
        cfg = self.cfg
        _, plan, _ = self._ready()
        out = cfg.run.out_dir
        first = self.resume()
        if cfg.privacy.reproducible_noise:
            log.warning(REPRODUCIBLE_WARNING)
        if out and first == 1:
            write_config(out, cfg.to_flat(), self.resolved_values(resolved))
        total = cfg.privacy.num_rounds
        bar = tqdm(total=total, initial=first - 1, desc=f"fedfdp {cfg.privacy.mode}", unit="round",
                   disable=not cfg.run.progress, leave=True)
        try:
            for r in range(first, total + 1):
                try:
                    outcome = step(r)
                except PrivacyBudgetExhausted as exc:
                    self.stop_reason = f"stopped before round {r}: {exc}"
                    log.warning(self.stop_reason)
                    bar.write(self.stop_reason)
                    break
                metrics: dict[str, float] = {}
                if self.evaluate_fn is not None and (r % cfg.run.eval_every == 0 or r == total):
                    metrics = {k: float(v) for k, v in (self.evaluate_fn(r, self.model) or {}).items()}
                acc = metrics.pop("accuracy", float("nan"))
                loss = metrics.pop("loss", float("nan"))
                phase = phase_for_round(cfg.privacy.mode, cfg.privacy.public_pretrain_rounds, r)
                s = outcome.stats
                row = {
                    "round": r,
                    "phase": phase.name,
                    "epsilon": outcome.epsilon,
                    **(outcome.epsilons or {}),
                    "delta": plan.delta,
                    "relation": plan.relation,
                    "accuracy": acc,
                    "loss": loss,
                    "public_loss": outcome.public_loss,
                    "replies": s.replies,
                    "rejected": s.rejected,
                    "asked": s.asked,
                    "missing": s.missing,
                    "noise_multiplier": plan.noise_multiplier if phase.noise else 0.0,
                    "normaliser": outcome.normaliser if phase.has_private else float("nan"),
                    "clipping_norm": outcome.clipping_norm if phase.noise else float("nan"),
                    "noise_source": noise_source(cfg),
                    **metrics,
                }
                self.rows.append(row)
                if out:
                    every = cfg.run.checkpoint_every
                    if every and (r % every == 0 or r == total):
                        self.checkpoint(r)
                    write_metrics(out, self.rows)
                bar.update(1)
                bar.set_postfix(eps=f"{row.get(self.parts.accounting.column, outcome.epsilon):.3g}",
                                acc=f"{acc:.3f}")
        finally:
            bar.close()
        if out:
            buf = io.BytesIO()
            torch.save(self.model.state_dict(), buf)
            atomic_write(Path(out) / MODEL_FILE, buf.getvalue())
        return self.rows


def _replay(charges: Sequence[Charge], accounting: Accounting = FDP_ACCOUNTING) -> dict[str, Any]:
    acc = accounting.new()
    for c in charges:
        acc.compose(c.noise_multiplier, c.sampling_rate, participation=c.participation)
    return acc.state_dict()


def verify_resume(
    out: str | Path, cfg: Config, server: FDPServer
) -> tuple[dict[str, Any] | None, Ledger | None]:
    """The checks of :meth:`FDPServer.resume` (also run by ``fedfdp run`` before
    Flower starts): returns the checkpoint and ledger to restore."""
    out = Path(out)
    if not cfg.run.resume:
        files = occupied(out)
        if files:
            raise CheckpointMismatch(
                f"out-dir={str(out)!r} already holds a run ({', '.join(files)}): resume it "
                "(fedfdp run --resume DIR, or resume=true) or choose another output directory"
            )
        return None, None
    ckpt = load_checkpoint(out)
    ledger = read_ledger(out)
    if ckpt is None and ledger is None:
        raise CheckpointMismatch(f"resume=true but out-dir={str(out)!r} holds no checkpoint or ledger")
    summary = None
    if ckpt is not None:
        try:
            check_compatible(ckpt["config"], cfg.to_flat())
        except CheckpointMismatch as exc:
            raise CheckpointMismatch(f"{out / CHECKPOINT_FILE}: {exc}") from exc
        if ckpt["num-records"] != server.num_records:
            raise CheckpointMismatch(
                f"{out / CHECKPOINT_FILE}: N={ckpt['num-records']} training records, the nodes now hold "
                f"{server.num_records}: different data, refusing to resume"
            )
        try:
            summary = LedgerSummary.from_dict(ckpt["ledger"])
        except (ValueError, TypeError) as exc:
            raise CheckpointMismatch(f"{out / CHECKPOINT_FILE}: {exc}") from exc
    verify_ledger(out, ledger, summary, server.expected_event(),
                  lambda charges: _replay(charges, server.parts.accounting))
    if ckpt is not None and ledger is not None:
        cfg_p = cfg.privacy
        charged = {c.round for c in ledger.charges}
        for r in range(1, int(ckpt["round"]) + 1):
            if phase_for_round(cfg_p.mode, cfg_p.public_pretrain_rounds, r).noise and r not in charged:
                raise CheckpointMismatch(
                    f"{out / LEDGER_FILE}: round {r} completed (checkpoint) but was never charged; "
                    "refusing to resume"
                )
    return ckpt, ledger

