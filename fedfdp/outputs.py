"""Run outputs: ``metrics.csv`` and the resolved ``config.toml``, written atomically.

A file is written to a temporary sibling, flushed to disk, moved into place
with :func:`os.replace`, and its directory is flushed too, so an interrupted
run (or a power cut) never leaves a half-written file or loses a rename.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from fedfdp.metrics_table import MetricsTable

METRICS_FILE = "metrics.csv"
CONFIG_FILE = "config.toml"
METRIC_COLUMNS = (
    "round",
    "phase",
    "epsilon",
    "epsilon_corrdp",
    "delta",
    "relation",
    "relation_text",
    "accuracy",
    "balanced_accuracy",
    "auc",
    "loss",
    "public_loss",
    "replies",
    "rejected",
    "asked",
    "missing",
    "noise_multiplier",
    "normaliser",
    "noise_source",
)


def atomic_write(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably: temporary file, fsync,
    rename, fsync of the directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def append_durably(path: str | Path, data: bytes) -> None:
    """Append ``data`` to ``path`` and flush it to disk (a file a run grows line by line:
    ``metrics.csv``, ``rows.jsonl``; a reader after a crash may find a cut last line, which
    their writers' resume rules drop).
    """
    with open(path, "ab") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def prepare_output_dir(path: str | Path, flag: str, *, empty: bool = False, create: bool = True) -> Path:
    """Create the output directory ``path`` (and its parents) or refuse it with a
    one-line :class:`~fedfdp.config.ConfigError` naming ``flag`` and the value:
    a path that is a file, too long, not writable, or (``empty``) not empty.
    ``create=False`` checks without creating anything (before other validation).
    """
    from fedfdp.config import ConfigError

    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{flag}={str(path)!r}: is a file, not a directory")
        if empty and path.is_dir() and any(path.iterdir()):
            names = sorted(p.name for p in path.iterdir())[:5]
            raise ConfigError(
                f"{flag}={str(path)!r}: not empty, already holds {names}; choose an empty or new directory"
            )
        if not create:
            too_long = any(len(part.encode()) > 255 for part in path.parts) or len(str(path)) > 4095
            if too_long:
                raise ConfigError(f"{flag}={str(path)!r}: cannot write there (File name too long)")
            base = path.absolute()
            while not base.exists():
                base = base.parent
            if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
                raise ConfigError(f"{flag}={str(path)!r}: cannot write there ({base} is not writable)")
            return path
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test.", delete=True):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag}={str(path)!r}: cannot write there ({exc.strerror or exc})") from exc
    return path


def prepare_output_file(path: str | Path, flag: str) -> Path:
    """Check, before any work, that ``path`` can be written as a file; refuse it
    with a one-line :class:`~fedfdp.config.ConfigError` naming ``flag``: a
    directory, a parent that is a file, too long, or not writable.
    """
    from fedfdp.config import ConfigError

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag}={str(path)!r}: is a directory, not a file")
    prepare_output_dir(path.parent if str(path.parent) else Path("."), flag)
    if len(path.name.encode()) > 255:
        raise ConfigError(f"{flag}={str(path)!r}: file name too long")
    return path


def write_metrics(out_dir: str | Path, rows: Sequence[Any]) -> Path:
    """Write per-round rows (dicts or dataclasses) to ``out_dir/metrics.csv`` (whole, atomically)."""
    path = Path(out_dir) / METRICS_FILE
    atomic_write(path, MetricsTable.render(rows, METRIC_COLUMNS)[1].encode())
    return path


class MetricsFile:
    """``metrics.csv`` kept in step with a run's rows: the new row appended when it is one
    more line of the same table (:class:`~fedfdp.metrics_table.MetricsTable`), the file
    rewritten atomically otherwise.

    A run that stops leaves every line it wrote; a resumed run hands over its
    checkpoint's rows (a new list), and the file is rewritten from them first.

    Parameters
    ----------
    path : Path
        The file.
    leading : sequence of str
        The columns written first (default :data:`METRIC_COLUMNS`).
    """

    def __init__(self, path: str | Path, leading: Sequence[str] = METRIC_COLUMNS) -> None:
        self.path = Path(path)
        self._leading = tuple(leading)
        self._table: MetricsTable | None = None
        self._source: Sequence[Any] | None = None

    def write(self, rows: Sequence[Any]) -> None:
        """Bring the file to ``rows``: one appended line when ``rows`` is the list last
        written grown by one row that fits the table, the whole file otherwise.
        """
        table = self._table
        grown = (table is not None and rows is self._source and len(rows) == table.rows + 1
                 and self.path.is_file())
        line = table.add(rows[-1]) if grown and table is not None else None
        if line is not None:
            append_durably(self.path, line.encode())
            return
        self._table, text = MetricsTable.render(rows, self._leading)
        self._source = rows
        atomic_write(self.path, text.encode())


def write_config(
    out_dir: str | Path, flat: Mapping[str, Any], resolved: Mapping[str, Any] | None = None
) -> Path:
    """Write the configuration (flat kebab keys) and the values resolved at run
    start (σ, δ, N...) under ``[resolved]`` to ``out_dir/config.toml``.
    """
    doc: dict[str, Any] = {k: v for k, v in flat.items() if v is not None}
    if resolved:
        doc["resolved"] = {k: v for k, v in resolved.items() if v is not None}
    path = Path(out_dir) / CONFIG_FILE
    atomic_write(path, tomli_w.dumps(doc).encode())
    return path
