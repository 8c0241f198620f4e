"""A comparison sweep planned: every run of ``fedfdp compare``, validated before any starts.

:func:`parse_sweep` splits a sweep document (the format is in :mod:`simulations.compare`)
into the base keys, the three sweep lists (``modes``, ``target-epsilons``, ``seeds``) and
the per-mode ``[mode.NAME]`` tables (:class:`Sweep`); :func:`plan_runs` builds every run's
validated configuration (:class:`RunSpec`: mode, target ε, seed, configuration and its
:func:`config_hash`, the identity a restarted sweep matches in ``results.csv``), giving
each mode only the shared keys that act in it (:func:`shared_keys_for`);
:func:`validate_runs` loads every dataset and resolves every privacy plan (the calibrated
σ of each private run) before any run starts. Bad keys or values raise
:class:`~fedfdp.config.ConfigError` naming the key and the value.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfdp.config import (
    KEY_TABLE,
    MODES,
    ORCHESTRATION_KEYS,
    PRIVATE_MODES,
    Config,
    ConfigError,
    keys_for_mode,
    load_config,
    parse_override,
)

SWEEP_KEYS = ("modes", "target-epsilons", "seeds")
#: Keys fixed per run by the sweep itself.
_PER_RUN = ("mode", "seed", "target-epsilon", "noise-multiplier", "out-dir", "progress")
#: Keys that do not change what a run computes (left out of the configuration hash):
#: the configuration's ``run`` section.
NOT_HASHED = ORCHESTRATION_KEYS


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep: base keys, the three lists and per-mode overrides."""

    base: dict[str, Any]
    modes: tuple[str, ...]
    target_epsilons: tuple[float, ...]
    seeds: tuple[int, ...]
    per_mode: dict[str, dict[str, Any]]

    def as_toml(self) -> dict[str, Any]:
        """The sweep as a TOML document (written to ``sweep.toml``)."""
        doc: dict[str, Any] = dict(self.base)
        doc["modes"] = list(self.modes)
        doc["target-epsilons"] = list(self.target_epsilons)
        doc["seeds"] = list(self.seeds)
        if self.per_mode:
            doc["mode"] = {m: dict(v) for m, v in self.per_mode.items()}
        return doc


@dataclass(frozen=True)
class RunSpec:
    """One run of the sweep."""

    mode: str
    target_epsilon: float | None
    seed: int
    cfg: Config
    config_hash: str

    @property
    def key(self) -> tuple[str, float | None, int]:
        """Identity in ``results.csv``."""
        return (self.mode, self.target_epsilon, self.seed)

    @property
    def tag(self) -> str:
        """Directory name of the run's outputs."""
        eps = "ref" if self.target_epsilon is None else f"eps{self.target_epsilon:g}"
        return f"{self.mode}_{eps}_seed{self.seed}"


def _list(key: str, value: Any, kind: type) -> tuple[Any, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}={value!r}: must be a non-empty list")
    out = []
    for v in value:
        if kind is float:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{key}={value!r}: {v!r} is not a positive number")
            out.append(float(v))
        elif kind is int:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{key}={value!r}: {v!r} is not an integer >= 0")
            out.append(v)
        else:
            if v not in MODES:
                raise ConfigError(f"{key}={value!r}: {v!r} is not a mode ({', '.join(MODES)})")
            out.append(v)
    if len(set(out)) != len(out):
        raise ConfigError(f"{key}={value!r}: repeated value")
    return tuple(out)


def parse_sweep(doc: Mapping[str, Any], overrides: Sequence[str] = ()) -> Sweep:
    """Split a compare document into base keys, sweep lists and per-mode tables.

    ``overrides`` (``key=value``) apply to the base keys or the sweep lists.
    """
    doc = dict(doc)
    app = doc.get("tool", {}).get("flwr", {}).get("app", {}).get("config") if "tool" in doc else None
    if app is not None:
        doc = dict(app)
    for item in overrides:
        key, value = parse_override(item)
        doc[key] = value
    per_mode_raw = doc.pop("mode", {})
    if isinstance(per_mode_raw, str):
        raise ConfigError(
            f"mode={per_mode_raw!r}: a comparison sweeps modes; use modes = [...] "
            "(and [mode.NAME] tables for per-mode keys)"
        )
    if not isinstance(per_mode_raw, Mapping):
        raise ConfigError(f"mode={per_mode_raw!r}: must be tables [mode.NAME]")
    defaults = {"modes": ["nonprivate", "public", "dp", "fdp"], "target-epsilons": [1.0, 2.0, 4.0],
                "seeds": [0, 1, 2]}
    modes = _list("modes", doc.pop("modes", defaults["modes"]), str)
    targets = _list("target-epsilons", doc.pop("target-epsilons", defaults["target-epsilons"]), float)
    seeds = _list("seeds", doc.pop("seeds", defaults["seeds"]), int)
    per_mode: dict[str, dict[str, Any]] = {}
    for name, table in per_mode_raw.items():
        if name not in MODES:
            raise ConfigError(f"[mode.{name}]: {name!r} is not a mode ({', '.join(MODES)})")
        if name not in modes:
            raise ConfigError(f"[mode.{name}]: mode {name!r} is not in modes={list(modes)}")
        if not isinstance(table, Mapping):
            raise ConfigError(f"[mode.{name}]: must be a table of keys")
        fixed = [k for k in table if k in _PER_RUN or k in SWEEP_KEYS]
        if fixed:
            raise ConfigError(f"[mode.{name}] {fixed[0]}={table[fixed[0]]!r}: set by the sweep itself")
        per_mode[name] = dict(table)
    fixed = [k for k in doc if k in ("mode", "seed", "target-epsilon", "noise-multiplier")]
    if fixed:
        raise ConfigError(
            f"{fixed[0]}={doc[fixed[0]]!r}: set per run by the sweep (use modes, target-epsilons, seeds)"
        )
    return Sweep(doc, modes, targets, seeds, per_mode)


def config_hash(cfg: Config) -> str:
    """Short hash of everything that changes what a run computes."""
    flat = {k: v for k, v in cfg.to_flat().items() if k not in NOT_HASHED}
    text = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def shared_keys_for(base: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The sweep's shared keys that act in ``mode``.

    The one rule of a sweep's shared keys: they are given to every mode in which
    they have an effect (the key table's scope, :attr:`fedfdp.config.KeySpec.applies`:
    ``clipping-norm`` reaches ``dp`` and ``fdp``, not ``nonprivate`` or ``public``;
    :func:`fedfdp.config.keys_for_mode`); a shared key that acts in none of the
    sweep's modes is refused by :func:`plan_runs`, and a key of a ``[mode.NAME]``
    table must act in that mode.
    """
    return keys_for_mode(base, mode)


def plan_runs(sweep: Sweep, out: Path) -> list[RunSpec]:
    """Every run of the sweep, each configuration validated."""
    runs = []
    for key, value in sweep.base.items():
        spec = KEY_TABLE.get(key)
        if spec is not None and spec.applies is not None and not any(
            spec.applies.admits("mode", m) for m in sweep.modes
        ):
            raise ConfigError(f"{key}={value!r}: has no effect in modes={list(sweep.modes)} (it applies with "
                              f"{spec.applies.text()}); remove it")
    for mode in sweep.modes:
        targets: Sequence[float | None] = sweep.target_epsilons if mode in PRIVATE_MODES else [None]
        for eps in targets:
            for seed in sweep.seeds:
                mapping = shared_keys_for(sweep.base, mode)
                mapping.update(sweep.per_mode.get(mode, {}))
                mapping.update(
                    {"mode": mode, "seed": seed, "noise-multiplier": None, "progress": False,
                     "target-epsilon": eps}
                )
                if eps is not None and mapping.get("max-epsilon"):
                    mapping["max-epsilon"] = max(float(mapping["max-epsilon"]), eps)
                try:
                    cfg = load_config(mapping)
                except ConfigError as exc:
                    raise ConfigError(f"mode {mode!r}: {exc}") from exc
                untagged = RunSpec(mode, eps, seed, cfg, config_hash(cfg))
                tagged = load_config({"out-dir": str(out / "runs" / untagged.tag)}, base=cfg)
                runs.append(RunSpec(mode, eps, seed, tagged, untagged.config_hash))
    return runs


def validate_runs(runs: Sequence[RunSpec]) -> dict[str, float]:
    """Load every dataset and resolve every privacy plan before any run starts.

    Returns the calibrated σ of each private run (by tag). Raises on bad data
    or an unreachable target ε.
    """
    from fedfdp.data import load_dataset
    from fedfdp.models import build_model_for
    from fedfdp.run_plan import feature_map_for, mechanism_for

    sigmas: dict[str, float] = {}
    cache: dict[Any, float] = {}
    for run in runs:
        data = load_dataset(run.cfg.data)
        feature_map_for(run.cfg, data)
        build_model_for(run.cfg.training, data)
        if run.cfg.privacy.is_private:
            key = (run.cfg.privacy, run.cfg.data, data.num_records)
            if key not in cache:
                plan = mechanism_for(run.cfg, data)
                cache[key] = float(plan.noise_multiplier)  # type: ignore[arg-type]
            sigmas[run.tag] = cache[key]
    return sigmas
