"""A non-federated reference trainer for images: the five methods of §6.3, on one machine.

This is a **measuring** tool: it runs the methods of Section 6.3 of the FDP
paper on an :class:`~fedfdp.images.data.ImageSet` held in one place, with the
project's pieces for everything privacy-deciding (Poisson coins:
:func:`fedfdp.sampling.poisson_sample`; per-record clipping:
:func:`fedfdp.clipping.clipped_grad_sum`; noise:
:class:`fedfdp.mechanisms.GaussianSumMechanism`; calibration and ε:
:func:`fedfdp.accounting.calibrate_noise_multiplier`,
:func:`fedfdp.accounting.epsilon_for`). Phase 2 runs the same through the
federated engines; this module writes no ledger and has no budget guard.

Methods (``N`` training records, rate ``q``, clipping norm ``C``, noise
multiplier ``σ``, public batch ``m'``):

==============  ==========================================================  ==========
method          one step                                                    ε
==============  ==========================================================  ==========
``nonprivate``  mean ∇ℓ over a Poisson batch (rate ``q``)                   ∞
``public``      mean ∇ℓ_pub over a uniform batch of ``m'`` (blurred only)   0 (FDP)
``dp``          (Σ_i clip_C(∇ℓ_i) + N(0, σ²C²I)) / (qN)  (DP-SGD)          DP ⇒ FDP
``fdp-dpsgd``   ``pretrain_steps`` public steps, then ``dp`` steps          as ``dp``
``fdp``         ``pretrain_steps`` public steps, then Algorithm 1:          FDP
                mean ∇ℓ_pub over a uniform batch of ``m'`` drawn
                independently of the coins (Prop. 3) +
                α·(Σ_i clip_C(∇ℓ_priv,i) + N(0, σ²C²I)) / (qN),
                ``C`` by the recipe (:mod:`fedfdp.images.recipe`)
==============  ==========================================================  ==========

Privacy of the private steps (``dp``, the DP phase of ``fdp-dpsgd``, the
Algorithm 1 phase of ``fdp``): each is a Poisson-subsampled Gaussian mechanism
with rate ``q``, sensitivity ``C`` under add/remove (Def. 6) and noise
multiplier ``σ`` (Theorem 5; ``dp`` by Prop. 2 as well); ``steps`` of them are
composed by the PRV accountant, and ``σ`` is calibrated so that the **upper**
ε is at most ``target_epsilon`` at ``delta`` (default ``1/(2N)``). ``fdp``'s
default recipe moves ``C`` toward a quantile of the private norms through a
noisy count released each step; the count and the sum are then one Gaussian
mechanism of the calibrated multiplier ``σ_eff`` (the gradient gets
``σ = σ_eff/√(1 − r)``, the count ``σ_b = σ_eff/√r``), so ε covers it. The divisor
is the expected batch size ``qN``, never the realised one. Public steps,
public pre-training (Remark 2) and everything computed from Ψ cost nothing.
The Poisson coins and the noise come from ``secrets`` (default the OS
CSPRNG); everything else is public randomness from ``settings.seed``.
Evaluation uses held-out data only.

Device
------
The trainer computes on the device of the model's parameters (move the model
to ``cuda`` before :func:`train` to train there; nothing here requires CUDA).
Every random draw stays where it was: the Poisson coins and the Gaussian noise
are drawn on the CPU from ``secrets`` (the noise is added to the clipped sum on
the CPU, float64 then one rounding, and the result moved to the device), and
the public per-record draws come from CPU generators and are moved to the
device. So the public draws are the same on either device, and the secret
stream feeds the coins and the noise only, as on the CPU.

Public randomness, keyed by public quantities only
--------------------------------------------------
Every public draw comes from its own stream (:class:`PublicDraws`), keyed by
``(seed, stage, step, …)`` and never by anything the private batch decides:

==================================  ==========================================================
stream                              key
==================================  ==========================================================
uniform public batch of a step      ``(seed, stage, step)``
``nonprivate``'s Poisson batch      ``(seed, step)`` (``nonprivate`` has no guarantee)
one record's draws in one part      ``(seed, stage, step, part, record index)``: the diffusion
                                    draw ``(t, ε)``, then whatever a random Ψ draws
==================================  ==========================================================

So the public part of an ``fdp`` step — its batch, its draws, hence its
unnoised gradient — is the same function of the seed whatever the private
batch holds: nothing of ``|B_t|`` reaches it (a shared generator that served the
private batch first let anyone with the seed read ``|B_t|`` off the public
gradient). The private part's draws are per-record public streams too, keyed
by the record's index (a public identity of the record, like ``Ψ(x)``; a
neighbouring dataset adds or removes one record and the others keep their
indices) under a part key of their own, so they are never the public batch's
draws. Each record's draw is then fixed whoever else is in the batch, and
adding a record changes the clipped private sum by that record's term only:
sensitivity ``C`` under add/remove for every value of the draws, which the
adversary may know (Theorem 5 holds conditionally on them). The draws need not
be secret; keyed public draws keep runs reproducible and the secret stream
feeds only the coins and the noise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Protocol

import numpy as np
import torch
from torch import nn

from fedfdp.accounting import calibrate_noise_multiplier, default_delta, epsilon_for
from fedfdp.clipping import METHODS as CLIP_METHODS
from fedfdp.clipping import ClipMethod, clipped_grad_sum
from fedfdp.config import Mode, Optimizer
from fedfdp.entropy import BitStream, OSBits, SeededBits
from fedfdp.images.blur import PublicMap, apply_view
from fedfdp.images.data import ImageSet
from fedfdp.images.diffusion import DiffusionLoss, diffusion_terms
from fedfdp.images.recipe import (
    DEFAULT_RECIPE,
    ImageRecipe,
    StepDiagnostics,
    next_clipping_norm,
    step_diagnostics,
)
from fedfdp.losses import LossPart, cross_entropy, private_cross_entropy
from fedfdp.mechanisms import GaussianSumMechanism
from fedfdp.sampling import poisson_sample, uniform_sample

__all__ = [
    "METHODS",
    "ClassificationTask",
    "DiffusionTask",
    "ImageTask",
    "LossPart",
    "PublicDraws",
    "Stage",
    "TrainResult",
    "TrainSettings",
    "apply_view",
    "evaluate_classifier",
    "train",
]

#: The five methods of Section 6.3.
METHODS: tuple[Mode, ...] = (Mode.NONPRIVATE, Mode.PUBLIC, Mode.DP, Mode.FDP_DPSGD, Mode.FDP)

LossFn = Callable[[Sequence[torch.Tensor], torch.Tensor], torch.Tensor]


def _loss_part(part: LossPart | str) -> LossPart:
    if part not in tuple(LossPart):
        raise ValueError(f"part={part!r}: must be one of {', '.join(LossPart)}")
    return LossPart(part)


class Stage(IntEnum):
    """The stage a step belongs to (part of every public stream's key)."""

    PRETRAIN = 0
    MAIN = 1


# spawn-key root and purposes of the trainer's public streams (the federated
# engines' public streams, fedfdp.sampling, use roots 0 and 1)
_ROOT = 7
_PUBLIC_BATCH, _NONPRIVATE_BATCH, _RECORD = 1, 2, 3
_PART_KEY = {LossPart.FULL: 0, LossPart.PRIVATE: 1, LossPart.PUBLIC: 2}


@dataclass(frozen=True)
class PublicDraws:
    """The trainer's public randomness: one stream per public key (module docstring).

    Each stream is a :class:`numpy.random.SeedSequence` of ``seed`` with a spawn
    key naming its purpose and position; no stream is shared between two
    purposes, steps, parts or records, so what one of them yields never depends
    on how much another consumed — in particular not on the size of a private
    batch.

    Parameters
    ----------
    seed : int
        The run's public seed (``settings.seed``), ``>= 0``.

    Examples
    --------
    >>> import numpy as np, torch
    >>> draws = PublicDraws(3)
    >>> a = draws.record_generators(Stage.MAIN, 0, LossPart.PUBLIC, np.array([5, 9]))
    >>> b = draws.record_generators(Stage.MAIN, 0, LossPart.PUBLIC, np.array([9]))
    >>> torch.equal(torch.randn(2, generator=a[1]), torch.randn(2, generator=b[0]))
    True
    """

    seed: int

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}: must be an integer >= 0")

    def _sequence(self, *key: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(entropy=self.seed, spawn_key=(_ROOT, *key))

    def public_batch(self, stage: Stage, step: int, n: int, size: int) -> np.ndarray:
        """The uniform public batch (``size`` of ``n`` indices) of step ``step`` of ``stage``."""
        rng = np.random.default_rng(self._sequence(_PUBLIC_BATCH, int(stage), step))
        return uniform_sample(n, size, rng)

    def nonprivate_batch(self, step: int, n: int, rate: float) -> np.ndarray:
        """``nonprivate``'s Poisson batch of step ``step`` (public coins: no guarantee to keep)."""
        return poisson_sample(n, rate, SeededBits(self._sequence(_NONPRIVATE_BATCH, step)))

    def record_generators(
        self, stage: Stage, step: int, part: LossPart, index: np.ndarray
    ) -> list[torch.Generator]:
        """One generator per record of ``index`` for its draws in ``part`` at ``step``.

        Keyed by ``(stage, step, part, record index)`` only: a record's draws are
        the same whichever batch it is in and whatever else that batch holds.
        """
        part_key = _PART_KEY[_loss_part(part)]
        gens = []
        for i in np.asarray(index, dtype=np.int64).tolist():
            state = self._sequence(_RECORD, int(stage), step, part_key, i).generate_state(1, np.uint64)[0]
            gens.append(torch.Generator().manual_seed(int(state >> np.uint64(1))))
        return gens


class ImageTask(Protocol):
    """What the trainer needs from a task: the inputs, targets and per-record
    loss of one part (``full`` ℓ, ``private`` ℓ_priv, ``public`` ℓ_pub) on a
    batch, every record's random draws from its own public generator
    (:meth:`PublicDraws.record_generators`).
    """

    def parts(
        self, part: LossPart, x: torch.Tensor, y: torch.Tensor, generators: Sequence[torch.Generator]
    ) -> tuple[list[torch.Tensor], torch.Tensor, LossFn]: ...


@dataclass(frozen=True)
class ClassificationTask:
    """Cross-entropy with Ψ as the public view: ``ℓ_pub = CE(model(Ψ(x)), y)``,
    ``ℓ_priv = CE(model(x), y) − CE(model(Ψ(x)), y)`` (:mod:`fedfdp.losses`).
    """

    psi: PublicMap

    def parts(
        self, part: LossPart, x: torch.Tensor, y: torch.Tensor, generators: Sequence[torch.Generator]
    ) -> tuple[list[torch.Tensor], torch.Tensor, LossFn]:
        part = _loss_part(part)
        if part is LossPart.FULL:
            return [x], y, cross_entropy
        view = apply_view(self.psi, x, generators)
        if part is LossPart.PRIVATE:
            return [x, view], y, private_cross_entropy
        return [view], y, cross_entropy


@dataclass(frozen=True)
class DiffusionTask:
    """The DDPM loss and its split (:class:`~fedfdp.images.diffusion.DiffusionLoss`);
    one fresh draw ``(t, ε)`` per record, part and step from the record's own
    public generator (then Ψ's draws, if any, from the same generator).
    """

    loss: DiffusionLoss

    def parts(
        self, part: LossPart, x: torch.Tensor, y: torch.Tensor, generators: Sequence[torch.Generator]
    ) -> tuple[list[torch.Tensor], torch.Tensor, LossFn]:
        return diffusion_terms(self.loss, _loss_part(part), x, y, generators)


@dataclass(frozen=True)
class TrainSettings:
    """Settings of one reference training run (privacy-defining ones first).

    Parameters
    ----------
    method : str
        One of :data:`METHODS`.
    steps : int
        Main steps ``T >= 1``: the accounted private steps of ``dp``,
        ``fdp-dpsgd`` and ``fdp``; the plain steps of ``nonprivate`` and ``public``.
    sampling_rate : float
        Poisson rate ``q`` in (0, 1] (private batches; ``nonprivate`` batches).
    clipping_norm : float
        ``C > 0``.
    target_epsilon : float
        Calibration target (upper ε, add/remove) when ``noise_multiplier`` is None.
    noise_multiplier : float or None
        A fixed ``σ > 0`` instead of calibration.
    delta : float or None
        δ; default ``1/(2N)``.
    public_batch_size : int
        ``m'`` (``public`` steps, pre-training, Algorithm 1's public batch).
    pretrain_steps : int
        Public steps before the private phase of ``fdp-dpsgd`` and ``fdp``
        (0: the caller passes an already pre-trained model).
    alpha : float
        Weight of the private part in ``fdp`` steps.
    recipe : ImageRecipe
        How ``C`` of ``fdp``'s private part moves (:mod:`fedfdp.images.recipe`):
        by default it starts at ``clipping_norm`` and follows the median private
        norm, a noisy count charged in ε; :data:`~fedfdp.images.recipe.FIXED_CLIPPING`
        keeps ``clipping_norm``. ``dp`` and ``fdp-dpsgd`` always keep ``clipping_norm``.
    learning_rate, pretrain_learning_rate : float
        Step sizes of the main phase and of public pre-training (default: the same).
    optimizer : {"sgd", "adam"}
    momentum : float
        SGD momentum.
    clip_method : ClipMethod
        Engine of :func:`fedfdp.clipping.clipped_grad_sum` (its string is accepted).
    chunk_size : int
        Records per clipping call (memory only; the clipped sum is the same).
    seed : int
        Public randomness (public batches, nonprivate batches, Ψ and diffusion draws).
    eval_every : int
        Call ``evaluate`` every this many steps (0: only at the end).
    """

    method: Mode
    steps: int
    sampling_rate: float
    clipping_norm: float = 1.0
    target_epsilon: float = 8.0
    noise_multiplier: float | None = None
    delta: float | None = None
    public_batch_size: int = 256
    pretrain_steps: int = 0
    alpha: float = 1.0
    recipe: ImageRecipe = DEFAULT_RECIPE
    learning_rate: float = 0.1
    pretrain_learning_rate: float | None = None
    optimizer: Optimizer = Optimizer.SGD
    momentum: float = 0.9
    clip_method: ClipMethod = ClipMethod.AUTO
    chunk_size: int = 128
    seed: int = 0
    eval_every: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"mode={self.method!r}: must be one of {', '.join(METHODS)}")
        object.__setattr__(self, "method", Mode(self.method))
        for name in ("steps", "public_batch_size", "chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        for name in ("pretrain_steps", "eval_every", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r}: must be an integer >= 0")
        if not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling-rate={self.sampling_rate!r}: must be in (0, 1]")
        for name in ("clipping_norm", "target_epsilon", "learning_rate", "alpha"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r}: must be finite and > 0")
        if self.noise_multiplier is not None and not (
            math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0
        ):
            raise ValueError(f"noise-multiplier={self.noise_multiplier!r}: must be finite and > 0 or None")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta={self.delta!r}: must be in (0, 1) or None (1/(2N))")
        if self.pretrain_learning_rate is not None and not (
            math.isfinite(self.pretrain_learning_rate) and self.pretrain_learning_rate > 0
        ):
            raise ValueError(f"pretrain_learning_rate={self.pretrain_learning_rate!r}: must be > 0 or None")
        if self.optimizer not in tuple(Optimizer):
            raise ValueError(f"optimizer={self.optimizer!r}: must be sgd or adam")
        object.__setattr__(self, "optimizer", Optimizer(self.optimizer))
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum={self.momentum!r}: must be in [0, 1)")
        if self.clip_method not in CLIP_METHODS:
            raise ValueError(f"clip_method={self.clip_method!r}: must be one of "
                             f"{tuple(str(m) for m in CLIP_METHODS)}")
        object.__setattr__(self, "clip_method", ClipMethod(self.clip_method))
        if not isinstance(self.recipe, ImageRecipe):
            raise ValueError(f"recipe={self.recipe!r}: must be an ImageRecipe")

    @property
    def private(self) -> bool:
        """Whether the main phase is a private (noised, accounted) one."""
        return self.method.is_private

    @property
    def adaptive(self) -> bool:
        """Whether the private part's ``C`` follows the norms (``fdp`` with a quantile recipe)."""
        return self.method is Mode.FDP and self.recipe.adaptive


@dataclass
class TrainResult:
    """What a run did: the trained model, the privacy it spent, its timings.

    ``epsilon`` is the accountant's **upper** bound (add/remove, at ``delta``)
    for the private phase; ``inf`` for ``nonprivate``, 0 for ``public``; it is
    computed from ``accounted_noise_multiplier`` (``σ_eff``), which equals the
    gradient's ``noise_multiplier`` unless the private part's ``C`` adapts (then
    the count's noise ``count_noise_std`` takes its share, :mod:`fedfdp.images.recipe`).
    ``clipping_norms`` is ``C`` of every private step (post-processing of the noisy
    counts when it adapts).
    ``history`` holds one dict per evaluation (``step``, ``phase`` and whatever
    ``evaluate`` returned). ``reproducible_secrets`` is True when the coins and
    noise came from a seeded stream (tests only: then the guarantee does not hold
    against anyone who knows the seed).
    """

    model: nn.Module
    settings: TrainSettings
    num_records: int
    noise_multiplier: float | None
    epsilon: float
    delta: float
    wall_seconds: float
    pretrain_seconds: float
    reproducible_secrets: bool
    history: list[dict[str, float | int | str]] = field(default_factory=list)
    accounted_noise_multiplier: float | None = None
    count_noise_std: float | None = None
    clipping_norms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """Plain values for JSON (no model)."""
        return {
            "settings": asdict(self.settings),
            "num_records": self.num_records,
            "noise_multiplier": self.noise_multiplier,
            "accounted_noise_multiplier": self.accounted_noise_multiplier,
            "count_noise_std": self.count_noise_std,
            "clipping_norms": self.clipping_norms,
            "epsilon": self.epsilon,
            "epsilon_relation": "add-remove (upper bound)",
            "delta": self.delta,
            "wall_seconds": self.wall_seconds,
            "pretrain_seconds": self.pretrain_seconds,
            "reproducible_secrets": self.reproducible_secrets,
            "history": self.history,
        }


def _sum_grads(
    model: nn.Module,
    task: ImageTask,
    part: LossPart,
    x: torch.Tensor,
    y: torch.Tensor,
    index: np.ndarray,
    max_norm: float | None,
    settings: TrainSettings,
    draws: PublicDraws,
    stage: Stage,
    step: int,
    params: list[nn.Parameter],
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``Σ_{i ∈ index}`` of the (clipped, when ``max_norm``) per-record gradients of
    ``part``, record ``i``'s draws from its own stream ``(stage, step, part, i)``,
    and the per-record norms before clipping (NaN when ``max_norm`` is None).
    """
    total = [torch.zeros_like(p) for p in params]
    norms = []
    for s in range(0, len(index), settings.chunk_size):
        chunk = index[s : s + settings.chunk_size]
        idx = torch.as_tensor(chunk, dtype=torch.long, device=x.device)
        generators = draws.record_generators(stage, step, part, chunk)
        inputs, targets, loss_fn = task.parts(part, x[idx], y[idx], generators)
        result = clipped_grad_sum(model, inputs, targets, loss_fn, max_norm, settings.clip_method)
        total = [t + g for t, g in zip(total, result.grads, strict=True)]
        norms.append(result.norms.detach().cpu())
    return total, (torch.cat(norms) if norms else torch.empty(0))


# a bound no per-record norm reaches: the public sum with its per-record norms (diagnostics only)
_NO_CLIP = 1e30


def _model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def _optimizer(params: list[nn.Parameter], settings: TrainSettings, lr: float) -> torch.optim.Optimizer:
    if settings.optimizer is Optimizer.ADAM:
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=settings.momentum)


def _step(params: list[nn.Parameter], opt: torch.optim.Optimizer, grad: list[torch.Tensor]) -> None:
    for p, g in zip(params, grad, strict=True):
        p.grad = g.detach().to(p.dtype).clone()
    opt.step()
    for p in params:
        p.grad = None


def train(
    model: nn.Module,
    task: ImageTask,
    data: ImageSet,
    settings: TrainSettings,
    *,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    secrets: BitStream | None = None,
    log: Callable[[str], None] | None = None,
    diagnose: Callable[[StepDiagnostics], None] | None = None,
) -> TrainResult:
    """Train ``model`` (in place) on ``data`` by ``settings.method``.

    Parameters
    ----------
    model : nn.Module
        Initialised by the caller (public randomness); for the private phase it
        must not mix records (no BatchNorm; refused by the clipping engine).
        The run computes on the device of its parameters (module docstring:
        Device); the records are copied there.
    task : ImageTask
        :class:`ClassificationTask` or :class:`DiffusionTask`.
    data : ImageSet
        The training records (``N = len(data)``, public).
    evaluate : callable, optional
        ``evaluate(model) -> metrics`` on **held-out** data.
    secrets : BitStream, optional
        Source of the Poisson coins and the noise; default
        :class:`~fedfdp.entropy.OSBits` (the OS CSPRNG). A seeded stream makes
        the run reproducible and is flagged in the result.
    log : callable, optional
        Receives one line per evaluation.
    diagnose : callable, optional
        Receives a :class:`~fedfdp.images.recipe.StepDiagnostics` per private step
        (norms of the public gradient, the clipped private sum and the noise, the
        per-record private norms against ``C``; for ``fdp`` also the per-record
        public norms, at the cost of a per-record pass over the public batch).
        A measuring aid: these are private values, never released.

    Returns
    -------
    TrainResult
    """
    n = len(data)
    q = settings.sampling_rate
    delta = settings.delta if settings.delta is not None else default_delta(n)
    secret_stream: BitStream = secrets if secrets is not None else OSBits()
    reproducible = secrets is not None and not isinstance(secrets, OSBits)
    draws = PublicDraws(settings.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    device = _model_device(model)
    x, y = (t.to(device) for t in data.tensors())
    history: list[dict[str, float | int | str]] = []

    def record(step: int, phase: str) -> None:
        if evaluate is None:
            return
        metrics = evaluate(model)
        row: dict[str, float | int | str] = {"step": step, "phase": phase, **metrics}
        history.append(row)
        if log is not None:
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))

    sigma: float | None = None
    accounted: float | None = None
    count_std: float | None = None
    epsilon = math.inf if settings.method is Mode.NONPRIVATE else 0.0
    if settings.private:
        given = settings.noise_multiplier  # the gradient's σ when configured
        if given is not None:
            # the count, when C adapts, adds its share on top (as the engine's resolve_mechanism)
            accounted = given * math.sqrt(1 - settings.recipe.budget_share) if settings.adaptive else given
        else:
            accounted = calibrate_noise_multiplier(target_epsilon=settings.target_epsilon, sampling_rate=q,
                                                   rounds=settings.steps, delta=delta)
        sigma, count_std = settings.recipe.noise(accounted) if settings.adaptive else (accounted, None)
        if given is not None:
            sigma = given
        epsilon = float(epsilon_for(accounted, q, settings.steps, delta).upper)
    m_pub = min(settings.public_batch_size, n)

    def public_step(opt: torch.optim.Optimizer, stage: Stage, step: int) -> None:
        idx = draws.public_batch(stage, step, n, m_pub)
        total, _ = _sum_grads(model, task, LossPart.PUBLIC, x, y, idx, None, settings, draws, stage, step,
                              params)
        _step(params, opt, [t / m_pub for t in total])

    start = time.perf_counter()
    pretrain_seconds = 0.0
    if settings.method in (Mode.FDP_DPSGD, Mode.FDP) and settings.pretrain_steps:
        lr = settings.pretrain_learning_rate or settings.learning_rate
        opt = _optimizer(params, settings, lr)
        for s in range(settings.pretrain_steps):
            public_step(opt, Stage.PRETRAIN, s)
            if settings.eval_every and (s + 1) % settings.eval_every == 0:
                record(s + 1, "pretrain")
        pretrain_seconds = time.perf_counter() - start

    opt = _optimizer(params, settings, settings.learning_rate)
    clipping_norm = settings.clipping_norm
    clipping_norms: list[float] = []
    main = Stage.MAIN
    for s in range(settings.steps):
        if settings.method is Mode.PUBLIC:
            public_step(opt, main, s)
        elif settings.method is Mode.NONPRIVATE:
            idx = draws.nonprivate_batch(s, n, q)
            if len(idx):
                total, _ = _sum_grads(model, task, LossPart.FULL, x, y, idx, None, settings, draws, main, s,
                                      params)
                _step(params, opt, [t / len(idx) for t in total])
        else:
            if sigma is None:  # set whenever settings.private
                raise RuntimeError("private phase without a noise multiplier")
            mechanism = GaussianSumMechanism(sigma, clipping_norm)
            clipping_norms.append(clipping_norm)
            part = LossPart.PRIVATE if settings.method is Mode.FDP else LossPart.FULL
            idx = poisson_sample(n, q, secret_stream)
            clipped, norms = _sum_grads(model, task, part, x, y, idx, clipping_norm, settings, draws, main,
                                        s, params)
            # the noise is drawn and added on the CPU (secret stream), the sum moved back
            noisy_cpu = mechanism.privatize([c.cpu() for c in clipped], secret_stream)
            if settings.adaptive:
                if count_std is None:  # set whenever settings.adaptive
                    raise RuntimeError("adaptive clipping without the count's noise")
                # the count's noise: the same secret stream, right after the gradient noise
                clipping_norm = next_clipping_norm(settings.recipe, clipping_norm, norms, count_std, q * n,
                                                   secret_stream)
            noisy = [t.to(device) for t in noisy_cpu]
            weight = settings.alpha if settings.method is Mode.FDP else 1.0
            grad = [weight * t / (q * n) for t in noisy]
            pub_mean: list[torch.Tensor] | None = None
            pub_norms: torch.Tensor | None = None
            if settings.method is Mode.FDP:
                # independent of the coins (Prop. 3), and of how many records they drew
                pub_idx = draws.public_batch(main, s, n, m_pub)
                pub, pub_norms = _sum_grads(model, task, LossPart.PUBLIC, x, y, pub_idx,
                                            _NO_CLIP if diagnose is not None else None, settings, draws,
                                            main, s, params)
                pub_mean = [t / m_pub for t in pub]
                grad = [g + t for g, t in zip(grad, pub_mean, strict=True)]
            if diagnose is not None:
                diagnose(step_diagnostics(s, clipping_norms[-1], norms, clipped, noisy_cpu, q * n, pub_mean,
                                          pub_norms))
            _step(params, opt, grad)
        if settings.eval_every and (s + 1) % settings.eval_every == 0 and s + 1 < settings.steps:
            record(settings.pretrain_steps + s + 1, "main")
    wall = time.perf_counter() - start
    record(settings.pretrain_steps + settings.steps, "final")
    return TrainResult(
        model=model,
        settings=settings,
        num_records=n,
        noise_multiplier=sigma,
        accounted_noise_multiplier=accounted,
        count_noise_std=count_std,
        clipping_norms=clipping_norms,
        epsilon=epsilon,
        delta=delta,
        wall_seconds=wall,
        pretrain_seconds=pretrain_seconds,
        reproducible_secrets=reproducible,
        history=history,
    )


@torch.no_grad()
def evaluate_classifier(model: nn.Module, data: ImageSet, batch_size: int = 1000) -> dict[str, float]:
    """Accuracy and mean cross-entropy on ``data`` (held-out), model in eval mode."""
    was_training = model.training
    model.eval()
    device = _model_device(model)
    x, y = (t.to(device) for t in data.tensors())
    correct, loss = 0.0, 0.0
    try:
        for s in range(0, len(y), batch_size):
            logits = model(x[s : s + batch_size])
            correct += float((logits.argmax(1) == y[s : s + batch_size]).sum())
            loss += float(torch.nn.functional.cross_entropy(logits, y[s : s + batch_size], reduction="sum"))
    finally:
        model.train(was_training)
    return {"accuracy": correct / len(y), "loss": loss / len(y)}
