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
PUBLIC_LOSSES = ("gaussian", "zero", "mean")
PRIVACY_UNITS = ("record", "device")
OPTIMIZERS = ("sgd", "adam")
MODELS = ("mlp", "logistic")
DATASETS = ("fleet",)


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
        Construction of the public view Ψ-input: ``gaussian`` (padding with
        N(0, 1), default), ``zero`` (masking) or ``mean`` (public-mean imputation).
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
    public_loss: str = "gaussian"
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
    learning_rate: float = 0.5
    momentum: float = 0.9
    optimizer: str = "sgd"
    model: str = "mlp"
    hidden_size: int = 64


@dataclass(frozen=True)
class DataConfig:
    """Which records, split how."""

    dataset: str = "fleet"
    num_devices: int = 20
    records_per_device: int = 300
    test_fraction: float = 0.2
    data_seed: int = 0


@dataclass(frozen=True)
class RunConfig:
    """Orchestration: seeds, outputs, Flower client sampling."""

    seed: int = 0
    clients_per_round: int = 0
    eval_every: int = 1
    out_dir: str = ""
    checkpoint_every: int = 1
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
        for key, (section, attr, _kind) in _KEYS.items():
            value = getattr(getattr(self, section), attr)
            out[key] = 0.0 if value is None else value
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
    "dataset": ("data", "dataset", "choice"),
    "num-devices": ("data", "num_devices", "int+"),
    "records-per-device": ("data", "records_per_device", "int+"),
    "test-fraction": ("data", "test_fraction", "float01open"),
    "data-seed": ("data", "data_seed", "int0"),
    "seed": ("run", "seed", "int0"),
    "clients-per-round": ("run", "clients_per_round", "int0"),
    "eval-every": ("run", "eval_every", "int+"),
    "out-dir": ("run", "out_dir", "str"),
    "checkpoint-every": ("run", "checkpoint_every", "int0"),
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


def _parse(key: str, kind: str, value: Any) -> Any:
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
    return dict(app) if app is not None else data
