"""Tables as users have them, and metrics that say something.

Bad cells never pass silently (a text value in a numeric column, inf, duplicate
column names, a continuous label), a public device column may be a feature and
a private one is refused with the reason; the metrics against independent
computations (pairwise AUC, per-class recalls)."""

import itertools

import numpy as np
import pytest
import torch

from fedfdp.config import ConfigError, load_config
from fedfdp.data import DataError, load_dataset
from fedfdp.evaluation import binary_auc, held_out_metrics


def _table(tmp_path, rows, header="site,speed,heading,lat,y"):
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def _cfg(path, **kw):
    base = {"dataset": "csv", "data-path": str(path), "label-column": "y",
            "public-columns": ["speed", "heading"], "private-columns": ["lat"], "num-devices": 2,
            "test-fraction": 0.2}
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
    with pytest.raises(DataError, match=r"column 'heading': non-finite input values \(data row 6 holds inf"):
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
    assert len(data.devices) == 4 and "site=s0" in data.spec.public
    with pytest.raises(ConfigError, match="contains the device-column 'site'; which device holds a record"):
        _cfg(path, **{"device-column": "site", "private-columns": ["lat", "site"]})


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
