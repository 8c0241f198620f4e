"""Budgets across restarts: the hash-chained write-ahead ledger, checkpoints that load
without running code, pessimistic charges for what a crashed session may have written,
and refusal of every checkpoint/ledger pair that disagrees."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedfdp.accounting import FDPAccountant
from fedfdp.algorithm import run_centralised, run_plan_centrally
from fedfdp.checkpoint import CHECKPOINT_FILE, CheckpointMismatch, load_checkpoint
from fedfdp.config import load_config
from fedfdp.ledger import LEDGER_FILE, Ledger, LedgerError, read_ledger, write_ledger
from fedfdp.run_files import RunFiles
from fedfdp.run_plan import build_plan
from simulations.cli import main
from tests.flower_helpers import InProcessGrid, registered_strategy
from tests.mechanism_helpers import fdp_event, ledger_doc, write_ledger_doc, written_ledger

BASE = {
    # a fixed C: the ledger arithmetic below is per σ (adaptive C: tests/test_quantile_clipping.py)
    "clipping-quantile": 0,
    "num-devices": 3,
    "records-per-device": 50,
    "sampling-rate": 0.2,
    "public-batch-size": 20,
    "noise-multiplier": 1.0,
    "num-rounds": 6,
    "seed": 5,
    "progress": False,
    # comparisons with an uninterrupted run need the same secret streams: the explicit opt-in
    "reproducible-noise": True,
}


class Crash(RuntimeError):
    pass


def _crashing_eval(at: int):
    """An evaluation that crashes after round ``at`` was charged and stepped, before its
    checkpoint: the crash of a session inside a round."""

    def evaluate(r, model):
        if r == at:
            raise Crash(f"after round {r}")
        return {}

    return evaluate


def _cfg(tmp_path, **kw):
    return load_config({**BASE, "out-dir": str(tmp_path), **{k.replace("_", "-"): v for k, v in kw.items()}})


def _epsilon_of(ledger: Ledger, delta: float) -> float:
    acc = FDPAccountant()
    for ev in ledger.events():
        acc.compose(fdp_event(ev))
    return acc.epsilon(delta)


def test_resume_after_a_crash_inside_a_round_charges_it_again_and_never_lowers_epsilon(tmp_path):
    _, ref_rows = run_centralised(_cfg(tmp_path / "ref"))
    with pytest.raises(Crash):
        run_centralised(_cfg(tmp_path / "run"), evaluate_fn=_crashing_eval(4))
    crashed = written_ledger(tmp_path / "run")
    assert [c.round for c in crashed.charges] == [1, 2, 3, 4]  # round 4 charged before it drew
    _, rows = run_centralised(_cfg(tmp_path / "run", resume=True))
    ledger = written_ledger(tmp_path / "run")
    assert [(c.round, c.body["attempt"]) for c in ledger.charges] == [
        (1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (5, 0), (6, 0)]
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # one more charge than the uninterrupted run: ε is at least its ε
    assert rows[-1]["epsilon"] > ref_rows[-1]["epsilon"]
    assert rows[-1]["epsilon"] == pytest.approx(_epsilon_of(ledger, rows[-1]["delta"]), abs=0)


def test_resume_between_rounds_trains_the_same_model_and_charges_one_pessimistic_round(tmp_path):
    """A crash after round 3's checkpoint, before round 4 is charged: the ledger cannot
    tell "never written" from "written and lost", so the round is charged once more
    (unrecorded); the model equals the uninterrupted run's."""
    ref_model, ref_rows = run_centralised(_cfg(tmp_path / "ref"))
    cfg3 = load_config({**BASE, "out-dir": str(tmp_path / "run")})

    class CrashingJournal(RunFiles):
        """The run directory, whose durable write of round 4's charge never happens."""

        def write_ledger(self, ledger):
            if any(e.round == 4 for e in ledger.charges):
                raise Crash("before writing round 4's charge")
            super().write_ledger(ledger)

    journal = CrashingJournal(tmp_path / "run", cfg3.run, cfg3.to_flat(), cfg3.privacy.num_rounds)
    with pytest.raises(Crash):
        run_plan_centrally(build_plan(cfg3, files=journal))
    model, rows = run_centralised(_cfg(tmp_path / "run", resume=True))
    got, ref = written_ledger(tmp_path / "run"), written_ledger(tmp_path / "ref")
    assert [e.kind.value for e in got.charges].count("unrecorded") == 1
    assert [e.body for e in got.charges if e.kind.value == "charge"] == [e.body for e in ref.charges]
    assert rows[-1]["epsilon"] > ref_rows[-1]["epsilon"]
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_ledger_rolled_back_after_the_checkpoint_is_charged_pessimistically(tmp_path):
    """checkpoint-every = 3: the session after round 3's checkpoint wrote rounds 4-5
    and crashed; the ledger is restored from a copy taken after round 4. Resume is
    accepted, charges the round the copy lacks (and the one that was never written,
    the bound is per session: 3 rounds), and the final ε covers every charge ever
    written."""
    run = tmp_path / "run"
    cfg = _cfg(run, checkpoint_every=3)
    copies = {}

    def evaluate(r, model):
        copies[r] = (run / LEDGER_FILE).read_bytes()
        if r == 5:
            raise Crash("after round 5")
        return {}

    with pytest.raises(Crash):
        run_centralised(cfg, evaluate_fn=evaluate)
    written = written_ledger(run)
    assert len(written.charges) == 5
    (run / LEDGER_FILE).write_bytes(copies[4])  # the backup: 4 charges, one lost
    _, rows = run_centralised(_cfg(run, checkpoint_every=3, resume=True))
    ledger = written_ledger(run)
    kinds = [e.kind.value for e in ledger.charges]
    assert kinds.count("unrecorded") == 3 - 1  # rounds 4-6 may have been written; round 4 is there
    all_written = written.charges + [e for e in ledger.charges[4:] if e.kind.value == "charge"]
    acc = FDPAccountant()
    for e in all_written:
        acc.compose(fdp_event(e.event))
    assert rows[-1]["epsilon"] >= acc.epsilon(rows[-1]["delta"]) - 1e-12


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("delete-ledger", "missing, but"),
        ("delete-checkpoint", "checkpoint.pt: missing, but"),
        ("zero-ledger", "not a valid privacy ledger"),
        ("truncate-ledger", "does not contain the head"),
        ("rollback-before-head", "does not contain the head"),
        ("edit-event", "hash mismatch"),
        ("edit-event-rehashed", "another resolved mechanism|never charged|does not contain the head"),
        ("other-mechanism", "another resolved mechanism"),
        ("checkpoint-head-zeroed", "never charged"),
        ("pickled-checkpoint", "unreadable or unsafe checkpoint|not a checkpoint fedfdp wrote"),
        ("edit-rows", r"rows.jsonl: its first 6 lines are not the ones the checkpoint recorded"),
        ("truncate-rows", r"rows.jsonl: 5 complete lines, but the checkpoint counts 6"),
        ("delete-rows", r"rows.jsonl: missing, but the checkpoint counts 6 rows"),
    ],
)
def test_resume_refuses_every_disagreeing_pair_and_leaves_the_files(tmp_path, damage, match):
    run = tmp_path / "run"
    copies = {}

    def evaluate(r, model):
        copies[r] = (run / LEDGER_FILE).read_bytes()
        return {}

    run_centralised(_cfg(run), evaluate_fn=evaluate)
    ledger_path, ckpt_path = run / LEDGER_FILE, run / CHECKPOINT_FILE
    doc = ledger_doc(run)
    if damage == "delete-ledger":
        ledger_path.unlink()
    elif damage == "delete-checkpoint":
        ckpt_path.unlink()
    elif damage == "zero-ledger":
        ledger_path.write_bytes(b"\0" * ledger_path.stat().st_size)
    elif damage == "truncate-ledger":
        doc["entries"] = doc["entries"][:1]
        write_ledger_doc(run, doc)
    elif damage == "rollback-before-head":
        ledger_path.write_bytes(copies[3])
    elif damage == "edit-event":
        doc["entries"][2]["event"]["noise_multiplier"] = 50.0
        write_ledger_doc(run, doc)
    elif damage in ("edit-event-rehashed", "other-mechanism"):
        # a forged chain, valid link by link, but not the chain the checkpoint saw
        from fedfdp.accounting import event_from_dict
        from fedfdp.ledger import Ledger

        first = doc["entries"][0]
        digest = "f" * 64 if damage == "other-mechanism" else first["digest"]
        forged = Ledger.start(first["mechanism"], digest)
        for i, item in enumerate(doc["entries"][1:]):
            event = dict(item["event"])
            if damage == "edit-event-rehashed" and i == 1:
                event["noise_multiplier"] = 50.0
            forged.append_charge(item["round"], item["attempt"], event_from_dict(event))
        write_ledger(run, forged)
    elif damage == "checkpoint-head-zeroed":
        raw = torch.load(ckpt_path, weights_only=True)
        meta = json.loads(raw["meta"])
        meta["head"] = {"entries": 1, "hash": doc["entries"][0]["hash"], "charges": 0}
        raw["meta"] = json.dumps(meta)
        torch.save(raw, ckpt_path)
    elif damage == "edit-rows":
        rows_path = run / "rows.jsonl"
        rows_path.write_text(rows_path.read_text().replace('"round": 2,', '"round": 20,'))
    elif damage == "truncate-rows":
        rows_path = run / "rows.jsonl"
        rows_path.write_text("".join(rows_path.read_text().splitlines(keepends=True)[:5]))
    elif damage == "delete-rows":
        (run / "rows.jsonl").unlink()
    elif damage == "pickled-checkpoint":
        marker = tmp_path / "pwned"

        class Payload:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        torch.save({"meta": Payload(), "model": {}, "optimizer": {}}, ckpt_path)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises((CheckpointMismatch, LedgerError), match=match):
        run_centralised(_cfg(run, resume=True))
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # nothing written
    if damage == "pickled-checkpoint":
        assert not (tmp_path / "pwned").exists()  # the payload never ran


def test_a_fresh_run_refuses_an_occupied_directory_and_resume_needs_a_run(tmp_path):
    run_centralised(_cfg(tmp_path / "a"))
    with pytest.raises(CheckpointMismatch, match="already holds a run"):
        run_centralised(_cfg(tmp_path / "a"))
    with pytest.raises(CheckpointMismatch, match="holds no checkpoint or ledger"):
        run_centralised(_cfg(tmp_path / "empty", resume=True))


def test_checkpoints_hold_tensors_and_json_only(tmp_path):
    run_centralised(_cfg(tmp_path))
    ckpt = load_checkpoint(tmp_path)
    assert ckpt is not None
    assert ckpt.round == 6 and ckpt.head.charges == 6 and ckpt.every == 1
    raw = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    assert set(raw) == {"meta", "model", "optimizer"} and isinstance(raw["meta"], str)


def test_budget_stop_uses_every_charge_ever_written(tmp_path):
    """max-epsilon reached across crashes: the charges of the crashed attempts count."""
    cap_cfg = dict(num_rounds=30, max_epsilon=2.0)
    with pytest.raises(Crash):
        run_centralised(_cfg(tmp_path, **cap_cfg), evaluate_fn=_crashing_eval(3))
    _, rows = run_centralised(_cfg(tmp_path, resume=True, **cap_cfg))
    ledger = written_ledger(tmp_path)
    spent = _epsilon_of(ledger, rows[-1]["delta"])
    assert spent <= 2.0 + 1e-12 and rows[-1]["epsilon"] == spent
    assert len(rows) < 30  # stopped at the cap, with round 3 charged twice


def test_flower_path_resumes_from_the_same_files(tmp_path):
    cfg = _cfg(tmp_path)
    strat = registered_strategy(cfg)
    strat.registry = {}
    strat.start(InProcessGrid(cfg))
    assert len(written_ledger(tmp_path).charges) == 6
    with pytest.raises(CheckpointMismatch, match="already holds a run"):
        again = registered_strategy(cfg)
        again.registry = {}
        again.start(InProcessGrid(cfg))


def test_cli_refusal_is_one_line_with_status_2(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["run", "--centralised", "--out", str(run), *_sets({
        "num-devices": 3, "records-per-device": 40, "num-rounds": 3, "noise-multiplier": 1.0,
        "progress": "false", "clipping-quantile": 0})]
    assert main(argv) == 0
    (run / LEDGER_FILE).unlink()
    capsys.readouterr()
    assert main(["run", "--centralised", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ledger.jsonl: missing" in err[0]


def _sets(values: dict) -> list[str]:
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


def _wait_for(path: Path, charges: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ledger = read_ledger(path) if path.is_dir() else None
        except LedgerError:  # caught mid-rename: try again
            ledger = None
        if ledger is not None and len(ledger.charges) >= charges:
            return
        if proc.poll() is not None:
            pytest.fail("the run ended before it was killed")
        time.sleep(0.02)
    pytest.fail(f"the run did not reach {charges} charges")


@pytest.mark.slow
def test_kill_9_then_ledger_rollback_then_resume_never_prints_less_than_was_spent(tmp_path):
    """The review's attack, for real: `fedfdp run --centralised` (60 rounds, checkpoint
    every 10) killed with SIGKILL; the ledger replaced by an older copy with at least
    the checkpoint's charges; `--resume` charges the missing ones pessimistically, and
    the ε it prints at the end is at least the ε of every charge ever written."""
    run = tmp_path / "run"
    sets = {"num-devices": 4, "records-per-device": 60, "num-rounds": 60, "checkpoint-every": 10,
            "progress": "false", "max-epsilon": 2.0}
    argv = [sys.executable, "-m", "simulations.cli", "run", "--centralised", "--out", str(run),
            *_sets(sets)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_for(run, 14, proc)
        backup = (run / LEDGER_FILE).read_bytes()  # a copy taken mid-run
        _wait_for(run, 17, proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    written = written_ledger(run)
    assert len(read_ledger_from_bytes(backup).charges) < len(written.charges)
    shutil.copy(run / LEDGER_FILE, tmp_path / "as-killed.json")
    (run / LEDGER_FILE).write_bytes(backup)
    done = subprocess.run([sys.executable, "-m", "simulations.cli", "run", "--centralised", "--resume",
                           str(run)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    after = written_ledger(run)
    assert any(e.kind.value == "unrecorded" for e in after.charges)
    # every charge ever written: those of the killed session plus those after the backup's
    n_backup = len(read_ledger_from_bytes(backup).charges)
    ever = written.charges + [e for e in after.charges[n_backup:] if e.kind.value == "charge"]
    acc = FDPAccountant()
    for e in ever:
        acc.compose(fdp_event(e.event))
    rows = pd.read_csv(run / "metrics.csv")
    assert rows["epsilon"].iloc[-1] >= acc.epsilon(rows["delta"].iloc[-1]) - 1e-9
    ckpt = load_checkpoint(run)
    assert ckpt is not None and ckpt.head.charges == len(after.charges)


def read_ledger_from_bytes(raw: bytes) -> Ledger:
    from fedfdp.ledger import parse_ledger

    return parse_ledger(raw)


def _drop_from_checkpoint(run_dir: Path, keys: tuple[str, ...]) -> None:
    """Rewrite ``checkpoint.pt`` as a version that did not know ``keys`` wrote it."""
    doc = torch.load(run_dir / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    meta = json.loads(doc["meta"])
    for key in keys:
        del meta["config"][key]
    torch.save({**doc, "meta": json.dumps(meta)}, run_dir / CHECKPOINT_FILE)


def test_a_checkpoint_written_before_a_key_existed_resumes_at_the_key_default(tmp_path):
    """Keys added later (the diffusion model's) are absent from an older run's record:
    they count as their defaults, so the run resumes to its last round; a record that
    lacks a key the resuming configuration sets otherwise is still refused, naming it."""
    from fedfdp.checkpoint import check_compatible
    from fedfdp.config import default_record

    with pytest.raises(Crash):
        run_centralised(_cfg(tmp_path / "run"), evaluate_fn=_crashing_eval(4))
    new_keys = ("unet-width", "diffusion-steps")
    _drop_from_checkpoint(tmp_path / "run", new_keys)
    older = load_checkpoint(tmp_path / "run")
    assert older is not None and not set(new_keys) & set(older.config)
    _, rows = run_centralised(_cfg(tmp_path / "run", resume=True))
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]  # BASE's num-rounds

    saved = {k: v for k, v in default_record().items() if k not in new_keys}
    check_compatible(saved, default_record())
    with pytest.raises(CheckpointMismatch, match=r"unet-width: checkpoint 32 vs now 16"):
        check_compatible(saved, {**default_record(), "unet-width": 16})
