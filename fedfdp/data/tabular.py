"""``csv``: any user table (CSV or Parquet) with a declared public/private split.

Keys: ``data-path`` (``.csv``, ``.csv.gz``, ``.tsv`` or ``.parquet``/``.pq``,
chosen by extension), ``public-columns``, ``private-columns``,
``label-column``, optional ``device-column``, ``private-ranges``,
``private-categories``, ``public-ranges``, ``public-categories``,
``label-classes``, ``dirichlet-alpha``, ``max-records``.

Two places for the records (``data-location``):

``central`` (:func:`load_csv`)
    One table, read by every process; split into devices and a held-out part.
``node`` (:func:`load_site` on each SuperNode, :func:`load_heldout` on the server)
    Each SuperNode reads its own file (``data-path`` in its node config): all
    its rows are the training records of one device. The server reads
    ``test-path`` for evaluation only. Every column and the label classes
    must be declared (:func:`fedfdp.data.encoding.table_encoding`, strict).

Ψ (public)
    The ``public-columns`` and the label.
Private
    The ``private-columns``. Columns in neither list are ignored.
Public loss
    ``zero`` (declared, used by ``public-loss = "auto"``: every private
    column at the centre of its encoding — a numeric column's range midpoint,
    no category of a one-hot), ``gaussian`` (N(0, 1) padding), or ``mean``
    (the centre of each declared range, ``1/K`` for each of ``K`` declared
    categories). Zero masking replaced Gaussian padding as the tables'
    default after the measurements in ``docs/algorithm.md`` (padding a
    one-hot column with N(0, 1) draws puts Ψ(x) far from any real record).

Encoding
    :mod:`fedfdp.data.encoding`: declared ranges and categories where given
    (``private-ranges``, e.g. ``"age=0:120,income=0:500000"``;
    ``private-categories``, e.g. ``"city=Paris|Lyon|Nice"``; the same for
    public columns); otherwise, with ``central`` data only, public columns the
    mode's relation discloses are standardised / one-hot encoded with the
    training split's statistics. A protected column (a private one; under
    ``dp`` every column, under ``corrdp`` every input column:
    :mod:`fedfdp.config.protection`) without a declaration is refused, or with
    ``private-statistics = "estimate"`` scaled to a Gaussian-noised range (a
    text column: noisy categories) charged to the run's ε
    (:mod:`fedfdp.data.private_statistics`).
Labels
    Any values; rows with a missing label are dropped. Classes are
    ``label-classes`` if declared (other values are refused), else the sorted
    distinct values (as text) of a disclosed label; a protected one (``dp``,
    label-DP) is declared or estimated (the released classes and
    ``(unreleased)``).
Devices and held-out split
    With ``device-column`` each distinct value is a natural device, and whole
    natural devices are grouped into ``num-devices`` devices (at most the
    number of distinct values). Without it the rows are split over
    ``num-devices`` devices IID or by ``Dirichlet(dirichlet-alpha)`` label
    mixes. In both cases ``test-fraction`` of every device's rows is held out.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from fedfdp.config import DataConfig
from fedfdp.data.base import DeviceData, FederatedData
from fedfdp.data.encoding import (
    check_columns,
    encode_label_values,
    label_classes,
    label_text,
    table_encoding,
)
from fedfdp.data.private_statistics import estimate_private_ranges
from fedfdp.data.split import (
    DataError,
    assemble,
    data_rng,
    group_units,
    holdout_records,
    split_records,
)
from fedfdp.features import PublicStatistics
from fedfdp.input_files import regular_file

__all__ = ["load_csv", "load_frame", "load_heldout", "load_site", "read_table"]


def read_table(path: str | Path, max_records: int = 0, *, key: str = "data-path") -> pd.DataFrame:
    """Read a CSV/TSV or Parquet file chosen by its extension; errors name ``key``."""
    path = regular_file(path, key, error=DataError)  # missing, a FIFO, a device: refused
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            frame = pd.read_parquet(path)
            if max_records:
                frame = frame.head(max_records)
        elif name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz", ".txt")):
            sep = "\t" if ".tsv" in name else ","
            header = _raw_header(path, sep)
            dup = sorted({c for c in header if header.count(c) > 1})
            if dup:
                raise DataError(f"{key}={str(path)!r}: duplicate column name(s) {dup[:5]} in the header")
            frame = pd.read_csv(path, sep=sep, nrows=max_records or None)
        else:
            raise DataError(
                f"{key}={str(path)!r}: unknown extension; use .csv, .csv.gz, .tsv or .parquet"
            )
    except DataError:
        raise
    except UnicodeDecodeError:  # its text quotes the undecodable bytes of a cell: not shown
        raise DataError(f"{key}={str(path)!r}: cannot be read (not UTF-8 text)") from None
    except Exception as exc:  # parser errors of pandas/pyarrow: the file's structure, no cell
        raise DataError(f"{key}={str(path)!r}: cannot be read ({type(exc).__name__}: {exc})") from exc
    frame.columns = [str(c) for c in frame.columns]
    if len(frame) == 0:
        raise DataError(f"{key}={str(path)!r}: no rows")
    return frame


def _raw_header(path: Path, sep: str) -> list[str]:
    """The header row as written (pandas renames duplicates to ``a.1``)."""
    import csv
    import gzip

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as fh:
        return [c.strip() for c in next(csv.reader(fh, delimiter=sep), [])]


def _labelled(frame: pd.DataFrame, cfg: DataConfig, where: str) -> pd.DataFrame:
    frame = frame[frame[cfg.label_column].notna()].reset_index(drop=True)
    if len(frame) == 0:
        raise DataError(f"label-column={cfg.label_column!r}: every label in {where} is missing")
    return frame


def load_csv(cfg: DataConfig) -> FederatedData:
    """Load one user table, split over devices (``data-location = "central"``)."""
    return load_frame(read_table(cfg.data_path, cfg.max_records), cfg, repr(cfg.data_path), "csv")


def load_frame(frame: pd.DataFrame, cfg: DataConfig, where: str, name: str) -> FederatedData:
    """A table already in memory (a file's rows, or a packaged dataset's), split
    over devices and encoded exactly as :func:`load_csv` does (``cfg``'s column
    lists and declarations).
    """
    check_columns(frame, cfg, where, [cfg.device_column] if cfg.device_column else [])
    frame = _labelled(frame, cfg, where)
    known = bool(cfg.label_classes) or not cfg.protected.label  # else estimated after the hold-out
    if known:
        y = encode_label_values(frame[cfg.label_column], label_classes(cfg, frame), where,
                                cfg.protected.label)
    else:  # the split's label codes (only dirichlet-alpha reads them): sorted values, never released
        y = np.unique([label_text(v) for v in frame[cfg.label_column]], return_inverse=True)[1]
    if cfg.device_column:
        units = frame[cfg.device_column]
        if units.isna().any():
            raise DataError(
                f"device-column={cfg.device_column!r}: {int(units.isna().sum())} row(s) have no device"
            )
        units = units.astype(str).to_numpy()
        num_devices = cfg.num_devices or len(np.unique(units))  # 0: one device per unit
        device = group_units(units, num_devices, data_rng(cfg.data_seed, 2), what="devices",
                             dataset=name)
    else:
        num_devices = cfg.num_devices
        device = split_records(y, num_devices, cfg.dirichlet_alpha, data_rng(cfg.data_seed, 2),
                               dataset=name)
    test = holdout_records(device, cfg.test_fraction, data_rng(cfg.data_seed, 1))
    cfg = estimate_private_ranges(cfg, frame, ~test)  # refuses what is neither declared nor estimated
    enc = table_encoding(cfg, frame, ~test)
    if not known:
        y = enc.labels(frame, where)
    data = assemble(
        name,
        enc.spec,
        enc.encode(frame),
        y,
        device,
        test,
        enc.classes,
        num_devices=num_devices,
        label_key=f"label-column={cfg.label_column!r}",
        public_loss="zero",
        public_statistics=enc.public_statistics,
    )
    estimated = cfg.estimated_ranges or cfg.estimated_categories
    if estimated and data.num_records != int(np.count_nonzero(~test)):  # pragma: no cover
        # the estimates' noise was calibrated on N = the training rows; the ledger's charge uses
        # the devices' sizes: they must be the same N
        raise RuntimeError(f"{where}: {data.num_records} training records in the devices, "
                           f"{int(np.count_nonzero(~test))} in the estimate")
    return dataclasses.replace(data, estimated_ranges=cfg.estimated_ranges,
                               estimated_categories=cfg.estimated_categories)


def _declared_table(cfg: DataConfig, path: str, key: str) -> tuple[FederatedData, np.ndarray, np.ndarray]:
    """A file encoded with the strict (fully declared) encoding: an empty
    FederatedData carrying the schema, and the file's inputs and labels.
    """
    where = f"{key}={path!r}"
    frame = read_table(path, cfg.max_records, key=key)
    check_columns(frame, cfg, where)
    frame = _labelled(frame, cfg, where)
    enc = table_encoding(cfg)
    with np.errstate(over="ignore"):  # an overflow to inf is refused just below
        x = np.ascontiguousarray(enc.encode(frame), dtype=np.float32)
    if not np.isfinite(x).all():
        raise DataError(f"{where}: non-finite input values after encoding (inf in a public column?)")
    y = enc.labels(frame, where)
    empty = FederatedData(
        name="csv",
        spec=enc.spec,
        devices=(),
        test_x=np.zeros((0, len(enc.spec.columns)), dtype=np.float32),
        test_y=np.zeros(0, dtype=np.int64),
        class_names=enc.classes,
        public_statistics=PublicStatistics.from_public(enc.spec, enc.public_statistics),
    )
    return empty, x, y


@lru_cache(maxsize=4)
def load_site(cfg: DataConfig, path: str) -> FederatedData:
    """One SuperNode's own file (``data-location = "node"``): all its rows are the
    training records of one device, ``devices[0]``; no held-out part. The node
    config's ``data-path`` names the file. Cached per process.
    """
    schema, x, y = _declared_table(cfg, path, "data-path")
    return dataclasses.replace(schema, devices=(DeviceData(x, y),))


def load_heldout(cfg: DataConfig) -> FederatedData:
    """The server's view with ``data-location = "node"``: the schema and the
    held-out records of ``test-path``; no training devices (they stay on the
    SuperNodes, which report only their record counts).
    """
    schema, x, y = _declared_table(cfg, cfg.test_path, "test-path")
    return dataclasses.replace(schema, test_x=x, test_y=y)
