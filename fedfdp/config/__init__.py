"""One validated, frozen configuration, built in one place.

Every tunable is a kebab-case key (``noise-multiplier``, ``sampling-rate``...)
that appears in ``[tool.flwr.app.config]`` of ``pyproject.toml``, in experiment
TOML files and in ``fedfdp run --set key=value``. :func:`load_config` parses a
flat mapping of such keys into :class:`Config`, whose sections are the privacy
mechanism (:class:`PrivacyConfig`), the optimisation and model
(:class:`TrainingConfig`), the data (:class:`DataConfig`) and orchestration
(:class:`RunConfig`, the only performance-only section).

Which keys define the guarantee is said once, in the key table
(:mod:`fedfdp.config.keys`): :data:`GUARANTEE_KEYS` are the inputs of the
resolved mechanism, :data:`ORCHESTRATION_KEYS` what may change on resume;
:func:`key_reference` gives one row per key (``docs/configuration.md`` is
generated from it: ``python -m fedfdp.config``).

Closed choices are enums (:class:`Mode`, :class:`PrivacyUnit`,
:class:`PublicLoss`, :class:`Optimizer`, :class:`DataLocation`,
:class:`ClipShares`, :class:`TvFloor`) that equal their strings; "not set" is
``None`` (``""`` in TOML). Validation happens here, before any work starts,
and every error names the key and the offending value, e.g.
``noise-multiplier=-1.0: must be > 0``.
"""


from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from fedfdp.config.choices import (
    AGGREGATIONS,
    CLIP_SHARES,
    DATA_LOCATIONS,
    DATASETS,
    IMAGE_DATASETS,
    MODELS,
    MODES,
    OPTIMIZERS,
    PAPER_FLOOR,
    PRIVACY_UNITS,
    PRIVATE_MODES,
    PUBLIC_LOSSES,
    SECAGG_MODES,
    Aggregation,
    ClipShares,
    DataLocation,
    Mode,
    Optimizer,
    PrivacyUnit,
    PrivateStatistics,
    PublicLoss,
    TvFloor,
)
from fedfdp.config.keys import (
    DEFAULT_TARGET_EPSILON,
    GUARANTEE_KEYS,
    IGNORED_KEYS,
    KEY_TABLE,
    KEYS,
    ORCHESTRATION_KEYS,
    Applies,
    Guarantee,
    KeySpec,
    Kind,
    Section,
    guarantee_keys_of,
)
from fedfdp.config.protection import Protected, protected
from fedfdp.config.reference import KeyReference, key_reference
from fedfdp.config.schema import (
    Config,
    DataConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from fedfdp.config.values import IMPORT_PATH, ConfigError, UnknownKindError, parse_value

__all__ = [
    "AGGREGATIONS",
    "CLIP_SHARES",
    "DATASETS",
    "DATA_LOCATIONS",
    "DEFAULT_TARGET_EPSILON",
    "FDP_DPSGD_PRETRAIN_ROUNDS",
    "GUARANTEE_KEYS",
    "IMAGE_DATASETS",
    "KEYS",
    "KEY_TABLE",
    "MODELS",
    "MODES",
    "OPTIMIZERS",
    "ORCHESTRATION_KEYS",
    "PAPER_FLOOR",
    "PRIVACY_UNITS",
    "PRIVATE_MODES",
    "PUBLIC_LOSSES",
    "SECAGG_MODES",
    "Aggregation",
    "Applies",
    "ClipShares",
    "Config",
    "ConfigError",
    "DataConfig",
    "DataLocation",
    "Guarantee",
    "KeyReference",
    "KeySpec",
    "Kind",
    "Mode",
    "Optimizer",
    "PrivacyConfig",
    "PrivacyUnit",
    "PrivateStatistics",
    "Protected",
    "PublicLoss",
    "RunConfig",
    "Section",
    "TrainingConfig",
    "TvFloor",
    "UnknownKindError",
    "config_keys",
    "default_record",
    "fdp_dpsgd_pretrain_rounds",
    "guarantee_keys_of",
    "is_import_path",
    "key_reference",
    "keys_for_mode",
    "load_config",
    "load_toml_file",
    "parse_override",
    "read_toml",
]


def is_import_path(value: str) -> bool:
    """Whether ``value`` has the form ``package.module:name`` (a user's model
    builder or dataset loader, :mod:`fedfdp.user_code`).
    """
    return bool(IMPORT_PATH.match(value))


def config_keys() -> tuple[str, ...]:
    """All accepted keys, in documentation order."""
    return tuple(KEY_TABLE)


def load_config(mapping: Mapping[str, Any] | None = None, *, base: Config | None = None) -> Config:
    """Parse and validate a flat kebab-case mapping into a frozen :class:`Config`.

    Parameters
    ----------
    mapping : Mapping[str, Any], optional
        Keys from :func:`config_keys`; missing keys keep the value of ``base``
        (defaults when ``base`` is None), except that a ``device-column``
        without ``num-devices`` means one device per value of the column
        (``num-devices = 0``, :func:`fedfdp.run_plan.resolve_released`).
    base : Config, optional
        Configuration the mapping overrides.

    Raises
    ------
    ConfigError
        Unknown key (with a suggestion), wrong type, out-of-range value, or an
        inconsistent combination; the message names the key and the value.

    Examples
    --------
    >>> from fedfdp import load_config
    >>> cfg = load_config({"mode": "dp", "target-epsilon": 1.0, "num-rounds": 20})
    >>> cfg.privacy.mode, cfg.privacy.num_rounds
    ('dp', 20)
    >>> cfg.privacy.mode is Mode.DP
    True
    >>> load_config({"mode": "dp", "noise-multiplier": 1.1, "delta": ""}).privacy.delta is None
    True
    """
    if mapping is not None and not isinstance(mapping, Mapping):
        raise ConfigError(f"mapping={mapping!r}: must be a mapping of configuration keys to values (a dict "
                          f"such as {{'mode': 'dp'}}), not a {type(mapping).__name__}")
    if base is not None and not isinstance(base, Config):
        raise ConfigError(f"base={base!r}: must be a Config")
    base = base or Config()
    sections: dict[str, dict[str, Any]] = {
        name: {f.name: getattr(getattr(base, name), f.name) for f in fields(getattr(base, name))}
        for name in Section
    }
    for key, value in (mapping or {}).items():
        if not isinstance(key, str):
            raise ConfigError(f"{key!r}={value!r}: configuration keys are strings (kebab-case, such as "
                              "'num-rounds')")
        if key in IGNORED_KEYS:
            continue
        if key not in KEY_TABLE:
            close = difflib.get_close_matches(key, KEY_TABLE, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{key}={value!r}: unknown configuration key{hint}")
        spec = KEY_TABLE[key]
        sections[spec.section][spec.attr] = parse_value(key, spec.kind, value)
    if mapping and mapping.get("device-column") and "num-devices" not in mapping:
        sections[Section.DATA]["num_devices"] = 0  # one device per unit of the column (resolve_released)
    privacy = sections[Section.PRIVACY]
    if (privacy["mode"] == Mode.FDP_DPSGD and privacy["public_pretrain_rounds"] == 0
            and "public-pretrain-rounds" not in (mapping or {})):
        # fdp-dpsgd needs public pre-training: unless the key is given, its default is the
        # paper's recipe scaled to the run (50 of the default 150 rounds, at most a third)
        privacy["public_pretrain_rounds"] = fdp_dpsgd_pretrain_rounds(privacy["num_rounds"])
    privacy_config = PrivacyConfig(**sections[Section.PRIVACY])
    sections[Section.DATA]["protected"] = protected(privacy_config)  # before the data section's checks
    return Config(
        privacy=privacy_config,
        training=TrainingConfig(**sections[Section.TRAINING]),
        data=DataConfig(**sections[Section.DATA]),
        run=RunConfig(**sections[Section.RUN]),
    )


#: Public pre-training rounds of ``fdp-dpsgd`` when ``public-pretrain-rounds`` is not given.
FDP_DPSGD_PRETRAIN_ROUNDS = 50


def default_record() -> dict[str, Any]:
    """The flat record (:meth:`Config.to_flat`) of the default configuration: the value a
    key had in a run recorded before the key existed (a new key's default keeps the
    behaviour of the code before it).
    """
    return Config().to_flat()


def fdp_dpsgd_pretrain_rounds(num_rounds: int) -> int:
    """``fdp-dpsgd``'s default public pre-training: ``min(50, max(1, num_rounds // 3))``.

    >>> fdp_dpsgd_pretrain_rounds(150), fdp_dpsgd_pretrain_rounds(30), fdp_dpsgd_pretrain_rounds(2)
    (50, 10, 1)
    """
    return min(FDP_DPSGD_PRETRAIN_ROUNDS, max(1, int(num_rounds) // 3))


def keys_for_mode(mapping: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The keys of ``mapping`` that act in ``mode`` (:attr:`KeySpec.applies`), for one
    set of keys shared by runs of several modes (``fedfdp compare``'s rule): a key
    that has no effect in ``mode`` is left out instead of being refused.

    Examples
    --------
    >>> keys_for_mode({"noise-multiplier": 1.0, "learning-rate": 0.5}, "public")
    {'learning-rate': 0.5}
    """
    def acts(key: str) -> bool:
        spec = KEY_TABLE.get(key)
        return spec is None or spec.applies is None or spec.applies.admits("mode", str(mode))

    return {k: v for k, v in mapping.items() if acts(k)}


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` from the command line; the value is read as a TOML
    literal (``1e-5``, ``true``, ``"fdp"``), falling back to a bare string.
    """
    if "=" not in text:
        raise ConfigError(f"{text!r}: expected key=value")
    key, raw = text.split("=", 1)
    key, raw = key.strip(), raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def load_toml_file(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is a :class:`ConfigError`
    naming it (``config='...'``).
    """
    from fedfdp.input_files import regular_file

    if Path(path).is_dir():
        raise ConfigError(f"config={str(path)!r}: is a directory, not a TOML file")
    path = regular_file(path, "config")  # a FIFO or /dev/zero would never end
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config={str(path)!r}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"config={str(path)!r}: cannot read ({exc.strerror or exc})") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config={str(path)!r}: not valid TOML ({exc})") from exc


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read an experiment TOML file: flat keys at the top level, or under
    ``[tool.flwr.app.config]`` (so ``pyproject.toml`` works too) — not both: a
    file with configuration keys at the top level beside that table is refused,
    naming them (neither place silently wins).
    """
    data = load_toml_file(path)
    app = _flwr_app_config(data, path)
    if app is not None:
        stray = sorted(k for k in data if k in KEY_TABLE)
        if stray:
            raise ConfigError(
                f"config={str(path)!r}: keys {stray} at the top level and a [tool.flwr.app.config] table; "
                "put every key in one of the two places"
            )
        return dict(app)
    data.pop("resolved", None)  # values a run resolved at start (written by fedfdp run)
    return data


def _flwr_app_config(data: Mapping[str, Any], path: str | Path) -> Mapping[str, Any] | None:
    """``[tool.flwr.app.config]`` of a TOML document (None when absent); every level of the
    path must be a table, refused in one line naming the first one that is not.
    """
    node: Any = data
    trail = []
    for part in ("tool", "flwr", "app", "config"):
        trail.append(part)
        node = node.get(part)
        if node is None:
            return None
        if not isinstance(node, Mapping):
            raise ConfigError(f"config={str(path)!r}: {'.'.join(trail)}={node!r} must be a table "
                              f"([{'.'.join(trail)}]) of configuration keys")
    return node
