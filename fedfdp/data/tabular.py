"""``csv``: any user table (CSV or Parquet) with a declared public/private split.

Keys: ``data-path`` (``.csv``, ``.csv.gz``, ``.tsv`` or ``.parquet``/``.pq``,
chosen by extension), ``public-columns``, ``private-columns``,
``label-column``, optional ``device-column``, ``private-ranges``,
``private-categories``, ``dirichlet-alpha``, ``max-records``.

Ψ (public)
    The ``public-columns`` and the label.
Private
    The ``private-columns``. Columns in neither list are ignored.
Public loss
    ``gaussian`` (default), ``zero``, or ``mean`` (the centre of each declared
    range, ``1/K`` for each of ``K`` declared categories).

Encoding
    * Numeric public columns are standardised with the training split's mean
      and std (statistics of public columns: public); missing → 0.
    * Non-numeric public columns are one-hot encoded over the categories seen
      in the training split; missing or unseen → all zeros.
    * Numeric private columns are mapped from their **declared** range
      (``private-ranges``, e.g. ``"age=0:120,income=0:500000"``) to [−1, 1],
      values outside clipped; missing → 0 (the range centre).
    * Non-numeric private columns are one-hot encoded over their **declared**
      categories (``private-categories``, e.g. ``"city=Paris|Lyon|Nice"``);
      missing or undeclared values → all zeros.
    * Scaling or encoding a private column with statistics computed from the
      data (its min/max, its set of values) is itself a disclosure that no ε
      accounts for. When a private column has no declaration, the loader still
      runs — with the min/max or the categories of the data — and emits a
      :class:`PrivateStatisticsWarning` naming the columns.
Labels
    Any values; rows with a missing label are dropped. Classes are the sorted
    distinct values (as text).
Devices and held-out split
    With ``device-column`` each distinct value is a natural device, and whole
    natural devices are grouped into ``num-devices`` devices (at most the
    number of distinct values). Without it the rows are split over
    ``num-devices`` devices IID or by ``Dirichlet(dirichlet-alpha)`` label
    mixes. In both cases ``test-fraction`` of every device's rows is held out.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from fedfdp.config import DataConfig
from fedfdp.data.base import FederatedData
from fedfdp.data.split import (
    DataError,
    assemble,
    data_rng,
    encode_labels,
    group_units,
    holdout_records,
    split_records,
)
from fedfdp.features import FeatureSpec


class PrivateStatisticsWarning(UserWarning):
    """A private column was scaled or encoded with statistics of the data itself."""


def read_table(path: str | Path, max_records: int = 0) -> pd.DataFrame:
    """Read a CSV/TSV or Parquet file chosen by its extension."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data-path={str(path)!r}: no such file")
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            frame = pd.read_parquet(path)
            if max_records:
                frame = frame.head(max_records)
        elif name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz", ".txt")):
            sep = "\t" if ".tsv" in name else ","
            frame = pd.read_csv(path, sep=sep, nrows=max_records or None)
        else:
            raise DataError(
                f"data-path={str(path)!r}: unknown extension; use .csv, .csv.gz, .tsv or .parquet"
            )
    except DataError:
        raise
    except Exception as exc:  # parser errors of pandas/pyarrow
        raise DataError(f"data-path={str(path)!r}: cannot be read ({type(exc).__name__}: {exc})") from exc
    frame.columns = [str(c) for c in frame.columns]
    if len(frame) == 0:
        raise DataError(f"data-path={str(path)!r}: no rows")
    return frame


def _is_numeric(series: pd.Series) -> bool:
    return bool(pd.api.types.is_numeric_dtype(series)) or bool(pd.api.types.is_bool_dtype(series))


def _as_float(series: pd.Series) -> np.ndarray:
    return pd.to_numeric(series, errors="coerce").astype("float64").to_numpy()


def _text(series: pd.Series) -> np.ndarray:
    """Values as text, ``None`` for missing."""
    return np.array([None if pd.isna(v) else str(v) for v in series], dtype=object)


def _one_hot(values: np.ndarray, categories: tuple[str, ...]) -> np.ndarray:
    index = {c: i for i, c in enumerate(categories)}
    out = np.zeros((len(values), len(categories)), dtype=np.float64)
    for row, v in enumerate(values):
        k = index.get(v) if v is not None else None
        if k is not None:
            out[row, k] = 1.0
    return out


def load_csv(cfg: DataConfig) -> FederatedData:
    """Load a user table (see the module docstring)."""
    frame = read_table(cfg.data_path, cfg.max_records)
    available = list(frame.columns)
    for key, cols in (
        ("public-columns", list(cfg.public_columns)),
        ("private-columns", list(cfg.private_columns)),
        ("label-column", [cfg.label_column]),
        ("device-column", [cfg.device_column] if cfg.device_column else []),
    ):
        unknown = [c for c in cols if c not in frame.columns]
        if unknown:
            value = cols if key.endswith("columns") else cols[0]
            raise DataError(
                f"{key}={value!r}: column(s) {unknown} not in {cfg.data_path!r} "
                f"(columns: {available[:30]}{' ...' if len(available) > 30 else ''})"
            )
    frame = frame[frame[cfg.label_column].notna()].reset_index(drop=True)
    if len(frame) == 0:
        raise DataError(f"label-column={cfg.label_column!r}: every label is missing")
    y, classes = encode_labels(frame[cfg.label_column].to_numpy(), f"label-column={cfg.label_column!r}")

    if cfg.device_column:
        units = frame[cfg.device_column]
        if units.isna().any():
            raise DataError(
                f"device-column={cfg.device_column!r}: {int(units.isna().sum())} row(s) have no device"
            )
        units = units.astype(str).to_numpy()
        device = group_units(units, cfg.num_devices, data_rng(cfg.data_seed, 2), what="devices",
                             dataset="csv")
    else:
        device = split_records(y, cfg.num_devices, cfg.dirichlet_alpha, data_rng(cfg.data_seed, 2),
                               dataset="csv")
    test = holdout_records(device, cfg.test_fraction, data_rng(cfg.data_seed, 1))
    train = ~test

    ranges = {n: (lo, hi) for n, lo, hi in cfg.private_ranges}
    declared_cats = dict(cfg.private_categories)
    blocks: list[np.ndarray] = []
    public_names: list[str] = []
    private_names: list[str] = []
    stats: list[float] = []
    computed: list[str] = []

    for col in cfg.public_columns:
        series = frame[col]
        if _is_numeric(series):
            v = _as_float(series)
            ref = v[train & ~np.isnan(v)]
            mean = float(ref.mean()) if len(ref) else 0.0
            std = float(ref.std()) if len(ref) else 1.0
            blocks.append(np.nan_to_num((v - mean) / (std if std > 0 else 1.0), nan=0.0)[:, None])
            public_names.append(col)
        else:
            text = _text(series)
            cats = tuple(sorted({v for v in text[train] if v is not None}))
            blocks.append(_one_hot(text, cats))
            public_names.extend(f"{col}={c}" for c in cats)

    for col in cfg.private_columns:
        series = frame[col]
        if col in declared_cats or not _is_numeric(series):
            text = _text(series)
            if col in declared_cats:
                cats = declared_cats[col]
            else:
                cats = tuple(sorted({v for v in text if v is not None}))
                computed.append(f"{col} (categories)")
            if not cats:
                raise DataError(f"private-columns: column {col!r} has no values")
            blocks.append(_one_hot(text, cats))
            private_names.extend(f"{col}={c}" for c in cats)
            stats.extend([1.0 / len(cats)] * len(cats))
        else:
            v = _as_float(series)
            if col in ranges:
                lo, hi = ranges[col]
            else:
                seen = v[~np.isnan(v)]
                if len(seen) == 0:
                    raise DataError(f"private-columns: column {col!r} has no values")
                lo, hi = float(seen.min()), float(seen.max())
                if hi <= lo:
                    hi = lo + 1.0
                computed.append(f"{col} (min/max)")
            scaled = np.clip(2.0 * (v - lo) / (hi - lo) - 1.0, -1.0, 1.0)
            blocks.append(np.nan_to_num(scaled, nan=0.0)[:, None])
            private_names.append(col)
            stats.append(0.0)

    if computed:
        warnings.warn(
            f"private column(s) {computed} of {cfg.data_path!r} were scaled/encoded with statistics "
            "computed from the data, which discloses them outside the privacy guarantee; declare "
            "private-ranges (numeric) and private-categories (text) in the configuration",
            PrivateStatisticsWarning,
            stacklevel=2,
        )
    names = public_names + private_names
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise DataError(f"public-columns/private-columns: encoded column names collide: {dup[:5]}")
    if not public_names:
        raise DataError(f"public-columns={list(cfg.public_columns)}: encode to no column (no values)")
    spec = FeatureSpec(columns=tuple(names), public=tuple(public_names), private=tuple(private_names))
    return assemble(
        "csv",
        spec,
        np.concatenate(blocks, axis=1),
        y,
        device,
        test,
        classes,
        num_devices=cfg.num_devices,
        label_key=f"label-column={cfg.label_column!r}",
        public_statistics=stats,
    )
