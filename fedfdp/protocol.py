"""The client/server message contract, independent of the transport.

Key names and the validation of a client's reply live here so that the Flower
client (``clients/``) and strategy (``strategies/``) share one definition and
``fedfdp`` stays free of Flower imports.

A train instruction (:class:`TrainInstruction`) carries the global model and a
config with the round, its ``attempt``, the ``phase``, the ``privacy-unit``,
``sampling-rate`` (q), ``clipping-norm`` (C), the ``device-ids`` the node must
serve, each device's ``public-counts`` and ``private-flags``. It carries **no
seed and no secret**: each node draws its Poisson coins and private padding
from its own entropy (:mod:`fedfdp.entropy`), and the public streams derive
from the run seed the node already holds. A reply carries ``private`` (sum of
clipped private gradients), ``public`` (sum of public gradients) and metrics
``public-count``/``public-loss-sum``. There is deliberately no private batch
size and no metric of the private batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import numpy as np

from fedfdp.config import PRIVACY_UNITS, Mode, PrivacyUnit
from fedfdp.modes import PHASES

ChoiceT = TypeVar("ChoiceT", bound=StrEnum)

# Record keys
ARRAYS = "arrays"
CONFIG = "config"
PRIVATE = "private"
PUBLIC = "public"
METRICS = "metrics"
# Config keys of a train instruction
PHASE = "phase"
SAMPLING_RATE = "sampling-rate"
CLIPPING_NORM = "clipping-norm"
DEVICE_IDS = "device-ids"
PUBLIC_COUNTS = "public-counts"
ROUND = "server-round"
PRIVATE_FLAGS = "private-flags"
ATTEMPT = "attempt"
UNIT = "privacy-unit"
# Metric keys of a reply
PUBLIC_COUNT = "public-count"
PUBLIC_LOSS_SUM = "public-loss-sum"
#: How many clipped private vectors were already within ``C`` (adaptive clipping).
UNCLIPPED_COUNT = "unclipped-count"
DEVICE_SIZES = "device-sizes"


class InvalidReply(ValueError):
    """A client reply that must not touch the model or the ledger."""


class InvalidInstruction(ValueError):
    """A train instruction a node must refuse; the message names the key and value."""


@dataclass(frozen=True)
class TrainInstruction:
    """What the server asks of one node in one round (without the model).

    Attributes
    ----------
    round, attempt : int
        The round (from 1) and how often it was charged before (a re-run after
        a crash has ``attempt > 0``).
    phase : Mode
        A :data:`fedfdp.modes.PHASES` name (a string is converted).
    unit : PrivacyUnit
        ``record`` or ``device`` (a string is converted).
    sampling_rate, clipping_norm : float
        ``q`` in (0, 1] and ``C`` > 0.
    device_ids : tuple of int
        The node's devices asked this round.
    public_counts : tuple of int
        Each device's share of the public batch.
    private_flags : tuple of bool
        Whether each device does private work.

    Examples
    --------
    >>> from fedfdp import TrainInstruction
    >>> order = TrainInstruction(round=3, attempt=0, phase="fdp", unit="record", sampling_rate=0.05,
    ...                          clipping_norm=1.0, device_ids=(0, 4), public_counts=(12, 9),
    ...                          private_flags=(True, True))
    >>> TrainInstruction.from_config(order.to_config()) == order
    True
    """

    round: int
    attempt: int
    phase: Mode
    unit: PrivacyUnit
    sampling_rate: float
    clipping_norm: float
    device_ids: tuple[int, ...]
    public_counts: tuple[int, ...]
    private_flags: tuple[bool, ...]

    def __post_init__(self) -> None:
        for name, value in ((ROUND, self.round), (ATTEMPT, self.attempt)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise InvalidInstruction(f"{name}={value!r}: must be an integer")
        for name, number in ((SAMPLING_RATE, self.sampling_rate), (CLIPPING_NORM, self.clipping_norm)):
            if isinstance(number, bool) or not isinstance(number, int | float | np.integer | np.floating):
                raise InvalidInstruction(f"{name}={number!r}: must be a number")
        for name, seq in ((DEVICE_IDS, self.device_ids), (PUBLIC_COUNTS, self.public_counts),
                          (PRIVATE_FLAGS, self.private_flags)):
            if isinstance(seq, str | bytes) or not isinstance(seq, Sequence | np.ndarray):
                raise InvalidInstruction(f"{name}={seq!r}: must be a list")
        if self.round < 1 or self.attempt < 0:
            raise InvalidInstruction(f"{ROUND}={self.round}, {ATTEMPT}={self.attempt}: out of range")
        if self.phase not in PHASES:
            raise InvalidInstruction(f"{PHASE}={self.phase!r}: unknown (known: {', '.join(PHASES)})")
        if self.unit not in PRIVACY_UNITS:
            raise InvalidInstruction(f"{UNIT}={self.unit!r}: must be record or device")
        object.__setattr__(self, "phase", Mode(self.phase))
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        if not (math.isfinite(self.sampling_rate) and 0 < self.sampling_rate <= 1):
            raise InvalidInstruction(f"{SAMPLING_RATE}={self.sampling_rate}: must be in (0, 1]")
        if not (math.isfinite(self.clipping_norm) and self.clipping_norm > 0):
            raise InvalidInstruction(f"{CLIPPING_NORM}={self.clipping_norm}: must be > 0")
        n = len(self.device_ids)
        if n == 0 or len(self.public_counts) != n or len(self.private_flags) != n:
            raise InvalidInstruction(
                f"{DEVICE_IDS}={list(self.device_ids)}, {PUBLIC_COUNTS}={list(self.public_counts)}, "
                f"{PRIVATE_FLAGS}={list(self.private_flags)}: need equal, non-empty lists"
            )
        if len(set(self.device_ids)) != n or min(self.public_counts) < 0:
            raise InvalidInstruction(
                f"{DEVICE_IDS}={list(self.device_ids)}, {PUBLIC_COUNTS}={list(self.public_counts)}: "
                "duplicate devices or negative counts"
            )

    def to_config(self) -> dict[str, int | float | str | list[int]]:
        """The instruction as a flat config mapping (a Flower ConfigRecord's content)."""
        return {
            ROUND: self.round,
            ATTEMPT: self.attempt,
            PHASE: self.phase.value,
            UNIT: self.unit.value,
            SAMPLING_RATE: self.sampling_rate,
            CLIPPING_NORM: self.clipping_norm,
            DEVICE_IDS: list(self.device_ids),
            PUBLIC_COUNTS: list(self.public_counts),
            PRIVATE_FLAGS: [int(f) for f in self.private_flags],
        }

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> TrainInstruction:
        """Parse and validate an instruction; raise :class:`InvalidInstruction`."""
        missing = [k for k in _INSTRUCTION_KEYS if k not in config]
        if missing:
            raise InvalidInstruction(f"train instruction misses {missing}")

        def ints(key: str) -> tuple[int, ...]:
            raw = config[key]
            if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
                raise InvalidInstruction(f"{key}={raw!r}: must be a list of integers")
            if any(isinstance(v, bool) or not float(v).is_integer() for v in raw):
                raise InvalidInstruction(f"{key}={list(raw)}: must be a list of integers")
            return tuple(int(v) for v in raw)

        def number(key: str, kind: type) -> float:
            raw = config[key]
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                raise InvalidInstruction(f"{key}={raw!r}: must be a number")
            if kind is int and not float(raw).is_integer():
                raise InvalidInstruction(f"{key}={raw!r}: must be an integer")
            return kind(raw)

        def choice(key: str, kind: type[ChoiceT]) -> ChoiceT:
            raw = config[key]
            try:
                return kind(str(raw))
            except ValueError:
                raise InvalidInstruction(
                    f"{key}={raw!r}: unknown (known: {', '.join(k.value for k in kind)})"
                ) from None

        flags = ints(PRIVATE_FLAGS)
        if any(f not in (0, 1) for f in flags):
            raise InvalidInstruction(f"{PRIVATE_FLAGS}={list(flags)}: must be 0 or 1")
        return cls(
            round=int(number(ROUND, int)),
            attempt=int(number(ATTEMPT, int)),
            phase=choice(PHASE, Mode),
            unit=choice(UNIT, PrivacyUnit),
            sampling_rate=float(number(SAMPLING_RATE, float)),
            clipping_norm=float(number(CLIPPING_NORM, float)),
            device_ids=ints(DEVICE_IDS),
            public_counts=ints(PUBLIC_COUNTS),
            private_flags=tuple(bool(f) for f in flags),
        )


_INSTRUCTION_KEYS = (ROUND, ATTEMPT, PHASE, UNIT, SAMPLING_RATE, CLIPPING_NORM, DEVICE_IDS, PUBLIC_COUNTS,
                     PRIVATE_FLAGS)


@dataclass(frozen=True)
class ValidReply:
    """A reply that passed :func:`validate_reply`, as float arrays in parameter order."""

    private: list[np.ndarray] | None
    public: list[np.ndarray] | None
    public_count: int
    public_loss_sum: float
    unclipped: int = 0


def _arrays(
    name: str,
    arrays: Mapping[str, np.ndarray] | None,
    expected: Mapping[str, tuple[int, ...]],
) -> list[np.ndarray]:
    if arrays is None:
        raise InvalidReply(f"missing '{name}' arrays")
    missing = [k for k in expected if k not in arrays]
    extra = [k for k in arrays if k not in expected]
    if missing or extra:
        raise InvalidReply(f"'{name}' arrays: missing {missing}, unexpected {extra}")
    out = []
    for key, shape in expected.items():
        arr = np.asarray(arrays[key])
        if arr.dtype.kind != "f":
            raise InvalidReply(f"'{name}.{key}': dtype {arr.dtype} is not floating point")
        if tuple(arr.shape) != tuple(shape):
            raise InvalidReply(f"'{name}.{key}': shape {tuple(arr.shape)}, expected {tuple(shape)}")
        if not np.isfinite(arr).all():
            raise InvalidReply(f"'{name}.{key}': contains NaN or Inf")
        out.append(arr.astype(np.float32, copy=False))
    return out


def validate_reply(
    *,
    private: Mapping[str, np.ndarray] | None,
    public: Mapping[str, np.ndarray] | None,
    metrics: Mapping[str, float | int] | None,
    expected: Mapping[str, tuple[int, ...]],
    want_private: bool,
    want_public: bool,
    clipping_norm: float | None,
    max_private_records: int,
    public_count_asked: int,
) -> ValidReply:
    """Check a reply against what the round asked for; raise :class:`InvalidReply`.

    Parameters
    ----------
    expected
        Parameter name → shape, in parameter order.
    clipping_norm, max_private_records
        A sum of at most ``max_private_records`` vectors each clipped to ``C``
        (records, or devices for the device unit) has norm ≤
        ``C · max_private_records``; a larger norm is impossible for an honest
        client and is rejected (``clipping_norm=None``: no check). With a
        clipped private part the reply also counts the vectors already within
        ``C`` (``unclipped-count``, an integer in ``[0, max_private_records]``).
    public_count_asked
        The public batch size allocated to the node; the reply must match it.
    """
    priv = _arrays(PRIVATE, private, expected) if want_private else None
    if not want_private and private:
        raise InvalidReply("unexpected 'private' arrays in a round without private part")
    pub = _arrays(PUBLIC, public, expected) if want_public else None
    if not want_public and public:
        raise InvalidReply("unexpected 'public' arrays in a round without public part")
    if priv is not None and clipping_norm is not None:
        norm = math.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in priv))
        bound = clipping_norm * max_private_records * (1 + 1e-4) + 1e-6
        if norm > bound:
            raise InvalidReply(
                f"private sum norm {norm:.4g} exceeds C x records = {bound:.4g}: impossible "
                "for clipped gradients"
            )
    metrics = metrics or {}
    count, loss, unclipped = 0, 0.0, 0
    if priv is not None and clipping_norm is not None:
        raw = metrics.get(UNCLIPPED_COUNT)
        if raw is None:
            raise InvalidReply(f"metrics {sorted(metrics)}: need '{UNCLIPPED_COUNT}'")
        if isinstance(raw, bool) or not float(raw).is_integer() or not 0 <= int(raw) <= max_private_records:
            raise InvalidReply(f"{UNCLIPPED_COUNT}={raw!r}: not a count in [0, {max_private_records}]")
        unclipped = int(raw)
    if want_public:
        if PUBLIC_COUNT not in metrics or PUBLIC_LOSS_SUM not in metrics:
            raise InvalidReply(
                f"metrics {sorted(metrics)}: need '{PUBLIC_COUNT}', '{PUBLIC_LOSS_SUM}'"
            )
        raw = metrics[PUBLIC_COUNT]
        if isinstance(raw, bool) or not float(raw).is_integer() or int(raw) < 0:
            raise InvalidReply(f"public-count={raw!r}: not a count")
        if int(raw) != public_count_asked:
            raise InvalidReply(f"public-count={raw!r}: expected {public_count_asked}")
        count = int(raw)
        loss = float(metrics[PUBLIC_LOSS_SUM])
        if not math.isfinite(loss):
            raise InvalidReply(f"public-loss-sum={loss}: not finite")
    return ValidReply(priv, pub, count, loss, unclipped)
