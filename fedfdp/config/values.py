"""Configuration keys, their kinds and the parsers of their values.

``KEY_TABLE`` maps every kebab-case key to its section, attribute and kind; the
parsers turn a TOML / Flower run-config value into the typed value of the
frozen dataclasses (:mod:`fedfdp.config.schema`), or raise a
:class:`ConfigError` naming the key and the value.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from typing import Any

#: ``package.module:attribute``: a user's model builder or dataset loader.
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")

MODES = ("nonprivate", "public", "dp", "fdp", "fdp-dpsgd", "corrdp")
PRIVATE_MODES = ("dp", "fdp", "fdp-dpsgd", "corrdp")
PUBLIC_LOSSES = ("auto", "gaussian", "zero", "mean", "label-free")
PRIVACY_UNITS = ("record", "device")
OPTIMIZERS = ("sgd", "adam")
MODELS = ("mlp", "logistic", "cnn")
DATASETS = ("fleet", "watch", "storms", "purchase100", "criteo", "csv", "cps1988", "health-insurance",
            "nlswork", "hmda", "correlated", "mnist5k", "digits", "images")
#: Image datasets (``(C, H, W)`` records; Ψ = the Gaussian blur of ``blur-kernel``, ``blur-sigma``).
IMAGE_DATASETS = ("mnist5k", "digits", "images")
#: ``corrdp-clip-shares``: per-block clipping shares of CorrDP-SGD.
CLIP_SHARES = ("proportional", "equal")
#: ``corrdp-tv-floor`` meaning the paper's floor ``(m_s/m)²`` of Eq. (3).
PAPER_FLOOR = "paper"
#: Where the training records live: ``central`` (every node loads the dataset
#: the run names and serves its partition) or ``node`` (each SuperNode reads
#: its own file, named in its node config).
DATA_LOCATIONS = ("central", "node")


class ConfigError(ValueError):
    """A configuration key has a bad value; the message names key and value.

    The command line prints it as one line, ``error: ...``, with exit status 2.

    Examples
    --------
    >>> from fedfdp import ConfigError, load_config
    >>> try:
    ...     load_config({"noise-multiplier": -1.0})
    ... except ConfigError as err:
    ...     print(err)
    noise-multiplier=-1.0: must be > 0 (or 0 for unset)
    """


# key -> (section, attribute, kind). kind: "float+", "float01", "unit0" ([0, 1]), "int+", "int0",
# "choice", "tvs" / "bins" / "floor" (CorrDP), ...
KEY_TABLE: dict[str, tuple[str, str, str]] = {
    "mode": ("privacy", "mode", "choice"),
    "noise-multiplier": ("privacy", "noise_multiplier", "optfloat+"),
    "target-epsilon": ("privacy", "target_epsilon", "optfloat+"),
    "max-epsilon": ("privacy", "max_epsilon", "optfloat+"),
    "delta": ("privacy", "delta", "optdelta"),
    "clipping-norm": ("privacy", "clipping_norm", "float+"),
    "clipping-quantile": ("privacy", "clipping_quantile", "quantile"),
    "clipping-learning-rate": ("privacy", "clipping_learning_rate", "float+"),
    "clipping-budget-share": ("privacy", "clipping_budget_share", "float01open"),
    "sampling-rate": ("privacy", "sampling_rate", "prob"),
    "public-batch-size": ("privacy", "public_batch_size", "int+"),
    "public-loss": ("privacy", "public_loss", "choice"),
    "public-pretrain-rounds": ("privacy", "public_pretrain_rounds", "int0"),
    "privacy-unit": ("privacy", "privacy_unit", "choice"),
    "device-sampling-rate": ("privacy", "device_sampling_rate", "optprob"),
    "num-rounds": ("privacy", "num_rounds", "int+"),
    "clients-per-round": ("privacy", "clients_per_round", "int0"),
    "reproducible-noise": ("privacy", "reproducible_noise", "bool"),
    "sensitive-columns": ("privacy", "sensitive_columns", "strlist"),
    "insensitive-tv": ("privacy", "insensitive_tv", "tvs"),
    "tv-estimate": ("privacy", "tv_estimate", "bool"),
    "tv-bins": ("privacy", "tv_bins", "bins"),
    "tv-min-prob": ("privacy", "tv_min_prob", "unit0"),
    "tv-delta": ("privacy", "tv_delta", "optdelta"),
    "corrdp-weight-bound": ("privacy", "corrdp_weight_bound", "float+"),
    "corrdp-feature-bound": ("privacy", "corrdp_feature_bound", "optfloat+"),
    "corrdp-tv-floor": ("privacy", "corrdp_tv_floor", "floor"),
    "corrdp-clip-shares": ("privacy", "corrdp_clip_shares", "choice"),
    "alpha": ("training", "alpha", "float+"),
    "learning-rate": ("training", "learning_rate", "float+"),
    "momentum": ("training", "momentum", "float01"),
    "optimizer": ("training", "optimizer", "choice"),
    "model": ("training", "model", "choice-or-path"),
    "hidden-size": ("training", "hidden_size", "int+"),
    "hidden-sizes": ("training", "hidden_sizes", "intlist"),
    "cnn-width": ("training", "cnn_width", "int+"),
    "dataset": ("data", "dataset", "choice-or-path"),
    "num-devices": ("data", "num_devices", "int0"),
    "records-per-device": ("data", "records_per_device", "int+"),
    "test-fraction": ("data", "test_fraction", "float01open"),
    "data-seed": ("data", "data_seed", "int0"),
    "data-path": ("data", "data_path", "str"),
    "public-columns": ("data", "public_columns", "strlist"),
    "private-columns": ("data", "private_columns", "strlist"),
    "label-column": ("data", "label_column", "str"),
    "device-column": ("data", "device_column", "str"),
    "dirichlet-alpha": ("data", "dirichlet_alpha", "float0"),
    "blur-kernel": ("data", "blur_kernel", "odd+"),
    "blur-sigma": ("data", "blur_sigma", "float+"),
    "blur-levels": ("data", "blur_levels", "levels"),
    "image-pool": ("data", "image_pool", "int+"),
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
    "num-sensitive": ("data", "num_sensitive", "int+"),
    "num-insensitive": ("data", "num_insensitive", "int+"),
    "correlation": ("data", "correlation", "unit0"),
    "label-signal": ("data", "label_signal", "float+"),
    "seed": ("training", "seed", "int0"),
    "eval-every": ("run", "eval_every", "int+"),
    "out-dir": ("run", "out_dir", "str"),
    "checkpoint-every": ("run", "checkpoint_every", "int0"),
    "resume": ("run", "resume", "bool"),
    "node-wait-timeout": ("run", "node_wait_timeout", "float+"),
    "round-timeout": ("run", "round_timeout", "float+"),
    "progress": ("run", "progress", "bool"),
}

#: (section, attribute) -> key
_KEY_OF: dict[tuple[str, str], str] = {(sec, attr): key for key, (sec, attr, _) in KEY_TABLE.items()}

_CHOICES: dict[str, tuple[str, ...]] = {
    "mode": MODES,
    "public-loss": PUBLIC_LOSSES,
    "privacy-unit": PRIVACY_UNITS,
    "optimizer": OPTIMIZERS,
    "model": MODELS,
    "dataset": DATASETS,
    "data-location": DATA_LOCATIONS,
    "corrdp-clip-shares": CLIP_SHARES,
}

#: Keys that are not run settings but may appear in shared TOML files
#: (Flower injects ``server-round`` into client configs).
IGNORED_KEYS = frozenset({"server-round"})


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
    """``{col = [...]}`` tables or ``"col=...,col=..."`` strings, as (col, raw) pairs;
    a column named twice is refused."""
    if isinstance(value, Mapping):
        out = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str):
        out = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if "=" not in part:
                raise _fail(key, value, f"entry {part!r} is not column=...")
            name, raw = part.split("=", 1)
            out.append((name.strip(), raw.strip()))
    else:
        raise _fail(key, value, "must be a table {column = ...} or a string 'column=...,column=...'")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise _fail(key, value, "a column is declared twice")
    return out


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


def _parse_tvs(key: str, value: Any) -> tuple[tuple[str, float], ...]:
    """``insensitive-tv``: ``"speed=0.3,hour=0.1,*=0.5"`` (``*``: every other
    insensitive column) or a table ``{speed = 0.3}``; each TV a number in [0, 1]."""
    out = []
    for name, raw in _entries(key, value):
        if not name:
            raise _fail(key, value, "an entry has no column name")
        try:
            tv = float(raw) if isinstance(raw, str) else _as_float(key, raw)
        except (ValueError, ConfigError):
            raise _fail(key, value, f"TV of {name!r} = {raw!r} is not a number") from None
        if not (math.isfinite(tv) and 0.0 <= tv <= 1.0):
            raise _fail(key, value, f"TV of {name!r} = {raw!r} must be in [0, 1]")
        out.append((name, tv))
    return tuple(out)


def _parse_bins(key: str, value: Any) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """``tv-bins``: ``"speed=-0.5:0:0.5,hour=0"`` (interior cut points of each
    numeric model input, strictly increasing) or a table ``{speed = [-0.5, 0, 0.5]}``."""
    out = []
    for name, raw in _entries(key, value):
        try:
            if isinstance(raw, str):
                edges = tuple(float(v) for v in raw.split(":"))
            elif isinstance(raw, list | tuple):
                edges = tuple(_as_float(key, v) for v in raw)
            else:
                edges = (_as_float(key, raw),)
        except (ValueError, ConfigError):
            raise _fail(key, value, f"cut points of {name!r} must be numbers a:b:c") from None
        if not edges or not all(math.isfinite(e) for e in edges) or any(
            b <= a for a, b in itertools.pairwise(edges)
        ):
            raise _fail(key, value, f"cut points of {name!r} must be finite and strictly increasing")
        out.append((name, edges))
    return tuple(out)


def flat_value(kind: str, value: Any) -> Any:
    """The flat (TOML scalar) form of a parsed value; inverse of :func:`parse_value`."""
    if kind in ("strlist", "intlist"):
        return ",".join(str(v) for v in value)
    if kind == "classes":
        return "|".join(value)
    if kind == "ranges":
        return ",".join(f"{n}={lo!r}:{hi!r}" for n, lo, hi in value)
    if kind == "categories":
        return ",".join(f"{n}={'|'.join(c)}" for n, c in value)
    if kind == "tvs":
        return ",".join(f"{n}={v!r}" for n, v in value)
    if kind == "bins":
        return ",".join(f"{n}={':'.join(repr(e) for e in edges)}" for n, edges in value)
    if kind == "quantile" and value is None:
        return "auto"
    return value


def validated_value(section: str, attr: str, value: Any) -> Any:
    """A typed field value checked as its key's parser would check it (the same
    message as the TOML path), normalised; ``None`` stays unset for optional keys."""
    key = _KEY_OF[(section, attr)]
    kind = KEY_TABLE[key][2]
    if value is None and (kind.startswith("opt") or kind == "quantile"):
        return None
    if value is None:
        raise _fail(key, value, "must be set")
    return parse_value(key, kind, flat_value(kind, value))


def parse_value(key: str, kind: str, value: Any) -> Any:
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
    if kind == "tvs":
        return _parse_tvs(key, value)
    if kind == "bins":
        return _parse_bins(key, value)
    if kind == "floor":
        if value == PAPER_FLOOR:
            return value
        if isinstance(value, str) or not 0 <= _as_float(key, value) <= 1:
            raise _fail(key, value, f"must be {PAPER_FLOOR!r} ((m_s/m)^2, Eq. (3)) or a number in [0, 1]")
        return float(value)
    if kind == "quantile":
        if value == "auto":
            return None
        if isinstance(value, str):
            raise _fail(key, value, "must be 'auto' (the mode's recipe) or a number in [0, 1)")
        return parse_value(key, "float01", value)
    if kind in ("choice", "choice-or-path"):
        choices = _CHOICES[key]
        path = kind == "choice-or-path" and isinstance(value, str) and IMPORT_PATH.match(value)
        if isinstance(value, str) and (value in choices or path):
            return value
        extra = " or an import path 'package.module:name' to your own" if kind == "choice-or-path" else ""
        raise _fail(key, value, f"must be one of {', '.join(choices)}{extra}")
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
    if kind == "odd+":
        out = _as_int(key, value)
        if out < 1 or out % 2 == 0:
            raise _fail(key, value, "must be an odd integer >= 1 (the kernel is centred on a pixel)")
        return out
    if kind == "levels":
        out = _as_int(key, value)
        if out == 1 or out < 0:
            raise _fail(key, value, "must be an integer >= 2 (quantisation levels) or 0 (the exact blur)")
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
            unset = "delta/2" if key == "tv-delta" else "1/(2N)"
            raise _fail(key, value, f"must be in (0, 1) (or 0 for {unset})")
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
    elif kind == "unit0" and not 0 <= out <= 1:
        raise _fail(key, value, "must be in [0, 1]")
    return out
