"""Statistics of private columns: declared, or released with accounted noise, or refused.

Issue 22 item 1. The refusal goes through the real CLI (a subprocess); the
estimator is checked statistically (noise scale, coverage) and by a property:
the released range depends on the data only through the noisy histogram.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfdp.accounting.events import SubsampledGaussian, ThresholdedHistogram
from fedfdp.config import ConfigError, load_config
from tests.mechanism_helpers import events_as, fdp_event, written_ledger

CLI = [sys.executable, "-m", "simulations.cli"]


def _table(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    pd.DataFrame({
        "speed": rng.normal(size=n),
        "heading": rng.normal(size=n),
        "age": rng.integers(18, 66, n),
        "income": rng.normal(3000.0, 500.0, n),
        "city": rng.choice(["Paris", "Lyon"], n),
        "label": rng.integers(0, 2, n),
    }).to_csv(path, index=False)
    return path


def _keys(path: Path, private: str = "age,city", **extra: str) -> list[str]:
    keys = {"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
            "private-columns": private, "label-column": "label", "num-devices": "4",
            "num-rounds": "2", "progress": "false", **extra}
    return [a for k, v in keys.items() for a in ("--set", f"{k}={v}")]


# ----------------------------------------------------------------- refusal


def test_undeclared_private_columns_are_refused_by_the_cli_in_one_line_and_nothing_is_written(tmp_path):
    path = _table(tmp_path / "t.csv")
    out = tmp_path / "run"
    proc = subprocess.run([*CLI, "run", "--centralised", "--out", str(out), *_keys(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("error: private-columns: ['age', 'city'] have no declared encoding")
    assert "private-ranges" in line and "private-categories" in line  # way out 1: declare
    assert 'private-statistics = "estimate"' in line  # way out 2: estimate with accounted noise
    assert "Traceback" not in proc.stderr
    assert not out.exists()  # no run files left


def test_a_text_column_is_estimated_under_estimate_and_the_release_is_written_once(tmp_path):
    """A text column under estimate: its categories are released (both cities, 300 records each
    on average, far above τ), written into the configuration by resolve_released and encoded
    one-hot; a resolved configuration is not estimated again."""
    from fedfdp.data import load_dataset
    from fedfdp.run_plan import resolve_released

    path = _table(tmp_path / "t.csv")
    cfg = load_config({"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
                       "private-columns": "age,city", "label-column": "label", "num-devices": 4,
                       "private-statistics": "estimate"})
    data = load_dataset(cfg.data)
    assert data.estimated_categories == (("city", ("Lyon", "Paris")),)
    assert [c for c, _, _ in data.estimated_ranges] == ["age"]
    assert data.spec is not None
    assert data.spec.private == ("age", "city=Lyon", "city=Paris")
    resolved = resolve_released(cfg, data)
    assert resolved.data.estimated_categories == data.estimated_categories
    assert load_config(resolved.to_flat()).data.estimated_categories == data.estimated_categories
    assert resolve_released(resolved) is resolved  # nothing left to estimate


def test_a_private_label_needs_declared_classes(tmp_path):
    path = _table(tmp_path / "t.csv")
    base = {"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
            "private-columns": "age", "private-ranges": "age=0:120", "label-column": "label",
            "num-devices": 4, "public-loss": "label-free"}
    with pytest.raises(ConfigError, match=r"label-classes='': under public-loss='label-free' the label"):
        load_config(base)
    assert load_config({**base, "label-classes": "0|1"}).data.label_classes == ("0", "1")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"estimated-ranges": "age=0:64"}, "estimated-ranges names ['age']: ranges released by "
                                           "private-statistics='estimate'"),
        ({"private-statistics": "estimate", "private-ranges": "age=0:100", "estimated-ranges": "age=0:64"},
         "estimated-ranges names ['age']: only private columns without a declared encoding"),
        ({"private-statistics": "estimate", "mode": "corrdp", "clipping-quantile": 0.0},
         "private-statistics='estimate' with mode='corrdp'"),
    ],
)
def test_estimate_keys_are_checked(tmp_path, extra, fragment):
    base = {"dataset": "csv", "data-path": str(tmp_path / "t.csv"), "public-columns": "speed,heading",
            "private-columns": "age", "label-column": "label", "num-devices": 4}
    with pytest.raises(ConfigError) as info:
        load_config({**base, **extra})
    assert fragment in str(info.value)


# ----------------------------------------------------------------- the estimator


def test_the_grid_is_public_signed_powers_of_two():
    from fedfdp.data.private_statistics import GRID_MAX_EXPONENT, GRID_MIN_EXPONENT, NUM_BUCKETS, range_grid

    edges = range_grid()
    assert len(edges) == NUM_BUCKETS + 1 and np.all(np.diff(edges) > 0)
    positive = edges[edges > 0]
    np.testing.assert_array_equal(positive, 2.0 ** np.arange(GRID_MIN_EXPONENT, GRID_MAX_EXPONENT + 2))
    np.testing.assert_array_equal(edges[edges < 0], -positive[::-1])


def test_histogram_counts_each_present_value_once_and_clamps_the_outer_buckets():
    from fedfdp.data.private_statistics import NUM_BUCKETS, histogram, range_grid

    edges = range_grid()
    values = np.array([0.0, 1.0, 1.5, 3.0, -3.0, 1e300, -1e300, np.nan])
    h = histogram(values)
    assert h.sum() == 7  # NaN is missing: no bucket
    assert h[0] == 1 and h[NUM_BUCKETS - 1] == 1  # beyond the outer edges: the outer buckets
    for v in (1.0, 1.5, 3.0, -3.0):  # an independent bucket lookup: low edge <= v < high edge
        k = next(i for i in range(NUM_BUCKETS) if edges[i] <= v < edges[i + 1])
        assert h[k] >= 1
    assert h[next(i for i in range(NUM_BUCKETS) if edges[i] <= 1.0 < edges[i + 1])] == 2  # 1 and 1.5


def test_noise_is_gaussian_with_the_stated_std_and_comes_from_the_secret_source():
    """Noise minus the true histogram over 100 default (OS CSPRNG) draws: mean 0 within
    5 standard errors, std sigma within 3 % (its relative standard error is 0.45 % here),
    and two draws never coincide (nothing seeded)."""
    from fedfdp.data.private_statistics import NUM_BUCKETS, histogram, noisy_histogram

    values = np.arange(100.0)
    sigma = 3.7
    noise = np.stack([noisy_histogram(values, sigma) - histogram(values) for _ in range(100)]).ravel()
    n = noise.size
    assert n == 100 * NUM_BUCKETS
    assert abs(noise.mean()) < 5 * sigma / np.sqrt(n)
    assert abs(noise.std() / sigma - 1) < 0.03
    assert not np.array_equal(noisy_histogram(values, sigma), noisy_histogram(values, sigma))


def test_the_range_covers_the_data_buckets_and_no_empty_bucket_with_the_stated_probability():
    """Ages uniform on 18..65 (2000 records): the buckets [16, 32), [32, 64), [64, 128) hold
    ~580, ~1330 and ~83 records, all above tau + sigma z(1 - beta); every other bucket is empty.
    The module's statement: each full bucket is missed with probability <= beta and some empty
    one passes with probability <= beta, so the range is exactly [16, 128) with probability
    >= 1 - 4 beta = 0.96. Over 300 releases the failures are Binomial(300, <= 0.04): mean <= 12;
    more than 30 has probability < 1e-5."""
    from fedfdp.data.private_statistics import FALSE_BUCKET_PROBABILITY, released_range, threshold

    rng = np.random.default_rng(5)
    ages = rng.integers(18, 66, 2000).astype(float)
    sigma = 4.0
    assert np.sum(ages >= 64) > threshold(sigma) + sigma * 2.33  # the full-bucket condition holds
    failures = sum(released_range(ages, sigma) != (16.0, 128.0) for _ in range(300))
    assert FALSE_BUCKET_PROBABILITY == 0.01
    assert failures <= 30


def test_too_few_records_for_the_budget_are_refused_in_one_line(tmp_path, monkeypatch):
    import fedfdp.data.private_statistics as ps
    from fedfdp.data import DataError, load_dataset

    # noise-free draws: the refusal is the threshold's (counts of about 10 and 20 below τ ≈ 43),
    # not a matter of chance (with the secret draws some bucket clears τ in about 3 % of runs)
    monkeypatch.setattr(ps, "secret_normals", lambda n: np.zeros(n))
    path = _table(tmp_path / "t.csv", n=40)
    cfg = load_config({"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
                       "private-columns": "age", "label-column": "label", "num-devices": 2,
                       "private-statistics": "estimate", "estimation-epsilon": 0.05})
    with pytest.raises(DataError, match=r"column 'age': no bucket of its noisy histogram clears the thresh"):
        load_dataset(cfg.data)


# ----------------------------------------------------------------- the property


@pytest.mark.parametrize("seed", range(20))
def test_replacing_one_private_value_changes_the_release_only_through_the_noisy_histogram(tmp_path, seed):
    """With the noise injected, D and D' (one record's age replaced) release the same range
    and the same encoding of every other record whenever their noisy histograms are equal
    (noise z for D, z + (h(D) - h(D')) / sigma for D'): the data reach the released layout only
    through the noisy histogram. And h(D) - h(D') has L1 norm <= 2 (L2 <= sqrt 2): two buckets."""
    from fedfdp.data.encoding import table_encoding
    from fedfdp.data.private_statistics import (
        NUM_BUCKETS,
        estimate_private_ranges,
        estimation_events,
        histogram,
    )

    rng = np.random.default_rng(seed)
    n = 300
    frame = pd.DataFrame({"speed": rng.normal(size=n), "age": rng.integers(18, 90, n).astype(float),
                          "label": rng.integers(0, 2, n)})
    other = frame.copy()
    victim = int(rng.integers(n))
    other.loc[victim, "age"] = float(rng.choice([0.5, 17.0, 40.0, 1e6, -3.0]))
    train = np.ones(n, dtype=bool)
    cfg = load_config({"dataset": "csv", "data-path": "unused.csv", "public-columns": "speed",
                       "private-columns": "age", "label-column": "label", "num-devices": 2,
                       "private-statistics": "estimate", "estimation-epsilon": 1.0}).data
    diff = histogram(frame["age"].to_numpy()) - histogram(other["age"].to_numpy())
    assert np.abs(diff).sum() <= 2 and np.count_nonzero(diff) <= 2
    z = rng.normal(size=NUM_BUCKETS)
    shift = diff / estimation_events(cfg, n)[0].event.noise_multiplier
    released = estimate_private_ranges(cfg, frame, train, normals=lambda k: z)
    released_other = estimate_private_ranges(cfg, other, train, normals=lambda k: z + shift)
    assert released.estimated_ranges == released_other.estimated_ranges
    x = table_encoding(released, frame, train).encode(frame)
    x_other = table_encoding(released_other, other, train).encode(other)
    keep = np.arange(n) != victim
    np.testing.assert_array_equal(x[keep], x_other[keep])


# ----------------------------------------------------------------- charged, in the printed ε


@pytest.mark.slow
def test_an_estimate_run_prints_an_epsilon_that_includes_the_estimates(tmp_path):
    """The real CLI with two estimated columns and a fixed sigma: the ledger holds the two
    estimates right after the mechanism, config.toml the released ranges, and the printed
    epsilon is dp-accounting's composition of every ledger event (independent reference),
    above the rounds alone; the estimates' own epsilon at 1/(2N) is the declared share."""
    from fedfdp.ledger import EntryKind
    from tests.references import dp_ref_eps, gaussian_eps_ref

    path = _table(tmp_path / "t.csv", n=600)
    out = tmp_path / "run"
    argv = [*CLI, "run", "--centralised", "--out", str(out),
            *_keys(path, private="age,income", **{"private-statistics": "estimate", "noise-multiplier": "1.0",
                                                   "clipping-quantile": "0", "num-rounds": "4",
                                                   "estimation-epsilon": "0.4"})]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = float(proc.stdout.split("epsilon=")[1].split()[0])
    ledger = written_ledger(out)
    kinds = [e.kind for e in ledger.entries]
    assert kinds[:3] == [EntryKind.MECHANISM, EntryKind.ESTIMATE, EntryKind.ESTIMATE]
    assert [e.body["statistic"] for e in ledger.entries[1:3]] == ["encoding of 'age'", "encoding of 'income'"]
    estimates = events_as(ThresholdedHistogram, (e.event for e in ledger.entries[1:3]))
    rounds = events_as(SubsampledGaussian, (e.event for e in ledger.entries[3:]))
    assert len(rounds) == 4 and all(e.sampling_rate == 1.0 for e in estimates)
    config = (out / "config.toml").read_text()
    assert 'private-statistics = "estimate"' in config and "estimated-ranges = \"age=" in config
    delta = float(ledger.mechanism["delta"])
    every = [(e.noise_multiplier, e.sampling_rate, 1) for e in estimates + rounds]
    alone = [(e.noise_multiplier, e.sampling_rate, 1) for e in rounds]
    reference = dp_ref_eps(every, delta)
    assert printed >= reference - 0.01  # an upper bound (PLD's own discretisation: 1e-4)
    assert printed <= reference + 0.1  # within the accountant's eps_error (0.05) and its mesh
    assert printed > dp_ref_eps(alone, delta) + 0.05  # the estimates are in it
    num_records = int(ledger.mechanism["num_records"])
    sigma_e = estimates[0].noise_multiplier
    own = gaussian_eps_ref(np.sqrt(2) / sigma_e, 1 / (2 * num_records))  # two Gaussians: mu = sqrt(2)/sigma
    assert 0.35 <= own <= 0.4 + 1e-9
    # the budget split in config.toml [resolved]: the estimates alone, and with every planned round
    import tomllib

    resolved = tomllib.loads(config)["resolved"]
    assert resolved["estimates"] == ["encoding of 'age'", "encoding of 'income'"]
    thresholds = sum(-np.log1p(-e.threshold_delta) for e in estimates)  # their delta, set aside
    alone_ref = gaussian_eps_ref(np.sqrt(2) / sigma_e, delta - thresholds)
    assert alone_ref - 0.01 <= resolved["estimates-epsilon"] <= alone_ref + 0.1
    assert resolved["planned-epsilon"] == pytest.approx(printed, abs=1e-3)  # all 4 rounds ran


def test_a_target_epsilon_is_met_by_the_composition_of_estimates_and_rounds(tmp_path):
    """resolve_mechanism calibrates training on what the estimates leave: the composed upper
    epsilon is at most the target, the training sigma is larger than without estimates, and the
    mechanism's dict (the ledger's entry 0) lists the estimates; without them the digest is
    that of a configuration that never heard of estimates."""
    from fedfdp.accounting import FDPAccountant
    from fedfdp.budget import Budget
    from fedfdp.ledger import EntryKind, Ledger
    from fedfdp.mechanism import PublicFacts, resolve_mechanism

    base = {"dataset": "csv", "data-path": "unused.csv", "public-columns": "speed",
            "private-columns": "age,income", "label-column": "label", "num-devices": 2,
            "private-ranges": "age=0:120", "target-epsilon": 2.0, "clipping-quantile": 0.0,
            "num-rounds": 30}
    facts = PublicFacts((300, 300), num_params=10)
    declared = resolve_mechanism(load_config({**base, "private-ranges": "age=0:120,income=0:1e4"}), facts)
    estimated = resolve_mechanism(load_config({**base, "private-statistics": "estimate"}), facts)
    assert declared.estimates == () and "estimates" not in declared.to_dict()
    assert [e.statistic for e in estimated.estimates] == ["encoding of 'income'"]  # age is declared
    assert estimated.noise_multiplier is not None and declared.noise_multiplier is not None
    assert estimated.noise_multiplier > declared.noise_multiplier
    budget = Budget(estimated, FDPAccountant())
    assert isinstance(budget.accountant, FDPAccountant)
    assert budget.accountant.rounds == 1  # a fresh run starts with its estimate
    assert estimated.event is not None
    budget.spend(estimated.event, 30)
    assert budget.epsilon() <= 2.0
    ledger = Ledger.start(estimated.to_dict(), estimated.digest())
    assert [e.kind for e in ledger.entries] == [EntryKind.MECHANISM, EntryKind.ESTIMATE]
    assert Ledger.from_dict(ledger.to_dict()).events() == [estimated.estimates[0].event]
    # a resumed run replays the estimate from the ledger: not composed twice
    from fedfdp.mechanism import replay

    resumed = Budget(estimated, replay(ledger.events(), FDPAccountant))
    assert isinstance(resumed.accountant, FDPAccountant)
    assert resumed.accountant.rounds == 1


def test_an_edited_estimate_entry_is_refused(tmp_path):
    from fedfdp.ledger import Ledger
    from fedfdp.mechanism import PublicFacts, resolve_mechanism

    cfg = load_config({"dataset": "csv", "data-path": "unused.csv", "public-columns": "speed",
                       "private-columns": "age", "label-column": "label", "num-devices": 2,
                       "private-statistics": "estimate", "noise-multiplier": 1.0})
    m = resolve_mechanism(cfg, PublicFacts((300, 300), num_params=10))
    doc = Ledger.start(m.to_dict(), m.digest()).to_dict()
    doc["entries"] = doc["entries"][:1]  # the estimate dropped, the chain still valid
    doc["entries"].append(Ledger.start({"x": 1}, "d" * 64).to_dict()["entries"][0] | {"kind": "charge"})
    with pytest.raises(ValueError):
        Ledger.from_dict(doc)
    short = Ledger.start(m.to_dict(), m.digest())
    short.entries = short.entries[:1]
    assert m.event is not None
    short.append_charge(1, 0, m.event)
    with pytest.raises(ValueError, match="estimate entries differ from the estimates its mechanism lists"):
        Ledger.from_dict(short.to_dict())


# ----------------------------------------------------------------- CorrDP's released TVs


@pytest.mark.parametrize("seed", range(5))
def test_replacing_one_record_changes_the_released_tvs_only_through_the_noise(seed):
    """D and D' differ in one record's sensitive sign. Without noise the in-sample TVs move by
    at most c3/n = 4/(pi_min n) (the sensitivity the noise is calibrated to); with noise z for D
    and z + (TV_D - TV_D')/noise_std for D', the released TVs, hence the design's TVs, are
    identical: the data reach the design only through the noisy release."""
    import dataclasses

    from fedfdp.corrdp.run import corrdp_setup
    from fedfdp.data import DeviceData, load_dataset

    cfg = load_config({"mode": "corrdp", "dataset": "correlated", "num-sensitive": 1, "num-insensitive": 2,
                       "num-devices": 4, "records-per-device": 300, "correlation": 0.3, "data-seed": seed,
                       "clipping-quantile": 0.0, "tv-estimate": True, "tv-bins": "*=0", "tv-min-prob": 0.45})
    data = load_dataset(cfg.data)
    rng = np.random.default_rng(seed)
    device = int(rng.integers(len(data.devices)))
    row = int(rng.integers(len(data.devices[device])))
    x = np.array(data.devices[device].x, copy=True)
    x[row, 0] = -x[row, 0]  # the sensitive sign replaced
    devices = list(data.devices)
    devices[device] = DeviceData(x, data.devices[device].y)
    other = dataclasses.replace(data, devices=tuple(devices))
    n = data.num_records
    zero = np.zeros
    exact = corrdp_setup(cfg, data, normals=zero).estimates
    exact_other = corrdp_setup(cfg, other, normals=zero).estimates
    for f in exact:
        assert abs(exact[f].noisy - exact_other[f].noisy) <= 4 / (0.45 * n) + 1e-12
    z = rng.normal(size=len(exact))
    shift = np.array([(exact[f].noisy - exact_other[f].noisy) / exact[f].noise_std for f in exact])
    mine = corrdp_setup(cfg, data, normals=lambda k: z)
    theirs = corrdp_setup(cfg, other, normals=lambda k: z + shift)
    for f in exact:
        assert mine.estimates[f].noisy == pytest.approx(theirs.estimates[f].noisy, abs=1e-12)
    assert mine.design.roles.tv == pytest.approx(theirs.design.roles.tv, abs=1e-12)


@pytest.mark.slow
def test_the_flower_path_estimates_once_and_every_process_encodes_with_the_released_ranges(tmp_path):
    """fedfdp run on Flower's simulation engine: the CLI releases the range once and writes it to
    the run's configuration; the ServerApp charges it (one estimate entry) and the printed epsilon
    is the ledger's (fedfdp account --run recomputes it)."""
    import json

    from fedfdp.ledger import EntryKind

    path = _table(tmp_path / "t.csv", n=400)
    out = tmp_path / "run"
    keys = _keys(path, private="age", **{"private-statistics": "estimate", "num-rounds": "3"})
    proc = subprocess.run([*CLI, "run", "--out", str(out), *keys], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = float(proc.stdout.split("epsilon=")[1].split()[0])
    ledger = written_ledger(out)
    assert [e.kind for e in ledger.entries].count(EntryKind.ESTIMATE) == 1
    assert 'estimated-ranges = "age=' in (out / "config.toml").read_text()
    account = subprocess.run([*CLI, "account", "--run", str(out), "--json"], capture_output=True, text=True,
                             timeout=300)
    assert account.returncode == 0, account.stderr
    report = json.loads(account.stdout)
    assert report["estimates"] == ["encoding of 'age'"] and report["rounds"] == 3
    assert report["epsilon"] == pytest.approx(printed, abs=1e-3)


# ----------------------------------------------------------------- private categories (thresholded)


def _ref_threshold_delta(event) -> float:
    """δ_t from scipy's normal tail directly: P(1 + σZ > τ) for the event's own τ."""
    from scipy import stats

    return float(stats.norm.sf((event.threshold() - 1.0) / event.noise_multiplier))


def test_a_thresholded_histogram_round_trips_and_its_threshold_releases_a_singleton_with_prob_delta_t():
    from fedfdp.accounting.events import ThresholdedHistogram, event_from_dict

    for sigma, delta_t in ((0.5, 1e-9), (4.0, 1e-6), (30.0, 0.01)):
        ev = ThresholdedHistogram(sigma, delta_t)
        assert event_from_dict(json.loads(json.dumps(ev.to_dict()))) == ev
        assert _ref_threshold_delta(ev) == pytest.approx(delta_t, rel=1e-6)
        assert ev.gaussian() != ev and ev.gaussian().sampling_rate == 1.0
    for bad in (0.0, 0.5, -1e-3, float("nan")):
        with pytest.raises(ValueError, match="threshold_delta="):
            ThresholdedHistogram(1.0, bad)


@pytest.mark.parametrize("relation", ["add-remove", "replacement"])
def test_the_accountant_reports_the_gaussian_parts_at_delta_minus_the_thresholds_delta(relation):
    """Independent reference: the composed Gaussians in closed form, mu = sqrt(sum 1/sigma^2),
    with delta_t from scipy's tail: add/remove at delta - sum -ln(1 - delta_t); replacement by
    Proposition 1 from that statement (a grid search over the add/remove delta); strictly
    more than with no threshold."""
    from fedfdp.accounting import FDPAccountant
    from fedfdp.accounting.events import SubsampledGaussian, ThresholdedHistogram
    from tests.references import gaussian_eps_ref

    delta = 1e-5
    scale = 1.0 if relation == "add-remove" else 0.02  # replacement pays (1 + e^ε) times the δ_t
    thresholded = [ThresholdedHistogram(3.0, 1e-6 * scale), ThresholdedHistogram(3.0, 1e-6 * scale),
                   ThresholdedHistogram(6.0, 5e-7 * scale)]
    gaussians = [SubsampledGaussian(2.0, 1.0)]
    acc, plain = FDPAccountant(), FDPAccountant()
    for ev in thresholded:
        acc.compose(ev)
        plain.compose(ev.gaussian())
    for g in gaussians:
        acc.compose(g)
        plain.compose(g)
    cost = sum(-np.log1p(-_ref_threshold_delta(ev)) for ev in thresholded)
    assert cost > sum(ev.threshold_delta for ev in thresholded)  # −ln(1 − δ_t) ≥ δ_t
    got = acc.epsilon_bound(delta, relation)
    if relation == "add-remove":
        mu = np.sqrt(sum(1 / e.noise_multiplier**2 for e in thresholded + gaussians))
        ref = gaussian_eps_ref(mu, delta - cost)
        assert ref <= got.upper <= ref + 2e-9 * (1 + ref)
        assert got.upper > gaussian_eps_ref(mu, delta) + 0.01  # the thresholds' δ is not free
        assert got.lower <= gaussian_eps_ref(mu, delta) + 1e-9  # the lower end stays a lower bound
    else:  # Proposition 1 from (ε_G(d), d + cost): min 2 ε_G(d) over (d + cost)(1 + e^ε_G(d)) <= delta
        mu = np.sqrt(sum(1 / e.noise_multiplier**2 for e in thresholded + gaussians))
        from scipy import optimize

        def excess(d: float) -> float:
            return (d + cost) * (1 + np.exp(gaussian_eps_ref(mu, d))) - delta

        grid = np.geomspace(1e-12, delta, 400)  # ε_G falls in d: the optimum is the largest feasible d
        last = int(np.flatnonzero([excess(d) <= 0 for d in grid])[-1])
        ref = 2 * gaussian_eps_ref(mu, optimize.brentq(excess, grid[last], grid[last + 1], xtol=1e-18))
        assert ref - 1e-6 <= got.upper <= ref + 0.02
        assert got.upper > plain.epsilon(delta, relation) + 0.01
    # what the thresholds leave no delta for is infinite, not a number
    assert math.isinf(acc.epsilon(cost * 0.999))
    # the state round-trips through JSON with its events, and the replay gives the same epsilon
    again = FDPAccountant()
    again.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert again.ledger == acc.ledger and again.epsilon(delta, relation) == got.upper


def test_calibration_meets_the_target_with_the_thresholds_delta_included_and_refuses_when_none_is_left():
    from fedfdp.accounting import FDPAccountant
    from fedfdp.accounting.events import ThresholdedHistogram
    from fedfdp.accounting.protocol import calibrate
    from tests.references import gaussian_eps_ref

    delta, delta_t, k = 1e-5, 1e-7, 3
    sigma = calibrate(FDPAccountant, lambda s: ThresholdedHistogram(s, delta_t), target_epsilon=1.0,
                      rounds=k, delta=delta)
    cost = k * -np.log1p(-delta_t)
    assert gaussian_eps_ref(np.sqrt(k) / sigma, delta - cost) <= 1.0 + 1e-6
    assert gaussian_eps_ref(np.sqrt(k) / (sigma / 1.002), delta - cost) > 1.0  # the smallest, to rtol
    refused = r"target-epsilon=1: unreachable at delta=2e-07: epsilon is infinite"
    with pytest.raises(ValueError, match=refused):
        calibrate(FDPAccountant, lambda s: ThresholdedHistogram(s, 1e-7), target_epsilon=1.0, rounds=3,
                  delta=2e-7)


def test_released_categories_keep_each_value_with_the_stated_probability_from_the_secret_source():
    """Statistics (OS CSPRNG, the default source): a value held by c records is released
    with probability P(c + σZ > τ) = Φ̄((τ − c)/σ) (scipy), for c = 1 (that is δ_t), near τ,
    and far above; absent values never; 3000 trials, tolerance 5 binomial sd."""
    from scipy import stats

    from fedfdp.accounting.events import ThresholdedHistogram
    from fedfdp.data.private_statistics import category_counts, released_categories

    ev = ThresholdedHistogram(2.0, 0.1)  # τ ≈ 3.56
    tau = ev.threshold()
    values = ["one"] + ["four"] * 4 + ["five"] * 5 + ["many"] * 12 + [None, float("nan")]
    assert category_counts(values) == {"one": 1, "four": 4, "five": 5, "many": 12}
    trials = 3000
    hits = {k: 0 for k in ("one", "four", "five", "many")}
    for _ in range(trials):
        released = released_categories(values, ev)
        assert set(released) <= set(hits) and list(released) == sorted(released)
        for k in released:
            hits[k] += 1
    for key, c in (("one", 1), ("four", 4), ("five", 5), ("many", 12)):
        p = float(stats.norm.sf((tau - c) / 2.0))
        sd = np.sqrt(p * (1 - p) / trials)
        assert abs(hits[key] / trials - p) <= 5 * sd + 1e-3, (key, hits[key] / trials, p)
    assert float(stats.norm.sf((tau - 1) / 2.0)) == pytest.approx(0.1, rel=1e-9)


def test_released_categories_add_sigma_times_the_source_and_keep_what_clears_tau():
    """The noisy count is exactly count + σ·z for the injected draws (sorted values)."""
    from fedfdp.accounting.events import ThresholdedHistogram
    from fedfdp.data.private_statistics import released_categories

    ev = ThresholdedHistogram(3.0, 1e-3)
    tau = ev.threshold()
    values = ["b"] * 10 + ["a"] * 20 + ["c"]
    z = np.array([(tau - 20) / 3 + 1e-6, (tau - 10) / 3 - 1e-6, 10.0])  # a just clears, b just misses
    assert released_categories(values, ev, lambda n: z[:n]) == ("a", "c")
    with pytest.raises(ValueError, match="noise source gave shape"):
        released_categories(values, ev, lambda n: np.zeros(n + 1))


def test_estimation_events_charge_every_estimated_column_one_thresholded_histogram_within_its_epsilon():
    """One ThresholdedHistogram(σ_e, δ_e/(10k)) per estimated column, whatever its type (a
    function of the configuration and N); their composition (closed form, independent) meets
    estimation-epsilon at δ_e = 1/(2N) with the thresholds' δ taken off."""
    from fedfdp.accounting import FDPAccountant
    from fedfdp.accounting.events import ThresholdedHistogram
    from fedfdp.data.private_statistics import estimation_events
    from tests.references import gaussian_eps_ref

    cfg = load_config({"dataset": "csv", "data-path": "unused.csv", "public-columns": "speed",
                       "private-columns": "age,city,job", "label-column": "label",
                       "private-statistics": "estimate", "estimation-epsilon": 0.5}).data
    n = 2000
    events = estimation_events(cfg, n)
    assert [e.statistic for e in events] == ["encoding of 'age'", "encoding of 'city'", "encoding of 'job'"]
    assert all(isinstance(e.event, ThresholdedHistogram) for e in events)
    assert len({e.event for e in events}) == 1
    first = events[0].event
    assert isinstance(first, ThresholdedHistogram)
    sigma = first.noise_multiplier
    delta_e = 1 / (2 * n)
    assert first.threshold_delta == pytest.approx(delta_e / 30)
    cost = sum(-np.log1p(-_ref_threshold_delta(e.event)) for e in events)
    ref = gaussian_eps_ref(np.sqrt(3) / sigma, delta_e - cost)
    assert 0.49 <= ref <= 0.5 + 1e-6
    acc = FDPAccountant()
    for e in events:
        acc.compose(e.event)
    assert acc.epsilon(delta_e) <= 0.5 + 1e-6


@pytest.mark.slow
def test_a_text_column_run_is_charged_its_categories_and_replayed_by_fedfdp_account(tmp_path):
    """The real CLI with a text column under estimate: config.toml holds the released
    categories, the ledger a ThresholdedHistogram estimate, and `fedfdp account --run` in a
    fresh process replays it to the ε the run printed, which is above that of the same ledger
    with the plain Gaussian (the thresholds' δ is charged)."""
    from fedfdp.accounting import FDPAccountant

    path = _table(tmp_path / "t.csv", n=600)
    out = tmp_path / "run"
    argv = [*CLI, "run", "--centralised", "--out", str(out),
            *_keys(path, private="age,city", **{"private-statistics": "estimate", "noise-multiplier": "1.0",
                                                 "private-ranges": "age=0:120", "clipping-quantile": "0",
                                                 "num-rounds": "3", "estimation-epsilon": "0.4"})]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = float(proc.stdout.split("epsilon=")[1].split()[0])
    assert 'estimated-categories = "city=Lyon|Paris"' in (out / "config.toml").read_text()
    ledger = written_ledger(out)
    estimate = ledger.entries[1]
    assert estimate.body["statistic"] == "encoding of 'city'"
    assert isinstance(estimate.event, ThresholdedHistogram)
    account = subprocess.run([*CLI, "account", "--run", str(out), "--json"], capture_output=True, text=True,
                             timeout=600)
    assert account.returncode == 0, account.stderr[-2000:]
    replayed = json.loads(account.stdout)["epsilon"]
    assert replayed == pytest.approx(printed, abs=1e-4)
    delta = float(ledger.mechanism["delta"])
    plain = FDPAccountant()
    for e in map(fdp_event, ledger.events()):
        plain.compose(e.gaussian() if isinstance(e, ThresholdedHistogram) else e)
    assert replayed > plain.epsilon(delta)
