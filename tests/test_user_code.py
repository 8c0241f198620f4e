"""Your own model and data by import path (``model = "pkg.mod:build"``,
``dataset = "pkg.mod:load"``), and as objects in Python."""

import numpy as np
import pytest
import torch

from fedfdp import ConfigError, FeatureMap, load_config, run_centralised
from fedfdp.data import load_dataset
from fedfdp.models import build_model_for
from tests.plugin_pkg.user import TwoLayer

BASE = {"num-rounds": 3, "num-devices": 3, "progress": False, "records-per-device": 30}


def test_model_and_dataset_by_import_path_run_end_to_end():
    cfg = load_config({**BASE, "model": "tests.plugin_pkg.user:build",
                       "dataset": "tests.plugin_pkg.user:load", "public-loss": "zero"})
    data = load_dataset(cfg.data)
    assert data.name == "mine" and data.num_records == 90
    assert isinstance(build_model_for(cfg.training, data), TwoLayer)
    model, rows = run_centralised(cfg)
    assert isinstance(model, TwoLayer) and len(rows) == 3 and rows[-1]["epsilon"] <= 2.0


def test_your_model_and_feature_map_as_objects():
    cfg = load_config(BASE)
    data = load_dataset(cfg.data)
    model = torch.nn.Sequential(torch.nn.Linear(data.num_features, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, data.num_classes))
    fmap = FeatureMap(view=lambda x, g: torch.zeros_like(x))  # Ψ discloses nothing: a user callable
    out, rows = run_centralised(cfg, data, model=model, feature_map=fmap)
    assert out is model and len(rows) == 3


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("model", "not a path",
         "model='not a path': must be one of mlp, logistic, cnn, ddpm or an import path"),
        ("model", "no_such_pkg.mod:build", "cannot import 'no_such_pkg.mod'"),
        ("model", "tests.plugin_pkg.user:nothing", "has no callable 'nothing'"),
        ("model", "tests.plugin_pkg.user:not_a_model", "returned str, not a torch.nn.Module"),
        ("dataset", "tests.plugin_pkg.user:build", "raised TypeError: build() missing 1 required"),
    ],
)
def test_bad_import_paths_are_one_line_errors(key, value, message):
    with pytest.raises(ConfigError) as err:
        cfg = load_config({**BASE, key: value})
        data = load_dataset(cfg.data)
        build_model_for(cfg.training, data)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_view_that_changes_the_shape_is_refused():
    fmap = FeatureMap(view=lambda x, g: x[:, :1])
    with pytest.raises(ValueError, match="public view must keep the batch's shape"):
        fmap.check(torch.as_tensor(np.zeros((2, 3), dtype=np.float32)))
