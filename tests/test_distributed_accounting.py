"""Accounting of distributed discrete Gaussian noise (fedfdp.accounting.distributed).

Independent references: the central Gaussian's ε from the FDP accountant (route A's
limit as the scale grows); dp-accounting 0.6.0's RDP accountant for the Gaussian
case, to which the DDG bound reduces when its τ underflows (route B); and an exact
convolution of discrete Gaussian pmfs, computed here with numpy, against
``N_Z(0, nσ²)`` and against the smoothed Gaussian of Lemma 2 (computed here by
quadrature), for the two density-ratio lemmas route A rests on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import special

from fedfdp.accounting import epsilon_for
from fedfdp.accounting.distributed import (
    MAX_SLACK,
    MIN_LOCAL_SIGMA,
    ROUTE_B_ORDERS,
    DistributedDiscreteGaussian,
    ddg_rdp,
    ddg_tau,
    distributed_epsilon,
    honest_parties,
    local_noise_sigma,
    route_a_epsilon,
    route_b_epsilon,
    sensitivity,
    smoothing_divergence_bound,
    sum_divergence_bound,
    theta_excess,
)

dp_accounting = pytest.importorskip("dp_accounting")


def event(sigma: float, q: float, d: int = 10_000, n: int = 10, scale: float | None = None):
    """A round calibrated for ``n`` honest parties to central noise multiplier ``sigma``."""
    s = 1000.0 * math.sqrt(d) if scale is None else scale
    return DistributedDiscreteGaussian(local_noise_sigma(sigma, s, d, n), n, s, d, q)


def dp_rdp_eps(sigma: float, q: float, rounds: int, delta: float, orders) -> float:
    """dp-accounting's RDP epsilon of ``rounds`` Poisson-subsampled Gaussians."""
    acc = dp_accounting.rdp.RdpAccountant(list(orders))
    ev = dp_accounting.GaussianDpEvent(sigma)
    if q < 1.0:
        ev = dp_accounting.PoissonSampledDpEvent(q, ev)
    acc.compose(ev, rounds)
    return float(acc.get_epsilon(delta))


# --------------------------------------------------------------------------------------
# route A
# --------------------------------------------------------------------------------------


def test_route_a_tends_to_the_central_gaussian() -> None:
    """With σ_loc = σ(s+√d)/√n_h, route A's ε decreases to the central Gaussian's
    (FDP accountant, σ, q, T) and is within 1e-6 of it at s = 1e9."""
    sigma, q, rounds, delta, d, n = 1.3, 0.05, 100, 1e-5, 1000, 10
    central = epsilon_for(sigma, q, rounds, delta).upper
    eps = []
    for s in (10.0 * math.sqrt(d), 1e4, 1e9):
        ev = event(sigma, q, d, n, scale=s)
        eps.append(route_a_epsilon([(ev, rounds)], delta).upper)
    assert all(e >= central - 1e-9 for e in eps)
    assert eps[0] >= eps[1] >= eps[2]
    assert abs(eps[-1] - central) < 1e-6


def test_route_a_composes_rounds_with_different_survivors() -> None:
    """Rounds with 10, 9 and 8 honest parties: route A equals the FDP accountant's ε
    of the three σ_eff events (up to the 2Λ shift), and lies between the all-8 and
    all-10 runs."""
    d, s, q, delta = 1000, 1e5, 0.1, 1e-5
    sl = local_noise_sigma(1.0, s, d, 10)
    evs = [DistributedDiscreteGaussian(sl, n, s, d, q) for n in (10, 9, 8)]
    mixed = route_a_epsilon([(evs[0], 20), (evs[1], 20), (evs[2], 20)], delta).upper
    lo = route_a_epsilon([(evs[0], 60)], delta).upper
    hi = route_a_epsilon([(evs[2], 60)], delta).upper
    assert lo < mixed < hi
    assert evs[0].noise_multiplier > evs[1].noise_multiplier > evs[2].noise_multiplier


def test_route_a_replacement_is_the_central_replacement() -> None:
    """The density-ratio transfer holds for any relation: route A's replacement ε is
    the FDP accountant's replacement ε of σ_eff (Proposition 1), above add/remove."""
    ev = event(1.0, 0.05, d=100, scale=1e7)
    rep = route_a_epsilon([(ev, 50)], 1e-5, relation="replacement")
    ref = epsilon_for(ev.noise_multiplier, 0.05, 50, 1e-5, "replacement")
    assert rep.relation == "replacement"
    assert rep.upper == pytest.approx(ref.upper, abs=1e-9)
    assert rep.upper > route_a_epsilon([(ev, 50)], 1e-5).upper


@pytest.mark.parametrize("sigma", [0.7, 1.3, 2.1])
@pytest.mark.parametrize("q", [0.01, 0.1])
@pytest.mark.parametrize("rounds", [20, 150])
def test_route_a_below_route_b(sigma: float, q: float, rounds: int) -> None:
    for scale_factor in (10.0, 1000.0):
        d = 10_000
        ev = event(sigma, q, d, 10, scale=scale_factor * math.sqrt(d))
        for delta in (1e-5, 1 / 6400):
            both = distributed_epsilon([(ev, rounds)], delta)
            assert both.route_a.upper <= both.route_b
            assert both.epsilon == both.route_a.upper


# --------------------------------------------------------------------------------------
# route B
# --------------------------------------------------------------------------------------


def _gaussian_equivalent(ev: DistributedDiscreteGaussian) -> float:
    """σ of the Gaussian the DDG bound reduces to when τ = 0: √n_h σ_loc / Δ."""
    return math.sqrt(ev.honest_parties) * ev.local_sigma / ev.sensitivity


@pytest.mark.parametrize("sigma, rounds", [(0.8, 50), (2.0, 500)])
def test_route_b_without_subsampling_is_dp_accountings_gaussian_rdp(sigma: float, rounds: int) -> None:
    """q = 1 and σ_loc >= 4 (τ·d < 1e-50): DDG's bound is the Gaussian's α/(2σ²) and
    route B equals dp-accounting's RDP ε on the same orders."""
    ev = event(sigma, 1.0)
    assert ddg_tau(ev.local_sigma, ev.honest_parties) * ev.dimension < 1e-50
    ref = dp_rdp_eps(_gaussian_equivalent(ev), 1.0, rounds, 1e-5, ROUTE_B_ORDERS)
    assert route_b_epsilon([(ev, rounds)], 1e-5) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("sigma, q, rounds", [(0.9, 0.05, 150), (1.5, 0.2, 40)])
def test_route_b_subsampled_against_dp_accounting(sigma: float, q: float, rounds: int) -> None:
    """At order 2 Zhu & Wang's general bound equals the exact subsampled-Gaussian
    moment, so route B restricted to α = 2 equals dp-accounting's; over all orders it
    is above dp-accounting's exact (tight) subsampled-Gaussian RDP ε, but within 60%."""
    ev = event(sigma, q)
    g = _gaussian_equivalent(ev)
    assert route_b_epsilon([(ev, rounds)], 1e-5, orders=[2]) == pytest.approx(
        dp_rdp_eps(g, q, rounds, 1e-5, [2]), rel=1e-9
    )
    ref = dp_rdp_eps(g, q, rounds, 1e-5, ROUTE_B_ORDERS)
    got = route_b_epsilon([(ev, rounds)], 1e-5)
    assert ref - 1e-9 <= got <= 1.6 * ref


def test_ddg_rdp_reduces_to_the_gaussian_only_when_tau_vanishes() -> None:
    """Prop. 14 per round: at σ_loc = 4 (τ ~ 1e-67) it is the Gaussian's α Δ²/(2nσ²);
    at σ_loc = 0.6 (τ ~ 0.1) the τ terms make it visibly larger."""
    d, n, l2 = 1000, 50, 40.0 + math.sqrt(1000)
    orders = np.arange(2, 40)
    for sigma, larger in ((4.0, False), (0.6, True)):
        got = ddg_rdp(orders, sigma, n, l2, d)
        gauss = orders * l2**2 / (2 * n * sigma**2)
        if larger:
            assert np.all(got > gauss * (1 + 1e-3))
        else:
            np.testing.assert_allclose(got, gauss, rtol=1e-12)
    with pytest.raises(ValueError, match="local_sigma=0.4"):
        ddg_rdp(orders, 0.4, n, l2, d)


# --------------------------------------------------------------------------------------
# refusals and calibration
# --------------------------------------------------------------------------------------


def test_small_local_sigma_refused() -> None:
    with pytest.raises(ValueError, match=r"local_sigma=0\.5"):
        DistributedDiscreteGaussian(0.5, 10, 1000.0, 100, 0.05)
    with pytest.raises(ValueError, match="local_sigma=3.99"):
        DistributedDiscreteGaussian(3.99, 10, 1000.0, 100, 0.05)
    DistributedDiscreteGaussian(MIN_LOCAL_SIGMA, 10, 1000.0, 100, 0.05)


def test_no_honest_party_refused() -> None:
    with pytest.raises(ValueError, match="n_h=0"):
        honest_parties(3, 3)
    with pytest.raises(ValueError, match="n_h=0"):
        DistributedDiscreteGaussian(10.0, 0, 1000.0, 100, 0.05)
    with pytest.raises(ValueError, match="n_h=0"):
        local_noise_sigma(1.0, 1000.0, 100, 5, 5)
    assert honest_parties(7, 2) == 5


def test_large_slack_refused() -> None:
    # t = 1: ln((1+η)/(1-η)) ≈ 1.07e-8 per coordinate, d = 1000 -> Λ ≈ 1e-5
    with pytest.raises(ValueError, match="slack"):
        DistributedDiscreteGaussian(10.0, 10, 1000.0, 1000, 0.05, smoothing=1.0)
    # each round just below the cap, the run above it
    ev = DistributedDiscreteGaussian(10.0, 10, 1000.0, 40, 0.05, smoothing=1.3)
    assert ev.slack < MAX_SLACK < 100 * ev.slack
    with pytest.raises(ValueError, match="total slack"):
        route_a_epsilon([(ev, 100)], 1e-5)


def test_smoothing_must_leave_variance() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        DistributedDiscreteGaussian(4.0, 1, 1000.0, 10, 0.05, smoothing=4.0)


def test_local_sigma_calibration() -> None:
    """σ_loc = σ(s+√d)/√(n_min - t_c): with n_h = n_min - t_c the smoothed round's σ_eff
    is σ up to the t² term: relative 1 - √(1 - t²/(σΔ)²) ≈ 2/(σΔ)² at t = 2."""
    sigma, s, d, n_min, t_c = 1.1, 2.0**17, 10_000, 12, 2
    sl = local_noise_sigma(sigma, s, d, n_min, t_c)
    assert sl == pytest.approx(sigma * (s + 100.0) / math.sqrt(10), rel=1e-15)
    ev = DistributedDiscreteGaussian(sl, n_min - t_c, s, d, 0.1)
    assert ev.sensitivity == sensitivity(s, d) == s + 100.0
    assert 1 - ev.noise_multiplier / sigma == pytest.approx(2.0 / (sigma * ev.sensitivity) ** 2, rel=1e-4)


def test_event_serialises() -> None:
    ev = event(1.0, 0.05)
    d = ev.to_dict()
    assert d["kind"] == "distributed-discrete-gaussian"
    assert DistributedDiscreteGaussian(**{k: v for k, v in d.items() if k != "kind"}) == ev


# --------------------------------------------------------------------------------------
# the lemmas, against exact numerics
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", [0.2, 0.5, 1.0, 4.0])
def test_theta_excess_is_the_poisson_summation_bound(v: float) -> None:
    """``Σ_k exp(-(k-c)²/(2v)) / √(2πv)`` stays within ``1 ± η(v)`` for every c, and
    reaches ``1 + η(v)`` at c = 0 (to first order): direct summation here."""
    k = np.arange(-200, 201, dtype=np.float64)
    cs = np.linspace(0.0, 1.0, 101)
    vals = np.array([np.exp(-((k - c) ** 2) / (2 * v)).sum() for c in cs]) / math.sqrt(2 * math.pi * v)
    eta = theta_excess(v)
    assert np.all(np.abs(vals - 1.0) <= eta * (1 + 1e-9) + 1e-15)
    if eta > 1e-12:
        assert vals[0] - 1.0 > 0.99 * eta


def _dg_log_pmf(var: float, x: np.ndarray) -> np.ndarray:
    """log N_Z(0, var)(x) by normalised summation over |y| <= 40√var + 10."""
    half = math.ceil(40 * math.sqrt(var)) + 10
    y = np.arange(-half, half + 1, dtype=np.float64)
    log_norm = special.logsumexp(-(y * y) / (2 * var))
    return -(x * x) / (2 * var) - log_norm


def _sum_pmf(sigma: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact pmf of the sum of n N_Z(0, σ²) on its support, by repeated convolution of
    the pmf truncated to |x| <= 40σ + 10 (each truncated mass < e^-800: nothing in
    float64). All terms are positive, so the relative error is a few n·u."""
    half = math.ceil(40 * sigma) + 10
    x = np.arange(-half, half + 1, dtype=np.float64)
    p = np.exp(_dg_log_pmf(sigma * sigma, x))
    out = p
    for _ in range(n - 1):
        out = np.convolve(out, p)
    support = np.arange(-(n * half), n * half + 1, dtype=np.float64)
    return support, out


def _smoothed_log_pmf(var: float, t: float, x: np.ndarray) -> np.ndarray:
    """log P[N_Z(G, t²) = x] with G ~ N(0, var - t²): trapezoid quadrature over G of
    ``φ(G) ρ_t(x - G) / θ_t(G)``, ``θ_t(g) = Σ_k exp(-(k - g)²/(2t²))`` summed directly
    (exponentially accurate for these analytic integrands at step w/16)."""
    s = math.sqrt(var - t * t)
    w = s * t / math.sqrt(var)
    reach = float(np.abs(x).max()) + 14 * max(s, t)
    g = np.arange(-reach, reach + w / 32, w / 16)
    kk = np.arange(-math.ceil(reach + 12 * t) - 1, math.ceil(reach + 12 * t) + 2, dtype=np.float64)
    log_theta = np.array([special.logsumexp(-((kk - gi) ** 2) / (2 * t * t)) for gi in g])
    base = -(g * g) / (2 * s * s) - math.log(math.sqrt(2 * math.pi) * s) - log_theta
    out = np.empty(x.size)
    for i, xi in enumerate(x):
        out[i] = special.logsumexp(base - (xi - g) ** 2 / (2 * t * t)) + math.log(w / 16)
    return out


#: The smoothing parameter per σ_loc in the check (σ_loc = 4 uses the default t = 2).
SMOOTH_T = {1.0: 0.7, 2.0: 1.0, 4.0: 2.0}


@pytest.mark.parametrize("sigma", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("n", [2, 5, 10])
def test_exact_convolution_against_both_lemmas(sigma: float, n: int) -> None:
    """On |x| <= 8σ√n (pmf >= e^-32):

    * Lemma 1: |log(P_sum / N_Z(0, nσ²))| <= τ_n(σ) (:func:`sum_divergence_bound`),
      and also <= DDG's τ;
    * Lemmas 1 + 2: |log(P_sum / P_smoothed)| <= τ_n(σ) + ln((1+η(t²))/(1-η(t²))).

    Tolerance: 1e-11 absolute on the log ratios (float64 convolution and quadrature).
    At σ = 1 the bounds are ~2e-4: sharp within a factor 2 for n = 2, loose for more
    parties (the measured gap falls to ~1e-6); at σ >= 2 they are below 1e-8 and the
    check shows agreement to the tolerance.
    """
    support, p_sum = _sum_pmf(sigma, n)
    keep = np.abs(support) <= 8 * sigma * math.sqrt(n)
    x = support[keep]
    log_sum = np.log(p_sum[keep])
    var = n * sigma * sigma
    tau = sum_divergence_bound(sigma, n)
    gap_dg = float(np.abs(log_sum - _dg_log_pmf(var, x)).max())
    assert gap_dg <= tau + 1e-11
    assert gap_dg <= ddg_tau(sigma, n) + 1e-11
    if sigma == 1.0 and n == 2:
        assert gap_dg > tau / 3  # sharp for two parties; further convolutions smooth the gap
    t = SMOOTH_T[sigma]
    gap_sm = float(np.abs(log_sum - _smoothed_log_pmf(var, t, x)).max())
    assert gap_sm <= tau + smoothing_divergence_bound(t) + 1e-11


def test_sum_bound_properties() -> None:
    assert sum_divergence_bound(3.0, 1) == 0.0
    for sigma in (0.5, 1.0, 2.0):
        for n in (2, 10, 100):
            assert sum_divergence_bound(sigma, n) <= ddg_tau(sigma, n)
    assert sum_divergence_bound(1.0, 10) > sum_divergence_bound(1.0, 2) > sum_divergence_bound(2.0, 2)
    assert sum_divergence_bound(0.2, 2) == math.inf
    assert smoothing_divergence_bound(2.0) == pytest.approx(4 * math.exp(-8 * math.pi**2), rel=1e-6)


def test_the_event_is_part_of_the_vocabulary_and_its_accountant_follows_the_protocol():
    """The distributed round round-trips through the ledger's event parser, and its
    accountant composes, checks without mutating, and restores state like the others;
    its ε is route A's upper bound (never above route B's) and grows with rounds."""
    from fedfdp.accounting import event_from_dict
    from fedfdp.accounting.distributed import DistributedAccountant
    from fedfdp.accounting.protocol import Accountant

    ev = DistributedDiscreteGaussian(local_sigma=3.3e5, honest_parties=10, scale=2**19, dimension=10**5,
                                     sampling_rate=0.05)
    assert event_from_dict(ev.to_dict()) == ev
    acc = DistributedAccountant()
    assert isinstance(acc, Accountant)
    acc.compose(ev, 100)
    eps100 = acc.epsilon(1e-5)
    bound = acc.epsilon_bound(1e-5)
    assert bound.route_a.upper <= bound.route_b and eps100 == bound.epsilon
    assert not acc.would_exceed(ev, 50, max_epsilon=1e9, delta=1e-5) and acc.rounds == 100
    assert acc.would_exceed(ev, 50, max_epsilon=eps100, delta=1e-5)
    clone = DistributedAccountant()
    clone.load_state_dict(acc.state_dict())
    assert clone.epsilon(1e-5) == eps100
    acc.compose(ev, 50)
    assert acc.epsilon(1e-5) > eps100


def test_the_event_lives_in_the_vocabulary_and_the_accounts_re_export_its_maths():
    """The event is fedfdp.accounting.events', its lemmas discrete_gaussian_bounds'; the old
    import paths through fedfdp.accounting.distributed name the very same objects."""
    from fedfdp.accounting import discrete_gaussian_bounds as bounds
    from fedfdp.accounting import distributed, events

    assert DistributedDiscreteGaussian is events.DistributedDiscreteGaussian
    for name in ("MIN_LOCAL_SIGMA", "MAX_SLACK", "SMOOTHING", "sensitivity", "theta_excess",
                 "sum_divergence_bound", "smoothing_divergence_bound", "ddg_tau"):
        assert getattr(distributed, name) is getattr(bounds, name), name
    assert sensitivity(2.0**10, 10**4) == 2.0**10 + 100.0  # Δ = s + √d


def test_route_a_alone_is_the_accountant_a_target_is_calibrated_over():
    """route_b=False: ε is route A's upper bound (route B not computed, inf), never below
    the printed ε of the full accountant (the smaller of the two routes)."""
    from fedfdp.accounting.distributed import DistributedAccountant

    ev = DistributedDiscreteGaussian(local_sigma=3.3e5, honest_parties=10, scale=2**19, dimension=10**5,
                                     sampling_rate=0.05)
    both, route_a = DistributedAccountant(), DistributedAccountant(route_b=False)
    for acc in (both, route_a):
        acc.compose(ev, 150)
    alone = route_a.epsilon_bound(1e-5)
    assert alone.route_b == math.inf and route_a.epsilon(1e-5) == alone.route_a.upper
    assert alone.route_a == both.epsilon_bound(1e-5).route_a
    assert both.epsilon(1e-5) <= route_a.epsilon(1e-5)
    assert route_a.epsilon(1e-5) == route_a_epsilon([(ev, 150)], 1e-5).upper


# --------------------------------------------------------------------------------------
# estimates released before training (private-statistics = "estimate") under secure
# aggregation: their own events, composed with the rounds by both routes
# --------------------------------------------------------------------------------------


def _threshold_cost(events: list[tuple[Any, int]]) -> float:
    """Σ count·(−ln(1 − δ_t)), written out here from the event's definition."""
    from fedfdp.accounting.events import ThresholdedHistogram

    return sum(-math.log1p(-e.threshold_delta) * n for e, n in events if isinstance(e, ThresholdedHistogram))


def test_route_a_composes_estimates_with_the_rounds_as_dp_accountings_pld() -> None:
    """Four thresholded histograms (σ_e = 12) and 150 distributed rounds: route A's upper ε
    is the PLD composition (dp-accounting, an independent accountant) of the Gaussian parts
    and the smoothed rounds at δe^{−Λ} minus the thresholds' δ, plus 2Λ, within the
    accountant's eps_error (0.05) and above it (an upper bound)."""
    from fedfdp.accounting.events import ThresholdedHistogram

    pld = pytest.importorskip("dp_accounting.pld")
    rounds = event(1.1, 0.05)
    estimate = ThresholdedHistogram(12.0, 1e-7)
    charged: list[tuple[Any, int]] = [(estimate, 4), (rounds, 150)]
    delta = 1e-5
    lam = rounds.slack * 150
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(12.0), 4)
    smoothed = dp_accounting.GaussianDpEvent(rounds.noise_multiplier)
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.05, smoothed), 150)
    reference = acc.get_epsilon(delta * math.exp(-lam) - _threshold_cost(charged)) + 2 * lam
    got = route_a_epsilon(charged, delta).upper
    assert reference - 1e-3 <= got <= reference + 0.06
    alone = route_a_epsilon([(rounds, 150)], delta).upper
    assert got > alone + 0.01  # the estimates are in it


def test_route_b_of_estimates_is_gaussian_rdp_converted_at_delta_minus_the_thresholds() -> None:
    """Estimates alone (no subsampling): route B is dp-accounting's RDP of the Gaussian
    parts over the same orders, converted at δ − Σ −ln(1 − δ_t); with a δ the thresholds
    exhaust, no finite ε."""
    from fedfdp.accounting.events import ThresholdedHistogram

    estimate = ThresholdedHistogram(8.0, 2e-6)
    charged: list[tuple[Any, int]] = [(estimate, 3)]
    delta = 1e-4
    rdp = dp_accounting.rdp.RdpAccountant(list(ROUTE_B_ORDERS))
    rdp.compose(dp_accounting.GaussianDpEvent(8.0), 3)
    reference = float(rdp.get_epsilon(delta - _threshold_cost(charged)))
    assert route_b_epsilon(charged, delta) == pytest.approx(reference, rel=1e-9)
    assert route_b_epsilon(charged, 5e-6) == math.inf  # 3 thresholds take 6e-6 of it


def test_the_distributed_accountant_composes_estimates_and_restores_them() -> None:
    """The accountant takes thresholded histograms beside the rounds: its ε is the smaller
    of the two routes of everything composed, above the rounds alone, and it survives a
    state round trip; a CorrDP round is still refused."""
    from fedfdp.accounting.distributed import DistributedAccountant
    from fedfdp.accounting.events import CorrDPClass, CorrDPRound, ThresholdedHistogram

    estimate = ThresholdedHistogram(10.0, 1e-7)
    rounds = event(1.2, 0.05)
    acc = DistributedAccountant()
    acc.compose(estimate, 2)
    acc.compose(rounds, 100)
    both = distributed_epsilon([(estimate, 2), (rounds, 100)], 1e-5)
    assert acc.epsilon(1e-5) == both.epsilon == min(both.route_a.upper, both.route_b)
    assert acc.epsilon(1e-5) > distributed_epsilon([(rounds, 100)], 1e-5).epsilon
    clone = DistributedAccountant()
    clone.load_state_dict(acc.state_dict())
    assert clone.epsilon(1e-5) == acc.epsilon(1e-5) and clone.rounds == 102
    with pytest.raises(ValueError, match="composes DistributedDiscreteGaussian"):
        acc.compose(CorrDPRound((CorrDPClass("s", 1.0, 1.0),), 1.0, 0.1))  # type: ignore[arg-type]


def _secagg_estimate_keys(path, **extra: object) -> dict[str, object]:
    return {"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
            "private-columns": "age,city", "label-column": "label", "num-devices": 4, "num-rounds": 3,
            "progress": False, "private-statistics": "estimate", "aggregation": "secagg",
            "secagg-min-survivors": 3, "clipping-quantile": 0, **extra}


def _estimate_table(path, n: int = 600):
    import pandas as pd

    rng = np.random.default_rng(0)
    pd.DataFrame({"speed": rng.normal(size=n), "heading": rng.normal(size=n), "age": rng.integers(18, 66, n),
                  "city": rng.choice(["Paris", "Lyon"], n),
                  "label": rng.integers(0, 2, n)}).to_csv(path, index=False)
    return path


def test_secure_aggregation_calibrates_training_on_what_the_estimates_leave() -> None:
    """aggregation = "secagg" with estimated columns is no longer refused: the estimates are
    listed in the mechanism, the target is met by the distributed accountant's composition of
    the estimates and every planned round (both routes), and σ is larger than with the
    columns declared."""
    from fedfdp.accounting.distributed import DistributedAccountant
    from fedfdp.config import load_config
    from tests.mechanism_helpers import resolve

    keys = _secagg_estimate_keys("unused.csv", **{"target-epsilon": 2.0, "num-rounds": 40})
    estimated = resolve(load_config(keys), 480, devices=4)
    declarations = {"private-ranges": "age=0:120", "private-categories": "city=Lyon|Paris"}
    declared = resolve(load_config({**keys, **declarations}), 480, devices=4)
    assert [e.statistic for e in estimated.estimates] == ["encoding of 'age'", "encoding of 'city'"]
    assert declared.estimates == ()
    assert estimated.noise_multiplier is not None and declared.noise_multiplier is not None
    assert estimated.noise_multiplier > declared.noise_multiplier
    assert isinstance(estimated.event, DistributedDiscreteGaussian)
    acc = DistributedAccountant()
    for e in estimated.estimates:
        acc.compose(e.event)
    acc.compose(estimated.event, 40)
    assert acc.epsilon(estimated.delta) <= 2.0


def test_a_secagg_run_with_estimates_replays_to_the_printed_epsilon(tmp_path) -> None:
    """A centralised secure-aggregation run with two estimated columns: its ledger holds the
    two estimates after the mechanism and three distributed rounds, and the ledger replayed
    (what ``fedfdp account --run`` does) gives the ε of metrics.csv's last row."""
    import pandas as pd

    from fedfdp.accounting.events import ThresholdedHistogram
    from fedfdp.algorithm import run_centralised
    from fedfdp.config import load_config
    from fedfdp.ledger_replay import replay_ledger
    from tests.mechanism_helpers import events_as, written_ledger

    path = _estimate_table(tmp_path / "t.csv")
    out = tmp_path / "run"
    cfg = load_config(_secagg_estimate_keys(path, **{"target-epsilon": 3.0, "out-dir": str(out),
                                                      "reproducible-noise": False}))
    run_centralised(cfg)
    ledger = written_ledger(out)
    estimates = events_as(ThresholdedHistogram, (e.event for e in ledger.entries[1:3]))
    rounds = events_as(DistributedDiscreteGaussian, (e.event for e in ledger.entries[3:]))
    assert len(estimates) == 2 and len(rounds) == 3
    printed = float(pd.read_csv(out / "metrics.csv")["epsilon"].iloc[-1])
    replayed = replay_ledger(ledger).accountant.epsilon(float(ledger.mechanism["delta"]))
    assert replayed == pytest.approx(printed, abs=1e-9)
    assert printed <= 3.0


@pytest.mark.slow
def test_fedfdp_account_run_equals_the_printed_epsilon_of_a_secagg_run_with_estimates(tmp_path) -> None:
    """The real CLI: ``fedfdp run --centralised`` with secure aggregation and estimated
    columns prints ε; ``fedfdp account --run`` in a fresh process replays the ledger to it."""
    import json
    import subprocess
    import sys

    path = _estimate_table(tmp_path / "t.csv")
    out = tmp_path / "run"
    keys = _secagg_estimate_keys(path, **{"target-epsilon": 3.0, "reproducible-noise": False})
    flat = {k: str(v).lower() if isinstance(v, bool) else v for k, v in keys.items()}
    sets = [a for k, v in flat.items() for a in ("--set", f"{k}={v}")]
    cli = [sys.executable, "-m", "simulations.cli"]
    proc = subprocess.run([*cli, "run", "--centralised", "--out", str(out), *sets], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = float(proc.stdout.split("epsilon=")[1].split()[0])
    account = subprocess.run([*cli, "account", "--run", str(out), "--json"], capture_output=True, text=True,
                             timeout=600)
    assert account.returncode == 0, account.stderr[-2000:]
    doc = json.loads(account.stdout)
    assert doc["aggregation"] == "secagg" and doc["estimates"] == ["encoding of 'age'", "encoding of 'city'"]
    assert doc["epsilon"] == pytest.approx(printed, abs=1e-3)  # printed to 4 significant digits
