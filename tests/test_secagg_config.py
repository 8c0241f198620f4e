"""aggregation = "secagg": the configuration's refusals (one line each, naming the value)
and the resolution (the distributed event at n_h = n_min − t_c, σ_eff = σ)."""

import math

import numpy as np
import pytest

from fedfdp.accounting.distributed import DistributedAccountant, DistributedDiscreteGaussian
from fedfdp.config import ConfigError, load_config
from fedfdp.mechanism import PublicFacts, resolve_mechanism

SECAGG = {"aggregation": "secagg", "secagg-min-survivors": 4}


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        ({"aggregation": "plain", "secagg-min-survivors": None, "secagg-colluders": 1},
         "secagg-colluders=1: has no effect with aggregation='plain'"),
        ({"aggregation": "plain", "secagg-min-survivors": None, "secagg-scale": 64.0},
         "secagg-scale=64.0: has no effect"),
        ({"secagg-min-survivors": None}, "secagg-min-survivors is unset"),
        ({"secagg-min-survivors": 2}, "secagg-min-survivors=2: secure aggregation needs at least 3 parties"),
        ({"secagg-colluders": 4}, "secagg-colluders=4: must be below secagg-min-survivors=4"),
        # n_min = 4: k = min(4, 2*2+1) lowered to odd = 3, t = 2 (Bell et al.'s default)
        ({"secagg-colluders": 2}, "secagg-colluders=2: must be below the Shamir threshold t=2"),
        ({"secagg-min-survivors": 9, "secagg-threshold": 5, "secagg-colluders": 5},
         "secagg-colluders=5: must be below the Shamir threshold t=5"),
        ({"secagg-threshold": 5}, "secagg-threshold=5: above secagg-min-survivors=4"),
        ({"secagg-neighbours": 7, "secagg-threshold": 3}, "secagg-threshold=3: must be in"),
        ({"secagg-neighbours": 9}, "secagg-neighbours=9: its default threshold 5 is above"),
        ({"device-sampling-rate": 0.5}, "device-sampling-rate=0.5: with aggregation='secagg'"),
        ({"clients-per-round": 3}, "clients-per-round=3: aggregation='secagg'"),
        ({"clipping-quantile": 0.5}, "clipping-quantile=0.5: aggregation='secagg' keeps C fixed"),
        ({"mode": "corrdp", "clipping-quantile": 0}, "mode='corrdp' with aggregation='secagg'"),
        ({"mode": "public"}, "mode='public' with aggregation='secagg'"),
        ({"reproducible-noise": True}, "reproducible-noise=true with aggregation='secagg'"),
    ],
)
def test_refusals_are_one_line_naming_the_value(extra, start):
    with pytest.raises(ConfigError) as err:
        load_config({**SECAGG, **extra})
    text = str(err.value)
    assert text.startswith(start) and "\n" not in text, text


def test_modes_with_one_noisy_sum_are_accepted_and_auto_clipping_is_fixed():
    for mode, extra in (("dp", {}), ("fdp", {}), ("fdp-dpsgd", {"public-pretrain-rounds": 2})):
        p = load_config({**SECAGG, "mode": mode, **extra}).privacy
        assert not p.adaptive_clipping


def _facts(devices=10, per=160, d=1000):
    return PublicFacts(tuple([per] * devices), num_params=d)


def test_resolution_charges_n_min_minus_colluders_with_sigma_eff_equal_sigma():
    cfg = load_config({**SECAGG, "secagg-min-survivors": 8, "secagg-colluders": 2, "noise-multiplier": 1.3,
                       "num-rounds": 10})
    m = resolve_mechanism(cfg, _facts())
    ev, plan = m.event, m.secagg
    assert isinstance(ev, DistributedDiscreteGaussian) and ev.honest_parties == 6 and plan is not None
    assert ev.noise_multiplier == pytest.approx(1.3, rel=1e-12)  # σ_eff = √(n_h σ_loc² − t²)/(s+√d)
    delta_s = plan.scale + math.sqrt(1000)
    assert plan.local_sigma == pytest.approx(math.sqrt((1.3**2 * delta_s**2 + 4) / 6), rel=1e-12)
    assert m.to_dict()["secagg"]["min_survivors"] == 8


def test_a_calibrated_run_stays_within_its_target_under_the_distributed_accountant():
    cfg = load_config({**SECAGG, "target-epsilon": 2.0, "num-rounds": 40})
    m = resolve_mechanism(cfg, _facts())
    assert isinstance(m.event, DistributedDiscreteGaussian)
    acc = DistributedAccountant()
    acc.compose(m.event, 40)
    assert acc.epsilon(m.delta) <= 2.0
    acc.compose(m.event, 4)
    assert acc.epsilon(m.delta) > 2.0  # not far from the target


def test_a_plain_runs_description_has_no_secagg_entry():
    m = resolve_mechanism(load_config({"noise-multiplier": 1.0}), _facts())
    assert m.secagg is None and "secagg" not in m.to_dict()


@pytest.mark.parametrize(
    ("extra", "facts", "start"),
    [
        ({"secagg-scale": 1.0}, _facts(d=1), "secagg-scale=1: each party's noise std"),
        ({"secagg-scale": 2.0**30}, _facts(), "secagg-scale=1073741824.0: the aggregate could reach"),
        ({"secagg-min-survivors": 12}, _facts(), "secagg-min-survivors=12: more than the 10 parties"),
    ],
)
def test_resolution_refusals(extra, facts, start):
    cfg = load_config({**SECAGG, "noise-multiplier": 1.0, **extra})
    with pytest.raises(ConfigError) as err:
        resolve_mechanism(cfg, facts)
    assert str(err.value).startswith(start), str(err.value)


def test_the_distributed_accountant_composes_a_central_gaussian_event_too():
    """A Gaussian-noised statistic released before the rounds (a SubsampledGaussian at rate 1)
    composes with the distributed rounds: route A is the FDP accountant over both (the slack
    is the rounds'), route B adds the Gaussian's RDP α/(2σ²) (independent formula here)."""
    from fedfdp.accounting import FDPAccountant, SubsampledGaussian
    from fedfdp.accounting.distributed import ROUTE_B_ORDERS, distributed_epsilon, route_b_epsilon

    ev = DistributedDiscreteGaussian(local_sigma=5e4, honest_parties=8, scale=2**14, dimension=300,
                                     sampling_rate=0.05)
    est = SubsampledGaussian(4.0, 1.0)
    delta = 1e-5
    both = distributed_epsilon([(est, 1), (ev, 50)], delta)
    acc = FDPAccountant()
    acc.compose(est)
    acc.compose(ev.gaussian_event(), 50)
    assert both.route_a.upper == pytest.approx(acc.epsilon_bound(delta).upper, abs=1e-9)
    assert both.route_a.upper <= both.route_b
    alone = distributed_epsilon([(ev, 50)], delta)
    assert both.epsilon > alone.epsilon
    orders = np.asarray(ROUTE_B_ORDERS, dtype=float)
    rdp = 3 * orders / (2 * 16.0)  # three Gaussian releases at σ = 4, sensitivity 1
    ref = np.min(rdp + np.log1p(-1 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1))
    assert route_b_epsilon([(est, 3)], delta) == pytest.approx(max(0.0, ref), rel=1e-12)
    acc2 = DistributedAccountant()
    acc2.compose(est)
    acc2.compose(ev, 50)
    assert acc2.epsilon(delta) == pytest.approx(both.epsilon, rel=1e-12)


def _central(target, rounds, n=1600, q=0.05):
    """The central calibration at δ = 1/(2N): what a secure-aggregation σ is whenever the
    slack does not push route A above the target (the pinned configurations)."""
    from fedfdp.accounting import calibrate_noise_multiplier

    return calibrate_noise_multiplier(target_epsilon=target, sampling_rate=q, rounds=rounds,
                                      delta=1 / (2 * n))


@pytest.mark.parametrize(("target", "d"), [(2.0, 1000), (8.0, 1000), (8.0, 20), (8.0, 3)])
def test_a_target_is_calibrated_over_the_distributed_accountant_and_meets_it(target, d):
    """The one calibrator over route A and σ ↦ secagg_event(secagg_plan(σ)): the central σ
    (route A is the central ε up to 2Λ ≈ 0), even for a small model whose plan has no event
    at the smallest σ the search tries (σ_loc < 4 at σ = 2⁻¹⁰); route A at σ·(1 − 2·10⁻³)
    is above the target."""
    from fedfdp.secagg.plan import secagg_event, secagg_plan

    cfg = load_config({**SECAGG, "target-epsilon": target, "num-rounds": 40})
    m = resolve_mechanism(cfg, _facts(d=d))
    assert isinstance(m.event, DistributedDiscreteGaussian) and m.noise_multiplier is not None
    assert m.noise_multiplier == _central(target, 40)
    acc = DistributedAccountant()
    acc.compose(m.event, 40)
    assert acc.epsilon(m.delta) <= target
    lower = secagg_event(secagg_plan(m.noise_multiplier * (1 - 2e-3), dimension=d, num_records=1600,
                                     max_parties=10, min_survivors=4, colluders=0), 0.05)
    below = DistributedAccountant(route_b=False)
    below.compose(lower, 40)
    assert below.epsilon(m.delta) > target


@pytest.mark.parametrize(
    ("extra", "facts", "start"),
    [
        # the target is met at σ ≈ 1.3, where σ_loc = √((σ²(1 + 1)² + 4)/4) < 4: raise the scale
        ({"secagg-scale": 1.0, "target-epsilon": 2.0}, _facts(d=1), "secagg-scale=1: each party's noise std"),
        ({"secagg-min-survivors": 12, "target-epsilon": 2.0}, _facts(), "secagg-min-survivors=12: more than"),
        ({"secagg-scale": 2.0**30, "target-epsilon": 2.0}, _facts(),
         "secagg-scale=1073741824.0: the aggregate"),
        # route B alone would reach it (RDP at tiny δ), route A not: refused like the central one
        ({"delta": 1e-300, "target-epsilon": 2.0}, _facts(),
         "target-epsilon=2: unreachable with noise-multiplier"),
    ],
)
def test_calibration_refusals(extra, facts, start):
    cfg = load_config({**SECAGG, **extra})
    with pytest.raises(ConfigError) as err:
        resolve_mechanism(cfg, facts)
    assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)


def test_a_target_met_only_with_small_local_noise_names_a_local_sigma_below_the_minimum():
    cfg = load_config({**SECAGG, "secagg-scale": 1.0, "target-epsilon": 2.0})
    with pytest.raises(ConfigError) as err:
        resolve_mechanism(cfg, _facts(d=1))
    sigma_loc = float(str(err.value).split("σ_loc=")[1].split()[0])
    assert sigma_loc < 4.0
