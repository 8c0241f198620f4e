"""Budgets across restarts: write-ahead ledger, atomic checkpoints, resume, refusal."""

import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from fedfdp.checkpoint import CheckpointMismatch, read_ledger
from fedfdp.config import load_config
from tests.flower_helpers import InProcessGrid, registered_strategy

BASE = {
    "num-devices": 3,
    "records-per-device": 50,
    "sampling-rate": 0.2,
    "public-batch-size": 20,
    "noise-multiplier": 1.0,
    "target-epsilon": 0,
    "num-rounds": 6,
    "seed": 5,
    "progress": False,
    "hidden-size": 8,
}


class Crash(RuntimeError):
    pass


def _run(cfg, crash_round=None, where="mid"):
    strat = registered_strategy(cfg)
    strat.registry = {}
    if crash_round is not None and where == "boundary":
        original = strat.charge

        def charge(r):
            if r == crash_round:
                raise Crash(f"before charging round {r}")
            original(r)

        strat.charge = charge

    def tamper(node, msg, reply):
        train = msg.metadata.message_type == "train"
        if where == "mid" and train and msg.content["config"]["server-round"] == crash_round:
            raise Crash(f"inside round {crash_round}")
        return reply

    strat.start(InProcessGrid(cfg, tamper=tamper))
    return strat


def _params(strat):
    return [p.detach().clone() for p in strat.params]


def test_resume_after_crash_between_rounds_equals_uninterrupted(tmp_path):
    ref = _run(load_config({**BASE, "out-dir": str(tmp_path / "ref")}))
    out = str(tmp_path / "run")
    with pytest.raises(Crash):
        _run(load_config({**BASE, "out-dir": out}), crash_round=4, where="boundary")
    assert len(read_ledger(out).charges) == 3
    resumed = _run(load_config({**BASE, "out-dir": out, "resume": True}))
    for a, b in zip(_params(ref), _params(resumed), strict=True):
        assert torch.equal(a, b)
    assert resumed.ledger.charges == ref.ledger.charges
    assert resumed.budget.epsilon() == ref.budget.epsilon()
    assert [r["round"] for r in resumed.rows] == list(range(1, 7))


def test_crash_inside_a_round_is_charged_and_rerun_with_fresh_randomness(tmp_path):
    ref = _run(load_config({**BASE, "out-dir": str(tmp_path / "ref")}))
    out = str(tmp_path / "run")
    with pytest.raises(Crash):
        _run(load_config({**BASE, "out-dir": out}), crash_round=4, where="mid")
    ledger = read_ledger(out)
    assert ledger.charges[-1] == [4, 0]  # written before the round drew its noise
    resumed = _run(load_config({**BASE, "out-dir": out, "resume": True}))
    assert resumed.ledger.charges == [[1, 0], [2, 0], [3, 0], [4, 0], [4, 1], [5, 0], [6, 0]]
    assert resumed.budget.epsilon() > ref.budget.epsilon()  # never below the true cost
    assert any(not torch.equal(a, b) for a, b in zip(_params(ref), _params(resumed), strict=True))


def test_budget_never_exceeded_across_restarts(tmp_path):
    out = str(tmp_path / "run")
    cfg = {**BASE, "num-rounds": 40, "max-epsilon": 3.0, "out-dir": out}
    for crash in (3, 6, 9, 12):
        with pytest.raises(Crash):
            _run(load_config({**cfg, "resume": crash != 3}), crash_round=crash, where="mid")
    final = _run(load_config({**cfg, "resume": True}))
    assert final.stop_reason is not None
    assert final.budget.epsilon() <= 3.0
    assert len(final.ledger.charges) == len(final.rows) + 4  # four aborted attempts charged


def test_refusals(tmp_path):
    out = str(tmp_path / "run")
    _run(load_config({**BASE, "num-rounds": 2, "out-dir": out}))
    with pytest.raises(CheckpointMismatch, match="already holds a run"):
        _run(load_config({**BASE, "num-rounds": 2, "out-dir": out}))
    with pytest.raises(CheckpointMismatch, match=r"sampling-rate: checkpoint 0.2 vs now 0.3"):
        _run(load_config({**BASE, "num-rounds": 2, "out-dir": out, "resume": True, "sampling-rate": 0.3}))
    with pytest.raises(CheckpointMismatch, match="holds no checkpoint"):
        _run(load_config({**BASE, "out-dir": str(tmp_path / "empty"), "resume": True}))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ledger.json").write_text("{not json")
    with pytest.raises(CheckpointMismatch, match="malformed privacy ledger"):
        _run(load_config({**BASE, "out-dir": str(tmp_path / "bad"), "resume": True}))


@pytest.mark.slow
def test_kill_real_subprocess_and_resume(tmp_path):
    """A real `fedfdp run` killed with SIGKILL mid-run, then `fedfdp run --resume`:
    its ledger equals an uninterrupted run's, plus the aborted attempt if the kill
    landed inside a round; ε never below the uninterrupted run's."""
    common = [
        "--set",
        "num-devices=3",
        "--set",
        "records-per-device=40",
        "--set",
        "num-rounds=20",
        "--set",
        "public-batch-size=16",
        "--set",
        "noise-multiplier=1.0",
        "--set",
        "target-epsilon=0",
        "--set",
        "progress=false",
        "--set",
        "hidden-size=8",
    ]
    cli = [sys.executable, "-m", "simulations.cli", "run"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    subprocess.run([*cli, "--out", str(ref), *common], check=True, capture_output=True, timeout=300)
    proc = subprocess.Popen(
        [*cli, "--out", str(run), *common],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            ledger = read_ledger(run) if run.is_dir() else None
            if ledger is not None and len(ledger.charges) >= 5:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run did not reach 5 rounds")
    finally:
        import os

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = len(read_ledger(run).charges)
    assert killed_at < 20
    done = subprocess.run([*cli, "--resume", str(run)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    a, b = read_ledger(ref), read_ledger(run)
    extra = [c for c in b.charges if c[1] > 0]
    assert [c for c in b.charges if c[1] == 0] == a.charges
    assert len(extra) <= 1
    ref_m, run_m = pd.read_csv(ref / "metrics.csv"), pd.read_csv(run / "metrics.csv")
    assert list(run_m["round"]) == list(range(1, 21))
    assert run_m["epsilon"].iloc[-1] >= ref_m["epsilon"].iloc[-1] - 1e-12
    if not extra:
        assert run_m["epsilon"].iloc[-1] == pytest.approx(ref_m["epsilon"].iloc[-1], abs=1e-12)
