"""Privacy audit: Clopper–Pearson against references, the ε lower bound, the test
choice, and the canary audit through the real client and strategy — it passes
the correct mechanism and fails every planted bug (fedfdp.faults)."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from fedfdp import faults
from fedfdp.accounting import epsilon_for
from fedfdp.audit import (
    choose_test,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
    evaluate_test,
)
from simulations.cli import main
from strategies import canary_audit as A

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
    des = A.design(A.AuditSetup(alone=3, twins=2, twin_count=5, rounds=3))
    # _check_design (run by design) verified each canary's clipped gradient is +C on its
    # own coordinate through fedfdp.contribution.private_batch_sum; the markers are the
    # canaries' public gradients on their own hidden unit
    assert des.num_canaries == 5 and np.all(des.marker > 0)
    data = des.devices(np.array([A.WORLD1, A.ADD_REMOVE, A.REPLACEMENT, A.WORLD1, A.ADD_REMOVE]), "private")
    assert [len(d) for d in data.devices] == [1, 0, 1, 6, 5]
    assert data.devices[2].x[-1, -1] == -des.setup.amplitude  # replacement: same Ψ, private −a
    assert np.array_equal(data.devices[2].x[-1, :-1], des.canary_x[2, :-1])
    public = des.devices(np.full(5, A.ADD_REMOVE), "public")  # Algorithm 2: Ψ still there
    assert [len(d) for d in public.devices] == [1, 1, 1, 6, 6]


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
        proj, _ = A.one_round(des, seed, worlds)
        scaled = proj * setup.noise_multiplier  # units of C
        assert np.allclose(scaled[3:], 0, atol=0.1)
        assert np.all(np.isclose(scaled[:3], 0, atol=0.1) | np.isclose(scaled[:3], 1, atol=0.1))
        seen += list(np.round(scaled[:3]))
    assert 0 < np.mean(seen) < 1  # Poisson-sampled


def _audit(bug, rounds, **kw):
    setup = A.AuditSetup(rounds=rounds, seed=11, **kw)
    (res,) = A.run_audit(setup, ["add-remove"], bug)
    return res


@pytest.mark.slow
def test_audit_passes_the_correct_mechanism():
    res = _audit(None, 150)
    assert res["epsilon_claimed"] == pytest.approx(1.12, abs=0.01)
    assert not res["violated"] and res["epsilon_lower"] < res["epsilon_claimed"] - 0.3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bug", "rounds", "canaries"),
    [
        ("no-clip", 60, {}),
        ("low-noise", 100, {}),
        ("shared-batch", 400, {"alone": 72, "twins": 0}),
        ("realized-normalization", 200, {"alone": 0, "twins": 48}),
    ],
)
def test_audit_fails_every_planted_bug(bug, rounds, canaries):
    res = _audit(bug, rounds, **canaries)
    assert res["violated"], res
    assert res["epsilon_lower"] > res["epsilon_claimed"] + 0.2


def test_planted_bugs_are_off_outside_the_block():
    assert not any(faults.active(b) for b in faults.BUGS)
    with faults.planted_bug("low-noise"):
        assert faults.active("low-noise") and not faults.active("no-clip")
    assert not faults.active("low-noise")
    with pytest.raises(ValueError, match="unknown"):
        A.run_audit(A.AuditSetup(rounds=3), ["add-remove"], "bogus")


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


def test_inprocess_helpers_are_reexported_for_tests():
    import strategies.inprocess as inprocess
    import tests.flower_helpers as helpers

    for name in ("InProcessGrid", "client_reply", "registered_strategy", "train_messages", "node_context"):
        assert getattr(helpers, name) is getattr(inprocess, name)
