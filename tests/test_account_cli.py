"""Tests for ``fedfdp account`` (simulations/account.py).

The command is called in-process through :func:`simulations.cli.main` (stdout
captured); one test runs the installed ``fedfdp`` console script.

References are independent of the code under test:

- ``q = 1``: the Gaussian mechanism in closed form (``mu = sqrt(T)/sigma``),
  solved with scipy; ``ref <= epsilon <= ref + 2e-9 (1 + ref)``, and Theorem 4's
  bound ``1 - G_mu(Ball)`` within 1e-9.
- ``q < 1``: Google dp-accounting's PLD accountant (``ADD_OR_REMOVE_ONE``,
  ``value_discretization_interval = 1e-4``, an upper bound within ~1e-4 of the
  truth); the printed ε (upper bound) must satisfy
  ``ref - 1e-3 <= epsilon <= ref + eps_error + 5e-3`` with ``eps_error = 0.05``,
  the tolerance stated in docs/accounting.md.
- ``--device-sampling-rate P``: the binomial mixture of dp-accounting's k-fold PLDs
  (``tests/references.py``), ``ref - 1e-6 <= epsilon <= ref + eps_error + 5e-3``.
- Pathological inputs run the CLI in a subprocess with a 3 GiB address-space cap:
  a finite valid answer (above an independent reference at a milder setting) or
  exit status 2 with one line naming the flag and value, in seconds.
- ``--run DIR`` reads directories written by real runs (``fedfdp run`` in a
  subprocess, or :func:`fedfdp.run_centralised`; an interruption is a Ctrl-C
  raised inside a round): its ε equals the run's last ``metrics.csv`` ε exactly,
  and is within the tolerances above of dp-accounting's (the adaptive-clipping
  σ_eff derived here from the run's σ and σ_b) and of the participation
  mixture. Bad input corrupts copies of real files.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import tomli_w
from scipy import special

from fedfdp.accounting import epsilon_for
from simulations.cli import main
from tests.references import dp_ref_eps, gaussian_eps_ref, participation_eps_ref

warnings.filterwarnings("ignore", category=DeprecationWarning)

EPS_ERROR = 0.05
KEYS = {
    "epsilon",
    "epsilon_estimate",
    "epsilon_lower",
    "epsilon_replacement",
    "delta",
    "noise_multiplier",
    "sampling_rate",
    "device_sampling_rate",
    "rounds",
    "relation",
}


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``fedfdp account ARGV`` in-process: (exit code, stdout, stderr)."""
    try:
        rc = main(["account", *argv])
    except SystemExit as exc:  # argparse errors
        rc = int(exc.code) if exc.code is not None else 0
    out, err = capsys.readouterr()
    return rc, out, err


def cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    rc, out, err = cli([*argv, "--json"], capsys)
    assert rc == 0, err
    return json.loads(out)


def direct(sigma: float, q: float, rounds: int, delta: float) -> list[str]:
    return ["--noise-multiplier", str(sigma), "--sampling-rate", str(q), "--rounds", str(rounds),
            "--delta", str(delta)]


# ------------------------------------------------------------------ references
def assert_within_reference(eps: float, ref: float) -> None:
    assert ref - 1e-3 <= eps <= ref + EPS_ERROR + 5e-3, (eps, ref)


# ------------------------------------------------------------------ noise-multiplier mode
def test_json_keys_and_interval(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli_json(direct(1.0, 0.01, 1000, 1e-5), capsys)
    assert set(r) >= KEYS
    assert r["relation"] == "add-remove"
    assert (r["noise_multiplier"], r["sampling_rate"], r["rounds"], r["delta"]) == (1.0, 0.01, 1000, 1e-5)
    assert r["epsilon_lower"] <= r["epsilon_estimate"] <= r["epsilon"]
    assert r["epsilon"] - r["epsilon_estimate"] <= EPS_ERROR
    assert r["epsilon_replacement"] >= r["epsilon"]
    assert "ball" not in r and "attribute_inference_bound" not in r


@pytest.mark.parametrize(("sigma", "rounds", "delta"), [(1.0, 1, 1e-5), (2.0, 100, 1e-6), (10.0, 1000, 1e-5)])
def test_gaussian_closed_form(capsys: pytest.CaptureFixture[str], sigma: float, rounds: int,
                              delta: float) -> None:
    r = cli_json(direct(sigma, 1.0, rounds, delta), capsys)
    ref = gaussian_eps_ref(math.sqrt(rounds) / sigma, delta)
    assert ref <= r["epsilon"] <= ref + 2e-9 * (1 + ref)


@pytest.mark.parametrize(
    ("sigma", "q", "rounds", "delta"),
    [(1.0, 0.01, 1000, 1e-5), (0.8, 1 / 16, 100, 1e-5), (1.1, 0.02, 2000, 1e-8)],
)
def test_against_dp_accounting(capsys: pytest.CaptureFixture[str], sigma: float, q: float, rounds: int,
                               delta: float) -> None:
    r = cli_json(direct(sigma, q, rounds, delta), capsys)
    ref = dp_ref_eps([(sigma, q, rounds)], delta)
    assert_within_reference(r["epsilon"], ref)
    assert r["epsilon_lower"] <= ref + 1e-3


def test_num_records_sets_default_delta(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--noise-multiplier", "1.3", "--sampling-rate", "0.05", "--rounds", "150"]
    r = cli_json([*argv, "--num-records", "3311"], capsys)
    assert r["delta"] == 1 / 6622
    assert r["epsilon"] == cli_json([*argv, "--delta", repr(1 / 6622)], capsys)["epsilon"]


# ------------------------------------------------------------------ target mode
@pytest.mark.parametrize(("target", "q", "rounds", "delta"),
                         [(2.0, 0.05, 150, 1.5e-4), (0.5, 0.01, 500, 1e-5), (8.0, 1.0, 10, 1e-6)])
def test_target_never_overshoots(capsys: pytest.CaptureFixture[str], target: float, q: float,
                                 rounds: int, delta: float) -> None:
    argv = ["--target-epsilon", str(target), "--sampling-rate", str(q), "--rounds", str(rounds),
            "--delta", str(delta)]
    r = cli_json(argv, capsys)
    assert set(r) >= KEYS and r["target_epsilon"] == target
    sigma = r["noise_multiplier"]
    assert r["epsilon"] <= target
    assert r["epsilon"] >= 0.98 * target  # calibrated, not merely safe
    assert r["epsilon"] == epsilon_for(sigma, q, rounds, delta).upper
    assert epsilon_for(sigma / 1.01, q, rounds, delta).upper > target  # smallest σ, to rtol
    if q == 1.0:
        ref = gaussian_eps_ref(math.sqrt(rounds) / sigma, delta)
    else:
        ref = dp_ref_eps([(sigma, q, rounds)], delta)
    assert ref <= target + 1e-3  # the independent ε of the printed σ is within the target too


# ------------------------------------------------------------------ --ball (Theorem 4)
def test_ball_bounds_and_monotone(capsys: pytest.CaptureFixture[str]) -> None:
    for ball in (0.05, 0.3):
        prev_eps, prev_bound = -1.0, -1.0
        for sigma in (3.0, 1.2, 0.7):  # ε increasing
            r = cli_json([*direct(sigma, 0.05, 100, 1e-5), "--ball", str(ball)], capsys)
            bound = r["attribute_inference_bound"]
            assert r["ball"] == ball
            assert ball <= bound <= 1.0
            assert r["epsilon"] > prev_eps
            assert bound >= prev_bound - 1e-9
            prev_eps, prev_bound = r["epsilon"], bound
        assert prev_bound > ball  # some leakage is allowed at ε ≈ several
    for ball in (0.0, 1.0):  # edges: [ball, 1]
        r = cli_json([*direct(1.0, 0.05, 100, 1e-5), "--ball", str(ball)], capsys)
        assert ball <= r["attribute_inference_bound"] <= 1.0


def test_ball_gaussian_closed_form(capsys: pytest.CaptureFixture[str]) -> None:
    sigma, rounds, ball = 4.0, 16, 0.1
    r = cli_json([*direct(sigma, 1.0, rounds, 1e-5), "--ball", str(ball)], capsys)
    mu = math.sqrt(rounds) / sigma
    ref = 1.0 - special.ndtr(special.ndtri(1.0 - ball) - mu)
    assert abs(r["attribute_inference_bound"] - ref) <= 1e-9


# ------------------------------------------------------------------ --run: ledgers of real runs
ROOT = Path(__file__).resolve().parents[1]
#: Big enough that the default ``fdp`` recipe picks adaptive clipping (γ > 0).
ADAPTIVE = ["num-devices=4", "records-per-device=1000", "num-rounds=3", "progress=false"]
TINY = {"num-devices": 2, "records-per-device": 40, "num-rounds": 3, "progress": False}


def fedfdp(*argv: str) -> subprocess.CompletedProcess:
    """``fedfdp ARGV`` in a subprocess (this checkout's code), which must succeed."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "simulations.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def fedfdp_run(out: Path, settings: list[str]) -> Path:
    """``fedfdp run --centralised --out OUT --set KEY=VALUE ...``."""
    sets = itertools.chain.from_iterable(("--set", item) for item in settings)
    fedfdp("run", "--centralised", "--out", str(out), *sets)
    return out


def resolved(run: Path) -> dict:
    return tomllib.loads((run / "config.toml").read_text())["resolved"]


def metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def interrupt_at(round_: int):
    """An ``evaluate_fn`` that presses Ctrl-C inside ``round_`` (after its charge and step,
    before its checkpoint)."""

    def evaluate(r: int, model) -> dict[str, float]:
        if r == round_:
            raise KeyboardInterrupt
        return {}

    return evaluate


@pytest.fixture(scope="module")
def fdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fedfdp run``, mode fdp, the default recipe: adaptive clipping, so the accounted σ
    (gradient and count noise together) is not the gradient's σ."""
    run = fedfdp_run(tmp_path_factory.mktemp("account") / "fdp", ADAPTIVE)
    r = resolved(run)
    assert r["clipping-quantile"] > 0 and r["accounted-noise-multiplier"] < r["noise-multiplier"]
    return run


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fedfdp run``, mode dp, a fixed C, Poisson device sampling at p = 0.5 (10 rounds:
    the reference's bound on the rounds no device draw touches, ``P(K = 0)·δ_1``, stays
    negligible)."""
    run = fedfdp_run(tmp_path_factory.mktemp("account") / "dp",
                     ["mode=dp", "clipping-quantile=0", "device-sampling-rate=0.5", "num-devices=4",
                      "records-per-device=100", "num-rounds=10", "progress=false"])
    r = resolved(run)
    assert "clipping-count-std" not in r and r["accounted-participation"] == 0.5  # fixed C: no count
    return run


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run interrupted inside round 2 (after its charge, before its checkpoint), then
    ``fedfdp run --resume``: round 2 runs again and is charged again, round 3 would
    exceed max-epsilon. Also returns a copy of the ledger as the interruption left it."""
    from fedfdp import load_config, run_centralised

    base = tmp_path_factory.mktemp("account")
    run = base / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_centralised(load_config({**TINY, "out-dir": str(run)}), evaluate_fn=interrupt_at(2))
    before = base / "ledger-at-interruption.json"
    shutil.copyfile(run / "ledger.jsonl", before)
    fedfdp("run", "--centralised", "--resume", str(run))
    return run, before


@pytest.fixture(scope="module")
def public_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedfdp import load_config, run_centralised

    run = tmp_path_factory.mktemp("account") / "public"
    run_centralised(load_config({**TINY, "mode": "public", "out-dir": str(run)}))
    return run


@pytest.fixture(scope="module")
def nonprivate_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedfdp import load_config, run_centralised

    run = tmp_path_factory.mktemp("account") / "nonprivate"
    run_centralised(load_config({**TINY, "mode": "nonprivate", "out-dir": str(run)}))
    return run


@pytest.fixture(scope="module")
def corrdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedfdp import load_config, run_centralised

    run = tmp_path_factory.mktemp("account") / "corrdp"
    run_centralised(load_config({**TINY, "mode": "corrdp", "dataset": "correlated", "insensitive-tv": "*=0.5",
                                 "out-dir": str(run)}))
    return run


@pytest.mark.parametrize("which", ["fdp_run", "dp_run"])
def test_run_prints_the_runs_epsilon(which: str, request: pytest.FixtureRequest,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The ε of ``account --run`` is the run's last metrics.csv ε: exactly in JSON, and to
    the printed digits in the table."""
    run = request.getfixturevalue(which)
    rows = metrics(run)
    last = rows[-1]
    r = cli_json(["--run", str(run)], capsys)
    assert set(r) >= KEYS
    assert r["epsilon"] == float(last["epsilon"])
    assert r["delta"] == float(last["delta"]) == resolved(run)["delta"]
    assert r["relation"] == last["relation"] == "add-remove"
    private = [row for row in rows if row["phase"] in ("fdp", "dp")]
    planned = resolved(run)["private-rounds"]
    assert r["rounds"] == r["charges"] == r["charged_rounds"] == len(private) == planned
    assert r["planned_private_rounds"] == planned and r["mode"] == which.removesuffix("_run")
    rc, out, err = cli(["--run", str(run)], capsys)
    assert rc == 0 and err == ""
    line = next(ln for ln in out.splitlines() if ln.startswith("ε add/remove"))
    assert line.split()[2] == f"{float(last['epsilon']):.4f}"
    assert "upper bound" in line and f"{planned} of {planned} planned" in out


def test_run_epsilon_against_independent_references(fdp_run: Path, dp_run: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """fdp with adaptive clipping: the gradient (σ) and the clipped count (σ_b) are Gaussians
    on the same Poisson sample, one Gaussian of 1/σ_eff² = 1/σ² + 1/σ_b²; dp with Poisson
    devices: the participation mixture at p = 0.5 (not rate p·q)."""
    res = resolved(fdp_run)
    r = cli_json(["--run", str(fdp_run)], capsys)
    sigma_eff = (res["noise-multiplier"] ** -2 + res["clipping-count-std"] ** -2) ** -0.5
    assert r["noise_multiplier"] == pytest.approx(sigma_eff, rel=1e-9)
    assert (r["sampling_rate"], r["device_sampling_rate"]) == (0.05, 1.0)
    assert_within_reference(r["epsilon"], dp_ref_eps([(sigma_eff, 0.05, 3)], res["delta"]))

    res = resolved(dp_run)
    r = cli_json(["--run", str(dp_run)], capsys)
    assert r["noise_multiplier"] == res["noise-multiplier"]  # fixed C: no count released
    assert (r["sampling_rate"], r["device_sampling_rate"]) == (0.05, 0.5)
    ref = participation_eps_ref(r["noise_multiplier"], 0.05, 0.5, 10, res["delta"], vdi=1e-3)
    assert ref - 1e-6 <= r["epsilon"] <= ref + EPS_ERROR + 5e-3
    assert r["epsilon"] > epsilon_for(r["noise_multiplier"], 0.025, 10, res["delta"]).upper  # not rate p·q
    rc, out, _ = cli(["--run", str(dp_run)], capsys)
    assert rc == 0 and any(ln.startswith("device sampling p") and "0.5" in ln for ln in out.splitlines())


def test_run_options(fdp_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--delta overrides the run's δ; --ball and the replacement ε are those of the same
    accountant (Theorem 4 within [Ball, 1]; Prop. 1 above add/remove)."""
    res = resolved(fdp_run)
    r = cli_json(["--run", str(fdp_run), "--ball", "0.2"], capsys)
    assert r["epsilon_lower"] <= r["epsilon_estimate"] <= r["epsilon"] < r["epsilon_replacement"]
    assert 0.2 < r["attribute_inference_bound"] <= 1.0
    r2 = cli_json(["--run", str(fdp_run), "--delta", "1e-6"], capsys)
    assert r2["delta"] == 1e-6 and r2["epsilon"] > r["epsilon"]
    assert_within_reference(r2["epsilon"], dp_ref_eps([(res["accounted-noise-multiplier"], 0.05, 3)], 1e-6))
    rc, _, err = cli(["--run", str(fdp_run), "--delta", "1e-6", "--num-records", "10"], capsys)
    assert rc == 2 and "give one" in err


def test_resumed_run_counts_the_round_charged_twice(resumed_run: tuple[Path, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = resumed_run
    rows = metrics(run)
    assert [int(row["round"]) for row in rows] == [1, 2]  # round 3 stopped at max-epsilon
    r = cli_json(["--run", str(run)], capsys)
    assert r["epsilon"] == float(rows[-1]["epsilon"])
    assert (r["charges"], r["charged_rounds"], r["rounds"]) == (3, 2, 3)
    assert_within_reference(r["epsilon"], dp_ref_eps([(resolved(run)["accounted-noise-multiplier"], 0.05, 3)],
                                                      resolved(run)["delta"]))
    rc, out, _ = cli(["--run", str(run)], capsys)
    assert rc == 0 and "3 of 3 planned; 1 re-run after a crash, charged again" in out


# ------------------------------------------------------------------ --tradeoff
def read_curve(path: Path) -> tuple[list[float], list[float]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["alpha", "beta"]
    return [float(a) for a, _ in rows[1:]], [float(b) for _, b in rows[1:]]


def assert_tradeoff_function(alphas: list[float], betas: list[float]) -> None:
    """Non-increasing, convex (chord test, 1e-9), 0 <= f(α) <= 1 − α, α spans [0, 1]."""
    assert alphas[0] == 0.0 and alphas[-1] == 1.0 and len(alphas) >= 100
    assert all(a1 > a0 for a0, a1 in itertools.pairwise(alphas))
    assert betas[0] <= 1.0
    for a, b in zip(alphas, betas, strict=True):
        assert 0.0 <= b <= 1.0 - a + 1e-12
    assert all(b1 <= b0 + 1e-12 for b0, b1 in itertools.pairwise(betas))
    for i in range(1, len(alphas) - 1):
        a0, a, a1 = alphas[i - 1], alphas[i], alphas[i + 1]
        chord = betas[i - 1] + (betas[i + 1] - betas[i - 1]) * (a - a0) / (a1 - a0)
        assert betas[i] <= chord + 1e-9, (i, a)


def test_tradeoff_files_direct(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "sub" / "f"
    r = cli_json([*direct(1.0, 0.05, 200, 1e-5), "--tradeoff", str(prefix)], capsys)
    assert r["tradeoff_csv"] == f"{prefix}.csv" and r["tradeoff_png"] == f"{prefix}.png"
    alphas, betas = read_curve(Path(r["tradeoff_csv"]))
    assert_tradeoff_function(alphas, betas)
    assert betas[0] > 0.5 and betas[-1] == 0.0  # informative, ends at f(1) = 0
    png = Path(r["tradeoff_png"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_tradeoff_files_for_run(fdp_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(["--run", str(fdp_run), "--tradeoff", str(tmp_path / "tradeoff")], capsys)
    assert rc == 0, err
    assert "tradeoff.csv" in out
    assert_tradeoff_function(*read_curve(tmp_path / "tradeoff.csv"))
    assert (tmp_path / "tradeoff.png").stat().st_size > 5000


def test_tradeoff_gaussian_matches_closed_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli_json([*direct(2.0, 1.0, 4, 1e-5), "--tradeoff", str(tmp_path / "g")], capsys)
    alphas, betas = read_curve(tmp_path / "g.csv")
    assert_tradeoff_function(alphas, betas)
    for a, b in zip(alphas, betas, strict=True):
        if 0.0 < a < 1.0:
            assert abs(b - special.ndtr(special.ndtri(1.0 - a) - 1.0)) <= 1e-9


# ------------------------------------------------------------------ human output
def test_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(["--target-epsilon", "2", "--sampling-rate", "0.05", "--rounds", "150",
                        "--delta", "1.5e-4", "--ball", "0.1"], capsys)
    assert rc == 0 and err == ""
    lines = out.strip().splitlines()
    assert 5 <= len(lines) <= 10
    eps_lines = [ln for ln in lines if ln.startswith("ε")]
    assert len(eps_lines) == 2
    for ln in eps_lines:
        assert "upper bound" in ln and "δ = 0.00015" in ln
    assert "add/remove" in eps_lines[0] and "replacement" in eps_lines[1]
    assert "calibrated for target ε = 2" in out
    assert any(ln.startswith("attribute inference") and "upper bound" in ln for ln in lines)


# ------------------------------------------------------------------ bad input
GOOD = ["--sampling-rate", "0.1", "--rounds", "10", "--delta", "1e-5"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--noise-multiplier", "1", "--sampling-rate", "1.5", "--rounds", "10", "--delta", "1e-5"],
         "--sampling-rate=1.5: must be in (0, 1]"),
        (["--noise-multiplier", "1", "--sampling-rate", "0", "--rounds", "10", "--delta", "1e-5"],
         "--sampling-rate=0.0"),
        (["--noise-multiplier", "0", *GOOD], "--noise-multiplier=0.0: must be > 0"),
        (["--noise-multiplier", "-1", *GOOD], "--noise-multiplier=-1.0: must be > 0"),
        (["--noise-multiplier", "nan", *GOOD], "--noise-multiplier=nan"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--rounds", "0", "--delta", "1e-5"],
         "--rounds=0: must be an integer >= 1"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--rounds", "10", "--delta", "1"],
         "--delta=1.0: must be in (0, 1)"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--rounds", "10", "--delta", "0"],
         "--delta=0.0: must be in (0, 1)"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--rounds", "10"], "--delta is required"),
        (["--noise-multiplier", "1", "--target-epsilon", "2", *GOOD],
         "--noise-multiplier=1.0 and --target-epsilon=2.0: give one"),
        (GOOD, "give --noise-multiplier S or --target-epsilon E"),
        (["--noise-multiplier", "1", "--rounds", "10", "--delta", "1e-5"], "--sampling-rate is required"),
        (["--target-epsilon", "0.01", *GOOD], "--target-epsilon=0.01: unreachable"),
        (["--target-epsilon", "-1", *GOOD], "--target-epsilon=-1.0: must be > 0"),
        (["--noise-multiplier", "1", *GOOD, "--ball", "1.2"], "--ball=1.2: must be in [0, 1]"),
        (["--noise-multiplier", "1", *GOOD, "--eps-error", "0"], "--eps-error=0.0: must be in (0, 1]"),
        (["--noise-multiplier", "1", *GOOD, "--num-records", "10"], "--delta=1e-05 and --num-records=10"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--rounds", "x", "--delta", "1e-5"],
         "argument --rounds: invalid int value: 'x'"),
        (["--run", "/nonexistent/fedfdp-run"], "--run='/nonexistent/fedfdp-run': no such directory"),
    ],
)
def test_bad_input_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    rc, out, err = cli(argv, capsys)
    assert rc == 2
    assert needle in err, err
    assert "Traceback" not in err and out == ""


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _not_json(run: Path) -> None:
    (run / "ledger.jsonl").write_text("{not json")


def _truncated(run: Path) -> None:
    data = (run / "ledger.jsonl").read_bytes()
    (run / "ledger.jsonl").write_bytes(data[: len(data) // 2])


def _sigma(run: Path) -> tuple[str, str]:
    sigma = resolved(run)["accounted-noise-multiplier"]
    return repr(sigma), repr(2 * sigma)


def _one_charge_edited(run: Path) -> None:
    """The last σ written in the ledger doubled (the others, and what they compose to, kept)."""
    old, new = _sigma(run)
    text = (run / "ledger.jsonl").read_text()
    assert text.count(old) >= 2
    head, _, tail = text.rpartition(old)
    (run / "ledger.jsonl").write_text(head + new + tail)


def _every_sigma_edited(run: Path) -> None:
    """Every σ in the ledger doubled, its mechanism's included."""
    old, new = _sigma(run)
    text = (run / "ledger.jsonl").read_text()
    (run / "ledger.jsonl").write_text(text.replace(old, new))


def _resolved_delta_edited(run: Path) -> None:
    """A larger δ written into config.toml (a smaller ε would be printed)."""
    doc = tomllib.loads((run / "config.toml").read_text())
    doc["resolved"]["delta"] = doc["resolved"]["delta"] * 10
    (run / "config.toml").write_text(tomli_w.dumps(doc))


def _bad_toml(run: Path) -> None:
    (run / "config.toml").write_text("mode = [unterminated\n")


def _bad_delta(run: Path) -> None:
    doc = tomllib.loads((run / "config.toml").read_text())
    doc["resolved"]["delta"] = 2.0
    (run / "config.toml").write_text(tomli_w.dumps(doc))


def _no_config(run: Path) -> None:
    (run / "config.toml").unlink()


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (_not_json, "not a valid privacy ledger"),
        (_truncated, "not a valid privacy ledger"),
        (_one_charge_edited, "the ledger was edited"),
        (_every_sigma_edited, "the ledger was edited"),
        (_resolved_delta_edited, "the ledger or the configuration was edited"),
        (_bad_toml, "is not valid TOML"),
        (_bad_delta, "[resolved] delta=2.0: must be in (0, 1)"),
        (_no_config, "no config.toml there"),
    ],
)
def test_corrupted_run_dir_exit_2(fdp_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], make,
                                  needle: str) -> None:
    """A real run's files, corrupted: one line naming the directory and why, exit status 2."""
    run = _copy(fdp_run, tmp_path / "run")
    make(run)
    rc, out, err = cli(["--run", str(run)], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"--run={str(run)!r}" in err and needle in err, err


def test_rolled_back_ledger_exit_2(resumed_run: tuple[Path, Path], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The ledger the interruption left (2 charges) put back after the resumed run charged a
    third: it composes to less than the ε the run already reported."""
    run = _copy(resumed_run[0], tmp_path / "run")
    shutil.copyfile(resumed_run[1], run / "ledger.jsonl")
    rc, out, err = cli(["--run", str(run)], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "rolled back" in err and f"--run={str(run)!r}" in err, err


def test_runs_that_charge_nothing(public_run: Path, nonprivate_run: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """public: a ledger of no charge, ε = 0; nonprivate: private data without noise, ε = ∞
    (null), as the runs report; a ledger deleted from a run is refused (its checkpoint
    records it), and a directory with neither says nothing was charged."""
    r = cli_json(["--run", str(public_run)], capsys)
    assert (r["epsilon"], r["charges"], r["rounds"]) == (0.0, 0, 0)
    assert float(metrics(public_run)[-1]["epsilon"]) == 0.0
    r = cli_json(["--run", str(nonprivate_run)], capsys)
    assert r["epsilon"] is None and r["epsilon_replacement"] is None and r["charges"] == 0
    assert math.isinf(float(metrics(nonprivate_run)[-1]["epsilon"]))
    rc, out, _ = cli(["--run", str(nonprivate_run)], capsys)
    assert rc == 0 and next(ln for ln in out.splitlines() if ln.startswith("ε add/remove")).split()[2] == "∞"
    rc, out, err = cli(["--run", str(nonprivate_run), "--ball", "0.1"], capsys)
    assert rc == 2 and "ε = ∞" in err
    run = _copy(public_run, tmp_path / "run")
    (run / "ledger.jsonl").unlink()
    rc, out, err = cli(["--run", str(run)], capsys)
    assert rc == 2 and out == "" and "missing" in err and "the ledger was deleted" in err, err
    (run / "checkpoint.pt").unlink()
    rc, out, err = cli(["--run", str(run)], capsys)
    assert rc == 2 and out == "" and "no privacy ledger there (mode='public'" in err, err


def test_corrdp_run_prints_its_corrdp_epsilon(corrdp_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CorrDP ledger's events carry the design's classes: replayed, they give the run's
    last epsilon_corrdp, printed as a CorrDP ε (never in the DP/FDP column); Theorem 4
    and the trade-off curve, statements about an add/remove ε, are refused."""
    last = metrics(corrdp_run)[-1]
    assert last["epsilon"] in ("", "nan") and resolved(corrdp_run)["relation"] == "corrdp"
    r = cli_json(["--run", str(corrdp_run)], capsys)
    assert r["epsilon"] is None and r["relation"] == "corrdp"
    assert r["epsilon_corrdp"] == float(last["epsilon_corrdp"])
    assert r["charges"] == r["rounds"] == 3 and r["delta"] == float(last["delta"])
    rc, out, _ = cli(["--run", str(corrdp_run)], capsys)
    line = next(ln for ln in out.splitlines() if ln.startswith("ε CorrDP"))
    assert line.split()[2] == f"{float(last['epsilon_corrdp']):.4f}" and "not a DP or FDP ε" in line
    assert "add/remove" not in out
    for flag in (["--ball", "0.1"], ["--tradeoff", "x"]):
        rc, out, err = cli(["--run", str(corrdp_run), *flag], capsys)
        assert rc == 2 and out == "" and "not for a CorrDP run" in err


# ------------------------------------------------------------------ secure aggregation
@pytest.fixture(scope="module")
def secagg_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with ``aggregation = "secagg"`` (4 SuperNodes, ``n_min = 3``, 3 rounds) driven by
    the real strategy and the real ClientApp in process (``tests/test_secagg_flower.py``'s
    grid: every reply is the ClientApp's), writing a run directory as ``fedfdp run`` does."""
    from tests.test_secagg_flower import run_strategy, secagg_config

    run = tmp_path_factory.mktemp("account") / "secagg"
    strat, _, _ = run_strategy(secagg_config(**{"out-dir": str(run)}))
    assert strat.stop_reason is None
    return run


def sigma_eff_ref(res: dict) -> float:
    """σ_eff of a distributed round from the run's [resolved] numbers (docs/secagg_accounting.md:
    ``√(n_h σ_loc² − t²) / (s + √d)``, ``t = 2``)."""
    event = res["event"]
    var = event["honest_parties"] * event["local_sigma"] ** 2 - event["smoothing"] ** 2
    return math.sqrt(var) / (event["scale"] + math.sqrt(event["dimension"]))


def check_secagg_account(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``account --run`` of a secagg run: the run's own last ε exactly, replayed by the
    distributed accountant (the smaller of routes A and B); route A against dp-accounting's
    PLD of the smoothed Gaussian rounds at σ_eff (the slack Λ < 1e-20 here)."""
    res = resolved(run)
    rows = metrics(run)
    assert res["aggregation"] == "secagg"
    r = cli_json(["--run", str(run)], capsys)
    assert set(r) >= KEYS and r["aggregation"] == "secagg"
    assert r["epsilon"] == float(rows[-1]["epsilon"])
    assert r["epsilon"] == min(r["epsilon_route_a"], r["epsilon_route_b"])
    assert r["rounds"] == r["charges"] == r["charged_rounds"] == len(rows) == res["private-rounds"]
    assert r["honest_parties"] == res["secagg-honest-parties"] == 3
    assert r["local_sigma"] == res["secagg-local-sigma"] and r["device_sampling_rate"] == 1.0
    sigma = sigma_eff_ref(res)
    assert r["noise_multiplier"] == pytest.approx(sigma, rel=1e-12) and r["slack"] < 1e-20
    assert_within_reference(r["epsilon_route_a"], dp_ref_eps([(sigma, 0.05, len(rows))], res["delta"]))
    assert r["ledger"] == [{**res["event"], "count": len(rows)}]
    rc, out, err = cli(["--run", str(run)], capsys)
    assert rc == 0 and err == ""
    line = next(ln for ln in out.splitlines() if ln.startswith("ε add/remove"))
    assert line.split()[2] == f"{float(rows[-1]['epsilon']):.4f}" and "routes A and B" in line
    assert any(ln.startswith("aggregation") and "secagg" in ln for ln in out.splitlines())


def test_secagg_run_replays_its_distributed_events(secagg_run: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    check_secagg_account(secagg_run, capsys)


def test_secagg_run_refusals(secagg_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Theorem 4 and the trade-off curve are refused (route A bounds ε, not the curve); a
    ledger whose charges were edited (fewer honest parties in every event's hash-chained
    entry) is refused by the library."""
    for flag in (["--ball", "0.1"], ["--tradeoff", str(tmp_path / "f")]):
        rc, out, err = cli(["--run", str(secagg_run), *flag], capsys)
        assert rc == 2 and out == "" and "aggregation='secagg'" in err and len(err.splitlines()) == 1
    edited = _copy(secagg_run, tmp_path / "edited")
    ledger = edited / "ledger.jsonl"
    ledger.write_text(ledger.read_text().replace('"honest_parties":3', '"honest_parties":2'))
    rc, out, err = cli(["--run", str(edited)], capsys)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_secagg_fedfdp_run_on_the_simulation_engine(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The same through ``fedfdp run`` on Flower's simulation engine (4 SuperNodes, each a
    SecAgg+ party)."""
    run = tmp_path / "run"
    sets = ["num-devices=4", "records-per-device=60", "num-rounds=3", "progress=false", "aggregation=secagg",
            "secagg-min-survivors=3", "public-batch-size=32"]
    fedfdp("run", "--out", str(run), "--supernodes", "4",
           *itertools.chain.from_iterable(("--set", x) for x in sets))
    check_secagg_account(run, capsys)


def test_run_excludes_direct_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(["--run", str(tmp_path), "--rounds", "5"], capsys)
    assert rc == 2 and "--rounds=5: not with --run" in err
    rc, _, err = cli(["--run", str(tmp_path), "--device-sampling-rate", "0.5"], capsys)
    assert rc == 2 and "--device-sampling-rate=0.5: not with --run" in err


# ------------------------------------------------------------------ console script
def test_console_script() -> None:
    exe = shutil.which("fedfdp", path=str(Path(sys.executable).parent)) or shutil.which("fedfdp")
    if exe is None:
        pytest.skip("fedfdp console script not installed (pip install -e .)")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([exe, "account", *direct(1.0, 0.01, 1000, 1e-5), "--json"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert set(r) >= KEYS
    assert_within_reference(r["epsilon"], dp_ref_eps([(1.0, 0.01, 1000)], 1e-5))



# ------------------------------------------------------------------ --device-sampling-rate
def test_device_sampling_rate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = direct(1.34, 0.05, 150, 1.5e-4)
    r = cli_json([*argv, "--device-sampling-rate", "0.2"], capsys)
    assert r["device_sampling_rate"] == 0.2 and r["sampling_rate"] == 0.05
    ref = participation_eps_ref(1.34, 0.05, 0.2, 150, 1.5e-4, vdi=1e-3)
    assert ref - 1e-6 <= r["epsilon"] <= ref + EPS_ERROR + 5e-3
    assert r["epsilon"] == epsilon_for(1.34, 0.05, 150, 1.5e-4, participation=0.2).upper
    plain = cli_json(argv, capsys)
    assert plain["device_sampling_rate"] == 1.0
    assert r["epsilon"] < plain["epsilon"]
    assert r["epsilon"] > epsilon_for(1.34, 0.01, 150, 1.5e-4).upper  # not rate p·q
    rc, out, _ = cli([*argv, "--device-sampling-rate", "0.2"], capsys)
    assert rc == 0 and any(ln.startswith("device sampling p") and "0.2" in ln for ln in out.splitlines())
    rc, out, _ = cli(argv, capsys)
    assert "device sampling" not in out


def test_device_sampling_rate_target(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--target-epsilon", "2", "--sampling-rate", "0.05", "--rounds", "150", "--delta", "1.5e-4",
            "--device-sampling-rate", "0.2"]
    r = cli_json(argv, capsys)
    sigma = r["noise_multiplier"]
    assert 1.9 <= r["epsilon"] <= 2.0
    assert participation_eps_ref(sigma, 0.05, 0.2, 150, 1.5e-4, vdi=1e-3) <= 2.0 + 1e-6
    assert epsilon_for(sigma / 1.01, 0.05, 150, 1.5e-4, participation=0.2).upper > 2.0


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.1", "nan"])
def test_device_sampling_rate_bad(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    rc, out, err = cli([*direct(1.0, 0.05, 10, 1e-5), "--device-sampling-rate", bad], capsys)
    assert rc == 2 and out == "" and f"--device-sampling-rate={float(bad)!r}" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------ pathological input
_CAPPED = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from simulations.cli import main
sys.exit(main(["account", *sys.argv[1:]]))
"""

PATHOLOGICAL = [
    # (argv, lower reference (sigma, q, rounds, delta) or None, expected exit status, needle)
    (direct(1e-3, 0.05, 150, 1e-5), (0.3, 0.05, 150, 1e-5), 0, None),  # >4 GB before
    (["--target-epsilon", "1e12", "--sampling-rate", "0.05", "--rounds", "150", "--delta", "1e-5"],
     None, 0, None),  # ~23 GB before
    (direct(0.8, 0.05, 150, 1e-300), (0.8, 0.05, 150, 1e-12), 0, None),  # math domain error before
    ([*direct(0.8, 0.05, 150, 5e-324), "--ball", "0.1"], (0.8, 0.05, 150, 1e-12), 0, None),
    (direct(1.0, 0.05, 10**15, 1e-5), (1.0, 0.05, 10_000, 1e-5), 0, None),
    ([*direct(1e-3, 0.05, 150, 1e-5), "--device-sampling-rate", "1e-3"], None, 0, None),
    (["--target-epsilon", "1e-300", "--sampling-rate", "0.05", "--rounds", "150", "--delta", "1e-5"],
     None, 2, "--target-epsilon=1e-300: unreachable"),
    (["--target-epsilon", "5", "--sampling-rate", "0.05", "--rounds", str(10**15), "--delta", "1e-5"],
     None, 2, "--target-epsilon=5.0: unreachable"),
    ([*direct(1.0, 0.05, 150, 1e-5), "--device-sampling-rate", "1e-400"], None, 2,
     "--device-sampling-rate=0.0: must be in (0, 1]"),
]


@pytest.mark.parametrize(("argv", "reference", "status", "needle"), PATHOLOGICAL)
def test_pathological_input_bounded(argv: list[str], reference, status: int, needle: str | None) -> None:
    """Each case runs under a 3 GiB address-space cap and answers in seconds: a valid
    bound (above the reference at a milder setting; epsilon is monotone) or a
    one-line refusal naming the flag."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _CAPPED, *argv, "--json"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=root, check=False)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if status == 2:
        assert needle is not None  # every refusal case names its flag
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
        return
    r = json.loads(proc.stdout)
    assert r["epsilon"] is not None and r["epsilon_replacement"] is not None
    assert 0.0 <= r["epsilon"] <= r["epsilon_replacement"]
    if reference is not None:
        sigma, q, rounds, delta = reference
        assert r["epsilon"] >= dp_ref_eps([(sigma, q, rounds)], delta, vdi=1e-3) - 1e-6
    if "target_epsilon" in r:
        assert r["epsilon"] <= r["target_epsilon"]
    if "attribute_inference_bound" in r:
        assert r["ball"] <= r["attribute_inference_bound"] <= 1.0


# ------------------------------------------------------------------ the library's ledger replay
def _ledger(mechanism: dict, charges: list[tuple[int | None, object]]):
    from fedfdp.ledger import Ledger

    ledger = Ledger.start(mechanism, "d" * 64)
    for round_, event in charges:
        if round_ is None:
            ledger.append_unrecorded(event, 1, "crashed")  # type: ignore[arg-type]
        else:
            ledger.append_charge(round_, ledger.attempts(round_), event)  # type: ignore[arg-type]
    return ledger


def test_a_ledger_replays_into_the_accountant_its_mechanism_names() -> None:
    """add-remove: every charge (a re-run round and a pessimistic one included) composed by
    the FDP accountant, its ε the Gaussian closed form of all of them; consecutive equal
    events merged; secure aggregation and CorrDP pick their accountants."""
    from fedfdp.accounting import FDPAccountant, SubsampledGaussian
    from fedfdp.accounting.distributed import DistributedAccountant
    from fedfdp.accounting.events import DistributedDiscreteGaussian
    from fedfdp.corrdp.accounting import CorrDPAccountant
    from fedfdp.ledger_replay import replay_ledger

    a, b = SubsampledGaussian(2.0, 1.0), SubsampledGaussian(3.0, 1.0)
    got = replay_ledger(_ledger({"relation": "add-remove"}, [(1, a), (2, a), (2, a), (None, a), (3, b)]))
    assert isinstance(got.accountant, FDPAccountant)
    assert got.events == ((a, 4), (b, 1))
    assert (got.charges, got.charged_rounds) == (5, 3)
    mu = math.sqrt(4 / 2.0**2 + 1 / 3.0**2)  # Gaussian mechanisms compose to μ = √(Σ 1/σ²)
    ref = gaussian_eps_ref(mu, 1e-5)
    assert ref <= got.accountant.epsilon(1e-5) <= ref + 2e-9 * (1 + ref)
    ddg = DistributedDiscreteGaussian(local_sigma=50.0, honest_parties=4, scale=64.0, dimension=10,
                                      sampling_rate=0.1)
    secagg = replay_ledger(_ledger({"relation": "add-remove", "secagg": {}}, [(1, ddg)]), eps_error=0.1)
    assert isinstance(secagg.accountant, DistributedAccountant) and secagg.accountant.eps_error == 0.1
    corrdp = replay_ledger(_ledger({"relation": "corrdp"}, []), delta_estimation=1e-7)
    assert isinstance(corrdp.accountant, CorrDPAccountant) and corrdp.accountant.delta_estimation == 1e-7


def test_a_ledger_without_an_accountant_or_with_foreign_events_is_refused_in_one_line() -> None:
    from fedfdp.accounting.events import DistributedDiscreteGaussian
    from fedfdp.ledger_replay import replay_ledger

    with pytest.raises(ValueError, match=r"^relation='replacement' in its mechanism: no accountant for it$"):
        replay_ledger(_ledger({"relation": "replacement"}, []))
    ddg = DistributedDiscreteGaussian(local_sigma=50.0, honest_parties=4, scale=64.0, dimension=10,
                                      sampling_rate=0.1)
    with pytest.raises(ValueError, match=r"^its events do not replay \(event=Dis") as err:
        replay_ledger(_ledger({"relation": "add-remove"}, [(1, ddg)]))
    assert "\n" not in str(err.value)
