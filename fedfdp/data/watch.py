"""``watch``: real smartwatch recordings of shoulder-rehabilitation exercises.

Source: ``seglearn/data/watch_dataset.npy`` shipped inside the ``seglearn``
package (BSD licence; install with ``pip install 'fedfdp[datasets]'``), read
offline from the installed package. 140 recordings of 6 channels at 50 Hz —
accelerometer ``ax, ay, az`` (g) and gyroscope ``wx, wy, wz`` (rad/s) — of
7 exercises (``PEN, ABD, FEL, IR, ER, TRAP, ROW``) by 10 subjects, 14
recordings each.

Records
    Each recording is cut into non-overlapping windows of ``window-size``
    samples (default 100 = 2 s; the tail shorter than a window is dropped).
    A window's features are, per channel, ``mean, std, min, max`` and the mean
    absolute first difference (30 features); its label is the exercise.
Ψ (public)
    The 15 gyroscope features (``w*_*``) and the label: rotation rates say how
    the arm moves, not where it is.
Private
    The 15 accelerometer features (``a*_*``): they carry the wrist's
    orientation with respect to gravity, i.e. posture.
Public loss
    ``zero`` (declared: ``public-loss = "auto"`` picks it, as for the synthetic
    fleet, where zero masking beat Gaussian padding on the held-out split);
    ``gaussian`` and ``mean`` (0 g, a declared constant) also work.
Scaling
    Gyroscope features are standardised with their training-split mean and
    std — statistics of public columns only. Accelerometer features are
    divided by the declared constant 1 g (no statistic of the private data).
Devices and held-out split
    One subject is one natural device; ``num-devices`` (at most 10) groups whole
    subjects. The held-out split takes whole recordings (``test-fraction`` of
    the recordings of every exercise, by ``data-seed``), so windows of one
    recording never sit on both sides.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from fedfdp.config import DataConfig
from fedfdp.data.base import FederatedData
from fedfdp.data.split import DataError, assemble, data_rng, group_units, holdout_units, require
from fedfdp.features import FeatureSpec

CHANNELS = ("ax", "ay", "az", "wx", "wy", "wz")
STATS = ("mean", "std", "min", "max", "absdiff")
PRIVATE_CHANNELS = ("ax", "ay", "az")
PUBLIC_CHANNELS = ("wx", "wy", "wz")
PUBLIC_COLUMNS = tuple(f"{c}_{s}" for c in PUBLIC_CHANNELS for s in STATS)
PRIVATE_COLUMNS = tuple(f"{c}_{s}" for c in PRIVATE_CHANNELS for s in STATS)
#: Declared scale of the accelerometer (private) features: 1 g.
ACCEL_SCALE_G = 1.0


def watch_file() -> str:
    """Path of ``watch_dataset.npy`` inside the installed ``seglearn`` package."""
    seglearn = require("seglearn", "watch")
    if seglearn.__file__ is None:
        raise DataError("dataset='watch': the installed seglearn package has no file location")
    path = os.path.join(os.path.dirname(seglearn.__file__), "data", "watch_dataset.npy")
    if not os.path.isfile(path):
        raise DataError(f"dataset='watch': {path!r} not found in the installed seglearn package")
    return path


def window_features(signal: np.ndarray, window: int) -> np.ndarray:
    """Per-window features of one recording ``(T, 6)`` → ``(T // window, 30)``,
    ordered channel by channel as ``mean, std, min, max, absdiff``.
    """
    k = len(signal) // window
    w = signal[: k * window].reshape(k, window, signal.shape[1])
    feats = [
        w.mean(1),
        w.std(1),
        w.min(1),
        w.max(1),
        np.abs(np.diff(w, axis=1)).mean(1),
    ]
    # (k, stats, channels) -> (k, channels, stats)
    return np.stack(feats, axis=1).transpose(0, 2, 1).reshape(k, -1)


#: SHA-256 of the pickled dataset file seglearn ships (1.2.5). The file can only be read
#: by unpickling, which can run code: only a file with a known digest is unpickled.
KNOWN_WATCH_DIGESTS = frozenset({"eb122f23cdf06ef6bd6c6c5312958ec5cf9d038e2e6d457b8081662c75a42537"})


def unpickle_known(path: Path | str) -> dict:
    """The dataset dict of ``path``, unpickled only if its SHA-256 is a known one
    (:data:`KNOWN_WATCH_DIGESTS`); a replaced or unknown file is refused, naming it.
    """
    import hashlib

    raw = Path(path).read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest not in KNOWN_WATCH_DIGESTS:
        raise DataError(f"{path}: unknown file (sha256 {digest[:16]}...); it is a pickle, which can run code "
                        "when loaded, so only the file seglearn 1.2.5 ships is read")
    return np.load(io.BytesIO(raw), allow_pickle=True).item()


def load_watch(cfg: DataConfig) -> FederatedData:
    """Load the smartwatch exercises (see the module docstring for Ψ)."""
    if cfg.window_size < 4:
        raise DataError(f"window-size={cfg.window_size}: must be at least 4 samples")
    raw = unpickle_known(watch_file())
    labels = list(raw["y_labels"])
    xs, ys, subjects, recordings = [], [], [], []
    for r, (signal, label, subject) in enumerate(zip(raw["X"], raw["y"], raw["subject"], strict=True)):
        feats = window_features(np.asarray(signal, dtype=np.float64), cfg.window_size)
        xs.append(feats)
        ys.append(np.full(len(feats), int(label)))
        subjects.append(np.full(len(feats), int(subject)))
        recordings.append(np.full(len(feats), r))
    x = np.concatenate(xs)
    if len(x) == 0:
        raise DataError(f"window-size={cfg.window_size}: longer than every recording")
    y = np.concatenate(ys)
    subject = np.concatenate(subjects)
    recording = np.concatenate(recordings)

    test = holdout_units(recording, cfg.test_fraction, data_rng(cfg.data_seed, 1), strata=y)
    all_columns = tuple(f"{c}_{s}" for c in CHANNELS for s in STATS)
    col = {name: i for i, name in enumerate(all_columns)}
    pub = x[:, [col[c] for c in PUBLIC_COLUMNS]]
    mean, std = pub[~test].mean(0), pub[~test].std(0)
    pub = (pub - mean) / np.where(std > 0, std, 1.0)
    priv = x[:, [col[c] for c in PRIVATE_COLUMNS]] / ACCEL_SCALE_G
    spec = FeatureSpec(
        columns=PUBLIC_COLUMNS + PRIVATE_COLUMNS, public=PUBLIC_COLUMNS, private=PRIVATE_COLUMNS
    )
    device = np.full(len(y), -1, dtype=np.int64)
    train = ~test
    device[train] = group_units(
        subject[train], cfg.num_devices, data_rng(cfg.data_seed, 2), what="subjects", dataset="watch",
        scope=" in its training split"
    )
    return assemble(
        "watch",
        spec,
        np.concatenate([pub, priv], axis=1),
        y,
        device,
        test,
        labels,
        num_devices=cfg.num_devices,
        public_statistics=[0.0] * len(PRIVATE_COLUMNS),
        public_loss="zero",
    )
