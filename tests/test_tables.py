"""Tables as users have them, and metrics that say something.

Bad cells never pass silently (a text value in a numeric column, inf, duplicate
column names, a continuous label), a public device column may be a feature and
a private one is refused with the reason; the metrics against independent
computations (pairwise AUC, per-class recalls)."""

import itertools
import json
import tomllib

import numpy as np
import pytest
import torch

from fedfdp.config import ConfigError, load_config
from fedfdp.data import DataError, load_dataset
from fedfdp.evaluation import binary_auc, held_out_metrics
from fedfdp.run_plan import resolve_released
from simulations.cli import main


def _table(tmp_path, rows, header="site,speed,heading,lat,y"):
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def _cfg(path, **kw):
    base = {"dataset": "csv", "data-path": str(path), "label-column": "y",
            "public-columns": ["speed", "heading"], "private-columns": ["lat"], "num-devices": 2,
            "test-fraction": 0.2, "private-ranges": "lat=-90:90"}
    return load_config({**base, **kw})


def _rows(n=60, bad=None):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        speed = "fast" if bad == i else f"{rng.normal():.3f}"
        out.append(f"s{i % 4},{speed},{rng.normal():.3f},{rng.normal():.3f},{i % 2}")
    return out


def test_a_text_value_in_a_numeric_column_is_an_error_naming_column_and_row(tmp_path):
    path = _table(tmp_path, _rows(bad=17))
    match = r"column 'speed': .*\['fast'\] are not numbers \(first at data row 18"
    with pytest.raises(DataError, match=match):
        load_dataset(_cfg(path).data)


def test_inf_names_its_column(tmp_path):
    rows = _rows()
    rows[5] = "s1,0.1,inf,0.2,1"
    match = r"column 'heading': value\(s\) \['inf'\] are non-finite input values \(first at data row 6"
    with pytest.raises(DataError, match=match):
        load_dataset(_cfg(_table(tmp_path, rows)).data)


def test_duplicate_column_names_are_an_error(tmp_path):
    path = _table(tmp_path, [r + ",1" for r in _rows()], header="site,speed,heading,lat,y,speed")
    with pytest.raises(DataError, match=r"duplicate column name\(s\) \['speed'\]"):
        load_dataset(_cfg(path).data)


def test_a_continuous_label_asks_for_label_classes(tmp_path):
    rng = np.random.default_rng(1)
    rows = [f"s{i % 3},{rng.normal():.3f},{rng.normal():.3f},{rng.normal():.3f},{rng.normal() * 100:.2f}"
            for i in range(300)]
    match = r"label-column='y': 2\d\d distinct values .* declared in label-classes"
    with pytest.raises(DataError, match=match):
        load_dataset(_cfg(_table(tmp_path, rows)).data)


def test_a_public_device_column_may_be_a_feature_a_private_one_is_refused(tmp_path):
    path = _table(tmp_path, _rows())
    data = load_dataset(_cfg(path, **{"device-column": "site", "num-devices": 4,
                                     "public-columns": ["speed", "heading", "site"]}).data)
    assert data.spec is not None
    assert len(data.devices) == 4 and "site=s0" in data.spec.public
    with pytest.raises(ConfigError, match="contains the device-column 'site'; which device holds a record"):
        _cfg(path, **{"device-column": "site", "private-columns": ["lat", "site"]})


def _base(path, **kw):
    """A csv configuration without num-devices (the user's first try)."""
    return {"dataset": "csv", "data-path": str(path), "label-column": "y",
            "public-columns": ["speed", "heading"], "private-columns": ["lat"], "test-fraction": 0.2,
            "private-ranges": "lat=-90:90", **kw}


def test_with_a_device_column_num_devices_defaults_to_the_devices_in_the_file(tmp_path):
    """Sites s0..s4 (5, not the default 20): one device per site, each holding
    exactly that site's rows (checked through the public one-hot of the site)."""
    rows = [r.replace(f"s{i % 4},", f"s{i % 5},", 1) for i, r in enumerate(_rows(100))]
    cfg = load_config(_base(_table(tmp_path, rows), **{"device-column": "site",
                                                      "public-columns": ["speed", "heading", "site"]}))
    assert cfg.data.num_devices == 0
    data = load_dataset(cfg.data)
    assert len(data.devices) == 5 and data.spec is not None
    site_cols = [data.spec.columns.index(f"site=s{k}") for k in range(5)]
    seen = set()
    for dev in data.devices:
        sites = {int(np.argmax(x[site_cols])) for x in dev.x}
        assert len(sites) == 1
        seen |= sites
    assert seen == set(range(5))
    assert resolve_released(cfg, data).data.num_devices == 5
    assert resolve_released(cfg).data.num_devices == 5
    # an explicit num-devices still groups whole sites
    assert len(load_dataset(load_config({**_base(tmp_path / "t.csv"), "device-column": "site",
                                         "num-devices": 2}).data).devices) == 2


def test_the_cli_writes_the_resolved_device_count(tmp_path):
    rows = [r.replace(f"s{i % 4},", f"s{i % 3},", 1) for i, r in enumerate(_rows(90))]
    path = _table(tmp_path, rows)
    out = tmp_path / "run"
    sets = [f"{k}={json.dumps(v)}" for k, v in _base(path, **{"device-column": "site", "num-rounds": 2,
                                                             "progress": False}).items()]
    assert main(["run", "--centralised", "--out", str(out), *[a for s in sets for a in ("--set", s)]]) == 0
    written = tomllib.loads((out / "config.toml").read_text())
    assert written["num-devices"] == 3


@pytest.mark.parametrize("extra", [{"dataset": "fleet"}, {"dataset": "watch"}])
def test_num_devices_zero_needs_a_device_column(extra):
    with pytest.raises(ConfigError, match="num-devices=0 .*needs dataset='csv' with a device-column"):
        load_config({"num-devices": 0, **extra})


def test_binary_auc_matches_the_pairwise_definition():
    rng = np.random.default_rng(2)
    for _ in range(20):
        n = int(rng.integers(5, 40))
        scores = rng.integers(0, 6, n).astype(float)  # many ties
        labels = rng.integers(0, 2, n).astype(bool)
        if labels.all() or not labels.any():
            continue
        pairs = [(1.0 if a > b else 0.5 if a == b else 0.0)
                 for a, b in itertools.product(scores[labels], scores[~labels])]
        assert binary_auc(scores, labels) == pytest.approx(np.mean(pairs))
    assert np.isnan(binary_auc(np.ones(3), np.ones(3, dtype=bool)))


def test_held_out_metrics_of_a_majority_predictor():
    """A model that always predicts class 0 on 90 % class-0 data: accuracy 0.9,
    balanced accuracy 0.5, AUC 0.5 (constant score), log loss of its probabilities."""
    y = np.array([0] * 90 + [1] * 10)
    x = np.zeros((100, 3), dtype=np.float32)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(torch.tensor([2.0, 0.0]))
    m = held_out_metrics(model, x, y)
    p1 = 1 / (1 + np.exp(2.0))
    expect_loss = -(0.9 * np.log(1 - p1) + 0.1 * np.log(p1))
    assert m["accuracy"] == pytest.approx(0.9) and m["balanced_accuracy"] == pytest.approx(0.5)
    assert m["auc"] == pytest.approx(0.5) and m["loss"] == pytest.approx(expect_loss, rel=1e-6)
