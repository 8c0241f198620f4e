"""The SecAgg+ messages as flat records of strings and bytes (the Flower layer's wire form).

Flower's ``ConfigRecord`` holds signed 64-bit integers, but node ids are unsigned 64-bit
(:data:`~fedfdp.secagg.crypto.MAX_NODE_ID`), so every integer travels as a decimal
string and a tuple of ids as one comma-separated string; a tuple of equal-length byte
strings travels as their concatenation (its item length beside it). The ``uint32``
array of :class:`~fedfdp.secagg.messages.CollectReply` is not part of the record: the
caller puts it in an ``ArrayRecord``. :func:`from_wire` rebuilds the message, whose
constructor validates every field (:class:`~fedfdp.secagg.errors.MessageError`).

The collect reply's arrays
--------------------------
One ``ArrayRecord`` (:data:`MASKED`) holds the masked vector (:data:`MASKED`: ``d``
``uint32`` words) and, when the round has a public part, the node's public sum
(:data:`PUBLIC_SUM`: ``d`` ``float32`` values, the trainable parameters' coordinates in
the model's order, :func:`pack_public` / :func:`unpack_public`): 8 bytes per coordinate
and two array headers, whatever the number of parameter tensors. ``float32`` is exact:
the node computes the public sum in the model's ``float32`` and the server steps in
``float32``, so the bytes carry every bit the step uses. A fixed-point encoding would
save nothing (4 bytes for the ring's 32 bits) unless it dropped bits, and the public sum
is unclipped, so no public range bounds it. The public sum is public by definition
(disclosed in the clear under every aggregation): packing changes no accounting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

import numpy as np

from fedfdp.secagg.errors import MessageError, Stage
from fedfdp.secagg.messages import (
    CollectReply,
    CollectRequest,
    ConfirmReply,
    ConfirmRequest,
    KeysReply,
    KeysRequest,
    SetupReply,
    SetupRequest,
    UnmaskReply,
    UnmaskRequest,
)

__all__ = ["MASKED", "MESSAGE_TYPES", "PUBLIC_SUM", "REPLY_TO", "SECAGG", "STAGES", "STAGE_MESSAGES",
           "from_wire", "pack_public", "to_wire", "unpack_public"]

#: The record of a secure-aggregation message (a ``ConfigRecord`` of :func:`to_wire`).
SECAGG = "secagg"
#: The ``ArrayRecord`` (and its array) holding a collect reply's masked vector.
MASKED = "masked"
#: The array, beside :data:`MASKED` in its record, holding a collect reply's public sum
#: (``float32``, flat: :func:`pack_public`).
PUBLIC_SUM = "public-sum"
#: The four stages of a round, as Flower ``train`` actions (``train.sa_setup`` ...), in
#: order: :attr:`Stage.action <fedfdp.secagg.errors.Stage.action>` of every stage.
STAGES: tuple[str, ...] = tuple(stage.action for stage in Stage)

_M = TypeVar("_M")

#: The request (server → client) and reply (client → server) class of every stage.
STAGE_MESSAGES: dict[Stage, tuple[type[Any], type[Any]]] = {
    Stage.SETUP: (SetupRequest, SetupReply),
    Stage.SHARE_KEYS: (KeysRequest, KeysReply),
    Stage.COLLECT: (CollectRequest, CollectReply),
    Stage.UNMASK: (UnmaskRequest, UnmaskReply),
}

#: The reply class of every request class, the unmask stage's consistency check
#: (:class:`ConfirmRequest`, sent with the unmask stage's action) included.
REPLY_TO: dict[type[Any], type[Any]] = {
    **{request: reply for request, reply in STAGE_MESSAGES.values()},
    ConfirmRequest: ConfirmReply,
}

#: The ten message classes, by name.
MESSAGE_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls for pair in REPLY_TO.items() for cls in pair
}


_FIELD_TABLES: dict[type, tuple[tuple[str, str], ...]] = {}


def _field_table(cls: type) -> tuple[tuple[str, str], ...]:
    """``cls``'s fields as (name, annotation) pairs, read once per message class."""
    table = _FIELD_TABLES.get(cls)
    if table is None:
        table = _FIELD_TABLES[cls] = tuple((f.name, str(f.type)) for f in fields(cls))
    return table


def to_wire(msg: Any) -> dict[str, str | bytes]:
    """``msg``'s fields as strings and bytes (module docstring); a ``CollectReply``'s
    ``masked`` array is left out.
    """
    out: dict[str, str | bytes] = {"type": type(msg).__name__}
    for name, kind in _field_table(type(msg)):
        value = getattr(msg, name)
        if isinstance(value, np.ndarray):
            continue
        if isinstance(value, bytes):
            out[name] = value
        elif isinstance(value, int):
            out[name] = str(value)
        elif isinstance(value, tuple) and kind == "tuple[bytes, ...]":
            sizes = {len(v) for v in value}
            if len(sizes) > 1:
                raise ValueError(f"{type(msg).__name__}.{name}: byte strings of unequal length")
            out[name] = b"".join(value)
            out[f"{name}.size"] = str(sizes.pop() if sizes else 0)
        elif isinstance(value, tuple):
            out[name] = ",".join(str(int(v)) for v in value)
        else:
            raise TypeError(f"{type(msg).__name__}.{name}: cannot be put on the wire "
                            f"({type(value).__name__})")
    return out


def from_wire(cls: type[_M], record: Any, masked: np.ndarray | None = None) -> _M:
    """The ``cls`` message a :func:`to_wire` record describes (``masked``: a
    ``CollectReply``'s array). Raises :class:`MessageError` naming the field.
    """
    if record.get("type") != cls.__name__:
        raise MessageError(f"{cls.__name__}: the record is a {record.get('type')!r}", field="type")
    kwargs: dict[str, Any] = {}
    for name, kind in _field_table(cls):
        if kind == "np.ndarray":
            kwargs[name] = masked
            continue
        if name not in record:
            raise MessageError(f"{cls.__name__}.{name}: missing", field=name)
        raw = record[name]
        try:
            if kind == "int":
                kwargs[name] = int(str(raw))
            elif kind == "bytes":
                kwargs[name] = bytes(raw)
            elif kind == "tuple[int, ...]":
                text = str(raw)
                kwargs[name] = tuple(int(v) for v in text.split(",")) if text else ()
            elif kind == "tuple[bytes, ...]":
                size = int(str(record[f"{name}.size"]))
                blob = bytes(raw)
                if size < 0 or (size == 0 and blob) or (size and len(blob) % size):
                    raise ValueError(f"{len(blob)} bytes in items of {size}")
                kwargs[name] = tuple(blob[i : i + size] for i in range(0, len(blob), size)) if size else ()
            else:  # pragma: no cover - every field type is listed
                raise ValueError(f"unknown field type {kind}")
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.__name__}.{name}: unreadable ({exc})", field=name) from None
    return cls(**kwargs)


def pack_public(sums: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """The public sums of the parameters ``names`` (in that order) as one flat ``float32``
    vector (module docstring: exact for the ``float32`` sums a node computes).

    Raises
    ------
    ValueError
        A parameter missing from ``sums``, or a sum that is not floating point.
    """
    parts = []
    for name in names:
        if name not in sums:
            raise ValueError(f"public sum: parameter {name!r} missing")
        arr = np.asarray(sums[name])
        if arr.dtype.kind != "f":
            raise ValueError(f"public sum of {name!r}: dtype {arr.dtype} is not floating point")
        parts.append(arr.reshape(-1).astype(np.float32, copy=False))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def unpack_public(flat: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_public`: the flat vector cut into the parameters' ``shapes``
    (in their order).

    Raises
    ------
    MessageError
        ``flat`` is not a one-dimensional ``float32`` array of exactly the parameters'
        coordinate count (one line naming the dtype or the length; field
        :data:`PUBLIC_SUM`).
    """
    if not isinstance(flat, np.ndarray) or flat.dtype != np.float32 or flat.ndim != 1:
        desc = (f"{flat.dtype} array of shape {flat.shape}" if isinstance(flat, np.ndarray)
                else type(flat).__name__)
        raise MessageError(f"{PUBLIC_SUM}: must be a one-dimensional float32 array, got {desc}",
                           field=PUBLIC_SUM)
    sizes = [int(np.prod(shape, dtype=np.int64)) if shape else 1 for shape in shapes.values()]
    if flat.size != sum(sizes):
        raise MessageError(f"{PUBLIC_SUM}: {flat.size} coordinates, expected d={sum(sizes)}",
                           field=PUBLIC_SUM)
    out, at = {}, 0
    for (name, shape), size in zip(shapes.items(), sizes, strict=True):
        out[name] = flat[at : at + size].reshape(shape)
        at += size
    return out
