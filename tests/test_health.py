"""Runs that leave the finite range stop loudly: one line naming the round and the
likely setting, exit status 2, the ledger keeping the round's charge, the last good
checkpoint intact and no final model written."""

import math
import subprocess
import sys

import pytest
import torch

from fedfdp.algorithm import run_centralised
from fedfdp.checkpoint import load_checkpoint
from fedfdp.config import load_config
from fedfdp.health import RunDiverged
from fedfdp.ledger import read_ledger

BASE = {"num-devices": 3, "records-per-device": 40, "num-rounds": 4, "progress": False,
        "clipping-quantile": 0}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"noise-multiplier": 1e300},
         r"round 1: the aggregated gradient .*; likely the noise \(noise-multiplier x clipping-norm"),
        ({"noise-multiplier": 1.0, "clipping-norm": 1e300}, r"round 1: the aggregated gradient"),
        ({"noise-multiplier": 1.0, "learning-rate": 1e30}, r"round \d: the (model|aggregated gradient|public "
                                                           r"loss|held-out loss).*learning-rate"),
        ({"noise-multiplier": 1.0, "alpha": 1e300},
         r"round 1: the aggregated gradient.*; likely alpha=1e\+300"),
    ],
)
def test_a_blown_up_round_stops_the_run_and_keeps_ledger_and_checkpoint(tmp_path, overrides, match):
    cfg = load_config({**BASE, **overrides, "out-dir": str(tmp_path)})
    with pytest.raises(RunDiverged, match=match):
        run_centralised(cfg)
    ledger = read_ledger(tmp_path)
    ckpt = load_checkpoint(tmp_path)
    assert ledger is not None and len(ledger.charges) >= 1  # the round's charge stays
    assert ckpt is not None and ckpt.round < len(ledger.charges)  # the last good state
    assert all(bool(torch.isfinite(t).all()) for t in ckpt.model.values())
    assert not (tmp_path / "model.pt").exists()


def test_a_model_with_non_finite_initial_weights_is_refused():
    cfg = load_config({**BASE, "noise-multiplier": 1.0})
    model = torch.nn.Linear(5, 2)  # the fleet's 5 inputs... any shape: refused before it is used
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    with pytest.raises(RunDiverged, match="initial weights are not finite"):
        run_centralised(cfg, model=model)


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "simulations.cli", "run", "--centralised", "--out", str(out)]
    for k, v in {**BASE, "progress": "false", "noise-multiplier": 1e300}.items():
        argv += ["--set", f"{k}={v}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "round 1" in lines[0] and "noise-multiplier" in lines[0]
    assert "Traceback" not in done.stderr


def test_an_expected_private_batch_below_one_is_refused_before_any_work():
    from fedfdp.config import ConfigError

    cfg = load_config({**BASE, "noise-multiplier": 1.0, "sampling-rate": 1e-12})
    with pytest.raises(ConfigError, match=r"sampling-rate=1e-12: the expected private batch is .* records"):
        run_centralised(cfg)


@pytest.mark.parametrize(
    ("values", "verdict"),
    [
        ([1.0, -2.0], None),
        ([1e15, -1e15], None),  # the limit itself is healthy
        ([0.0, 1.0001e15], "diverged"),
        ([-3e20, 1.0], "diverged"),
        ([1.0, math.nan], "is not finite"),
        ([5e30, math.nan], "is not finite"),  # NaN beside a diverged value: NaN is named
        ([math.inf, 1.0], "is not finite"),
        ([-math.inf, math.nan], "is not finite"),
        ([], None),
    ],
)
def test_finite_or_raise_tells_nan_and_inf_from_divergence(values, verdict):
    """Each tensor is judged by its largest magnitude: NaN or ±inf is "not finite", a finite
    magnitude above DIVERGENCE_LIMIT = 1e15 "diverged", anything else passes (references by
    hand, in float64 and float32)."""
    from fedfdp.health import finite_or_raise

    for dtype in (torch.float64, torch.float32):
        tensors = [torch.zeros(3, dtype=dtype), torch.tensor(values, dtype=dtype)]
        if dtype is torch.float32 and any(abs(v) > 3.4e38 for v in values if math.isfinite(v)):
            continue
        if verdict is None:
            finite_or_raise(7, "the model", tensors, "learning-rate")
            continue
        with pytest.raises(RunDiverged, match=rf"^round 7: the model {verdict}.*likely learning-rate$"):
            finite_or_raise(7, "the model", tensors, "learning-rate")
