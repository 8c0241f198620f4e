"""One record of a message's ``RecordDict`` by name and kind.

``content.config_records[key]`` (and ``array_records``, ``metric_records``) builds a
typed copy of every record of its kind on each access before looking one up: with the
five exchanges of a secure-aggregation round and the node state kept in
``Context.state``, those views were a measurable share of a round's CPU
(``benchmarks/secagg.py``). :func:`get_record` looks the one record up and checks its kind,
with the same outcome: the record, or ``KeyError`` when it is absent or of another kind.
"""

from __future__ import annotations

from typing import TypeVar

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

__all__ = ["find_record", "get_record"]

R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)


def find_record(content: RecordDict, key: str, kind: type[R]) -> R | None:
    """``content[key]`` when it is a record of ``kind``, else None (absent, or of
    another kind): ``content.<kind>_records.get(key)``.
    """
    value = content.get(key)
    return value if isinstance(value, kind) else None


def get_record(content: RecordDict, key: str, kind: type[R]) -> R:
    """``content[key]``, a record of ``kind``: ``content.<kind>_records[key]``.

    Raises
    ------
    KeyError
        ``key`` is absent, or names a record of another kind.
    """
    value = find_record(content, key, kind)
    if value is None:
        raise KeyError(key)
    return value
