"""A node's contribution to one round of Algorithm 1 (the client-side half).

A node (a Flower SuperNode, or the centralised engine holding every device)
serves one or more devices. For the devices a round asks of it, it computes

* ``private_sum``: Σ over the devices' Poisson private batches of per-record
  gradients of the private loss, each clipped to ``C`` (Algorithm 1 steps 3-4,
  Remark 1); for the device unit, Σ over devices of each device's mean private
  gradient clipped to ``C`` as one vector. Sensitivity ``C`` per record (per
  device). No noise here — the server adds it once to the sum over nodes.
* ``public_sum``: Σ over uniform public batches, drawn from the public stream
  (never from the coins of the private batch: Prop. 3), of unclipped gradients
  of ``ℓ_pub`` on public views (steps 5-6). Public information: it depends on
  Ψ(x) and public labels only.

Every device draws its Poisson coins and private padding from its own secret
stream (:meth:`fedfdp.entropy.SecretSource.device`); the record-unit private
sum over all of a node's devices is then **one** clipped sum over the union of
their batches (the same number as the sum of per-device clipped sums, in one
call). The realised private batch size and any statistic of the private batch
stay on the node.

The two steps that decide privacy are components, so an audit can swap one of
them for a broken variant through the same seam a normal run uses
(:class:`ClientParts`): the :class:`BatchSampler` that draws a device's two
batches and the :class:`PrivateAggregator` that turns the drawn private
batches into the private sum.

Where it computes
-----------------
On the device of the model's parameters (:func:`model_device`; a model split over
devices is refused). Every draw — Poisson coins, secret padding, public per-record
draws — is made on the CPU, where the loss terms are built; their inputs and targets
move to the model's device for the forward/backward, and the sums come back to the CPU
(:data:`CPU`), where the server adds its noise. The draws are the same on any device.

A public batch shape (:class:`BatchShape`, secure aggregation)
--------------------------------------------------------------
Under secure aggregation the server is an adversary and sees when a node's reply
arrives; a node whose work grows with its secret Poisson batch tells it the batch
size. With ``BatchShape.PUBLIC`` the private batch is processed in a **public**
number of rows, :func:`batch_slots`: the count a Poisson batch of the ``n`` records
asked for (``n`` and ``q`` public) exceeds with probability at most
:data:`SLOT_OVERFLOW` (Chernoff, :func:`fedfdp.binomial_tails.upper_count`). The
rows beyond the sample are zero records whose loss is multiplied by 0, so their
gradient, hence their clipped contribution, is exactly 0 and the clipped sum is the
unpadded one (up to the order of float additions); the count of vectors within ``C``
counts sampled rows only; the realised count never leaves the node. Record unit: one
slot count for the union of the node's private batches (``n`` = the records of its
devices asked for private work); device unit: one per device. A batch beyond its
slots (probability ≤ ``SLOT_OVERFLOW`` per node and round) is processed whole, in
a multiple of the slot count: nothing is truncated, the released sum is the
mechanism's, and only the reply time can show that the rare event happened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch
from torch import nn

from fedfdp.binomial_tails import upper_count
from fedfdp.clipping import ClipMethod, clipped_grad_sum
from fedfdp.clipping.common import LossFn, tensor_sum
from fedfdp.config import PRIVACY_UNITS, ConfigError, PrivacyUnit
from fedfdp.entropy import DeviceSecrets, SecretSource, SystemEntropy
from fedfdp.losses import FeatureMap, LossPart, LossTerms, RecordKeys
from fedfdp.modes import PHASES, Phase, PrivateLoss
from fedfdp.sampling import PublicStreams, poisson_sample, uniform_sample

if TYPE_CHECKING:
    from fedfdp.data import DeviceData
    from fedfdp.protocol import TrainInstruction

UNITS = PRIVACY_UNITS


@dataclass
class Contribution:
    """What a node sends for one round.

    Attributes
    ----------
    private_sum : list of Tensor or None
        Sum of clipped private gradients (None if the phase has no private
        part). Zeros for empty Poisson batches — still sent, so the server
        cannot tell an empty batch from a full one.
    public_sum : list of Tensor or None
        Sum of unclipped public gradients (None if the phase has no public part).
    public_count : int
        Records in the public batches.
    public_loss_sum : float
        Sum of ``ℓ_pub`` over the public batches.
    """

    private_sum: list[torch.Tensor] | None
    public_sum: list[torch.Tensor] | None
    public_count: int
    public_loss_sum: float
    unclipped_count: int = 0


@dataclass(frozen=True)
class PrivateSum:
    """A node's private part: the sum of clipped private gradients and how many
    of the clipped vectors (records, or devices for the device unit) were
    already within ``C`` — the count adaptive clipping needs (Andrew et al.
    2021); it leaves the node only for the server to add noise to it.
    """

    grads: list[torch.Tensor]
    unclipped: int = 0


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters a round updates, in a fixed order."""
    return [p for p in model.parameters() if p.requires_grad]


#: Where a node's sums and every tensor built from shapes live (module docstring).
CPU = torch.device("cpu")


def model_device(model: nn.Module) -> torch.device:
    """The device a round's forward/backward passes run on: that of the model's
    parameters (the CPU for a model without any).

    Raises
    ------
    ConfigError
        The parameters are on more than one device (named), or on the meta device
        (shapes without values).
    """
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise ConfigError(f"model: its parameters are on more than one device ({names}); a run computes "
                          "on one: move the whole model there (model.to(device))")
    device = devices.pop() if devices else CPU
    if device.type == "meta":
        raise ConfigError("model: its parameters are on the meta device (shapes without values); "
                          "materialise them (to_empty, then initialise) before a run")
    return device


def _on(device: torch.device, inputs: Sequence[torch.Tensor], targets: torch.Tensor,
        ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A loss's inputs and targets, built on the CPU, moved to the model's ``device`` for
    its forward/backward (the same tensors when it is the CPU).
    """
    return [x.to(device) for x in inputs], targets.to(device)


def clip_vector(tensors: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """Scale the tensor list, seen as one vector, to L2 norm at most ``max_norm``."""
    norm = torch.sqrt(tensor_sum((t.double() ** 2).sum() for t in tensors)) if tensors else torch.tensor(0.0)
    factor = min(1.0, max_norm / float(norm)) if float(norm) > 0 else 1.0
    return [t * factor for t in tensors]


# --------------------------------------------------------------------------------------
# the work of one round
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceTask:
    """What a round asks of one device.

    Attributes
    ----------
    device : int
        Global device id.
    x, y : np.ndarray
        The device's training records.
    private : bool
        Whether the device does private work this round (drawn by the server's
        sampling plan; always True without device sampling).
    public_count : int
        The device's share of the uniform public batch.
    """

    device: int
    x: np.ndarray
    y: np.ndarray
    private: bool
    public_count: int


@dataclass(frozen=True)
class RoundSettings:
    """The round-level settings of a node's work (from the train instruction)."""

    round: int
    attempt: int
    phase: Phase
    sampling_rate: float
    clipping_norm: float
    unit: PrivacyUnit = PrivacyUnit.RECORD
    public_seed: int = 0
    clip_method: ClipMethod = ClipMethod.AUTO

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"privacy-unit={self.unit!r}: must be record or device")
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        if not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling-rate={self.sampling_rate}: must be in (0, 1]")
        if not self.clipping_norm > 0:
            raise ValueError(f"clipping-norm={self.clipping_norm}: must be > 0")


@dataclass(frozen=True)
class PrivateBatch:
    """A device's drawn private batch with its secret padding generator.

    ``sampled``: how many of the rows, from the first, are the Poisson sample (None:
    all); the rows after them are the padding of a public shape (:class:`BatchShape`)
    and contribute exactly zero. ``keys``: each row's public identity (seed, round,
    device, index), for decompositions that draw per record
    (:meth:`fedfdp.losses.FeatureMap.terms`).
    """

    x: torch.Tensor
    y: torch.Tensor
    padding: torch.Generator
    device_size: int
    sampled: int | None = None
    keys: RecordKeys | None = None

    @property
    def size(self) -> int:
        """The realised sample size (never sent)."""
        return len(self.y) if self.sampled is None else self.sampled

    @property
    def weights(self) -> torch.Tensor:
        """1 for each sampled row, 0 for each padding row."""
        w = torch.zeros(len(self.y), dtype=torch.long)
        w[: self.size] = 1
        return w


class BatchShape(Enum):
    """How a node lays out its private batch (module docstring).

    ``REALISED``: as drawn (a trusted server: no one the guarantee is against times the
    node). ``PUBLIC``: in :func:`batch_slots` rows, whatever the sample's size (secure
    aggregation: the server sees when each reply arrives).
    """

    REALISED = "realised"
    PUBLIC = "public"


#: The probability allowed, per node (device, for the device unit) and round, that a
#: Poisson batch exceeds its public slot count.
SLOT_OVERFLOW = 2.0**-80


def batch_slots(records: int, rate: float) -> int:
    """The public number of rows a Poisson batch of ``records`` records at ``rate`` is
    processed in: the smallest count it exceeds with probability at most
    :data:`SLOT_OVERFLOW` (Chernoff). Depends on public quantities only.

    Examples
    --------
    >>> batch_slots(1000, 0.05), batch_slots(16, 0.05), batch_slots(0, 0.05)
    (137, 16, 0)
    """
    return upper_count(records, rate, SLOT_OVERFLOW)


def _rows(sampled: int, slots: int) -> int:
    """``slots``, or the next multiple of it when the sample overflows."""
    return slots * max(1, -(-sampled // slots)) if slots else sampled


def _zero_rows(like: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros((n, *like.shape[1:]), dtype=like.dtype)


def _pad(batch: PrivateBatch, rows: int) -> PrivateBatch:
    extra = rows - len(batch.y)
    return replace(batch, x=torch.cat([batch.x, _zero_rows(batch.x, extra)]),
                   y=torch.cat([batch.y, torch.zeros(extra, dtype=batch.y.dtype)]), sampled=len(batch.y),
                   keys=None if batch.keys is None else batch.keys.padded(extra))


def public_shape(batches: Sequence[PrivateBatch], unit: PrivacyUnit, rate: float) -> list[PrivateBatch]:
    """``batches`` laid out in public slots (module docstring): the device unit pads
    each device's batch to :func:`batch_slots` of its size; the record unit appends one
    batch of zero rows so that the union has :func:`batch_slots` of the records asked
    (its padding views drawn from the last device's secret generator, after that
    device's own).
    """
    if unit is PrivacyUnit.DEVICE:
        return [_pad(b, _rows(len(b.y), batch_slots(b.device_size, rate))) for b in batches]
    if not batches:
        return []
    sampled = sum(len(b.y) for b in batches)
    extra = _rows(sampled, batch_slots(sum(b.device_size for b in batches), rate)) - sampled
    last = batches[-1]
    keys = None if last.keys is None else last.keys[:0].padded(extra)
    filler = PrivateBatch(_zero_rows(last.x, extra), torch.zeros(extra, dtype=last.y.dtype), last.padding,
                          device_size=0, sampled=0, keys=keys)
    return [*batches, filler]


@dataclass(frozen=True)
class ZeroPadded:
    """A per-record loss over targets ``(n, 2)`` = (target, weight): ``loss · weight``,
    so a row of weight 0 has gradient exactly 0 (clipped, still 0). Targets of
    ``shape`` per record (not a class index: a diffusion model's noise) are carried as
    ``(n, 1 + size)`` = (weight, flattened target) (:meth:`weighted`).
    """

    loss: LossFn
    shape: tuple[int, ...] = ()

    @staticmethod
    def weighted(targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``targets`` with each row's weight, as :meth:`__call__` reads them."""
        if targets.dim() == 1:
            return torch.stack([targets, weights], dim=1)
        return torch.cat([weights.to(targets.dtype)[:, None], targets.flatten(1)], dim=1)

    def __call__(self, outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        """Per-record ``loss(outputs, target) · weight``."""
        if not self.shape:
            per_record, weight = self.loss(outputs, targets[:, 0]), targets[:, 1]
        else:
            per_record, weight = self.loss(outputs, targets[:, 1:].reshape(-1, *self.shape)), targets[:, 0]
        return per_record * weight.to(per_record.dtype)


# --------------------------------------------------------------------------------------
# components (the seams)
# --------------------------------------------------------------------------------------


class BatchSampler(Protocol):
    """Draws a device's private and public batches for a round."""

    def __call__(
        self, n: int, rate: float, public_count: int, secrets: DeviceSecrets, public: PublicStreams
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(private indices, public indices)`` into the device's ``n`` records."""
        ...


def independent_batches(
    n: int, rate: float, public_count: int, secrets: DeviceSecrets, public: PublicStreams
) -> tuple[np.ndarray, np.ndarray]:
    """The honest sampler: a Poisson private batch at ``rate`` from the device's
    secret coins and, independently, a uniform public batch of ``public_count``
    records from the public stream (Prop. 3).
    """
    private = poisson_sample(n, rate, secrets.coins)
    if public_count == 0:  # nothing drawn: the stream is this device's in this round only
        return private, np.empty(0, dtype=np.int64)
    return private, uniform_sample(n, public_count, public.sample)


class PrivateAggregator(Protocol):
    """Turns the drawn private batches of a node's devices into its private sum.

    Under ``BatchShape.PUBLIC`` it must give the rows after a batch's ``sampled`` weight
    0 and work on every row (:func:`clipped_private_sum` does; the per-block aggregator of
    CorrDP does not, and secure aggregation does not serve CorrDP).
    """

    def __call__(
        self,
        model: nn.Module,
        decomposition: FeatureMap,
        settings: RoundSettings,
        batches: Sequence[PrivateBatch],
    ) -> PrivateSum:
        """The node's private sum of ``batches`` for ``model`` under ``decomposition``
        and the round's ``settings``.
        """
        ...


#: The loss part a phase's private sum differentiates.
_PRIVATE_PART = {PrivateLoss.PRIVATE: LossPart.PRIVATE, PrivateLoss.FULL: LossPart.FULL}


def _rows_of(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[idx]`` for a vector of row indices (``index_select``: the same rows, ~5x faster)."""
    return torch.index_select(t, 0, idx)


def _joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` without the copy when there is one part (one device)."""
    return parts[0] if len(parts) == 1 else torch.cat(list(parts))


def _private_terms(decomposition: FeatureMap, phase: Phase, batch: PrivateBatch) -> LossTerms:
    part = _PRIVATE_PART.get(phase.private_loss)
    if part is None:
        raise ValueError(f"phase {phase.name!r} has no private part")
    keys = batch.keys
    if batch.sampled is None or batch.sampled == len(batch.y):
        return decomposition.terms(part, batch.x, batch.y, batch.padding, keys)
    # the sample's views first, then the padding rows' (the sample's draws as unpadded)
    s = batch.sampled
    head_keys, tail_keys = (None, None) if keys is None else (keys[:s], keys[s:])
    head = decomposition.terms(part, batch.x[:s], batch.y[:s], batch.padding, head_keys)
    tail = decomposition.terms(part, batch.x[s:], batch.y[s:], batch.padding, tail_keys)
    return LossTerms([torch.cat([h, t]) for h, t in zip(head.inputs, tail.inputs, strict=True)],
                     torch.cat([head.targets, tail.targets]), head.loss)


def private_gradient_sum(
    model: nn.Module,
    decomposition: FeatureMap,
    phase: Phase,
    batches: Sequence[PrivateBatch],
    clipping_norm: float | None,
    clip_method: ClipMethod = ClipMethod.AUTO,
) -> list[torch.Tensor]:
    """Σ over the union of ``batches`` of per-record private-loss gradients, each
    clipped to ``clipping_norm`` (``None``: unclipped), in one call.
    """
    return private_clipped_sum(model, decomposition, phase, batches, clipping_norm, clip_method).grads


def private_clipped_sum(
    model: nn.Module,
    decomposition: FeatureMap,
    phase: Phase,
    batches: Sequence[PrivateBatch],
    clipping_norm: float | None,
    clip_method: ClipMethod = ClipMethod.AUTO,
) -> PrivateSum:
    """:func:`private_gradient_sum` with the count of records whose gradient norm
    was already within ``clipping_norm`` (0 without clipping).
    """
    device = model_device(model)
    if not batches or not any(len(b.y) for b in batches):
        return PrivateSum([torch.zeros_like(p, device=CPU) for p in trainable(model)], 0)
    terms = [_private_terms(decomposition, phase, batch) for batch in batches]
    loss_fn = terms[-1].loss
    inputs = [_joined([t.inputs[k] for t in terms]) for k in range(len(terms[0].inputs))]
    targets = _joined([t.targets for t in terms])
    sampled = None
    if any(b.sampled is not None for b in batches):  # a public shape: padding rows weigh 0
        sampled = torch.cat([b.weights for b in batches])
        shape = tuple(targets.shape[1:])
        targets, loss_fn = ZeroPadded.weighted(targets, sampled), ZeroPadded(loss_fn, shape)
    out = clipped_grad_sum(model, *_on(device, inputs, targets), loss_fn, clipping_norm, method=clip_method)
    grads = [g.to(CPU) for g in out.grads]
    if clipping_norm is None:
        return PrivateSum(grads, 0)
    within = out.norms.to(CPU) <= clipping_norm
    return PrivateSum(grads, int((within if sampled is None else within & (sampled == 1)).sum()))


def clipped_private_sum(
    model: nn.Module,
    decomposition: FeatureMap,
    settings: RoundSettings,
    batches: Sequence[PrivateBatch],
) -> PrivateSum:
    """The honest aggregator.

    Record unit: one clipped sum over the union of the batches (each record's
    gradient clipped to ``C`` when the phase clips). Device unit: each device's
    mean private gradient over its batch, clipped to ``C`` as one vector, summed
    over devices. Either way with the count of vectors already within ``C``.
    """
    phase = settings.phase
    if phase.per_block:
        raise ValueError(
            f"phase {phase.name!r} clips per block: the node needs the CorrDP aggregator "
            "(fedfdp.run_plan.client_parts_for), not the joint clipping of the default ClientParts"
        )
    clip = settings.clipping_norm if phase.clip else None
    if settings.unit is PrivacyUnit.RECORD:
        return private_clipped_sum(model, decomposition, phase, batches, clip, settings.clip_method)
    total = [torch.zeros_like(p, device=CPU) for p in trainable(model)]
    unclipped = 0
    for batch in batches:
        grads = private_gradient_sum(model, decomposition, phase, [batch], None, settings.clip_method)
        mean = [g / max(batch.size, 1) for g in grads]
        if clip is not None:
            norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in mean))
            unclipped += int(norm <= clip)
            mean = clip_vector(mean, clip)
        total = [t + m for t, m in zip(total, mean, strict=True)]
    return PrivateSum(total, unclipped)


@dataclass(frozen=True)
class ClientParts:
    """The components a node computes its contribution with.

    Attributes
    ----------
    secrets : SecretSource
        The node's secret entropy (default: the OS CSPRNG).
    batches : BatchSampler
        Draws each device's private and public batch.
    aggregate : PrivateAggregator
        Turns the private batches into the private sum.
    shape : BatchShape
        ``PUBLIC``: the private batches are laid out in public slots before
        ``aggregate`` (:func:`public_shape`; secure aggregation).
    """

    secrets: SecretSource = field(default_factory=SystemEntropy)
    batches: BatchSampler = independent_batches
    aggregate: PrivateAggregator = clipped_private_sum
    shape: BatchShape = BatchShape.REALISED

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", BatchShape(self.shape))


# --------------------------------------------------------------------------------------
# a node's contribution
# --------------------------------------------------------------------------------------


class PublicBatch(NamedTuple):
    """A device's public batch: records ``(x, y)``, the padding stream of their views,
    and each row's public identity (``keys``: for decompositions that draw per record).
    """

    x: torch.Tensor
    y: torch.Tensor
    padding: torch.Generator
    keys: RecordKeys | None = None


def public_gradient_sum(
    model: nn.Module,
    decomposition: FeatureMap,
    batches: Sequence[PublicBatch | tuple[torch.Tensor, torch.Tensor, torch.Generator]],
) -> tuple[list[torch.Tensor], float, int]:
    """Σ of unclipped public-loss gradients over the union of ``batches`` (each a
    :class:`PublicBatch`, or ``(x, y, padding)``: its views padded from its own public
    stream), in one forward/backward; returns ``(gradients, loss sum, records)``.
    """
    params = trainable(model)
    device = model_device(model)
    given = [PublicBatch(*b) for b in batches if len(b[1])]
    if not given:
        return [torch.zeros_like(p, device=CPU) for p in params], 0.0, 0
    terms = [decomposition.terms(LossPart.PUBLIC, b.x, b.y, b.padding, b.keys) for b in given]
    inputs = [_joined([t.inputs[k] for t in terms]) for k in range(len(terms[0].inputs))]
    inputs, targets = _on(device, inputs, _joined([t.targets for t in terms]))
    total = terms[0].loss([model(inp) for inp in inputs], targets).sum()
    grads = torch.autograd.grad(total, params)
    return [g.detach().to(CPU) for g in grads], float(total.detach()), len(targets)


def node_contribution(
    model: nn.Module,
    decomposition: FeatureMap,
    settings: RoundSettings,
    tasks: Sequence[DeviceTask],
    parts: ClientParts | None = None,
) -> Contribution:
    """The contribution of a node's devices to one round (module docstring).

    Each device draws its batches with ``parts.batches`` from its own secret
    stream and the public stream; the private batches of all devices asked for
    private work are aggregated by ``parts.aggregate``; the public batches are
    summed (unclipped) over all devices.
    """
    parts = parts if parts is not None else ClientParts()
    model_device(model)  # a model on several devices is refused before anything is drawn
    phase = settings.phase
    private_batches: list[PrivateBatch] = []
    public_batches: list[PublicBatch] = []
    for task in tasks:
        n = len(task.y)
        count = task.public_count if phase.public else 0
        secrets = parts.secrets.device(settings.round, task.device, settings.attempt)
        public = PublicStreams.for_device(settings.public_seed, settings.round, task.device)
        private_idx, public_idx = parts.batches(n, settings.sampling_rate, count, secrets, public)
        x = torch.as_tensor(task.x)
        y = torch.as_tensor(task.y, dtype=torch.long)
        if phase.has_private and task.private:
            idx = torch.as_tensor(private_idx, dtype=torch.long)
            keys = RecordKeys.of(settings.public_seed, settings.round, task.device, private_idx)
            private_batches.append(PrivateBatch(_rows_of(x, idx), _rows_of(y, idx), secrets.padding, n,
                                                keys=keys))
        if count:
            idx = torch.as_tensor(public_idx, dtype=torch.long)
            keys = RecordKeys.of(settings.public_seed, settings.round, task.device, public_idx)
            public_batches.append(PublicBatch(_rows_of(x, idx), _rows_of(y, idx), public.padding, keys))
    private_sum, unclipped = None, 0
    if phase.has_private:
        if parts.shape is BatchShape.PUBLIC:
            private_batches = public_shape(private_batches, settings.unit, settings.sampling_rate)
        part = parts.aggregate(model, decomposition, settings, private_batches)
        private_sum, unclipped = part.grads, part.unclipped
    if not phase.public:
        return Contribution(private_sum, None, 0, 0.0, unclipped)
    public_sum, loss_sum, count = public_gradient_sum(model, decomposition, public_batches)
    return Contribution(private_sum, public_sum, count, loss_sum, unclipped)


def client_update(
    model: nn.Module,
    feature_map: FeatureMap,
    devices: Mapping[int, DeviceData],
    instruction: TrainInstruction,
    *,
    public_seed: int = 0,
    parts: ClientParts | None = None,
) -> Contribution:
    """A node's reply to one train instruction, for your own model and data.

    ``model`` holds the round's global weights; ``devices`` maps the global id
    of every device this node serves to its records (the data protocol: arrays
    per device); the instruction names the devices asked this round. Each
    device's Poisson coins and private padding come from ``parts.secrets``
    (default: the OS CSPRNG, fresh for every draw); the public batches from
    the public stream of ``public_seed`` (the run's seed). The private sum's
    sensitivity is ``C`` per record (per device for the device unit) under
    add/remove (Def. 6); nothing about the private batch leaves the node but
    that sum.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from fedfdp import DeviceData, FeatureMap, TrainInstruction, client_update
    >>> rng = np.random.default_rng(0)
    >>> dev = DeviceData(rng.normal(size=(50, 4)).astype(np.float32), rng.integers(0, 2, 50))
    >>> order = TrainInstruction(round=1, attempt=0, phase="fdp", unit="record",
    ...                          sampling_rate=0.2, clipping_norm=1.0, device_ids=(7,),
    ...                          public_counts=(8,), private_flags=(True,))
    >>> fmap = FeatureMap.columns(["a", "b", "c", "d"], private=["d"], view="zero")
    >>> out = client_update(torch.nn.Linear(4, 2), fmap, {7: dev}, order)
    >>> out.public_count, float(torch.cat([g.ravel() for g in out.private_sum]).norm()) <= 50.0
    (8, True)
    """
    missing = [d for d in instruction.device_ids if d not in devices]
    if missing:
        raise ValueError(f"device-ids={list(instruction.device_ids)}: devices {missing} are not this node's")
    if devices:
        first = next(iter(devices.values()))
        feature_map.check(torch.as_tensor(first.x[:1]))
    settings = RoundSettings(
        round=instruction.round,
        attempt=instruction.attempt,
        phase=PHASES[instruction.phase],
        sampling_rate=instruction.sampling_rate,
        clipping_norm=instruction.clipping_norm,
        unit=instruction.unit,
        public_seed=public_seed,
    )
    tasks = [
        DeviceTask(d, devices[d].x, devices[d].y, f, c)
        for d, c, f in zip(instruction.device_ids, instruction.public_counts, instruction.private_flags,
                           strict=True)
    ]
    return node_contribution(model, feature_map, settings, tasks, parts)
