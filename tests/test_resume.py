"""Budgets across restarts: write-ahead ledger, durable checkpoints, resume, and
refusal of every ledger that was lost, zeroed, rolled back or edited."""

import json
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from fedfdp.algorithm import run_centralised
from fedfdp.checkpoint import CheckpointMismatch, read_ledger
from fedfdp.config import load_config
from simulations.cli import main
from tests.flower_helpers import InProcessGrid, registered_strategy

BASE = {
    # a fixed C: the ledger arithmetic below is per σ (adaptive C across resumes:
    # tests/test_quantile_clipping.py)
    "clipping-quantile": 0,
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
    # comparisons with an uninterrupted run need the same secret streams: the explicit opt-in
    "reproducible-noise": True,
}


class Crash(RuntimeError):
    pass


def _run(cfg, crash_round=None, where="mid"):
    strat = registered_strategy(cfg)
    strat.registry = {}
    if crash_round is not None and where == "boundary":
        original = strat.server.charge

        def charge(r):
            if r == crash_round:
                raise Crash(f"before charging round {r}")
            return original(r)

        strat.server.charge = charge

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
    assert (ledger.charges[-1].round, ledger.charges[-1].attempt) == (4, 0)  # before the round drew noise
    resumed = _run(load_config({**BASE, "out-dir": out, "resume": True}))
    rounds = [(c.round, c.attempt) for c in resumed.ledger.charges]
    assert rounds == [(1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (5, 0), (6, 0)]
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
    mismatch = r"checkpoint.pt: .*sampling-rate: checkpoint 0.2 vs now 0.3"
    with pytest.raises(CheckpointMismatch, match=mismatch):
        _run(load_config({**BASE, "num-rounds": 2, "out-dir": out, "resume": True, "sampling-rate": 0.3}))
    with pytest.raises(CheckpointMismatch, match="holds no checkpoint"):
        _run(load_config({**BASE, "out-dir": str(tmp_path / "empty"), "resume": True}))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ledger.json").write_text("{not json")
    with pytest.raises(CheckpointMismatch, match="malformed privacy ledger"):
        _run(load_config({**BASE, "out-dir": str(tmp_path / "bad"), "resume": True}))


# --------------------------------------------------------------------------------------
# a ledger that cannot be lost
# --------------------------------------------------------------------------------------


def _finished(tmp_path, rounds=4):
    """A run that stopped after ``rounds`` of 6 (its checkpoint and ledger on disk)."""
    out = tmp_path / "run"
    with pytest.raises(Crash):
        _run(load_config({**BASE, "out-dir": str(out)}), crash_round=rounds + 1, where="boundary")
    return out


def _edit(path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _zero(doc):
    doc["charges"] = []
    doc["accountant"]["ledger"] = []


def _roll_back(doc):
    doc["charges"] = doc["charges"][:2]
    doc["accountant"]["ledger"][0]["count"] = 2


def _sigma_everywhere(doc):
    for c in doc["charges"]:
        c[2] = 50.0
    doc["accountant"]["ledger"][0]["noise_multiplier"] = 50.0


def _sigma_in_accountant(doc):
    doc["accountant"]["ledger"][0]["noise_multiplier"] = 50.0


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda p: p.unlink(), "missing, but .*checkpoint.pt records 4 privacy charges"),
        (lambda p: p.write_text(""), "malformed privacy ledger"),
        (lambda p: p.write_bytes(b"\xff\xfe{"), "malformed privacy ledger"),
        (lambda p: _edit(p, _zero), "0 charges, the checkpoint records 4: .*zeroed or rolled back"),
        (lambda p: _edit(p, _roll_back), "2 charges, the checkpoint records 4"),
        (lambda p: _edit(p, _sigma_everywhere), "digest mismatch"),
        (lambda p: _edit(p, _sigma_in_accountant), "accountant state does not match"),
    ],
    ids=["deleted", "empty", "not-utf8", "zeroed", "rolled-back", "sigma-edited", "accountant-edited"],
)
def test_resume_refuses_a_lost_or_edited_ledger(tmp_path, damage, match):
    out = _finished(tmp_path)
    damage(out / "ledger.json")
    with pytest.raises(CheckpointMismatch, match=match) as err:
        _run(load_config({**BASE, "out-dir": str(out), "resume": True}))
    assert "ledger.json" in str(err.value) and "\n" not in str(err.value)


def test_resume_refuses_a_ledger_charged_under_another_plan(tmp_path):
    """A ledger written without a checkpoint (crash in round 1), then σ edited
    consistently (charges and accountant): no digest to compare, but the charges
    disagree with the resolved plan's σ."""
    out = tmp_path / "run"
    with pytest.raises(Crash):
        _run(load_config({**BASE, "out-dir": str(out)}), crash_round=1, where="mid")
    assert not (out / "checkpoint.pt").exists()
    _edit(out / "ledger.json", _sigma_everywhere)
    plan = r"charged with sigma=50.0, .*; the resolved plan has sigma=1.0"
    with pytest.raises(CheckpointMismatch, match=plan):
        _run(load_config({**BASE, "out-dir": str(out), "resume": True}))


def test_resume_refuses_a_corrupted_checkpoint_naming_it(tmp_path):
    out = _finished(tmp_path)
    (out / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointMismatch, match=r"checkpoint.pt: unreadable checkpoint"):
        _run(load_config({**BASE, "out-dir": str(out), "resume": True}))


def test_resume_with_the_ledger_intact_continues_from_its_epsilon(tmp_path):
    ref = _run(load_config({**BASE, "out-dir": str(tmp_path / "ref")}))
    out = _finished(tmp_path)
    resumed = _run(load_config({**BASE, "out-dir": str(out), "resume": True}))
    assert resumed.budget.epsilon() == ref.budget.epsilon()


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda out: (out / "ledger.json").unlink(), "ledger.json: missing"),
        (lambda out: (out / "checkpoint.pt").write_bytes(b"\x00" * 10), "checkpoint.pt: unreadable"),
    ],
)
def test_cli_refusals_are_one_line_with_status_2(tmp_path, capsys, damage, match):
    out = _finished(tmp_path)
    damage(out)
    assert main(["run", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and match in err and "\n" not in err and "Traceback" not in err


def test_centralised_engine_writes_the_same_ledger_and_refuses_an_occupied_directory(tmp_path, capsys):
    out = tmp_path / "central"
    cfg = load_config({**BASE, "out-dir": str(out)})
    _, rows = run_centralised(cfg)
    for name in ("config.toml", "metrics.csv", "ledger.json", "checkpoint.pt", "model.pt"):
        assert (out / name).is_file(), name
    assert len(read_ledger(out).charges) == 6 == len(rows)
    metrics = (out / "metrics.csv").read_text()
    with pytest.raises(CheckpointMismatch, match="already holds a run"):
        run_centralised(cfg)
    assert (out / "metrics.csv").read_text() == metrics  # nothing overwritten
    assert main(["run", "--centralised", "--out", str(out), "--set", "num-rounds=6"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (out / "metrics.csv").read_text() == metrics
    # an interrupted centralised run resumes through the same ledger
    cut = tmp_path / "cut"
    with pytest.raises(PrivacyBudgetStop):
        run_centralised(load_config({**BASE, "out-dir": str(cut), "num-rounds": 6}),
                        server_parts=_stopping_parts(3))
    resumed_cfg = load_config({**BASE, "out-dir": str(cut), "resume": True})
    _, resumed = run_centralised(resumed_cfg)
    assert [r["round"] for r in resumed] == list(range(1, 7))
    assert [(c.round, c.attempt) for c in read_ledger(cut).charges][:3] == [(1, 0), (2, 0), (3, 0)]


class PrivacyBudgetStop(RuntimeError):
    pass


def _stopping_parts(after):
    """Server parts whose mechanism raises once ``after`` rounds were released."""
    from fedfdp.mechanisms import GaussianSumMechanism
    from fedfdp.server import ServerParts

    calls = {"n": 0}

    def mechanism(sigma, clip):
        calls["n"] += 1
        if calls["n"] > after:
            raise PrivacyBudgetStop("interrupted")
        return GaussianSumMechanism(sigma, clip)

    return ServerParts(mechanism=mechanism)


@pytest.mark.slow
def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    from pathlib import Path

    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is dead: it only awaits its reaper)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_real_subprocess_and_resume(tmp_path):
    """A real `fedfdp run` killed with SIGKILL mid-run leaves no Flower process
    behind, then `fedfdp run --resume`: its ledger equals an uninterrupted run's,
    plus the aborted attempt if the kill landed inside a round; ε never below the
    uninterrupted run's."""
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

        descendants = _descendants(proc.pid)  # the SuperLink and flwr run: sessions of their own
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # the SuperLink and flwr go at once (PR_SET_PDEATHSIG); Ray's agents exit on their
    # own once their raylet is gone (measured: within two minutes)
    deadline = time.monotonic() + 180
    while any(_alive(pid) for pid in descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert descendants and not [pid for pid in descendants if _alive(pid)], "orphans left running"
    killed_at = len(read_ledger(run).charges)
    assert killed_at < 20
    done = subprocess.run([*cli, "--resume", str(run)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    a, b = read_ledger(ref), read_ledger(run)
    extra = [c for c in b.charges if c.attempt > 0]
    assert [c for c in b.charges if c.attempt == 0] == a.charges
    assert len(extra) <= 1
    ref_m, run_m = pd.read_csv(ref / "metrics.csv"), pd.read_csv(run / "metrics.csv")
    assert list(run_m["round"]) == list(range(1, 21))
    assert run_m["epsilon"].iloc[-1] >= ref_m["epsilon"].iloc[-1] - 1e-12
    if not extra:
        assert run_m["epsilon"].iloc[-1] == pytest.approx(ref_m["epsilon"].iloc[-1], abs=1e-12)
