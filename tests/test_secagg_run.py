"""End to end: ``fedfdp run`` with ``aggregation = "secagg"`` on Flower's simulation engine
(slow: starts a SuperLink and Ray). Each virtual SuperNode is one SecAgg+ party.

The printed ε is checked against the ledger's events, recomputed with route A
(:func:`route_a_epsilon`) and route B (:func:`route_b_epsilon`) directly; the ledger's
events must be the resolved distributed event (``n_h = n_min − t_c``).
"""

import subprocess
import sys
import tomllib

import pandas as pd
import pytest

from fedfdp.accounting.distributed import DistributedDiscreteGaussian, route_a_epsilon, route_b_epsilon
from fedfdp.ledger import read_ledger
from tests.mechanism_helpers import events_as, written_ledger

pytestmark = pytest.mark.slow


def _run(out, *sets, supernodes=4):
    cmd = [sys.executable, "-m", "simulations.cli", "run", "--out", str(out), "--supernodes", str(supernodes)]
    for item in ("num-devices=4", "records-per-device=60", "num-rounds=3", "progress=false",
                 "aggregation=secagg", "secagg-min-survivors=3", "public-batch-size=32", *sets):
        cmd += ["--set", item]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400)


def test_fedfdp_run_with_secure_aggregation(tmp_path):
    out = tmp_path / "run"
    proc = _run(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics["round"]) == [1, 2, 3]
    assert (metrics["replies"] == 4).all()
    events = events_as(DistributedDiscreteGaussian, written_ledger(out).events())
    assert len(events) == 3
    resolved = tomllib.loads((out / "config.toml").read_text())["resolved"]
    assert events[0].honest_parties == 3 and events[0].local_sigma == resolved["secagg-local-sigma"]
    delta = resolved["delta"]
    want = min(route_a_epsilon(events, delta).upper, route_b_epsilon(events, delta))
    assert metrics["epsilon"].iloc[-1] == pytest.approx(want, rel=1e-9)
    assert want <= 2.0 + 1e-12  # the default target
    assert "upper bound" in proc.stdout


def test_fedfdp_run_secagg_with_too_few_supernodes_fails_naming_the_cause(tmp_path):
    proc = _run(tmp_path / "run", "secagg-min-survivors=4", supernodes=3)
    assert proc.returncode != 0
    assert "secagg-min-survivors=4: only 3 SuperNodes" in proc.stdout + proc.stderr


def _run_with_dropout(tmp_path, n_min: int):
    """``fedfdp run``'s own simulation (staged app, local SuperLink) with the SuperNode of
    partition 2 dropping out of every collect stage (tests/secagg_tamper_app.py)."""
    import shutil
    from pathlib import Path

    import tomli_w

    from fedfdp.config import load_config
    from simulations.flower_processes import LocalSimulation, stage_simulation_app

    out = tmp_path / "run"
    out.mkdir()
    cfg = load_config({"num-devices": 4, "records-per-device": 60, "num-rounds": 2, "progress": False,
                       "aggregation": "secagg", "secagg-min-survivors": n_min, "public-batch-size": 32,
                       "out-dir": str(out)})
    with LocalSimulation() as sim:
        app = stage_simulation_app(sim.root / "app", cfg)
        shutil.copy(Path(__file__).parent / "secagg_tamper_app.py", app / "secagg_tamper_app.py")
        doc = tomllib.loads((app / "pyproject.toml").read_text())
        doc["tool"]["flwr"]["app"]["components"]["clientapp"] = "secagg_tamper_app:app"
        (app / "pyproject.toml").write_text(tomli_w.dumps(doc))
        sim.run(app, 4)
    return cfg, out


def test_a_supernode_dropping_at_collect_below_min_survivors_leaves_model_and_ledger_unchanged(tmp_path):
    import torch

    from fedfdp.data import load_server_data
    from fedfdp.models import build_model_for

    cfg, out = _run_with_dropout(tmp_path, n_min=4)
    ledger = read_ledger(out)
    assert ledger is not None and ledger.charges == []  # every try aborted before unmask: no charge
    assert not (out / "metrics.csv").exists() or pd.read_csv(out / "metrics.csv").empty
    initial = build_model_for(cfg.training, load_server_data(cfg.data)).state_dict()  # from the public seed
    final = torch.load(out / "model.pt", weights_only=True)
    assert set(final) == set(initial)
    for k in initial:
        assert torch.equal(final[k], initial[k]), k


def test_a_supernode_dropping_at_collect_above_min_survivors_is_charged_the_planned_event(tmp_path):
    _, out = _run_with_dropout(tmp_path, n_min=3)
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics["round"]) == [1, 2] and (metrics["replies"] == 3).all()
    events = events_as(DistributedDiscreteGaussian, written_ledger(out).events())
    assert len(events) == 2 and all(e.honest_parties == 3 for e in events)
