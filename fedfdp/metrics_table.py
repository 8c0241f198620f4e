"""``metrics.csv`` row by row: the same bytes as a whole-table write, at a constant cost per round.

A run adds one row to ``metrics.csv`` every round. Rendering the whole table again
each round (a pandas frame of every row so far, then the file rewritten) costs time and
bytes that grow with the round number: about 0.2 s a round at 10,000 rows on a 2-core
machine, so a 10,000-round run spent most of its time there. :class:`MetricsTable`
renders the table with pandas (``DataFrame.from_records(rows).to_csv(index=False)``,
the project's leading columns first) and keeps, per column, what decided pandas'
type for it (a missing value, an integer, a float, a boolean or anything else). A new
row that adds no column and changes no column's type is one more line of the same
table, rendered here the way pandas writes that type; :class:`fedfdp.outputs.MetricsFile`
appends it to the file. Otherwise — a column appears, or an integer column meets a
missing value and turns to floats — the whole table is rendered again.

``tests/test_metrics_table.py`` checks the appended file against pandas' rendering
of every prefix of random tables.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["ColumnKind", "MetricsTable", "metrics_frame"]


class ColumnKind(Enum):
    """How a column's values are written: pandas' type for the column."""

    INTEGER = "integer"  # int64: every row has an integer, written as is
    FLOAT = "float"  # float64: numbers with a float or a missing value; missing is empty
    BOOLEAN = "boolean"  # bool: every row has a boolean
    TEXT = "text"  # object (or a column of missing values only): str() of each, missing empty


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and math.isnan(value))


@dataclass
class _Column:
    """What decides a column's kind, over the rows so far."""

    missing: bool = False
    integer: bool = False
    floating: bool = False
    boolean: bool = False
    other: bool = False

    @classmethod
    def of_dtype(cls, dtype: Any) -> _Column:
        if pd.api.types.is_bool_dtype(dtype):
            return cls(boolean=True)
        if pd.api.types.is_integer_dtype(dtype):
            return cls(integer=True)
        if pd.api.types.is_float_dtype(dtype):
            return cls(floating=True)
        return cls(other=True)

    def seeing(self, value: Any) -> _Column:
        """These facts with ``value`` seen too."""
        new = _Column(self.missing, self.integer, self.floating, self.boolean, self.other)
        if _missing(value):
            new.missing = True
        elif isinstance(value, (bool, np.bool_)):
            new.boolean = True
        elif isinstance(value, (int, np.integer)):
            new.integer = True
        elif isinstance(value, (float, np.floating)) and not isinstance(value, np.float32):
            new.floating = True
        else:
            new.other = True  # text, and types whose rendering is left to pandas (float32)
        return new

    @property
    def kind(self) -> ColumnKind:
        if self.other or (self.boolean and (self.integer or self.floating or self.missing)):
            return ColumnKind.TEXT
        if self.boolean:
            return ColumnKind.BOOLEAN
        if self.integer or self.floating:
            return ColumnKind.FLOAT if (self.floating or self.missing) else ColumnKind.INTEGER
        return ColumnKind.TEXT


def _cell(value: Any, kind: ColumnKind) -> str:
    if _missing(value):
        return ""
    if kind is ColumnKind.FLOAT or isinstance(value, (float, np.floating)):
        return repr(float(value))
    if kind is ColumnKind.INTEGER:
        return str(int(value))
    return str(value)


def _record(row: Any) -> dict[str, Any]:
    if is_dataclass(row) and not isinstance(row, type):
        return asdict(row)
    return dict(row)


def metrics_frame(rows: Sequence[Any], leading: Sequence[str]) -> pd.DataFrame:
    """The rows (dicts or dataclass instances) as a frame, the ``leading`` columns first."""
    frame = pd.DataFrame.from_records([_record(r) for r in rows])
    first = [c for c in leading if c in frame.columns]
    return frame[first + [c for c in frame.columns if c not in first]]


class MetricsTable:
    """A rendered ``metrics.csv`` and what its next row needs to be one more line of it.

    Build it with :meth:`render`; :meth:`add` renders a row as one more line when it fits.
    """

    def __init__(self, columns: dict[str, _Column], rows: int) -> None:
        self._columns = columns
        self.rows = rows

    @classmethod
    def render(cls, rows: Sequence[Any], leading: Sequence[str]) -> tuple[MetricsTable, str]:
        """The table of ``rows`` and its text: pandas' rendering, the leading columns first."""
        frame = metrics_frame(rows, leading)
        columns = {name: _Column.of_dtype(frame[name].dtype) for name in frame.columns}
        return cls(columns, len(rows)), frame.to_csv(index=False)

    def add(self, row: Mapping[str, Any] | Any) -> str | None:
        """``row``'s CSV line (with its newline) when it is one more line of this table
        (no new column, no column's kind changed); ``None`` otherwise (render the whole
        table again).
        """
        if not self.rows:
            return None
        record = _record(row)
        if any(name not in self._columns for name in record):
            return None
        seen = {name: col.seeing(record.get(name)) for name, col in self._columns.items()}
        if any(seen[name].kind is not col.kind for name, col in self._columns.items()):
            return None
        self._columns = seen
        self.rows += 1
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(
            [_cell(record.get(name), col.kind) for name, col in seen.items()]
        )
        return buf.getvalue()
