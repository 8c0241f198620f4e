"""Where random bits come from: secret entropy, and the reproducible opt-in.

fedfdp draws two kinds of randomness (``docs/architecture.md``, DESIGN.md §3):

*public* randomness
    model initialisation, the public batch, its allocation over devices, the
    choice of nodes, synthetic data. Knowing it reveals nothing about private
    features, so it derives from the run ``seed`` (:mod:`fedfdp.sampling`).
*secret* randomness
    the server's Gaussian noise, the server's draw of devices for the device
    unit, every device's Poisson coins and the Gaussian padding inside
    ``ℓ_priv``. Whoever can predict it can undo the mechanism: knowing the
    noise turns a released update into the noiseless clipped sum (with SGD and
    momentum the final model's noise is a known linear combination of the
    per-round draws), and knowing a device's coins removes the amplification
    by subsampling. Secret bits therefore come from :class:`SystemEntropy`:
    the operating system's CSPRNG (``os.urandom``: Linux ``getrandom``), read
    afresh for every draw by the party that draws, never derived from the
    configuration, never stored, never sent.

:class:`SeededEntropy` is the one exception, for equivalence tests and
published tables that must be re-runnable: every secret stream derives from
``(seed, purpose, round, ...)``. It is chosen only by the configuration key
``reproducible-noise = true``; the guarantee then holds only against parties
who do not know the seed, and every output says so
(:data:`REPRODUCIBLE_WARNING`). Deployments refuse it.

Each party holds one :class:`SecretSource` and asks it for bit streams by
purpose: :meth:`SecretSource.noise`, :meth:`SecretSource.device_draw` (server)
and :meth:`SecretSource.device` (client). A :class:`BitStream` yields raw
64-bit words; :func:`uniforms` and :func:`torch_generator` turn them into what
the samplers consume.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

#: Printed beside every output of a run whose secret randomness derives from the seed.
REPRODUCIBLE_WARNING = (
    "reproducible-noise=true: the noise and the private batches derive from the run seed; "
    "the privacy guarantee holds only against parties who do not know the seed"
)

#: ``noise_source`` column of metrics.csv and results.csv.
NOISE_SOURCE_SECRET = "os-csprng"
NOISE_SOURCE_SEEDED = "run seed (reproducible-noise): guarantee only against parties who do not know the seed"

# purposes of the seeded streams (spawn-key paths); the public streams of
# fedfdp.sampling use another root, so no secret stream equals a public one
_SECRET_ROOT = 0x5EC
_NOISE, _DEVICE_DRAW, _DEVICE_COINS, _DEVICE_PADDING = 0, 1, 2, 3


class BitStream(Protocol):
    """A source of independent, uniformly distributed 64-bit words."""

    def words(self, n: int) -> np.ndarray:
        """``n`` words as a ``uint64`` array."""
        ...


class OSBits:
    """Words from the operating system's CSPRNG (``os.urandom``), read on demand."""

    def words(self, n: int) -> np.ndarray:
        if n < 0:
            raise ValueError(f"n={n}: must be >= 0")
        return np.frombuffer(os.urandom(8 * n), dtype="<u8").astype(np.uint64, copy=False)


class SeededBits:
    """Words from PCG64 seeded by a :class:`numpy.random.SeedSequence` (reproducible only)."""

    def __init__(self, seq: np.random.SeedSequence) -> None:
        self._bits = np.random.PCG64(seq)

    def words(self, n: int) -> np.ndarray:
        if n < 0:
            raise ValueError(f"n={n}: must be >= 0")
        return self._bits.random_raw(n).astype(np.uint64, copy=False)


def uniforms(stream: BitStream, n: int) -> np.ndarray:
    """``n`` uniform draws on the open interval (0, 1), 53 random bits each."""
    top = stream.words(n) >> np.uint64(11)
    return (top.astype(np.float64) + 0.5) * 2.0**-53


def torch_generator(stream: BitStream) -> torch.Generator:
    """A torch generator seeded with 63 bits of ``stream`` (for padding draws)."""
    gen = torch.Generator()
    gen.manual_seed(int(stream.words(1)[0] >> np.uint64(1)))
    return gen


@dataclass(frozen=True)
class DeviceSecrets:
    """One device's secret randomness in one round.

    Attributes
    ----------
    coins : BitStream
        The Poisson coins of the private batch.
    padding : torch.Generator
        Gaussian padding of the views inside ``ℓ_priv``.
    """

    coins: BitStream
    padding: torch.Generator


class SecretSource(Protocol):
    """What a party asks for secret randomness (see the module docstring)."""

    @property
    def reproducible(self) -> bool:
        """True when the streams derive from a seed (the opt-in mode)."""
        ...

    def noise(self, round_: int, attempt: int) -> BitStream:
        """The server's Gaussian noise of a round."""
        ...

    def device_draw(self, round_: int, attempt: int) -> BitStream:
        """The server's secret draw of devices in a round."""
        ...

    def device(self, round_: int, device: int, attempt: int) -> DeviceSecrets:
        """A device's Poisson coins and private padding in a round."""
        ...


class SystemEntropy:
    """Secret randomness from the OS CSPRNG: unpredictable, never reproducible.

    Every call reads fresh bits; the arguments only name the purpose.
    """

    reproducible = False

    def noise(self, round_: int, attempt: int) -> BitStream:
        return OSBits()

    def device_draw(self, round_: int, attempt: int) -> BitStream:
        return OSBits()

    def device(self, round_: int, device: int, attempt: int) -> DeviceSecrets:
        bits = OSBits()
        return DeviceSecrets(bits, torch_generator(bits))


class SeededEntropy:
    """Secret streams derived from ``seed`` (``reproducible-noise = true`` only).

    Streams for distinct ``(purpose, round, device, attempt)`` are independent
    (distinct :class:`~numpy.random.SeedSequence` spawn keys); an ``attempt``
    > 0 (a round re-run after a crash) gets fresh streams.
    """

    reproducible = True

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed={seed!r}: must be an integer >= 0")
        self.seed = int(seed)

    def _stream(self, *path: int) -> SeededBits:
        return SeededBits(np.random.SeedSequence(entropy=self.seed, spawn_key=(_SECRET_ROOT, *path)))

    def noise(self, round_: int, attempt: int) -> BitStream:
        return self._stream(_NOISE, round_, attempt)

    def device_draw(self, round_: int, attempt: int) -> BitStream:
        return self._stream(_DEVICE_DRAW, round_, attempt)

    def device(self, round_: int, device: int, attempt: int) -> DeviceSecrets:
        coins = self._stream(_DEVICE_COINS, round_, device, attempt)
        padding = torch_generator(self._stream(_DEVICE_PADDING, round_, device, attempt))
        return DeviceSecrets(coins, padding)


def secret_source(reproducible_seed: int | None) -> SecretSource:
    """:class:`SystemEntropy`, or :class:`SeededEntropy` for an explicit seed."""
    return SystemEntropy() if reproducible_seed is None else SeededEntropy(reproducible_seed)


def noise_source(reproducible: bool) -> str:
    """What a run's secret randomness derives from, as every output prints it
    (``reproducible``: ``reproducible-noise = true``).
    """
    return NOISE_SOURCE_SEEDED if reproducible else NOISE_SOURCE_SECRET
