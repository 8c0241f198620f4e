"""CorrDP (fedfdp.corrdp): roles, TV (closed forms, the estimator's c2/c3 bounds, Def. 3.10),
the synthetic dataset, and the Laplace mechanisms (exact sampler, scale, Theorem 2.9).

CorrDP-SGD (blocks, clipping, noise, accounting) is in ``tests/test_corrdp_sgd.py``.
Statistical tests state their level; none takes its expected value from the code under test.
"""

from __future__ import annotations

import doctest
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import fedfdp.corrdp
from fedfdp.corrdp import (
    Bins,
    FeatureRoles,
    InsensitiveFeature,
    corrdp_laplace,
    correlated_features,
    correlated_sensitivity,
    discrete_laplace,
    empirical_tv,
    estimate_tvs,
    group_feature_means,
    inflate,
    linf_bound,
    minimal_correlated_sensitivity,
    relation_sensitivity,
    standard_laplace,
    standard_sensitivity,
    tv_of_joint,
)
from fedfdp.corrdp.tv import TVConstants, estimation_error_bound, joint_codes, min_records
from fedfdp.entropy import OSBits, SeededEntropy

# ----------------------------------------------------------------------------- the package


@pytest.mark.parametrize("name", [n for n in fedfdp.corrdp.__all__ if not n.startswith("RELATION")])
def test_public_name_has_a_docstring_and_runnable_examples(name):
    """The project's API convention (tests/test_api.py), for fedfdp.corrdp's names."""
    obj = getattr(fedfdp.corrdp, name)
    assert len((obj.__doc__ or "").strip().splitlines()) > 2, f"{name}: no docstring"
    tests = [t for t in doctest.DocTestFinder(recurse=False).find(obj, name) if t.examples]
    assert tests, f"{name}: no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t)
    assert runner.failures == 0, f"{name}: {runner.failures} example(s) failed"


def test_corrdp_never_imports_flower():
    code = "import sys, fedfdp.corrdp; print('flwr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- roles


def test_roles_partition_and_bad_input_named():
    roles = FeatureRoles.from_names(["hr", "speed", "oh_a", "oh_b"], ["hr"], {"speed": 0.3, "kind": 1.0},
                                    groups={"kind": ["oh_a", "oh_b"]})  # fmt: skip
    assert roles.sensitive == (0,) and roles.tv == {"speed": 0.3, "kind": 1.0}
    assert roles.insensitive[1].columns == (2, 3)
    with pytest.raises(ValueError, match=r"'speed': tv=1.5 must be in \[0, 1\]"):
        FeatureRoles.from_names(["hr", "speed"], ["hr"], {"speed": 1.5})
    with pytest.raises(ValueError, match=r"tv=-0.1 must be in"):
        InsensitiveFeature("x", (0,), -0.1)
    with pytest.raises(ValueError, match=r"tv=nan must be in"):
        InsensitiveFeature("x", (0,), float("nan"))
    both = r"column 1 \('speed'\) is declared both sensitive and insensitive feature 'speed'"
    with pytest.raises(ValueError, match=both):
        FeatureRoles.from_names(["hr", "speed"], ["hr", "speed"], {"speed": 0.2})
    with pytest.raises(ValueError, match=r"columns 1 \('speed'\): neither sensitive nor insensitive"):
        FeatureRoles.from_names(["hr", "speed"], ["hr"], {})
    with pytest.raises(ValueError, match=r"sensitive column 'pulse': not an input column"):
        FeatureRoles.from_names(["hr", "speed"], ["pulse"], {"speed": 0.2})
    assert roles.with_tv({"speed": 0.6}).tv == {"speed": 0.6, "kind": 1.0}


# ----------------------------------------------------------------------------- TV: closed forms


def test_tv_of_joint_paper_example_and_copy_model():
    # Example 2.5: X1 | X2 = k ~ Bernoulli(k/3), k in {1, 2}: TV(2) = 1/3.
    joint = 0.5 * np.array([[2 / 3, 1 / 3], [1 / 3, 2 / 3]])
    assert tv_of_joint(joint) == pytest.approx(1 / 3, abs=1e-12)
    # copy model with k categories: X_j = S w.p. rho else uniform: TV = rho
    k, rho = 4, 0.35
    cond = rho * np.eye(k) + (1 - rho) / k
    assert tv_of_joint(cond / k) == pytest.approx(rho, abs=1e-12)
    # independence: 0; rows with zero probability are ignored
    assert tv_of_joint(np.outer([0.2, 0.8, 0.0], [0.5, 0.5])) == pytest.approx(0.0, abs=1e-15)


def _sample(joint: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    v, s = joint.shape
    flat = rng.choice(v * s, size=n, p=joint.ravel())
    return flat // s, flat % s


def test_estimator_error_within_c2_bound_on_synthetic_law():
    """200 samples of n = 2000 from a fixed 3 x 4 law (each value has probability >= 0.25):
    |T̂V − TV| exceeds e(β = 0.05) in at most 5% of them (Assumption 3.8 with our c2, γ = 1/2);
    e(β) <= c2 sqrt(ln(1/β)) / sqrt(n); and the estimator is consistent (mean error < 0.03)."""
    rng = np.random.default_rng(3)
    cond = rng.dirichlet(np.ones(4), size=3)
    joint = np.array([0.25, 0.35, 0.40])[:, None] * cond
    truth = tv_of_joint(joint)
    n, beta, pi = 2000, 0.05, 0.25
    bound = estimation_error_bound(n, 3, 4, pi, beta)
    c2 = math.sqrt(2 * (4 * math.log(2) + math.log(2 * 3) + 1) / (pi / 2))  # the docstring's c2
    assert TVConstants.of(3, 4, pi).c2 == pytest.approx(c2)
    assert bound <= c2 * math.sqrt(math.log(1 / beta)) / math.sqrt(n)
    errors = np.array([abs(empirical_tv(*_sample(joint, n, rng), 3, 4, pi) - truth) for _ in range(200)])
    assert np.mean(errors > bound) <= beta
    assert errors.mean() < 0.03
    assert n >= min_records(3, pi, beta)


def test_estimator_sensitivity_c3_over_n_exhaustive():
    """Every single-record replacement of 300 random small tables (n = 10, 3 values, 2 cells,
    π_min = 0.3, so ν n = 1.5 straddles the counts) moves T̂V by at most c3/n = 4/(π_min n);
    the largest move found is within a factor 3 of the bound (the bound is not vacuous)."""
    rng = np.random.default_rng(0)
    n, v, s, pi = 10, 3, 2, 0.3
    c3 = TVConstants.of(v, s, pi).c3
    assert c3 == pytest.approx(4 / pi)
    worst = 0.0
    for _ in range(300):
        col, sens = rng.integers(0, v, n), rng.integers(0, s, n)
        base = empirical_tv(col, sens, v, s, pi)
        for i in range(n):
            for a in range(v):
                for b in range(s):
                    c2, s2 = col.copy(), sens.copy()
                    c2[i], s2[i] = a, b
                    worst = max(worst, abs(empirical_tv(c2, s2, v, s, pi) - base) * n / c3)
    assert worst <= 1.0 + 1e-12
    assert worst > 1 / 3


def test_estimator_sensitivity_randomized_larger_tables():
    rng = np.random.default_rng(1)
    n, v, s, pi = 200, 5, 6, 0.1
    c3 = TVConstants.of(v, s, pi).c3
    worst = 0.0
    for _ in range(300):
        col = rng.choice(v, size=n, p=[0.5, 0.2, 0.15, 0.1, 0.05])  # rare values near ν n
        sens = rng.integers(0, s, n)
        base = empirical_tv(col, sens, v, s, pi)
        i = rng.integers(n)
        col[i], sens[i] = rng.integers(v), rng.integers(s)
        worst = max(worst, abs(empirical_tv(col, sens, v, s, pi) - base) * n / c3)
    assert worst <= 1.0 + 1e-12


def test_inflation_def_3_10_and_its_conditions():
    est = inflate("u", 0.2, 100_000, 2, 4, 0.4, 1e-5, 3)
    k = TVConstants.of(2, 4, 0.4)
    c2 = math.sqrt(2 * (4 * math.log(2) + math.log(4) + 1) / 0.2)
    expected = 2 * c2 * math.sqrt(math.log(3 / 1e-5)) / math.sqrt(100_000)
    assert est.bound_valid and est.inflation == pytest.approx(expected)
    assert est.tv_tilde == pytest.approx(min(1.0, 0.2 + expected))
    assert k.gamma == 0.5 and k.c3 == pytest.approx(2 / 0.2)
    # clipped to 1
    assert inflate("u", 0.9, 100_000, 2, 4, 0.4, 1e-5, 3).tv_tilde == 1.0
    # too few records for the Hoeffding event: TV falls back to 1 and says why
    small = inflate("u", 0.1, 50, 2, 4, 0.4, 1e-5, 3)
    assert small.tv_tilde == 1.0 and not small.bound_valid and "records" in small.note
    with pytest.raises(ValueError, match=r"min_value_prob=0.6: must be in \(0, 1/2\]"):
        inflate("u", 0.1, 100, 2, 4, 0.6, 1e-5, 3)


def test_estimate_tvs_on_synthetic_data_recovers_closed_form():
    rho = [0.0, 0.4, 0.9]
    data = correlated_features(40_000, 2, 3, rho, seed=5)
    bins = data.bins()
    sens = {data.names[c]: data.x[:, c] for c in data.sensitive}
    ins = {data.names[c]: data.x[:, c] for c in data.insensitive}
    est = estimate_tvs(sens, ins, bins, min_value_prob=0.45, delta=1e-3)
    for name, r in zip(ins, rho, strict=True):
        e = estimation_error_bound(40_000, 2, 4, 0.45, 1e-3 / 3)
        assert abs(est[name].tv_hat - r) <= e, (name, est[name].tv_hat, r)
        assert abs(est[name].tv_hat - r) < 0.03
        assert est[name].bound_valid and est[name].tv_tilde >= r
    with pytest.raises(ValueError, match="column 's0' is declared both sensitive and insensitive"):
        estimate_tvs(sens, {"s0": data.x[:, 0]}, bins, 0.45, 1e-3)
    with pytest.raises(ValueError, match=r"no declared bins for columns \['u0'\]"):
        estimate_tvs(sens, ins, {k: v for k, v in bins.items() if k != "u0"}, 0.45, 1e-3)


def test_bins_and_joint_codes():
    b = Bins(edges=(0.0, 1.0))
    assert b.size == 3 and b.codes([-1.0, 0.0, 0.5, 1.0, 7.0]).tolist() == [0, 1, 1, 2, 2]
    c = Bins(categories=("walk", "run"))
    assert c.codes(["run", "walk"]).tolist() == [1, 0]
    with pytest.raises(ValueError, match="mode: value 'swim' is not a declared category"):
        c.codes(["swim"], "mode")
    with pytest.raises(ValueError, match="strictly increasing"):
        Bins(edges=(1.0, 0.0))
    joint, cells = joint_codes([np.array([0, 1, 2]), np.array([1, 0, 1])], [3, 2])
    assert cells == 6 and joint.tolist() == [1, 2, 5]


# ----------------------------------------------------------------------------- synthetic data


def test_synthetic_bounds_and_closed_form_tv():
    data = correlated_features(20_000, 3, 4, [0.0, 0.25, 0.5, 1.0], seed=2, num_classes=3)
    assert data.x.shape == (20_000, 7) and set(np.unique(data.y)) == {0, 1, 2}
    assert np.abs(data.x).max() <= data.bound and np.linalg.norm(data.x, axis=1).max() <= 1.0 + 1e-12
    # independent check of TV(j) = rho_j: P(s_l = + | x_j > 0) - P(s_l = + | x_j < 0)
    for j, col in enumerate(data.insensitive):
        s = data.x[:, data.linked[j]] > 0
        pos = data.x[:, col] > 0
        diff = s[pos].mean() - s[~pos].mean()
        assert diff == pytest.approx(data.tv[j], abs=0.03)
    roles = data.roles()
    assert roles.tv == {"u0": 0.0, "u1": 0.25, "u2": 0.5, "u3": 1.0}
    with pytest.raises(ValueError, match=r"rho of insensitive column u1: 1.2 must be in \[0, 1\]"):
        correlated_features(10, 1, 2, [0.1, 1.2])


# ----------------------------------------------------------------------------- Laplace


def test_discrete_laplace_sampler_is_exact():
    """400k draws with t = 3 against P(Z = z) = (1 − e^{-1/3})/(1 + e^{-1/3}) e^{-|z|/3}:
    chi-square goodness of fit over |z| <= 10 and the two tails, p > 1e-4."""
    t = 3
    z = discrete_laplace(OSBits(), t, 400_000)
    a = math.exp(-1 / t)
    support = np.arange(-10, 11)
    pmf = (1 - a) / (1 + a) * a ** np.abs(support)
    tail = (1 - pmf.sum()) / 2
    observed = [np.sum(z < -10), *[np.sum(z == k) for k in support], np.sum(z > 10)]
    expected = np.array([tail, *pmf, tail]) * len(z)
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def _roles_and_sensitivities() -> tuple[FeatureRoles, np.ndarray]:
    roles = FeatureRoles(4, (0,), (InsensitiveFeature("a", (1,), 0.5), InsensitiveFeature("b", (2,), 0.0),
                                   InsensitiveFeature("c", (3,), 1.0)))  # fmt: skip
    return roles, np.array([1.0, 2.0, 3.0, 0.5])


def test_correlated_sensitivity_def_2_7_by_hand():
    roles, d = _roles_and_sensitivities()
    # Σ_S + Σ_U TV Δf = 1 + 0.5·2 + 0·3 + 1·0.5 = 2.5; relation Δf = max(1, 2, 3, 0.5) = 3
    assert correlated_sensitivity(d, roles) == pytest.approx(2.5)
    assert relation_sensitivity(d, roles) == pytest.approx(3.0)
    assert minimal_correlated_sensitivity(d, roles) == pytest.approx(1.0)  # max(1, 0.5·2, 0, 1·0.5)
    assert standard_sensitivity(d) == pytest.approx(6.5)
    # two disjoint groups: the max over rows; not disjoint: the sum
    table = np.stack([d, 2 * d])
    assert correlated_sensitivity(table, roles) == pytest.approx(5.0)
    assert correlated_sensitivity(table, roles, disjoint_groups=False) == pytest.approx(7.5)
    # all TV = 1 and many columns: Δf of the relation is the smaller term
    roles1 = roles.with_tv({"a": 1.0, "b": 1.0})
    assert correlated_sensitivity(d, roles1) == pytest.approx(3.0)


def test_group_means_and_their_sensitivity_by_brute_force():
    rng = np.random.default_rng(4)
    x = rng.uniform(-2, 2, size=(30, 3))
    g = rng.integers(0, 4, 30)
    lo, hi = np.array([-1.0, 0.0, -2.0]), np.array([1.0, 1.0, 2.0])
    means, sens = group_feature_means(x, g, 5, lo, hi)
    counts = np.bincount(g, minlength=5)
    assert sens[4].tolist() == [0.0, 0.0, 0.0] and means[4].tolist() == [0.0, 0.5, 0.0]  # empty group
    for i in range(30):
        for k in range(3):
            for value in (lo[k] - 5, hi[k] + 5):  # extremes, clamped
                x2 = x.copy()
                x2[i, k] = value
                m2, _ = group_feature_means(x2, g, 5, lo, hi)
                moved = np.abs(m2 - means)
                assert moved.max() <= sens[g[i], k] + 1e-12
                assert moved[g[i], k] <= (hi[k] - lo[k]) / counts[g[i]] + 1e-12
                assert np.count_nonzero(moved > 1e-15) <= 1  # Def. 2.8: one coordinate per feature


def _chi2_scale_matches(noise: np.ndarray, scale: float, alpha: float = 1e-6) -> bool:
    """Two-sided test of H0: |Y| ~ Exp(scale) (Laplace scale b): 2 Σ|Y| / b ~ χ²(2n)."""
    n = noise.size
    stat = 2.0 * float(np.abs(noise).sum()) / scale
    return stats.chi2.ppf(alpha / 2, 2 * n) <= stat <= stats.chi2.ppf(1 - alpha / 2, 2 * n)


def test_corrdp_laplace_scale_accepts_right_rejects_wrong():
    """40k noise draws of the released per-group means: accept b = Δ_C f / ε, reject b·2/3 and
    b·3/2 (chi-square on Σ|Y|, α = 1e-6). The scale used is Δ_C f/ε up to the grid slack."""
    roles, d = _roles_and_sensitivities()
    values = np.zeros((50, 4))
    coord = np.tile(d, (50, 1)) / 10
    eps = 0.7
    releases = [corrdp_laplace(values, coord, roles, eps, OSBits()) for _ in range(200)]
    b = correlated_sensitivity(coord, roles) / eps
    assert releases[0].scale == pytest.approx(b, rel=1e-6) and releases[0].scale >= b
    assert releases[0].relation == "corrdp"
    noise = np.concatenate([r.values.ravel() for r in releases])
    assert _chi2_scale_matches(noise, b)
    assert not _chi2_scale_matches(noise, b * 2 / 3)
    assert not _chi2_scale_matches(noise, b * 3 / 2)
    std = standard_laplace(values, coord, eps, OSBits())
    assert std.relation == "dp" and std.scale == pytest.approx(standard_sensitivity(coord) / eps, rel=1e-6)


def test_theorem_2_9_linf_accuracy():
    """4000 statistics of K = 10 coordinates (rows of one release over disjoint groups, so each
    row has the scale of a single-row release): the rate of ‖noise‖_∞ > b ln(K/β) (β = 0.2) is
    ≤ β (one-sided binomial, α = 1e-4) and matches the exact 1 − (1 − β/K)^K (two-sided, p > 1e-4);
    with the noise scaled by 3/2 the bound fails (rate > β)."""
    beta, reps = 0.2, 4000
    roles10 = FeatureRoles(10, (0, 1), tuple(InsensitiveFeature(f"u{k}", (k,), 0.3) for k in range(2, 10)))
    row = np.linspace(0.1, 1.0, 10)
    single = corrdp_laplace(np.zeros(10), row, roles10, 1.0, OSBits())
    values = np.full((reps, 10), 0.25)
    rel = corrdp_laplace(values, np.tile(row, (reps, 1)), roles10, 1.0, OSBits())
    assert rel.scale == single.scale
    bound = linf_bound(rel.scale, 10, beta)
    assert bound == pytest.approx(rel.scale * math.log(10 / beta))
    sup = np.abs(rel.values - values).max(axis=1)
    hits = int(np.sum(sup > bound))
    exact = 1 - (1 - beta / 10) ** 10
    assert stats.binomtest(hits, reps, beta, alternative="greater").pvalue > 1e-4
    assert stats.binomtest(hits, reps, exact).pvalue > 1e-4
    assert np.mean(1.5 * sup > bound) > beta


def test_laplace_privacy_loss_per_class_and_grid_outputs():
    """The proof of Theorem 2.9, checked numerically: for every class of CorrDP neighbour the
    ℓ1 move of per-group means (with the grid slack) over the scale is ≤ ε (sensitive) and
    ≤ ε/TV(j) (feature j). Outputs are grid points whatever the input (no Mironov holes)."""
    roles, _ = _roles_and_sensitivities()
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=(40, 4))
    g = rng.integers(0, 3, 40)
    lo, hi = -np.ones(4), np.ones(4)
    means, coord = group_feature_means(x, g, 3, lo, hi)
    eps = 0.5
    rel = corrdp_laplace(means, coord, roles, eps, SeededEntropy(1).noise(0, 0))
    slack = coord + rel.grid * (coord > 0)
    for row in range(3):
        sens_move = slack[row, 0]
        assert sens_move / rel.scale <= eps + 1e-12
        for f in roles.insensitive:
            move = slack[row, list(f.columns)].sum()
            if f.tv > 0:
                assert move / rel.scale <= eps / f.tv + 1e-12
    steps = rel.values / rel.grid
    assert np.array_equal(steps, np.round(steps))
    shifted = corrdp_laplace(means + rel.grid / 3, coord, roles, eps, SeededEntropy(1).noise(0, 0))
    moved = (shifted.values - rel.values) / rel.grid  # same noise: only the rounding of the input
    assert set(np.unique(moved)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match=r"epsilon=0.0: must be finite and > 0"):
        corrdp_laplace(means, coord, roles, 0.0, OSBits())
    with pytest.raises(ValueError, match="differ in shape"):
        corrdp_laplace(means[:2], coord, roles, 1.0, OSBits())
