"""The bad inputs of issue 23, one by one: each is refused in **one line naming the
value**, with **exit status 2**, and **nothing is lost** (a refused run creates no run
directory; a run stopped by its numerical health keeps its ledger and last good
checkpoint).

The command-line cases go through the ``fedfdp`` entry point (:func:`simulations.cli.main`,
what the console script calls) in this process, so that the 42 cases stay cheap; the
cases that need a process of their own (Ctrl-C, ``kill -9``, the help text) start
``python -m simulations.cli``. The Python-API cases call :func:`fedfdp.run_centralised`.
Expected messages are written here by hand from the inputs, never taken from the code
under test.
"""

from __future__ import annotations

import copy
import hashlib
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
import torch
from torch import nn

from fedfdp import ConfigError, FeatureMap, load_config, run_centralised
from fedfdp.data import load_dataset
from fedfdp.ledger import read_ledger
from simulations.cli import main
from tests.mechanism_helpers import written_ledger

CLI = [sys.executable, "-m", "simulations.cli"]
#: A tiny fleet: 3 devices of ~40 records, a few rounds, no progress bar.
TINY = {"num-devices": 3, "records-per-device": 40, "num-rounds": 3, "progress": "false"}
USER_MODELS = '''
from torch import nn

def wrong_width(num_features, num_classes):
    return nn.Linear(num_features + 7, num_classes)
'''


def sets(mapping: dict[str, object]) -> list[str]:
    out: list[str] = []
    for key, value in mapping.items():
        out += ["--set", f"{key}={value}"]
    return out


def refused(capsys, argv: list[str], *needles: str) -> str:
    """Run ``fedfdp ARGV``; it must exit 2 with exactly one line on stderr, an
    ``error:`` naming every needle, and no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith("error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def tree_digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (empty if it does not exist)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------- refused before any work (fedfdp run)

RUN_REFUSALS = [
    # (id, extra keys, words the one line must contain)
    ("nonprivate-with-sigma", {"mode": '"nonprivate"', "noise-multiplier": 1},
     ["noise-multiplier=1.0", "mode='nonprivate'"]),
    ("public-with-clipping", {"mode": '"public"', "clipping-norm": 2.0},
     ["clipping-norm=2.0", "mode='public'"]),
    ("delta-1e-300", {"delta": 1e-300}, ["delta=1e-300", "unreachable"]),
    ("rounds-1e12", {"num-rounds": 10**12}, ["num-rounds=1000000000000", "at most 2147483647"]),
    ("records-per-device-1", {"records-per-device": 1}, ["records-per-device=1"]),
    ("blur-kernel-wider-than-image", {"dataset": '"digits"', "blur-kernel": 17}, ["blur-kernel=17"]),
    ("hidden-sizes-1e5", {"model": '"mlp"', "hidden-sizes": "[100000,100000]"},
     ["hidden-sizes=[100000, 100000]", "GB of memory"]),
    ("records-per-device-1e8", {"records-per-device": 100_000_000},
     ["records-per-device=100000000", "GB of memory"]),
    ("max-epsilon-below-one-round", {"noise-multiplier": 1.0, "max-epsilon": 0.001},
     ["max-epsilon=0.001", "one private round"]),
    ("data-path-a-directory", {"dataset": '"purchase100"', "data-path": '"/"'},
     ["data-path='/'", "is a directory"]),
    ("sampling-rate-1e-12", {"sampling-rate": 1e-12}, ["sampling-rate"]),
    # a model key set for a model it does not shape (fedfdp.models)
    ("hidden-size-on-logistic", {"hidden-size": 8},
     ["hidden-size=8", "model='logistic'", "applies with model in mlp, cnn"]),
    ("hidden-sizes-on-logistic", {"hidden-sizes": "[8]"},
     ["hidden-sizes='8'", "model='logistic'", "applies with model in mlp)"]),
    ("cnn-width-on-mlp", {"model": '"mlp"', "cnn-width": 4},
     ["cnn-width=4", "model='mlp'", "applies with model in cnn)"]),
    ("cnn-width-on-an-image-mlp", {"dataset": '"digits"', "model": '"mlp"', "cnn-width": 4},
     ["cnn-width=4", "model='mlp'"]),
]


@pytest.mark.parametrize(("extra", "needles"), [c[1:] for c in RUN_REFUSALS],
                         ids=[c[0] for c in RUN_REFUSALS])
def test_a_run_is_refused_before_any_work(tmp_path, capsys, extra, needles):
    out = tmp_path / "run"
    refused(capsys, ["run", "--centralised", "--out", str(out), *sets({**TINY, **extra})], *needles)
    assert not out.exists()  # nothing created, nothing lost


@pytest.mark.parametrize("aggregation", [{}, {"aggregation": '"secagg"', "secagg-min-survivors": 3}],
                         ids=["plain", "secagg"])
def test_an_unreachable_target_names_the_key_once(tmp_path, capsys, aggregation):
    """The calibration's refusal names ``target-epsilon`` once (not ``target-epsilon=2.0:
    target-epsilon=2: ...``), on the central and the secure-aggregation calibration."""
    out = tmp_path / "run"
    line = refused(capsys, ["run", "--centralised", "--out", str(out),
                            *sets({**TINY, "delta": 1e-300, "target-epsilon": 2.0, **aggregation})],
                   "target-epsilon=2", "unreachable", "delta=1e-300")
    assert line.count("target-epsilon") == 1, line
    assert not out.exists()


def test_a_toml_file_with_top_level_keys_and_a_flower_table_is_refused(tmp_path, capsys):
    path = tmp_path / "exp.toml"
    path.write_text('mode = "public"\n\n[tool.flwr.app.config]\nnum-rounds = 3\n')
    refused(capsys, ["run", "--centralised", "--config", str(path), "--out", str(tmp_path / "run")],
            "['mode']", "[tool.flwr.app.config]")
    assert not (tmp_path / "run").exists()


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "h3_user_models.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "h3_user_models"


@pytest.mark.parametrize("engine", [["--centralised"], []], ids=["centralised", "flower"])
def test_a_user_model_of_the_wrong_input_width_is_refused_on_both_engines(tmp_path, capsys, user_models,
                                                                           engine):
    out = tmp_path / "run"
    refused(capsys, ["run", *engine, "--out", str(out),
                     *sets({**TINY, "model": f'"{user_models}:wrong_width"'})],
            f"model='{user_models}:wrong_width'", "does not accept")
    assert not out.exists()


# --------------------------------------------------------------- numerical health (exit 2)

HEALTH = [
    ("sigma-1e300", {"noise-multiplier": 1e300}),
    ("clipping-norm-1e300", {"noise-multiplier": 1.0, "clipping-norm": 1e300}),
    ("alpha-1e300", {"noise-multiplier": 1.0, "alpha": 1e300}),
    ("learning-rate-1e30", {"noise-multiplier": 1.0, "learning-rate": 1e30}),
]


@pytest.mark.parametrize("extra", [c[1] for c in HEALTH], ids=[c[0] for c in HEALTH])
def test_a_blown_up_run_exits_2_in_one_line_keeping_the_ledger(tmp_path, capsys, extra):
    out = tmp_path / "run"
    line = refused(capsys, ["run", "--centralised", "--out", str(out),
                            *sets({**TINY, "clipping-quantile": 0, **extra})], "round ")
    assert "not finite" in line or "diverged" in line
    ledger = read_ledger(out)
    assert ledger is not None and len(ledger.charges) >= 1 and not (out / "model.pt").exists()


@pytest.mark.slow
def test_a_blown_up_flower_run_exits_2_in_one_line(tmp_path):
    """The same through Flower's simulation (the default engine): the ServerApp's
    refusal reaches the user as the one line, not as Flower's traceback."""
    out = tmp_path / "run"
    done = subprocess.run([*CLI, "run", "--out", str(out),
                           *sets({**TINY, "clipping-quantile": 0, "noise-multiplier": 1e300})],
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert lines[-1].startswith("error: round 1: the aggregated gradient is not finite")
    assert "Traceback" not in done.stderr
    assert len(written_ledger(out).charges) >= 1 and not (out / "model.pt").exists()


# ------------------------------------------------------------------- other commands

def test_compare_threads_below_one_is_refused(tmp_path, capsys):
    for threads in ("0", "-3"):
        refused(capsys, ["compare", "--out", str(tmp_path / "cmp"), "--threads", threads],
                f"--threads={threads}")
    assert not (tmp_path / "cmp").exists()


def test_compare_report_only_on_an_empty_directory_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(capsys, ["compare", "--out", str(empty), "--report-only"], f"--out='{empty}'", "results.csv")
    assert list(empty.iterdir()) == []


def test_audit_rounds_beyond_memory_is_refused_before_any_trial(capsys):
    refused(capsys, ["audit", "--rounds", "1000000000"], "--rounds=1000000000", "GB of memory")


def test_the_attribute_attack_on_a_csv_run_is_refused(tmp_path, capsys):
    run = tmp_path / "csvrun"
    run.mkdir()
    cfg = load_config({"dataset": "csv", "data-path": "t.csv", "label-column": "y", "public-columns": "a",
                       "private-columns": "b", "private-ranges": "b=-1:1"})
    (run / "config.toml").write_text(tomli_w.dumps(cfg.to_flat()))
    before = tree_digest(run)
    refused(capsys, ["audit", "--attack", "attribute", "--run", str(run)], f"--run='{run}'", "dataset='csv'")
    assert tree_digest(run) == before


def test_audit_help_shows_a_plain_percent():
    done = subprocess.run([*CLI, "audit", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "95% lower bound" in " ".join(done.stdout.split())
    assert "%%" not in done.stdout


# ---------------------------------------------------------------------- Python API

@pytest.fixture(scope="module")
def fleet():
    cfg = load_config({**TINY, "progress": False, "num-rounds": 2})
    return cfg, load_dataset(cfg.data)


@pytest.mark.parametrize("given", [{"num-rounds": 2}, "experiment.toml"], ids=["dict", "str"])
def test_something_else_than_a_config_is_refused_in_one_line(given):
    with pytest.raises(ConfigError, match=r"not a fedfdp\.Config; build one with load_config") as err:
        run_centralised(given)
    assert "\n" not in str(err.value) and repr(given)[:10] in str(err.value)


def _api_refusal(fleet, match, **kwargs):
    cfg, data = fleet
    with pytest.raises(ConfigError, match=match) as err:
        run_centralised(cfg, kwargs.pop("data", data), **kwargs)
    assert "\n" not in str(err.value)


def test_a_model_of_the_wrong_width_is_refused(fleet):
    width = fleet[1].num_features
    _api_refusal(fleet, rf"model: does not accept the data's records \(shape \({width},\) each\)",
                 model=nn.Linear(width + 3, fleet[1].num_classes))


def test_a_model_with_more_outputs_than_classes_is_refused(fleet):
    """The issue's ``Linear(3, 5)`` on two classes: a model whose outputs are not the classes."""
    _, data = fleet
    two = copy.deepcopy(data)
    two = type(two)(**{**two.__dict__, "class_names": ("a", "b")})
    for dev in two.devices:
        dev.y[:] = dev.y % 2
    two.test_y[:] = two.test_y % 2
    _api_refusal((fleet[0], two), r"returns \(2, 5\) for 2 records, but the data has 2 classes",
                 model=nn.Linear(data.num_features, 5))


def test_labels_out_of_range_are_refused(fleet):
    bad = copy.deepcopy(fleet[1])
    bad.devices[2].y[4] = 99
    _api_refusal(fleet, r"device 2 has label 99, outside the 5 classes", data=bad)


def test_a_nan_input_is_refused(fleet):
    bad = copy.deepcopy(fleet[1])
    bad.devices[1].x[3, 2] = math.nan
    _api_refusal(fleet, r"device 1 has a non-finite input \(NaN or inf\) at record 3", data=bad)


def test_a_view_of_the_wrong_shape_is_refused(fleet):
    _api_refusal(fleet, r"feature map view: returned \(\(1, 2\)",
                 feature_map=FeatureMap(view=lambda x, g: x[:, :2]))


def test_a_view_with_nan_is_refused(fleet):
    _api_refusal(fleet, r"feature map view: returned a non-finite value",
                 feature_map=FeatureMap(view=lambda x, g: x * math.nan))


def test_a_model_with_nan_weights_is_refused(fleet):
    model = nn.Linear(fleet[1].num_features, fleet[1].num_classes)
    with torch.no_grad():
        model.bias[1] = math.nan
    _api_refusal(fleet, r"initial weights are not finite", model=model)


# ------------------------------------------------------------------ small outputs

def test_a_one_seed_summary_shows_no_spread(tmp_path):
    from simulations.compare_report import write_summary

    rows = [{"dataset": "fleet", "mode": mode, "target_epsilon": eps, "seed": 0, "accuracy": acc,
             "balanced_accuracy": acc, "auc": float("nan"), "loss": 1.0, "epsilon": eps or 0.0, "delta": 1e-5,
             "noise_multiplier": 1.0, "engine": "centralised", "noise_source": "os-csprng",
             "relation": "add-remove", "rounds": 3, "pretrain_rounds": 0, "private_rounds": 3,
             "num_records": 100}
            for mode, eps, acc in (("public", None, 0.5), ("dp", 1.0, 0.6), ("fdp", 1.0, 0.7))]
    write_summary(pd.DataFrame(rows), tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    assert "70.0" in text and "± 0.0" not in text and "One seed" in text
    assert "No AUC" in text  # the empty column is explained


def test_a_run_says_once_that_noise_is_reproducible(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--centralised", "--out", str(out),
                 *sets({**TINY, "num-rounds": 1, "reproducible-noise": "true"})]) == 0
    std = capsys.readouterr()
    assert std.err.count("reproducible-noise=true") == 1  # stderr: once
    assert "auc:" not in std.out  # the fleet is not binary: no AUC expected (tests/test_quiet_output.py)
    assert "config.toml, metrics.csv, ledger.jsonl, checkpoint.pt, model.pt" in std.out


# ------------------------------------------------------- processes: Ctrl-C and kill -9

def _wait_for_charges(out: Path, count: int, proc: subprocess.Popen, limit: float = 240) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "ledger.jsonl").exists():
            ledger = read_ledger(out)
            if ledger is not None and len(ledger.charges) >= count:
                return
        time.sleep(0.05)


@pytest.mark.slow
def test_ctrl_c_in_compare_prints_one_line_and_exits_130(tmp_path):
    """Ctrl-C after the sweep's run has charged 3 rounds (of 100,000: it cannot end first,
    however busy the machine; the waits are bounded, not timed)."""
    out = tmp_path / "cmp"
    argv = [*CLI, "compare", "--out", str(out), "--no-progress", "--set", "modes=['dp']",
            "--set", "target-epsilons=[1.0]", "--set", "seeds=[0]",
            *sets({"num-devices": 3, "records-per-device": 40, "num-rounds": 100_000})]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        ledgers = list(out.glob("runs/*/ledger.jsonl"))
        ledger = read_ledger(ledgers[0].parent) if ledgers else None
        if ledger is not None and len(ledger.charges) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before 3 charges"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("interrupted")]) == 1
    assert len(written_ledger(next(out.glob("runs/*"))).charges) >= 3  # intact and readable


@pytest.mark.slow
def test_kill_9_without_checkpoints_then_resume_says_it_restarts(tmp_path):
    """``checkpoint-every = 0``, ``kill -9`` mid-run, ``--resume``: the resume says that it
    starts again from round 1, and the ledger keeps every charge (never silently)."""
    out = tmp_path / "run"
    argv = [*CLI, "run", "--centralised", "--out", str(out),
            *sets({**TINY, "num-rounds": 40, "checkpoint-every": 0, "noise-multiplier": 1.0,
                   "max-epsilon": 100})]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_charges(out, 3, proc)
    proc.kill()
    proc.wait(timeout=60)
    charges = len(written_ledger(out).charges)
    assert 3 <= charges < 40, charges
    done = subprocess.run([*CLI, "run", "--centralised", "--resume", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "resuming" in line]
    assert said and "after round 0" in said[0]  # the restart is announced
    assert "Traceback" not in done.stderr
    assert len(written_ledger(out).charges) >= charges  # the ledger never shrinks


# ------------------------------------------------ a user's own ClientApp (clients.fdp_train)


def test_fdp_train_refuses_a_model_of_the_wrong_width_once_per_architecture(tmp_path):
    """A user's own ClientApp (:func:`clients.fdp_train`, the examples/fdp-app path) with a
    model whose first layer is 7 features too wide: one line naming the records' width and
    the layer's; a model of the right width is checked in its first round only (a fresh
    model of the same architecture, as the example builds each round, is not run again in
    eval mode: the check's forward pass is the only one in eval mode)."""
    from clients import fdp_train
    from fedfdp.models import build_model_for
    from fedfdp.run_plan import feature_map_for
    from tests.flower_helpers import registered_strategy, train_messages

    cfg = load_config({**TINY, "noise-multiplier": 1.0, "out-dir": str(tmp_path / "unused")})
    data = load_dataset(cfg.data)
    features = data.devices[0].x.shape[1]
    strat = registered_strategy(cfg, data)
    msg = next(m for m in train_messages(strat, 1) if m.metadata.dst_node_id == 0)
    devices = {0: data.devices[0]}
    feature_map = feature_map_for(cfg, data)

    class Wide(nn.Module):  # an architecture of its own: the check's cache never saw it
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(features + 7, data.num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    for _ in range(2):  # refused every time (a failed check is not cached)
        with pytest.raises(ConfigError) as caught:
            fdp_train(msg, Wide(), feature_map, devices, public_seed=cfg.training.seed)
        line = str(caught.value)
        assert "\n" not in line
        assert f"({features} input features each; its first Linear layer takes in_features={features + 7})" \
            in line, line

    evals: list[int] = []

    def seen(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if not module.training:
            evals.append(len(args[0]))

    def right() -> nn.Module:
        model = build_model_for(cfg.training, data)
        model.register_forward_hook(seen)
        return model

    fdp_train(msg, right(), feature_map, devices, public_seed=cfg.training.seed)
    first = list(evals)
    fdp_train(msg, right(), feature_map, devices, public_seed=cfg.training.seed)
    assert first == [2] and evals == [2], evals  # the check ran once, on 2 records
