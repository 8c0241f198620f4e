"""The client/server message contract, independent of the transport.

Key names and the validation of a client's reply live here so that the Flower
client (``clients/``) and strategy (``strategies/``) share one definition and
``fedfdp`` stays free of Flower imports.

A train instruction carries the global model and a config with the round's
``phase``, ``sampling-rate`` (q), ``clipping-norm`` (C), ``seed``, the
``device-ids`` the node must serve and each device's ``public-counts``. A reply
carries ``private`` (sum of clipped private gradients), ``public`` (sum of
public gradients) and metrics ``public-count``/``public-loss-sum``. There is
deliberately no private batch size and no metric of the private batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedfdp import faults

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
SEED = "seed"
DEVICE_IDS = "device-ids"
PUBLIC_COUNTS = "public-counts"
ROUND = "server-round"
PRIVATE_FLAGS = "private-flags"
ATTEMPT = "attempt"
UNIT = "privacy-unit"
# Metric keys of a reply
PUBLIC_COUNT = "public-count"
PUBLIC_LOSS_SUM = "public-loss-sum"
DEVICE_SIZES = "device-sizes"


class InvalidReply(ValueError):
    """A client reply that must not touch the model or the ledger."""


@dataclass(frozen=True)
class ValidReply:
    """A reply that passed :func:`validate_reply`, as float arrays in parameter order."""

    private: list[np.ndarray] | None
    public: list[np.ndarray] | None
    public_count: int
    public_loss_sum: float


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
        client and is rejected (``clipping_norm=None``: no check).
    public_count_asked
        The public batch size allocated to the node; the reply must match it.
    """
    priv = _arrays(PRIVATE, private, expected) if want_private else None
    if not want_private and private:
        raise InvalidReply("unexpected 'private' arrays in a round without private part")
    pub = _arrays(PUBLIC, public, expected) if want_public else None
    if not want_public and public:
        raise InvalidReply("unexpected 'public' arrays in a round without public part")
    if priv is not None and clipping_norm is not None and not faults.active("no-clip"):
        norm = math.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in priv))
        bound = clipping_norm * max_private_records * (1 + 1e-4) + 1e-6
        if norm > bound:
            raise InvalidReply(
                f"private sum norm {norm:.4g} exceeds C x records = {bound:.4g}: impossible "
                "for clipped gradients"
            )
    metrics = metrics or {}
    count, loss = 0, 0.0
    if want_public:
        if PUBLIC_COUNT not in metrics or PUBLIC_LOSS_SUM not in metrics:
            raise InvalidReply(
                f"metrics {sorted(metrics)}: need '{PUBLIC_COUNT}', '{PUBLIC_LOSS_SUM}'"
            )
        raw = metrics[PUBLIC_COUNT]
        if isinstance(raw, bool) or not float(raw).is_integer() or int(raw) < 0:
            raise InvalidReply(f"public-count={raw!r}: not a count")
        if int(raw) != public_count_asked and not faults.active("shared-batch"):
            raise InvalidReply(f"public-count={raw!r}: expected {public_count_asked}")
        count = int(raw)
        loss = float(metrics[PUBLIC_LOSS_SUM])
        if not math.isfinite(loss):
            raise InvalidReply(f"public-loss-sum={loss}: not finite")
    return ValidReply(priv, pub, count, loss)


def shapes_of(names: Sequence[str], arrays: Sequence[np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Name → shape mapping in parameter order."""
    return {n: tuple(a.shape) for n, a in zip(names, arrays, strict=True)}
