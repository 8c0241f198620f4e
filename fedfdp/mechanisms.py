"""The Gaussian mechanism on a sum of clipped per-record gradients.

Sensitivity: each record contributes one gradient clipped to L2 norm ``C``, so
adding or removing a record (Def. 6 of the FDP paper, through the simulator of
Algorithm 2) or replacing its private features (Def. 5) moves the sum by at most
``C`` (``2C`` for unrestricted replacement in plain DP; the FDP replacement
number is derived from add/remove by Prop. 1 in :mod:`fedfdp.accounting`).
Adding ``N(0, σ²C²·I)`` once to the sum makes one step a Gaussian mechanism
with noise multiplier ``σ``; with Poisson sampling at rate ``q`` it is the
subsampled Gaussian of Theorem 5.

The sampler
-----------
:func:`gaussian_noise` draws the noise from a :class:`~fedfdp.entropy.BitStream`
(by default the OS CSPRNG, :class:`~fedfdp.entropy.SystemEntropy`), never from a
seeded Mersenne Twister. Against floating-point attacks on the noise
(Mironov 2012 for the Laplace mechanism; Holohan & Braghin 2021,
arXiv:2107.10138, for textbook Gaussian samplers, whose outputs occupy an
irregular, input-revealing subset of the floats) each coordinate is the
normalised sum of four independent Box–Muller normals computed from 53-bit
uniforms in float64, ``Z = (G₁ + G₂ + G₃ + G₄) / 2`` — the construction of
Holohan & Braghin §5.1, also used by Opacus' secure mode. ``Z`` is exactly
``N(0, 1)`` in real arithmetic; the sum fills the gaps that a single
Box–Muller draw leaves between representable outputs. The noisy sum
``S + σC·Z`` is formed in float64 and rounded once to the model's dtype.
This is a mitigation, not an exact-arithmetic guarantee: a discrete Gaussian
on a fixed grid (Canonne, Kamath & Steinke 2020) would be exact but is far
slower in Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedfdp.entropy import BitStream, uniforms

#: Box–Muller normals summed per output coordinate (Holohan & Braghin §5.1).
SUMMANDS = 4


def standard_normals(stream: BitStream, n: int) -> np.ndarray:
    """``n`` independent ``N(0, 1)`` draws (float64) from ``stream``, each the
    normalised sum of :data:`SUMMANDS` Box–Muller normals (module docstring).
    """
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    pairs = (SUMMANDS * n + 1) // 2
    u = uniforms(stream, 2 * pairs)
    radius = np.sqrt(-2.0 * np.log(u[:pairs]))
    angle = (2.0 * math.pi) * u[pairs:]
    draws = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[: SUMMANDS * n]
    return draws.reshape(SUMMANDS, n).sum(axis=0) / math.sqrt(SUMMANDS)


def gaussian_noise(shapes: Sequence[torch.Size], std: float, stream: BitStream) -> list[torch.Tensor]:
    """Independent ``N(0, std²)`` float64 draws shaped like ``shapes``, from ``stream``."""
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"noise std={std}: must be finite and >= 0")
    sizes = [math.prod(s) for s in shapes]
    flat = torch.from_numpy(standard_normals(stream, sum(sizes)) * std)
    return [part.reshape(s) for part, s in zip(torch.split(flat, sizes), shapes, strict=True)]


class SumMechanism(Protocol):
    """What the server's noise step needs of a mechanism: ``privatize(clipped_sum,
    stream)`` returns the noisy sum, its noise drawn from the secret ``stream``
    (:class:`GaussianSumMechanism`; CorrDP's per-block
    :class:`~fedfdp.corrdp.noise.CorrDPGaussianMechanism`).
    """

    def privatize(self, clipped_sum: Sequence[torch.Tensor], stream: BitStream) -> list[torch.Tensor]: ...


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

    def privatize(self, clipped_sum: Sequence[torch.Tensor], stream: BitStream) -> list[torch.Tensor]:
        """Return ``clipped_sum + N(0, σ²C²·I)``, the noise drawn once from ``stream``
        (float64 addition, one rounding to each tensor's dtype).
        """
        noise = gaussian_noise([t.shape for t in clipped_sum], self.std, stream)
        return [(s.double() + z).to(dtype=s.dtype) for s, z in zip(clipped_sum, noise, strict=True)]
