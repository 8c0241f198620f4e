"""Datasets: the synthetic device fleet (default) and the loader registry."""

from __future__ import annotations

from functools import lru_cache

from fedfdp.config import DataConfig
from fedfdp.data.base import DeviceData, FederatedData
from fedfdp.data.fleet import make_fleet

__all__ = ["DeviceData", "FederatedData", "load_dataset", "make_fleet"]


@lru_cache(maxsize=4)
def load_dataset(cfg: DataConfig) -> FederatedData:
    """Load (or generate) the dataset a configuration names; cached per process.

    Raises
    ------
    ValueError
        Unknown dataset name, or a dataset parameter out of range.
    """
    if cfg.dataset == "fleet":
        return make_fleet(
            cfg.num_devices,
            cfg.records_per_device,
            seed=cfg.data_seed,
            test_fraction=cfg.test_fraction,
        )
    raise ValueError(f"dataset={cfg.dataset!r}: unknown (available: fleet)")
