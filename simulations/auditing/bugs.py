"""Planted bugs: broken components for the audit to catch.

A privacy audit is only trustworthy if it demonstrably catches broken
mechanisms. Each bug here is **one** broken component, passed to the real
client and server code through the same seams a normal run uses
(:class:`fedfdp.contribution.ClientParts`, :class:`fedfdp.round_engine.ServerParts`);
nothing in the library reads a flag, and a normal run (``fedfdp run``,
``flwr run``) can never reach one.

=========================  =============  ==============================================
bug                        component      what breaks
=========================  =============  ==============================================
``shared-batch``           batch sampler  the public batch is filled from the private
                                          Poisson sample first (Prop. 3: the public
                                          gradient reveals the coins)
``no-clip``                aggregator     private per-record gradients are not clipped
``realized-normalization`` aggregator     each device rescales its private sum so that
                                          the server's division by ``q·n`` yields the
                                          mean over the *realised* batch
``low-noise``              mechanism      the server adds noise with ``σ/2`` (accounted
                                          as ``σ``)
``predictable-noise``      secret source  the server's noise derives from the run seed,
                                          which every client and reader of the
                                          configuration knows
``pq-accounting``          sampling plan  Poisson device sampling (record unit) is
                                          charged at rate ``p·q`` (device-mates reveal
                                          whether a device was drawn: not a bound)
``count-public-stream``    count          adaptive clipping's count is noised from the
                           mechanism      server's *public* stream of the round
                                          (:func:`fedfdp.sampling.server_public_rng`,
                                          which every reader of the configuration can
                                          replay); the gradient noise stays secret
``count-low-noise``        count          the count's noise has std ``σ_b/20`` (what
                           mechanism      ``σ_eff·√r`` in place of ``σ_eff/√r`` gives at
                                          the default share ``r = 0.05``) while the
                                          accountant is charged ``σ_eff``
=========================  =============  ==============================================

The count bugs enter through :attr:`fedfdp.round_engine.ServerParts.count_mechanism`, the
component that noises adaptive clipping's count in every adaptive run.

CorrDP (``mode = "corrdp"``, audited by :mod:`simulations.auditing.corrdp`):

=========================  =============  ==============================================
bug                        component      what breaks
=========================  =============  ==============================================
``tv-no-inflation``        mechanism      the insensitive noise is scaled by the raw
                                          in-sample estimate ``T̂V`` (Def. 3.10 without
                                          the inflation); the accountant is charged for
                                          the inflated ``TṼ``
``tv-underestimated``      mechanism      the insensitive noise is scaled by ``TṼ/4``
=========================  =============  ==============================================
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedfdp.config import Config, PrivacyUnit
from fedfdp.contribution import (
    ClientParts,
    PrivateBatch,
    PrivateSum,
    RoundSettings,
    clipped_private_sum,
    private_gradient_sum,
)
from fedfdp.corrdp.noise import corrdp_mechanism_factory
from fedfdp.corrdp.run import corrdp_setup
from fedfdp.corrdp.tv import TVEstimate
from fedfdp.entropy import BitStream, DeviceSecrets, SecretSource, SeededEntropy
from fedfdp.losses import FeatureMap
from fedfdp.mechanisms import GaussianSumMechanism
from fedfdp.round_engine import ServerParts
from fedfdp.run_plan import server_parts_for
from fedfdp.sampling import PublicStreams, poisson_sample, server_public_rng
from fedfdp.sampling_plan import SamplingPlan, Subsampling

if TYPE_CHECKING:
    from fedfdp.data import FederatedData


def shared_batch_sampler(
    n: int, rate: float, public_count: int, secrets: DeviceSecrets, public: PublicStreams
) -> tuple[np.ndarray, np.ndarray]:
    """Bug: the public batch (of the asked size) takes the private sample first,
    then other records in public-stream order.
    """
    private = poisson_sample(n, rate, secrets.coins)
    rest = public.sample.permutation(np.setdiff1d(np.arange(n), private))
    return private, np.sort(np.concatenate([private, rest])[:public_count])


def unclipped_private_sum(
    model: nn.Module,
    decomposition: FeatureMap,
    settings: RoundSettings,
    batches: Sequence[PrivateBatch],
) -> PrivateSum:
    """Bug: the private sum without clipping."""
    return PrivateSum(private_gradient_sum(model, decomposition, settings.phase, batches, None,
                                           settings.clip_method))


def realised_normalisation_sum(
    model: nn.Module,
    decomposition: FeatureMap,
    settings: RoundSettings,
    batches: Sequence[PrivateBatch],
) -> PrivateSum:
    """Bug: each device's clipped sum scaled by ``q·n/|B|`` (the server then
    divides by ``q·n``: the mean over the realised batch).
    """
    total = clipped_private_sum(model, decomposition, settings, [])
    for batch in batches:
        part = clipped_private_sum(model, decomposition, settings, [batch])
        scale = settings.sampling_rate * batch.device_size / max(len(batch.y), 1)
        total = PrivateSum([t + g * scale for t, g in zip(total.grads, part.grads, strict=True)],
                           total.unclipped + part.unclipped)
    return total


class HalfNoise(GaussianSumMechanism):
    """Bug: noise with ``σ/2`` while the accountant is charged ``σ``."""

    @property
    def std(self) -> float:
        return 0.5 * self.noise_multiplier * self.clipping_norm


class TwentiethNoise(GaussianSumMechanism):
    """Bug (for the count): noise with ``σ_b/20`` while the accountant is charged for
    ``σ_b`` — ``σ_eff·√r`` in place of ``σ_eff/√r`` at the default share ``r = 0.05``.
    """

    @property
    def std(self) -> float:
        return self.noise_multiplier * self.clipping_norm / 20.0


@dataclass(frozen=True)
class PublicStreamNoise(GaussianSumMechanism):
    """Bug (for the count): the noise of round ``round_`` drawn from the server's public
    stream of that round (:func:`fedfdp.sampling.server_public_rng` of the run seed),
    not from the secret stream it is handed.
    """

    seed: int = 0
    round_: int = 1

    def privatize(self, clipped_sum: Sequence[torch.Tensor], stream: BitStream) -> list[torch.Tensor]:
        rng = server_public_rng(self.seed, self.round_)
        return [(s.double() + self.std * torch.from_numpy(rng.standard_normal(tuple(s.shape)))).to(s.dtype)
                for s in clipped_sum]


def public_count_server(seed: int) -> ServerParts:
    """The server of the ``count-public-stream`` bug: its ``k``-th noisy count (round
    ``k`` of a run whose rounds are all private) draws from the public stream of round
    ``k`` of ``seed``.
    """
    calls = itertools.count(1)

    def count_mechanism(std: float, sensitivity: float) -> PublicStreamNoise:
        return PublicStreamNoise(std, sensitivity, seed, next(calls))

    return ServerParts(count_mechanism=count_mechanism)


class ProductPlan(SamplingPlan):
    """Bug: Poisson device sampling at the record level charged at rate ``p·q``."""

    @property
    def subsampling(self) -> Subsampling:
        s = self.settings
        if s.unit == PrivacyUnit.RECORD and s.device_sampling_rate is not None:
            return Subsampling(s.device_sampling_rate * s.sampling_rate)
        return super().subsampling


@dataclass(frozen=True)
class PlantedBug:
    """One broken component: the client and server parts that carry it.

    ``server(seed)`` and ``client(seed)`` build the parts for a run with public
    seed ``seed`` (the predictable-noise bug derives its noise from it).
    """

    name: str
    component: str
    server: Callable[[int], ServerParts] = field(default=lambda seed: ServerParts())
    client: Callable[[], ClientParts] = field(default=ClientParts)


def _seeded_server(seed: int) -> ServerParts:
    secrets: SecretSource = SeededEntropy(seed)
    return ServerParts(secrets=secrets)


BUGS: dict[str, PlantedBug] = {
    b.name: b
    for b in (
        PlantedBug("shared-batch", "batch sampler", client=lambda: ClientParts(batches=shared_batch_sampler)),
        PlantedBug("no-clip", "aggregator", client=lambda: ClientParts(aggregate=unclipped_private_sum)),
        PlantedBug(
            "realized-normalization", "aggregator",
            client=lambda: ClientParts(aggregate=realised_normalisation_sum),
        ),
        PlantedBug("low-noise", "mechanism", server=lambda seed: ServerParts(mechanism=HalfNoise)),
        PlantedBug("predictable-noise", "secret source", server=_seeded_server),
        PlantedBug(
            "pq-accounting", "sampling plan", server=lambda seed: ServerParts(sampling_plan=ProductPlan)
        ),
        PlantedBug("count-public-stream", "count mechanism", server=public_count_server),
        PlantedBug("count-low-noise", "count mechanism",
                   server=lambda seed: ServerParts(count_mechanism=TwentiethNoise)),
    )
}

#: The honest components.
CORRECT = PlantedBug("none", "none")


def planted(name: str | None) -> PlantedBug:
    """The bug called ``name`` (``None``: the honest components)."""
    if name is None:
        return CORRECT
    if name not in BUGS:
        raise ValueError(f"--break {name!r}: unknown (known: {', '.join(BUGS)})")
    return BUGS[name]


# --------------------------------------------------------------------------------------
# CorrDP
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorrDPBug:
    """A CorrDP server whose mechanism scales every insensitive block's noise by the
    TV ``tv(estimate)`` while its accounting (the claim) keeps the honest design's.
    ``tv = None``: the honest server.
    """

    name: str
    component: str
    tv: Callable[[TVEstimate], float] | None = None

    def server(self, cfg: Config, data: FederatedData, estimate: TVEstimate) -> ServerParts:
        """The server's parts for ``cfg`` on ``data`` with this bug's mechanism."""
        honest = server_parts_for(cfg, data)
        if self.tv is None:
            return honest
        design = corrdp_setup(cfg, data).design
        low = self.tv(estimate)
        roles = design.roles.with_tv({f.name: low for f in design.roles.insensitive})
        broken = dataclasses.replace(design, roles=roles)
        return dataclasses.replace(honest, mechanism=corrdp_mechanism_factory(broken))


CORRDP_BUGS: dict[str, CorrDPBug] = {
    b.name: b
    for b in (
        CorrDPBug("tv-no-inflation", "mechanism", lambda est: est.tv_hat),
        CorrDPBug("tv-underestimated", "mechanism", lambda est: est.tv_tilde / 4),
    )
}


def corrdp_planted(name: str | None) -> CorrDPBug:
    """The CorrDP bug called ``name`` (``None``: the honest server)."""
    if name is None:
        return CorrDPBug("none", "none")
    if name not in CORRDP_BUGS:
        known = ", ".join(CORRDP_BUGS)
        raise ValueError(f"--break {name!r}: unknown for the corrdp relation (known: {known})")
    return CORRDP_BUGS[name]
