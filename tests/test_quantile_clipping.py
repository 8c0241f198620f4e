"""Adaptive clipping (Andrew et al. 2021) on the private part.

* The accountant is charged the joint release (clipped sum and noisy count),
  checked against the closed form of the Gaussian mechanism (full batches) and
  against dp-accounting (Poisson subsampling), with ``σ_eff`` computed here.
* ``C`` converges to the requested quantile of norms computed by a per-record
  (per-device) loop, in the centralised engine and on the Flower path alike.
* ``C`` survives a resume; a bad count in a reply is rejected; a count noise
  that would eat the budget is refused.
"""

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedfdp import protocol as P
from fedfdp.accounting import SubsampledGaussian
from fedfdp.algorithm import run_centralised
from fedfdp.config import ConfigError, load_config
from fedfdp.data import load_dataset
from fedfdp.entropy import SeededEntropy
from fedfdp.models import build_model_for
from fedfdp.quantile_clipping import adapt_clipping_norm
from tests.flower_helpers import InProcessGrid, registered_strategy
from tests.mechanism_helpers import events_as, resolve
from tests.references import dp_ref_eps, gaussian_eps_ref

BASE = {
    "num-devices": 6, "records-per-device": 80, "num-rounds": 4,
    "clipping-quantile": 0.5, "progress": False, "seed": 4, "reproducible-noise": True,
}


@pytest.mark.parametrize("eps", [0.5, 2.0, 8.0])
def test_full_batch_charge_equals_the_joint_gaussian_mechanism(eps):
    """q = 1: each round releases the sum (shift C, noise σC) and the count
    (shift 1, noise σ_b) — a Gaussian mechanism with μ² = 1/σ² + 1/σ_b² per
    round, μ√T over T rounds (closed form; within 0.5 %)."""
    cfg = load_config({**BASE, "sampling-rate": 1.0, "num-rounds": 30, "target-epsilon": eps})
    plan = resolve(cfg, 480)
    sigma, sigma_b = plan.noise_multiplier, plan.count_noise
    assert sigma is not None and sigma_b is not None
    assert sigma_b**-2 == pytest.approx(0.05 * (sigma**-2 + sigma_b**-2))  # the count's 5 % share
    mu = np.sqrt(30 * (sigma**-2 + sigma_b**-2))
    assert gaussian_eps_ref(mu, plan.delta) == pytest.approx(eps, rel=5e-3)
    # the gradient alone gets less noise than a fixed-C run at the same ε
    fixed = resolve(load_config({**BASE, "sampling-rate": 1.0, "num-rounds": 30, "target-epsilon": eps,
                                      "clipping-quantile": 0}), 480)
    assert fixed.noise_multiplier is not None and fixed.noise_multiplier < sigma


def test_subsampled_charge_matches_dp_accounting(tmp_path):
    """q = 0.1: a run's printed ε (the upper end of the PRV accountant's
    interval) is at least dp-accounting's add/remove ε of the Poisson-subsampled
    Gaussian with σ_eff computed here from σ and σ_b, and within 3 % of it."""
    cfg = load_config({**BASE, "sampling-rate": 0.1, "num-rounds": 20, "target-epsilon": 2.0,
                       "out-dir": str(tmp_path)})
    _, rows = run_centralised(cfg)
    plan = resolve(cfg, 480)
    assert plan.noise_multiplier is not None and plan.count_noise is not None
    sigma_eff = (plan.noise_multiplier**-2 + plan.count_noise**-2) ** -0.5
    ref = dp_ref_eps([(sigma_eff, 0.1, 20)], plan.delta)
    assert ref - 1e-3 <= rows[-1]["epsilon"] <= 1.03 * ref
    assert rows[-1]["epsilon"] <= 2.0 + 1e-9


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.9])
def test_geometric_update_converges_to_the_quantile(quantile):
    """Fixed lognormal norms, count noise σ_b = 1 on 2000 vectors: after 400
    steps from C = 100 the share of norms ≤ C is γ ± 0.03."""
    norms = np.random.default_rng(1).lognormal(0.0, 1.0, 2000)
    stream = SeededEntropy(0).noise(1, 0)
    c = 100.0
    shares = []
    for step in range(400):
        c = adapt_clipping_norm(c, int((norms <= c).sum()), 1.0, 2000.0, quantile, 0.2, stream)
        if step >= 300:
            shares.append((norms <= c).mean())
    assert abs(np.mean(shares) - quantile) < 0.03
    assert abs(np.quantile(norms, quantile) / c - 1) < 0.2


def _loop_norms(cfg, data):
    """Norms of the per-record gradients of the full loss (mode dp) at the
    initial model, and of each device's mean gradient: a loop, one record at a time."""
    model = build_model_for(cfg.training, data)
    record, device = [], []
    for dev in data.devices:
        grads = []
        for x, y in zip(dev.x, dev.y, strict=True):
            model.zero_grad()
            F.cross_entropy(model(torch.as_tensor(x)[None]), torch.as_tensor(y)[None]).backward()
            parts = []
            for p in model.parameters():
                assert p.grad is not None
                parts.append(p.grad.detach().double().ravel())
            g = torch.cat(parts)
            grads.append(g)
            record.append(float(g.norm()))
        device.append(float(torch.stack(grads).mean(0).norm()))
    return np.array(record), np.array(device)


UNITS: dict[str, dict[str, Any]] = {
    "record": {"sampling-rate": 0.5},
    # whole devices each round they are drawn: the mean over the device's records
    "device": {"privacy-unit": "device", "device-sampling-rate": 0.5, "sampling-rate": 1.0,
               "num-devices": 12},
}


@pytest.mark.parametrize("unit", list(UNITS))
def test_engine_tracks_the_median_of_per_record_norms(unit):
    """Mode dp, a frozen model (learning rate 1e-12): after 60 rounds C is within
    25 % of the median norm of the per-record gradients (per-device mean
    gradients for the device unit) computed by a loop."""
    cfg = load_config({**BASE, "mode": "dp", "num-rounds": 60, "learning-rate": 1e-12, "momentum": 0.0,
                       "clipping-norm": 0.05, "noise-multiplier": 1.0,
                       "clipping-budget-share": 0.5, **UNITS[unit]})
    data = load_dataset(cfg.data)
    _, rows = run_centralised(cfg, data)
    assert rows[0]["clipping_norm"] == 0.05
    final = np.mean([r["clipping_norm"] for r in rows[-10:]])
    record_norms, device_norms = _loop_norms(cfg, data)
    target = np.median(record_norms if unit == "record" else device_norms)
    assert final == pytest.approx(target, rel=0.25)


def test_flower_path_adapts_c_as_the_centralised_engine(tmp_path):
    """Same reproducible run on the Flower path and the centralised engine:
    the same C every round, the same ledger and model."""
    cfg_map = {**BASE, "noise-multiplier": 1.0, "sampling-rate": 0.3, "num-rounds": 5}
    flower_cfg = load_config({**cfg_map, "out-dir": str(tmp_path / "flower")})
    strat = registered_strategy(flower_cfg)
    strat.registry = {}
    strat.start(InProcessGrid(flower_cfg))
    _, central = run_centralised(load_config({**cfg_map, "out-dir": str(tmp_path / "central")}))
    c_flower = [r["clipping_norm"] for r in strat.rows]
    c_central = [r["clipping_norm"] for r in central]
    assert len(set(c_flower)) == 5  # C moved every round
    np.testing.assert_allclose(c_flower, c_central, rtol=1e-6)
    assert strat.ledger is not None and strat.mechanism is not None
    events = events_as(SubsampledGaussian, (c.event for c in strat.ledger.charges))
    charged = [e.noise_multiplier for e in events]
    assert charged == [] or charged == pytest.approx(
        [strat.mechanism.accounted_noise_multiplier] * 5
    )


class Crash(RuntimeError):
    pass


def test_resume_continues_with_the_adapted_c(tmp_path):
    """A run stopped after round 3's checkpoint resumes round 4 with the C that
    round 3 left (not the configured start)."""
    cfg_map = {**BASE, "noise-multiplier": 1.0, "sampling-rate": 0.3, "num-rounds": 6}
    _, ref = run_centralised(load_config({**cfg_map, "out-dir": str(tmp_path / "ref")}))
    out = str(tmp_path / "run")

    def evaluate(round_, model):
        if round_ == 4:
            raise Crash("after round 4's update, before its checkpoint")
        return {}

    with pytest.raises(Crash):
        run_centralised(load_config({**cfg_map, "out-dir": out}), evaluate_fn=evaluate)
    _, resumed = run_centralised(load_config({**cfg_map, "out-dir": out, "resume": True}))
    assert [r["round"] for r in resumed] == list(range(1, 7))
    assert ref[3]["clipping_norm"] != 1.0
    assert resumed[3]["clipping_norm"] == pytest.approx(ref[3]["clipping_norm"], rel=1e-12)


@pytest.mark.parametrize("share", [0, 1, -0.1, float("nan"), "a"])
def test_budget_share_outside_the_open_interval_is_refused(share):
    with pytest.raises(ConfigError, match="clipping-budget-share="):
        load_config({**BASE, "clipping-budget-share": share})


@pytest.mark.parametrize("raw", [None, -1, 11, 2.5, True])
def test_reply_with_a_bad_count_is_rejected(raw):
    shapes = {"w": (2,)}
    metrics = {} if raw is None else {P.UNCLIPPED_COUNT: raw}
    with pytest.raises(P.InvalidReply, match=P.UNCLIPPED_COUNT):
        P.validate_reply(private={"w": np.zeros(2, np.float32)}, public=None, metrics=metrics,
                         expected=shapes, want_private=True, want_public=False, clipping_norm=1.0,
                         max_private_records=10, public_count_asked=0)
    ok = P.validate_reply(private={"w": np.zeros(2, np.float32)}, public=None,
                          metrics={P.UNCLIPPED_COUNT: 7}, expected=shapes, want_private=True,
                          want_public=False, clipping_norm=1.0, max_private_records=10, public_count_asked=0)
    assert ok.unclipped == 7


def test_auto_is_the_recipe_of_each_mode():
    """``clipping-quantile = "auto"`` (the default): adaptive for fdp only; an
    explicit value applies to any mode; the flat form round-trips."""
    assert load_config({"mode": "fdp"}).privacy.adaptive_clipping
    for mode in ("dp", "fdp-dpsgd", "public"):
        extra = {"public-pretrain-rounds": 10} if mode == "fdp-dpsgd" else {}
        assert not load_config({"mode": mode, **extra}).privacy.adaptive_clipping
    assert not load_config({"mode": "fdp", "clipping-quantile": 0}).privacy.adaptive_clipping
    assert load_config({"mode": "dp", "clipping-quantile": 0.7}).privacy.adaptive_clipping
    cfg = load_config({"clipping-quantile": "auto"})
    assert cfg.privacy.clipping_quantile is None and cfg.to_flat()["clipping-quantile"] == "auto"
    assert load_config(cfg.to_flat()) == cfg
    match = r"clipping-quantile='median': must be a number in \[0, 1\), or \"auto\""
    with pytest.raises(ConfigError, match=match):
        load_config({"clipping-quantile": "median"})
    with pytest.raises(ConfigError, match="clipping-quantile=1"):
        load_config({"clipping-quantile": 1})


def _recipe_reference(sigma, sigma_b, d, batch):
    """The recipe from its docstring, solved with scipy's brentq (an independent root finder)."""
    from scipy.optimize import brentq

    kappa = sigma * np.sqrt(d) / batch
    x = brentq(lambda x: np.exp(-2 * x) - kappa**2 * x, 1e-12, 100)
    gamma = 1 - np.exp(-x)
    ceiling = min(0.99, 1 - 2 * sigma_b / batch)
    return 0.0 if gamma < 0.5 or ceiling < 0.5 else min(gamma, ceiling)


@pytest.mark.parametrize(
    ("eps", "records", "hidden"), [(0.5, 100, 0), (2.0, 100, 0), (8.0, 400, 0), (1.0, 40, 256)]
)
def test_server_resolves_the_recipe_from_public_quantities(eps, records, hidden):
    """The server's γ equals the recipe computed here from σ, σ_b, the model's
    parameter count and q·N; a noise-dominated run (a wide MLP on few records)
    keeps C fixed every round."""
    from fedfdp.run_plan import build_plan

    extra = {"model": "mlp", "hidden-sizes": str(hidden)} if hidden else {}
    cfg = load_config({"num-devices": 10, "records-per-device": records, "target-epsilon": eps,
                       "num-rounds": 20, "progress": False, **extra})
    data = load_dataset(cfg.data)
    run = build_plan(cfg, data)
    plan = run.engine(data.sizes.tolist()).mechanism
    from dataclasses import replace

    split_cfg = replace(cfg, privacy=replace(cfg.privacy, clipping_quantile=0.5))
    split = resolve(split_cfg, sum(data.sizes.tolist()))  # the budget split "auto" starts from
    d = sum(p.numel() for p in run.model.parameters())
    batch = cfg.privacy.sampling_rate * sum(data.sizes.tolist())
    ref = _recipe_reference(split.noise_multiplier, split.count_noise, d, batch)
    assert plan.clipping.quantile == pytest.approx(ref, abs=1e-9)
    from fedfdp.run_plan import mechanism_for

    assert mechanism_for(cfg, data) == plan  # compare's checks record the σ the run uses
    if ref == 0.0:
        # a fixed C releases no count: the whole budget goes to the gradient (σ = σ_eff, same ε)
        assert plan.count_noise is None
        assert plan.noise_multiplier == pytest.approx(split.accounted_noise_multiplier, rel=1e-9)
        assert plan.noise_multiplier is not None and split.noise_multiplier is not None
        assert plan.noise_multiplier < split.noise_multiplier
        _, rows = run_centralised(cfg, data)
        assert {r["clipping_norm"] for r in rows} == {1.0}
    else:
        assert 0.5 <= ref <= 0.99
        assert (plan.noise_multiplier, plan.count_noise) == (split.noise_multiplier, split.count_noise)
