"""The server half of a run, for every engine: a round engine and its collaborators.

:class:`FDPServer` is the round engine: **resolve** the mechanism over the public
facts (:func:`fedfdp.mechanism.resolve_mechanism`, once), then per round **charge**
(budget check; the event written to the hash-chained ledger before anything is drawn),
**noise** (``N(0, σ²C²I)`` once, from the server's secret stream), **step** (divide by
the sampling plan's normaliser, add the public gradient, optimizer step, adaptive
clipping's next ``C``). The Flower strategy (:mod:`strategies.fdp_strategy`) and the
centralised engine (:mod:`fedfdp.algorithm`) both drive it through its public methods;
they differ only in how a round's contributions are computed.

What it is given rather than does itself:

* :class:`RunFiles` — the run directory: ``config.toml``, the ledger's durable writes,
  ``checkpoint.pt``, ``metrics.csv``, ``model.pt`` and the resume checks
  (:mod:`fedfdp.checkpoint`, :mod:`fedfdp.ledger`);
* an :data:`EvaluateFn` — held-out evaluation;
* a :class:`Progress` — the progress bar;
* :class:`ServerParts` — the privacy-deciding components (secret entropy, the noise
  mechanism, the sampling plan, the accounting, the projection); a normal run uses
  the defaults (or, for ``mode = "corrdp"``, those of
  :func:`fedfdp.parts.server_parts_for`), the audit swaps one for a planted bug.

:meth:`FDPServer.run` is the loop over rounds: budget stop, evaluation, rows,
checkpoints — each through its collaborator.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedfdp.accounting import PrivacyBudgetExhausted
from fedfdp.checkpoint import Checkpoint, Resume
from fedfdp.config import Config
from fedfdp.entropy import REPRODUCIBLE_WARNING, SecretSource, noise_source, run_secrets
from fedfdp.evaluation import held_out_metrics
from fedfdp.health import RunDiverged, finite_or_raise
from fedfdp.ledger import Ledger
from fedfdp.mechanism import (
    FDP_ACCOUNTING,
    Accounting,
    Budget,
    PublicFacts,
    ResolvedMechanism,
    replay,
    resolve_mechanism,
    run_accounting,
    sampling_settings,
)
from fedfdp.mechanisms import GaussianSumMechanism, SumMechanism
from fedfdp.modes import Phase
from fedfdp.quantile_clipping import next_clipping_norm
from fedfdp.run_files import Progress, RunFiles
from fedfdp.sampling import server_public_rng
from fedfdp.sampling_plan import RoundPlan, SamplingPlan, SamplingSettings
from fedfdp.update import RoundNoise, apply_gradient, build_optimizer, combine_gradient

log = logging.getLogger("fedfdp.server")

class RoundAborted(RuntimeError):
    """A round could not complete without releasing more than it may (secure
    aggregation below ``n_min`` survivors, every try): the run stops before it,
    nothing of it charged or stepped.
    """


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
        :class:`~fedfdp.sampling_plan.SamplingPlan`; its ``subsampling`` is the
        ``(q, p)`` of the event the accountant is charged.
    accounting : Accounting
        The relation, the event family and the accountant
        (:class:`fedfdp.mechanism.Accounting`).
    project : callable or None
        ``project(model)`` in place after every step and when the plan is resolved
        (post-processing onto the parameter set Θ, e.g. CorrDP-SGD's weight bound).
    count_mechanism : callable
        ``count_mechanism(σ_b, 1)`` → the noise mechanism of adaptive clipping's count of
        vectors within ``C`` (a sum of indicators: sensitivity 1); it draws from the
        round's secret noise stream, after the gradient noise.
    """

    secrets: SecretSource | None = None
    mechanism: Callable[[float, float], SumMechanism] = GaussianSumMechanism
    sampling_plan: Callable[[SamplingSettings, tuple[int, ...], tuple[int, ...]], SamplingPlan] = SamplingPlan
    accounting: Accounting = FDP_ACCOUNTING
    project: Callable[[nn.Module], None] | None = None
    count_mechanism: Callable[[float, float], SumMechanism] = GaussianSumMechanism


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
        """Nodes asked that neither replied nor were rejected."""
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


#: ``evaluate_fn(round, model) -> metrics``: server-side evaluation on held-out
#: data (``accuracy`` and ``loss`` fill those columns of ``metrics.csv``; other
#: keys become columns too). Never on private training data.
EvaluateFn = Callable[[int, nn.Module], Mapping[str, float] | None]


def held_out_evaluation(x: Any, y: Any) -> EvaluateFn:
    """An ``evaluate_fn`` reporting accuracy, balanced accuracy, AUC (binary) and
    log loss on ``(x, y)`` (:func:`fedfdp.evaluation.held_out_metrics`).
    """

    def evaluate_fn(round_: int, model: nn.Module) -> dict[str, float]:
        return held_out_metrics(model, x, y)

    return evaluate_fn


class FDPServer:
    """The server half of a run, for any ``torch.nn.Module`` (module docstring).

    Adds ``N(0, σ²C²I)`` once per private round to the sum of the nodes'
    clipped private sums (sensitivity ``C`` per record under add/remove,
    Def. 6), divides by the sampling plan's data-independent normaliser and
    charges the resolved mechanism's event (Theorem 5; the participation mixture
    under Poisson device sampling) — written to the ledger before the round draws
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
    files : RunFiles, optional
        The run directory (default: ``out-dir``'s, or none without one).

    Examples
    --------
    >>> import torch
    >>> from fedfdp import Config, FDPServer, PrivacyConfig
    >>> cfg = Config(privacy=PrivacyConfig(noise_multiplier=1.0, num_rounds=5))
    >>> server = FDPServer(cfg, torch.nn.Linear(4, 2))
    >>> mechanism = server.resolve([100, 80, 120])   # public device sizes
    >>> round(mechanism.noise_multiplier, 2), mechanism.sampling_rate
    (1.0, 0.05)
    """

    def __init__(
        self,
        cfg: Config,
        model: nn.Module,
        *,
        evaluate_fn: EvaluateFn | None = None,
        parts: ServerParts | None = None,
        files: RunFiles | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model={type(model).__name__}: must be a torch.nn.Module")
        self.cfg = cfg
        self.evaluate_fn = evaluate_fn
        self.parts = parts if parts is not None else ServerParts()
        #: The run's accounting: the parts', or the distributed one under secure aggregation.
        self.accounting = run_accounting(cfg, self.parts.accounting)
        if files is None and cfg.run.out_dir:
            files = RunFiles(cfg.run.out_dir, cfg)
        self.files = files
        self.secrets = self.parts.secrets if self.parts.secrets is not None else run_secrets(cfg)
        self.model = model
        #: The parameters a round updates, in a fixed order.
        self.params: list[nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.shapes = {n: tuple(p.shape) for n, p in zip(self.names, self.params, strict=True)}
        t = cfg.training
        self.optimizer = build_optimizer(self.params, t.optimizer, t.learning_rate, t.momentum)
        self.sampling: SamplingPlan | None = None
        self.mechanism: ResolvedMechanism | None = None
        self.budget: Budget | None = None
        self.ledger: Ledger | None = None
        self.rows: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.current: RoundState | None = None
        #: ``C`` of the next private round (moves with adaptive clipping).
        self.clipping_norm = float(cfg.privacy.clipping_norm)

    # ---------------------------------------------------------------- resolve
    def resolve(self, device_sizes: Sequence[int], device_nodes: Sequence[int] = ()) -> ResolvedMechanism:
        """Build the sampling plan over the (public) device sizes and resolve the
        mechanism (:func:`fedfdp.mechanism.resolve_mechanism`) for the event it charges.
        A model whose initial weights are not finite is refused (:class:`RunDiverged`).
        """
        for name, param in zip(self.names, self.params, strict=True):
            if not bool(torch.isfinite(param).all()):
                raise RunDiverged(f"model parameter {name!r}: initial weights are not finite (NaN or inf)")
        sizes = tuple(int(s) for s in device_sizes)
        self.sampling = self.parts.sampling_plan(sampling_settings(self.cfg), sizes, tuple(device_nodes))
        facts = PublicFacts(tuple(self.sampling.device_sizes), sum(int(t.numel()) for t in self.params))
        self.mechanism = resolve_mechanism(self.cfg, facts, accounting=self.parts.accounting,
                                           subsampling=self.sampling.subsampling)
        self.budget = Budget(self.mechanism, self.accounting.new())
        self.ledger = Ledger.start(self.mechanism.to_dict(), self.mechanism.digest())
        if self.parts.project is not None:
            self.parts.project(self.model)  # the initial model in Θ (post-processing: no cost)
        return self.mechanism

    @property
    def plan(self) -> ResolvedMechanism | None:
        """The resolved mechanism (None before :meth:`resolve`)."""
        return self.mechanism

    @property
    def num_records(self) -> int:
        """``N`` (0 before :meth:`resolve`)."""
        return self.sampling.num_records if self.sampling is not None else 0

    def _ready(self) -> tuple[SamplingPlan, ResolvedMechanism, Budget, Ledger]:
        if self.sampling is None or self.mechanism is None or self.budget is None or self.ledger is None:
            raise RuntimeError("FDPServer: no mechanism yet; call resolve() first")
        return self.sampling, self.mechanism, self.budget, self.ledger

    # ---------------------------------------------------------------- rounds
    def charge(self, round_: int) -> int:
        """Compose the round's event and, with a run directory, write the ledger
        durably — before the round draws its batches and noise. Returns the attempt
        number (how often the round was charged before).
        """
        _, mechanism, budget, ledger = self._ready()
        if mechanism.event is None:
            raise RuntimeError(f"round {round_}: a private round without an event")
        attempt = ledger.attempts(round_)
        ledger.append_charge(round_, attempt, mechanism.event)
        budget.spend(mechanism.event)
        if self.files is not None:
            self.files.write_ledger(ledger)
        return attempt

    def begin_round(self, round_: int, *, charge: bool = True) -> RoundState:
        """Phase, budget check and write-ahead charge, then the round's sampling.

        ``charge=False`` (secure aggregation): the budget is checked but the charge
        waits for :meth:`charge_round`, after the collect stage; a round that aborts
        before it (:meth:`abort_round`) is never charged.

        Raises
        ------
        PrivacyBudgetExhausted
            The round would take ε above the cap; nothing was charged.
        """
        sampling, mechanism, budget, ledger = self._ready()
        phase = mechanism.phase(round_)
        attempt = 0
        if phase.noise:
            budget.check()
            attempt = self.charge(round_) if charge else ledger.attempts(round_)
        public_rng = server_public_rng(self.cfg.training.seed, round_)
        plan = sampling.round(phase, public_rng, self.secrets.device_draw(round_, attempt))
        self.current = RoundState(round_, phase, attempt, plan, self.clipping_norm)
        return self.current

    def charge_round(self) -> None:
        """The deferred charge of the round in flight (``begin_round(charge=False)``):
        budget check, then the event written durably to the ledger and composed —
        before anything of the round is released (secure aggregation: before unmasking).

        Raises
        ------
        PrivacyBudgetExhausted
            Nothing was charged.
        """
        state = self.current
        if state is None:
            raise RuntimeError("charge_round without begin_round")
        _, _, budget, _ = self._ready()
        if not state.phase.noise:
            raise RuntimeError(f"round {state.round}: a round without noise is not charged")
        budget.check()
        state.attempt = self.charge(state.round)

    def abort_round(self, stats: RoundStats | None = None) -> RoundOutcome:
        """End the round in flight without a step: the model, the optimizer, ``C`` and
        the ledger are unchanged (secure aggregation below ``n_min`` survivors).
        """
        state = self.current
        if state is None:
            raise RuntimeError("abort_round without begin_round")
        _, _, budget, _ = self._ready()
        self.current = None
        log.warning("round %d aborted: no step, nothing charged", state.round)
        epsilons = self.accounting.columns(budget.epsilon())
        return RoundOutcome(epsilons["epsilon"], float("nan"), stats or RoundStats(), state.plan.normaliser,
                            state.clipping_norm, epsilons)

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
        _, mechanism, budget, _ = self._ready()
        noise = None
        clipping = mechanism.clipping
        phase = state.phase
        if phase.noise and mechanism.secagg is not None:
            # secure aggregation: the private sum arrives with the parties' noise in it
            phase = dataclasses.replace(phase, noise=False)
        elif state.phase.noise:
            if mechanism.noise_multiplier is None:
                raise RuntimeError(f"round {state.round}: a private round without a noise multiplier")
            noise = RoundNoise(self.parts.mechanism(mechanism.noise_multiplier, state.clipping_norm),
                               self.secrets.noise(state.round, state.attempt))
        grad, _ = combine_gradient(
            phase,
            private_sums,
            public_sums,
            public_count,
            shapes=[torch.Size(s) for s in self.shapes.values()],
            expected_batch_size=state.plan.normaliser,
            alpha=self.cfg.training.alpha,
            noise=noise,
        )
        t = self.cfg.training
        sigma_c = (mechanism.noise_multiplier or 0.0) * state.clipping_norm
        finite_or_raise(state.round, "the aggregated gradient", grad,
                        f"the noise (noise-multiplier x clipping-norm = {sigma_c:.3g}) over the normaliser "
                        f"{state.plan.normaliser:.3g} (sampling-rate x records), or alpha={t.alpha:g}")
        apply_gradient(self.params, self.optimizer, grad)
        finite_or_raise(state.round, "the model", list(self.params),
                        f"learning-rate={t.learning_rate:g} (with momentum={t.momentum:g}) or "
                        f"alpha={t.alpha:g} too large for this model")
        if self.parts.project is not None:
            self.parts.project(self.model)
        if noise is not None and clipping.adaptive and clipping.count_noise is not None:
            count = self.parts.count_mechanism(clipping.count_noise, 1.0)
            (noisy,) = count.privatize([torch.tensor([float(unclipped)], dtype=torch.float64)], noise.stream)
            self.clipping_norm = next_clipping_norm(
                state.clipping_norm, float(noisy), state.plan.normaliser, clipping.quantile,
                clipping.learning_rate,
            )
        self.current = None
        public_loss = public_loss_sum / public_count if public_count else float("nan")
        if public_count and not math.isfinite(public_loss):
            raise RunDiverged(f"round {state.round}: the public loss is {public_loss}; likely "
                              f"learning-rate={t.learning_rate:g} too large, or non-finite inputs in the "
                              "data")
        epsilons = self.accounting.columns(budget.epsilon())
        return RoundOutcome(
            epsilons["epsilon"], public_loss, stats or RoundStats(), state.plan.normaliser,
            state.clipping_norm, epsilons,
        )

    # ---------------------------------------------------------------- state
    def restore(self, resume: Resume) -> int:
        """Restore a verified resume (:meth:`RunFiles.verify`): the ledger (every charge
        ever written, plus the pessimistic ones, durably appended first), the model,
        optimizer, rows and ``C``; return the first round to run.
        """
        _, mechanism, _, _ = self._ready()
        if resume.ledger is None:
            return 1
        ledger = resume.ledger
        if resume.unrecorded:
            if mechanism.event is None:
                raise RuntimeError("unrecorded charges for a mechanism that charges nothing")
            ledger.append_unrecorded(mechanism.event, resume.unrecorded,
                                     "may have been written after the last checkpoint and is missing")
            log.warning("%d charge(s) the interrupted session may have written are missing from the ledger: "
                        "charged pessimistically", resume.unrecorded)
            if self.files is not None:
                self.files.write_ledger(ledger)
        self.ledger = ledger
        self.budget = Budget(mechanism, replay(ledger.events(), self.accounting.new))
        ckpt = resume.checkpoint
        if ckpt is None:
            return 1
        self.model.load_state_dict(ckpt.model)
        self.optimizer.load_state_dict(ckpt.optimizer)
        self.rows = list(ckpt.rows)
        self.clipping_norm = ckpt.clipping_norm
        return ckpt.round + 1

    def checkpoint_state(self, round_: int) -> Checkpoint:
        """The run's state after ``round_`` (for :meth:`RunFiles.checkpoint`)."""
        _, mechanism, _, ledger = self._ready()
        return Checkpoint(
            round=round_, config=self.cfg.to_flat(), num_records=self.num_records,
            mechanism_digest=mechanism.digest(), head=ledger.head(), rows=self.rows,
            clipping_norm=self.clipping_norm, every=self.cfg.run.checkpoint_every,
            model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
        )

    def resolved_values(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``[resolved]`` table of ``config.toml``: the resolved mechanism."""
        _, m, _, _ = self._ready()
        values: dict[str, Any] = {
            "noise-multiplier": m.noise_multiplier,
            "accounted-noise-multiplier": m.accounted_noise_multiplier,
            "delta": m.delta,
            "num-records": m.num_records,
            "private-rounds": m.private_rounds,
            "max-epsilon": m.max_epsilon,
            "relation": str(m.relation),
            **self.accounting.resolved,
            "accounted-rate": m.sampling_rate,
            "accounted-participation": m.participation,
            "event": m.event.to_dict() if m.event is not None else None,
            "mechanism-digest": m.digest(),
            "noise-source": noise_source(self.cfg),
        }
        if m.estimates:  # the budget split: what the released statistics cost, alone and with training
            values.update(self.budget_split(m))
        if m.secagg is not None:
            values.update({"secagg-local-sigma": m.secagg.local_sigma, "secagg-scale": m.secagg.scale,
                           "secagg-honest-parties": m.secagg.honest_parties})
        if m.clipping.count_noise is not None:
            values["clipping-count-std"] = m.clipping.count_noise
        if m.clipping.count_noise is not None or (m.private and self.cfg.privacy.clipping_quantile is None
                                                  and self.cfg.privacy.adaptive_clipping):
            values["clipping-quantile"] = m.clipping.quantile  # what "auto" chose (0: fixed C)
        if self.cfg.privacy.reproducible_noise:
            values["warning"] = REPRODUCIBLE_WARNING
        return {**{k: v for k, v in values.items() if v is not None}, **(extra or {})}

    def budget_split(self, m: ResolvedMechanism) -> dict[str, Any]:
        """The ε of the statistics released before training (``m.estimates``) composed
        alone, and with every planned private round: upper bounds at ``m.delta`` for
        ``m.relation`` from a fresh accountant of the run's accounting, so the split
        shown is the accountant's composition, not a sum of ε's.
        """
        estimates = replay([e.event for e in m.estimates], self.accounting.new)
        split: dict[str, Any] = {
            "estimates": [e.statistic for e in m.estimates],
            "estimates-epsilon": float(estimates.epsilon(m.delta)),
        }
        if m.event is not None and m.private_rounds:
            estimates.compose(m.event, m.private_rounds)
            split["planned-epsilon"] = float(estimates.epsilon(m.delta))
        return split

    # ---------------------------------------------------------------- a whole run
    def resume(self) -> int:
        """Check the run directory and restore a run from it; return the first round
        to run (:meth:`RunFiles.verify`, :meth:`restore`).
        """
        if self.files is None:
            return 1
        _, mechanism, _, ledger = self._ready()
        found = self.files.verify(mechanism)
        first = self.restore(found)
        if found.ledger is None:  # a new run: the mechanism is the ledger's first entry
            self.files.write_ledger(ledger)
        if found.checkpoint is not None or found.ledger is not None:
            log.warning("resuming %s after round %d: epsilon so far %.4g (%d charges in the ledger)",
                        self.files.out, first - 1, self.budget.epsilon() if self.budget else 0.0,
                        len(self.ledger.charges) if self.ledger else 0)
        # every session starts from a checkpoint of the head it continues from
        self.files.checkpoint(self.checkpoint_state(first - 1))
        return first

    def run(self, step: Callable[[int], RoundOutcome], *, resolved: dict[str, Any] | None = None) -> list[
        dict[str, Any]
    ]:
        """Run every round with ``step(round) -> RoundOutcome`` (which calls
        :meth:`begin_round` and :meth:`finish_round`); evaluate server-side, write
        metrics, checkpoints and the final model through the collaborators. Stops
        cleanly before a round that would exceed ``max-epsilon``.
        """
        cfg = self.cfg
        self._ready()
        first = self.resume()
        if cfg.privacy.reproducible_noise:
            log.warning(REPRODUCIBLE_WARNING)
        if self.files is not None and first == 1:
            self.files.write_config(self.resolved_values(resolved))
        total = cfg.privacy.num_rounds
        progress = Progress(total, first - 1, f"fedfdp {cfg.privacy.mode}", cfg.run.progress)
        column = self.accounting.column
        try:
            for r in range(first, total + 1):
                try:
                    outcome = step(r)
                except (PrivacyBudgetExhausted, RoundAborted) as exc:
                    self.stop_reason = f"stopped before round {r}: {exc}"
                    log.warning(self.stop_reason)
                    progress.write(self.stop_reason)
                    break
                metrics: dict[str, float] = {}
                if self.evaluate_fn is not None and (r % cfg.run.eval_every == 0 or r == total):
                    metrics = {k: float(v) for k, v in (self.evaluate_fn(r, self.model) or {}).items()}
                    if "loss" in metrics and not math.isfinite(metrics["loss"]):
                        raise RunDiverged(f"round {r}: the held-out loss is {metrics['loss']}; the model "
                                          f"diverged (likely learning-rate={cfg.training.learning_rate:g})")
                row = self.row(r, outcome, metrics)
                self.rows.append(row)
                if self.files is not None:
                    if self.files.due(r):
                        self.files.checkpoint(self.checkpoint_state(r))
                    self.files.metrics(self.rows)
                progress.update(row.get(column, outcome.epsilon), row["accuracy"])
        finally:
            progress.close()
        if self.files is not None:
            self.files.model(self.model)
        return self.rows

    def row(self, round_: int, outcome: RoundOutcome, metrics: dict[str, float]) -> dict[str, Any]:
        """The ``metrics.csv`` row of a round."""
        _, m, _, _ = self._ready()
        phase = m.phase(round_)
        s = outcome.stats
        acc = metrics.pop("accuracy", float("nan"))
        loss = metrics.pop("loss", float("nan"))
        return {
            "round": round_,
            "phase": phase.name,
            "epsilon": outcome.epsilon,
            **(outcome.epsilons or {}),
            "delta": m.delta,
            "relation": str(m.relation),
            "accuracy": acc,
            "loss": loss,
            "public_loss": outcome.public_loss,
            "replies": s.replies,
            "rejected": s.rejected,
            "asked": s.asked,
            "missing": s.missing,
            "noise_multiplier": m.noise_multiplier if phase.noise else 0.0,
            "normaliser": outcome.normaliser if phase.has_private else float("nan"),
            "clipping_norm": outcome.clipping_norm if phase.noise else float("nan"),
            "noise_source": noise_source(self.cfg),
            **metrics,
        }
