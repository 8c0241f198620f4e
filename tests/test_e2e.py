"""End to end: `fedfdp run` on Flower's Simulation Runtime (slow: starts a SuperLink and Ray).

`fedfdp run` submits the run with `flwr run` to a SuperLink of its own in
simulation mode (Flower's supported path; `flwr.simulation.run_simulation` is
deprecated), on as many virtual SuperNodes as the machine has cores.
"""

import os
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.mechanism_helpers import ledger_doc

pytestmark = pytest.mark.slow


def test_fedfdp_run_simulation(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "simulations.cli",
        "run",
        "--out",
        str(out),
        "--set",
        "num-devices=3",
        "--set",
        "num-rounds=4",
        "--set",
        "records-per-device=60",
        "--set",
        "target-epsilon=3.0",
        "--set",
        "public-batch-size=32",
        "--set",
        "progress=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics["round"]) == [1, 2, 3, 4]
    assert {"round", "epsilon", "accuracy", "loss", "delta", "relation"} <= set(metrics.columns)
    assert (metrics["replies"] == 3).all() and (metrics["rejected"] == 0).all()
    eps = metrics["epsilon"].to_numpy()
    assert (eps[1:] > eps[:-1]).all() and eps[-1] <= 3.0  # grows each round, ends at or below target
    assert eps[-1] > 2.5  # calibrated to land near the target
    assert metrics["accuracy"].between(0, 1).all()
    cfg = tomllib.loads((out / "config.toml").read_text())
    assert cfg["mode"] == "fdp" and cfg["num-devices"] == 3
    assert cfg["resolved"]["noise-multiplier"] > 0
    assert cfg["resolved"]["delta"] == pytest.approx(1 / (2 * cfg["resolved"]["num-records"]))
    assert "upper bound" in proc.stdout
    assert "deprecated" not in proc.stdout + proc.stderr
    assert cfg["resolved"]["num-nodes"] == 3  # a small fleet: one virtual SuperNode per device
    for name in ("ledger.jsonl", "checkpoint.pt", "model.pt"):
        assert (out / name).is_file(), name


def _run(out, *args, timeout=300, env=None):
    cmd = [sys.executable, "-m", "simulations.cli", "run", "--out", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _marked(mark: str) -> list[int]:
    """Live processes whose environment holds ``mark`` (every process a run started inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_fedfdp_run_on_fewer_supernodes_is_the_same_run(tmp_path):
    """The same reproducible run on one SuperNode per device and on 2 SuperNodes
    (through Flower's Simulation Runtime): the same ledger, ε and normaliser per
    round, and the same final model up to float summation order; the progress
    bar reaches the terminal; no SuperLink, SuperExec or Ray process is left."""
    common = ["--set", "num-devices=5", "--set", "num-rounds=3", "--set", "records-per-device=40",
              "--set", "reproducible-noise=true", "--set", "seed=4", "--set", "clients-per-round=3",
              "--set", "noise-multiplier=1.0"]
    runs = {}
    mark = f"fedfdp-e2e-{uuid.uuid4().hex}"
    env = {**os.environ, "FEDFDP_TEST_MARK": mark}
    for n in (5, 2):
        proc = _run(tmp_path / f"n{n}", "--supernodes", str(n), *common, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "fedfdp fdp" in proc.stderr and "eps=" in proc.stderr  # the ServerApp's progress bar
        runs[n] = tmp_path / f"n{n}"
    a, b = (pd.read_csv(runs[n] / "metrics.csv") for n in (5, 2))
    assert list(a["epsilon"]) == list(b["epsilon"])
    assert list(a["normaliser"]) == pytest.approx(list(b["normaliser"]), rel=1e-12)
    assert list(a["asked"]) == [3, 3, 3] and (b["asked"] <= 2).all()  # 3 devices on 5 nodes / on 2
    la, lb = (ledger_doc(runs[n]) for n in (5, 2))
    assert la["entries"] == lb["entries"] and len(la["entries"]) == 1 + 3  # the mechanism, 3 charges
    ma, mb = (torch.load(runs[n] / "model.pt") for n in (5, 2))
    for k in ma:
        torch.testing.assert_close(ma[k], mb[k], rtol=1e-4, atol=1e-6)
    nodes = [tomllib.loads((runs[n] / "config.toml").read_text())["resolved"]["num-nodes"] for n in (5, 2)]
    assert nodes == [5, 2]
    assert _marked(mark) == []  # the SuperLink, its SuperExec, flwr-simulation and Ray: all stopped


def test_a_larger_fleet_runs_on_one_supernode_per_core(tmp_path):
    proc = _run(tmp_path / "z", "--set", "num-devices=40", "--set", "num-rounds=2", "--set",
                "records-per-device=20", "--set", "progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = tomllib.loads((tmp_path / "z" / "config.toml").read_text())["resolved"]
    assert resolved["num-nodes"] == min(40, os.cpu_count() or 1)
    metrics = pd.read_csv(tmp_path / "z" / "metrics.csv")
    assert (metrics["asked"] == resolved["num-nodes"]).all()
    assert (metrics["replies"] == metrics["asked"]).all()


def test_failed_simulated_run_is_an_error_naming_the_cause(tmp_path):
    proc = _run(tmp_path / "x", "--set", "num-devices=30", "--set", "num-rounds=2", "--set",
                "records-per-device=20", "--set", "node-wait-timeout=0.01", "--set", "progress=false")
    assert proc.returncode == 1
    assert "error: the simulated run did not complete" in proc.stderr
    assert "node-wait-timeout=0.01" in proc.stderr.splitlines()[-1]


def test_supernodes_out_of_range_is_refused(tmp_path):
    proc = _run(tmp_path / "y", "--supernodes", "4", "--set", "num-devices=3", timeout=60)
    assert proc.returncode == 2 and "--supernodes=4: must be in 1..num-devices=3" in proc.stderr


def test_bad_config_fails_before_any_work(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "simulations.cli",
        "run",
        "--out",
        str(tmp_path / "x"),
        "--set",
        "noise-multiplier=-1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "noise-multiplier=-1: must be > 0" in proc.stderr
    assert not (tmp_path / "x").exists()
