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
from dataclasses import dataclass, field, replace
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
    #: A run stopped by its numerical health after drawing round 1's noise: ``{out}`` may
    #: hold the ledger with that charge, and the line must say how to go on (``--resume``).
    keeps_charge: bool = False
    timeout: float = 600.0


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
    out += more_cases()
    return out


SECAGG3 = {**TINY, "aggregation": '"secagg"', "secagg-min-survivors": 3, "mode": '"dp"',
           "clipping-quantile": 0}
PYAPI = "from fedfdp import *; import numpy as np; "


def more_cases() -> list[Case]:
    """Classes of bad input found by a review on a fresh clone: runs stopped by a non-finite
    update, unbounded counts, secure aggregation's documented ranges, an edited ``[resolved]``
    table, files that are not regular files, canaries beyond the run, configuration sources
    that are not tables, the public constructors' arguments, and messages that explain
    another key."""
    r = run_case
    return [
        # ------------------------------------------------ a run stopped in round 1 (charge kept)
        Case("diverged sigma 1e300", r("", "", key_sets={"noise-multiplier": 1e300}).argv,
             "noise-multiplier", keeps_charge=True),
        Case("diverged clip 1e300", r("", "", key_sets={"clipping-norm": 1e300, "clipping-quantile": 0}).argv,
             "clipping-norm", keeps_charge=True),
        Case("diverged alpha 1e300", r("", "", key_sets={"alpha": 1e300}).argv, "alpha",
             keeps_charge=True),
        Case("diverged lr 1e30", r("", "", key_sets={"learning-rate": 1e30}).argv, "learning-rate",
             keeps_charge=True),
        r("user model returns nan", "nanmodels:build", key_sets={"model": '"nanmodels:build"'}),
        r("user model nan weights", "nanmodels:nan_weights", key_sets={"model": '"nanmodels:nan_weights"'}),
        # ------------------------------------------------ counts beyond the machine
        Case("api rounds 1e30", code="from fedfdp import load_config; load_config({'num-rounds': 10**30})",
             needle="num-rounds="),
        Case("api devices 1e30", code="from fedfdp import load_config; load_config({'num-devices': 10**30})",
             needle="num-devices="),
        Case("api public batch 1e30",
             code="from fedfdp import load_config; load_config({'public-batch-size': 10**30})",
             needle="public-batch-size="),
        Case("api hidden 1e30", code="from fedfdp import load_config; load_config({'hidden-size': 10**30})",
             needle="hidden-size="),
        Case("api seed 1e30", code="from fedfdp import load_config; load_config({'seed': 10**30})",
             needle="seed="),
        Case("api sigma 1e400 int", code="from fedfdp import load_config; "
             "load_config({'noise-multiplier': 10**400})", needle="noise-multiplier="),
        r("rounds 1e30", "num-rounds=", key_sets={"num-rounds": 10**30}),
        r("records 1e20", "records-per-device=", key_sets={"records-per-device": 10**20}),
        r("window 1e20", "window-size=", key_sets={"window-size": 10**20}),
        r("hidden sizes 1e20", "hidden-sizes=", key_sets={"hidden-sizes": f"[{10**20}]"}),
        r("eval every 1e20", "eval-every=", key_sets={"eval-every": 10**20}),
        # ------------------------------------------------ secure aggregation's documented ranges
        r("secagg neighbours above parties", "secagg-neighbours=5", base=SECAGG3,
          key_sets={"secagg-neighbours": 5}),
        r("secagg threshold below derived", "secagg-threshold=1", base=SECAGG3,
          key_sets={"secagg-threshold": 1}),
        r("secagg neighbours even", "secagg-neighbours=4", base={**SECAGG3, "num-devices": 6},
          key_sets={"secagg-neighbours": 4}),
        Case("secagg neighbours even words", code="from fedfdp import load_config; "
             "load_config({'secagg-neighbours': 4})", needle="neighbour"),
        # ------------------------------------------------ resume against the [resolved] table
        Case("resume edited resolved", ("run", "--centralised", "--resume", "{run}"), "resolved", run=True,
             files=("edit-resolved",)),
        Case("resume dropped resolved", ("run", "--centralised", "--resume", "{run}"), "resolved", run=True,
             files=("drop-resolved",)),
        Case("resume sets target", ("run", "--centralised", "--resume", "{run}", "--set",
                                    "target-epsilon=5"), "target-epsilon", run=True),
        Case("resume crafted checkpoint", ("run", "--centralised", "--resume", "{run}"), "checkpoint.pt",
             run=True, files=("craft-checkpoint",)),
        # ------------------------------------------------ files that are not regular files
        Case("account ledger fifo", ("account", "--run", "{run}"), "ledger.jsonl", run=True,
             files=("fifo-ledger",), timeout=60),
        Case("account ledger dev zero", ("account", "--run", "{run}"), "ledger.jsonl", run=True,
             files=("zero-ledger",), timeout=60),
        Case("resume checkpoint fifo", ("run", "--centralised", "--resume", "{run}"), "checkpoint.pt",
             run=True, files=("fifo-checkpoint",), timeout=60),
        Case("resume config fifo", ("run", "--centralised", "--resume", "{run}"), "config.toml",
             run=True, files=("fifo-config",), timeout=60),
        Case("config fifo", ("run", "--config", "{fifo}", "--out", "{out}"), "{fifo}", timeout=60),
        Case("config dev zero", ("run", "--config", "/dev/zero", "--out", "{out}"), "/dev/zero", timeout=60),
        replace(r("csv data path fifo", "{fifo}", key_sets={"dataset": '"csv"', "data-path": '"{fifo}"',
                                                             "label-column": '"y"', "public-columns": '"a"',
                                                             "private-columns": '"b"'}), timeout=60),
        replace(r("csv data path dev zero", "/dev/zero",
                  key_sets={"dataset": '"csv"', "data-path": '"/dev/zero"', "label-column": '"y"',
                            "public-columns": '"a"', "private-columns": '"b"'}), timeout=60),
        replace(r("images npz fifo", "{fifo}", base={**TINY, "dataset": '"images"', "num-devices": 3},
                  key_sets={"data-path": '"{fifo}"'}), timeout=60),
        replace(r("node policy fifo", "{fifo}", "--node-policy", "{fifo}"), timeout=60),
        Case("sites table fifo", ("sites", "{fifo}", "--by", "a", "--out", "{out}"), "{fifo}", timeout=60),
        # ------------------------------------------------ canaries beyond the run
        Case("audit one-run million canaries", ("audit", "--one-run", "--canaries", "1000000"),
             "--canaries=1000000", timeout=120),
        Case("audit one-run 1e30 canaries", ("audit", "--one-run", "--canaries", str(10**30)),
             "--canaries=", timeout=120),
        # ------------------------------------------------ configuration sources that are not tables
        Case("pyproject config a list", ("run", "--config", "{pp_config_list}", "--out", "{out}"),
             "tool.flwr.app.config"),
        Case("pyproject tool a number", ("run", "--config", "{pp_tool_int}", "--out", "{out}"), "tool"),
        Case("pyproject app a string", ("run", "--config", "{pp_app_str}", "--out", "{out}"),
             "tool.flwr.app"),
        Case("config table a value", ("run", "--config", "{nested_toml}", "--out", "{out}"), "num-rounds"),
        Case("api load_config a string", code="from fedfdp import load_config; load_config('mode=dp')",
             needle="mode=dp"),
        Case("api load_config int key", code="from fedfdp import load_config; load_config({1: 2})",
             needle="1"),
        Case("api Config privacy dict", code="from fedfdp import Config; Config(privacy={'mode': 'dp'})",
             needle="privacy="),
        Case("api Config positional", code="from fedfdp import Config; Config(1, 2, 3)", needle="privacy=1"),
        # ------------------------------------------------ the public constructors
        Case("api FeatureMap columns a string", code=PYAPI + "FeatureMap.columns('abc', ['a'])",
             needle="'abc'"),
        Case("api FeatureMap private a string", code=PYAPI + "FeatureMap.columns(['a', 'b'], 'b')",
             needle="'b'"),
        Case("api FederatedData test labels short",
             code=PYAPI + "from fedfdp.features import FeatureSpec; x = np.zeros((5, 2), np.float32); "
                  "y = np.zeros(5, np.int64); FederatedData('t', FeatureSpec(('a', 'b'), ('a',), ('b',)), "
                  "(DeviceData(x, y),), x, y[:4], ('no', 'yes'))",
             needle="test_y"),
        Case("api FederatedData one class name",
             code=PYAPI + "from fedfdp.features import FeatureSpec; x = np.zeros((5, 2), np.float32); "
                  "y = np.zeros(5, np.int64); FederatedData('t', FeatureSpec(('a', 'b'), ('a',), ('b',)), "
                  "(DeviceData(x, y),), x, y, 'yes')",
             needle="class_names='yes'"),
        Case("api DeviceData labels short", code=PYAPI + "DeviceData(np.zeros((5, 2)), np.zeros(4))",
             needle="y"),
        # ------------------------------------------------ messages that explain the key
        r("test fraction empty split", "test-fraction=0.001",
          key_sets={"dataset": '"correlated"', "mode": '"corrdp"', "test-fraction": 0.001}),
        Case("api empty held-out split",
             code=PYAPI + "from fedfdp.features import FeatureSpec; x = np.zeros((40, 2), np.float32); "
                  "y = np.arange(40) % 2; data = FederatedData('t', FeatureSpec(('a', 'b'), ('a',), ('b',)), "
                  "(DeviceData(x, y),), x[:0], y[:0], ('no', 'yes')); run_centralised(load_config("
                  "{'num-rounds': 2, 'progress': False, 'sampling-rate': 0.5}), data)",
             needle="held-out split is empty"),
    ]


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
    os.mkfifo(tmp / "fifo")  # a reader that opens it waits for a writer: never does
    (tmp / "pp-config-list.toml").write_text("[tool.flwr.app]\nconfig = []\n")
    (tmp / "pp-tool-int.toml").write_text("tool = 1\n")
    (tmp / "pp-app-str.toml").write_text('[tool.flwr]\napp = "x"\n')
    (tmp / "nested.toml").write_text("[num-rounds]\nx = 1\n")
    return {"run": str(run), "tmp": str(tmp), "bad_toml": str(tmp / "bad.toml"),
            "binary": str(tmp / "binary.bin"),
            "unknown_toml": str(tmp / "unknown.toml"), "absent_mode_toml": str(tmp / "absent.toml"),
            "csv": str(tmp / "t.csv"), "bad_results": str(bad_results), "fifo": str(tmp / "fifo"),
            "pp_config_list": str(tmp / "pp-config-list.toml"), "pp_tool_int": str(tmp / "pp-tool-int.toml"),
            "pp_app_str": str(tmp / "pp-app-str.toml"), "nested_toml": str(tmp / "nested.toml")}


#: A user's model module (``model = "nanmodels:build"``) whose outputs or weights are NaN.
NAN_MODELS = '''
import torch
from torch import nn


class Nan(nn.Module):
    def __init__(self, num_features, num_classes):
        super().__init__()
        self.lin = nn.Linear(num_features, num_classes)

    def forward(self, x):
        return self.lin(x.flatten(1)) * float("nan")


def build(num_features, num_classes):
    return Nan(num_features, num_classes)


def nan_weights(num_features, num_classes):
    lin = nn.Linear(num_features, num_classes)
    with torch.no_grad():
        lin.weight.fill_(float("nan"))
    return lin
'''


def tamper(run: Path, files: tuple[str, ...]) -> None:
    """Make the copy of the prepared run what ``files`` says."""
    ledger, config, ckpt = run / "ledger.jsonl", run / "config.toml", run / "checkpoint.pt"
    if "tamper-ledger" in files:
        data = bytearray(ledger.read_bytes())
        data[len(data) // 2] ^= 0x01
        ledger.write_bytes(bytes(data))
    if "drop-config" in files:
        config.unlink()
    if "edit-resolved" in files:  # sigma -> 9.0 in the [resolved] table only
        head, _, tail = config.read_text().partition("[resolved]")
        lines = ["noise-multiplier = 9.0" if ln.startswith("noise-multiplier =") else ln
                 for ln in tail.splitlines()]
        config.write_text(head + "[resolved]" + "\n".join(lines) + "\n")
    if "drop-resolved" in files:
        config.write_text(config.read_text().partition("[resolved]")[0])
    if "craft-checkpoint" in files:  # a plain pickle, not torch's zip format
        import pickle
        ckpt.write_bytes(pickle.dumps({"meta": "{}", "model": {}, "optimizer": {}}))
    for name, path in (("fifo-ledger", ledger), ("fifo-checkpoint", ckpt), ("fifo-config", config)):
        if name in files:
            path.unlink()
            os.mkfifo(path)
    if "zero-ledger" in files:
        ledger.unlink()
        ledger.symlink_to("/dev/zero")


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
        tamper(Path(names["run"]), case.files)
    (work / "nanmodels.py").write_text(NAN_MODELS)
    watched = [Path(names["run"]), Path(names["bad_results"]), Path(names["binary"]), Path(names["csv"])]
    before = {str(p): digest(p) for p in watched}
    command = [*CLI, *(a.format(**names) for a in case.argv)]
    argv = [sys.executable, "-c", case.code] if case.code else command
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=case.timeout, env=env)
        code, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        code, err = -1, f"timed out after {case.timeout:g} s"
    seconds = time.perf_counter() - start
    lines = [line for line in err.splitlines() if line.strip()]
    needle = case.needle.format(**names)
    changed = [p for p in watched if digest(p) != before[str(p)]]
    created = (work / "out").exists()
    if created and case.keeps_charge:  # the ledger of the round whose noise was drawn stays
        ledger = work / "out" / "ledger.jsonl"
        kept = ledger.is_file() and '"kind":"charge"' in ledger.read_text(errors="replace")
        told = any("--resume" in line for line in lines)
        created = not (kept and told)
    if case.code:  # the Python API: one exception, one line naming the value
        last = lines[-1] if lines else ""
        api_ok = last.startswith(("fedfdp.config.values.ConfigError:", "fedfdp.health.RunDiverged:",
                                  "ValueError:", "TypeError:"))
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
    parser.add_argument("--part", choices=["all", "base", "more"], default="all",
                        help="base: the sweep's first cases; more: the classes of more_cases()")
    parser.add_argument("--show", default="POOR,BAD", help="verdicts to print in full")
    args = parser.parse_args(argv)
    more = {c.name for c in more_cases()}
    part = {"all": cases(), "base": [c for c in cases() if c.name not in more], "more": more_cases()}
    chosen = [c for c in part[args.part] if args.only in c.name]
    names = [c.name for c in chosen]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate case names")
    tmp = Path(tempfile.mkdtemp(prefix="fedfdp-sweep-"))
    show = set(args.show.split(","))
    results = []
    try:
        places = prepare(tmp)
        with ThreadPoolExecutor(max(1, args.workers)) as pool:
            verdicts = pool.map(lambda ic: classify(ic[1], places, tmp / f"case{ic[0]:03d}"),
                                enumerate(chosen))
            for case, (verdict, text, seconds) in zip(chosen, verdicts, strict=True):
                results.append((verdict, text, seconds))
                if verdict in show:  # as each case ends (a long sweep shows its progress)
                    print(f"{verdict:<5} {case.name}: {text[:300]} ({seconds:.1f} s)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    counts = Counter(v for v, _, _ in results)
    print(f"{len(chosen)} cases: " + ", ".join(f"{counts[v]} {v}" for v in ("GOOD", "POOR", "BAD")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
