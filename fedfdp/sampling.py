"""Samplers on independent, explicitly seeded generator streams.

Every random choice in fedfdp comes from a generator derived from one run seed
with :class:`numpy.random.SeedSequence` (``spawn_key`` paths), never from a
global RNG. The streams are separate by construction:

=====================  =====================================================
stream                 used for
=====================  =====================================================
``private-sampling``   the Poisson private batch of a device in a round
``public-sampling``    the uniform public batch of a device in a round
``private-padding``    Gaussian padding of the views inside ``ℓ_priv``
``public-padding``     Gaussian padding of the public batch's views
``noise``              the server's Gaussian noise
``server-sampling``    public-batch allocation over devices, client choice
=====================  =====================================================

Prop. 3 of the FDP paper is why the private and public batches must not share
randomness: if the public batch reveals the Poisson coins, subsampling no
longer amplifies privacy. Here the two batches are drawn from generators whose
seeds differ in their spawn key, so they are statistically independent. Padding draws are split the same way:
if the public views were padded from the stream the private views consumed,
the released public gradient would depend on the realised private batch size.

The seed is part of the secret state of the mechanism: anyone who knows it can
recompute the batches and the noise. For deployments use ``seed = -1``
semantics at the application level (fresh OS entropy) or keep the seed as
secret as a key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_CLIENT, _SERVER = 0, 1
_PRIVATE, _PUBLIC, _PRIVATE_PADDING, _PUBLIC_PADDING = 0, 1, 2, 3
_NOISE, _SERVER_SAMPLING = 0, 1


def _sequence(seed: int, *path: int) -> np.random.SeedSequence:
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0")
    return np.random.SeedSequence(entropy=seed, spawn_key=tuple(path))


def _torch_generator(seq: np.random.SeedSequence) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
    return gen


@dataclass
class DeviceStreams:
    """Generators one device uses in one round."""

    private: np.random.Generator
    public: np.random.Generator
    private_padding: torch.Generator
    public_padding: torch.Generator

    @classmethod
    def for_round(cls, seed: int, round_: int, device: int, attempt: int = 0) -> DeviceStreams:
        """Streams of ``device`` in round ``round_`` under run seed ``seed``.

        ``attempt > 0`` (a round re-run after a crash) gives fresh, independent
        streams: batches are never reused across two releases.
        """

        def seq(kind: int) -> np.random.SeedSequence:
            extra = (attempt,) if attempt else ()
            return _sequence(seed, _CLIENT, round_, device, kind, *extra)

        return cls(
            private=np.random.default_rng(seq(_PRIVATE)),
            public=np.random.default_rng(seq(_PUBLIC)),
            private_padding=_torch_generator(seq(_PRIVATE_PADDING)),
            public_padding=_torch_generator(seq(_PUBLIC_PADDING)),
        )


@dataclass
class ServerStreams:
    """Generators the server uses in one round."""

    noise: torch.Generator
    sampling: np.random.Generator

    @classmethod
    def for_round(cls, seed: int, round_: int, attempt: int = 0) -> ServerStreams:
        """Streams of the server in round ``round_`` (``attempt > 0``: fresh
        noise for a round re-run after a crash — noise is never reused)."""
        extra = (attempt,) if attempt else ()
        return cls(
            noise=_torch_generator(_sequence(seed, _SERVER, round_, _NOISE, *extra)),
            sampling=np.random.default_rng(_sequence(seed, _SERVER, round_, _SERVER_SAMPLING, *extra)),
        )


def poisson_sample(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a Poisson sample: each of ``n`` records joins independently
    with probability ``rate``. The realised size varies and may be 0.

    This is the sampling that Theorem 5 (amplification by subsampling) assumes.
    """
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    if not 0 < rate <= 1:
        raise ValueError(f"sampling-rate={rate}: must be in (0, 1]")
    return np.flatnonzero(rng.random(n) < rate)


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
