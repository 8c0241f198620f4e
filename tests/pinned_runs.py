"""What a run releases, pinned: the behaviour a refactoring must not change.

Every case is a small configuration run to its end with ``reproducible-noise = true``
on both engines (the centralised engine, and the real strategy and client handlers on
an in-process Flower grid), out-dir set. Its fingerprint is read back from the files
the run wrote, so it does not depend on how the code is organised:

* the resolved mechanism's digest and the whole ledger (every entry's hash: the events
  charged, in order);
* ``config.toml``'s ``[resolved]`` table;
* every row of ``metrics.csv`` (ε to the last digit, δ, the normaliser, ``C``, σ, the
  reply counts; the held-out metrics, which follow from the model);
* the final model (``model.pt``): with reproducible noise the whole trajectory of public
  and secret draws ends in it;
* ``fedfdp account --run DIR --json``: the ledger replayed.

The reference (``tests/data/pinned_runs.json``) was written by this module from the
code before the configuration's one door (issue "The configuration has one door", main
6126ba6): ``python -m tests.pinned_runs --write``. Secure aggregation draws its noise
from each party's OS CSPRNG whatever the configuration says, so its model and held-out
metrics are not pinned (everything else is).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

REFERENCE = Path(__file__).parent / "data" / "pinned_runs.json"

#: Keys every case shares (small and fast; reproducible so the trajectory is a function
#: of the configuration).
BASE: dict[str, Any] = {
    "num-devices": 5, "records-per-device": 40, "num-rounds": 4, "sampling-rate": 0.2,
    "public-batch-size": 24, "seed": 3, "reproducible-noise": True, "progress": False,
}

CORRDP: dict[str, Any] = {
    "mode": "corrdp", "dataset": "correlated", "num-sensitive": 1, "num-insensitive": 3,
    "correlation": 0.5, "corrdp-weight-bound": 0.8, "noise-multiplier": 1.5, "clipping-norm": 0.5,
    "learning-rate": 2.0,
}

#: name -> (keys on top of BASE, engines). A table file is written for the "csv" cases.
CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "fdp-default": ({}, ("centralised", "flower")),
    "fdp-sigma": ({"noise-multiplier": 1.3, "clipping-quantile": 0.0}, ("centralised", "flower")),
    "fdp-adaptive": ({"noise-multiplier": 1.3, "clipping-quantile": 0.6}, ("centralised", "flower")),
    "dp-cap": ({"mode": "dp", "noise-multiplier": 0.8, "max-epsilon": 3.0, "num-rounds": 6},
               ("centralised", "flower")),
    "dp-target": ({"mode": "dp", "target-epsilon": 3.0}, ("centralised", "flower")),
    "dp-replacement-delta": ({"mode": "dp", "noise-multiplier": 1.1, "delta": 1e-4},
                             ("centralised", "flower")),
    "fdp-dpsgd": ({"mode": "fdp-dpsgd", "public-pretrain-rounds": 1}, ("centralised", "flower")),
    "public": ({"mode": "public", "sampling-rate": ""}, ("centralised", "flower")),
    "nonprivate": ({"mode": "nonprivate"}, ("centralised", "flower")),
    "label-free": ({"public-loss": "label-free", "noise-multiplier": 1.2}, ("centralised", "flower")),
    "poisson-devices": ({"device-sampling-rate": 0.6, "target-epsilon": 4.0}, ("centralised", "flower")),
    "device-unit": ({"privacy-unit": "device", "device-sampling-rate": 0.8, "noise-multiplier": 2.0,
                     "clipping-quantile": 0.0}, ("centralised", "flower")),
    "nodes-per-round": ({"clients-per-round": 2, "mode": "dp"}, ("centralised", "flower")),
    "mlp-adam": ({"model": "mlp", "hidden-size": 8, "optimizer": "adam", "learning-rate": 0.01,
                  "mode": "dp", "noise-multiplier": 1.0}, ("centralised", "flower")),
    "corrdp": (CORRDP | {"insensitive-tv": "u0=0.1,u1=0.4,*=1.0"}, ("centralised", "flower")),
    "corrdp-target": (CORRDP | {"insensitive-tv": "*=0.5", "noise-multiplier": "", "target-epsilon": 4.0},
                      ("centralised",)),
    "corrdp-estimated-tvs": (CORRDP | {"insensitive-tv": "", "tv-estimate": True, "tv-bins": "*=0",
                                       "tv-min-prob": 0.2, "estimated-tvs": "u0=0.3,u1=0.45,u2=0.2"},
                             ("centralised", "flower")),
    "estimated-ranges": ({"dataset": "csv", "public-columns": "speed,heading", "private-columns": "age",
                          "label-column": "label", "private-statistics": "estimate",
                          "estimated-ranges": "age=20:60", "target-epsilon": 3.0}, ("centralised", "flower")),
    "digits-cnn": ({"dataset": "digits", "model": "cnn", "cnn-width": 4, "hidden-size": 8,
                    "records-per-device": 0, "num-rounds": 2, "noise-multiplier": 1.0},
                   ("centralised",)),
    "secagg": ({"aggregation": "secagg", "secagg-min-survivors": 3, "mode": "dp", "target-epsilon": 3.0,
                "secagg-timeout": 30.0, "round-timeout": 30.0, "node-wait-timeout": 10.0,
                "reproducible-noise": False}, ("centralised", "flower")),
    "secagg-sigma": ({"aggregation": "secagg", "secagg-min-survivors": 4, "secagg-colluders": 1,
                      "noise-multiplier": 1.1, "max-epsilon": 9.0, "reproducible-noise": False,
                      "secagg-timeout": 30.0, "round-timeout": 30.0, "node-wait-timeout": 10.0},
                     ("centralised", "flower")),
}

#: metrics.csv columns that follow from the model (compared with a tolerance).
MODEL_COLUMNS = ("accuracy", "loss", "public_loss", "balanced_accuracy", "auc", "log_loss")


def write_table(path: Path, n: int = 200) -> Path:
    """A small table with a numeric private column (numpy's seeded generator: the same
    file on every machine)."""
    rng = np.random.default_rng(0)
    pd.DataFrame({
        "speed": rng.normal(size=n).round(6),
        "heading": rng.normal(size=n).round(6),
        "age": rng.integers(18, 66, n),
        "label": rng.integers(0, 2, n),
    }).to_csv(path, index=False)
    return path


def case_keys(name: str, out: Path, table: Path) -> dict[str, Any]:
    keys = {**BASE, **CASES[name][0], "out-dir": str(out)}
    if keys.get("dataset") == "csv":
        keys["data-path"] = str(table)
        keys["num-devices"] = 4
        del keys["records-per-device"]
    if keys.get("records-per-device") == 0:
        del keys["records-per-device"]
    return {k: v for k, v in keys.items() if v != ""}


def _number(text: str) -> Any:
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return None if math.isnan(value) else value


def _rows(out: Path) -> list[dict[str, Any]]:
    if not (out / "metrics.csv").exists():
        return []
    with (out / "metrics.csv").open(newline="") as fh:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _account(out: Path) -> dict[str, Any] | None:
    from simulations.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["account", "--run", str(out), "--json"])
    if code != 0:
        raise RuntimeError(f"fedfdp account --run {out}: exit {code}")
    report = json.loads(buf.getvalue())
    report.pop("run", None)
    return report


def fingerprint(out: Path) -> dict[str, Any]:
    """What the run in ``out`` released (module docstring)."""
    from fedfdp.ledger import read_ledger

    ledger = read_ledger(out)
    resolved = tomllib.loads((out / "config.toml").read_text())["resolved"]
    model = torch.load(out / "model.pt", weights_only=True)
    return {
        "ledger": ledger.to_dict()["entries"] if ledger is not None else None,
        "resolved": resolved,
        "rows": _rows(out),
        # float32 weights: 9 significant digits give each one back exactly
        "model": {k: [float(f"{x:.9g}") for x in v.double().reshape(-1).tolist()] for k, v in model.items()},
        "account": _account(out) if ledger is not None else None,
    }


def run_centralised_case(keys: dict[str, Any]) -> None:
    from fedfdp.algorithm import run_centralised
    from fedfdp.config import load_config

    run_centralised(load_config(keys))


def run_flower_case(keys: dict[str, Any]) -> None:
    """The real strategy and the real ClientApp on an in-process grid (one node per
    device, every node's Context kept: secure aggregation's sessions live there)."""
    from flwr.app import ArrayRecord, Context, Error, Message

    from clients.client_app import make_client_app
    from fedfdp.config import load_config
    from fedfdp.data import load_dataset
    from fedfdp.run_plan import build_plan
    from strategies.fdp_strategy import FDPStrategy, NodeChoice
    from tests.flower_helpers import InProcessGrid, node_context

    cfg = load_config(keys)

    class Grid(InProcessGrid):
        def __init__(self) -> None:
            super().__init__(cfg)
            self.app = make_client_app(cfg.to_flat())
            self.contexts: dict[int, Context] = {}

        def answer(self, msg: Message) -> Message:
            node = msg.metadata.dst_node_id
            context = self.contexts.setdefault(node, node_context(cfg, node))
            try:
                return self.app(msg, context)
            except Exception as exc:  # as Flower sends it
                return Message(error=Error(code=0, reason=str(exc)), reply_to=msg)

    plan = build_plan(cfg, load_dataset(cfg.data))
    strat = FDPStrategy(plan, node_choice=NodeChoice.DEVICES)
    strat.start(Grid(), ArrayRecord(plan.model.state_dict()))


ENGINES: dict[str, Callable[[dict[str, Any]], None]] = {
    "centralised": run_centralised_case,
    "flower": run_flower_case,
}


def run_case(name: str, engine: str, work: Path) -> dict[str, Any]:
    """Run case ``name`` on ``engine`` in ``work`` and return its fingerprint."""
    work.mkdir(parents=True, exist_ok=True)
    table = write_table(work / "table.csv")
    out = work / f"{name}-{engine}"
    ENGINES[engine](case_keys(name, out, table))
    return fingerprint(out)


def secret_noise(name: str) -> bool:
    """Whether the case's noise comes from the parties' OS CSPRNG whatever the seed."""
    return CASES[name][0].get("aggregation") == "secagg"


def compare(name: str, got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """The differences between two fingerprints of case ``name``: the ledger, the
    ``[resolved]`` table, the account report and every row column but the model's exactly
    (ε to 1e-12 relative: the last printed digit), the model and its held-out metrics to
    1e-6 (float reductions may differ across machines).
    """
    diffs: list[str] = []
    free = secret_noise(name)
    if got["ledger"] != want["ledger"]:
        diffs.append("ledger differs")
    if got["resolved"] != want["resolved"]:
        keys = sorted(set(got["resolved"]) | set(want["resolved"]))
        diffs.append("[resolved] differs: " + ", ".join(
            f"{k}: {got['resolved'].get(k)!r} != {want['resolved'].get(k)!r}"
            for k in keys if got["resolved"].get(k) != want["resolved"].get(k)))
    if len(got["rows"]) != len(want["rows"]):
        diffs.append(f"{len(got['rows'])} rows, want {len(want['rows'])}")
    for g, w in zip(got["rows"], want["rows"], strict=False):
        if set(g) != set(w):
            diffs.append(f"round {w.get('round')}: columns {sorted(set(g) ^ set(w))}")
        for k in set(g) & set(w):
            a, b = g[k], w[k]
            if k in MODEL_COLUMNS:
                if free:
                    continue
                same = a == b or (
                    isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-6,
                                                                                   abs_tol=1e-7))
            elif k.startswith("epsilon") and isinstance(a, float) and isinstance(b, float):
                same = math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
            else:
                same = a == b
            if not same:
                diffs.append(f"round {w.get('round')} {k}: {a!r} != {b!r}")
    if not free:
        if set(got["model"]) != set(want["model"]):
            diffs.append("model parameters differ in name")
        else:
            for k, w in want["model"].items():
                if not np.allclose(got["model"][k], w, rtol=1e-6, atol=1e-7):
                    diffs.append(f"model {k} differs")
    if _account_view(got["account"]) != _account_view(want["account"]):
        diffs.append(f"account differs: {got['account']} != {want['account']}")
    return diffs


def _account_view(report: dict[str, Any] | None) -> Any:
    if report is None:
        return None
    return {k: (round(v, 12) if isinstance(v, float) else v) for k, v in report.items()}


def all_cases() -> list[tuple[str, str]]:
    return [(name, engine) for name, (_, engines) in CASES.items() for engine in engines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {REFERENCE}")
    parser.add_argument("--check", action="store_true", help=f"compare with {REFERENCE}")
    parser.add_argument("--only", nargs="*", default=[], help="these cases only")
    parser.add_argument("--update", action="store_true",
                        help=f"re-record the --only cases in {REFERENCE}, leaving every other entry as it is")
    args = parser.parse_args(argv)
    got: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, engine in all_cases():
            if args.only and name not in args.only:
                continue
            got[f"{name}/{engine}"] = run_case(name, engine, Path(tmp))
    if args.update:
        if not args.only:
            parser.error("--update needs --only CASE ...")
        merged = {**json.loads(REFERENCE.read_text()), **got}
        lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(merged.items())]
        REFERENCE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    if args.write:
        REFERENCE.parent.mkdir(exist_ok=True)
        write_mechanisms()
        lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(got.items())]
        REFERENCE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    if args.check:
        want = json.loads(REFERENCE.read_text())
        bad = 0
        for key, fp in got.items():
            diffs = compare(key.split("/")[0], fp, want[key])
            print(key, diffs if diffs else "OK")
            bad += bool(diffs)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ----------------------------------------------------------------------------------------
# resolved mechanisms alone: many configurations, no training
# ----------------------------------------------------------------------------------------

def _mechanism_grid() -> dict[str, dict[str, Any]]:
    grid: dict[str, dict[str, Any]] = {}
    sampling: dict[str, dict[str, Any]] = {
        "record": {},
        "poisson": {"device-sampling-rate": 0.5},
        "device": {"privacy-unit": "device", "device-sampling-rate": 0.5},
        "nodes": {"clients-per-round": 3},
    }
    for mode in ("dp", "fdp", "fdp-dpsgd"):
        for target in (0.5, 2.0, 8.0):
            for name, keys in sampling.items():
                grid[f"{mode}/{target}/{name}"] = {"mode": mode, "target-epsilon": target, **keys}
    for target in (0.5, 2.0, 8.0):
        for colluders in (0, 2):
            grid[f"secagg/{target}/{colluders}"] = {
                "mode": "fdp", "aggregation": "secagg", "secagg-min-survivors": 8,
                "secagg-colluders": colluders, "target-epsilon": target}
        grid[f"adaptive/{target}"] = {"mode": "dp", "clipping-quantile": 0.5, "target-epsilon": target}
        grid[f"corrdp/{target}"] = {**CORRDP, "noise-multiplier": "", "insensitive-tv": "*=0.5",
                                    "target-epsilon": target, "num-devices": 4}
    grid["fdp/sigma/cap"] = {"noise-multiplier": 0.9, "max-epsilon": 5.0}
    grid["dp/delta"] = {"mode": "dp", "delta": 1e-6, "target-epsilon": 1.0}
    grid["fdp/rounds"] = {"num-rounds": 1000, "sampling-rate": 0.01, "target-epsilon": 1.0}
    return {k: {kk: vv for kk, vv in v.items() if vv != ""} for k, v in grid.items()}


MECHANISMS = _mechanism_grid()


def resolve_for(keys: dict[str, Any]) -> dict[str, Any]:
    """The resolved mechanism of ``keys`` over the configured data (the CLI's pre-check)."""
    from fedfdp.config import load_config
    from fedfdp.data import load_dataset
    from fedfdp.run_plan import mechanism_for

    cfg = load_config({**keys, "progress": False})
    mechanism = mechanism_for(cfg, load_dataset(cfg.data))
    return {"digest": mechanism.digest(), "mechanism": mechanism.to_dict()}


MECHANISM_REFERENCE = Path(__file__).parent / "data" / "pinned_mechanisms.json"


def write_mechanisms() -> None:
    got = {name: resolve_for(keys) for name, keys in MECHANISMS.items()}
    lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(got.items())]
    MECHANISM_REFERENCE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
