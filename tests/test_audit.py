"""Privacy audit: Clopper–Pearson against references, the ε lower bound, the test
choice, and the canary audit through the real client and strategy — it passes
the correct mechanism and fails every planted bug (a broken component,
simulations.auditing.bugs)."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedfdp import load_config
from fedfdp.accounting import epsilon_for
from fedfdp.audit import (
    choose_test,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
    evaluate_test,
)
from fedfdp.config import ConfigError
from fedfdp.mechanisms import GaussianSumMechanism
from fedfdp.round_engine import ServerParts
from fedfdp.run_plan import build_plan
from simulations.audit import BUG_NAMES
from simulations.auditing import canaries as A
from simulations.auditing.analysis import run_audit
from simulations.auditing.bugs import BUGS
from simulations.cli import main

# --------------------------------------------------------------------------------------
# Clopper–Pearson: closed forms and an independent implementation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 100, 5000])
@pytest.mark.parametrize("alpha", [0.025, 0.05, 0.2])
def test_cp_closed_forms(n, alpha):
    # no success: P(Bin(n, p) = 0) = (1-p)^n = alpha  =>  p = 1 - alpha^(1/n)
    assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-12)
    assert clopper_pearson_lower(0, n, alpha) == 0.0
    # all successes: p^n = alpha  =>  p = alpha^(1/n)
    assert clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-12)
    assert clopper_pearson_upper(n, n, alpha) == 1.0


@pytest.mark.parametrize(("k", "n"), [(1, 10), (3, 100), (50, 100), (17, 4000), (3999, 4000)])
@pytest.mark.parametrize("alpha", [0.025, 0.05])
def test_cp_matches_scipy_exact_interval_and_beta_quantiles(k, n, alpha):
    # scipy's two-sided exact (Clopper–Pearson) interval at 1 - 2α has the one-sided bounds at α
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
    assert clopper_pearson_upper(k, n, alpha) == pytest.approx(ci.high, rel=1e-9)
    assert clopper_pearson_lower(k, n, alpha) == pytest.approx(ci.low, rel=1e-9)
    assert clopper_pearson_upper(k, n, alpha) == pytest.approx(stats.beta.ppf(1 - alpha, k + 1, n - k))
    # defining property: P(Bin(n, ub) <= k) = alpha
    assert stats.binom.cdf(k, n, clopper_pearson_upper(k, n, alpha)) == pytest.approx(alpha, rel=1e-6)


def test_cp_coverage_statistical():
    """Coverage ≥ 1 − α: 20,000 draws of Bin(200, 0.03); the miss rate of the
    upper bound at α = 0.05 must be ≤ 0.05 + 4 s.e."""
    rng = np.random.default_rng(1)
    n, p, alpha = 200, 0.03, 0.05
    ks = rng.binomial(n, p, size=20_000)
    ub = {k: clopper_pearson_upper(int(k), n, alpha) for k in np.unique(ks)}
    miss = np.mean([ub[k] < p for k in ks])
    assert miss <= alpha + 4 * math.sqrt(alpha * (1 - alpha) / len(ks))


@pytest.mark.parametrize(("k", "n"), [(-1, 10), (11, 10), (0, 0), (True, 3)])
def test_cp_rejects_bad_counts(k, n):
    with pytest.raises(ValueError, match="k="):
        clopper_pearson_upper(k, n, 0.05)


# --------------------------------------------------------------------------------------
# ε lower bound
# --------------------------------------------------------------------------------------


def test_epsilon_lower_bound_by_hand():
    b = epsilon_lower_bound(false_positives=2, negatives=1000, false_negatives=700, positives=1000,
                            delta=0.01, alpha=0.05)
    fpr_ub = stats.beta.ppf(0.975, 3, 998)
    fnr_ub = stats.beta.ppf(0.975, 701, 300)
    expect = max(math.log((1 - 0.01 - fnr_ub) / fpr_ub), math.log((1 - 0.01 - fpr_ub) / fnr_ub), 0.0)
    assert b.epsilon == pytest.approx(expect)
    assert b.fpr_upper == pytest.approx(fpr_ub) and b.fnr_upper == pytest.approx(fnr_ub)
    assert b.fpr == 0.002 and b.fnr == 0.7


def test_epsilon_lower_bound_properties():
    # a useless test certifies nothing
    assert epsilon_lower_bound(500, 1000, 500, 1000, 1e-5).epsilon == 0.0
    # no errors: log(n / log(2/α)) up to the δ term, the largest certifiable ε
    b = epsilon_lower_bound(0, 1000, 0, 1000, 0.0)
    assert b.epsilon == pytest.approx(math.log((1 - b.fnr_upper) / b.fpr_upper))
    assert b.epsilon < math.log(1000 / math.log(2 / 0.05)) + 0.01
    # the two errors enter symmetrically
    assert epsilon_lower_bound(3, 800, 600, 800, 0.01).epsilon == pytest.approx(
        epsilon_lower_bound(600, 800, 3, 800, 0.01).epsilon
    )
    # larger δ or fewer trials can only lower the bound
    base = epsilon_lower_bound(2, 800, 600, 800, 0.01).epsilon
    assert epsilon_lower_bound(2, 800, 600, 800, 0.05).epsilon < base
    assert epsilon_lower_bound(1, 400, 300, 400, 0.01).epsilon < base
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound(0, 10, 0, 10, 1.0)


def test_gaussian_mechanism_audit_is_below_truth_and_informative():
    """Scores of the Gaussian mechanism (shift 1/σ): the audit's bound stays
    under the exact ε (q = 1: the accountant's closed form) and is clearly
    positive; thresholds chosen on separate trials."""
    rng = np.random.default_rng(3)
    sigma, delta, n = 0.5, 0.01, 4000
    truth = epsilon_for(sigma, 1.0, 1, delta).upper

    def draw():
        return {"T": rng.normal(size=n) + 1 / sigma}, {"T": rng.normal(size=n)}

    pos, neg = draw()
    test, _ = choose_test(pos, neg, delta, sizes=(n, n))
    pos, neg = draw()
    bound = evaluate_test(test, pos["T"], neg["T"], delta)
    assert 1.5 < bound.epsilon < truth


# --------------------------------------------------------------------------------------
# the canary audit through the real client and strategy
# --------------------------------------------------------------------------------------


def test_design_canaries_are_orthogonal_and_clip_to_c():
    des = A.design(A.AuditSetup(alone=3, twins=1, crowd=1, mates=1, twin_count=5, crowd_size=4, mate_count=2,
                                device_sampling_rate=0.5, rounds=3))
    # _check_design (run by design) verified each canary's clipped gradient is +C on its
    # own coordinate through fedfdp.contribution.private_gradient_sum; the markers are the
    # canaries' public gradients on their own hidden unit
    assert des.num_canaries == 6 and np.all(des.marker > 0)
    worlds = np.array([A.WORLD1, A.ADD_REMOVE, A.REPLACEMENT, A.WORLD1, A.ADD_REMOVE, A.WORLD1])
    data = des.devices(worlds, "private")
    assert [len(d) for d in data.devices] == [1, 0, 1, 6, 4, 3]
    assert data.devices[2].x[-1, -1] == -des.setup.amplitude  # replacement: same Ψ, private −a
    assert np.array_equal(data.devices[2].x[-1, :-1], des.canary_x[2, :-1])
    assert np.array_equal(data.devices[4].x, np.zeros((4, 13)))  # crowd: fillers only
    assert np.array_equal(data.devices[5].x[:2], des.mate_x[[5, 5]])  # mates, then the canary
    public = des.devices(np.full(6, A.ADD_REMOVE), "public")  # Algorithm 2: Ψ still there
    assert [len(d) for d in public.devices] == [1, 1, 1, 6, 5, 3]
    assert np.array_equal(public.devices[4].x[0], des.canary_x[4])  # crowd: the canary first


def test_one_round_recovers_the_released_private_sum():
    """With little noise (σ = 0.02) the recovered projections are the
    canaries' clipped contributions: +1·C/(σC) when sampled, 0 otherwise; and
    absent (add/remove) canaries contribute nothing."""
    setup = A.AuditSetup(alone=6, twins=0, rounds=3, sampling_rate=0.5, noise_multiplier=0.02)
    des = A.design(setup)
    A.set_identity()
    worlds = np.array([A.WORLD1] * 3 + [A.ADD_REMOVE] * 3)
    seen = []
    for seed in range(6):
        trial = A.one_round(des, seed, worlds)
        scaled = trial.projection * setup.noise_multiplier  # units of C
        assert trial.rejected == 0
        assert np.allclose(scaled[3:], 0, atol=0.1)
        assert np.all(np.isclose(scaled[:3], 0, atol=0.1) | np.isclose(scaled[:3], 1, atol=0.1))
        seen += list(np.round(scaled[:3]))
    assert 0 < np.mean(seen) < 1  # Poisson-sampled


def test_mates_reveal_whether_the_device_was_drawn():
    """Poisson devices at p = 0.5, σ = 0.02: the mates' coordinate is ≈ (mates
    sampled)·C when the device was drawn and 0 otherwise; a canary is only ever
    seen on a drawn device."""
    setup = A.AuditSetup(alone=0, twins=0, mates=8, mate_count=20, device_sampling_rate=0.5, rounds=3,
                         sampling_rate=0.5, noise_multiplier=0.02)
    des = A.design(setup)
    A.set_identity()
    drawn_seen = []
    for seed in range(4):
        trial = A.one_round(des, seed, np.full(8, A.WORLD1))
        mates = trial.mates * setup.noise_multiplier
        drawn = mates > 0.5
        assert np.allclose(mates[~drawn], 0, atol=0.1)
        assert np.allclose(trial.projection[~drawn] * setup.noise_multiplier, 0, atol=0.1)
        drawn_seen += list(drawn)
    assert 0 < np.mean(drawn_seen) < 1


def _audit(bug, rounds=150, **kw):
    """A repeatable audit: seeded secret streams (``secret_seed``), which the
    auditor's predictions never use; real audits draw from the OS CSPRNG."""
    setup = A.recommended_setup(bug, **{"seed": 11, "secret_seed": 5, "rounds": rounds, **kw})
    (res,) = run_audit(setup, ["add-remove"], bug)
    return res


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setup", "claim"), [(None, 1.12), ("shared-batch", 1.12), ("realized-normalization", 1.12),
                         ("pq-accounting", 2.28)]
)
def test_audit_passes_the_correct_mechanism(setup, claim):
    """The honest components pass on every canary configuration the bugs are
    audited with; on the Poisson device-sampling canaries the claim is the
    participation mixture (rate q = 0.5, p = 0.1: 2.28, where rate p·q would
    claim 0.65)."""
    res = _audit(None, **({} if setup is None else A.RECOMMENDED[setup]))
    if claim is not None:
        assert res["epsilon_claimed"] == pytest.approx(claim, abs=0.01)
    assert not res["violated"] and res["rejected_replies"] == 0, res
    assert res["epsilon_lower"] < res["epsilon_claimed"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bug", "rounds"),
    [
        ("no-clip", 60),
        ("low-noise", 100),
        ("shared-batch", 300),
        ("realized-normalization", 200),
        ("predictable-noise", 100),
        ("pq-accounting", 600),
    ],
)
def test_audit_fails_every_planted_bug(bug, rounds):
    res = _audit(bug, rounds)
    assert res["violated"], res


# --------------------------------------------------------------------------------------
# the default recipe: adaptive clipping, its noisy count released through the next C
# --------------------------------------------------------------------------------------


def test_server_noises_the_count_through_its_parts_then_steps_c_geometrically():
    """The seam a normal run uses: the round engine noises adaptive clipping's count with
    ServerParts.count_mechanism(σ_b, 1) and moves C by C·exp(−η(b̃ − γ)), b̃ the
    noisy count over the expected batch (here a mechanism that adds nothing)."""
    cfg = load_config({"num-devices": 2, "noise-multiplier": 1.0, "clipping-quantile": 0.5, "num-rounds": 1,
                       "sampling-rate": 0.5, "clipping-norm": 1.5, "progress": False})
    calls = []

    class Exact:
        def __init__(self, std, sensitivity):
            calls.append((std, sensitivity))

        def privatize(self, values, stream):
            return [v.clone() for v in values]

    assert ServerParts().count_mechanism is GaussianSumMechanism
    plan = build_plan(cfg, model=torch.nn.Linear(3, 2), server_parts=ServerParts(count_mechanism=Exact))
    server = plan.engine([40, 60])
    mechanism = server.mechanism
    state = server.begin_round(1)
    server.finish_round([[torch.zeros_like(p) for p in plan.model.parameters()]], [], 0, 0.0, unclipped=13)
    sigma_eff = math.sqrt(1 - 0.05)  # σ = 1 is the gradient's; the count takes the share 0.05
    assert calls == [(pytest.approx(sigma_eff / math.sqrt(0.05)), 1.0)]
    assert mechanism.clipping.count_noise == pytest.approx(sigma_eff / math.sqrt(0.05))
    assert state.plan.normaliser == pytest.approx(0.5 * 100)
    assert server.clipping_norm == pytest.approx(1.5 * math.exp(-0.2 * (13 / 50 - 0.5)))


def test_adaptive_canaries_resolve_the_recipe_and_read_the_count():
    """The recommended adaptive canaries: "auto" adapts (fillers raise the expected
    batch), σ_eff and σ_b follow the share; with little noise the count read off the
    next C is 1 exactly when the counted canary's coordinate shows it sampled (ρC)."""
    plan = A.audited_plan(A.design(A.recommended_setup("count-public-stream", rounds=3)), None)
    sigma_eff = 2.0 * math.sqrt(1 - 0.05)
    assert plan.accounted_noise_multiplier == pytest.approx(sigma_eff)
    assert plan.clipping.count_noise == pytest.approx(sigma_eff / math.sqrt(0.05))
    assert 0.5 <= plan.clipping.quantile <= 0.99
    explicit = A.audited_plan(A.design(A.recommended_setup("count-public-stream", rounds=3,
                                                            clipping_quantile=0.5)), None)
    assert explicit.clipping.quantile == 0.5
    setup = A.AuditSetup(alone=2, twins=0, counted=1, fillers=300, clipping_quantile=None,
                         noise_multiplier=0.01, sampling_rate=0.5, rounds=3)
    des = A.design(setup)  # checks: the counted canary is ρC on its coordinate and within C
    sigma_b = A.audited_plan(des, None).clipping.count_noise
    assert sigma_b is not None  # adaptive clipping: a noisy count
    A.set_identity()
    seen = []
    for seed in range(8):
        trial = A.one_round(des, seed, np.full(3, A.WORLD1))
        sampled = trial.projection[2] * setup.noise_multiplier / setup.counted_norm
        assert round(sampled) in (0, 1) and abs(sampled - round(sampled)) < 0.1
        assert trial.count * sigma_b == pytest.approx(round(sampled), abs=0.25)
        seen.append(round(sampled))
    assert 0 < np.mean(seen) < 1


def test_count_bugs_are_count_mechanisms():
    """count-public-stream: with the counted canary absent, the count the round releases
    is exactly the draw of the round's public stream (what the auditor predicts from the
    seed); honest: it is not. count-low-noise: σ_b/20."""
    des = A.design(A.recommended_setup("count-public-stream", rounds=3))
    worlds = np.full(des.num_canaries, A.ADD_REMOVE)
    A.set_identity()
    broken = A.one_round(des, 5, worlds, BUGS["count-public-stream"])
    honest = A.one_round(des, 5, worlds)
    assert broken.count == pytest.approx(broken.count_predicted, abs=1e-9)
    assert honest.count != pytest.approx(honest.count_predicted, abs=1e-3)
    parts = BUGS["count-low-noise"].server(0)
    count = parts.count_mechanism(8.0, 1.0)
    assert isinstance(count, GaussianSumMechanism) and count.std == pytest.approx(0.4)


def test_counted_canary_needs_adaptive_clipping_and_its_own_count():
    with pytest.raises(ConfigError, match="adaptive"):
        run_audit(A.AuditSetup(alone=1, counted=1, rounds=3, clipping_quantile=0), ["add-remove"])
    with pytest.raises(ConfigError, match="at most 1"):
        A.AuditSetup(counted=2)
    with pytest.raises(ConfigError, match="crowd"):
        A.AuditSetup(counted=1, crowd=2)


@pytest.mark.slow
@pytest.mark.parametrize("quantile", [None, 0.5])
def test_audit_passes_the_correct_mechanism_under_adaptive_clipping(quantile):
    """The default recipe ("auto", γ ≈ 0.70 here) and an explicit γ: the counted canary's
    sum and count together face the claim for σ_eff (0.52)."""
    res = _audit(None, 300, clipping_quantile=quantile)  # the adaptive canaries (recommended_setup)
    assert res["epsilon_claimed"] == pytest.approx(0.52, abs=0.01)
    assert res["clipping"]["resolved_quantile"] > 0
    assert not res["violated"] and res["epsilon_lower"] < res["epsilon_claimed"], res


@pytest.mark.slow
@pytest.mark.parametrize("quantile", [None, 0.5])
@pytest.mark.parametrize("bug", ["count-public-stream", "count-low-noise"])
def test_audit_catches_the_count_bugs(bug, quantile):
    res = _audit(bug, 600, clipping_quantile=quantile)
    assert res["violated"] and res["test"]["statistic"].startswith("counted/"), res


def test_planted_bugs_are_components_and_unknown_ones_refused():
    for name, bug in BUGS.items():
        assert bug.name == name and bug.component
    with pytest.raises(ValueError, match="unknown"):
        run_audit(A.AuditSetup(rounds=3), ["add-remove"], "bogus")
    assert set(BUG_NAMES) == set(BUGS)


def test_cli_json_and_errors(capsys):
    assert main(["audit", "--json", "--rounds", "6", "--relation", "both", "--noise-multiplier", "1.0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["relation"] for r in rows] == ["add-remove", "replacement"]
    for r in rows:
        assert {"epsilon_lower", "epsilon_claimed", "relation", "delta", "trials", "bug"} <= set(r)
        assert r["bug"] is None and r["trials"] > 0
    assert rows[1]["epsilon_claimed"] > rows[0]["epsilon_claimed"]  # Prop. 1 replacement bound
    with pytest.raises(SystemExit):
        main(["audit", "--break", "bogus"])
    assert main(["audit", "--attack", "attribute"]) == 2  # needs --run
    assert "--run" in capsys.readouterr().err
    assert main(["audit", "--rounds", "0"]) == 2  # refused, not the default 400
    assert "rounds=0" in capsys.readouterr().err
    assert main(["audit", "--clipping-quantile", "often"]) == 2
    assert "--clipping-quantile='often'" in capsys.readouterr().err
    assert main(["audit", "--clipping-quantile", "1.5", "--rounds", "3"]) == 2
    assert "clipping-quantile=1.5" in capsys.readouterr().err


def test_tests_build_rounds_like_the_audit_on_a_real_grid():
    """The tests build a round's messages with the audit's own builder, and their
    in-process grid is a real Flower Grid (the strategy's exchange has one path);
    the grid and the tests' strategy helpers live with the tests, not the audit."""
    from flwr.serverapp import Grid

    import simulations.auditing.inprocess as inprocess
    import tests.flower_helpers as helpers

    assert helpers.train_messages is inprocess.train_messages
    assert issubclass(helpers.InProcessGrid, Grid)
    for name in ("InProcessGrid", "client_reply", "registered_strategy", "node_context"):
        assert not hasattr(inprocess, name)
