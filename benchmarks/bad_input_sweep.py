"""A sweep of bad inputs through the real ``fedfdp`` command (one process each), classified.

``python benchmarks/bad_input_sweep.py [--workers 2] [--only WORD] [--show POOR,BAD]``

Every case is an input a user may get wrong (a value out of range, a setting that
has no effect, a file that is not what the key says, a run directory in the wrong
state, an option of another command...). Each runs ``python -m simulations.cli ...``
(or a Python snippet for the library's API) in a fresh process and is classified:

``GOOD``
    exit status 2, exactly one line on stderr (``error: ...``) naming the case's
    value (its *needle*), and no run file created or changed;
``POOR``
    exit status 2 and nothing lost, but the message is not one line or does not name
    the value;
``BAD``
    a traceback, exit status 1 (an internal error for a user's mistake), 0 (the bad
    input accepted silently), any other status, or a run file created or changed.

The cases are beyond the 42 of issue 23 (``tests/test_bad_inputs.py`` holds those).
A shared run directory (a finished tiny run) serves the resume, account and attack
cases; each case that may write works on its own copy, whose files are hashed
before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "simulations.cli"]
TINY = {"num-devices": 3, "records-per-device": 40, "num-rounds": 3, "progress": "false"}
DIGITS = {"dataset": '"digits"', "num-devices": 3}


@dataclass(frozen=True)
class Case:
    """One bad input: ``argv`` of ``fedfdp`` (or ``python -c code``), the text the one-line
    refusal must contain, and whether it works on a copy of the prepared run (``run``)."""

    name: str
    argv: tuple[str, ...] = ()
    needle: str = ""
    code: str = ""
    run: bool = False
    files: tuple[str, ...] = field(default_factory=tuple)


def sets(mapping: dict[str, object]) -> tuple[str, ...]:
    out: list[str] = []
    for key, value in mapping.items():
        out += ["--set", f"{key}={value}"]
    return tuple(out)


def run_case(name: str, needle: str, *extra: str, base: dict[str, object] | None = None,
             engine: tuple[str, ...] = ("--centralised",), key_sets: dict[str, object] | None = None) -> Case:
    """``fedfdp run`` of a tiny fleet with ``key_sets`` (and ``extra`` arguments), into ``{out}``."""
    mapping = {**(TINY if base is None else base), **(key_sets or {})}
    return Case(name, ("run", *engine, "--out", "{out}", *sets(mapping), *extra), needle)


def cases() -> list[Case]:
    """Every case of the sweep (>= 100)."""
    r = run_case
    out: list[Case] = [
        # ------------------------------------------------ values out of range, wrong types
        r("sigma negative", "noise-multiplier=-1", key_sets={"noise-multiplier": -1}),
        r("sigma zero", "noise-multiplier=0", key_sets={"noise-multiplier": 0}),
        r("sigma text", "noise-multiplier", key_sets={"noise-multiplier": '"abc"'}),
        r("sigma nan", "noise-multiplier=nan", key_sets={"noise-multiplier": "nan"}),
        r("sigma inf", "noise-multiplier=inf", key_sets={"noise-multiplier": "inf"}),
        r("target negative", "target-epsilon=-2", key_sets={"target-epsilon": -2}),
        r("target zero", "target-epsilon=0", key_sets={"target-epsilon": 0}),
        r("target inf", "target-epsilon=inf", key_sets={"target-epsilon": "inf"}),
        r("sigma and target", "noise-multiplier=1", key_sets={"noise-multiplier": 1, "target-epsilon": 2}),
        r("cap negative", "max-epsilon=-1", key_sets={"max-epsilon": -1}),
        r("cap below target", "max-epsilon=1", key_sets={"max-epsilon": 1, "target-epsilon": 2}),
        r("delta zero", "delta=0", key_sets={"delta": 0}),
        r("delta one", "delta=1", key_sets={"delta": 1}),
        r("delta above one", "delta=1.5", key_sets={"delta": 1.5}),
        r("clip zero", "clipping-norm=0", key_sets={"clipping-norm": 0}),
        r("clip negative", "clipping-norm=-1", key_sets={"clipping-norm": -1}),
        r("quantile one", "clipping-quantile=1", key_sets={"clipping-quantile": 1}),
        r("quantile negative", "clipping-quantile=-0.5", key_sets={"clipping-quantile": -0.5}),
        r("budget share zero", "clipping-budget-share=0", key_sets={"clipping-budget-share": 0}),
        r("budget share one", "clipping-budget-share=1", key_sets={"clipping-budget-share": 1}),
        r("clip lr zero", "clipping-learning-rate=0", key_sets={"clipping-learning-rate": 0}),
        r("q zero", "sampling-rate=0", key_sets={"sampling-rate": 0}),
        r("q above one", "sampling-rate=1.5", key_sets={"sampling-rate": 1.5}),
        r("public batch zero", "public-batch-size=0", key_sets={"public-batch-size": 0}),
        r("public loss word", "public-loss='bogus'", key_sets={"public-loss": '"bogus"'}),
        r("pretrain negative", "public-pretrain-rounds=-1", key_sets={"public-pretrain-rounds": -1}),
        r("pretrain all rounds", "public-pretrain-rounds=3", key_sets={"public-pretrain-rounds": 3}),
        r("fdp-dpsgd no pretrain", "public-pretrain-rounds=0",
          key_sets={"mode": '"fdp-dpsgd"', "public-pretrain-rounds": "0"}),
        r("mode word", "mode='bogus'", key_sets={"mode": '"bogus"'}),
        r("device unit without p", "privacy-unit='device'", key_sets={"privacy-unit": '"device"'}),
        r("p zero", "device-sampling-rate=0", key_sets={"device-sampling-rate": 0}),
        r("p above one", "device-sampling-rate=2", key_sets={"device-sampling-rate": 2}),
        r("k negative", "clients-per-round=-1", key_sets={"clients-per-round": -1}),
        r("k and p", "clients-per-round=2", key_sets={"clients-per-round": 2, "device-sampling-rate": 0.5}),
        r("rounds zero", "num-rounds=0", key_sets={"num-rounds": 0}),
        r("rounds negative", "num-rounds=-5", key_sets={"num-rounds": -5}),
        r("rounds fraction", "num-rounds=2.5", key_sets={"num-rounds": 2.5}),
        r("reproducible word", "reproducible-noise", key_sets={"reproducible-noise": '"maybe"'}),
        r("alpha zero", "alpha=0", key_sets={"alpha": 0}),
        r("alpha negative", "alpha=-1", key_sets={"alpha": -1}),
        r("lr zero", "learning-rate=0", key_sets={"learning-rate": 0}),
        r("momentum one", "momentum=1", key_sets={"momentum": 1}),
        r("momentum negative", "momentum=-0.1", key_sets={"momentum": -0.1}),
        r("momentum text", "momentum", key_sets={"momentum": '"high"'}),
        r("optimizer word", "optimizer='rmsprop'", key_sets={"optimizer": '"rmsprop"'}),
        r("model word", "model='resnet'", key_sets={"model": '"resnet"'}),
        r("model missing module", "model='nosuchpkg.mod:build'", key_sets={"model": '"nosuchpkg.mod:build"'}),
        r("model not a builder", "model='os:getcwd'", key_sets={"model": '"os:getcwd"'}),
        r("hidden zero", "hidden-size=0", key_sets={"hidden-size": 0}),
        r("hidden list zero", "hidden-sizes", key_sets={"model": '"mlp"', "hidden-sizes": "[0]"}),
        r("cnn width zero", "cnn-width=0", key_sets={"cnn-width": 0}),
        r("dataset word", "dataset='nosuch'", key_sets={"dataset": '"nosuch"'}),
        r("csv without path", "data-path=''", key_sets={"dataset": '"csv"', "label-column": '"y"',
                                                        "public-columns": '"a"', "private-columns": '"b"'}),
        r("csv missing file", "data-path='/nonexistent/t.csv'",
          key_sets={"dataset": '"csv"', "data-path": '"/nonexistent/t.csv"', "label-column": '"y"',
                    "public-columns": '"a"', "private-columns": '"b"'}),
        r("devices zero", "num-devices=0", key_sets={"num-devices": 0}),
        r("devices negative", "num-devices=-1", key_sets={"num-devices": -1}),
        r("devices million", "num-devices=1000000", key_sets={"num-devices": 1000000}),
        r("records zero", "records-per-device=0", key_sets={"records-per-device": 0}),
        r("test fraction zero", "test-fraction=0", key_sets={"test-fraction": 0}),
        r("test fraction one", "test-fraction=1", key_sets={"test-fraction": 1}),
        r("data seed negative", "data-seed=-1", key_sets={"data-seed": -1}),
        r("data path on fleet", "data-path='x.csv'", key_sets={"data-path": '"x.csv"'}),
        r("dirichlet negative", "dirichlet-alpha=-1", key_sets={"dirichlet-alpha": -1}),
        r("blur even", "blur-kernel=4", base={**TINY, **DIGITS}, key_sets={"blur-kernel": 4}),
        r("blur sigma zero", "blur-sigma=0", base={**TINY, **DIGITS}, key_sets={"blur-sigma": 0}),
        r("blur levels one", "blur-levels=1", base={**TINY, **DIGITS}, key_sets={"blur-levels": 1}),
        r("image pool zero", "image-pool=0", base={**TINY, **DIGITS}, key_sets={"image-pool": 0}),
        r("image pool too big", "image-pool=16", base={**TINY, **DIGITS}, key_sets={"image-pool": 16}),
        r("eval every zero", "eval-every=0", key_sets={"eval-every": 0}),
        r("checkpoint every negative", "checkpoint-every=-1", key_sets={"checkpoint-every": -1}),
        r("node wait zero", "node-wait-timeout=0", key_sets={"node-wait-timeout": 0}),
        r("round timeout negative", "round-timeout=-1", key_sets={"round-timeout": -1}),
        r("seed negative", "seed=-1", key_sets={"seed": -1}),
        r("resume word", "resume", key_sets={"resume": '"maybe"'}),
        r("unknown key", "noise-multiplyer", key_sets={"noise-multiplyer": 1}),
        r("set without =", "noise-multiplier", "--set", "noise-multiplier"),
        r("set empty key", "=1", "--set", "=1"),
        # ------------------------------------------------ settings that would be ignored
        r("adam with momentum", "momentum=0.5", key_sets={"optimizer": '"adam"', "momentum": 0.5}),
        r("blur on a table", "blur-kernel=5", key_sets={"blur-kernel": 5}),
        r("window on fleet", "window-size=50", key_sets={"window-size": 50}),
        r("hash buckets on fleet", "hash-buckets=10", key_sets={"hash-buckets": 10}),
        r("public features on fleet", "num-public-features=10", key_sets={"num-public-features": 10}),
        r("correlation on fleet", "correlation=0.9", key_sets={"correlation": 0.9}),
        r("tv on fdp", "insensitive-tv", key_sets={"insensitive-tv": '"*=0.5"'}),
        r("weight bound on dp", "corrdp-weight-bound=2.0",
          key_sets={"mode": '"dp"', "corrdp-weight-bound": 2}),
        r("cap on public", "max-epsilon=3.0", key_sets={"mode": '"public"', "max-epsilon": 3}),
        r("target on nonprivate", "target-epsilon=1.0",
          key_sets={"mode": '"nonprivate"', "target-epsilon": 1}),
        r("q on public", "sampling-rate=0.5", key_sets={"mode": '"public"', "sampling-rate": 0.5}),
        r("quantile on nonprivate", "clipping-quantile=0.5",
          key_sets={"mode": '"nonprivate"', "clipping-quantile": 0.5}),
        r("label column on fleet", "label-column='y'", key_sets={"label-column": '"y"'}),
        # ------------------------------------------------ combinations
        r("corrdp mlp", "model='mlp'", key_sets={"mode": '"corrdp"', "model": '"mlp"'}),
        r("corrdp adaptive", "clipping-quantile=0.5",
          key_sets={"mode": '"corrdp"', "clipping-quantile": 0.5}),
        r("corrdp images", "dataset='digits'", base={**TINY, **DIGITS}, key_sets={"mode": '"corrdp"'}),
        r("label-free mlp", "public-loss='label-free'",
          key_sets={"public-loss": '"label-free"', "model": '"mlp"'}),
        r("node data on fleet", "data-location='node'", key_sets={"data-location": '"node"'}),
        r("cnn on a table", "model='cnn'", key_sets={"model": '"cnn"'}),
        r("supernodes zero", "--supernodes=0", "--supernodes", "0", engine=()),
        r("supernodes too many", "--supernodes=99", "--supernodes", "99", engine=()),
        r("supernodes text", "--supernodes", "--supernodes", "abc", engine=()),
        # ------------------------------------------------ command lines and files
        Case("run without out", ("run", "--centralised"), "--out"),
        Case("config missing", ("run", "--config", "/nonexistent/x.toml", "--out", "{out}"),
             "/nonexistent/x.toml"),
        Case("config a directory", ("run", "--config", "{tmp}", "--out", "{out}"), "is a directory"),
        Case("config bad toml", ("run", "--config", "{bad_toml}", "--out", "{out}"), "not valid TOML"),
        Case("config not utf8", ("run", "--config", "{binary}", "--out", "{out}"), "not UTF-8"),
        Case("config unknown key", ("run", "--config", "{unknown_toml}", "--out", "{out}"),
             "noise-multiplyer"),
        Case("out is a file", ("run", "--centralised", "--out", "{binary}", *sets(TINY)), "{binary}"),
        Case("out occupied", ("run", "--centralised", "--out", "{run}", *sets(TINY)), "{run}", run=True),
        Case("resume missing dir", ("run", "--resume", "/nonexistent/run"), "/nonexistent/run"),
        Case("resume with out", ("run", "--resume", "{run}", "--out", "{out}"), "--resume", run=True),
        Case("resume changes sigma",
             ("run", "--centralised", "--resume", "{run}", "--set", "noise-multiplier=5"),
             "noise-multiplier", run=True),
        Case("resume tampered ledger", ("run", "--centralised", "--resume", "{run}"), "ledger", run=True,
             files=("tamper-ledger",)),
        Case("resume without config", ("run", "--centralised", "--resume", "{run}"), "config.toml", run=True,
             files=("drop-config",)),
        Case("unknown command", ("frobnicate",), "frobnicate"),
        Case("unknown option", ("run", "--bogus"), "--bogus"),
        Case("keys unknown option", ("keys", "--bogus"), "--bogus"),
        # ------------------------------------------------ compare
        Case("compare config missing", ("compare", "--config", "/nonexistent/c.toml", "--out", "{out}"),
             "/nonexistent/c.toml"),
        Case("compare mode word", ("compare", "--out", "{out}", "--set", "modes=['bogus']"), "bogus"),
        Case("compare negative target", ("compare", "--out", "{out}", "--set", "target-epsilons=[-1.0]"),
             "-1"),
        Case("compare mode string", ("compare", "--out", "{out}", "--set", "mode='dp'"), "mode='dp'"),
        Case("compare sets sigma", ("compare", "--out", "{out}", "--set", "noise-multiplier=1"),
             "noise-multiplier"),
        Case("compare engine word", ("compare", "--out", "{out}", "--engine", "bogus"), "bogus"),
        Case("compare metric word", ("compare", "--out", "{out}", "--metric", "bogus"), "bogus"),
        Case("compare out a file", ("compare", "--out", "{binary}", "--set", "modes=['public']"), "{binary}"),
        Case("compare key for no mode",
             ("compare", "--out", "{out}", "--set", "modes=['public','nonprivate']",
                                         "--set", "clipping-norm=2.0"), "clipping-norm=2.0"),
        Case("compare table of absent mode", ("compare", "--config", "{absent_mode_toml}", "--out", "{out}"),
             "mode.dp"),
        Case("compare malformed results", ("compare", "--out", "{bad_results}", "--report-only"),
             "results.csv", run=True),
        # ------------------------------------------------ account
        Case("account run missing", ("account", "--run", "/nonexistent/run"), "/nonexistent/run"),
        Case("account sigma negative", ("account", "--noise-multiplier", "-1", "--sampling-rate", "0.1",
                                        "--rounds", "10", "--delta", "1e-5"), "-1"),
        Case("account q zero",
             ("account", "--noise-multiplier", "1", "--sampling-rate", "0", "--rounds", "10",
              "--delta", "1e-5"),
             "0"),
        Case("account rounds zero", ("account", "--noise-multiplier", "1", "--sampling-rate", "0.1",
                                     "--rounds", "0", "--delta", "1e-5"), "rounds"),
        Case("account delta two", ("account", "--noise-multiplier", "1", "--sampling-rate", "0.1",
                                   "--rounds", "10", "--delta", "2"), "2"),
        Case("account ball above one", ("account", "--noise-multiplier", "1", "--sampling-rate", "0.1",
                                        "--rounds", "10", "--delta", "1e-5", "--ball", "1.5"), "1.5"),
        # ------------------------------------------------ audit
        Case("audit two rounds", ("audit", "--rounds", "2"), "rounds=2"),
        Case("audit q zero", ("audit", "--sampling-rate", "0", "--rounds", "3"), "0"),
        Case("audit sigma negative", ("audit", "--noise-multiplier", "-1", "--rounds", "3"), "-1"),
        Case("audit delta two", ("audit", "--delta", "2", "--rounds", "3"), "2"),
        Case("audit quantile word", ("audit", "--clipping-quantile", "abc"), "abc"),
        Case("audit canaries without one-run", ("audit", "--canaries", "5"), "--canaries"),
        Case("audit attack without run", ("audit", "--attack", "attribute"), "--run"),
        Case("audit negative references", ("audit", "--attack", "attribute", "--run", "{run}", "--references",
                                           "-1"), "--references=-1", run=True),
        Case("audit one-run rounds", ("audit", "--one-run", "--rounds", "5"), "--rounds"),
        Case("audit corrdp bug", ("audit", "--break", "tv-no-inflation"), "tv-no-inflation"),
        # ------------------------------------------------ sites
        Case("sites missing table", ("sites", "/nonexistent/t.csv", "--by", "a", "--out", "{out}"),
             "/nonexistent/t.csv"),
        Case("sites missing column", ("sites", "{csv}", "--by", "nosuch", "--out", "{out}"), "nosuch"),
        # ------------------------------------------------ the Python API
        Case("api mode number", code="from fedfdp import load_config; load_config({'mode': 3})",
             needle="mode=3"),
        Case("api negative sigma dataclass",
             code="from fedfdp import PrivacyConfig; PrivacyConfig(noise_multiplier=-1)",
             needle="noise-multiplier=-1"),
        Case("api data not FederatedData",
             code="from fedfdp import load_config, run_centralised; "
                  "run_centralised(load_config({'num-rounds': 1}), {'x': 1})", needle="data"),
        Case("api model not a module",
             code="from fedfdp import load_config, run_centralised; "
                  "run_centralised(load_config({'num-rounds': 1, 'num-devices': 3, "
                  "'records-per-device': 40}), "
                  "model='mlp')", needle="model"),
    ]
    return out


def prepare(tmp: Path) -> dict[str, str]:
    """The files the cases name: a finished tiny run, a CSV, malformed TOML and bytes."""
    run = tmp / "prepared-run"
    done = subprocess.run([*CLI, "run", "--centralised", "--out", str(run), *sets(TINY)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"preparing the run failed:\n{done.stderr[-3000:]}")
    (tmp / "bad.toml").write_text("mode = \n")
    (tmp / "binary.bin").write_bytes(b"\xff\xfe\x00garbage")
    (tmp / "unknown.toml").write_text("noise-multiplyer = 1\n")
    (tmp / "absent.toml").write_text("modes = ['public']\n\n[mode.dp]\nlearning-rate = 1.0\n")
    (tmp / "t.csv").write_text("a,b,y\n1,2,0\n3,4,1\n5,6,0\n")
    bad_results = tmp / "bad-results"
    bad_results.mkdir()
    (bad_results / "results.csv").write_bytes(b"\x00\x01garbage")
    return {"run": str(run), "tmp": str(tmp), "bad_toml": str(tmp / "bad.toml"),
            "binary": str(tmp / "binary.bin"),
            "unknown_toml": str(tmp / "unknown.toml"), "absent_mode_toml": str(tmp / "absent.toml"),
            "csv": str(tmp / "t.csv"), "bad_results": str(bad_results)}


def digest(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def classify(case: Case, places: dict[str, str], work: Path) -> tuple[str, str, float]:
    """Run one case in its own folder; (verdict, the first stderr lines, seconds)."""
    work.mkdir(parents=True)
    names = dict(places, out=str(work / "out"))
    if case.run or case.files:
        for key in ("run", "bad_results"):
            copy = work / Path(places[key]).name
            shutil.copytree(places[key], copy)
            names[key] = str(copy)
        run = Path(names["run"])
        if "tamper-ledger" in case.files:
            ledger = run / "ledger.jsonl"
            data = bytearray(ledger.read_bytes())
            data[len(data) // 2] ^= 0x01
            ledger.write_bytes(bytes(data))
        if "drop-config" in case.files:
            (run / "config.toml").unlink()
    watched = [Path(names["run"]), Path(names["bad_results"]), Path(names["binary"]), Path(names["csv"])]
    before = {str(p): digest(p) for p in watched}
    command = [*CLI, *(a.format(**names) for a in case.argv)]
    argv = [sys.executable, "-c", case.code] if case.code else command
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600, env=env)
        code, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        code, err = -1, "timed out after 600 s"
    seconds = time.perf_counter() - start
    lines = [line for line in err.splitlines() if line.strip()]
    needle = case.needle.format(**names)
    changed = [p for p in watched if digest(p) != before[str(p)]]
    created = (work / "out").exists()
    if case.code:  # the Python API: a one-line ConfigError is the refusal
        last = lines[-1] if lines else ""
        api_ok = last.startswith(("fedfdp.config.values.ConfigError:", "fedfdp.health.RunDiverged:"))
        if code == 1 and api_ok and needle in last:
            return "GOOD", last, seconds
        if code == 1 and api_ok:
            return "POOR", last, seconds
        return "BAD", (last or f"exit {code}"), seconds
    if "Traceback" in err or code != 2 or changed or created:
        why = []
        if changed:
            why.append(f"changed {', '.join(Path(p).name for p in map(str, changed))}")
        if created:
            why.append("created the run directory")
        return "BAD", f"exit {code}; {'; '.join(why)} {' | '.join(lines[-2:])}".strip(), seconds
    if len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]:
        return "GOOD", lines[0], seconds
    return "POOR", " | ".join(lines[:3]), seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default="", help="only cases whose name contains this")
    parser.add_argument("--show", default="POOR,BAD", help="verdicts to print in full")
    args = parser.parse_args(argv)
    chosen = [c for c in cases() if args.only in c.name]
    names = [c.name for c in chosen]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate case names")
    tmp = Path(tempfile.mkdtemp(prefix="fedfdp-sweep-"))
    try:
        places = prepare(tmp)
        with ThreadPoolExecutor(max(1, args.workers)) as pool:
            results = list(pool.map(lambda ic: classify(ic[1], places, tmp / f"case{ic[0]:03d}"),
                                    enumerate(chosen)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    show = set(args.show.split(","))
    for case, (verdict, text, seconds) in zip(chosen, results, strict=True):
        if verdict in show:
            print(f"{verdict:<5} {case.name}: {text[:300]} ({seconds:.1f} s)")
    counts = Counter(v for v, _, _ in results)
    print(f"{len(chosen)} cases: " + ", ".join(f"{counts[v]} {v}" for v in ("GOOD", "POOR", "BAD")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
