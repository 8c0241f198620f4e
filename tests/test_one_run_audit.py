"""One-run auditing (Steinke, Nasr, Jagielski 2023): the bound against exact binomial
sums and closed forms, its validity on a mechanism that meets its claim exactly
(randomized response), its power; the f-DP analysis (Mahloujifar, Melis, Chaudhuri
2024): its recursion against a general optimiser, its validity and power on exactly
Gaussian scores and on randomized response; the canaries, the simulator of an absent
canary, the recovered per-round releases, the power line; and `fedfdp audit --one-run`
end to end: the real run passes, the run with unclipped gradients fails."""

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from fedfdp import load_config
from fedfdp.audit import GUESS_PATTERNS, one_run_bound, one_run_epsilon, one_run_p_value
from fedfdp.config import ConfigError, Mode
from fedfdp.contribution import ClientParts, PrivateBatch, RoundSettings, clipped_private_sum
from fedfdp.data import load_dataset
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.run_plan import feature_map_for
from simulations.auditing.one_run import OneRunSetup, WithoutAbsent, run_one_run_audit, with_canaries
from simulations.cli import main

# --------------------------------------------------------------------------------------
# the bound: exact references
# --------------------------------------------------------------------------------------


def _tail(r: int, p: Fraction, v: int) -> Fraction:
    """P[Bin(r, p) >= v], exactly."""
    return sum((math.comb(r, k) * p**k * (1 - p) ** (r - k) for k in range(max(v, 0), r + 1)), Fraction(0))


def _reference_p_value(eps: float, delta: float, m: int, r: int, v: int) -> float:
    """The theorem's right-hand side from exact binomial sums (p rounded to a fraction)."""
    p = Fraction(1.0 / (1.0 + math.exp(-eps)))
    beta = _tail(r, p, v)
    if delta == 0 or v == 0:
        return float(beta)
    worst = max((_tail(r, p, v - i) - beta) / i for i in range(1, v + 1))
    return min(1.0, float(beta + 2 * m * Fraction(delta) * worst))


@pytest.mark.parametrize(("eps", "delta", "m", "r", "v"), [
    (0.0, 0.0, 10, 10, 7), (1.0, 0.0, 50, 20, 18), (2.0, 1e-4, 100, 40, 39), (0.5, 1e-3, 300, 60, 45),
    (3.0, 1e-5, 1000, 100, 100), (1.5, 0.0, 5, 5, 0),
])
def test_p_value_matches_exact_binomial_sums(eps, delta, m, r, v):
    assert one_run_p_value(eps, delta, m, r, v) == pytest.approx(_reference_p_value(eps, delta, m, r, v),
                                                                 rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("r", [5, 30, 200])
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_all_correct_without_delta_is_the_logit_of_alpha_root(r, alpha):
    # W = r correct: P[Bin(r, p) >= r] = p^r <= alpha  <=>  p >= alpha^(1/r)
    root = alpha ** (1 / r)
    expect = max(0.0, math.log(root / (1 - root)))  # 5 right guesses cannot refute eps = 0 at alpha = 0.01
    assert one_run_epsilon(10_000, r, r, 0.0, alpha) == pytest.approx(expect, abs=1e-9)


def test_bound_properties():
    # chance-level guessing certifies nothing; more correct guesses, or less delta, certify more
    assert one_run_epsilon(1000, 200, 100, 1e-5) == 0.0
    assert one_run_epsilon(1000, 200, 170, 1e-5) < one_run_epsilon(1000, 200, 185, 1e-5)
    assert one_run_epsilon(1000, 200, 180, 4e-4) < one_run_epsilon(1000, 200, 180, 1e-6)
    assert one_run_epsilon(1000, 200, 180, 1e-5, alpha=0.01) < one_run_epsilon(1000, 200, 180, 1e-5)
    # the p-value grows with epsilon when 2 m delta <= 1 (what makes the bisection's bound valid)
    grid = np.linspace(0, 6, 121)
    for v in (150, 185, 200):
        ps = [one_run_p_value(e, 4e-4, 1000, 200, v) for e in grid]
        assert all(a <= b + 1e-15 for a, b in itertools.pairwise(ps))
    # the bound is the edge of the rejected claims
    for delta in (0.0, 1e-5):
        e = one_run_epsilon(1000, 200, 185, delta)
        assert one_run_p_value(e, delta, 1000, 200, 185) <= 0.05 + 1e-9
        assert one_run_p_value(e + 0.01, delta, 1000, 200, 185) > 0.05
    with pytest.raises(ValueError, match="delta term"):
        one_run_epsilon(1000, 200, 185, 1e-3)  # 2 m delta = 2
    with pytest.raises(ValueError, match="correct"):
        one_run_p_value(1.0, 0.0, 10, 5, 6)


def test_bound_is_valid_on_randomized_response():
    """An eps-DP mechanism that meets its claim exactly: each canary's bit is reported
    truthfully with probability e^eps/(1+e^eps). Over 2,000 audits the bound must
    exceed eps in at most alpha of them (+ 3 binomial s.e.), and it must reach a
    fair share of eps (power)."""
    rng = np.random.default_rng(7)
    eps, m, n, alpha = 1.5, 400, 2000, 0.05
    truthful = 1 / (1 + math.exp(-eps))
    found = []
    for _ in range(n):
        included = rng.random(m) < 0.5
        reported = np.where(rng.random(m) < truthful, included, ~included)
        scores = reported + 0.01 * rng.random(m)  # ties broken at random
        found.append(one_run_bound(scores, included, 0.0, alpha).epsilon)
    bounds = np.array(found)
    assert np.mean(bounds > eps) <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / n)
    assert np.median(bounds) > 0.6 * eps


def test_bound_from_scores_uses_the_patterns_and_bonferroni():
    rng = np.random.default_rng(3)
    included = rng.random(200) < 0.5
    perfect = one_run_bound(included + rng.random(200) * 0.1, included, 0.0)
    # every pattern is all correct: the largest, half "in" and half "out" (200 guesses), wins
    assert (perfect.guesses_in, perfect.guesses_out) == (100, 100) or perfect.correct == perfect.guesses
    assert perfect.candidates == len(GUESS_PATTERNS)
    assert perfect.epsilon == pytest.approx(one_run_epsilon(200, perfect.guesses, perfect.correct, 0.0,
                                                            0.05 / len(GUESS_PATTERNS)))
    assert one_run_bound(rng.random(200), included, 0.0).epsilon < 1.0  # scores independent of the coins
    with pytest.raises(ValueError, match="NaN"):
        one_run_bound(np.full(200, np.nan), included, 0.0)


# --------------------------------------------------------------------------------------
# canaries, the simulator, the recovered releases
# --------------------------------------------------------------------------------------


def _tiny():
    cfg = load_config({"num-devices": 4, "records-per-device": 30, "progress": False})
    return cfg, load_dataset(cfg.data)


def test_canaries_have_their_own_private_column_and_fixed_psi():
    _, data = _tiny()
    fleet = with_canaries(data, 10, 7.0)
    spec = fleet.data.spec
    assert spec is not None and data.spec is not None
    width = len(data.spec.columns)
    assert spec.columns[width:] == tuple(f"canary_{j:04d}" for j in range(10))
    assert set(spec.columns[width:]) <= set(spec.private) and spec.public == data.spec.public
    assert fleet.data.num_records == data.num_records + 10
    assert np.array_equal(fleet.x[:, :width], np.zeros((10, width)))  # Ψ: all zero
    assert np.array_equal(fleet.x[:, width:], 7.0 * np.eye(10))
    for d, dev in enumerate(fleet.data.devices):  # canary j on device j mod 4, after the device's records
        mine = np.arange(d, 10, 4)
        assert np.array_equal(dev.x[-len(mine):], fleet.x[mine])
        assert np.array_equal(dev.x[: len(data.devices[d].x), width:], np.zeros((len(data.devices[d].x), 10)))


def test_without_absent_is_the_honest_aggregate_without_the_absent_records():
    cfg, data = _tiny()
    cfg = load_config({"num-devices": 4, "records-per-device": 30, "progress": False})
    fleet = with_canaries(data, 6, 5.0)
    model = build_model_for(cfg.training, fleet.data)
    dec = feature_map_for(cfg, fleet.data)
    settings = RoundSettings(round=1, attempt=0, phase=PHASES[Mode.FDP], sampling_rate=0.5, clipping_norm=1.0)
    dev = fleet.data.devices[1]  # holds canaries 1 and 5
    x, y = torch.as_tensor(dev.x), torch.as_tensor(dev.y)
    gen = torch.Generator().manual_seed(0)
    absent = (int(fleet.columns[5]),)
    got = WithoutAbsent(absent, clipped_private_sum)(model, dec, settings, [PrivateBatch(x, y, gen, len(y))])
    keep = torch.ones(len(y), dtype=torch.bool)
    keep[-1] = False  # canary 5 is the device's last record
    want = clipped_private_sum(model, dec, settings, [PrivateBatch(x[keep], y[keep], gen, len(y))])
    for a, b in zip(got.grads, want.grads, strict=True):
        assert torch.allclose(a, b)
    assert got.unclipped == want.unclipped
    assert ClientParts(aggregate=WithoutAbsent(absent, clipped_private_sum))  # a component of the seam


@pytest.mark.parametrize("score", ["rounds", "final"])
def test_scores_separate_the_canaries_when_the_noise_is_tiny(score):
    """sigma = 0.001 and a fixed C: the recovered releases are the canaries' clipped
    gradients, so an included canary sampled at least once (1 - 0.8^20 = 99% each)
    outscores every excluded one; only an included canary never sampled (at most 2 of
    about 20 with probability 0.999) ties with the excluded ones."""
    setup = OneRunSetup(canaries=40, amplitude=50.0, score=score, coin_seed=4, config={
        "num-devices": 4, "records-per-device": 50, "num-rounds": 20, "noise-multiplier": 0.001,
        "clipping-quantile": 0, "sampling-rate": 0.2,
    })
    res = run_one_run_audit(setup)
    assert res["mean_score_in"] > res["mean_score_out"]
    assert res["guesses"] > 0 and res["correct"] >= res["guesses"] - 2
    # the 40-guess pattern alone certifies 1.31 with 38 right (1.95 with 40); sigma = 0.001 claims ~2e7
    assert res["epsilon_lower"] > 1.1


def test_configurations_the_one_run_audit_cannot_read_are_refused():
    for key, value, word in [("mode", "corrdp", "mode"), ("reproducible-noise", True, "reproducible-noise"),
                             ("model", "mlp", "logistic"), ("optimizer", "adam", "momentum"),
                             ("device-sampling-rate", 0.5, "record unit")]:
        with pytest.raises(ConfigError, match=word):
            OneRunSetup(config={key: value}).run_config()
    with pytest.raises(ConfigError, match="canaries"):
        OneRunSetup(canaries=1)


# --------------------------------------------------------------------------------------
# fedfdp audit --one-run
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_one_run_real_run_passes(capsys):
    """The default recipe (fdp, adaptive clipping "auto", sigma calibrated to epsilon = 2)
    on the tiny fleet with 300 canaries (the recipe adapts C at this N): the lower bound
    stays under the printed epsilon, the f-DP analysis does not reject the run's curve."""
    assert main(["audit", "--one-run", "--json", "--canaries", "300"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["bug"] is None and res["relation"] == "add-remove" and res["delta"] == 1e-5
    assert res["epsilon_claimed"] == pytest.approx(2.0, abs=0.01)
    assert res["clipping"]["quantile"] > 0  # the recipe adapts C: its noisy count is released
    assert res["canaries"] == 300 and res["secrets"] == "os-csprng"
    assert res["epsilon_lower"] <= res["epsilon_claimed"] and not res["violated"]
    assert not res["fdp"]["claim_rejected"] and res["verdict"] == "pass"


@pytest.mark.slow
def test_cli_one_run_catches_unclipped_gradients(capsys):
    """--break no-clipping: an included canary's unclipped gradient is ~20 C against
    noise sigma*C; with 1,000 canaries every guess of the top patterns is right, which
    refutes the claim 2.00 in both analyses (docs/audit.md, section 7)."""
    assert main(["audit", "--one-run", "--json", "--break", "no-clipping", "--canaries", "1000"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["bug"] == "no-clip"
    assert res["epsilon_lower"] > res["epsilon_claimed"] and res["violated"], res
    assert res["verdict"].startswith("FAIL")


def test_cli_one_run_errors(capsys):
    assert main(["audit", "--one-run", "--rounds", "5"]) == 2
    assert "--set" in capsys.readouterr().err
    assert main(["audit", "--canaries", "5"]) == 2  # an option of --one-run
    assert "--one-run" in capsys.readouterr().err
    assert main(["audit", "--one-run", "--set", "mode=corrdp"]) == 2
    assert "mode" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# the f-DP analysis (Mahloujifar, Melis, Chaudhuri 2024): independent references
# --------------------------------------------------------------------------------------


def _least_mass_by_optimisation(mu: float, m: int, k: int, c: int, beta: float) -> float:
    """The least mass of an f-DP count distribution with tail beta at c, by a general
    constrained optimiser over p_0..p_{c-1} (not the recursion): minimise sum p subject
    to H_i >= g(R_{i+1}), in units of k/m."""
    from scipy import optimize, stats

    def masses(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = np.empty(c + 1)
        h = np.empty(c + 1)
        r[c], h[c] = beta * c / m, beta * (k - c) / m
        for i in range(c - 1, -1, -1):
            r[i] = r[i + 1] + p[i] * i / m
            h[i] = h[i + 1] + p[i] * (k - i) / m
        return r, h

    def slack(p: np.ndarray) -> np.ndarray:
        r, h = masses(p)
        return np.array([h[i] - stats.norm.cdf(stats.norm.ppf(min(r[i + 1], 1.0)) - mu) for i in range(c)])

    best = math.inf
    for start in (np.full(c, 0.5), np.full(c, 0.05), np.linspace(0.01, 1.0, c)):
        res = optimize.minimize(lambda p: float(np.sum(p)), start, method="SLSQP", bounds=[(0, 2)] * c,
                                constraints=[{"type": "ineq", "fun": slack}],
                                options={"ftol": 1e-12, "maxiter": 500})
        if res.success and np.all(slack(res.x) > -1e-9):
            best = min(best, float(np.sum(res.x)))
    return beta + best


@pytest.mark.parametrize(("mu", "m", "k", "c"), [(1.0, 20, 12, 9), (0.5, 30, 10, 8), (2.0, 15, 15, 11)])
def test_fdp_recursion_is_the_least_feasible_mass(mu, m, k, c):
    from fedfdp.one_run_fdp import fdp_required_mass, gaussian_curve

    got = float(fdp_required_mass(gaussian_curve(mu), m, k, c, 0.05)[0])
    want = _least_mass_by_optimisation(mu, m, k, c, 0.05)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_gaussian_and_epsilon_delta_curves_against_scipy():
    from scipy import stats

    from fedfdp.one_run_fdp import epsilon_delta_curve, gaussian_curve

    x = np.array([1e-6, 1e-3, 0.05, 0.3, 0.9, 1.0])
    for mu in (0.0, 0.7, 3.0):
        assert np.allclose(gaussian_curve(mu)(x), stats.norm.cdf(stats.norm.ppf(x) - mu), atol=1e-15)
    # (eps, delta)-DP: the least probability out given x in is max(0, e^-eps (x - delta)) (and the
    # line 1 - delta - e^eps (1 - x) never binds for x <= 1 - delta)
    g = epsilon_delta_curve([1.0, 0.0], [1e-3, 0.5])
    assert np.allclose(g(x), np.maximum(0.0, np.maximum(np.exp(-1.0) * (x - 1e-3), x - 0.5)))


def _gaussian_trial(rng: np.random.Generator, mu: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """m canaries of a mu-GDP mechanism (score N(mu, 1) if in, N(0, 1) if out): the
    worst case of mu-GDP for each canary, independent across canaries."""
    included = rng.random(m) < 0.5
    return rng.normal(mu * included, 1.0), included


def test_gdp_bound_is_valid_and_informative_on_gaussian_scores():
    """A mu-GDP mechanism with exactly Gaussian scores: over 300 audits the 95% bound
    exceeds the true mu in at most alpha of them (+ 3 binomial s.e.); it reaches a
    measured share of mu (median 0.54 at mu = 1, 1,000 canaries, top 10%; 1.13 at
    mu = 2, 2,000 canaries, top 5%, where all 100 guesses are right: that pattern's
    ceiling. The recursion pays for every f-DP mechanism, correlated ones included)."""
    from fedfdp.one_run_fdp import gdp_lower_bound, guess_counts

    rng = np.random.default_rng(11)
    alpha, n = 0.05, 300
    for mu, m, share, floor in ((1.0, 1000, 0.1, 0.4), (2.0, 2000, 0.05, 0.5)):
        bounds = []
        for _ in range(n):
            scores, included = _gaussian_trial(rng, mu, m)
            k_in, _, c = guess_counts(scores, included, share, 0.0)
            bounds.append(gdp_lower_bound(m, k_in, c, alpha))
        b = np.array(bounds)
        assert np.mean(b > mu) <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / n)
        assert np.median(b) > floor * mu


def test_fdp_claim_test_is_valid_on_randomized_response_and_sees_a_weaker_one():
    """Randomized response at eps is exactly (eps, 0)-DP: the test of that claim rejects in
    at most alpha of 300 audits (+ 3 s.e.); randomized response at 2 eps is rejected in
    most of them."""
    from fedfdp.one_run_fdp import epsilon_delta_curve, fdp_rejects, guess_counts

    rng = np.random.default_rng(12)
    eps, m, n, alpha = 1.0, 2000, 300, 0.05
    claim = epsilon_delta_curve([eps], [0.0])
    valid = alpha + 3 * math.sqrt(alpha * (1 - alpha) / n)
    for true_eps, low, high in ((eps, 0.0, valid), (2 * eps, 0.8, 1.0)):
        truthful = 1 / (1 + math.exp(-true_eps))
        hits = 0
        for _ in range(n):
            included = rng.random(m) < 0.5
            reported = np.where(rng.random(m) < truthful, included, ~included)
            scores = reported + 0.01 * rng.random(m)
            k_in, k_out, c = guess_counts(scores, included, 0.25, 0.25)
            hits += fdp_rejects(claim, m, k_in + k_out, c, alpha)
        assert low <= hits / n <= high, (true_eps, hits)


def test_gdp_bound_edges():
    from fedfdp.one_run_fdp import MU_GRID, gaussian_curve, gdp_lower_bound, needed_correct

    assert gdp_lower_bound(1000, 100, 0, 0.05) == 0.0
    assert gdp_lower_bound(1000, 100, 50, 0.05) == 0.0  # chance level
    lo, hi = gdp_lower_bound(1000, 100, 90, 0.05), gdp_lower_bound(1000, 100, 99, 0.05)
    assert 0 < lo < hi < MU_GRID[-1]
    # 2 guesses cannot reject mu = 0.5 even both right; 200 right of 200 can
    assert needed_correct(gaussian_curve(0.5), 1000, 2, 0.05) is None
    need = needed_correct(gaussian_curve(0.5), 1000, 200, 0.05)
    assert need is not None and 100 < need <= 200
    with pytest.raises(ValueError, match="correct"):
        gdp_lower_bound(10, 5, 6, 0.05)


def test_power_from_public_quantities_and_the_no_power_line():
    """20 canaries cannot refute epsilon = 2 even with every guess right (the e-d ceiling
    with all 20 right is about 1.05 at alpha/20); 5,000 canaries can in every f-DP pattern."""
    from fedfdp.one_run_fdp import epsilon_delta_curve
    from fedfdp.run_plan import mechanism_for
    from simulations.auditing.one_run import audit_power, claim_curve

    cfg = OneRunSetup().run_config()
    fleet = with_canaries(load_dataset(cfg.data), 20, 30.0)
    mech = mechanism_for(cfg, fleet.data)
    claim = claim_curve(mech, cfg.privacy.num_rounds)
    weak = audit_power(OneRunSetup(canaries=20), claim, 2.0, 1e-5)
    assert not weak.any and weak.steinke_ceiling < 2.0
    assert weak.line(20).startswith("no power: with 20 canaries, even 20 of 20 guesses right")
    strong = audit_power(OneRunSetup(canaries=5000), claim, 2.0, 1e-5)
    assert strong.any and all(n is not None for n in strong.fdp_needed)
    # the claim's curve lies above the line of its own printed (epsilon, delta)
    x = np.linspace(0.0, 0.2, 50)
    assert np.all(claim(x) >= epsilon_delta_curve([2.0], [1e-5])(x) - 1e-3)


def test_one_run_fdp_on_scores():
    """Scores that give the coins away reject a tight claim and bound mu well above 0;
    scores independent of the coins reject nothing."""
    from fedfdp.one_run_fdp import epsilon_delta_curve, gdp_lower_bound, one_run_fdp

    rng = np.random.default_rng(13)
    included = rng.random(2000) < 0.5
    claim = epsilon_delta_curve([0.5], [1e-6])
    patterns = ((0.015, 0.0), (0.03, 0.0))
    telling = one_run_fdp(included + 0.1 * rng.random(2000), included, claim, 1e-5, 0.05, patterns)
    assert telling.claim_rejected and telling.can_reject and telling.correct == telling.guesses_in
    assert telling.needed is not None and telling.correct >= telling.needed
    assert telling.mu_lower == max(gdp_lower_bound(2000, round(a * 2000), round(a * 2000), 0.025)
                                   for a, _ in patterns)
    assert telling.epsilon_of_mu > 0
    blind = one_run_fdp(rng.random(2000), included, claim, 1e-5, 0.05, patterns)
    assert not blind.claim_rejected and blind.mu_lower < telling.mu_lower


def test_planned_canaries_from_public_quantities():
    """The canary count from a model of the run (sigma, q, the rounds, the claim): a run
    with a tenth of the noise is caught with the fewest; a run with all of it never (the
    analysis is valid), so no count qualifies."""
    from fedfdp.run_plan import mechanism_for
    from simulations.auditing.one_run import CANARY_GRID, planned_canaries

    setup = OneRunSetup()
    cfg = setup.run_config()
    mech = mechanism_for(cfg, load_dataset(cfg.data))
    assert planned_canaries(mech, cfg.privacy.num_rounds, setup, alternative=0.1, trials=20) == CANARY_GRID[0]
    assert planned_canaries(mech, cfg.privacy.num_rounds, setup, alternative=1.0, trials=5) is None
    assert main(["audit", "--one-run", "--canaries", "many"]) == 2
