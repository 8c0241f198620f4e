"""The default budget of ``private-statistics = "estimate"`` (issue 30, point 1): a share of
the run's target that grows with the number of estimated columns, costing training little;
the thresholded histogram's ε checked by brute force on what it releases.

Independent references: the analytic Gaussian's ε (closed form, ``tests.references``) for
the estimates' own budget; the exact hockey-stick divergence of the released key set
(computed here with scipy's normal cdf) for the thresholded histogram's δ claim; the
budget's formula written out here. The σ ratio is a property of the default (at most 5 %
above the all-declared run), not a value computed by the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedfdp.accounting.events import ThresholdedHistogram
from fedfdp.config import ConfigError, DataConfig, PrivateStatistics, load_config
from fedfdp.data.split import DataError
from tests.mechanism_helpers import resolve
from tests.references import gaussian_delta_ref, gaussian_eps_ref

COLUMNS = ("a", "b", "c", "d", "e", "f", "g", "h")


def _keys(k: int, **extra: object) -> dict[str, object]:
    return {"dataset": "csv", "data-path": "unused.csv", "public-columns": "x", "label-column": "y",
            "private-columns": ",".join(COLUMNS[:k]), "clipping-quantile": 0, **extra}


def _declared(k: int) -> str:
    return ",".join(f"{c}=0:1" for c in COLUMNS[:k])


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("target", [0.5, 1.0, 4.0])
def test_the_default_budget_is_a_share_of_the_target_growing_like_the_root_of_the_columns(k, target):
    """min(0.2, 0.1·√k) of the target (written out here); an explicit estimation-epsilon wins."""
    from fedfdp.data.private_statistics import estimation_budget

    cfg = load_config(_keys(k, **{"private-statistics": "estimate", "target-epsilon": target})).data
    assert cfg.estimation_epsilon is None  # "auto"
    assert estimation_budget(cfg) == pytest.approx(min(0.2, 0.1 * math.sqrt(k)) * target, rel=1e-12)
    explicit = load_config(_keys(k, **{"private-statistics": "estimate", "target-epsilon": target,
                                       "estimation-epsilon": 0.37})).data
    assert estimation_budget(explicit) == 0.37


def test_the_reference_is_the_target_else_the_cap_else_the_default_target():
    """σ calibrated: its target (2.0 by default); σ given: max-epsilon, else 2.0."""
    from fedfdp.data.private_statistics import estimation_budget

    est = {"private-statistics": "estimate"}
    assert estimation_budget(load_config(_keys(4, **est)).data) == pytest.approx(0.4)
    given = {**est, "noise-multiplier": 1.0}
    capped = load_config(_keys(4, **given, **{"max-epsilon": 3.0})).data
    assert estimation_budget(capped) == pytest.approx(0.6)
    assert estimation_budget(load_config(_keys(4, **given)).data) == pytest.approx(0.4)


def test_an_automatic_budget_outside_a_configuration_is_refused_not_guessed():
    """A data section built alone has no run to take a share of: the noise released and the
    ε charged must come from the same numbers."""
    from fedfdp.data.private_statistics import estimation_budget, estimation_events

    alone = DataConfig(dataset="csv", data_path="t.csv", public_columns=("x",), label_column="y",
                       private_columns=("a",), private_statistics=PrivateStatistics.ESTIMATE)
    assert alone.estimation_reference is None
    with pytest.raises(DataError, match="estimation-epsilon='auto'"):
        estimation_budget(alone)
    with pytest.raises(DataError, match="estimation-epsilon='auto'"):
        estimation_events(alone, 1000)
    with pytest.raises(ConfigError, match="estimation reference epsilon"):
        from fedfdp.config.estimation import EstimationReference

        EstimationReference(-1.0)


@pytest.mark.parametrize("k,target,n", [(4, 1.0, 12_422), (1, 0.5, 2_000), (8, 2.0, 30_000)])
def test_the_estimates_alone_cost_their_budget_at_the_runs_delta(k, target, n):
    """k histograms of noise σ_e compose to a Gaussian of μ = √k/σ_e; its ε at δ minus the
    thresholds' δ (the analytic Gaussian, closed form) is at most the budget and within the
    calibration's tolerance of it."""
    m = resolve(load_config(_keys(k, **{"private-statistics": "estimate", "target-epsilon": target})), n)
    assert len(m.estimates) == k
    ev = m.estimates[0].event
    assert isinstance(ev, ThresholdedHistogram)
    cost = k * -math.log1p(-ev.threshold_delta)
    assert cost == pytest.approx(0.1 * m.delta, rel=1e-4)  # the thresholds: a tenth of the run's δ
    own = gaussian_eps_ref(math.sqrt(k) / ev.noise_multiplier, m.delta - cost)
    budget = min(0.2, 0.1 * math.sqrt(k)) * target
    assert budget * 0.97 <= own <= budget + 1e-9


def test_the_thresholds_delta_comes_from_the_runs_delta():
    """With an explicit δ far below 1/(2N) the thresholds take a tenth of that δ (before,
    a tenth of 1/(2N), more than the whole δ: the run could not be calibrated)."""
    m = resolve(load_config(_keys(4, **{"private-statistics": "estimate", "target-epsilon": 1.0,
                                        "delta": 1e-8})), 12_422)
    ev = m.estimates[0].event
    assert isinstance(ev, ThresholdedHistogram)
    assert m.delta == 1e-8 and ev.threshold_delta == pytest.approx(1e-8 * 0.1 / 4)
    own = gaussian_eps_ref(2.0 / ev.noise_multiplier, 1e-8 - 4 * -math.log1p(-ev.threshold_delta))
    assert own <= 0.2 + 1e-9


def _sigma_ratio(k: int, target: float, n: int, **extra: object) -> float:
    declared = resolve(load_config(_keys(k, **{"private-ranges": _declared(k), "target-epsilon": target},
                                       **extra)), n)
    estimated = resolve(load_config(_keys(k, **{"private-statistics": "estimate", "target-epsilon": target},
                                        **extra)), n)
    assert declared.noise_multiplier is not None and estimated.noise_multiplier is not None
    return estimated.noise_multiplier / declared.noise_multiplier


def test_at_target_one_four_estimated_columns_raise_training_sigma_by_at_most_five_percent():
    """The issue's case: ε = 1, four estimated columns, 12,422 records, the default fdp
    rounds and rate: σ at most 5 % above the all-declared run (the old fixed 0.5: +18 %)."""
    ratio = _sigma_ratio(4, 1.0, 12_422)
    assert 1.0 < ratio <= 1.05
    old = _sigma_ratio(4, 1.0, 12_422, **{"estimation-epsilon": 0.5})
    assert old > 1.15


@pytest.mark.slow
@pytest.mark.parametrize("target", [0.5, 2.0, 8.0])
@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("n", [2_000, 30_000])
def test_the_default_budget_costs_training_at_most_five_percent_of_sigma(target, k, n):
    """Over targets, column counts and table sizes (the default 150 rounds at q = 0.05)."""
    assert _sigma_ratio(k, target, n) <= 1.05


def test_secure_aggregation_takes_the_same_default_share():
    """Under aggregation = "secagg" the default budget is the same share, and σ stays within
    5 % of the all-declared secagg run."""
    secagg = {"aggregation": "secagg", "secagg-min-survivors": 3, "num-rounds": 60}
    declared = resolve(load_config(_keys(4, **{"private-ranges": _declared(4), "target-epsilon": 1.0},
                                         **secagg)), 12_000, devices=4)
    estimated = resolve(load_config(_keys(4, **{"private-statistics": "estimate", "target-epsilon": 1.0},
                                          **secagg)), 12_000, devices=4)
    assert declared.noise_multiplier is not None and estimated.noise_multiplier is not None
    assert 1.0 < estimated.noise_multiplier / declared.noise_multiplier <= 1.05


# ----------------------------------------------------------------- the thresholded histogram, brute force


def _released_key_delta(m: int, sigma: float, tau: float, eps: float) -> float:
    """Exact δ(ε) of the released key set (released or not: a Bernoulli) between a value
    held by m records and by m − 1 (m = 1: absent, never released), in the direction
    D (m) vs D' (m − 1): the sum of the positive parts of P − e^ε Q over both outcomes."""
    p1 = stats.norm.sf((tau - m) / sigma)
    p0 = stats.norm.sf((tau - (m - 1)) / sigma) if m > 1 else 0.0
    return max(0.0, p1 - math.exp(eps) * p0) + max(0.0, (1 - p1) - math.exp(eps) * (1 - p0))


@pytest.mark.parametrize("sigma,delta_t", [(4.0, 1e-3), (12.8, 1e-6), (29.3, 1e-6)])
def test_the_released_categories_are_within_the_events_bound_for_every_count(sigma, delta_t):
    """What a category estimate releases about one value is whether it clears τ. For every
    count m (1: the value's only record), both directions and a grid of ε, the exact δ(ε) of
    that release is at most the event's claim: the Gaussian part's δ(ε) (closed form, μ = 1/σ)
    plus −ln(1 − δ_t); at m = 1 it is δ_t exactly."""
    ev = ThresholdedHistogram(sigma, delta_t)
    tau = ev.threshold()
    assert _released_key_delta(1, sigma, tau, 0.0) == pytest.approx(delta_t, rel=1e-9)
    for eps in (0.0, 0.05, 0.2, 1.0):
        claim = gaussian_delta_ref(1.0 / sigma, eps) + ev.delta_cost
        for m in np.unique(np.linspace(1, tau + 6 * sigma, 200).astype(int)):
            forward = _released_key_delta(int(m), sigma, tau, eps)
            # the other direction: D' (m − 1) against D (m), complements swapped
            p1 = stats.norm.sf((tau - m) / sigma)
            p0 = stats.norm.sf((tau - (m - 1)) / sigma) if m > 1 else 0.0
            backward = max(0.0, p0 - math.exp(eps) * p1) + max(0.0, (1 - p0) - math.exp(eps) * (1 - p1))
            assert max(forward, backward) <= claim + 1e-12, (m, eps)
