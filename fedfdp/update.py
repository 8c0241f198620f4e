"""The server-side half of one round of Algorithm 1: noise, normalise, step.

Given the devices' contributions, the server

1. sums the private parts and adds ``N(0, σ²C²·I)`` **once** to that sum
   (:class:`fedfdp.mechanisms.GaussianSumMechanism`; sensitivity ``C``,
   add/remove), drawn from the server's secret stream;
2. divides it by the sampling plan's normaliser, the **expected** private
   batch size (``q·N`` in the plain case, :mod:`fedfdp.sampling_plan`) — never
   by the realised size, which is private (dividing by it is a known bug the
   audit looks for);
3. adds the mean public gradient ``Σ S_pub / Σ n_pub`` (public, unnoised);
4. weights the private part by ``α`` in ``fdp`` rounds (clipping biases the
   ratio between the two parts, Section 6.2) — other phases use weight 1;
5. takes an optimizer step (SGD with momentum by default).

Steps 1-2 are the only ones that touch private data, and they are
post-processed by 3-5, so each round is one Poisson-subsampled Gaussian
mechanism (Theorem 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedfdp.config import Optimizer
from fedfdp.entropy import BitStream
from fedfdp.mechanisms import SumMechanism
from fedfdp.modes import Phase


@dataclass(frozen=True)
class RoundNoise:
    """The noise of a private round: the mechanism and the secret stream it draws from."""

    mechanism: SumMechanism
    stream: BitStream


def combine_gradient(
    phase: Phase,
    private_sums: Sequence[Sequence[torch.Tensor]],
    public_sums: Sequence[Sequence[torch.Tensor]],
    public_count: int,
    *,
    shapes: Sequence[torch.Size],
    expected_batch_size: float,
    alpha: float,
    noise: RoundNoise | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Build the round's update direction ``g = g_pub + α·g̃_priv``.

    Parameters
    ----------
    private_sums, public_sums
        Per-reply tensor lists (already validated).
    public_count : int
        Total public records over the replies.
    shapes
        Parameter shapes (zeros are used when nothing arrived).
    expected_batch_size : float
        The sampling plan's normaliser (data-independent).
    noise : RoundNoise or None
        Required when ``phase.noise``.

    Returns
    -------
    gradient, noisy_private_sum
        The direction and the released private sum (None without private part).
    """
    grad = [torch.zeros(s) for s in shapes]
    released = None
    if phase.has_private:
        if expected_batch_size <= 0:
            raise ValueError(f"expected batch size {expected_batch_size}: must be > 0")
        total = [torch.zeros(s) for s in shapes]
        for parts in private_sums:
            total = [t + p for t, p in zip(total, parts, strict=True)]
        if phase.noise:
            if noise is None:
                raise ValueError(f"phase {phase.name!r} needs noise parameters")
            total = noise.mechanism.privatize(total, noise.stream)
        released = total
        weight = alpha if phase.public else 1.0
        grad = [g + weight * t / expected_batch_size for g, t in zip(grad, total, strict=True)]
    if phase.public and public_count > 0:
        total = [torch.zeros(s) for s in shapes]
        for parts in public_sums:
            total = [t + p for t, p in zip(total, parts, strict=True)]
        grad = [g + t / public_count for g, t in zip(grad, total, strict=True)]
    return grad, released


def build_optimizer(
    params: Sequence[nn.Parameter], name: str, learning_rate: float, momentum: float
) -> torch.optim.Optimizer:
    """The server optimizer; ``sgd`` (with momentum) is the paper's choice."""
    if name == Optimizer.SGD:
        return torch.optim.SGD(params, lr=learning_rate, momentum=momentum)
    if name == Optimizer.ADAM:
        return torch.optim.Adam(params, lr=learning_rate)
    raise ValueError(f"optimizer={name!r}: must be sgd or adam")


def apply_gradient(
    params: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer, grad: Sequence[torch.Tensor]
) -> None:
    """One optimizer step along ``grad`` (post-processing: no privacy cost), on each
    parameter's device (``grad`` is built on the CPU).
    """
    for p, g in zip(params, grad, strict=True):
        p.grad = g.detach().to(device=p.device, dtype=p.dtype).clone()
    optimizer.step()
    for p in params:
        p.grad = None
