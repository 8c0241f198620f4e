"""The sampling plan: who takes part in a round, what the update is divided by,
and which privacy event the accountant is charged — decided in one place.

Every engine takes its rounds from a :class:`SamplingPlan`: the Flower
strategy (:mod:`strategies.fdp_strategy`), the centralised reference
(:mod:`fedfdp.algorithm`) and the audit. Nothing else derives a rate or a
normaliser.

Sampling modes and what each round is charged
---------------------------------------------
``N`` is the number of training records, ``D`` the number of devices (both
public), ``q`` the record sampling rate, ``p`` the device sampling rate.

================================  ====================  ==============  ==================================
mode                              private work          normaliser      accounted event per round
================================  ====================  ==============  ==================================
record unit, every device         every device          ``q·N``         subsampled Gaussian at ``q``
record unit, ``k`` nodes          devices of ``k``      ``q·N_asked``   subsampled Gaussian at ``q``
                                  nodes
record unit, Poisson devices      each device w.p.      ``p·q·N``       w.p. ``p`` a subsampled Gaussian
at ``p``                          ``p``                                 at ``q``, else nothing
                                                                        (participation ``p``)
device unit, Poisson devices      each device w.p.      ``p·D``         subsampled Gaussian at ``p``
at ``p``                          ``p``
================================  ====================  ==============  ==================================

Why each is an upper bound (``docs/accounting.md`` has the proofs):

* the choice of ``k`` nodes is data-independent and made from the **public**
  stream: the adversary may know it, and a record of a chosen node still joins
  with probability ``q`` (Theorem 5), one of an unchosen node not at all;
* Poisson devices, record unit: a record's device-mates reveal whether its
  device was drawn, so the draw cannot be counted as secret (the old rate
  ``p·q`` was **not** an upper bound). The round is the mixture — with
  probability ``p`` Theorem 5's pair at rate ``q``, otherwise no access —
  with the draw revealed to the adversary; composing that mixture is exact for
  this mechanism and never above rate ``q``;
* device unit: the device's whole private contribution is clipped to ``C`` as
  one vector and included iff the device's secret coin comes up: a Poisson
  sample of devices at rate ``p``.

The normaliser is always a data-independent constant (never the realised
batch), so dividing by it is post-processing.

Randomness: the fixed-count node choice and the public batch come from the
public stream (:func:`fedfdp.sampling.server_public_rng`); the Poisson device
draw comes from the server's secret stream
(:meth:`fedfdp.entropy.SecretSource.device_draw`), which matters for the device
unit. The public device sample of the device unit (Prop. 3 at device level) is
drawn from the public stream, independently of the private one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedfdp.config.choices import PrivacyUnit
from fedfdp.entropy import BitStream, uniforms
from fedfdp.modes import Phase
from fedfdp.sampling import allocate_public_batch

UNITS = tuple(PrivacyUnit)


@dataclass(frozen=True)
class Subsampling:
    """The sampling part of the event a private round is charged: the Poisson rate
    ``rate`` of the privacy unit, given that the round touches it, and the probability
    ``participation`` that it does (known to the adversary). The event itself is the
    resolved mechanism's (:mod:`fedfdp.mechanism`).
    """

    rate: float
    participation: float = 1.0


@dataclass(frozen=True)
class SamplingSettings:
    """The privacy-defining sampling settings (validated on construction).

    Attributes
    ----------
    sampling_rate : float
        ``q``, in (0, 1].
    device_sampling_rate : float or None
        ``p`` in (0, 1], or None (every device, or ``nodes_per_round`` nodes).
    unit : str
        ``record`` or ``device`` (needs ``device_sampling_rate``).
    nodes_per_round : int
        ``k`` > 0: that many nodes chosen uniformly per round (public stream);
        0: every node. Not with ``device_sampling_rate``.
    public_batch_size : int
        ``m'``, the uniform public batch over all (or the publicly sampled) devices.
    """

    sampling_rate: float
    device_sampling_rate: float | None = None
    unit: PrivacyUnit = PrivacyUnit.RECORD
    nodes_per_round: int = 0
    public_batch_size: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling-rate={self.sampling_rate}: must be in (0, 1]")
        p = self.device_sampling_rate
        if p is not None and not 0 < p <= 1:
            raise ValueError(f"device-sampling-rate={p}: must be in (0, 1]")
        if self.unit not in UNITS:
            raise ValueError(f"privacy-unit={self.unit!r}: must be record or device")
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        if self.unit is PrivacyUnit.DEVICE and p is None:
            raise ValueError("privacy-unit='device': needs device-sampling-rate in (0, 1]")
        if self.nodes_per_round < 0:
            raise ValueError(f"clients-per-round={self.nodes_per_round}: must be >= 0")
        if self.nodes_per_round and p is not None:
            raise ValueError(
                f"clients-per-round={self.nodes_per_round}: give it or device-sampling-rate, not both"
            )
        if self.public_batch_size < 0:
            raise ValueError(f"public-batch-size={self.public_batch_size}: must be >= 0")

    @property
    def subsampling(self) -> Subsampling:
        """The sampling of the event one private round is charged (module docstring)."""
        if self.unit is PrivacyUnit.DEVICE:
            if self.device_sampling_rate is None:  # unreachable after validation
                raise RuntimeError("device unit without device-sampling-rate")
            return Subsampling(self.device_sampling_rate)
        return Subsampling(self.sampling_rate, self.device_sampling_rate or 1.0)


@dataclass(frozen=True)
class RoundPlan:
    """One round of a :class:`SamplingPlan`.

    Attributes
    ----------
    private : np.ndarray of bool
        Per device: whether it does private work this round.
    public_counts : np.ndarray of int
        Per device: its share of the uniform public batch.
    normaliser : float
        What the noisy private sum is divided by (a data-independent constant).
    """

    private: np.ndarray
    public_counts: np.ndarray
    normaliser: float

    def asked(self) -> np.ndarray:
        """Positions of the devices with any work this round."""
        return np.flatnonzero(self.private | (self.public_counts > 0))


@dataclass(frozen=True)
class SamplingPlan:
    """The per-round sampling of a run over public device sizes (module docstring).

    Parameters
    ----------
    settings : SamplingSettings
    device_sizes : sequence of int
        Training records of each device, in device order (public).
    device_nodes : sequence of int, optional
        The node serving each device, as any hashable label; nodes are ordered
        by their smallest device for the fixed-count choice, so the choice does
        not depend on transport-level node ids. Default: one node per device.
    """

    settings: SamplingSettings
    device_sizes: tuple[int, ...]
    device_nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        sizes = tuple(int(s) for s in self.device_sizes)
        if not sizes or min(sizes) < 0 or sum(sizes) < 1:
            raise ValueError(f"device sizes {list(sizes)[:8]}...: need devices with training records")
        object.__setattr__(self, "device_sizes", sizes)
        nodes = tuple(self.device_nodes) or tuple(range(len(sizes)))
        if len(nodes) != len(sizes):
            raise ValueError(f"{len(nodes)} node labels for {len(sizes)} devices")
        object.__setattr__(self, "device_nodes", nodes)

    @property
    def num_records(self) -> int:
        """``N``."""
        return sum(self.device_sizes)

    @property
    def subsampling(self) -> Subsampling:
        """The sampling of the event one private round is charged."""
        return self.settings.subsampling

    def _node_positions(self) -> np.ndarray:
        """Each device's node as a position among nodes ordered by smallest device."""
        order: dict[int, int] = {}
        for node in self.device_nodes:
            order.setdefault(node, len(order))
        return np.array([order[n] for n in self.device_nodes], dtype=np.int64)

    def round(self, phase: Phase, public_rng: np.random.Generator, secret_draw: BitStream) -> RoundPlan:
        """Who does what in a round of ``phase``.

        ``public_rng``: the round's public stream (node choice, public batch);
        ``secret_draw``: the server's secret stream (Poisson device draw).
        """
        s = self.settings
        sizes = np.array(self.device_sizes, dtype=np.int64)
        d = len(sizes)
        p = s.device_sampling_rate
        if p is not None:
            drawn = uniforms(secret_draw, d) < p
            if s.unit is PrivacyUnit.DEVICE:
                public_mask = public_rng.random(d) < p
                normaliser = p * d
            else:
                public_mask = np.ones(d, dtype=bool)
                normaliser = p * s.sampling_rate * float(sizes.sum())
        else:
            drawn = np.ones(d, dtype=bool)
            if s.nodes_per_round:
                nodes = self._node_positions()
                count = int(nodes.max()) + 1
                if s.nodes_per_round < count:
                    chosen = public_rng.choice(count, size=s.nodes_per_round, replace=False)
                    drawn = np.isin(nodes, chosen)
            public_mask = drawn
            normaliser = s.sampling_rate * float(sizes[drawn].sum())
        public_sizes = np.where(public_mask, sizes, 0)
        m = min(s.public_batch_size, int(public_sizes.sum())) if phase.public else 0
        counts = allocate_public_batch(public_sizes, m, public_rng)
        private = drawn & phase.has_private
        return RoundPlan(private=private, public_counts=counts, normaliser=float(normaliser))

    def record_bound(self, plan: RoundPlan, devices: Sequence[int]) -> int:
        """How many clipped vectors (records, or devices for the device unit) the
        private sum of ``devices`` (positions) can hold in round ``plan``: an honest
        node's private sum has norm at most ``C`` times this.
        """
        idx = np.asarray(devices, dtype=np.int64)
        chosen = idx[plan.private[idx]]
        if self.settings.unit is PrivacyUnit.DEVICE:
            return len(chosen)
        return int(np.sum(np.array(self.device_sizes)[chosen]))
