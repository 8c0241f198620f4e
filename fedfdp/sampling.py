"""Samplers, and the public streams that derive from the run seed.

Two kinds of randomness (:mod:`fedfdp.entropy`): *secret* streams (noise,
device draws of the device unit, Poisson coins, private padding) come from the
party's :class:`~fedfdp.entropy.SecretSource`; *public* streams derive from the
run ``seed`` with :class:`numpy.random.SeedSequence` spawn keys and may be known
to anyone:

=====================  =====================================================
public stream          used for
=====================  =====================================================
``public-sampling``    the uniform public batch of a device in a round
``public-padding``     Gaussian padding of the public batch's views
``server-sampling``    public-batch allocation over devices, node choice,
                       the device unit's public device sample
=====================  =====================================================

Prop. 3 of the FDP paper is why the private and public batches must not share
randomness: if the public batch reveals the Poisson coins, subsampling no
longer amplifies privacy. Here they cannot: the coins come from secret entropy
and the public batch from the seed. Padding draws are split the same way: if
the public views were padded from the stream the private views consumed, the
released public gradient would depend on the realised private batch size.
"""

from __future__ import annotations

import numpy as np
import torch

from fedfdp.entropy import BitStream, uniforms

_CLIENT, _SERVER = 0, 1
_PUBLIC, _PUBLIC_PADDING = 1, 3
_SERVER_SAMPLING = 1


def _sequence(seed: int, *path: int) -> np.random.SeedSequence:
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0")
    return np.random.SeedSequence(entropy=seed, spawn_key=tuple(path))


def _torch_generator(seq: np.random.SeedSequence) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
    return gen


class PublicStreams:
    """Public generators one device uses in one round (derived from the run seed).

    Each generator is derived on first use (the same generator whenever it is
    derived): a device with no public records in a round costs nothing.
    """

    __slots__ = ("_key", "_padding", "_sample")

    def __init__(self, sample: np.random.Generator | None = None, padding: torch.Generator | None = None,
                 *, key: tuple[int, int, int] | None = None) -> None:
        if key is None and (sample is None or padding is None):
            raise ValueError("PublicStreams: give both generators, or the (seed, round, device) key")
        self._sample, self._padding, self._key = sample, padding, key

    def _derivation_key(self) -> tuple[int, int, int]:
        if self._key is None:  # __init__ refuses a missing generator without a key
            raise RuntimeError("PublicStreams: no (seed, round, device) key to derive a stream from")
        return self._key

    @property
    def sample(self) -> np.random.Generator:
        """The uniform public batch's stream."""
        if self._sample is None:
            seed, round_, device = self._derivation_key()
            self._sample = np.random.default_rng(_sequence(seed, _CLIENT, round_, device, _PUBLIC))
        return self._sample

    @property
    def padding(self) -> torch.Generator:
        """The Gaussian padding of the public batch's views."""
        if self._padding is None:
            seed, round_, device = self._derivation_key()
            self._padding = _torch_generator(_sequence(seed, _CLIENT, round_, device, _PUBLIC_PADDING))
        return self._padding

    @classmethod
    def for_device(cls, seed: int, round_: int, device: int) -> PublicStreams:
        """Streams of ``device`` in round ``round_`` under run seed ``seed``."""
        if seed < 0:
            raise ValueError(f"seed={seed}: must be >= 0")
        return cls(key=(seed, round_, device))


def server_public_rng(seed: int, round_: int) -> np.random.Generator:
    """The server's public stream of a round: public-batch allocation, node
    choice, the device unit's public device sample.
    """
    return np.random.default_rng(_sequence(seed, _SERVER, round_, _SERVER_SAMPLING))


def poisson_coins(n: int, rate: float, coins: BitStream) -> np.ndarray:
    """``n`` independent Bernoulli(``rate``) draws (bool) from a secret stream.

    This is the sampling that Theorem 5 (amplification by subsampling) assumes;
    ``rate = 1`` includes everything.
    """
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    if not 0 < rate <= 1:
        raise ValueError(f"sampling-rate={rate}: must be in (0, 1]")
    return uniforms(coins, n) < rate


def poisson_sample(n: int, rate: float, coins: BitStream) -> np.ndarray:
    """Indices of a Poisson sample: each of ``n`` records joins independently
    with probability ``rate`` (:func:`poisson_coins`). The realised size varies
    and may be 0.
    """
    return np.flatnonzero(poisson_coins(n, rate, coins))


def uniform_sample(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct indices out of ``n``, uniformly (without replacement)."""
    if not 0 <= size <= n:
        raise ValueError(f"public batch size {size}: must be in [0, {n}]")
    return np.sort(rng.choice(n, size=size, replace=False))


def allocate_public_batch(sizes: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Split a uniform public batch of ``size`` over devices with ``sizes`` records.

    Drawing the per-device counts from the multivariate hypergeometric
    distribution and then ``count`` records uniformly within each device gives
    exactly a uniform ``size``-subset of the union of all records. Uses only
    public information (dataset sizes).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if (sizes < 0).any():
        raise ValueError(f"device sizes {sizes.tolist()}: must be >= 0")
    total = int(sizes.sum())
    if not 0 <= size <= total:
        raise ValueError(f"public-batch-size={size}: must be in [0, {total}] (records available)")
    if size == 0 or len(sizes) == 0:
        return np.zeros(len(sizes), dtype=np.int64)
    return rng.multivariate_hypergeometric(sizes, size, method="marginals").astype(np.int64)
