r"""Denoising diffusion (DDPM) with the FDP loss split ``ℓ = ℓ_priv + ℓ_pub``.

Model and loss
--------------
Ho et al.'s DDPM with noise prediction: for a record ``(x, y)`` (image in
[0, 1], rescaled to ``x₀ = 2x − 1``), a timestep ``t ~ U{0..T−1}`` and a noise
``ε ~ N(0, I)``,

.. math::

    x_t = \sqrt{\bar α_t}\, x₀ + \sqrt{1 − \bar α_t}\, ε, \qquad
    ℓ(w; x) = \operatorname{mean}\bigl(ε_w(x_t, t, y) − ε\bigr)^2 .

FDP split (Section 6.3 of the FDP paper, with Section 5's decomposition): the
public loss is **the same diffusion loss on the blurred image with the same
timestep and the same noise draw**,

.. math::

    ℓ_{pub}(w; Ψ(x)) = \operatorname{mean}\bigl(ε_w(\tilde x_t, t, y) − ε\bigr)^2,
    \quad \tilde x_t = \sqrt{\bar α_t}\,(2Ψ(x) − 1) + \sqrt{1 − \bar α_t}\, ε,

and ``ℓ_priv = ℓ − ℓ_pub``, so ``ℓ_priv + ℓ_pub = ℓ`` holds record by record
(up to one floating-point rounding), for every draw. ``ℓ_pub`` depends on
``(Ψ(x), y)`` and on the data-independent draw ``(t, ε)`` only.

The draws ``(t, ε)`` are data-independent randomness: they come from an
explicit ``torch.Generator`` (:func:`draw_noise`). They need not be secret:
for any fixed draw each record's clipped private gradient still has norm at
most ``C``, so one step stays a Poisson-subsampled Gaussian mechanism with
sensitivity ``C`` under add/remove (Def. 6; Theorem 5) whatever the adversary
knows about the draws — provided each record's draw is fixed whoever else is
in the batch, and the public batch's draws do not depend on the private one.
A run therefore gives every record its own generator per round and part
(:class:`DiffusionFeatureMap`, keyed by :class:`fedfdp.losses.RecordKeys`), never one
stream shared by the private and the public batch (whose public gradient would then
reveal the private batch's size). The secrets are the Poisson coins and the noise,
which the engine takes from the OS CSPRNG.

Fit to the clipping API
-----------------------
``clipped_grad_sum(model, inputs, targets, loss_fn, C)`` evaluates
``outputs[k] = model(inputs[k])`` and ``loss_fn(outputs, targets) -> (n,)``.
Here every input is one packed tensor ``(n, C·H·W + 2)`` per view
(:func:`pack`: ``[x_t, t, y]``, decoded by :class:`~fedfdp.images.unet.UNet`),
the targets are the noise ``ε`` ``(n, C, H, W)``, and
:class:`DiffusionLoss` gives the inputs and per-record losses of each part:

============  ===========================  ==============================
part          inputs                       loss
============  ===========================  ==============================
full ``ℓ``    ``[pack(x_t)]``              :meth:`DiffusionLoss.full_loss`
private       ``[pack(x_t), pack(x̃_t)]``   :meth:`DiffusionLoss.private_loss`
public        ``[pack(x̃_t)]``              :meth:`DiffusionLoss.public_loss`
============  ===========================  ==============================

Conditioning on the label makes the label part of Ψ: ``Ψ(x, y) = (blur(x), y)``,
as in the paper's class-conditional AFHQ model. ``conditional=False`` packs the
"no class" index instead, so neither loss reads the label.

In a run
--------
:class:`DiffusionFeatureMap` is the split as a :class:`fedfdp.losses.FeatureMap`:
its :meth:`~DiffusionFeatureMap.terms` is the seam through which every engine (the
centralised engine, a Flower node, plain or secure aggregation) computes ``ℓ``,
``ℓ_priv`` and ``ℓ_pub`` for every model, so ``model = "ddpm"`` trains through the
same sampling plan, clipping, noise, ledger and aggregation as a classifier. Each
record's draw ``(t, ε)`` in a round comes from the record's own public stream keyed
by ``(seed, round, part, record's global index)`` (:class:`fedfdp.losses.RecordKeys`),
never from a stream shared along the batch: see that class for why the privacy
analysis needs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from fedfdp.images.blur import PublicMap, apply_view
from fedfdp.images.data import ImageShape
from fedfdp.losses import FeatureMap, LossPart, LossTerms, RecordKeys

__all__ = [
    "SCHEDULES",
    "DiffusionDraw",
    "DiffusionFeatureMap",
    "DiffusionLoss",
    "NoiseSchedule",
    "diffusion_feature_map",
    "diffusion_terms",
    "draw_noise",
    "mse_per_record",
    "pack",
    "sample",
]

#: Accepted kinds of :class:`NoiseSchedule`.
SCHEDULES: tuple[str, ...] = ("linear", "cosine")


@dataclass(frozen=True)
class NoiseSchedule:
    """The forward process ``β_1..β_T``.

    Parameters
    ----------
    steps : int
        ``T >= 2``.
    kind : {"linear", "cosine"}
        ``linear``: ``β`` evenly spaced from ``beta_start`` to ``beta_end``
        (Ho et al. 2020: 1e-4 to 0.02 at T = 1000, rescaled by ``1000/T``).
        ``cosine``: ``ᾱ(t) = cos²(((t/T) + s)/(1 + s) · π/2)`` normalised,
        ``s = 0.008``, ``β`` capped at 0.999 (Nichol & Dhariwal 2021).
    beta_start, beta_end : float
        Linear schedule ends, for ``T = 1000``.
    """

    steps: int = 1000
    kind: str = "linear"
    beta_start: float = 1e-4
    beta_end: float = 0.02

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 2:
            raise ValueError(f"diffusion-steps={self.steps!r}: must be an integer >= 2")
        if self.kind not in SCHEDULES:
            raise ValueError(f"diffusion-schedule={self.kind!r}: must be one of {SCHEDULES}")
        scale = 1000.0 / self.steps
        if not (0 < self.beta_start <= self.beta_end and self.beta_end * scale < 1):
            raise ValueError(
                f"beta_start={self.beta_start}, beta_end={self.beta_end}: need 0 < start <= end "
                f"and end·1000/T < 1 (T = {self.steps})"
            )

    def betas(self) -> torch.Tensor:
        """``β_t``, ``(T,)`` float64."""
        if self.kind == "linear":
            scale = 1000.0 / self.steps
            return torch.linspace(
                self.beta_start * scale, self.beta_end * scale, self.steps, dtype=torch.float64
            )
        s = 0.008
        grid = torch.arange(self.steps + 1, dtype=torch.float64) / self.steps
        f = torch.cos((grid + s) / (1 + s) * math.pi / 2) ** 2
        alpha_bar = f / f[0]
        return (1 - alpha_bar[1:] / alpha_bar[:-1]).clamp(max=0.999)

    def alpha_bars(self) -> torch.Tensor:
        """``ᾱ_t = Π_{s <= t} (1 − β_s)``, ``(T,)`` float64."""
        return torch.cumprod(1 - self.betas(), dim=0)


@dataclass(frozen=True, eq=False)
class DiffusionDraw:
    """One record-wise draw of the forward process: timesteps ``t`` ``(n,)``
    (int64 in ``0..T−1``) and noise ``ε`` ``(n, C, H, W)``. Data-independent.
    """

    t: torch.Tensor
    noise: torch.Tensor

    def __post_init__(self) -> None:
        if self.t.dim() != 1 or self.noise.dim() != 4 or self.noise.shape[0] != self.t.shape[0]:
            raise ValueError(
                f"diffusion draw t={tuple(self.t.shape)}, noise={tuple(self.noise.shape)}: "
                "need (n,) and (n, C, H, W)"
            )

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def subset(self, index: torch.Tensor) -> DiffusionDraw:
        """The draws of the records ``index``."""
        return DiffusionDraw(self.t[index], self.noise[index])


def draw_noise(
    n: int,
    shape: ImageShape,
    schedule: NoiseSchedule,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> DiffusionDraw:
    """``n`` independent draws ``t ~ U{0..T−1}``, ``ε ~ N(0, I)`` from ``generator``."""
    if not isinstance(generator, torch.Generator):
        raise ValueError("draw_noise: an explicit torch.Generator is required (no global RNG)")
    t = torch.randint(0, schedule.steps, (n,), generator=generator)
    noise = torch.randn((n, *shape.as_tuple()), generator=generator, dtype=dtype)
    return DiffusionDraw(t, noise)


def pack(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One model input per record: ``[x.flatten(), t, y]``, ``(n, C·H·W + 2)`` in ``x``'s dtype.

    ``t`` and ``y`` are small integers (exact in float32 up to 2²⁴).
    """
    n = x.shape[0]
    if t.shape != (n,) or y.shape != (n,):
        raise ValueError(f"pack: x {tuple(x.shape)}, t {tuple(t.shape)}, y {tuple(y.shape)}: need n = {n}")
    return torch.cat([x.flatten(1), t.to(x.dtype)[:, None], y.to(x.dtype)[:, None]], dim=1)


def mse_per_record(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mean((prediction − target)²)`` over all but the first axis, ``(n,)``."""
    return (prediction - target).square().flatten(1).mean(1)


@dataclass(frozen=True)
class DiffusionLoss:
    """Inputs and per-record losses of ``ℓ``, ``ℓ_priv`` and ``ℓ_pub`` (module docstring).

    Parameters
    ----------
    schedule : NoiseSchedule
    psi : PublicMap
        Ψ, e.g. :class:`~fedfdp.images.blur.GaussianBlur`; applied to images in [0, 1].
    num_classes : int
        ``K``; the "no class" index is ``K``.
    conditional : bool
        Whether the label is packed (then it is part of Ψ).
    """

    schedule: NoiseSchedule
    psi: PublicMap
    num_classes: int
    conditional: bool = True
    #: ``ᾱ_t`` of the schedule, computed once.
    _alpha_bars: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_classes < 1:
            raise ValueError(f"num_classes={self.num_classes}: must be >= 1")
        object.__setattr__(self, "_alpha_bars", self.schedule.alpha_bars())

    def noisy(self, x: torch.Tensor, draw: DiffusionDraw) -> torch.Tensor:
        """``x_t = √ᾱ_t (2x − 1) + √(1 − ᾱ_t) ε`` for images ``x`` in [0, 1]."""
        if x.shape != draw.noise.shape:
            raise ValueError(f"images {tuple(x.shape)} and noise {tuple(draw.noise.shape)} differ")
        ab = self._alpha_bars.to(x.device)[draw.t].to(x.dtype).view(-1, 1, 1, 1)
        return ab.sqrt() * (2 * x - 1) + (1 - ab).sqrt() * draw.noise.to(x.dtype)

    def _labels(self, y: torch.Tensor) -> torch.Tensor:
        if not self.conditional:
            return torch.full_like(y, self.num_classes)
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ValueError(f"labels in [{int(y.min())}, {int(y.max())}]; need 0..{self.num_classes - 1}")
        return y

    def full_inputs(self, x: torch.Tensor, y: torch.Tensor, draw: DiffusionDraw) -> list[torch.Tensor]:
        """``[pack(x_t, t, y)]`` for ``ℓ``."""
        return [pack(self.noisy(x, draw), draw.t, self._labels(y))]

    def public_inputs(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        draw: DiffusionDraw,
        generator: torch.Generator | None = None,
    ) -> list[torch.Tensor]:
        """``[pack(x̃_t, t, y)]`` for ``ℓ_pub``: built from Ψ(x), never from ``x`` itself."""
        return [pack(self.noisy(self.psi(x, generator), draw), draw.t, self._labels(y))]

    def public_inputs_from_view(
        self, view: torch.Tensor, y: torch.Tensor, draw: DiffusionDraw
    ) -> list[torch.Tensor]:
        """As :meth:`public_inputs`, from an already computed Ψ(x) (a client that holds only Ψ)."""
        return [pack(self.noisy(view, draw), draw.t, self._labels(y))]

    def private_inputs(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        draw: DiffusionDraw,
        generator: torch.Generator | None = None,
    ) -> list[torch.Tensor]:
        """``[pack(x_t), pack(x̃_t)]`` for ``ℓ_priv`` (same ``t`` and ``ε`` in both)."""
        return self.full_inputs(x, y, draw) + self.public_inputs(x, y, draw, generator)

    @staticmethod
    def full_loss(outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        """Per-record ``ℓ`` (input 0)."""
        return mse_per_record(outputs[0], targets)

    @staticmethod
    def public_loss(outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        """Per-record ``ℓ_pub`` (input 0 is the public input)."""
        return mse_per_record(outputs[0], targets)

    @staticmethod
    def private_loss(outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        """Per-record ``ℓ_priv = ℓ − ℓ_pub`` (inputs 0 and 1)."""
        return mse_per_record(outputs[0], targets) - mse_per_record(outputs[1], targets)


def record_draws(
    generators: Sequence[torch.Generator], shape: ImageShape, schedule: NoiseSchedule, like: torch.Tensor
) -> DiffusionDraw:
    """One draw ``(t, ε)`` per record, record ``i``'s from ``generators[i]`` (on the CPU),
    moved to the device and dtype of ``like``.
    """
    per_record = [draw_noise(1, shape, schedule, g, like.dtype) for g in generators]
    if not per_record:
        return DiffusionDraw(torch.empty(0, dtype=torch.long, device=like.device),
                             like.new_empty((0, *shape.as_tuple())))
    return DiffusionDraw(torch.cat([d.t for d in per_record]).to(like.device),
                         torch.cat([d.noise for d in per_record]).to(like.device))


def diffusion_terms(
    loss: DiffusionLoss,
    part: LossPart,
    x: torch.Tensor,
    y: torch.Tensor,
    generators: Sequence[torch.Generator],
) -> LossTerms:
    """The inputs, targets (the noise ``ε``) and per-record loss of ``part`` on the batch
    ``(x, y)``; record ``i`` draws ``(t, ε)``, then whatever Ψ draws, from ``generators[i]``.

    ``full``: ``[pack(x_t)]`` and ``ℓ``; ``private``: ``[pack(x_t), pack(x̃_t)]`` and
    ``ℓ_priv = ℓ − ℓ_pub``; ``public``: ``[pack(x̃_t)]`` and ``ℓ_pub``, built from Ψ(x) only.
    """
    if len(generators) != len(x):
        raise ValueError(f"{len(generators)} generators for {len(x)} records: need one per record")
    draw = record_draws(generators, ImageShape(*x.shape[1:]), loss.schedule, x)
    if part == LossPart.FULL:
        return LossTerms(loss.full_inputs(x, y, draw), draw.noise, loss.full_loss)
    public = loss.public_inputs_from_view(apply_view(loss.psi, x, generators), y, draw)
    if part == LossPart.PRIVATE:
        return LossTerms(loss.full_inputs(x, y, draw) + public, draw.noise, loss.private_loss)
    if part == LossPart.PUBLIC:
        return LossTerms(public, draw.noise, loss.public_loss)
    raise ValueError(f"part={part!r}: must be one of {', '.join(LossPart)}")


@dataclass(frozen=True)
class DiffusionFeatureMap(FeatureMap):
    """The diffusion loss split as the feature map of a run (``model = "ddpm"``).

    ``view`` is Ψ (the blur; the label is public when the loss is conditional) and
    ``loss`` the :class:`DiffusionLoss` over it. :meth:`terms` gives ``ℓ``, ``ℓ_priv``
    and ``ℓ_pub`` (:func:`diffusion_terms`) with each record's draw ``(t, ε)`` from its
    own public stream, keyed by ``(seed, round, part, device, index)``
    (:class:`fedfdp.losses.RecordKeys`): a record's draw does not depend on the batch
    it is in, so for every value of the draws each record's clipped private gradient
    has norm ``≤ C`` and adding or removing a record changes the clipped sum by that
    record's term only — a step stays a Poisson-subsampled Gaussian mechanism of
    sensitivity ``C`` under add/remove (Def. 6, Theorem 5). The draws are public:
    the guarantee holds conditionally on them; the secrets are the coins and the noise.

    The classifier's methods (:meth:`private_inputs`, :meth:`private_loss`, ...) do
    not apply: the targets are the noise, not the labels; they are refused.
    """

    loss: DiffusionLoss | None = None
    classifier: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss is None:
            raise ValueError("DiffusionFeatureMap: give the diffusion loss")
        if self.view is None or self.view is not self.loss.psi:
            raise ValueError("DiffusionFeatureMap: view must be the diffusion loss's Ψ (loss.psi)")

    def terms(
        self,
        part: LossPart,
        x: torch.Tensor,
        y: torch.Tensor,
        generator: torch.Generator | None,
        keys: RecordKeys | None = None,
    ) -> LossTerms:
        """``ℓ``, ``ℓ_priv`` or ``ℓ_pub`` on ``(x, y)`` (class docstring); ``keys``, each
        row's public identity, are required (``generator`` is not used: no draw comes
        from a stream shared along the batch).
        """
        del generator
        if keys is None or len(keys) != len(x):
            got = "none" if keys is None else len(keys)
            raise ValueError(f"diffusion loss: {got} record keys for {len(x)} records; each record's "
                             "(t, ε) comes from its own public stream (pass the batch's RecordKeys)")
        if self.loss is None:  # refused in __post_init__
            raise RuntimeError("DiffusionFeatureMap without a loss")
        return diffusion_terms(self.loss, part, x, y, keys.generators(part))

    def _refuse(self, *_: object) -> list[torch.Tensor]:
        raise ValueError("DiffusionFeatureMap: the diffusion loss's inputs and targets come from "
                         "terms(part, x, y, generator, keys), not from the classifier's methods")

    private_inputs = _refuse  # type: ignore[assignment]
    public_inputs = _refuse  # type: ignore[assignment]
    private_loss = _refuse  # type: ignore[assignment]
    public_loss = _refuse  # type: ignore[assignment]


def diffusion_feature_map(psi: PublicMap, num_classes: int, steps: int = 1000) -> DiffusionFeatureMap:
    """The feature map of ``model = "ddpm"``: the class-conditional diffusion loss of a
    ``steps``-step linear schedule over Ψ = ``psi`` (``diffusion-steps``).
    """
    return DiffusionFeatureMap(view=psi, loss=DiffusionLoss(NoiseSchedule(steps), psi, num_classes))


@torch.no_grad()
def sample(
    model: nn.Module,
    schedule: NoiseSchedule,
    labels: torch.Tensor,
    shape: ImageShape,
    generator: torch.Generator,
    *,
    steps: int | None = None,
    batch_size: int = 256,
) -> torch.Tensor:
    """Ancestral sampling (DDPM), optionally on a respaced subsequence of timesteps.

    Parameters
    ----------
    model : nn.Module
        Noise predictor on packed inputs (:class:`~fedfdp.images.unet.UNet`);
        run in eval mode, its training flag restored afterwards.
    labels : torch.Tensor
        ``(n,)`` class per sample (``K`` for no class).
    steps : int, optional
        Number of denoising steps; fewer than ``T`` respaces the schedule to
        ``steps`` evenly spaced timesteps (``β'_k = 1 − ᾱ_{s_k}/ᾱ_{s_{k−1}}``,
        Nichol & Dhariwal 2021). Default ``T``.
    batch_size : int
        Samples per forward pass.

    Returns
    -------
    torch.Tensor
        ``(n, C, H, W)`` images in [0, 1] (float32). The predicted ``x₀`` is
        clipped to [−1, 1] at every step.
    """
    if not isinstance(generator, torch.Generator):
        raise ValueError("sample: an explicit torch.Generator is required (no global RNG)")
    total = schedule.steps
    steps = total if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= total:
        raise ValueError(f"sample steps={steps!r}: must be an integer in [1, {total}]")
    timesteps = torch.unique(torch.linspace(0, total - 1, steps, dtype=torch.float64).round().long())
    alpha_bars = schedule.alpha_bars()[timesteps]
    prev = torch.cat([torch.ones(1, dtype=torch.float64), alpha_bars[:-1]])
    params = list(model.parameters())
    dtype = params[0].dtype if params else torch.float32
    device = params[0].device if params else torch.device("cpu")
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, labels.shape[0], batch_size):
            y = labels[start : start + batch_size].to(device)
            n = y.shape[0]
            x = torch.randn((n, *shape.as_tuple()), generator=generator, dtype=dtype).to(device)
            for k in reversed(range(len(timesteps))):
                ab, ab_prev = float(alpha_bars[k]), float(prev[k])
                beta = 1 - ab / ab_prev
                t = torch.full((n,), int(timesteps[k]), device=device)
                eps = model(pack(x, t, y))
                x0 = ((x - math.sqrt(1 - ab) * eps) / math.sqrt(ab)).clamp(-1, 1)
                mean = (math.sqrt(ab_prev) * beta / (1 - ab)) * x0 + (
                    math.sqrt(1 - beta) * (1 - ab_prev) / (1 - ab)
                ) * x
                if k > 0:
                    var = beta * (1 - ab_prev) / (1 - ab)
                    z = torch.randn(x.shape, generator=generator, dtype=dtype).to(device)
                    x = mean + math.sqrt(var) * z
                else:
                    x = mean
            out.append(((x.clamp(-1, 1) + 1) / 2).float().cpu())
    finally:
        model.train(was_training)
    if not out:
        return torch.empty((0, *shape.as_tuple()))
    return torch.cat(out)
