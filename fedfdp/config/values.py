"""The parsers of configuration values, one per :class:`~fedfdp.config.keys.Kind`.

:func:`parse_value` turns a TOML / Flower run-config value into the typed value
of the frozen dataclasses (:mod:`fedfdp.config.schema`) — an enum member for a
closed choice, ``None`` for a key left unset (``""``) — or raises a
:class:`ConfigError` naming the key and the value; :func:`flat_value` is its
inverse. The dispatch is a closed mapping ``Kind -> parser`` checked on import
to cover every kind: a kind without a parser is an :class:`UnknownKindError`,
never a silent fallback.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from fedfdp.config.choices import PAPER_FLOOR, TvFloor
from fedfdp.config.keys import KEY_TABLE, SPEC_OF_FIELD, KeySpec, Kind

#: ``package.module:attribute``: a user's model builder or dataset loader.
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class ConfigError(ValueError):
    """A configuration key has a bad value; the message names key and value.

    The command line prints it as one line, ``error: ...``, with exit status 2.

    Examples
    --------
    >>> from fedfdp import ConfigError, load_config
    >>> try:
    ...     load_config({"noise-multiplier": 0})
    ... except ConfigError as err:
    ...     print(err)
    noise-multiplier=0: must be > 0, or "" to leave it unset: σ is calibrated to the calibration target
    """


class UnknownKindError(LookupError):
    """A value kind that no parser handles: an internal error of the key table, not a user's."""


def _fail(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{key}={value!r}: {why}")


#: The largest integer a count key takes (rounds, devices, records, batch and layer sizes,
#: window, levels...): a signed 32-bit index, so every array, tensor and loop it sizes fits
#: the machine's integer types; a larger count could never run.
MAX_COUNT = 2**31 - 1
#: The largest seed (``seed``, ``data-seed``): a signed 64-bit integer.
MAX_SEED = 2**63 - 1
#: Integer keys bounded by :data:`MAX_SEED` instead of :data:`MAX_COUNT`.
SEED_KEYS = frozenset({"seed", "data-seed"})


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(key, value, "must be a number")
    try:
        out = float(value)
    except OverflowError:  # an integer beyond every float
        raise _fail(key, value, "must be finite") from None
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
    if key in SEED_KEYS:
        if abs(value) > MAX_SEED:
            raise _fail(key, value, "must be below 2**63 (a 64-bit seed)")
    elif value > MAX_COUNT:
        raise _fail(key, value, f"must be at most {MAX_COUNT} (2**31 - 1, the largest count that fits "
                    "the arrays and loops it sizes)")
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
    a column named twice is refused.
    """
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
    contain commas).
    """
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
    insensitive column) or a table ``{speed = 0.3}``; each TV a number in [0, 1].
    """
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
    numeric model input, strictly increasing) or a table ``{speed = [-0.5, 0, 0.5]}``.
    """
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



#: What each kind accepts, in words (messages and the key reference).
KIND_TEXT: Mapping[Kind, str] = {
    Kind.FLOAT_POS: "a number > 0",
    Kind.FLOAT0: "a number >= 0",
    Kind.FLOAT01: "a number in [0, 1)",
    Kind.FLOAT01_OPEN: "a number in (0, 1)",
    Kind.UNIT: "a number in [0, 1]",
    Kind.PROB: "a number in (0, 1]",
    Kind.INT_POS: "an integer >= 1",
    Kind.INT0: "an integer >= 0",
    Kind.ODD_POS: "an odd integer >= 1",
    Kind.LEVELS: "an integer >= 2, or 0",
    Kind.BOOL: "true or false",
    Kind.STR: "a string",
    Kind.CHOICE: "one of the words listed",
    Kind.CHOICE_OR_PATH: "one of the words listed, or package.module:name",
    Kind.STRLIST: 'names: a list, or one string "a,b"',
    Kind.INTLIST: 'integers >= 1: a list, or one string "8,4"',
    Kind.CLASSES: 'labels: a list, or one string "a|b"',
    Kind.RANGES: '"column=low:high,..." or a table {column = [low, high]}',
    Kind.CATEGORIES: '"column=a|b,..." or a table {column = [a, b]}',
    Kind.TVS: '"column=TV,..." (TV in [0, 1]; * = every other) or a table',
    Kind.BINS: '"column=c1:c2:...,..." (increasing) or a table',
    Kind.FLOOR: '"paper" or a number in [0, 1]',
}


def _bounded_float(low: float, high: float, low_open: bool, high_open: bool, why: str) -> Callable[
    [str, Any], float
]:
    def parse(key: str, value: Any) -> float:
        out = _as_float(key, value)
        above = out > low if low_open else out >= low
        below = out < high if high_open else out <= high
        if not (above and below):
            raise _fail(key, value, why)
        return out

    return parse


def _bounded_int(check: Callable[[int], bool], why: str) -> Callable[[str, Any], int]:
    def parse(key: str, value: Any) -> int:
        out = _as_int(key, value)
        if not check(out):
            raise _fail(key, value, why)
        return out

    return parse


#: Why each odd key is odd (a refusal explains the key it names).
ODD_BECAUSE: Mapping[str, str] = {
    "blur-kernel": "the kernel is centred on a pixel",
    "secagg-neighbours": "a SuperNode and as many neighbours on each side of it in the SecAgg+ ring",
}


def _parse_odd(key: str, value: Any) -> int:
    out = _as_int(key, value)
    if out < 1 or out % 2 == 0:
        because = ODD_BECAUSE.get(key)
        raise _fail(key, value, "must be an odd integer >= 1" + (f" ({because})" if because else ""))
    return out


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _fail(key, value, "must be true or false")


def _parse_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(key, value, "must be a string")
    return value


def _parse_intlist(key: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        raw = [v.strip() for v in value.split(",")] if value.strip() else []
        try:
            ints = [_as_int(key, int(v)) for v in raw]
        except ValueError:
            raise _fail(key, value, "must be a list of positive integers") from None
    elif isinstance(value, list | tuple):
        ints = [_as_int(key, v) for v in value]
    else:
        raise _fail(key, value, "must be a list of positive integers")
    if any(v < 1 for v in ints):
        raise _fail(key, value, "must be a list of positive integers")
    return tuple(ints)


def _parse_floor(key: str, value: Any) -> float | TvFloor:
    if value == PAPER_FLOOR:
        return PAPER_FLOOR
    if isinstance(value, str) or not 0 <= _as_float(key, value) <= 1:
        raise _fail(key, value, f"must be {PAPER_FLOOR.value!r} ((m_s/m)^2, Eq. (3)) or a number in [0, 1]")
    return float(value)


def _parse_choice(key: str, value: Any) -> Any:
    spec = KEY_TABLE[key]
    if spec.choice_type is None:
        raise UnknownKindError(f"{key}: kind 'choice' without an enum (internal error of the key table)")
    if isinstance(value, str) and value in spec.choices:
        return spec.choice_type(value)
    raise _fail(key, value, f"must be one of {', '.join(spec.choices)}")


def _parse_choice_or_path(key: str, value: Any) -> str:
    spec = KEY_TABLE[key]
    if isinstance(value, str) and (value in spec.choices or IMPORT_PATH.match(value)):
        return value
    raise _fail(key, value, f"must be one of {', '.join(spec.choices)} or an import path "
                "'package.module:name' to your own")


#: The closed dispatch: every kind has exactly one parser.
PARSERS: Mapping[Kind, Callable[[str, Any], Any]] = {
    Kind.FLOAT_POS: _bounded_float(0.0, math.inf, True, True, "must be > 0"),
    Kind.FLOAT0: _bounded_float(0.0, math.inf, False, True, "must be >= 0"),
    Kind.FLOAT01: _bounded_float(0.0, 1.0, False, True, "must be in [0, 1)"),
    Kind.FLOAT01_OPEN: _bounded_float(0.0, 1.0, True, True, "must be in (0, 1)"),
    Kind.UNIT: _bounded_float(0.0, 1.0, False, False, "must be in [0, 1]"),
    Kind.PROB: _bounded_float(0.0, 1.0, True, False, "must be in (0, 1]"),
    Kind.INT_POS: _bounded_int(lambda v: v >= 1, "must be >= 1"),
    Kind.INT0: _bounded_int(lambda v: v >= 0, "must be >= 0"),
    Kind.ODD_POS: _parse_odd,
    Kind.LEVELS: _bounded_int(
        lambda v: v == 0 or v >= 2, "must be an integer >= 2 (quantisation levels) or 0 (the exact blur)"
    ),
    Kind.BOOL: _parse_bool,
    Kind.STR: _parse_str,
    Kind.CHOICE: _parse_choice,
    Kind.CHOICE_OR_PATH: _parse_choice_or_path,
    Kind.STRLIST: lambda key, value: tuple(_names(key, value)),
    Kind.INTLIST: _parse_intlist,
    Kind.CLASSES: _parse_classes,
    Kind.RANGES: _parse_ranges,
    Kind.CATEGORIES: _parse_categories,
    Kind.TVS: _parse_tvs,
    Kind.BINS: _parse_bins,
    Kind.FLOOR: _parse_floor,
}


def _plain(value: Any) -> Any:
    """An enum member as its plain value (``Mode.DP`` -> ``"dp"``); anything else unchanged."""
    return value.value if isinstance(value, Enum) else value


#: The inverse of each parser: the flat (TOML scalar) form of a parsed value.
WRITERS: Mapping[Kind, Callable[[Any], Any]] = {
    **{k: _plain for k in (Kind.FLOAT_POS, Kind.FLOAT0, Kind.FLOAT01, Kind.FLOAT01_OPEN, Kind.UNIT,
                           Kind.PROB, Kind.INT_POS, Kind.INT0, Kind.ODD_POS, Kind.LEVELS, Kind.BOOL,
                           Kind.STR, Kind.CHOICE, Kind.CHOICE_OR_PATH, Kind.FLOOR)},
    Kind.STRLIST: lambda value: ",".join(str(v) for v in value),
    Kind.INTLIST: lambda value: ",".join(str(v) for v in value),
    Kind.CLASSES: lambda value: "|".join(value),
    Kind.RANGES: lambda value: ",".join(f"{n}={lo!r}:{hi!r}" for n, lo, hi in value),
    Kind.CATEGORIES: lambda value: ",".join(f"{n}={'|'.join(c)}" for n, c in value),
    Kind.TVS: lambda value: ",".join(f"{n}={v!r}" for n, v in value),
    Kind.BINS: lambda value: ",".join(f"{n}={':'.join(repr(e) for e in edges)}" for n, edges in value),
}

for _table, _what in ((PARSERS, "parser"), (WRITERS, "writer"), (KIND_TEXT, "description")):
    _missing = sorted(set(Kind) - set(_table))
    if _missing:
        raise UnknownKindError(f"value kind(s) {_missing} have no {_what} (fedfdp.config.values)")


def _as_kind(key: str, kind: Kind | str) -> Kind:
    try:
        return Kind(kind)
    except ValueError:
        raise UnknownKindError(
            f"{key}: unknown value kind {kind!r} (an internal error of the key table; kinds: "
            f"{', '.join(Kind)})"
        ) from None


def is_unset(spec: KeySpec, value: Any) -> bool:
    """Whether ``value`` spells "not set" for ``spec``: ``None``, ``""`` or the key's word (``auto``)."""
    if not spec.optional:
        return False
    return value is None or value == "" or (bool(spec.unset_word) and value == spec.unset_word)


def unset_spelling(spec: KeySpec) -> str:
    """How "not set" is written in TOML for ``spec``: ``""``, or its word (``"auto"``)."""
    return f'"{spec.unset_word}"'


def parse_value(key: str, kind: Kind | str, value: Any) -> Any:
    """The typed value of ``key`` (of value kind ``kind``) from its TOML / run-config form.

    Parameters
    ----------
    key : str
        A key of :data:`~fedfdp.config.keys.KEY_TABLE`.
    kind : Kind or str
        Its value kind.
    value : Any
        The raw value; ``None`` or ``""`` leave an optional key unset (``None``).

    Raises
    ------
    ConfigError
        A bad value; the one-line message names the key and the value, and for an
        optional key says how to leave it unset.
    UnknownKindError
        ``kind`` is not a :class:`~fedfdp.config.keys.Kind` (an internal error).
    """
    kind = _as_kind(key, kind)
    spec = KEY_TABLE.get(key)
    if spec is not None and spec.optional:
        if is_unset(spec, value):
            return None
        unset = f"or {unset_spelling(spec)} to leave it unset: {spec.unset}"
        if isinstance(value, str) and kind is not Kind.STR:
            raise _fail(key, value, f"must be {KIND_TEXT[kind]}, {unset}")
        try:
            return PARSERS[kind](key, value)
        except ConfigError as exc:
            raise ConfigError(f"{exc}, {unset}") from None
    if value is None:
        raise _fail(key, value, f"must be set ({KIND_TEXT[kind]})")
    return PARSERS[kind](key, value)


def flat_value(spec: KeySpec, value: Any) -> Any:
    """The flat (TOML scalar) form of a parsed value of ``spec``; inverse of :func:`parse_value`.

    ``None`` (not set) is written ``""`` (``clipping-quantile``: ``"auto"``);
    enum members as their plain strings.
    """
    if value is None:
        return spec.unset_word
    return WRITERS[spec.kind](value)


def validated_value(section: str, attr: str, value: Any) -> Any:
    """A typed field value checked as its key's parser would check it (the same
    message as the TOML path), normalised; ``None`` stays unset for optional keys.
    """
    spec = SPEC_OF_FIELD[(section, attr)]
    if value is None and spec.optional:
        return None
    return parse_value(spec.key, spec.kind, flat_value(spec, value))
