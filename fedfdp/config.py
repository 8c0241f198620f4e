"""One validated, frozen configuration, built in one place.

Every tunable is a kebab-case key (``noise-multiplier``, ``sampling-rate``...)
that appears in ``[tool.flwr.app.config]`` of ``pyproject.toml``, in experiment
TOML files and in ``fedfdp run --set key=value``. :func:`load_config` parses a
flat mapping of such keys into :class:`Config`, whose parts separate the
privacy-defining settings (:class:`PrivacyConfig`) from the performance-only
ones (:class:`TrainingConfig`, :class:`DataConfig`, :class:`RunConfig`).

Validation happens here, before any work starts, and every error names the
key and the offending value, e.g. ``noise-multiplier=-1.0: must be > 0``.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

MODES = ("nonprivate", "public", "dp", "fdp", "fdp-dpsgd")
PRIVATE_MODES = ("dp", "fdp", "fdp-dpsgd")
PUBLIC_LOSSES = ("auto", "gaussian", "zero", "mean", "label-free")
PRIVACY_UNITS = ("record", "device")
OPTIMIZERS = ("sgd", "adam")
MODELS = ("mlp", "logistic")
DATASETS = ("fleet", "watch", "storms", "purchase100", "criteo", "csv")
#: Where the training records live: ``central`` (every node loads the dataset
#: the run names and serves its partition) or ``node`` (each SuperNode reads
#: its own file, named in its node config).
DATA_LOCATIONS = ("central", "node")


class ConfigError(ValueError):
    """A configuration key has a bad value; the message names key and value."""


@dataclass(frozen=True)
class PrivacyConfig:
    """Settings that define the privacy guarantee.

    Attributes
    ----------
    mode : str
        ``nonprivate``, ``public``, ``dp``, ``fdp`` or ``fdp-dpsgd``.
    noise_multiplier : float or None
        σ; the noise added to the private sum has std ``σ·C``. ``None`` means
        "calibrate from ``target_epsilon``".
    target_epsilon : float or None
        ε (add/remove, at ``delta``) the run must end at, not above.
    max_epsilon : float or None
        Hard budget: a round that would push ε above it is refused.
    delta : float or None
        δ; ``None`` means ``1 / (2 N)`` with ``N`` the number of training records.
    clipping_norm : float
        ``C``: per-record L2 bound of the private gradient (the sensitivity).
    sampling_rate : float
        ``q``: Poisson inclusion probability of a record in the private batch.
    public_batch_size : int
        ``m'``: size of the uniform public batch (drawn independently of the
        private batch, Prop. 3).
    public_loss : str
        Construction of the public view Ψ-input: ``auto`` (default: the
        dataset's declared choice — Gaussian padding unless the dataset says
        otherwise; the fleet declares zero masking), ``gaussian`` (padding with
        N(0, 1), the paper's Purchase100 choice), ``zero`` (masking) or ``mean``
        (public-mean imputation);
        or ``label-free``: label-DP, ``Ψ(x, y) = x`` (every input column public,
        the label private), ``ℓ_pub = logsumexp(wᵀx)``; needs ``model = "logistic"``.
    public_pretrain_rounds : int
        Rounds of public-loss-only training before the private rounds (Remark 2);
        they cost no ε. Required > 0 for ``fdp-dpsgd``.
    privacy_unit : str
        ``record`` (the paper's: one record's private features are protected)
        or ``device`` (all records of one device: the device's whole private
        contribution is clipped to ``C``; devices are Poisson-sampled with
        ``device_sampling_rate``).
    device_sampling_rate : float or None
        ``p``: each device takes part in a round independently with
        probability ``p`` (Poisson client sampling). Record-level accounting
        then uses rate ``p·q``; device-level uses ``p``. ``None``: every
        device (or a fixed count, ``clients-per-round``) takes part.
    """

    mode: str = "fdp"
    noise_multiplier: float | None = None
    target_epsilon: float | None = 2.0
    max_epsilon: float | None = None
    delta: float | None = None
    clipping_norm: float = 1.0
    sampling_rate: float = 0.05
    public_batch_size: int = 256
    public_loss: str = "auto"
    public_pretrain_rounds: int = 0
    privacy_unit: str = "record"
    device_sampling_rate: float | None = None

    @property
    def is_private(self) -> bool:
        """Whether the mode adds noise and spends ε."""
        return self.mode in PRIVATE_MODES


@dataclass(frozen=True)
class TrainingConfig:
    """Optimisation settings (performance only; they do not change ε)."""

    num_rounds: int = 150
    alpha: float = 1.0
    learning_rate: float = 0.1
    momentum: float = 0.9
    optimizer: str = "sgd"
    model: str = "logistic"
    hidden_size: int = 64
    #: Widths of the MLP's hidden layers; empty: two layers of ``hidden_size``.
    hidden_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class DataConfig:
    """Which records, split how (see ``docs/datasets.md``).

    Attributes
    ----------
    dataset : str
        ``fleet`` (synthetic, default), ``watch``, ``storms``, ``purchase100``,
        ``criteo`` or ``csv``.
    num_devices : int
        Devices. Datasets with natural devices (subjects, storms, a
        ``device_column``) group whole units into this many devices (at most
        the number of units); the others are split IID or Dirichlet.
    records_per_device : int
        Mean records per device of the synthetic generators (``fleet``, and
        ``purchase100``/``criteo`` without ``data_path``).
    test_fraction : float
        Share held out for server-side evaluation.
    data_seed : int
        Seed of generation, splits and the held-out choice.
    data_path : str
        File of ``purchase100``, ``criteo`` or ``csv`` (``.csv``/``.parquet``).
    public_columns, private_columns : tuple of str
        ``csv``: the columns of Ψ and the protected ones.
    label_column, device_column : str
        ``csv``: the label, and optionally the natural device of each row.
    dirichlet_alpha : float
        0: IID split; > 0: per-device label mix ``Dirichlet(α)`` (no natural devices).
    private_ranges : tuple of (column, low, high)
        ``csv``: declared ranges of numeric private columns, scaled to [-1, 1].
    private_categories : tuple of (column, categories)
        ``csv``: declared categories of non-numeric private columns.
    public_ranges, public_categories
        ``csv``: declared encodings of public columns (a range is mapped
        linearly to [-1, 1], not clipped). Undeclared public columns are
        standardised / one-hot encoded with training-split statistics
        (``data-location = "central"`` only).
    label_classes : tuple of str
        ``csv``: the declared label values, in class order; empty: the sorted
        distinct values of the file (``central`` only).
    data_location : str
        ``central`` (default) or ``node``: every SuperNode reads its own
        ``csv`` file, named by ``data-path`` in its **node config**, and serves
        one device (its ``partition-id``); every column, the label classes
        and ``test-path`` must then be declared, so that all sites encode
        their records identically (``docs/deploy.md``).
    test_path : str
        ``data-location = "node"``: the server's held-out file (``.csv`` or
        ``.parquet``, same columns), used only for evaluation.
    window_size : int
        ``watch``: samples per window (50 Hz).
    max_records : int
        Read at most this many rows of a file (0: all).
    num_public_features : int
        ``purchase100``: how many of the 600 features are public.
    hash_buckets : int
        ``criteo``: width of the hashed one-hot encoding of the categories.
    """

    dataset: str = "fleet"
    num_devices: int = 20
    records_per_device: int = 200
    test_fraction: float = 0.2
    data_seed: int = 0
    data_path: str = ""
    public_columns: tuple[str, ...] = ()
    private_columns: tuple[str, ...] = ()
    label_column: str = ""
    device_column: str = ""
    dirichlet_alpha: float = 0.0
    private_ranges: tuple[tuple[str, float, float], ...] = ()
    private_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    public_ranges: tuple[tuple[str, float, float], ...] = ()
    public_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    label_classes: tuple[str, ...] = ()
    data_location: str = "central"
    test_path: str = ""
    window_size: int = 100
    max_records: int = 0
    num_public_features: int = 100
    hash_buckets: int = 256


@dataclass(frozen=True)
class RunConfig:
    """Orchestration: seeds, outputs, Flower client sampling."""

    seed: int = 0
    clients_per_round: int = 0
    eval_every: int = 1
    out_dir: str = ""
    checkpoint_every: int = 1
    resume: bool = False
    node_wait_timeout: float = 120.0
    round_timeout: float = 600.0
    progress: bool = True


@dataclass(frozen=True)
class Config:
    """The whole resolved configuration of one run."""

    privacy: PrivacyConfig = PrivacyConfig()
    training: TrainingConfig = TrainingConfig()
    data: DataConfig = DataConfig()
    run: RunConfig = RunConfig()

    def to_flat(self) -> dict[str, Any]:
        """Flat kebab-case mapping (``None`` written as ``0``), the inverse of
        :func:`load_config`; suitable for TOML and Flower's run config."""
        out: dict[str, Any] = {}
        for key, (section, attr, kind) in _KEYS.items():
            value = getattr(getattr(self, section), attr)
            out[key] = 0.0 if value is None else _flat(kind, value)
        return out


# key -> (section, attribute, kind). kind: "float+", "float01", "int+", "int0", "str:<choices>"
_KEYS: dict[str, tuple[str, str, str]] = {
    "mode": ("privacy", "mode", "choice"),
    "noise-multiplier": ("privacy", "noise_multiplier", "optfloat+"),
    "target-epsilon": ("privacy", "target_epsilon", "optfloat+"),
    "max-epsilon": ("privacy", "max_epsilon", "optfloat+"),
    "delta": ("privacy", "delta", "optdelta"),
    "clipping-norm": ("privacy", "clipping_norm", "float+"),
    "sampling-rate": ("privacy", "sampling_rate", "prob"),
    "public-batch-size": ("privacy", "public_batch_size", "int+"),
    "public-loss": ("privacy", "public_loss", "choice"),
    "public-pretrain-rounds": ("privacy", "public_pretrain_rounds", "int0"),
    "privacy-unit": ("privacy", "privacy_unit", "choice"),
    "device-sampling-rate": ("privacy", "device_sampling_rate", "optprob"),
    "num-rounds": ("training", "num_rounds", "int+"),
    "alpha": ("training", "alpha", "float+"),
    "learning-rate": ("training", "learning_rate", "float+"),
    "momentum": ("training", "momentum", "float01"),
    "optimizer": ("training", "optimizer", "choice"),
    "model": ("training", "model", "choice"),
    "hidden-size": ("training", "hidden_size", "int+"),
    "hidden-sizes": ("training", "hidden_sizes", "intlist"),
    "dataset": ("data", "dataset", "choice"),
    "num-devices": ("data", "num_devices", "int+"),
    "records-per-device": ("data", "records_per_device", "int+"),
    "test-fraction": ("data", "test_fraction", "float01open"),
    "data-seed": ("data", "data_seed", "int0"),
    "data-path": ("data", "data_path", "str"),
    "public-columns": ("data", "public_columns", "strlist"),
    "private-columns": ("data", "private_columns", "strlist"),
    "label-column": ("data", "label_column", "str"),
    "device-column": ("data", "device_column", "str"),
    "dirichlet-alpha": ("data", "dirichlet_alpha", "float0"),
    "private-ranges": ("data", "private_ranges", "ranges"),
    "private-categories": ("data", "private_categories", "categories"),
    "public-ranges": ("data", "public_ranges", "ranges"),
    "public-categories": ("data", "public_categories", "categories"),
    "label-classes": ("data", "label_classes", "classes"),
    "data-location": ("data", "data_location", "choice"),
    "test-path": ("data", "test_path", "str"),
    "window-size": ("data", "window_size", "int+"),
    "max-records": ("data", "max_records", "int0"),
    "num-public-features": ("data", "num_public_features", "int+"),
    "hash-buckets": ("data", "hash_buckets", "int+"),
    "seed": ("run", "seed", "int0"),
    "clients-per-round": ("run", "clients_per_round", "int0"),
    "eval-every": ("run", "eval_every", "int+"),
    "out-dir": ("run", "out_dir", "str"),
    "checkpoint-every": ("run", "checkpoint_every", "int0"),
    "resume": ("run", "resume", "bool"),
    "node-wait-timeout": ("run", "node_wait_timeout", "float+"),
    "round-timeout": ("run", "round_timeout", "float+"),
    "progress": ("run", "progress", "bool"),
}

_CHOICES: dict[str, tuple[str, ...]] = {
    "mode": MODES,
    "public-loss": PUBLIC_LOSSES,
    "privacy-unit": PRIVACY_UNITS,
    "optimizer": OPTIMIZERS,
    "model": MODELS,
    "dataset": DATASETS,
    "data-location": DATA_LOCATIONS,
}

#: Keys that are not run settings but may appear in shared TOML files
#: (Flower injects ``server-round`` into client configs).
_IGNORED = frozenset({"server-round"})


def config_keys() -> tuple[str, ...]:
    """All accepted keys, in documentation order."""
    return tuple(_KEYS)


def _fail(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{key}={value!r}: {why}")


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(key, value, "must be a number")
    out = float(value)
    if not math.isfinite(out):
        raise _fail(key, value, "must be finite")
    return out


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _fail(key, value, "must be an integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise _fail(key, value, "must be an integer")
    return value


def _names(key: str, value: Any) -> list[str]:
    """A list of names: a TOML array of strings or one comma-separated string."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")] if value.strip() else []
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise _fail(key, value, "must be a list of strings or one comma-separated string")
    if any(not v for v in items):
        raise _fail(key, value, "contains an empty name")
    bad = [v for v in items if any(ch in v for ch in ",=|")]
    if bad:
        raise _fail(key, value, f"names {bad} contain one of ',', '=', '|'")
    dup = sorted({v for v in items if items.count(v) > 1})
    if dup:
        raise _fail(key, value, f"duplicated name(s) {dup}")
    return items


def _entries(key: str, value: Any) -> list[tuple[str, Any]]:
    """``{col = [...]}`` tables or ``"col=...,col=..."`` strings, as (col, raw) pairs."""
    if isinstance(value, Mapping):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, str):
        out = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if "=" not in part:
                raise _fail(key, value, f"entry {part!r} is not column=...")
            name, raw = part.split("=", 1)
            out.append((name.strip(), raw.strip()))
        return out
    raise _fail(key, value, "must be a table {column = ...} or a string 'column=...,column=...'")


def _parse_ranges(key: str, value: Any) -> tuple[tuple[str, float, float], ...]:
    out = []
    for name, raw in _entries(key, value):
        if isinstance(raw, str):
            # "low:high"; a leading '-' belongs to the number
            parts = raw.split(":")
            try:
                low, high = (float(v) for v in parts) if len(parts) == 2 else (None, None)
            except ValueError:
                low = high = None
        elif isinstance(raw, list | tuple) and len(raw) == 2:
            try:
                low, high = _as_float(key, raw[0]), _as_float(key, raw[1])
            except ConfigError:
                low = high = None
        else:
            low = high = None
        if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
            raise _fail(key, value, f"range of {name!r} must be low:high (two finite numbers)")
        if not low < high:
            raise _fail(key, value, f"range of {name!r}: low={low} must be below high={high}")
        out.append((name, low, high))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise _fail(key, value, "a column is declared twice")
    return tuple(out)


def _parse_categories(key: str, value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    out = []
    for name, raw in _entries(key, value):
        if isinstance(raw, str):
            cats = [c.strip() for c in raw.split("|")]
        elif isinstance(raw, list | tuple):
            cats = [str(c).strip() for c in raw]
        else:
            cats = []
        if not cats or any(not c for c in cats) or len(set(cats)) != len(cats):
            raise _fail(key, value, f"categories of {name!r} must be distinct, non-empty names")
        out.append((name, tuple(cats)))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise _fail(key, value, "a column is declared twice")
    return tuple(out)


def _parse_classes(key: str, value: Any) -> tuple[str, ...]:
    """Label values: a TOML array, or one string separated by ``|`` (labels may
    contain commas)."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split("|")] if value.strip() else []
    elif isinstance(value, list | tuple) and all(isinstance(v, str | int) for v in value):
        items = [str(v).strip() for v in value]
    else:
        raise _fail(key, value, "must be a list of labels or one string 'a|b|c'")
    if any(not v for v in items) or len(set(items)) != len(items):
        raise _fail(key, value, "labels must be distinct and non-empty")
    if len(items) == 1:
        raise _fail(key, value, "a classifier needs at least two classes")
    return tuple(items)


def _flat(kind: str, value: Any) -> Any:
    """The flat (TOML scalar) form of a parsed value; inverse of :func:`_parse`."""
    if kind in ("strlist", "intlist"):
        return ",".join(str(v) for v in value)
    if kind == "classes":
        return "|".join(value)
    if kind == "ranges":
        return ",".join(f"{n}={lo!r}:{hi!r}" for n, lo, hi in value)
    if kind == "categories":
        return ",".join(f"{n}={'|'.join(c)}" for n, c in value)
    return value


def _parse(key: str, kind: str, value: Any) -> Any:
    if kind == "strlist":
        return tuple(_names(key, value))
    if kind == "intlist":
        if isinstance(value, str):
            raw = [v.strip() for v in value.split(",")] if value.strip() else []
            try:
                ints = [int(v) for v in raw]
            except ValueError:
                raise _fail(key, value, "must be a list of positive integers") from None
        elif isinstance(value, list | tuple):
            ints = [_as_int(key, v) for v in value]
        else:
            raise _fail(key, value, "must be a list of positive integers")
        if any(v < 1 for v in ints):
            raise _fail(key, value, "must be a list of positive integers")
        return tuple(ints)
    if kind == "classes":
        return _parse_classes(key, value)
    if kind == "ranges":
        return _parse_ranges(key, value)
    if kind == "categories":
        return _parse_categories(key, value)
    if kind == "choice":
        choices = _CHOICES[key]
        if not isinstance(value, str) or value not in choices:
            raise _fail(key, value, f"must be one of {', '.join(choices)}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _fail(key, value, "must be a string")
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise _fail(key, value, "must be true or false")
    if kind == "int+":
        out = _as_int(key, value)
        if out < 1:
            raise _fail(key, value, "must be >= 1")
        return out
    if kind == "int0":
        out = _as_int(key, value)
        if out < 0:
            raise _fail(key, value, "must be >= 0")
        return out
    out = _as_float(key, value)
    if kind == "float+":
        if out <= 0:
            raise _fail(key, value, "must be > 0")
    elif kind == "optfloat+":
        if out < 0:
            raise _fail(key, value, "must be > 0 (or 0 for unset)")
        return None if out == 0 else out
    elif kind == "optdelta":
        if not 0 <= out < 1:
            raise _fail(key, value, "must be in (0, 1) (or 0 for 1/(2N))")
        return None if out == 0 else out
    elif kind == "optprob":
        if not 0 <= out <= 1:
            raise _fail(key, value, "must be in (0, 1] (or 0 for unset)")
        return None if out == 0 else out
    elif kind == "prob":
        if not 0 < out <= 1:
            raise _fail(key, value, "must be in (0, 1]")
    elif kind == "float0":
        if out < 0:
            raise _fail(key, value, "must be >= 0")
    elif kind == "float01":
        if not 0 <= out < 1:
            raise _fail(key, value, "must be in [0, 1)")
    elif kind == "float01open" and not 0 < out < 1:
        raise _fail(key, value, "must be in (0, 1)")
    return out


def load_config(mapping: Mapping[str, Any] | None = None, *, base: Config | None = None) -> Config:
    """Parse and validate a flat kebab-case mapping into a frozen :class:`Config`.

    Parameters
    ----------
    mapping : Mapping[str, Any], optional
        Keys from :func:`config_keys`; missing keys keep the value of ``base``
        (defaults when ``base`` is None).
    base : Config, optional
        Configuration the mapping overrides.

    Raises
    ------
    ConfigError
        Unknown key (with a suggestion), wrong type, out-of-range value, or an
        inconsistent combination; the message names the key and the value.
    """
    base = base or Config()
    sections: dict[str, dict[str, Any]] = {
        name: {f.name: getattr(getattr(base, name), f.name) for f in fields(getattr(base, name))}
        for name in ("privacy", "training", "data", "run")
    }
    for key, value in (mapping or {}).items():
        if key in _IGNORED:
            continue
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{key}={value!r}: unknown configuration key{hint}")
        section, attr, kind = _KEYS[key]
        sections[section][attr] = _parse(key, kind, value)
    cfg = Config(
        privacy=PrivacyConfig(**sections["privacy"]),
        training=TrainingConfig(**sections["training"]),
        data=DataConfig(**sections["data"]),
        run=RunConfig(**sections["run"]),
    )
    _check_combination(cfg)
    return cfg


def _check_combination(cfg: Config) -> None:
    p, t = cfg.privacy, cfg.training
    if p.is_private:
        if p.noise_multiplier is not None and p.target_epsilon is not None:
            raise ConfigError(
                f"noise-multiplier={p.noise_multiplier} and target-epsilon={p.target_epsilon}: "
                "give one of them (set the other to 0)"
            )
        if p.noise_multiplier is None and p.target_epsilon is None:
            raise ConfigError(f"mode={p.mode!r}: a private mode needs noise-multiplier or target-epsilon")
        if p.max_epsilon is not None and p.target_epsilon is not None and p.max_epsilon < p.target_epsilon:
            raise ConfigError(f"max-epsilon={p.max_epsilon}: below target-epsilon={p.target_epsilon}")
    if p.mode == "fdp-dpsgd" and p.public_pretrain_rounds == 0:
        raise ConfigError("public-pretrain-rounds=0: mode 'fdp-dpsgd' needs public pre-training")
    if p.public_pretrain_rounds >= t.num_rounds and p.is_private:
        raise ConfigError(
            f"public-pretrain-rounds={p.public_pretrain_rounds}: must be below "
            f"num-rounds={t.num_rounds} so that private rounds remain"
        )
    if p.privacy_unit == "device" and p.device_sampling_rate is None:
        raise ConfigError(
            "privacy-unit='device': needs device-sampling-rate in (0, 1] (devices are Poisson-sampled)"
        )
    if p.device_sampling_rate is not None and cfg.run.clients_per_round:
        raise ConfigError(
            f"clients-per-round={cfg.run.clients_per_round}: give it or device-sampling-rate, not both"
        )
    if cfg.data.num_devices > 100_000:
        raise ConfigError(f"num-devices={cfg.data.num_devices}: at most 100000")
    if p.public_loss == "label-free" and t.model != "logistic":
        raise ConfigError(
            f"public-loss='label-free': needs model='logistic' (got model={t.model!r}); the "
            "label-free public loss logsumexp(wᵀx) is the paper's softmax-regression construction"
        )
    _check_data(cfg.data)


def _check_data(d: DataConfig) -> None:
    """Data keys that only make sense together (the loaders check the file itself)."""
    overlap = sorted(set(d.public_columns) & set(d.private_columns))
    if overlap:
        raise ConfigError(
            f"public-columns={list(d.public_columns)}, private-columns={list(d.private_columns)}: "
            f"overlap in {overlap}; a column is public or private, not both"
        )
    csv_only = {
        "public-columns": d.public_columns,
        "private-columns": d.private_columns,
        "label-column": d.label_column,
        "device-column": d.device_column,
        "private-ranges": d.private_ranges,
        "private-categories": d.private_categories,
        "public-ranges": d.public_ranges,
        "public-categories": d.public_categories,
        "label-classes": d.label_classes,
    }
    _check_location(d)
    if d.data_path and d.dataset not in ("purchase100", "criteo", "csv"):
        raise ConfigError(
            f"data-path={d.data_path!r}: dataset={d.dataset!r} reads no file "
            "(data-path is for purchase100, criteo and csv)"
        )
    if d.dataset != "csv":
        given = [k for k, v in csv_only.items() if v]
        if given:
            raise ConfigError(f"{given[0]}={csv_only[given[0]]!r}: only used by dataset='csv' "
                              f"(dataset={d.dataset!r})")
    else:
        if not d.data_path and d.data_location == "central":
            raise ConfigError("data-path='': dataset='csv' needs the path of a .csv or .parquet file")
        if not d.label_column:
            raise ConfigError("label-column='': dataset='csv' needs the label column")
        if not d.public_columns:
            raise ConfigError("public-columns=[]: dataset='csv' needs at least one public column")
        if not d.private_columns:
            raise ConfigError("private-columns=[]: dataset='csv' needs at least one private column")
        for key, cols in (("public-columns", d.public_columns), ("private-columns", d.private_columns)):
            for special, name in (("label-column", d.label_column), ("device-column", d.device_column)):
                if name and name in cols:
                    raise ConfigError(f"{key}={list(cols)}: contains the {special} {name!r}")
        for side in ("public", "private"):
            ranges = {n for n, _, _ in getattr(d, f"{side}_ranges")}
            cats = {n for n, _ in getattr(d, f"{side}_categories")}
            columns = getattr(d, f"{side}_columns")
            stray = sorted((ranges | cats) - set(columns))
            if stray:
                raise ConfigError(
                    f"{side}-ranges/{side}-categories name {stray}: not in {side}-columns={list(columns)}"
                )
            if ranges & cats:
                raise ConfigError(
                    f"{side}-ranges and {side}-categories both declare {sorted(ranges & cats)}: pick one"
                )
    if d.dataset in ("watch", "storms", "csv") and d.dirichlet_alpha and (
        d.dataset != "csv" or d.device_column
    ):
        raise ConfigError(
            f"dirichlet-alpha={d.dirichlet_alpha}: dataset={d.dataset!r} has natural devices; "
            "the Dirichlet split applies to datasets without them"
        )


def _check_location(d: DataConfig) -> None:
    """``data-location = "node"``: each SuperNode's own file, everything declared."""
    if d.data_location == "central":
        if d.test_path:
            raise ConfigError(
                f"test-path={d.test_path!r}: only used with data-location='node' (with 'central' "
                "the held-out split is test-fraction of every device)"
            )
        return
    if d.dataset != "csv":
        raise ConfigError(
            f"data-location='node': needs dataset='csv' (got dataset={d.dataset!r}); each SuperNode "
            "reads its own CSV/Parquet file"
        )
    if d.data_path:
        raise ConfigError(
            f"data-path={d.data_path!r}: with data-location='node' each SuperNode names its own file "
            "in its node config (--node-config \"... data-path='/path/records.csv'\"); the run "
            "config names only the server's held-out file, test-path"
        )
    if not d.test_path:
        raise ConfigError("test-path='': data-location='node' needs the server's held-out file")
    for key, value in (("device-column", d.device_column), ("dirichlet-alpha", d.dirichlet_alpha)):
        if value:
            raise ConfigError(
                f"{key}={value!r}: with data-location='node' each SuperNode's file is one device"
            )
    if not d.label_classes:
        raise ConfigError(
            "label-classes='': data-location='node' needs the declared label values (every site "
            "must number the classes alike)"
        )
    for side in ("public", "private"):
        declared = {n for n, _, _ in getattr(d, f"{side}_ranges")} | {
            n for n, _ in getattr(d, f"{side}_categories")
        }
        cols = [c for c in getattr(d, f"{side}_columns") if c not in declared]
        if cols:
            raise ConfigError(
                f"{side}-columns {cols}: data-location='node' needs every column's encoding declared "
                f"({side}-ranges 'col=low:high' or {side}-categories 'col=a|b'), so that every site "
                "encodes its records identically without sharing statistics of its data"
            )


def private_rounds(cfg: Config) -> int:
    """Rounds that touch private data (and spend ε)."""
    if not cfg.privacy.is_private and cfg.privacy.mode != "nonprivate":
        return 0
    return cfg.training.num_rounds - cfg.privacy.public_pretrain_rounds


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` from the command line; the value is read as a TOML
    literal (``1e-5``, ``true``, ``"fdp"``), falling back to a bare string."""
    if "=" not in text:
        raise ConfigError(f"{text!r}: expected key=value")
    key, raw = text.split("=", 1)
    key, raw = key.strip(), raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read an experiment TOML file: flat keys at the top level, or under
    ``[tool.flwr.app.config]`` (so ``pyproject.toml`` works too)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config={str(path)!r}: no such file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config={str(path)!r}: not valid TOML ({exc})") from exc
    app = data.get("tool", {}).get("flwr", {}).get("app", {}).get("config")
    if app is not None:
        return dict(app)
    data.pop("resolved", None)  # values a run resolved at start (written by fedfdp run)
    return data
