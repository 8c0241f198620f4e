"""Shared pieces of the dataset loaders: errors, optional packages, device
splits, held-out splits, label encoding and the final assembly.

Every loader returns a :class:`~fedfdp.data.base.FederatedData` built by
:func:`assemble`, which refuses data that cannot train (a label with one
class, an empty device, an empty test split) with a message naming the value.
Randomness comes from an explicit ``numpy.random.Generator`` derived from
``data-seed``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from fedfdp.config import ConfigError, DataConfig, PrivacyConfig, PublicLoss
from fedfdp.config.protection import protected
from fedfdp.data.base import DeviceData, FederatedData
from fedfdp.features import FeatureSpec, PublicStatistics

#: Name of the pyproject extra that holds the optional dataset packages.
EXTRA = "datasets"


class DataError(ConfigError):
    """Bad data input (file, columns, labels, devices); the message names the key
    and the value. A :class:`~fedfdp.config.ConfigError`, so the CLI reports it
    the same way, before any run starts.
    """


class MissingExtraError(DataError):
    """An optional package of the ``datasets`` extra is not installed."""


def require(module: str, dataset: str) -> ModuleType:
    """Import an optional package; a missing one names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"dataset={dataset!r}: needs the package {module!r}; install it with "
            f"pip install 'fedfdp[{EXTRA}]'"
        ) from exc


def data_rng(seed: int, stream: int) -> np.random.Generator:
    """Generator for one purpose (``stream``) of one dataset seed."""
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(stream,)))


def encode_labels(values: Sequence[Any] | np.ndarray, key: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map label values to ``0..K-1`` (sorted by their string form); need K >= 2."""
    values = np.asarray(values)
    names = np.array([str(v) for v in values], dtype=object)
    classes = tuple(sorted(set(names.tolist())))
    if len(classes) < 2:
        shown = classes[0] if classes else "none"
        raise DataError(f"{key}: a single class ({shown!r}); a classifier needs at least two")
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[v] for v in names], dtype=np.int64), classes


def group_units(
    units: np.ndarray,
    num_devices: int,
    rng: np.random.Generator,
    *,
    what: str,
    dataset: str,
    scope: str = "",
) -> np.ndarray:
    """Assign whole natural units (subjects, storms, device ids) to ``num_devices``
    devices; returns the device of each record.

    Units are shuffled, then placed largest first on the device with the fewest
    records (balanced sizes, a unit is never split). With as many devices as
    units each unit is one device.

    Raises
    ------
    DataError
        ``num_devices`` above the number of units.
    """
    names, inverse, counts = np.unique(units, return_inverse=True, return_counts=True)
    if num_devices > len(names):
        raise DataError(
            f"num-devices={num_devices}: dataset {dataset!r} has {len(names)} {what}{scope}; "
            f"set num-devices to at most {len(names)} (whole {what} are grouped into devices)"
        )
    order = rng.permutation(len(names))
    order = order[np.argsort(-counts[order], kind="stable")]
    load = np.zeros(num_devices, dtype=np.int64)
    device_of_unit = np.empty(len(names), dtype=np.int64)
    for u in order:
        d = int(np.argmin(load))
        device_of_unit[u] = d
        load[d] += counts[u]
    return device_of_unit[inverse]


def split_records(
    y: np.ndarray, num_devices: int, alpha: float, rng: np.random.Generator, *, dataset: str
) -> np.ndarray:
    """Device of each record: IID (``alpha == 0``) or per-class ``Dirichlet(alpha)``
    proportions over the devices (non-IID label mixes).

    Raises
    ------
    DataError
        More devices than records, or a device left without records.
    """
    n = len(y)
    if num_devices > n:
        raise DataError(
            f"num-devices={num_devices}: dataset {dataset!r} has only {n} training records"
        )
    device = np.empty(n, dtype=np.int64)
    if alpha == 0:
        perm = rng.permutation(n)
        for d, part in enumerate(np.array_split(perm, num_devices)):
            device[part] = d
        return device
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        share = rng.dirichlet(np.full(num_devices, alpha))
        cuts = np.round(np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
        for d, part in enumerate(np.split(idx, cuts)):
            device[part] = d
    empty = sorted(set(range(num_devices)) - set(np.unique(device).tolist()))
    if empty:
        raise DataError(
            f"num-devices={num_devices}, dirichlet-alpha={alpha}: device(s) {empty[:5]} get no "
            "records; use fewer devices or a larger dirichlet-alpha"
        )
    return device


#: Datasets whose held-out split is stratified by the label (whole recordings per exercise).
LABEL_STRATIFIED_HOLDOUT = ("watch",)


def labels_private(privacy: PrivacyConfig) -> bool:
    """Whether ``privacy``'s relation protects the label (:func:`fedfdp.config.protection.protected`):
    ``mode = "dp"`` (the whole record), or ``public-loss = "label-free"`` (label-DP,
    ``Ψ(x, y) = x``) in any mode that claims an ε (every mode but ``nonprivate``).
    """
    return protected(privacy).label


def refuse_label_split(privacy: PrivacyConfig, d: DataConfig) -> None:
    """Refuse a device split or hold-out that reads the labels when the labels are private.

    The device sizes and ``N`` are public (``docs/threat_model.md``), so every split
    that runs under a private label must be a function of public quantities and the
    data seed only. The built-in splits are: the IID split (``dirichlet-alpha = 0``:
    a permutation from the data seed), ``device-column`` grouping (unit sizes), and
    the hold-out of ``test-fraction`` of every device (device sizes) — all free of
    the labels. Two are not, and are refused here with the key to change:
    ``dirichlet-alpha > 0`` (per-class Dirichlet shares, :func:`split_records`) and
    ``dataset = "watch"`` (its hold-out takes whole recordings of every exercise).

    Raises
    ------
    ConfigError
        Naming the key, its value and the way out.
    """
    if not labels_private(privacy):
        return
    if d.dirichlet_alpha:
        why = "public-loss='label-free'" if privacy.public_loss is PublicLoss.LABEL_FREE else "mode='dp'"
        raise ConfigError(
            f"dirichlet-alpha={d.dirichlet_alpha:g}: the Dirichlet split draws each class's share per "
            f"device from the labels, which {why} makes private (device sizes and N are public); set "
            "dirichlet-alpha = 0 (IID split from data-seed)"
        )
    if d.dataset in LABEL_STRATIFIED_HOLDOUT and privacy.public_loss is PublicLoss.LABEL_FREE:
        # under dp the one checksummed file's stratified hold-out is a constant of that public file
        raise ConfigError(
            f"dataset={d.dataset!r} with public-loss='label-free': its hold-out is stratified by the "
            "label, which label-DP makes private (N would depend on it); use its own Ψ (public-loss = "
            "\"auto\") or a table whose split reads no label"
        )


def holdout_records(groups: np.ndarray, test_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Test mask: ``round(test_fraction · n_g)`` random records of every group; a fraction
    that holds out no record at all is refused (the run's evaluation would have nothing to
    score), naming ``test-fraction``.
    """
    test = np.zeros(len(groups), dtype=bool)
    for g in np.unique(groups):
        idx = rng.permutation(np.flatnonzero(groups == g))
        test[idx[: round(test_fraction * len(idx))]] = True
    if len(groups) and not test.any():
        raise DataError(f"test-fraction={test_fraction}: holds out none of the {len(groups)} records "
                        "(round(test-fraction x records) is 0 in every group); raise it")
    return test


def holdout_units(
    units: np.ndarray, test_fraction: float, rng: np.random.Generator, strata: np.ndarray | None = None
) -> np.ndarray:
    """Test mask holding out whole units (recordings, storms): ``round(test_fraction · k)``
    of the ``k`` units of every stratum (all units one stratum when ``strata`` is None).

    Records of one unit are strongly correlated in time; holding out whole units
    keeps near-copies of training records out of the test split.
    """
    names, first = np.unique(units, return_index=True)
    unit_strata = np.zeros(len(names), dtype=np.int64) if strata is None else np.asarray(strata)[first]
    chosen = []
    for s in np.unique(unit_strata):
        idx = rng.permutation(np.flatnonzero(unit_strata == s))
        chosen.extend(names[idx[: max(1, round(test_fraction * len(idx)))]].tolist())
    return np.isin(units, chosen)


def assemble(
    name: str,
    spec: FeatureSpec,
    x: np.ndarray,
    y: np.ndarray,
    device: np.ndarray,
    test: np.ndarray,
    class_names: Sequence[str],
    *,
    num_devices: int,
    label_key: str = "label",
    public_statistics: Sequence[float] | None = None,
    public_loss: str = "zero",
) -> FederatedData:
    """Build the :class:`FederatedData`; refuse what cannot train.

    Parameters
    ----------
    x, y : np.ndarray
        All records (inputs in ``spec.columns`` order, labels ``0..K-1``).
    device : np.ndarray
        Device of each record (ignored for test records).
    test : np.ndarray of bool
        Held-out records (server-side evaluation only).
    public_statistics : sequence of float, optional
        Declared constants for ``mean`` imputation, one per private column.
    public_loss : str
        The dataset's declared public view, used by ``public-loss = "auto"``.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    if not np.isfinite(x).all():
        raise DataError(f"dataset {name!r}: non-finite input values after encoding")
    train = ~test
    if len(np.unique(y[train])) < 2:
        raise DataError(
            f"{label_key}: the training split of dataset {name!r} has a single class; "
            "a classifier needs at least two"
        )
    if not test.any():
        raise DataError(f"test-fraction: dataset {name!r} has an empty held-out split; raise test-fraction")
    devices = []
    for d in range(num_devices):
        mask = train & (device == d)
        if not mask.any():
            raise DataError(
                f"num-devices={num_devices}: device {d} of dataset {name!r} has no training "
                "records; use fewer devices"
            )
        devices.append(DeviceData(x[mask], y[mask]))
    stats = (
        PublicStatistics.from_public(spec, public_statistics) if public_statistics is not None else None
    )
    return FederatedData(
        name=name,
        spec=spec,
        devices=tuple(devices),
        test_x=x[test],
        test_y=y[test],
        class_names=tuple(class_names),
        public_statistics=stats,
        public_loss=public_loss,
    )
