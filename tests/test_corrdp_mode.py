"""``mode = "corrdp"`` as a run (issue 14, phase 2): the configuration and its refusals,
one federated round against a step built by hand (per-record loop, hand-made noise
scales), the Flower path against the centralised engine, the accounting of a run
against closed forms (tests/references.py), the outputs (``epsilon_corrdp``, never
``epsilon``), resume, in-sample TVs, and the refusals of parts that do not fit.
"""

from __future__ import annotations

import math
import tomllib

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fedfdp.accounting import CorrDPRound, SubsampledGaussian
from fedfdp.algorithm import run_centralised
from fedfdp.config import ConfigError, Mode, load_config
from fedfdp.contribution import ClientParts, PrivateBatch, RoundSettings, trainable
from fedfdp.corrdp.run import corrdp_setup, feature_groups
from fedfdp.corrdp.synthetic import correlated_features
from fedfdp.data import load_dataset
from fedfdp.entropy import SeededEntropy
from fedfdp.ledger import LedgerError
from fedfdp.mechanisms import standard_normals
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.round_engine import ServerParts
from fedfdp.run_files import RunFiles
from fedfdp.run_plan import build_plan, feature_map_for, server_parts_for
from fedfdp.sampling import poisson_sample
from strategies.fdp_strategy import FDPStrategy
from tests.flower_helpers import InProcessGrid, client_reply, registered_strategy, train_messages
from tests.mechanism_helpers import ledger_doc, write_ledger_doc
from tests.model_helpers import linear_layer
from tests.references import gaussian_eps_ref

#: m_s = 1 sensitive column s0, m_u = 3 insensitive u0..u2, |x_k| <= B = 1/sqrt(4) = 0.5.
BASE = {
    "mode": "corrdp",
    "dataset": "correlated",
    "num-sensitive": 1,
    "num-insensitive": 3,
    "correlation": 0.5,
    "num-devices": 4,
    "records-per-device": 40,
    "insensitive-tv": "u0=0.1,u1=0.4,*=1.0",
    "corrdp-weight-bound": 0.8,
    "noise-multiplier": 1.5,
    "sampling-rate": 0.3,
    "clipping-norm": 0.5,
    "learning-rate": 2.0,
    "momentum": 0.9,
    "seed": 3,
    "reproducible-noise": True,
    "progress": False,
}
B, D, C, SIGMA = 0.5, 0.8, 0.5, 1.5
TV = {"u0": 0.1, "u1": 0.4, "u2": 1.0}
FLOOR = (1 / 4) ** 2  # the paper's (m_s/m)^2


def _project(w: torch.Tensor, bound: float) -> torch.Tensor:
    """Every column scaled to norm <= bound (1 - 1e-5), by hand."""
    w = w.double()
    scale = torch.clamp(bound * (1 - 1e-5) / w.norm(dim=0), max=1.0)
    return (w * scale).float()


def _block_clipped_loop(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    """Sum over records of the per-block clipped CE gradient, one record at a time (autograd)."""
    # blocks: every input column its own block (s0, u0, u1, u2), each bound B; bias bound 1
    share_col, share_bias = B / math.sqrt(4 * B**2 + 1), 1 / math.sqrt(4 * B**2 + 1)
    gw, gb = torch.zeros_like(weight), torch.zeros_like(bias)
    for i in range(len(y)):
        w = weight.detach().clone().requires_grad_(True)
        b = bias.detach().clone().requires_grad_(True)
        xi = torch.clamp(x[i : i + 1], -B, B)
        F.cross_entropy(xi @ w.T + b, y[i : i + 1]).backward()
        assert w.grad is not None and b.grad is not None
        for k in range(w.shape[1]):
            col = w.grad[:, k]
            gw[:, k] += col * min(1.0, C * share_col / max(float(col.norm()), 1e-300))
        gb += b.grad * min(1.0, C * share_bias / max(float(b.grad.norm()), 1e-300))
    return gw, gb


def test_federated_round_equals_hand_built_corrdp_step():
    cfg = load_config(BASE)
    strat = registered_strategy(cfg)
    before = [p.detach().clone() for p in trainable(strat.model)]
    replies = [client_reply(cfg, m) for m in train_messages(strat, 1)]
    strat.aggregate_train(1, replies)
    federated = [p.detach().clone() for p in trainable(strat.model)]

    data = load_dataset(cfg.data)
    model = build_model_for(cfg.training, data)
    w0, b0 = (p.detach().clone() for p in trainable(model))
    w0 = _project(w0, D)  # the server projects the initial model when it resolves the plan
    torch.testing.assert_close(before[0], w0)
    secrets = SeededEntropy(3)
    xs, ys = [], []
    for d, dev in enumerate(data.devices):
        idx = poisson_sample(len(dev), 0.3, secrets.device(1, d, 0).coins)
        xs.append(torch.as_tensor(dev.x[idx]))
        ys.append(torch.as_tensor(dev.y[idx]))
    gw, gb = _block_clipped_loop(w0, b0, torch.cat(xs), torch.cat(ys))
    # Eq. (3): sigma*C on s0 and the bias, sigma*C*sqrt(max(TV, floor)) on u_j
    stds = [SIGMA * C] + [SIGMA * C * math.sqrt(max(TV[u], FLOOR)) for u in ("u0", "u1", "u2")]
    col_std = torch.tensor(stds, dtype=torch.float64)
    z = torch.from_numpy(standard_normals(secrets.noise(1, 0), 2 * 4 + 2))
    noisy_w = (gw.double() + z[:8].reshape(2, 4) * col_std).float()
    noisy_b = (gb.double() + z[8:] * SIGMA * C).float()
    n = data.num_records
    w1 = w0 - 2.0 * noisy_w / (0.3 * n)  # first SGD step: the momentum buffer is the gradient
    b1 = b0 - 2.0 * noisy_b / (0.3 * n)
    assert not torch.equal(federated[0], before[0])
    torch.testing.assert_close(federated[0], _project(w1, D), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(federated[1], b1, rtol=1e-4, atol=1e-5)
    assert float(federated[0].double().norm(dim=0).max()) <= D


def test_flower_path_and_centralised_engine_run_the_same_corrdp_plan(tmp_path):
    cfg_map = {**BASE, "num-rounds": 3, "sampling-rate": 0.5}
    flower_cfg = load_config({**cfg_map, "out-dir": str(tmp_path / "flower")})
    strat = registered_strategy(flower_cfg)
    strat.registry = {}
    strat.start(InProcessGrid(flower_cfg))
    central_cfg = load_config({**cfg_map, "out-dir": str(tmp_path / "central")})
    model, rows = run_centralised(central_cfg)
    assert len(strat.rows) == len(rows) == 3
    for f, c in zip(strat.rows, rows, strict=True):
        assert math.isnan(f["epsilon"]) and math.isnan(c["epsilon"])
        assert f["epsilon_corrdp"] == c["epsilon_corrdp"] > 0
        assert f["relation"] == c["relation"] == "corrdp"
    ledgers = [ledger_doc(tmp_path / d) for d in ("flower", "central")]
    assert ledgers[0] == ledgers[1]
    mechanism = ledgers[0]["entries"][0]["mechanism"]
    assert mechanism["relation"] == "corrdp" and mechanism["noise_multiplier"] == SIGMA
    events = [e["event"] for e in ledgers[0]["entries"][1:]]
    got = [(e["kind"], e["sampling_rate"], e["participation"]) for e in events]
    assert got == [("corrdp-round", 0.5, 1.0)] * 3
    for a, b in zip(trainable(strat.model), trainable(model), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)


def _class_mu(tv: dict[str, float]) -> dict[str, float]:
    """mu_c per class by hand (docs/corrdp.md section 4): one column per block, bound B; bias bound 1."""
    share_col, share_bias = B / math.sqrt(4 * B**2 + 1), 1 / math.sqrt(4 * B**2 + 1)
    clip_col, clip_bias = min(C * share_col, math.sqrt(2) * B), min(C * share_bias, math.sqrt(2))
    rho = min(math.sqrt(2), 0.5 * 2 * D * B)  # the residual moves by <= zeta/2, zeta = 2 D B (one column)
    std = {"s0": SIGMA * C, **{u: SIGMA * C * math.sqrt(max(t, FLOOR)) for u, t in tv.items()}}
    out = {}
    for changed in std:
        total = sum(
            ((2 * clip_col if k == changed else min(2 * clip_col, B * rho)) / s) ** 2 for k, s in std.items()
        )
        total += (min(2 * clip_bias, rho) / (SIGMA * C)) ** 2
        out[changed] = math.sqrt(total)
    return out


def test_epsilon_of_a_full_batch_run_matches_the_gaussian_closed_form(tmp_path):
    rounds = 4
    cfg = load_config({**BASE, "sampling-rate": 1.0, "num-rounds": rounds, "out-dir": str(tmp_path)})
    _, rows = run_centralised(cfg)
    delta = 1 / (2 * load_dataset(cfg.data).num_records)
    mu = _class_mu(TV)
    weight = {"s0": 1.0, **TV}
    # bound (i) per class: T rounds of a Gaussian pair with mu_c, exactly Gaussian with sqrt(T) mu_c
    ref = max(weight[c] * gaussian_eps_ref(math.sqrt(rounds) * m, delta) for c, m in mu.items())
    got = rows[-1]["epsilon_corrdp"]
    assert ref - 1e-6 <= got <= ref + 0.05  # the accountant's upper end, eps_error 0.05
    assert math.isnan(rows[-1]["epsilon"])
    # outputs: the CorrDP eps only under its own column, the relation named
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert metrics["epsilon"].isna().all()
    assert metrics["epsilon_corrdp"].iloc[-1] == pytest.approx(got)
    assert (metrics["relation"] == "corrdp").all()
    assert metrics["relation_text"].str.contains("eps/TV\\(j\\)").all()
    resolved = tomllib.loads((tmp_path / "config.toml").read_text())["resolved"]
    assert resolved["relation"] == "corrdp" and "membership not protected" in resolved["relation-text"]
    assert resolved["corrdp-tv"] == "u0=0.1,u1=0.4,u2=1"
    ledger = ledger_doc(tmp_path)
    assert ledger["entries"][0]["mechanism"]["noise_multiplier"] == SIGMA
    assert [e["event"]["sampling_rate"] for e in ledger["entries"][1:]] == [1.0] * rounds


def test_calibrated_run_ends_at_the_target_and_the_weights_stay_in_theta():
    cfg = load_config({**BASE, "noise-multiplier": None, "target-epsilon": 3.0, "num-rounds": 3})
    data = load_dataset(cfg.data)
    plan, _ = build_plan(cfg, data).resolve(data.sizes)
    assert plan.relation == "corrdp"
    model, rows = run_centralised(cfg)
    assert 2.9 <= rows[-1]["epsilon_corrdp"] <= 3.0
    assert rows[-1]["noise_multiplier"] == pytest.approx(plan.noise_multiplier)
    assert float(linear_layer(model).weight.detach().double().norm(dim=0).max()) <= D


def test_budget_cap_stops_a_corrdp_run_before_the_round_that_would_exceed_it():
    cfg = load_config({**BASE, "num-rounds": 30, "sampling-rate": 1.0, "max-epsilon": 4.0})
    _, rows = run_centralised(cfg)
    assert 0 < len(rows) < 30
    assert rows[-1]["epsilon_corrdp"] <= 4.0


def test_resume_of_a_corrdp_run_equals_the_uninterrupted_run(tmp_path):
    cfg_map = {**BASE, "num-rounds": 4}
    ref_cfg = load_config({**cfg_map, "out-dir": str(tmp_path / "ref")})
    ref = registered_strategy(ref_cfg)
    ref.registry = {}
    ref.start(InProcessGrid(ref_cfg))

    class Crash(RuntimeError):
        pass

    class CrashingJournal(RunFiles):
        """The run directory, whose durable write of round 3's charge never happens."""

        def write_ledger(self, ledger):
            if any(e.round == 3 for e in ledger.charges):
                raise Crash
            super().write_ledger(ledger)

    out = tmp_path / "run"
    cfg = load_config({**cfg_map, "out-dir": str(out)})
    data = load_dataset(cfg.data)
    journal = CrashingJournal(out, cfg.run, cfg.to_flat(), cfg.privacy.num_rounds)
    crashing = FDPStrategy(build_plan(cfg, data, files=journal))
    with pytest.raises(Crash):
        crashing.start(InProcessGrid(cfg))
    resumed_cfg = load_config({**cfg_map, "out-dir": str(out), "resume": True})
    resumed = registered_strategy(resumed_cfg)
    resumed.registry = {}
    resumed.start(InProcessGrid(resumed_cfg))
    # the model equals the uninterrupted run's; the round that may have been charged and
    # lost is charged once more (pessimistically), so the CorrDP ε is never below ref's
    assert resumed.rows[-1]["epsilon_corrdp"] > ref.rows[-1]["epsilon_corrdp"]
    assert resumed.ledger is not None
    kinds = [e.kind.value for e in resumed.ledger.charges]
    assert kinds.count("unrecorded") == 1 and kinds.count("charge") == 4
    for a, b in zip(trainable(ref.model), trainable(resumed.model), strict=True):
        assert torch.equal(a, b)
    # an edited charge is refused
    doc = ledger_doc(out)
    doc["entries"][1]["event"]["sampling_rate"] = 0.01
    write_ledger_doc(out, doc)
    again = registered_strategy(resumed_cfg)
    again.registry = {}
    with pytest.raises(LedgerError, match="hash mismatch"):
        again.start(InProcessGrid(resumed_cfg))


def _independent_tv(u: np.ndarray, s: np.ndarray) -> float:
    """max over pairs of values a, a' of u of the TV between P(s | u = a) and P(s | u = a'),
    from a per-record count (every value here is seen far more than nu*n times)."""
    conditionals = []
    for a in np.unique(u):
        rows = s[u == a]
        conditionals.append(np.array([np.mean(rows == c) for c in np.unique(s)]))
    return max(0.5 * np.abs(p - q).sum() for p in conditionals for q in conditionals)


def test_in_sample_tvs_are_released_with_gaussian_noise_and_public_margins():
    """tv-estimate releases clip(TV_hat + N(0, (sigma_tv c3/n)^2), 0, 1) per feature and the design
    uses min(1, released + e(beta) + noise_std z(1 - beta)), beta = tv-delta / (2 m_u); sigma_tv
    makes the m_u releases cost estimation-epsilon at 1/(2N) (closed-form Gaussian reference)."""
    from statistics import NormalDist

    from fedfdp.accounting.events import SubsampledGaussian
    from tests.references import gaussian_eps_ref

    cfg = load_config({
        **BASE, "insensitive-tv": "", "tv-estimate": True, "tv-bins": "*=0", "tv-min-prob": 0.45,
        "num-devices": 10, "records-per-device": 4000, "num-insensitive": 2, "correlation": 0.3,
    })
    data = load_dataset(cfg.data)
    x = np.concatenate([d.x for d in data.devices])
    n, delta = data.num_records, 1 / (2 * data.num_records)
    exact = corrdp_setup(cfg, data, normals=lambda k: np.zeros(k))  # noise injected: zero
    setup = corrdp_setup(cfg, data)  # the OS CSPRNG
    assert setup.design.delta_estimation == pytest.approx(delta / 2)
    sigma_tv = setup.charges[0].event.noise_multiplier
    assert [c.event for c in setup.charges] == [SubsampledGaussian(sigma_tv, 1.0)] * 2
    assert gaussian_eps_ref(np.sqrt(2) / sigma_tv, delta) == pytest.approx(0.5, abs=0.01)
    noise_std = sigma_tv * (4 / 0.45) / n
    beta = (delta / 2) / (2 * 2)
    nu = 0.45 / 2
    error = math.sqrt(2 * (2 * math.log(2) + math.log(2 * 2 / beta)) / (nu * n))  # 2 cells, 2 values
    margin = error + noise_std * NormalDist().inv_cdf(1 - beta)
    for i, name in enumerate(("u0", "u1")):
        signs = np.sign(x[:, 0])
        reference = _independent_tv(np.sign(x[:, 1 + i]), signs)
        assert exact.estimates[name].noisy == pytest.approx(reference, abs=1e-9)
        assert abs(reference - 0.3) < 0.04  # TV(j) = rho in closed form
        est = setup.estimates[name]
        assert est.noise_std == pytest.approx(noise_std) and est.margin == pytest.approx(margin)
        assert abs(est.noisy - reference) < 6 * noise_std
        assert setup.design.roles.tv[name] == pytest.approx(min(1.0, est.noisy + margin))
    resolved = setup.resolved()
    assert "released" in resolved["corrdp-tv-estimated"] and "hat" not in resolved["corrdp-tv-estimated"]
    assert "charged in the ledger" in resolved["corrdp-tv-estimated-note"]
    # released values read back (estimated-tvs): nothing drawn, the same design
    def never_drawn(k: int) -> np.ndarray:
        raise AssertionError(f"{k} normals drawn for released TVs")

    again = corrdp_setup(load_config({**cfg.to_flat(), "estimated-tvs": ",".join(
        f"{f}={e.noisy!r}" for f, e in setup.estimates.items())}), data, normals=never_drawn)
    assert again.design.roles.tv == setup.design.roles.tv
    # a node's layout never estimates: same blocks and clip shares, placeholder TVs
    layout = corrdp_setup(cfg, data, estimate=False)
    assert layout.layout_only and not layout.estimates
    assert layout.design.clip_shares == setup.design.clip_shares


def test_released_tvs_are_charged_and_in_the_corrdp_epsilon():
    """The released TVs' events are the mechanism's estimates (ledger entries before round 1);
    the CorrDP accountant adds their Gaussian epsilon at delta_g = (delta - delta_est)/2 to every
    class: eps = max_c d_c (eps_c(delta_m) + eps_est(delta_g)), recomputed here from the accountant's
    class breakdown without estimates and the closed-form Gaussian reference."""
    from fedfdp.corrdp.accounting import CorrDPAccountant
    from fedfdp.mechanism import resolve_mechanism
    from fedfdp.run_plan import public_facts, server_parts_for
    from tests.references import gaussian_eps_ref

    cfg = load_config({
        **BASE, "insensitive-tv": "", "tv-estimate": True, "tv-bins": "*=0", "tv-min-prob": 0.45,
        "num-devices": 10, "records-per-device": 400, "num-insensitive": 2, "correlation": 0.3,
        "noise-multiplier": 2.0, "num-rounds": 5,
    })
    data = load_dataset(cfg.data)
    parts = server_parts_for(cfg, data)
    m = resolve_mechanism(cfg, public_facts(cfg, data), accounting=parts.accounting)
    assert [e.statistic for e in m.estimates] == ["TV of 'u0'", "TV of 'u1'"]
    delta = m.delta
    acc = parts.accounting.new()
    assert isinstance(acc, CorrDPAccountant) and isinstance(m.event, CorrDPRound)
    plain = CorrDPAccountant(acc.delta_estimation)
    for e in m.estimates:
        assert isinstance(e.event, SubsampledGaussian)  # a TV is a Gaussian release (q = p = 1)
        acc.compose(e.event)
    acc.compose(m.event, 5)
    plain.compose(m.event, 5)
    d_g = (delta - acc.delta_estimation) / 2
    eps_est = gaussian_eps_ref(np.sqrt(2) / m.estimates[0].event.noise_multiplier, d_g)
    breakdown = plain.epsilon_bound(delta - d_g).classes
    expected = max(c.weight * (c.epsilon + eps_est) for c in breakdown)
    assert acc.epsilon(delta) == pytest.approx(expected, abs=0.06)  # the accountant's eps_error
    assert acc.epsilon(delta) > plain.epsilon(delta)
    state = acc.state_dict()
    restored = CorrDPAccountant(acc.delta_estimation)
    restored.load_state_dict(state)
    assert restored.epsilon(delta) == acc.epsilon(delta)


REFUSED = [
    ({"insensitive-tv": "u0=1.5"}, "insensitive-tv='u0=1.5': TV of 'u0' = '1.5' must be in \\[0, 1\\]"),
    ({"sensitive-columns": "s0,u0", "insensitive-tv": "u0=0.2"}, "column 'u0' is declared both"),
    ({"model": "mlp"}, "mode='corrdp': needs model='logistic' \\(got model='mlp'\\)"),
    ({"clipping-quantile": 0.5}, "clipping-quantile=0.5"),
    ({"public-pretrain-rounds": 2, "num-rounds": 5}, "public-pretrain-rounds=2"),
    ({"privacy-unit": "device", "device-sampling-rate": 0.5}, "privacy-unit='device'"),
    ({"tv-estimate": True}, "tv-estimate=true: needs tv-min-prob"),
    ({"corrdp-tv-floor": 1.5}, "corrdp-tv-floor=1.5"),
    ({"tv-bins": "u0=1:0"}, "strictly increasing"),
    ({"label-signal": 0.0}, "label-signal=0.0: must be > 0"),
    ({"label-signal": -1.0}, "label-signal=-1.0: must be > 0"),
]


@pytest.mark.parametrize(("extra", "match"), REFUSED)
def test_configuration_refusals_name_the_value(extra, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config({**BASE, **extra})
    assert "\n" not in str(err.value)


SETUP_REFUSED = [
    ({"insensitive-tv": "u0=0.1"}, "features u1, u2 are neither sensitive nor given a TV"),
    ({"insensitive-tv": "speed=0.1,*=0.5"}, "'speed' is not a column of the dataset"),
    ({"insensitive-tv": "s0=0.3,*=1"}, "column 's0' is declared both sensitive and insensitive"),
    ({"insensitive-tv": "", "tv-estimate": True, "tv-min-prob": 0.4, "tv-bins": "u0=0"},
     "no cut points for the numeric input 's0'"),
]


@pytest.mark.parametrize(("extra", "match"), SETUP_REFUSED)
def test_design_refusals_name_the_column(extra, match):
    cfg = load_config({**BASE, **extra})
    with pytest.raises(ConfigError, match=match) as err:
        corrdp_setup(cfg, load_dataset(cfg.data))
    assert "\n" not in str(err.value)


def test_parts_that_do_not_fit_the_mode_are_refused():
    cfg = load_config(BASE)
    data = load_dataset(cfg.data)
    with pytest.raises(ConfigError, match="mode='corrdp' with the 'add-remove' accounting"):
        build_plan(cfg, data, server_parts=ServerParts()).resolve(data.sizes)
    corrdp_only = ("insensitive-tv", "corrdp-weight-bound")  # refused outside corrdp (no setting ignored)
    fdp = load_config({**{k: v for k, v in BASE.items() if k not in corrdp_only}, "mode": "fdp"})
    with pytest.raises(ConfigError, match="mode='fdp' with the 'corrdp' accounting"):
        build_plan(fdp, data, server_parts=server_parts_for(cfg, data)).resolve([40] * 4)
    batch = PrivateBatch(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), torch.Generator(), 2)
    settings = RoundSettings(1, 0, PHASES[Mode.CORRDP], 0.3, 0.5)
    features = feature_map_for(cfg, data)
    with pytest.raises(ValueError, match="needs the CorrDP aggregator"):
        ClientParts().aggregate(build_model_for(cfg.training, data), features, settings, [batch])
    # a model outside the weight bound is refused by the node (the server projects it)
    model = build_model_for(cfg.training, data)
    with torch.no_grad():
        linear_layer(model).weight.mul_(100.0)
    parts = server_parts_for(cfg, data)
    from fedfdp.run_plan import client_parts_for

    with pytest.raises(ValueError, match="weight bound"):
        client_parts_for(cfg, data).aggregate(model, features, settings, [batch])
    assert parts.project is not None
    parts.project(model)
    assert float(linear_layer(model).weight.detach().double().norm(dim=0).max()) <= D


def _all_records(data):
    x = np.concatenate([d.x for d in data.devices] + [data.test_x])
    y = np.concatenate([d.y for d in data.devices] + [data.test_y])
    return x, y


def test_label_signal_sets_how_strongly_the_signs_decide_the_label():
    accuracy = []
    for signal in (0.05, 1.0, 4.0, 12.0):
        cfg = load_config({**BASE, "num-devices": 10, "records-per-device": 400, "label-signal": signal})
        assert cfg.data.label_signal == signal
        x, y = _all_records(load_dataset(cfg.data))
        # the loader's records are the generator's records at that signal (split over devices)
        drawn = correlated_features(4000, 1, 3, 0.5, seed=cfg.data.data_seed, signal=signal)

        def rows(a, b):
            return sorted(map(tuple, np.column_stack([a.astype(np.float32), b])))

        assert rows(x, y) == rows(drawn.x, drawn.y)
        # independent check: P(y=1 | t) = sigmoid(a·v·t) for the sign pattern t; the best
        # classifier of the pattern alone (majority label per pattern, 16 patterns of 4
        # columns) is more accurate for larger a
        patterns = (x > 0).astype(int) @ (1 << np.arange(4))
        ones = np.bincount(patterns, weights=y, minlength=16)
        total = np.bincount(patterns, minlength=16)
        accuracy.append(np.maximum(ones, total - ones).sum() / len(y))
    assert accuracy[0] < 0.56  # labels almost independent of the signs
    assert accuracy[-1] > 0.95
    assert accuracy == sorted(accuracy), accuracy


def test_feature_groups_of_a_real_table_encoding():
    groups = feature_groups(["education", "smsa=no", "smsa=yes", "ethnicity=cauc", "ethnicity=afam"])
    assert groups == {"education": (0,), "smsa": (1, 2), "ethnicity": (3, 4)}
    assert np.array_equal(np.concatenate(list(groups.values())), np.arange(5))


def test_compare_rows_for_corrdp_next_to_dp_and_fdp(tmp_path):
    from simulations.compare import run_sweep
    from simulations.compare_plan import parse_sweep

    doc = {
        "modes": ["public", "dp", "fdp", "corrdp"], "target-epsilons": [2.0], "seeds": [0], "num-rounds": 3,
        "dataset": "correlated", "num-sensitive": 1, "num-insensitive": 3, "num-devices": 4,
        "records-per-device": 40, "sampling-rate": 1.0, "mode": {"corrdp": {"insensitive-tv": "*=0.3"}},
    }
    out = tmp_path / "cmp"
    run_sweep(parse_sweep(doc), out, progress=False)
    frame = pd.read_csv(out / "results.csv").set_index("mode")
    assert frame.loc["corrdp", "relation"] == "corrdp"
    assert math.isnan(frame.loc["corrdp", "epsilon"])  # never in the DP/FDP column
    assert 1.9 < frame.loc["corrdp", "epsilon_corrdp"] <= 2.0
    assert frame.loc["dp", "relation"] == frame.loc["fdp", "relation"] == "add-remove"
    assert frame.loc[["dp", "fdp"], "epsilon_corrdp"].isna().all()
    summary = (out / "summary.md").read_text()
    assert "| `corrdp` (CorrDP ε) |" in summary and "CorrDP ε" in summary
    assert "| `corrdp` − `dp` (points) |" in summary
    assert "ε_corrdp 2" in summary or "ε_corrdp 1.9" in summary
    corr_row = next(line for line in summary.splitlines() if line.startswith("| `corrdp` (CorrDP ε)"))
    assert "**" not in corr_row  # not bolded against add/remove modes
    assert (out / "privacy_utility.png").stat().st_size > 1000
