"""The CLI's one error path: user errors one line with status 2, Ctrl-C one line with
status 130 and the ledger intact, internal errors one line naming a traceback file
with status 1 — through the real command (subprocess)."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedfdp.ledger import read_ledger
from tests.mechanism_helpers import written_ledger

CLI = [sys.executable, "-m", "simulations.cli"]
TINY = ["--set", "num-devices=3", "--set", "records-per-device=40",
        "--set", "progress=false"]


@pytest.mark.slow
def test_ctrl_c_in_a_run_prints_one_line_exits_130_and_keeps_the_ledger(tmp_path):
    """Ctrl-C after 3 charged rounds of 100,000 (the run cannot end first, however busy the
    machine; the waits are bounded, not timed)."""
    out = tmp_path / "run"
    argv = [*CLI, "run", "--centralised", "--out", str(out), *TINY, "--set", "num-rounds=100000",
            "--set", "noise-multiplier=1.0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        ledger = read_ledger(out) if (out / "ledger.jsonl").exists() else None
        if ledger is not None and len(ledger.charges) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and "resume" in lines[0]
    assert len(written_ledger(out).charges) >= 3  # intact and readable


def test_an_internal_error_is_one_line_with_a_traceback_file(monkeypatch, capsys):
    """An exception no user input explains: one line naming its type and message and the
    file holding the traceback (status 1); the traceback is in that file, not on stderr."""
    import argparse

    import simulations.cli as cli

    def parser(only=None, *, lazy=False):
        p = argparse.ArgumentParser(prog="fedfdp")
        sub = p.add_subparsers(dest="command", required=True)

        def fail(args):
            raise RuntimeError("an invariant broke\nsecond line")

        sub.add_parser("run").set_defaults(func=fail)
        return p

    monkeypatch.setattr(cli, "make_parser", parser)
    assert cli.main(["run"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("internal error: RuntimeError: an invariant broke; second line")
    path = Path(err[0].rsplit("traceback in ", 1)[1].rstrip(")"))
    assert "Traceback" in path.read_text() and "an invariant broke" in path.read_text()
    path.unlink()


def test_keys_lists_every_key_from_the_configuration_table(capsys):
    """``fedfdp keys`` prints every key of the key table with its guarantee flag (one
    source with docs/configuration.md); ``fedfdp run --help`` points to it."""
    import json

    from fedfdp.config import GUARANTEE_KEYS, key_reference
    from simulations.cli import main

    assert main(["keys", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in rows] == [r.key for r in key_reference()]
    flagged = {r["key"] for r in rows if r["guarantee"] == "yes"}
    assert flagged <= set(GUARANTEE_KEYS) and "noise-multiplier" in flagged and "progress" not in flagged
    assert main(["keys", "--guarantee", "--json"]) == 0
    assert "progress" not in {r["key"] for r in json.loads(capsys.readouterr().out)}
    done = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "fedfdp keys" in done.stdout


def test_a_corrdp_run_prints_its_corrdp_epsilon_and_the_released_tvs_share(tmp_path):
    """``fedfdp run`` on a CorrDP run with estimated TVs: the summary prints the ε of the
    ``epsilon_corrdp`` column (the ``epsilon`` column is empty: never ``epsilon=nan``) with
    the relation of ``relation_text``, and the next line the budget split of config.toml's
    ``[resolved]`` (the released TVs alone, the planned total)."""
    import math
    import tomllib

    import pandas as pd

    out = tmp_path / "run"
    keys = {"mode": "corrdp", "dataset": "correlated", "num-sensitive": "1", "num-insensitive": "2",
            "num-devices": "4", "records-per-device": "100", "insensitive-tv": "", "tv-estimate": "true",
            "tv-bins": "*=0", "tv-min-prob": "0.45", "noise-multiplier": "2.0", "num-rounds": "2",
            "clipping-norm": "0.5", "progress": "false"}
    argv = [*CLI, "run", "--centralised", "--out", str(out),
            *[a for k, v in keys.items() for a in ("--set", f"{k}={v}")]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "nan" not in lines[0] and " epsilon=" not in lines[0]
    printed = float(lines[0].split("epsilon_corrdp=")[1].split()[0])
    last = pd.read_csv(out / "metrics.csv").iloc[-1]
    assert math.isnan(last["epsilon"]) and printed == float(f"{last['epsilon_corrdp']:.4g}") > 0
    assert f"({last['relation_text']}; delta=" in lines[0]
    resolved = tomllib.loads((out / "config.toml").read_text())["resolved"]
    alone, planned = resolved["estimates-epsilon"], resolved["planned-epsilon"]
    assert 0 < alone < planned
    assert lines[1] == (f"of which released statistics: epsilon={alone:.4g} alone "
                        f"(planned total {planned:.4g})")


def test_secagg_supernodes_default_to_n_min_and_fewer_are_refused_before_the_run_dir(tmp_path, monkeypatch):
    """Under aggregation = "secagg" each SuperNode is one party: the default count (one per
    core above 8 devices) is raised to secagg-min-survivors, and ``--supernodes`` below it is
    refused by the real CLI in one line, status 2, before the output directory exists."""
    import simulations.flower_processes as run
    from fedfdp.config import load_config

    secagg = {"num-devices": 12, "records-per-device": 20, "aggregation": "secagg", "secagg-min-survivors": 5}
    monkeypatch.setattr(run.os, "cpu_count", lambda: 2)
    assert run.default_supernodes(12) == 2  # the default below n_min that Flower's ServerApp refused
    assert run.supernodes_for(load_config(secagg)) == 5
    assert run.supernodes_for(load_config({**secagg, "secagg-min-survivors": 3}), 7) == 7
    assert run.supernodes_for(load_config({"num-devices": 12})) == 2  # plain aggregation: unchanged

    out = tmp_path / "run"
    sets = [a for k, v in secagg.items() for a in ("--set", f"{k}={v}")]
    done = subprocess.run([*CLI, "run", "--out", str(out), "--supernodes", "4", *sets],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: secagg-min-survivors=5: only 4 SuperNodes "
                                                   "(--supernodes=4)"), lines
    assert not out.exists() and done.stdout == ""
    few = subprocess.run([*CLI, "run", "--out", str(out), *sets, "--set", "num-devices=4"],
                         capture_output=True, text=True, timeout=300)
    assert few.returncode == 2 and "only 4 SuperNodes (num-devices=4)" in few.stderr and not out.exists()
