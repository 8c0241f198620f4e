"""How the columns of a user table become model inputs: one encoding, every site.

A :class:`TableEncoding` maps a pandas frame to the model's input matrix and
label vector. It is built once (:func:`table_encoding`) from the declarations
of the configuration (``public-ranges``, ``public-categories``,
``private-ranges``, ``private-categories``, ``label-classes``) and, for what is
not declared, from statistics of a reference frame:

=========================  ==========================================  =============================
column                     declared                                    not declared (``central``)
=========================  ==========================================  =============================
numeric public             ``[low, high] → [−1, 1]`` (linear, not      standardised with the
                           clipped: Ψ is disclosed anyway)             training split's mean and std
text public                one-hot over the declared categories        one-hot over the training
                                                                       split's categories
numeric private            ``[low, high] → [−1, 1]``, clipped          refused, or with
                                                                       ``private-statistics =
                                                                       "estimate"`` a noisy range
                                                                       charged to the ε, clipped
text private               one-hot over the declared categories        refused, or with
                                                                       ``estimate`` the categories
                                                                       of a noisy thresholded
                                                                       histogram, charged
label                      index in ``label-classes``                  sorted distinct values (the
                                                                       label is public; refused when
                                                                       it is private, label-free)
=========================  ==========================================  =============================

Missing values encode to 0 (numeric: the range centre or the mean) or to an
all-zero one-hot block (missing or undeclared category).

Why declarations matter for privacy: scaling a private column by its min/max
or enumerating its values discloses statistics of the private features that
no ε accounts for; so a private column is declared or estimated with accounted
noise (:mod:`fedfdp.data.private_statistics`), never encoded with the data's own
statistics. Why they matter for deployments: with
``data-location = "node"`` every SuperNode encodes its own file, and only a
fully declared encoding (``strict``) guarantees that all sites and the server
map the same record to the same input vector without exchanging statistics of
their data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedfdp.config import DataConfig
from fedfdp.data.split import DataError
from fedfdp.features import FeatureSpec


def is_numeric(series: pd.Series) -> bool:
    """Whether a column holds numbers (or booleans)."""
    return bool(pd.api.types.is_numeric_dtype(series)) or bool(pd.api.types.is_bool_dtype(series))


#: A text column whose non-missing values are numbers in at least this share is a
#: numeric column with bad cells, refused (not silently one-hot encoded).
NUMERIC_SHARE = 0.9


def check_numeric_cells(series: pd.Series, column: str) -> None:
    """Refuse a column read as text although (nearly) all its values are numbers:
    name the column, the first bad cell's row and its value.
    """
    if is_numeric(series):
        return
    present = series.notna().to_numpy()
    if not present.any():
        return
    numbers = pd.to_numeric(series, errors="coerce").notna().to_numpy()
    share = numbers[present].mean()
    if share >= NUMERIC_SHARE and share < 1.0:
        bad = np.flatnonzero(present & ~numbers)
        row = int(bad[0])
        raise DataError(
            f"column {column!r}: value(s) {sorted({str(series.iloc[i]) for i in bad[:5]})} are not numbers "
            f"(first at data row {row + 1}: {str(series.iloc[row])!r}; {len(bad)} such cell(s) in a column "
            f"{100 * share:.1f}% numbers); fix the cell(s), or declare the column's categories to encode "
            "it as text"
        )


def refuse_undeclared(columns: Sequence[str], cfg: DataConfig) -> DataError:
    """The one-line refusal of private columns that are neither declared nor estimated
    (:func:`table_encoding`, and :func:`fedfdp.data.private_statistics.estimate_private_ranges`
    under ``private-statistics = "declared"``).
    """
    return DataError(
        f"private-columns: {list(columns)} have no declared encoding (private-statistics="
        f"{str(cfg.private_statistics)!r}); declare them (private-ranges = \"col=low:high\", "
        "private-categories = \"col=a|b\"), or set private-statistics = \"estimate\" to release noisy "
        "ranges and categories charged to the run's ε (estimation-epsilon)"
    )


def _as_float(series: pd.Series) -> np.ndarray:
    return pd.to_numeric(series, errors="coerce").astype("float64").to_numpy()


def _text(series: pd.Series) -> np.ndarray:
    """Values as text, ``None`` for missing."""
    return np.array([None if pd.isna(v) else str(v) for v in series], dtype=object)


@dataclass(frozen=True)
class ColumnEncoding:
    """The encoding of one table column.

    ``kind`` is ``range`` (``2(v − low)/(high − low) − 1``, clipped to
    [−1, 1] when ``clip``), ``standard`` (``(v − low)/high``: ``low`` is the
    mean and ``high`` the standard deviation) or ``onehot`` (over
    ``categories``).
    """

    column: str
    kind: str
    low: float = 0.0
    high: float = 1.0
    clip: bool = False
    categories: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        """Names of the encoded input columns."""
        if self.kind == "onehot":
            return [f"{self.column}={c}" for c in self.categories]
        return [self.column]

    def encode(self, series: pd.Series) -> np.ndarray:
        """The column's block of the input matrix, ``(n, len(names))`` float64."""
        if self.kind == "onehot":
            index = {c: i for i, c in enumerate(self.categories)}
            out = np.zeros((len(series), len(self.categories)), dtype=np.float64)
            for row, v in enumerate(_text(series)):
                k = index.get(v) if v is not None else None
                if k is not None:
                    out[row, k] = 1.0
            return out
        v = _as_float(series)
        bad = np.isnan(v) & ~series.isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            examples = sorted({str(x) for x in series[bad].head(5)})
            raise DataError(
                f"column {self.column!r}: value(s) {examples} are not numbers (first at data row {row + 1}: "
                f"{str(series.iloc[row])!r}; the column is encoded as numeric: "
                f"{'declared range' if self.kind == 'range' else 'numeric data'})"
            )
        inf = np.isinf(v)
        if inf.any():
            row = int(np.flatnonzero(inf)[0])
            raise DataError(
                f"column {self.column!r}: non-finite input values (data row {row + 1} holds {v[row]})"
            )
        if self.kind == "standard":
            scaled = (v - self.low) / (self.high if self.high > 0 else 1.0)
        else:
            scaled = 2.0 * (v - self.low) / (self.high - self.low) - 1.0
            if self.clip:
                scaled = np.clip(scaled, -1.0, 1.0)
        return np.nan_to_num(scaled, nan=0.0)[:, None]

    @property
    def centre(self) -> list[float]:
        """Public-mean imputation constants of the block (``mean`` public loss):
        the range centre 0, or ``1/K`` per category.
        """
        if self.kind == "onehot":
            return [1.0 / len(self.categories)] * len(self.categories)
        return [0.0]


@dataclass(frozen=True)
class TableEncoding:
    """Public and private column encodings plus the label classes of a table."""

    public: tuple[ColumnEncoding, ...]
    private: tuple[ColumnEncoding, ...]
    label_column: str
    classes: tuple[str, ...]

    @property
    def spec(self) -> FeatureSpec:
        """Which encoded columns are public (Ψ) and which private."""
        pub = [n for e in self.public for n in e.names]
        priv = [n for e in self.private for n in e.names]
        return FeatureSpec(columns=tuple(pub + priv), public=tuple(pub), private=tuple(priv))

    @property
    def public_statistics(self) -> list[float]:
        """Declared constants for ``mean`` imputation, one per private input column."""
        return [v for e in self.private for v in e.centre]

    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """Inputs ``(n, d)`` float64, in ``spec.columns`` order."""
        return np.concatenate([e.encode(frame[e.column]) for e in self.public + self.private], axis=1)

    def labels(self, frame: pd.DataFrame, where: str) -> np.ndarray:
        """Class indices of the (non-missing) labels of ``frame``."""
        return encode_label_values(frame[self.label_column], self.classes, where)


def _label_text(value: object) -> str:
    """A label as text; an integral float (a numeric column pandas read as float) as an integer."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


#: More distinct label values than this must be declared (``label-classes``).
MAX_UNDECLARED_CLASSES = 100


def label_classes(cfg: DataConfig, frame: pd.DataFrame | None) -> tuple[str, ...]:
    """``label-classes`` if declared, else the sorted distinct labels of ``frame``
    (at least two); ``frame = None`` (strict) requires the declaration.
    """
    if cfg.label_classes:
        return cfg.label_classes
    if frame is None:
        raise DataError("label-classes='': needed where every site encodes its own file")
    values = sorted({_label_text(v) for v in frame[cfg.label_column].to_numpy()})
    if len(values) > MAX_UNDECLARED_CLASSES:
        raise DataError(
            f"label-column={cfg.label_column!r}: {len(values)} distinct values (e.g. {values[:3]}): a "
            f"continuous label? A classifier over more than {MAX_UNDECLARED_CLASSES} classes needs "
            "them declared in label-classes; or bin the label into classes first"
        )
    if len(values) < 2:
        shown = values[0] if values else "none"
        raise DataError(
            f"label-column={cfg.label_column!r}: a single class ({shown!r}); a classifier needs at least two"
        )
    return tuple(values)


def encode_label_values(series: pd.Series, classes: Sequence[str], where: str) -> np.ndarray:
    """Class index of every label; a value outside ``classes`` is refused,
    naming the values and ``where`` they come from.
    """
    text = [_label_text(v) for v in series.to_numpy()]
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({v for v in text if v not in index})
    if unknown:
        raise DataError(
            f"label-classes={list(classes)}: {where} has label value(s) {unknown[:10]} that are not declared"
        )
    return np.array([index[v] for v in text], dtype=np.int64)


def table_encoding(
    cfg: DataConfig,
    frame: pd.DataFrame | None = None,
    train: np.ndarray | None = None,
) -> TableEncoding:
    """Build the encoding of ``cfg``'s columns.

    Parameters
    ----------
    cfg : DataConfig
        Column lists and declarations; a private column's range may also come from
        ``estimated-ranges`` (released with accounted noise,
        :func:`fedfdp.data.private_statistics.estimate_private_ranges`).
    frame : DataFrame, optional
        The reference table for undeclared **public** columns (statistics of its
        ``train`` rows) and the label classes. ``None``: strict, every column and the
        label classes must be declared. Private columns never read it.
    train : np.ndarray of bool, optional
        Training rows of ``frame`` (default: all).

    Raises
    ------
    DataError
        A private column neither declared nor estimated (one line naming the
        columns and both ways out); strict mode with an undeclared column or label
        classes.
    """
    if frame is not None and train is None:
        train = np.ones(len(frame), dtype=bool)

    def undeclared(col: str, side: str) -> DataError:
        return DataError(
            f"{side}-columns: column {col!r} has no declared encoding ({side}-ranges or "
            f"{side}-categories); needed where every site encodes its own file"
        )

    public: list[ColumnEncoding] = []
    ranges = {n: (lo, hi) for n, lo, hi in cfg.public_ranges}
    cats = dict(cfg.public_categories)
    for col in cfg.public_columns:
        if col in ranges:
            public.append(ColumnEncoding(col, "range", *ranges[col]))
        elif col in cats:
            public.append(ColumnEncoding(col, "onehot", categories=cats[col]))
        elif frame is None or train is None:  # strict
            raise undeclared(col, "public")
        else:
            check_numeric_cells(frame[col], col)
            if is_numeric(frame[col]):
                ref = _as_float(frame[col])[train]
                ref = ref[~np.isnan(ref)]
                mean = float(ref.mean()) if len(ref) else 0.0
                std = float(ref.std()) if len(ref) else 1.0
                public.append(ColumnEncoding(col, "standard", mean, std))
            else:
                categories = tuple(sorted({v for v in _text(frame[col])[train] if v is not None}))
                public.append(ColumnEncoding(col, "onehot", categories=categories))

    private: list[ColumnEncoding] = []
    ranges = {n: (lo, hi) for n, lo, hi in (*cfg.private_ranges, *cfg.estimated_ranges)}
    cats = dict((*cfg.private_categories, *cfg.estimated_categories))
    missing = [c for c in cfg.private_columns if c not in ranges and c not in cats]
    if missing:
        if frame is None:  # strict
            raise undeclared(missing[0], "private")
        raise refuse_undeclared(missing, cfg)
    for col in cfg.private_columns:
        if col in ranges:
            private.append(ColumnEncoding(col, "range", *ranges[col], clip=True))
        else:
            private.append(ColumnEncoding(col, "onehot", categories=cats[col]))

    enc = TableEncoding(tuple(public), tuple(private), cfg.label_column, label_classes(cfg, frame))
    names = list(enc.spec.columns)
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise DataError(f"public-columns/private-columns: encoded column names collide: {dup[:5]}")
    if not enc.spec.public:
        raise DataError(f"public-columns={list(cfg.public_columns)}: encode to no column (no values)")
    return enc


def check_columns(frame: pd.DataFrame, cfg: DataConfig, where: str, extra: Sequence[str] = ()) -> None:
    """Refuse a table that lacks a configured column, naming the key and the file."""
    available = list(frame.columns)
    for key, cols in (
        ("public-columns", list(cfg.public_columns)),
        ("private-columns", list(cfg.private_columns)),
        ("label-column", [cfg.label_column]),
        ("device-column", list(extra)),
    ):
        unknown = [c for c in cols if c not in frame.columns]
        if unknown:
            value = cols if key.endswith("columns") else cols[0]
            raise DataError(
                f"{key}={value!r}: column(s) {unknown} not in {where} "
                f"(columns: {available[:30]}{' ...' if len(available) > 30 else ''})"
            )
