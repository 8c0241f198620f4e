"""The round engine: the server half of one round of Algorithm 1, for every engine.

A :class:`RoundEngine` is built over a resolved mechanism and its sampling plan
(:meth:`fedfdp.run_plan.RunPlan.engine`, the one place that resolves them) and runs
rounds, nothing else:

**begin** — the round's phase; for a private round the budget check and the
**charge**: the event written to the hash-chained ledger (and, through the
:class:`Journal`, durably to disk) before anything of the round is drawn; then the
sampling plan's draw (who takes part, the public counts, the normaliser) —
:meth:`RoundEngine.begin_round`;

**noise** — ``N(0, σ²C²I)`` added once to the sum of the nodes' clipped private sums,
from the server's secret stream (none under secure aggregation: the parties added it);

**step** — divide by the plan's data-independent normaliser, add the public gradient
(weight ``α``), one optimizer step, the projection onto Θ, adaptive clipping's next
``C`` from the count noised with the same secret stream —
:meth:`RoundEngine.finish_round`.

**restore** puts a verified resume back: the ledger (every charge ever written),
the budget replayed from it, the model, optimizer and ``C``.

It reads no configuration, writes no file but the ledger through its journal,
evaluates nothing and draws no progress bar: the run loop (:mod:`fedfdp.run_loop`)
does those. The Flower strategy, the secure-aggregation round driver, the centralised
engine and the audit drive it through its methods only.

Sensitivity and relation: each node sends a sum of per-record private gradients
clipped to ``C`` (sensitivity ``C`` per record under add/remove, FDP paper Def. 6),
so one round is the Poisson-subsampled Gaussian mechanism of Theorem 5 (with the
participation mixture under Poisson device sampling, rate ``p`` for the device unit);
the charged event is the resolved mechanism's and rounds compose (Theorem 3).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from fedfdp.budget import Budget
from fedfdp.checkpoint import Checkpoint
from fedfdp.config import TrainingConfig
from fedfdp.contribution import model_device
from fedfdp.entropy import SecretSource, SystemEntropy
from fedfdp.health import RunDiverged, finite_or_raise
from fedfdp.ledger import Head, Ledger
from fedfdp.ledger_replay import replay
from fedfdp.mechanism import FDP_ACCOUNTING, Accounting, ResolvedMechanism
from fedfdp.mechanisms import GaussianSumMechanism, SumMechanism
from fedfdp.modes import Phase
from fedfdp.quantile_clipping import next_clipping_norm
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
        Noise and device draws; None: what the configuration asks for (the run plan
        fills it in: the OS CSPRNG, or the seed under ``reproducible-noise``).
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
        ``project(model)`` in place after every step and when the engine is built
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


class Journal(Protocol):
    """Where the ledger is written durably: :meth:`write_ledger` returns only once the
    ledger is on disk (the write-ahead of every charge; :class:`fedfdp.run_files.RunFiles`).
    """

    def write_ledger(self, ledger: Ledger) -> None: ...


@dataclass(frozen=True)
class RoundState:
    """The round in flight: its number, phase, attempt (charges of it before this
    one), the sampling plan's draw and ``C``.
    """

    round: int
    phase: Phase
    attempt: int
    plan: RoundPlan
    clipping_norm: float


@dataclass(frozen=True)
class RoundStats:
    """What an engine reports of a round's replies."""

    replies: int = 1
    rejected: int = 0
    asked: int = 1

    @property
    def missing(self) -> int:
        """Nodes asked that neither replied nor were rejected."""
        return self.asked - self.replies - self.rejected


@dataclass(frozen=True)
class RoundOutcome:
    """The server's result of a round."""

    epsilon: float
    public_loss: float
    stats: RoundStats = field(default_factory=RoundStats)
    normaliser: float = float("nan")
    clipping_norm: float = float("nan")
    #: The ε columns of the round's row (``epsilon`` empty for a CorrDP ε: :class:`Accounting`).
    epsilons: dict[str, Any] | None = None


@dataclass(frozen=True)
class EngineState:
    """What a checkpoint keeps of the engine after a round."""

    head: Head
    clipping_norm: float
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


def check_finite_model(model: nn.Module) -> None:
    """Refuse a model whose initial trainable weights are not finite
    (:class:`~fedfdp.health.RunDiverged` naming the parameter), and first one whose
    parameters are on more than one device or on none with values
    (:func:`~fedfdp.contribution.model_device`: ``ConfigError`` naming them).
    """
    model_device(model)
    for name, param in model.named_parameters():
        if param.requires_grad and not bool(torch.isfinite(param).all()):
            raise RunDiverged(f"model parameter {name!r}: initial weights are not finite (NaN or inf)")


class RoundEngine:
    """The server half of every round (module docstring), for any ``torch.nn.Module``.

    Parameters
    ----------
    mechanism : ResolvedMechanism
        The run's resolved mechanism (σ, C, the event, δ, the phases).
    sampling : SamplingPlan
        Who takes part in each round and the normaliser, over the public device sizes.
    model : torch.nn.Module
        The global model; its trainable parameters are what a round updates, on their
        device (a model split over devices is refused: :func:`~fedfdp.contribution.model_device`).
        Initial weights that are not finite are refused (:class:`~fedfdp.health.RunDiverged`).
    training : TrainingConfig
        The optimiser, its learning rate and momentum, ``α`` and the public seed
        (post-processing of the noisy sums, and public randomness).
    parts : ServerParts
        The noise mechanism, the accounting, the projection and the count's noise.
    secrets : SecretSource
        The server's secret streams (noise, the device draw).
    journal : Journal, optional
        Where every charge is written durably before the round draws anything (a run
        directory); None: the ledger lives in memory only.

    Examples
    --------
    >>> import torch
    >>> from fedfdp import build_plan, load_config
    >>> plan = build_plan(load_config({"noise-multiplier": 1.0, "num-rounds": 5, "progress": False}),
    ...                   model=torch.nn.Linear(4, 2), num_devices=3)
    >>> engine = plan.engine([100, 80, 120])          # public device sizes
    >>> round(engine.mechanism.noise_multiplier, 2), engine.mechanism.sampling_rate
    (1.0, 0.05)
    >>> state = engine.begin_round(1)                 # charged before anything is drawn
    >>> len(engine.ledger.charges), state.plan.normaliser
    (1, 15.0)
    """

    def __init__(
        self,
        mechanism: ResolvedMechanism,
        sampling: SamplingPlan,
        model: nn.Module,
        *,
        training: TrainingConfig,
        parts: ServerParts | None = None,
        secrets: SecretSource | None = None,
        journal: Journal | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model={type(model).__name__}: must be a torch.nn.Module")
        self._parts = parts if parts is not None else ServerParts()
        self._secrets: SecretSource = (secrets if secrets is not None else self._parts.secrets
                                       if self._parts.secrets is not None else SystemEntropy())
        self._journal = journal
        self._mechanism = mechanism
        self._sampling = sampling
        self._model = model
        self._training = training
        check_finite_model(model)
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._params: list[nn.Parameter] = [p for _, p in params]
        self._shapes = {n: tuple(p.shape) for n, p in params}
        self._optimizer = build_optimizer(self._params, training.optimizer, training.learning_rate,
                                          training.momentum)
        self._budget = Budget(mechanism, self.accounting.new())
        self._ledger = Ledger.start(mechanism.to_dict(), mechanism.digest())
        self._current: RoundState | None = None
        #: ``C`` of the next private round (moves with adaptive clipping).
        self._clipping_norm = float(mechanism.clipping.norm)
        if self._parts.project is not None:
            self._parts.project(model)  # the initial model in Θ (post-processing: no cost)

    # ---------------------------------------------------------------- what it holds
    @property
    def mechanism(self) -> ResolvedMechanism:
        """The resolved mechanism the engine runs."""
        return self._mechanism

    @property
    def sampling(self) -> SamplingPlan:
        """The sampling plan (who takes part, the normaliser, a node's record bound)."""
        return self._sampling

    @property
    def accounting(self) -> Accounting:
        """The relation, event family and accountant of the run."""
        return self._parts.accounting

    @property
    def model(self) -> nn.Module:
        """The global model."""
        return self._model

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every trainable parameter, by name, in order."""
        return dict(self._shapes)

    @property
    def in_flight(self) -> RoundState | None:
        """The round between :meth:`begin_round` and its end, None between rounds."""
        return self._current

    @property
    def ledger(self) -> Ledger:
        """The run's hash-chained ledger (the mechanism, then every charge)."""
        return self._ledger

    @property
    def clipping_norm(self) -> float:
        """``C`` of the next private round."""
        return self._clipping_norm

    @property
    def num_records(self) -> int:
        """``N``."""
        return self._sampling.num_records

    def epsilon(self) -> float:
        """ε spent so far (the accountant's upper bound at the mechanism's δ)."""
        return self._budget.epsilon()

    def epsilons(self) -> dict[str, Any]:
        """The ε columns of an output row (:meth:`Accounting.columns`)."""
        return self.accounting.columns(self._budget.epsilon())

    # ---------------------------------------------------------------- rounds
    def _charge(self, round_: int) -> int:
        """Compose the round's event and write the ledger durably — before the round
        draws its batches and noise. Returns the attempt number (how often the round
        was charged before).
        """
        event = self._mechanism.event
        if event is None:
            raise RuntimeError(f"round {round_}: a private round without an event")
        attempt = self._ledger.attempts(round_)
        self._ledger.append_charge(round_, attempt, event)
        self._budget.compose(event)  # ε is evaluated when asked (epsilon()), once a round
        if self._journal is not None:
            self._journal.write_ledger(self._ledger)
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
        phase = self._mechanism.phase(round_)
        attempt = 0
        if phase.noise:
            self._budget.check()
            attempt = self._charge(round_) if charge else self._ledger.attempts(round_)
        public_rng = server_public_rng(self._training.seed, round_)
        plan = self._sampling.round(phase, public_rng, self._secrets.device_draw(round_, attempt))
        self._current = RoundState(round_, phase, attempt, plan, self._clipping_norm)
        return self._current

    def charge_round(self) -> None:
        """The deferred charge of the round in flight (``begin_round(charge=False)``):
        budget check, then the event written durably to the ledger and composed —
        before anything of the round is released (secure aggregation: before unmasking).

        Raises
        ------
        PrivacyBudgetExhausted
            Nothing was charged.
        """
        state = self._current
        if state is None:
            raise RuntimeError("charge_round without begin_round")
        if not state.phase.noise:
            raise RuntimeError(f"round {state.round}: a round without noise is not charged")
        self._budget.check()
        self._current = dataclasses.replace(state, attempt=self._charge(state.round))

    def abort_round(self, stats: RoundStats | None = None) -> RoundOutcome:
        """End the round in flight without a step: the model, the optimizer, ``C`` and
        the ledger are unchanged (secure aggregation below ``n_min`` survivors).
        """
        state = self._current
        if state is None:
            raise RuntimeError("abort_round without begin_round")
        self._current = None
        log.warning("round %d aborted: no step, nothing charged", state.round)
        epsilons = self.epsilons()
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
        state = self._current
        if state is None:
            raise RuntimeError("finish_round without begin_round")
        mechanism = self._mechanism
        noise = None
        clipping = mechanism.clipping
        phase = state.phase
        if phase.noise and mechanism.secagg is not None:
            # secure aggregation: the private sum arrives with the parties' noise in it
            phase = dataclasses.replace(phase, noise=False)
        elif state.phase.noise:
            if mechanism.noise_multiplier is None:
                raise RuntimeError(f"round {state.round}: a private round without a noise multiplier")
            noise = RoundNoise(self._parts.mechanism(mechanism.noise_multiplier, state.clipping_norm),
                               self._secrets.noise(state.round, state.attempt))
        t = self._training
        grad, _ = combine_gradient(
            phase,
            private_sums,
            public_sums,
            public_count,
            shapes=[torch.Size(s) for s in self._shapes.values()],
            expected_batch_size=state.plan.normaliser,
            alpha=t.alpha,
            noise=noise,
        )
        sigma_c = (mechanism.noise_multiplier or 0.0) * state.clipping_norm
        noise_cause = (f"the noise (noise-multiplier x clipping-norm = {sigma_c:.3g}) over the normaliser "
                       f"{state.plan.normaliser:.3g} (sampling-rate x records)")
        alpha_cause = f"alpha={t.alpha:g} (it scales the private part and its noise)"
        causes = (alpha_cause, noise_cause) if t.alpha > 1 else (noise_cause, alpha_cause)  # a raised α first
        finite_or_raise(state.round, "the aggregated gradient", grad, f"{causes[0]}, or {causes[1]}")
        apply_gradient(self._params, self._optimizer, grad)
        finite_or_raise(state.round, "the model", list(self._params),
                        f"learning-rate={t.learning_rate:g} (with momentum={t.momentum:g}) or "
                        f"alpha={t.alpha:g} too large for this model")
        if self._parts.project is not None:
            self._parts.project(self._model)
        if noise is not None and clipping.adaptive and clipping.count_noise is not None:
            count = self._parts.count_mechanism(clipping.count_noise, 1.0)
            (noisy,) = count.privatize([torch.tensor([float(unclipped)], dtype=torch.float64)], noise.stream)
            self._clipping_norm = next_clipping_norm(
                state.clipping_norm, float(noisy), state.plan.normaliser, clipping.quantile,
                clipping.learning_rate,
            )
        self._current = None
        public_loss = public_loss_sum / public_count if public_count else float("nan")
        if public_count and not math.isfinite(public_loss):
            raise RunDiverged(f"round {state.round}: the public loss is {public_loss}; likely "
                              f"learning-rate={t.learning_rate:g} too large, or non-finite inputs in the "
                              "data")
        epsilons = self.epsilons()
        return RoundOutcome(
            epsilons["epsilon"], public_loss, stats or RoundStats(), state.plan.normaliser,
            state.clipping_norm, epsilons,
        )

    # ---------------------------------------------------------------- state
    def restore_ledger(self, ledger: Ledger, unrecorded: int = 0) -> None:
        """Continue from a verified ``ledger`` (every charge ever written): the charges
        the interrupted session may have written after its last checkpoint
        (``unrecorded``) are appended pessimistically and written durably first, then
        the budget is replayed from the ledger.
        """
        if unrecorded:
            event = self._mechanism.event
            if event is None:
                raise RuntimeError("unrecorded charges for a mechanism that charges nothing")
            ledger.append_unrecorded(event, unrecorded,
                                     "may have been written after the last checkpoint and is missing")
            log.warning("%d charge(s) the interrupted session may have written are missing from the ledger: "
                        "charged pessimistically", unrecorded)
            if self._journal is not None:
                self._journal.write_ledger(ledger)
        self._ledger = ledger
        self._budget = Budget(self._mechanism, replay(ledger.events(), self.accounting.new))

    def restore_state(self, ckpt: Checkpoint) -> None:
        """The model, the optimizer and ``C`` of a verified checkpoint."""
        self._model.load_state_dict(ckpt.model)
        self._optimizer.load_state_dict(ckpt.optimizer)
        self._clipping_norm = ckpt.clipping_norm

    def state(self) -> EngineState:
        """The engine's state between rounds, for a checkpoint."""
        return EngineState(self._ledger.head(), self._clipping_norm, self._model.state_dict(),
                           self._optimizer.state_dict())
