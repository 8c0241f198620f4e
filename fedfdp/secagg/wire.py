"""The SecAgg+ messages as records of the Flower layer (their wire form).

A message travels as a ``ConfigRecord`` of two entries: ``type`` (the class name) and
``body``, one byte string holding every field in the class's field order:

=================== ==================================================================
field type          bytes
=================== ==================================================================
``int``             8, big-endian unsigned (node ids are unsigned 64-bit,
                    :data:`~fedfdp.secagg.crypto.MAX_NODE_ID`; Flower's own integers
                    are signed)
``bytes``           a 4-byte big-endian length, then the bytes
``tuple[int]``      a 4-byte count, then 8 bytes per id
``tuple[bytes]``    a 4-byte count and a 4-byte item length, then the items (the
                    tuples of a message hold byte strings of one length each)
=================== ==================================================================

One entry per message, not one per field: Flower checks and converts every entry of a
record on each side of the wire, so the packed form costs a fraction of a field-by-field
record. The ``uint32`` array of :class:`~fedfdp.secagg.messages.CollectReply` is not
part of the record: the caller puts it in an ``ArrayRecord``. :func:`from_wire` reads
the body (a truncated body, one with bytes left over, or an integer of another width is
refused) and rebuilds the message, whose constructor validates every field
(:class:`~fedfdp.secagg.errors.MessageError` naming the field).

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

import struct
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
from fedfdp.secagg.packing import Reader, pack_blob, pack_ids, pack_items, pack_u64

__all__ = ["BODY", "MASKED", "MESSAGE_TYPES", "PUBLIC_SUM", "REPLY_TO", "SECAGG", "STAGES", "STAGE_MESSAGES",
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


#: The entry of a :func:`to_wire` record holding the packed fields.
BODY = "body"

def to_wire(msg: Any) -> dict[str, str | bytes]:
    """``msg`` as a record (module docstring): its class name and its fields packed in
    one byte string (:mod:`fedfdp.secagg.packing`); a ``CollectReply``'s ``masked``
    array is left out.
    """
    parts: list[bytes] = []
    for name, kind in _field_table(type(msg)):
        value = getattr(msg, name)
        if kind == "np.ndarray":
            continue
        if kind == "int" and isinstance(value, int):
            parts.append(pack_u64(value))
        elif kind == "bytes" and isinstance(value, bytes):
            parts.append(pack_blob(value))
        elif kind == "tuple[int, ...]" and isinstance(value, tuple):
            parts.append(pack_ids(value))
        elif kind == "tuple[bytes, ...]" and isinstance(value, tuple):
            try:
                parts.append(pack_items(value))
            except ValueError as exc:
                raise ValueError(f"{type(msg).__name__}.{name}: {exc}") from None
        else:
            raise TypeError(f"{type(msg).__name__}.{name}: cannot be put on the wire "
                            f"({type(value).__name__})")
    return {"type": type(msg).__name__, BODY: b"".join(parts)}


def from_wire(cls: type[_M], record: Any, masked: np.ndarray | None = None) -> _M:
    """The ``cls`` message a :func:`to_wire` record describes (``masked``: a
    ``CollectReply``'s array). Raises :class:`MessageError` naming the field.
    """
    if record.get("type") != cls.__name__:
        raise MessageError(f"{cls.__name__}: the record is a {record.get('type')!r}", field="type")
    blob = record.get(BODY)
    if not isinstance(blob, bytes):
        raise MessageError(f"{cls.__name__}.{BODY}: missing", field=BODY)
    kwargs: dict[str, Any] = {}
    read = Reader(blob)
    name = BODY
    try:
        for name, kind in _field_table(cls):
            if kind == "np.ndarray":
                kwargs[name] = masked
            elif kind == "int":
                kwargs[name] = read.u64()
            elif kind == "bytes":
                kwargs[name] = read.blob()
            elif kind == "tuple[int, ...]":
                kwargs[name] = read.ids()
            elif kind == "tuple[bytes, ...]":
                kwargs[name] = read.items()
            else:  # pragma: no cover - every field type is listed
                raise ValueError(f"unknown field type {kind}")
        name = BODY
        read.end()
    except (struct.error, ValueError) as exc:
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
