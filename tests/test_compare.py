"""``fedfdp compare``: calibration lands every private mode on its target ε (never
above, checked with an independent accountant), a tiny sweep end to end, restart,
and bad input before any run."""

import math
from pathlib import Path

import pandas as pd
import pytest

from fedfdp.config import ConfigError, load_config
from simulations import compare
from simulations.compare import run_sweep
from simulations.compare_plan import Sweep, parse_sweep, plan_runs
from simulations.compare_report import write_report
from simulations.compare_results import read_interrupted
from tests.mechanism_helpers import resolve, written_ledger
from tests.references import dp_ref_eps

TINY = {"num-devices": 2, "records-per-device": 40, "num-rounds": 3, "public-batch-size": 16}


@pytest.mark.parametrize("target", [0.5, 2.0])
@pytest.mark.parametrize(("mode", "pretrain"), [("dp", 0), ("fdp", 0), ("fdp", 10), ("fdp-dpsgd", 10)])
def test_calibration_lands_each_private_mode_on_target(mode, pretrain, target):
    cfg = load_config({"mode": mode, "target-epsilon": target, "num-rounds": 40,
                       "public-pretrain-rounds": pretrain, "sampling-rate": 0.05})
    plan = resolve(cfg, 4000)
    assert plan.private_rounds == 40 - pretrain  # pre-training costs nothing
    assert plan.accounted_noise_multiplier is not None
    eps = dp_ref_eps([(plan.accounted_noise_multiplier, 0.05, plan.private_rounds)], plan.delta, vdi=1e-3)
    # never above the target (PLD estimates within ~1e-3 of the true curve) ...
    assert eps <= target + 5e-3
    # ... and not needlessly below it: the reported ε is the upper end of an
    # interval of width eps_error = 0.05 (fedfdp.accounting's default), so the
    # true ε sits at most ~0.05 below the target (plus 1% for the σ bisection)
    assert eps >= 0.99 * target - 0.05


def test_fewer_private_rounds_need_less_noise():
    base = {"mode": "fdp-dpsgd", "target-epsilon": 1.0, "num-rounds": 40}
    few = resolve(load_config({**base, "public-pretrain-rounds": 30}), 4000)
    many = resolve(load_config({**base, "public-pretrain-rounds": 1}), 4000)
    assert few.noise_multiplier is not None and many.noise_multiplier is not None
    assert few.noise_multiplier < many.noise_multiplier


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"mode": "fdp"}, "a comparison sweeps modes"),
        ({"modes": ["fdp", "dpsgd"]}, "'dpsgd' is not a mode"),
        ({"modes": []}, "modes=[]: must be a non-empty list"),
        ({"target-epsilons": [1.0, -2.0]}, "-2.0 is not a positive number"),
        ({"seeds": [0, 0]}, "repeated value"),
        ({"seed": 3}, "seed=3: set per run by the sweep"),
        ({"modes": ["dp"], "mode": {"fdp": {"alpha": 2.0}}}, "[mode.fdp]: mode 'fdp' is not in modes"),
        ({"modes": ["dp"], "mode": {"dp": {"target-epsilon": 2.0}}}, "set by the sweep itself"),
    ],
)
def test_bad_sweeps(doc, fragment):
    with pytest.raises(ConfigError) as err:
        parse_sweep(doc)
    assert fragment in str(err.value)


def test_bad_run_keys_fail_before_any_run(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "run_one", _never)
    with pytest.raises(ConfigError, match="fdp-dpsgd"):
        no_pretraining = {"fdp-dpsgd": {"public-pretrain-rounds": 0}}
        run_sweep(parse_sweep({"modes": ["dp", "fdp-dpsgd"], **TINY, "mode": no_pretraining}), tmp_path,
                  progress=False)
    with pytest.raises(ConfigError, match="dataset='csv' needs"):
        run_sweep(parse_sweep({"modes": ["dp"], **TINY, "dataset": "csv"}), tmp_path, progress=False)
    with pytest.raises(ConfigError, match="no such file"):
        run_sweep(
            parse_sweep({"modes": ["dp"], **TINY, "dataset": "purchase100", "data-path": "/no/file"}),
            tmp_path,
            progress=False,
        )
    assert not (tmp_path / "results.csv").exists()


def _never(*args, **kwargs):
    raise AssertionError("no run may start")


def _sweep(**extra) -> Sweep:
    doc = {"modes": ["public", "fdp"], "target-epsilons": [1.0], "seeds": [0, 1], **TINY, **extra}
    return parse_sweep(doc)


def test_tiny_sweep_end_to_end_and_restart(tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    run_sweep(_sweep(), out, progress=False)
    frame = pd.read_csv(out / "results.csv")
    assert len(frame) == 4  # public x 2 seeds, fdp x 1 ε x 2 seeds
    for col in ("dataset", "mode", "target_epsilon", "epsilon", "seed", "accuracy", "loss", "rounds",
                "noise_multiplier", "relation", "delta"):
        assert col in frame.columns
    fdp = frame[frame["mode"] == "fdp"]
    assert (fdp["epsilon"] <= 1.0).all() and (fdp["epsilon"] > 0.9).all()
    assert (fdp["noise_multiplier"] > 0).all() and (fdp["rounds"] == 3).all()
    pub = frame[frame["mode"] == "public"]
    assert (pub["epsilon"] == 0).all() and pub["target_epsilon"].isna().all()
    assert frame["accuracy"].between(0, 1).all()
    assert (out / "privacy_utility.png").stat().st_size > 1000
    summary = (out / "summary.md").read_text()
    assert "| `fdp` |" in summary and "| `public` |" in summary
    assert (out / "runs" / "fdp_eps1_seed0" / "metrics.csv").is_file()

    # restart: nothing left to do, nothing run, results unchanged
    before = (out / "results.csv").read_bytes()
    monkeypatch.setattr(compare, "run_one", _never)
    run_sweep(_sweep(), out, progress=False)
    assert (out / "results.csv").read_bytes() == before

    # a lost row is run again, and only that one
    calls = []

    def recording_run_one(run, engine, sigma):
        calls.append(run.key)
        return _row(run)

    monkeypatch.setattr(compare, "run_one", recording_run_one)
    frame.drop(index=frame.index[-1]).to_csv(out / "results.csv", index=False)
    run_sweep(_sweep(), out, progress=False)
    assert calls == [("fdp", 1.0, 1)]
    assert len(pd.read_csv(out / "results.csv")) == 4

    # extending the sweep runs only the new seed
    calls.clear()
    run_sweep(_sweep(seeds=[0, 1, 2]), out, progress=False)
    assert sorted(calls) == [("fdp", 1.0, 2), ("public", None, 2)]

    # the same runs under another configuration are refused
    with pytest.raises(ConfigError, match="from another configuration"):
        run_sweep(_sweep(**{"num-rounds": 4}), out, progress=False)


def _row(run):
    return {"dataset": "fleet", "mode": run.mode, "target_epsilon": run.target_epsilon, "epsilon": 0.5,
            "delta": 1e-3, "relation": "add-remove", "seed": run.seed, "accuracy": 0.5, "loss": 1.0,
            "rounds": 3, "pretrain_rounds": 0, "private_rounds": 3, "noise_multiplier": 1.0,
            "engine": "centralised", "seconds": 0.0, "config_hash": run.config_hash}


@pytest.mark.parametrize("content", ["not,a,results\n1,2,3\n", "\x00\x01garbage", ""])
def test_malformed_results_are_refused_never_overwritten(tmp_path, monkeypatch, content):
    (tmp_path / "results.csv").write_text(content)
    monkeypatch.setattr(compare, "run_one", _never)
    with pytest.raises(ConfigError, match="results.csv"):
        run_sweep(_sweep(), tmp_path, progress=False)
    assert (tmp_path / "results.csv").read_text() == content


def test_per_mode_overrides_and_pretraining_reported(tmp_path):
    sweep = parse_sweep(
        {"modes": ["fdp-dpsgd", "dp"], "target-epsilons": [2.0], "seeds": [0], **TINY, "num-rounds": 4,
         "mode": {"fdp-dpsgd": {"public-pretrain-rounds": 2}, "dp": {"learning-rate": 0.05}}}
    )
    run_sweep(sweep, tmp_path, progress=False)
    frame = pd.read_csv(tmp_path / "results.csv").set_index("mode")
    assert frame.loc["fdp-dpsgd", "pretrain_rounds"] == 2 and frame.loc["fdp-dpsgd", "private_rounds"] == 2
    assert frame.loc["dp", "pretrain_rounds"] == 0 and frame.loc["dp", "private_rounds"] == 4
    # both end at the target over their own private rounds: fewer rounds, less noise
    assert frame.loc["fdp-dpsgd", "noise_multiplier"] < frame.loc["dp", "noise_multiplier"]
    assert frame["epsilon"].max() <= 2.0
    metrics = pd.read_csv(tmp_path / "runs" / "fdp-dpsgd_eps2_seed0" / "metrics.csv")
    assert list(metrics["phase"]) == ["public", "public", "dp", "dp"]
    assert list(metrics["epsilon"][:2]) == [0.0, 0.0]  # pre-training rounds are ε = 0 rounds
    assert "`fdp-dpsgd` 2 of 4" in (tmp_path / "summary.md").read_text()
    dp_run = (tmp_path / "runs" / "dp_eps2_seed0" / "config.toml").read_text()
    assert "learning-rate = 0.05" in dp_run  # the per-mode key reached that mode only
    other = (tmp_path / "runs" / "fdp-dpsgd_eps2_seed0" / "config.toml").read_text()
    assert "learning-rate = 0.05" not in other


def test_cli_compare(tmp_path, capsys):
    from simulations.cli import main

    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'modes = ["nonprivate", "dp"]\ntarget-epsilons = [4.0]\nseeds = [0]\n'
        + "".join(f"{k} = {v}\n" for k, v in TINY.items())
    )
    assert main(["compare", "--config", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "| `nonprivate` |" in text and "| `dp` |" in text
    frame = pd.read_csv(tmp_path / "o" / "results.csv")
    assert math.isinf(frame.loc[frame["mode"] == "nonprivate", "epsilon"].iloc[0])
    bad = tmp_path / "bad.toml"
    bad.write_text('modes = ["dp"]\nnum-rounds = 0\n')
    assert main(["compare", "--config", str(bad), "--out", str(tmp_path / "b")]) == 2
    assert "num-rounds=0" in capsys.readouterr().err


@pytest.mark.slow
def test_flower_engine_runs_the_same_sweep(tmp_path):
    """The Flower path: same σ and ε as the reference, pre-training rounds at ε = 0."""
    out = tmp_path / "fl"
    sweep = parse_sweep({"modes": ["fdp-dpsgd"], "target-epsilons": [2.0], "seeds": [0], **TINY,
                         "mode": {"fdp-dpsgd": {"public-pretrain-rounds": 1}}})
    run_sweep(sweep, out, engine="flower", progress=False)
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert row["engine"] == "flower" and row["rounds"] == 3
    assert row["pretrain_rounds"] == 1 and row["private_rounds"] == 2
    assert 1.9 < row["epsilon"] <= 2.0
    metrics = pd.read_csv(out / "runs" / "fdp-dpsgd_eps2_seed0" / "metrics.csv")
    assert list(metrics["phase"]) == ["public", "dp", "dp"]
    assert metrics["epsilon"].iloc[0] == 0.0  # the pre-training round costs nothing
    # same σ and ε as the centralised reference
    run_sweep(sweep, tmp_path / "c", progress=False)
    ref = pd.read_csv(tmp_path / "c" / "results.csv").iloc[0]
    assert row["noise_multiplier"] == pytest.approx(ref["noise_multiplier"])
    assert row["epsilon"] == pytest.approx(ref["epsilon"], abs=1e-6)


def test_summary_reports_fdp_minus_the_best_baseline(tmp_path):
    """Hand-made results: per ε the row is fdp − max(dp, fdp-dpsgd, public)
    in accuracy points and fdp − min(...) in log loss, computed here."""
    from simulations.compare_report import write_summary

    acc = {("dp", 1.0): 0.80, ("fdp-dpsgd", 1.0): 0.83, ("fdp", 1.0): 0.825,
           ("dp", 2.0): 0.86, ("fdp-dpsgd", 2.0): 0.84, ("fdp", 2.0): 0.87, ("public", None): 0.81}
    rows = []
    for (mode, eps), a in acc.items():
        for seed in (0, 1):
            rows.append({"dataset": "t", "mode": mode, "target_epsilon": eps, "seed": seed, "accuracy": a,
                         "loss": 1 - a, "epsilon": eps or 0.0, "delta": 1e-5, "noise_multiplier": 1.0,
                         "engine": "centralised", "pretrain_rounds": 0, "rounds": 3})
    write_summary(pd.DataFrame(rows), tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    best_acc = "| `fdp` − best of `dp`, `fdp-dpsgd`, `public` (points) | -0.5 | +1.0 |"
    best_loss = "| `fdp` − best of `dp`, `fdp-dpsgd`, `public` (log loss) | +0.005 | -0.010 |"
    assert best_acc in text and best_loss in text
    # the compact target table: ε = 1 misses (−0.5 points; loss +0.005), ε = 2 meets it
    assert ("| 1 | 82.5 | 83.0 (`fdp-dpsgd`) | -0.50 | 0.1750 | 0.1700 (`fdp-dpsgd`) | +0.0050 | **no** |"
            in text)
    assert "| 2 | 87.0 | 86.0 (`dp`) | +1.00 | 0.1300 | 0.1400 (`dp`) | -0.0100 | yes |" in text
    assert "Per-mode settings" not in text
    write_summary(pd.DataFrame(rows), tmp_path / "tuned.md",
                  per_mode={"dp": {"learning-rate": 1.0}, "corrdp": {"corrdp-tv-floor": 0.25}})
    tuned = (tmp_path / "tuned.md").read_text()
    assert "Per-mode settings (every other key as the sweep's): `dp`: learning-rate = 1.0." in tuned
    assert "outside the privacy guarantee" in tuned and "corrdp-tv-floor" not in tuned  # no corrdp rows


# ---------------------------------------------------------------------- interrupted runs
def _interrupted(sweep: Sweep, out: Path, round_: int, *, snapshot_at: int | None = None):
    """The run directory the sweep's one run leaves when ``fedfdp.run_centralised`` (what
    compare runs) is interrupted by Ctrl-C inside ``round_`` (after the round's charge and
    step, before its checkpoint); the bytes of its ledger then; and (``snapshot_at``) the
    bytes of its ledger as they were on disk at that earlier round's evaluation."""
    from fedfdp.algorithm import run_centralised
    from fedfdp.data import load_dataset
    from fedfdp.run_plan import resolve_released

    (run,) = plan_runs(sweep, out)
    data = load_dataset(run.cfg.data)
    cfg = resolve_released(run.cfg, data)
    run_dir = Path(cfg.run.out_dir)
    run_dir.mkdir(parents=True)
    snapshot: list[bytes] = []

    def evaluate(r, model):
        if r == snapshot_at:
            snapshot.append((run_dir / "ledger.jsonl").read_bytes())
        if r == round_:
            raise KeyboardInterrupt
        return {}

    with pytest.raises(KeyboardInterrupt):
        run_centralised(cfg, data, evaluate_fn=evaluate)
    return run_dir, (run_dir / "ledger.jsonl").read_bytes(), (snapshot[0] if snapshot else None)


def _one(mode: str = "fdp", **extra) -> Sweep:
    return parse_sweep({"modes": [mode], "target-epsilons": [1.0], "seeds": [0], **TINY, "num-rounds": 4,
                        **extra})


def _charges(run_dir: Path) -> list:
    return written_ledger(run_dir).charges


def _resolved(run_dir: Path) -> dict:
    import tomllib

    return tomllib.loads((run_dir / "config.toml").read_text())["resolved"]


@pytest.mark.parametrize(("interrupt", "after", "again"), [(3, 2, [1, 2, 3, 3]), (1, 0, [1, 1, 2, 3])])
def test_interrupted_run_is_resumed_and_its_ledger_grows(tmp_path, capsys, interrupt, after, again):
    """Ctrl-C inside a round (charged, not checkpointed): compare resumes the run from its
    checkpoint; the new ledger starts with every old charge and charges that round again;
    the last round would exceed ε = 1 and is not run."""
    out = tmp_path / "cmp"
    run_dir, old, _ = _interrupted(_one(), out, interrupt)
    kept = tmp_path / "old"
    kept.mkdir()
    (kept / "ledger.jsonl").write_bytes(old)
    before = _charges(kept)
    assert [c.round for c in before] == list(range(1, interrupt + 1))

    run_sweep(_one(), out, progress=False)
    assert f"resuming the interrupted run after round {after}" in capsys.readouterr().out
    charges = _charges(run_dir)
    assert charges[: len(before)] == before  # every old charge still there, in order
    assert [c.round for c in charges] == again
    assert not list((out / "runs").glob("*.interrupted-*"))
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert row["resumed_after_round"] == after and row["rounds"] == 3
    assert list(pd.read_csv(run_dir / "metrics.csv")["round"]) == [1, 2, 3]
    # the row's ε is that of all four charges (within the target), checked independently
    sigma = _resolved(run_dir)["accounted-noise-multiplier"]
    ref = dp_ref_eps([(sigma, 0.05, 4)], row["delta"], vdi=1e-3)
    assert ref - 1e-3 <= row["epsilon"] <= min(ref + 0.055, 1.0)
    assert f"resumed after round {after}" in (out / "summary.md").read_text()


@pytest.mark.parametrize("mode", ["fdp", "corrdp"])
def test_interrupted_run_of_another_configuration_is_kept_aside(tmp_path, capsys, mode):
    """The sweep edited after a Ctrl-C inside round 3 (num-rounds 4 → 5): the library refuses
    the resume; the directory is renamed, its ledger byte-identical, its spent ε reported
    (add/remove: within dp-accounting's; CorrDP: its own relation, above what the run
    reported after round 2); the run starts afresh."""
    extra = {"dataset": "correlated", "insensitive-tv": "*=0.5"} if mode == "corrdp" else {}
    out = tmp_path / "cmp"
    run_dir, old, _ = _interrupted(_one(mode, **extra), out, 3)
    resolved = _resolved(run_dir)
    reported = pd.read_csv(run_dir / "metrics.csv").iloc[-1]

    run_sweep(_one(mode, **{**extra, "num-rounds": 5}), out, progress=False)
    kept = out / "runs" / f"{run_dir.name}.interrupted-1"
    assert (kept / "ledger.jsonl").read_bytes() == old
    said = capsys.readouterr().out
    assert f"kept aside as runs/{kept.name}" in said and "another resolved mechanism" in said
    (row,) = read_interrupted(out)
    assert row["run"] == run_dir.name and row["kept_at"] == f"runs/{kept.name}"
    assert "another resolved mechanism" in row["reason"]
    assert row["charges"] == 3 and row["delta"] == resolved["delta"]
    assert row["relation"] == resolved["relation"]
    if mode == "fdp":
        ref = dp_ref_eps([(resolved["accounted-noise-multiplier"], 0.05, 3)], resolved["delta"], vdi=1e-3)
        assert ref - 1e-3 <= row["epsilon"] <= ref + 0.055
    else:
        assert reported["round"] == 2 and reported["epsilon_corrdp"] < row["epsilon"] <= 1.0
    summary = (out / "summary.md").read_text()
    assert f"`runs/{kept.name}`" in summary and "in addition" in summary
    spent = f"≤ {row['epsilon']:.3g} (upper bound, {row['relation']}, δ = {row['delta']:.3g}; 3 charges)"
    assert spent in summary
    # the rerun started afresh, with a ledger of its own
    fresh = pd.read_csv(out / "results.csv").iloc[0]
    assert math.isnan(fresh["resumed_after_round"])
    assert [c.round for c in _charges(run_dir)] == list(range(1, int(fresh["rounds"]) + 1))

    # a report redrawn later still names it; a second compare does not record it twice
    write_report(out)
    assert f"`runs/{kept.name}`" in (out / "summary.md").read_text()
    run_sweep(_one(mode, **{**extra, "num-rounds": 5}), out, progress=False)
    assert len(read_interrupted(out)) == 1


def test_rolled_back_ledger_is_kept_aside_and_not_accounted(tmp_path):
    """The ledger as it was at round 1 put back after a Ctrl-C inside round 3: the resume
    is refused (the checkpoint's head is missing), the directory kept with that ledger,
    and its budget reported as unknown with the ε the run had already reported (a lower
    bound) — never as the smaller ε of the rolled-back file."""
    out = tmp_path / "cmp"
    run_dir, _, early = _interrupted(_one(), out, 3, snapshot_at=1)
    (run_dir / "ledger.jsonl").write_bytes(early)
    reported = pd.read_csv(run_dir / "metrics.csv").iloc[-1]

    run_sweep(_one(), out, progress=False)
    kept = out / "runs" / f"{run_dir.name}.interrupted-1"
    assert (kept / "ledger.jsonl").read_bytes() == early
    (row,) = read_interrupted(out)
    assert "rolled back" in row["reason"] and math.isnan(row["epsilon"])
    assert "rolled back" in row["note"] and f"epsilon {reported['epsilon']:.4g} after round 2" in row["note"]
    summary = (out / "summary.md").read_text()
    assert f"`runs/{kept.name}`" in summary and "unknown (not accounted" in summary


def test_the_plot_defaults_to_fd_only_when_every_run_is_generative():
    import pandas as pd

    from simulations.compare_report import default_metric

    diffusion = pd.DataFrame({"accuracy": [float("nan")] * 2, "fd": [3.0, 4.0]})
    classifier = pd.DataFrame({"accuracy": [0.9, 0.8], "fd": [float("nan")] * 2})
    mixed = pd.concat([diffusion, classifier], ignore_index=True)
    assert default_metric(diffusion) == "fd"
    assert default_metric(classifier) == "accuracy"
    assert default_metric(mixed) == "accuracy"
    assert default_metric(classifier.drop(columns="fd")) == "accuracy"
