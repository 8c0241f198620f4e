"""How the columns of a user table become model inputs: one encoding, every site.

A :class:`TableEncoding` maps a pandas frame to the model's input matrix and
label vector. It is built once (:func:`table_encoding`) from the declarations
of the configuration (``public-ranges``, ``public-categories``,
``private-ranges``, ``private-categories``, ``label-classes``) and, for what is
not declared, from statistics of a reference frame:

=========================  ==========================================  =============================
column                     declared                                    not declared (``central``)
=========================  ==========================================  =============================
numeric, disclosed         ``[low, high] → [−1, 1]`` (linear, not      standardised with the
                           clipped: Ψ is disclosed anyway)             training split's mean and std
text, disclosed            one-hot over the declared categories        one-hot over the training
                                                                       split's categories
numeric, protected         ``[low, high] → [−1, 1]`` (a private        refused, or with
                           column's clipped)                           ``private-statistics =
                                                                       "estimate"`` a noisy range
                                                                       charged to the ε, clipped
text, protected            one-hot over the declared categories        refused, or with
                                                                       ``estimate`` the categories
                                                                       of a noisy thresholded
                                                                       histogram, charged
label, disclosed           index in ``label-classes``                  sorted distinct values
label, protected           index in ``label-classes``                  refused, or with ``estimate``
                                                                       the released classes and
                                                                       :data:`UNRELEASED_LABEL`
=========================  ==========================================  =============================

*Protected* is decided by the mode's relation, in one place
(:func:`fedfdp.config.protection.protected_columns`, read from ``DataConfig.protected``):
the private columns; under label-DP the label too; under ``corrdp`` every input
column; under ``dp`` the whole record, every column and the label. Everything else is
*disclosed* (Ψ under FDP). A refusal of a protected cell names its column and the count
of bad cells, never the value or its row (:func:`bad_cells`).

Missing values encode to 0 (numeric: the range centre or the mean) or to an
all-zero one-hot block (missing or undeclared category).

Why declarations matter for privacy: scaling a protected column by its min/max
or enumerating its values (or the label's) discloses statistics of what the relation
protects that no ε accounts for (under ``dp`` a rare label would add an output to the
model); so a protected column is declared or estimated with accounted noise
(:mod:`fedfdp.data.private_statistics`), never encoded with the data's own
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

from fedfdp.config import DataConfig, Protected
from fedfdp.data.split import DataError
from fedfdp.features import FeatureSpec


def is_numeric(series: pd.Series) -> bool:
    """Whether a column holds numbers (or booleans)."""
    return bool(pd.api.types.is_numeric_dtype(series)) or bool(pd.api.types.is_bool_dtype(series))


#: A text column whose non-missing values are numbers in at least this share is a
#: numeric column with bad cells, refused (not silently one-hot encoded).
NUMERIC_SHARE = 0.9


def bad_cells(column: str, problem: str, series: pd.Series, bad: np.ndarray, protected: bool,
              context: str = "", advice: str = "") -> DataError:
    """The one-line refusal of the cells ``bad`` (a boolean mask over ``series``) of ``column``
    that are ``problem`` (``"not numbers"``).

    A cell of a **protected** column (:func:`fedfdp.config.protection.protected_columns`: a
    private column; under ``dp`` every column and the label) is never quoted, nor its row:
    the message names the column, the problem and the number of such cells, so no private
    value, and no record's position, leaves the run through it. A cell of a column the
    relation discloses (Ψ under FDP) is quoted with its data row, to help fix the file.
    """
    rows = np.flatnonzero(bad)
    tail = (f"; {context}" if context else "") + ")" + (f"; {advice}" if advice else "")
    if protected:
        return DataError(f"column {column!r}: {len(rows)} cell(s) are {problem} (a protected column: its "
                         f"values and rows are not shown{tail}")
    row = int(rows[0])
    examples = sorted({str(series.iloc[i]) for i in rows[:5]})
    return DataError(f"column {column!r}: value(s) {examples} are {problem} (first at data row {row + 1}: "
                     f"{str(series.iloc[row])!r}; {len(rows)} such cell(s){tail}")


def check_numeric_cells(series: pd.Series, column: str, protected: bool) -> None:
    """Refuse a column read as text although (nearly) all its values are numbers
    (:func:`bad_cells`: the column and the count; a disclosed column's first bad cell too).
    """
    if is_numeric(series):
        return
    present = series.notna().to_numpy()
    if not present.any():
        return
    numbers = pd.to_numeric(series, errors="coerce").notna().to_numpy()
    share = numbers[present].mean()
    if share >= NUMERIC_SHARE and share < 1.0:
        raise bad_cells(
            column, "not numbers", series, present & ~numbers, protected,
            f"in a column {100 * share:.1f}% numbers",
            "fix the cell(s), or declare the column's categories to encode it as text",
        )


def refuse_undeclared(columns: Sequence[str], cfg: DataConfig) -> DataError:
    """The one-line refusal of protected columns (:func:`fedfdp.config.protection.protected_columns`)
    that are neither declared nor estimated (:func:`table_encoding`, and
    :func:`fedfdp.data.private_statistics.estimate_private_ranges` under ``private-statistics =
    "declared"``): it names them and both ways out (only the declaration under ``corrdp``, whose
    accountant composes no estimate).
    """
    private = [c for c in columns if c in cfg.private_columns]
    public = [c for c in columns if c in cfg.public_columns]
    label = [c for c in columns if c == cfg.label_column]
    if not public and not label:
        head = f"private-columns: {list(columns)} have no declared encoding"
    else:
        scope = {Protected.WHOLE_RECORD: "the whole record", Protected.INPUTS: "every input column",
                 Protected.PRIVATE_COLUMNS_AND_LABEL: "the label"}.get(cfg.protected, "the private columns")
        head = (f"the mode's relation protects {scope}, and {list(columns)} have no declared encoding (no "
                "statistic of a protected column or label is read off the data)")
    declare = []
    if private:
        declare.append("private-ranges = \"col=low:high\", private-categories = \"col=a|b\"")
    if public:
        declare.append("public-ranges = \"col=low:high\", public-categories = \"col=a|b\"")
    if label:
        declare.append("label-classes = \"a|b\"")
    out = f"declare them ({', '.join(declare)})"
    if cfg.protected is not Protected.INPUTS:
        out += (", or set private-statistics = \"estimate\" to release noisy ranges and categories "
                "charged to the run's ε (estimation-epsilon)")
    return DataError(f"{head} (private-statistics={str(cfg.private_statistics)!r}); {out}")


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
    ``categories``). ``protected``: the relation protects the column, so a refusal of its
    cells quotes neither a value nor a row (:func:`bad_cells`).
    """

    column: str
    kind: str
    low: float = 0.0
    high: float = 1.0
    clip: bool = False
    categories: tuple[str, ...] = ()
    protected: bool = False

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
            raise bad_cells(
                self.column, "not numbers", series, bad, self.protected, "the column is encoded as numeric: "
                f"{'declared range' if self.kind == 'range' else 'numeric data'}",
            )
        inf = np.isinf(v)
        if inf.any():
            raise bad_cells(self.column, "non-finite input values", series, inf, self.protected)
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
    label_protected: bool = False

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
        return encode_label_values(frame[self.label_column], self.classes, where, self.label_protected)


def label_text(value: object) -> str:
    """A label as text; an integral float (a numeric column pandas read as float) as an integer."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


#: More distinct label values than this must be declared (``label-classes``).
MAX_UNDECLARED_CLASSES = 100


#: The class of every label value a categories estimate did not release (a rare value):
#: with ``private-statistics = "estimate"`` and a protected label, the classes are the
#: released values and this one, always, so the model's shape is a function of the noisy
#: release alone and no record is refused for holding a rare label.
UNRELEASED_LABEL = "(unreleased)"


def label_classes(cfg: DataConfig, frame: pd.DataFrame | None) -> tuple[str, ...]:
    """``label-classes`` if declared; a protected label (``cfg.protected.label``) otherwise
    takes the classes its charged estimate released (``estimated-categories``) and
    :data:`UNRELEASED_LABEL`, or is refused; a disclosed label the sorted distinct labels
    of ``frame`` (at least two); ``frame = None`` (strict) requires the declaration.
    """
    if cfg.label_classes:
        return cfg.label_classes
    if cfg.protected.label:
        released = dict(cfg.estimated_categories).get(cfg.label_column)
        if released is None:
            raise refuse_undeclared([cfg.label_column], cfg)
        return (*(c for c in released if c != UNRELEASED_LABEL), UNRELEASED_LABEL)  # the marker once
    if frame is None:
        raise DataError("label-classes='': needed where every site encodes its own file")
    values = sorted({label_text(v) for v in frame[cfg.label_column].to_numpy()})
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


def encode_label_values(series: pd.Series, classes: Sequence[str], where: str,
                        protected: bool = False) -> np.ndarray:
    """Class index of every label. A value outside ``classes`` is :data:`UNRELEASED_LABEL`'s
    when the classes end with it (an estimate's), else refused: naming the values and
    ``where`` they come from, or, for a ``protected`` label, only their number.
    """
    text = [label_text(v) for v in series.to_numpy()]
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({v for v in text if v not in index})
    if unknown and classes and classes[-1] == UNRELEASED_LABEL:
        other = len(classes) - 1
        return np.array([index.get(v, other) for v in text], dtype=np.int64)
    if unknown:
        if protected:
            count = sum(v not in index for v in text)
            raise DataError(
                f"label-classes={list(classes)}: {where} has {count} label(s) that are not declared (the "
                "label is protected: its values and rows are not shown)"
            )
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
        Column lists and declarations; a protected column's encoding may also come from
        ``estimated-ranges`` / ``estimated-categories`` (released with accounted noise,
        :func:`fedfdp.data.private_statistics.estimate_private_ranges`).
    frame : DataFrame, optional
        The reference table for undeclared **disclosed** columns (statistics of its
        ``train`` rows) and a disclosed label's classes. ``None``: strict, every column
        and the label classes must be declared. Protected columns
        (:func:`fedfdp.config.protection.protected_columns`: the private ones; under ``dp``
        every column and the label, under ``corrdp`` every input column) never read it.
    train : np.ndarray of bool, optional
        Training rows of ``frame`` (default: all).

    Raises
    ------
    DataError
        A protected column neither declared nor estimated (one line naming the
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

    estimated_ranges = {n: (lo, hi) for n, lo, hi in cfg.estimated_ranges}
    estimated_categories = dict(cfg.estimated_categories)
    inputs = cfg.protected.inputs
    missing: list[str] = []
    public: list[ColumnEncoding] = []
    ranges = {n: (lo, hi) for n, lo, hi in cfg.public_ranges}
    cats = dict(cfg.public_categories)
    for col in cfg.public_columns:
        if col in ranges:
            public.append(ColumnEncoding(col, "range", *ranges[col], protected=inputs))
        elif col in cats:
            public.append(ColumnEncoding(col, "onehot", categories=cats[col], protected=inputs))
        elif inputs and col in estimated_ranges:
            public.append(ColumnEncoding(col, "range", *estimated_ranges[col], clip=True, protected=True))
        elif inputs and col in estimated_categories:
            public.append(ColumnEncoding(col, "onehot", categories=estimated_categories[col], protected=True))
        elif frame is None or train is None:  # strict
            raise undeclared(col, "public")
        elif inputs:
            missing.append(col)
        else:
            check_numeric_cells(frame[col], col, protected=False)
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
    ranges = {n: (lo, hi) for n, lo, hi in cfg.private_ranges} | estimated_ranges
    cats = dict(cfg.private_categories) | estimated_categories
    missing += [c for c in cfg.private_columns if c not in ranges and c not in cats]
    if cfg.protected.label and not cfg.label_classes and cfg.label_column not in estimated_categories:
        missing.append(cfg.label_column)
    if missing:
        if frame is None:  # strict
            raise undeclared(missing[0], "private")
        raise refuse_undeclared(missing, cfg)
    for col in cfg.private_columns:
        if col in ranges:
            private.append(ColumnEncoding(col, "range", *ranges[col], clip=True, protected=True))
        else:
            private.append(ColumnEncoding(col, "onehot", categories=cats[col], protected=True))

    enc = TableEncoding(tuple(public), tuple(private), cfg.label_column, label_classes(cfg, frame),
                        cfg.protected.label)
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
