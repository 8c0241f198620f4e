"""``criteo``: the paper's Criteo display-ads setting (file or synthetic).

File format (``data-path``): Criteo's ``train.txt`` / ``day_N`` — tab-separated,
40 fields per line: the 0/1 click label, 13 integer features ``I1..I13``, 26
categorical features ``C1..C26`` (8-hex-digit hashes); an empty field is
missing. ``max-records`` reads only the first rows (the paper used 40,000
training and 10,000 test records of day 0).

Without ``data-path`` a **synthetic** file of the same format is generated from
``data-seed`` (``num-devices × records-per-device`` lines) and goes through the
same encoder: heavy-tailed counts with per-feature missing rates, Zipf-
distributed categories with vocabularies of 10 to 10,000 values, and a
logistic click model in which the categories carry most of the signal and the
integers a little (the paper: categories alone ≈ 74 %, all ≈ 75 %). About 25 %
positives, like Criteo.

Encoding
    Integers: ``sign(v)·log(1 + |v|)`` standardised with the training split's
    statistics (public columns), missing → 0, plus a 0/1 missing indicator per
    integer. Categories: hashed one-hot — value ``v`` of field ``Cj`` sets
    column ``hash(Cj=v) mod hash-buckets`` to 1 (a fixed CRC-32 hash, no
    statistic of the data); a missing category sets nothing.
Ψ (public)
    The 13 integers, their 13 missing indicators, and the label.
Private
    The ``hash-buckets`` hashed category columns (all 26 categorical fields).
Public loss
    ``zero`` (declared: ``public-loss = "auto"`` picks it; the paper's):
    masking the categories removes them from the linear model,
    ``ℓ_pub = logistic(w_n·x_n, y)``; ``mean`` also imputes 0.
Model
    ``model = "logistic"``: (softmax) logistic regression over the hashed
    one-hot encoding, the paper's model.
Devices and held-out split
    ``test-fraction`` held out at random; the rest split over ``num-devices``
    devices, IID or by ``Dirichlet(dirichlet-alpha)``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from fedfdp.config import DataConfig
from fedfdp.data.base import FederatedData
from fedfdp.data.split import DataError, assemble, data_rng, holdout_records, split_records
from fedfdp.features import FeatureSpec

INT_FIELDS = tuple(f"I{i}" for i in range(1, 14))
CAT_FIELDS = tuple(f"C{i}" for i in range(1, 27))
FIELDS = ("label", *INT_FIELDS, *CAT_FIELDS)


def read_criteo(path: str | Path, max_records: int = 0, protected: bool = False) -> pd.DataFrame:
    """Read a Criteo TSV file as strings (``""`` = missing), columns :data:`FIELDS`;
    ``protected``: the label is protected (``dp``), a bad one is counted, not quoted.

    Raises
    ------
    DataError
        Missing file, a line without 40 fields, or a label other than 0/1.
    """
    from fedfdp.input_files import regular_file

    path = regular_file(path, "data-path", error=DataError)  # missing, a FIFO, a device: refused
    try:
        frame = pd.read_csv(
            path,
            sep="\t",
            header=None,
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            nrows=max_records or None,
            quoting=3,  # csv.QUOTE_NONE: hashes are bare
        )
    except (ValueError, pd.errors.ParserError) as exc:
        raise DataError(
            f"data-path={str(path)!r}: not a Criteo TSV file (40 tab-separated fields): {exc}"
        ) from exc
    if frame.shape[1] != len(FIELDS):
        raise DataError(
            f"data-path={str(path)!r}: {frame.shape[1]} fields per line; Criteo has 40 "
            "(label, 13 integers, 26 categories)"
        )
    frame.columns = list(FIELDS)
    bad = frame.loc[~frame["label"].isin(["0", "1"]), "label"]
    if len(bad) and protected:  # a protected label (dp) is never quoted: the count only
        raise DataError(f"data-path={str(path)!r}: {len(bad)} label(s) are not 0 or 1")
    if len(bad):
        raise DataError(f"data-path={str(path)!r}: label {bad.iloc[0]!r} is not 0 or 1")
    return frame


def synthetic_criteo(n: int, seed: int) -> pd.DataFrame:
    """``n`` synthetic lines in Criteo's format (strings, ``""`` = missing)."""
    rng = data_rng(seed, 20)
    columns: dict[str, list[str] | np.ndarray] = {}
    logit = np.full(n, -1.9)
    for name in INT_FIELDS:
        mu, s = rng.uniform(0.5, 4.0), rng.uniform(0.5, 1.5)
        values = np.floor(np.exp(rng.normal(mu, s, n))).astype(np.int64) - 1
        z = (np.log1p(np.maximum(values, 0)) - mu) / s
        logit += rng.normal(0, 0.15) * z
        text = values.astype(str).astype(object)
        text[rng.random(n) < rng.uniform(0.02, 0.45)] = ""
        columns[name] = text
    for j, name in enumerate(CAT_FIELDS):
        vocab = int(10 ** rng.uniform(1, 4))
        weights = 1.0 / np.arange(1, vocab + 1) ** 1.1
        idx = rng.choice(vocab, size=n, p=weights / weights.sum())
        effect = rng.normal(0, rng.uniform(0.1, 0.6), vocab)
        logit += effect[idx]
        hashes = np.array(
            [f"{zlib.crc32(f'{seed}:{j}:{v}'.encode()):08x}" for v in range(vocab)], dtype=object
        )
        text = hashes[idx]
        text[rng.random(n) < rng.uniform(0.0, 0.2)] = ""
        columns[name] = text
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    frame = pd.DataFrame({"label": label.astype(str), **columns})
    return frame[list(FIELDS)]


def _bucket(field: str, value: str, buckets: int) -> int:
    return zlib.crc32(f"{field}={value}".encode()) % buckets


def encode_criteo(
    frame: pd.DataFrame, test: np.ndarray, buckets: int, standardise: bool = True
) -> tuple[np.ndarray, np.ndarray, FeatureSpec]:
    """Encode Criteo lines (see the module docstring): ``(x, y, spec)``; ``standardise =
    False`` (the inputs are protected, ``dp``) keeps the integers' declared transform
    ``sign(v)·log(1 + |v|)`` without the training split's mean and std.
    """
    n = len(frame)
    y = frame["label"].astype(np.int64).to_numpy()
    public_cols, blocks = [], []
    missing_cols = []
    for name in INT_FIELDS:
        raw = frame[name].to_numpy()
        missing = raw == ""
        try:
            values = np.where(missing, "0", raw).astype(np.float64)
        except ValueError:  # the value is not quoted (under dp every field is protected)
            bad = sum(not v.lstrip("+-").isdigit() for v in raw[~missing])
            raise DataError(f"criteo field {name}: {bad} value(s) are not integers") from None
        z = np.sign(values) * np.log1p(np.abs(values))
        ref = z[~test & ~missing]
        if standardise:
            mean = ref.mean() if len(ref) else 0.0
            std = ref.std() if len(ref) else 1.0
            z = np.where(missing, 0.0, (z - mean) / (std if std > 0 else 1.0))
        else:  # the inputs are protected (dp): the declared transform alone, no statistic of the data
            z = np.where(missing, 0.0, z)
        blocks.append(z)
        public_cols.append(name)
        missing_cols.append(missing.astype(np.float64))
    blocks.extend(missing_cols)
    public_cols.extend(f"{name}_missing" for name in INT_FIELDS)
    private = np.zeros((n, buckets), dtype=np.float32)
    for name in CAT_FIELDS:
        raw = frame[name].to_numpy()
        codes = {v: _bucket(name, v, buckets) for v in pd.unique(raw) if v != ""}
        rows = np.flatnonzero(raw != "")
        private[rows, [codes[v] for v in raw[rows]]] = 1.0
    private_cols = tuple(f"hash_{b:05d}" for b in range(buckets))
    x = np.concatenate([np.stack(blocks, axis=1).astype(np.float32), private], axis=1)
    spec = FeatureSpec(
        columns=tuple(public_cols) + private_cols, public=tuple(public_cols), private=private_cols
    )
    return x, y, spec


def load_criteo(cfg: DataConfig) -> FederatedData:
    """Load ``data-path`` or generate synthetic lines (see the module docstring)."""
    if cfg.hash_buckets < 2:
        raise DataError(f"hash-buckets={cfg.hash_buckets}: must be at least 2")
    if cfg.data_path:
        frame = read_criteo(cfg.data_path, cfg.max_records, protected=cfg.protected.label)
    else:
        frame = synthetic_criteo(cfg.num_devices * cfg.records_per_device, cfg.data_seed)
    test = holdout_records(np.zeros(len(frame)), cfg.test_fraction, data_rng(cfg.data_seed, 1))
    x, y, spec = encode_criteo(frame, test, cfg.hash_buckets, standardise=not cfg.protected.inputs)
    device = np.full(len(y), -1, dtype=np.int64)
    device[~test] = split_records(
        y[~test], cfg.num_devices, cfg.dirichlet_alpha, data_rng(cfg.data_seed, 2), dataset="criteo"
    )
    return assemble(
        "criteo",
        spec,
        x,
        y,
        device,
        test,
        ("no-click", "click"),
        num_devices=cfg.num_devices,
        public_statistics=[0.0] * len(spec.private),
        public_loss="zero",
    )
