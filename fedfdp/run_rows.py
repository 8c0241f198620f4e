"""``rows.jsonl``: a run's rows, one JSON line each, appended as the run goes.

The rows of ``metrics.csv`` are what a resumed run continues from. A checkpoint once
held them all in its JSON, so every checkpoint (by default every round) encoded and
wrote every row so far: about 0.1 s a round at 10,000 rounds. Now a round's row is one
line appended to ``rows.jsonl`` (flushed and ``fsync``-ed before the checkpoint that
counts it), and the checkpoint records only how many lines it covers and the SHA-256
of those lines' bytes (:class:`RowsMark`). Resume reads the first ``count`` lines,
checks their digest and parses them (:func:`read_rows`); lines after them (written by a
session that stopped before its next checkpoint) are dropped when the resumed run
writes the file again from its rows. A file cut short, edited or missing is refused in
one line naming it: a resume never continues from rows that are not the checkpoint's.

The lines are ``json.dumps`` of each row (``NaN`` and ``Infinity`` as Python's json
writes them), so they read back to the same values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfdp.input_files import optional_file
from fedfdp.ledger import LedgerError
from fedfdp.outputs import append_durably, atomic_write

__all__ = ["ROWS_FILE", "RowsLog", "RowsMark", "RowsMismatch", "read_rows"]

#: The rows file of a run directory.
ROWS_FILE = "rows.jsonl"


class RowsMismatch(LedgerError):
    """``rows.jsonl`` is not what the checkpoint recorded; the message names the file."""


@dataclass(frozen=True)
class RowsMark:
    """What a checkpoint records of ``rows.jsonl``: its first ``count`` lines and their
    SHA-256 (hex, of the bytes with their newlines).
    """

    count: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, doc: Any) -> RowsMark:
        if not isinstance(doc, dict) or set(doc) != {"count", "sha256"}:
            raise ValueError(f"rows {str(doc)[:80]}: expected count and sha256")
        count, digest = doc["count"], doc["sha256"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"rows count {count!r}")
        hexadecimal = isinstance(digest, str) and all(c in "0123456789abcdef" for c in digest)
        if not (hexadecimal and len(digest) == 64):
            raise ValueError(f"rows sha256 {digest!r}")
        return cls(count, digest)


class RowsLog:
    """``run_dir/rows.jsonl`` kept in step with a run's rows (module docstring).

    :meth:`write` appends the rows added to the same list since the last call (one
    ``json.dumps`` each) and rewrites the file atomically for any other list (a resumed
    run's); :meth:`mark` is what a checkpoint records of it.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / ROWS_FILE
        self._source: Sequence[Any] | None = None
        self._count = 0
        self._hash = hashlib.sha256()

    def write(self, rows: Sequence[dict[str, Any]]) -> RowsMark:
        """Bring the file to ``rows``; return its mark."""
        same = rows is self._source and len(rows) >= self._count and self.path.is_file()
        if same and len(rows) == self._count:
            return self.mark()
        lines = [(json.dumps(row) + "\n").encode() for row in rows[self._count if same else 0:]]
        if same:
            append_durably(self.path, b"".join(lines))
        else:
            self._hash = hashlib.sha256()
            atomic_write(self.path, b"".join(lines))
        for line in lines:
            self._hash.update(line)
        self._source, self._count = rows, len(rows)
        return self.mark()

    def mark(self) -> RowsMark:
        return RowsMark(self._count, self._hash.hexdigest())


def read_rows(run_dir: str | Path, mark: RowsMark) -> list[dict[str, Any]]:
    """The first ``mark.count`` rows of ``run_dir/rows.jsonl``, checked against ``mark``.

    Raises
    ------
    RowsMismatch
        The file is missing, not a regular file, shorter than ``mark.count`` lines, its
        lines' digest differs (edited), or a line is not a JSON object.
    """
    path = Path(run_dir) / ROWS_FILE
    if mark.count == 0:
        return []
    if optional_file(path) is None:
        raise RowsMismatch(f"{path}: missing, but the checkpoint counts {mark.count} rows in it; "
                           "refusing to resume")
    data = path.read_bytes()
    lines = data.split(b"\n")
    if len(lines) <= mark.count:  # the last complete line ends with "\n": one more piece
        raise RowsMismatch(f"{path}: {len(lines) - 1} complete lines, but the checkpoint counts "
                           f"{mark.count}; refusing to resume")
    covered = b"".join(line + b"\n" for line in lines[: mark.count])
    if hashlib.sha256(covered).hexdigest() != mark.sha256:
        raise RowsMismatch(f"{path}: its first {mark.count} lines are not the ones the checkpoint "
                           "recorded (edited); refusing to resume")
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines[: mark.count], 1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise RowsMismatch(f"{path}: line {number} is not a JSON object; refusing to resume")
        rows.append(row)
    return rows
