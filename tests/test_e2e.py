"""End to end: `fedfdp run` on Flower's simulation engine (slow: starts Ray)."""

import subprocess
import sys
import tomllib

import pandas as pd
import pytest

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
