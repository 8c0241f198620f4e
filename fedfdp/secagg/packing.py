"""The binary packing the secure-aggregation messages and a node's saved state share.

Big-endian, length-prefixed, nothing self-describing (the reader knows the layout):

==================  ==============================================================
value               bytes
==================  ==============================================================
an integer          ``u64``
a byte string       ``u32`` length, the bytes
an optional one     ``u32`` ``0xFFFFFFFF`` when absent, else as a byte string
ids                 ``u32`` count, one ``u64`` each
equal-length items  ``u32`` count, ``u32`` length, the items
an id map           ``u32`` count, ``u32`` length, the ids (``u64``), the values
==================  ==============================================================

:class:`Reader` takes them back in order; a value that runs past the end, or bytes
left over at :meth:`Reader.end`, raise ``ValueError`` (the caller names the field).
A count is checked against the bytes left before anything of its size is built.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

__all__ = ["Reader", "pack_blob", "pack_id_map", "pack_ids", "pack_items", "pack_optional", "pack_u64"]

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">II")
_NONE = 0xFFFFFFFF  # the length of an absent optional value


def pack_u64(value: int) -> bytes:
    return _U64.pack(value)


def pack_blob(value: bytes) -> bytes:
    return _U32.pack(len(value)) + value


def pack_optional(value: bytes | None) -> bytes:
    return _U32.pack(_NONE) if value is None else pack_blob(value)


def pack_ids(ids: Sequence[int]) -> bytes:
    return _U32.pack(len(ids)) + struct.pack(f">{len(ids)}Q", *ids)


def _length(values: Sequence[bytes]) -> int:
    size = len(values[0]) if values else 0
    if any(len(v) != size for v in values):
        raise ValueError("byte strings of unequal length")
    return size


def pack_items(values: Sequence[bytes]) -> bytes:
    """Byte strings of one length: count, length, the strings."""
    return _PAIR.pack(len(values), _length(values)) + b"".join(values)


def pack_id_map(values: Mapping[int, bytes]) -> bytes:
    """Ids and their values (all of one length): count, length, ids, values."""
    items = list(values.values())
    return (struct.pack(f">II{len(items)}Q", len(items), _length(items), *values) + b"".join(items))


class Reader:
    """Reads packed values in order from ``raw``, starting at ``at``."""

    def __init__(self, raw: bytes, at: int = 0) -> None:
        self.raw, self.at = raw, at

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.raw):
            raise ValueError(f"{size} bytes wanted at {self.at}, {len(self.raw) - self.at} left")
        out = self.raw[self.at : self.at + size]
        self.at += size
        return out

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def blob(self) -> bytes:
        return self.take(self.u32())

    def optional(self) -> bytes | None:
        size = self.u32()
        return None if size == _NONE else self.take(size)

    def ids(self) -> tuple[int, ...]:
        count = self.u32()
        return struct.unpack(f">{count}Q", self.take(8 * count))

    def items(self) -> tuple[bytes, ...]:
        count, size = self.u32(), self.u32()
        if count and not size:
            raise ValueError(f"{count} empty byte strings")
        values = self.take(count * size)
        return tuple(values[i * size : (i + 1) * size] for i in range(count))

    def id_map(self) -> dict[int, bytes]:
        count, size = self.u32(), self.u32()
        keys = struct.unpack(f">{count}Q", self.take(8 * count))
        values = self.take(count * size)
        return {k: values[i * size : (i + 1) * size] for i, k in enumerate(keys)}

    def end(self) -> None:
        if self.at != len(self.raw):
            raise ValueError(f"{len(self.raw) - self.at} bytes left over")
