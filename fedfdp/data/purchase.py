"""``purchase100``: the paper's Purchase100 setting (file or synthetic).

File format (``data-path``): the public ``dataset_purchase`` file — no header,
comma-separated, 601 fields per line: the label (an integer 1–100) then 600
binary purchase flags. ``max-records`` reads only the first rows.

Without ``data-path`` a **synthetic** table of the same shape is generated
from ``data-seed`` (``num-devices × records-per-device`` records): 100 customer
clusters, each with its own purchase probabilities over the 600 products (a
common sparse popularity profile plus 30 cluster-signature products bought
with probability 0.3–0.8); a record draws its cluster uniformly, then each
flag independently. It has Purchase100's shape and sparsity, not its exact
distribution.

Ψ (public)
    ``num-public-features`` (default 100) of the 600 features, chosen at
    random by ``data-seed`` (fixed for the dataset), and the label.
Private
    The other 500 features.
Public loss
    ``zero`` (declared: ``public-loss = "auto"`` picks it): a private flag
    masked to 0, "not bought", the typical value of a sparse binary feature.
    The paper's choice, ``gaussian`` (N(0, 1) padding), is far from that
    distribution: on the synthetic table (20 × 200 records, the 600-300-100 MLP,
    q = 1/16, ε = 2, seed 0, defaults otherwise) ``fdp`` reached 85.4 % with
    zero masking and 32.9 % with Gaussian padding (public alone: 32.2 %).
Model
    The paper's 600-300-100 MLP: ``model = "mlp"``, ``hidden-sizes = "300"``;
    the paper trains with sampling rate 1/16 and noise multiplier about 1.
Devices and held-out split
    ``test-fraction`` of the records is held out at random; the rest is split
    over ``num-devices`` devices, IID or by ``Dirichlet(dirichlet-alpha)``
    label mixes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedfdp.config import DataConfig
from fedfdp.data.base import FederatedData
from fedfdp.data.split import DataError, assemble, data_rng, holdout_records, split_records
from fedfdp.features import FeatureSpec

NUM_FEATURES = 600
NUM_CLASSES = 100
COLUMNS = tuple(f"f{i:03d}" for i in range(NUM_FEATURES))
CLASS_NAMES = tuple(str(c) for c in range(1, NUM_CLASSES + 1))


def read_purchase(
    path: str | Path, max_records: int = 0, protected: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Read a ``dataset_purchase`` file: ``(x (n, 600) float32, y (n,) in 0..99)``;
    ``protected``: the label is protected (``dp``), a bad one is counted, not quoted.

    Raises
    ------
    DataError
        Missing file, a line without 601 fields, a non-numeric field, or a
        label outside 1–100; the message names ``data-path`` and the problem.
    """
    from fedfdp.input_files import regular_file

    path = regular_file(path, "data-path", error=DataError)  # missing, a FIFO, a device: refused
    try:
        frame = pd.read_csv(path, header=None, nrows=max_records or None, dtype=np.float64)
    except (ValueError, pd.errors.ParserError) as exc:  # the parser's text may quote a cell: not shown
        raise DataError(
            f"data-path={str(path)!r}: not a Purchase100 file (601 numeric comma-separated "
            f"fields per line: label 1-100, then 600 features; {type(exc).__name__})"
        ) from None
    if frame.shape[1] != NUM_FEATURES + 1:
        raise DataError(
            f"data-path={str(path)!r}: {frame.shape[1]} fields per line; Purchase100 has 601 "
            "(label 1-100, then 600 features)"
        )
    if frame.isna().any().any():
        raise DataError(f"data-path={str(path)!r}: empty fields; Purchase100 has none")
    labels = frame.iloc[:, 0].to_numpy()
    bad = labels[(labels != np.round(labels)) | (labels < 1) | (labels > NUM_CLASSES)]
    if len(bad) and protected:
        raise DataError(f"data-path={str(path)!r}: {len(bad)} label(s) outside 1-100")
    if len(bad):
        raise DataError(f"data-path={str(path)!r}: label {float(bad[0]):g} outside 1-100")
    return frame.iloc[:, 1:].to_numpy(dtype=np.float32), labels.astype(np.int64) - 1


def synthetic_purchase(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A Purchase100-shaped table of ``n`` records (see the module docstring)."""
    rng = data_rng(seed, 10)
    popularity = rng.beta(0.4, 12.0, size=NUM_FEATURES)
    probs = np.tile(popularity, (NUM_CLASSES, 1))
    for c in range(NUM_CLASSES):
        signature = rng.choice(NUM_FEATURES, size=30, replace=False)
        probs[c, signature] = rng.uniform(0.3, 0.8, size=30)
    y = rng.integers(0, NUM_CLASSES, size=n)
    x = (rng.random((n, NUM_FEATURES)) < probs[y]).astype(np.float32)
    return x, y.astype(np.int64)


def public_features(num_public: int, seed: int) -> tuple[str, ...]:
    """The public columns: ``num_public`` of the 600, random but fixed by ``seed``."""
    if not 1 <= num_public < NUM_FEATURES:
        raise DataError(f"num-public-features={num_public}: must be in [1, {NUM_FEATURES - 1}]")
    chosen = np.sort(data_rng(seed, 11).choice(NUM_FEATURES, size=num_public, replace=False))
    return tuple(COLUMNS[i] for i in chosen)


def load_purchase100(cfg: DataConfig) -> FederatedData:
    """Load ``data-path`` or generate the synthetic table (see the module docstring)."""
    if cfg.data_path:
        x, y = read_purchase(cfg.data_path, cfg.max_records, protected=cfg.protected.label)
    else:
        x, y = synthetic_purchase(cfg.num_devices * cfg.records_per_device, cfg.data_seed)
    public = public_features(cfg.num_public_features, cfg.data_seed)
    private = tuple(c for c in COLUMNS if c not in set(public))
    test = holdout_records(np.zeros(len(y)), cfg.test_fraction, data_rng(cfg.data_seed, 1))
    device = np.full(len(y), -1, dtype=np.int64)
    device[~test] = split_records(
        y[~test], cfg.num_devices, cfg.dirichlet_alpha, data_rng(cfg.data_seed, 2), dataset="purchase100"
    )
    spec = FeatureSpec(columns=COLUMNS, public=public, private=private)
    return assemble(
        "purchase100",
        spec,
        x,
        y,
        device,
        test,
        CLASS_NAMES,
        num_devices=cfg.num_devices,
        public_statistics=[0.0] * len(private),
        public_loss="zero",
    )
