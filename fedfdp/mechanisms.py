"""The Gaussian mechanism on a sum of clipped per-record gradients.

Sensitivity: each record contributes one gradient clipped to L2 norm ``C``, so
adding or removing a record (Def. 6 of the FDP paper, through the simulator of
Algorithm 2) or replacing its private features (Def. 5) moves the sum by at most
``C`` (``2C`` for unrestricted replacement in plain DP; the FDP replacement
number is derived from add/remove by Prop. 1 in :mod:`fedfdp.accounting`).
Adding ``N(0, σ²C²·I)`` once to the sum makes one step a Gaussian mechanism
with noise multiplier ``σ``; with Poisson sampling at rate ``q`` it is the
subsampled Gaussian of Theorem 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def gaussian_noise_like(
    tensors: Sequence[torch.Tensor], std: float, generator: torch.Generator
) -> list[torch.Tensor]:
    """Independent ``N(0, std²)`` draws shaped like ``tensors``, from ``generator``.

    Drawn in float64 and cast, so the draw does not depend on the model dtype's
    RNG path.
    """
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"noise std={std}: must be finite and >= 0")
    out = []
    for t in tensors:
        draw = torch.randn(t.shape, generator=generator, dtype=torch.float64)
        out.append((draw * std).to(dtype=t.dtype))
    return out


@dataclass(frozen=True)
class GaussianSumMechanism:
    """Adds ``N(0, σ²C²·I)`` to a sum of per-record gradients clipped to ``C``.

    Parameters
    ----------
    noise_multiplier : float
        σ > 0.
    clipping_norm : float
        C > 0, the L2 sensitivity of the sum under add/remove.
    """

    noise_multiplier: float
    clipping_norm: float

    def __post_init__(self) -> None:
        for name, value in (
            ("noise-multiplier", self.noise_multiplier),
            ("clipping-norm", self.clipping_norm),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value}: must be finite and > 0")

    @property
    def std(self) -> float:
        """Per-coordinate noise standard deviation ``σ·C``."""
        return self.noise_multiplier * self.clipping_norm

    def privatize(
        self, clipped_sum: Sequence[torch.Tensor], generator: torch.Generator
    ) -> list[torch.Tensor]:
        """Return ``clipped_sum + N(0, σ²C²·I)``, noise drawn once from ``generator``."""
        noise = gaussian_noise_like(clipped_sum, self.std, generator)
        return [s + z for s, z in zip(clipped_sum, noise, strict=True)]
