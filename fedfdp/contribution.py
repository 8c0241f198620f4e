"""A device's contribution to one round of Algorithm 1 (the client-side half).

For its own records a device computes

* ``private_sum``: Σ over its Poisson private batch of per-record gradients of
  the private loss, each clipped to ``C`` (Algorithm 1 steps 3-4, Remark 1).
  Sensitivity ``C`` per record (add/remove); no noise here — the server adds it
  once to the sum over devices.
* ``public_sum``: Σ over a uniform public batch, drawn from an independent
  stream (Prop. 3), of unclipped gradients of ``ℓ_pub`` on public views
  (steps 5-6). Public information: it depends on Ψ(x) and public labels only.

The realised private batch size and any statistic of the private batch stay on
the device. The sum over devices equals the same computation on the union of
their batches (tested against :mod:`fedfdp.algorithm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedfdp import faults
from fedfdp.clipping import clipped_grad_sum
from fedfdp.losses import LossDecomposition, cross_entropy
from fedfdp.modes import Phase
from fedfdp.sampling import DeviceStreams, poisson_sample, uniform_sample


@dataclass
class Contribution:
    """What a device sends for one round.

    Attributes
    ----------
    private_sum : list of Tensor or None
        Sum of clipped private per-record gradients (None if the phase has no
        private part). Zeros for an empty Poisson batch — still sent, so the
        server cannot tell an empty batch from a full one.
    public_sum : list of Tensor or None
        Sum of unclipped public gradients (None if the phase has no public part).
    public_count : int
        Records in the public batch.
    public_loss_sum : float
        Sum of ``ℓ_pub`` over the public batch.
    """

    private_sum: list[torch.Tensor] | None
    public_sum: list[torch.Tensor] | None
    public_count: int
    public_loss_sum: float


def trainable(model: nn.Module) -> list[torch.Tensor]:
    """The parameters a round updates, in a fixed order."""
    return [p for p in model.parameters() if p.requires_grad]


def clip_vector(tensors: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """Scale the tensor list, seen as one vector, to L2 norm at most ``max_norm``."""
    norm = torch.sqrt(sum((t.double() ** 2).sum() for t in tensors)) if tensors else torch.tensor(0.0)
    factor = min(1.0, max_norm / float(norm)) if float(norm) > 0 else 1.0
    return [t * factor for t in tensors]


def private_batch_sum(
    model: nn.Module,
    decomposition: LossDecomposition,
    phase: Phase,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clipping_norm: float,
    padding: torch.Generator,
    clip_method: str = "auto",
    per_record_clip: bool = True,
) -> list[torch.Tensor]:
    """Σ of per-record private-loss gradients over the batch ``(x, y)``, each
    clipped to ``clipping_norm`` when the phase clips (and ``per_record_clip``)."""
    if phase.private_loss == "private":
        inputs = decomposition.private_inputs(x, padding)
        loss_fn = decomposition.private_loss
    elif phase.private_loss == "full":
        inputs, loss_fn = [x], cross_entropy
    else:
        raise ValueError(f"phase {phase.name!r} has no private part")
    clip = clipping_norm if phase.clip and per_record_clip and not faults.active("no-clip") else None
    result = clipped_grad_sum(model, inputs, y, loss_fn, clip, method=clip_method)
    return result.grads


def public_batch_sum(
    model: nn.Module,
    decomposition: LossDecomposition,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    padding: torch.Generator,
) -> tuple[list[torch.Tensor], float]:
    """Σ of unclipped public-loss gradients over ``(x, y)`` and the loss sum."""
    params = trainable(model)
    if len(y) == 0:
        return [torch.zeros_like(p) for p in params], 0.0
    inputs = decomposition.public_inputs(x, padding)
    losses = decomposition.public_loss([model(inp) for inp in inputs], y)
    total = losses.sum()
    grads = torch.autograd.grad(total, params)
    return [g.detach() for g in grads], float(total.detach())


def device_contribution(
    model: nn.Module,
    decomposition: LossDecomposition,
    phase: Phase,
    x: np.ndarray,
    y: np.ndarray,
    *,
    sampling_rate: float,
    clipping_norm: float,
    public_count: int,
    streams: DeviceStreams,
    clip_method: str = "auto",
    private: bool = True,
    unit: str = "record",
) -> Contribution:
    """One device's contribution to a round (see the module docstring).

    Parameters
    ----------
    x, y : np.ndarray
        The device's training records.
    sampling_rate : float
        ``q`` of the Poisson private batch.
    public_count : int
        Size of this device's share of the uniform public batch (allocated by
        the server from public device sizes).
    streams : DeviceStreams
        Independent generators for the private sample, the public sample and
        the two padding draws.
    private : bool
        Whether the device was drawn for the private part this round (Poisson
        device sampling); if not, its private part is a zero vector.
    unit : str
        ``record``: each record's gradient is clipped to ``C`` (sensitivity
        ``C`` per record). ``device``: the mean private gradient over the
        device's Poisson batch is clipped to ``C`` as one vector (sensitivity
        ``C`` per device — the device's whole private contribution).
    """
    if unit not in ("record", "device"):
        raise ValueError(f"privacy-unit={unit!r}: must be record or device")
    n = len(y)
    xt = torch.as_tensor(x)
    yt = torch.as_tensor(y, dtype=torch.long)
    private_sum = public_sum = None
    public_loss_sum = 0.0
    private_idx = np.empty(0, dtype=np.int64)
    if phase.has_private and not private:
        private_sum = [torch.zeros_like(p) for p in trainable(model)]
    elif phase.has_private and unit == "device":
        private_idx = poisson_sample(n, sampling_rate, streams.private)
        idx = torch.as_tensor(private_idx)
        unclipped = private_batch_sum(
            model, decomposition, phase, xt[idx], yt[idx], clipping_norm=clipping_norm,
            padding=streams.private_padding, clip_method=clip_method, per_record_clip=False,
        )
        mean = [g / max(len(private_idx), 1) for g in unclipped]
        private_sum = clip_vector(mean, clipping_norm) if phase.clip else mean
    elif phase.has_private:
        private_idx = poisson_sample(n, sampling_rate, streams.private)
        idx = torch.as_tensor(private_idx)
        private_sum = private_batch_sum(
            model, decomposition, phase, xt[idx], yt[idx],
            clipping_norm=clipping_norm, padding=streams.private_padding,
            clip_method=clip_method,
        )
        if faults.active("realized-normalization"):
            # planted bug: the sum is rescaled so that the server's division by
            # q·n yields the mean over the *realised* batch
            scale = sampling_rate * n / max(len(private_idx), 1)
            private_sum = [g * scale for g in private_sum]
    if not phase.public:
        return Contribution(private_sum, None, 0, 0.0)
    if faults.active("shared-batch") and phase.has_private:
        public_idx = private_idx  # planted bug: the public batch reuses the Poisson sample
    else:
        public_idx = uniform_sample(n, public_count, streams.public)
    idx = torch.as_tensor(public_idx)
    public_sum, public_loss_sum = public_batch_sum(
        model, decomposition, xt[idx], yt[idx], padding=streams.public_padding
    )
    return Contribution(private_sum, public_sum, len(public_idx), public_loss_sum)


def add_contributions(parts: list[Contribution]) -> Contribution:
    """Sum several devices' contributions (what one Flower client sends for all
    the devices it serves)."""
    if not parts:
        raise ValueError("no contributions to add")

    def _sum(tensors: list[list[torch.Tensor] | None]) -> list[torch.Tensor] | None:
        present = [t for t in tensors if t is not None]
        if not present:
            return None
        return [torch.stack(ts).sum(0) for ts in zip(*present, strict=True)]

    return Contribution(
        private_sum=_sum([p.private_sum for p in parts]),
        public_sum=_sum([p.public_sum for p in parts]),
        public_count=sum(p.public_count for p in parts),
        public_loss_sum=sum(p.public_loss_sum for p in parts),
    )
