"""Images in the run configuration: the datasets, Ψ = blur and ``model = "cnn"``
through the same client, strategy, server and centralised engine as the tables.

* ``fedfdp compare`` on scikit-learn's 8×8 digits, every mode, end to end (seconds).
* The parts a configuration selects: the blur of the ``blur-*`` keys as the public
  view (``ℓ_priv + ℓ_pub = ℓ`` record by record), DigitCNN, flattened linear models.
* The Flower path (real client and strategy code) and the centralised engine run
  the same plan on images and end at the same model.
* Loaders from the configuration: ``image-pool``, ``max-records``, a user's NPZ and
  PNG folder through ``dataset = "images"``.
* Bad input refused with one line naming the key and the value.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("sklearn")

from fedfdp.algorithm import run_centralised
from fedfdp.config import ConfigError, load_config
from fedfdp.contribution import trainable
from fedfdp.data import DataError, load_dataset
from fedfdp.images import DigitCNN, GaussianBlur
from fedfdp.models import build_model_for
from fedfdp.run_plan import feature_map_for, server_parts_for
from tests.flower_helpers import InProcessGrid, registered_strategy
from tests.mechanism_helpers import ledger_doc

DIGITS = {
    "dataset": "digits", "model": "cnn", "cnn-width": 4, "hidden-size": 16, "num-devices": 4,
    "blur-kernel": 5, "blur-sigma": 1.0, "progress": False,
}


def test_compare_on_digits_end_to_end(tmp_path, capsys):
    from simulations.cli import main

    sweep = tmp_path / "digits.toml"
    sweep.write_text(
        'modes = ["nonprivate", "public", "dp", "fdp-dpsgd", "fdp"]\ntarget-epsilons = [4.0]\n'
        "seeds = [0]\nnum-rounds = 4\nsampling-rate = 0.05\npublic-batch-size = 32\n"
        "eval-every = 2\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in DIGITS.items() if k != "progress")
        + "[mode.fdp-dpsgd]\npublic-pretrain-rounds = 2\n"
    )
    out = tmp_path / "out"
    assert main(["compare", "--config", str(sweep), "--out", str(out), "--no-progress"]) == 0
    assert "| `fdp` |" in capsys.readouterr().out
    frame = pd.read_csv(out / "results.csv")
    assert sorted(frame["mode"]) == ["dp", "fdp", "fdp-dpsgd", "nonprivate", "public"]
    assert (frame["dataset"] == "digits").all()
    assert frame["accuracy"].between(0, 1).all()
    private = frame[frame["target_epsilon"].notna()]
    assert ((private["epsilon"] <= 4.0) & (private["epsilon"] > 3.5)).all()
    assert (private["noise_multiplier"] > 0).all()
    assert frame.loc[frame["mode"] == "public", "epsilon"].iloc[0] == 0
    assert math.isinf(frame.loc[frame["mode"] == "nonprivate", "epsilon"].iloc[0])
    # N = the training images of 1,797 (test-fraction 0.2, class-stratified)
    assert frame["num_records"].iloc[0] == load_dataset(load_config(DIGITS).data).num_records
    assert (out / "runs" / "fdp_eps4_seed0" / "metrics.csv").is_file()


def test_the_configuration_selects_blur_and_cnn():
    cfg = load_config({**DIGITS, "blur-levels": 0})
    data = load_dataset(cfg.data)
    assert data.is_image and data.image_shape == (1, 8, 8) and data.spec is None
    assert data.devices[0].x.shape[1:] == (1, 8, 8) and data.num_features == 64
    dec = feature_map_for(cfg, data)
    assert dec.view == GaussianBlur(5, 1.0, levels=None)
    x = torch.as_tensor(data.devices[0].x[:6])
    y = torch.as_tensor(data.devices[0].y[:6])
    torch.testing.assert_close(dec.public_inputs(x, None)[0], GaussianBlur(5, 1.0, levels=None)(x))
    model = build_model_for(cfg.training, data)
    assert isinstance(model, DigitCNN) and model.body[0].out_channels == 4
    with torch.no_grad():
        full = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        priv = dec.private_loss([model(v) for v in dec.private_inputs(x, None)], y)
        pub = dec.public_loss([model(v) for v in dec.public_inputs(x, None)], y)
    torch.testing.assert_close(priv + pub, full, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(priv, torch.zeros_like(priv))
    # quantised by default: the view is on the 256-level grid
    view = feature_map_for(load_config(DIGITS), data).public_inputs(x, None)[0]
    torch.testing.assert_close(view * 255, torch.round(view * 255))
    # linear models read the flattened image
    cnn_keys = ("cnn-width", "hidden-size")  # they shape only the CNN: refused with logistic
    linear = {k: v for k, v in DIGITS.items() if k not in cnn_keys}
    logistic = build_model_for(load_config({**linear, "model": "logistic"}).training, data)
    assert logistic(x).shape == (6, 10)
    assert server_parts_for(cfg, data).accounting.relation == "add-remove"


def test_flower_path_and_centralised_engine_agree_on_images(tmp_path):
    """Real client + strategy code in process vs the centralised engine: same ε per
    round, same ledger, same model (fdp with a pre-training round, reproducible streams)."""
    base = {**DIGITS, "mode": "fdp", "noise-multiplier": 1.2, "sampling-rate": 0.1,
            "public-batch-size": 16, "num-rounds": 3, "public-pretrain-rounds": 1, "seed": 5,
            "reproducible-noise": True}
    flower_cfg = load_config({**base, "out-dir": str(tmp_path / "flower")})
    strat = registered_strategy(flower_cfg)
    strat.registry = {}
    strat.start(InProcessGrid(flower_cfg))
    model, central_rows = run_centralised(load_config({**base, "out-dir": str(tmp_path / "central")}))
    assert [r["epsilon"] for r in strat.rows] == [r["epsilon"] for r in central_rows]
    assert central_rows[-1]["epsilon"] > 0
    ledgers = [ledger_doc(tmp_path / d) for d in ("flower", "central")]
    # the same mechanism and charges, entry for entry (the hash chains are identical)
    assert ledgers[0]["entries"] == ledgers[1]["entries"] and len(ledgers[0]["entries"]) - 1 == 2
    moved = False
    for a, b in zip(trainable(strat.model), trainable(model), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)
    fresh = trainable(build_model_for(flower_cfg.training, load_dataset(flower_cfg.data)))
    for a, b in zip(trainable(strat.model), fresh, strict=True):
        moved = moved or not torch.equal(a.detach(), b.detach())
    assert moved


def test_pool_subset_and_user_files(tmp_path):
    pooled = load_dataset(load_config({**DIGITS, "image-pool": 2, "max-records": 500}).data)
    assert pooled.image_shape == (1, 4, 4)
    assert pooled.num_records + len(pooled.test_y) == 500
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(60, 6, 6), dtype=np.uint8)
    y = np.arange(60) % 3
    np.savez(tmp_path / "mine.npz", x=x, y=y)
    data = load_dataset(load_config({"dataset": "images", "data-path": str(tmp_path / "mine.npz"),
                                     "num-devices": 2, "model": "cnn"}).data)
    assert data.image_shape == (1, 6, 6) and data.num_classes == 3
    got = np.concatenate([d.x for d in data.devices] + [data.test_x]).reshape(60, -1) * 255
    assert sorted(map(tuple, np.round(got).astype(int))) == sorted(map(tuple, x.reshape(60, -1).astype(int)))
    from PIL import Image

    folder = tmp_path / "pngs"
    folder.mkdir()
    lines = ["filename,label"]
    for i in range(20):
        Image.fromarray(x[i]).save(folder / f"{i}.png")
        lines.append(f"{i}.png,{'cat' if i % 2 else 'dog'}")
    (folder / "labels.csv").write_text("\n".join(lines) + "\n")
    png = load_dataset(load_config({"dataset": "images", "data-path": str(folder), "num-devices": 2}).data)
    assert png.class_names == ("cat", "dog") and png.image_shape == (1, 6, 6)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"blur-kernel": 4}, "blur-kernel=4: must be an odd integer >= 1"),
        ({"blur-kernel": 0}, "blur-kernel=0: must be an odd integer >= 1"),
        ({"blur-kernel": -3}, "blur-kernel=-3: must be an odd integer >= 1"),
        ({"blur-kernel": 2.5}, "blur-kernel=2.5: must be an integer"),
        ({"blur-sigma": 0.0}, "blur-sigma=0.0: must be > 0"),
        ({"blur-sigma": -1.0}, "blur-sigma=-1.0: must be > 0"),
        ({"blur-levels": 1}, "blur-levels=1: must be an integer >= 2"),
        ({"image-pool": 0}, "image-pool=0: must be >= 1"),
        ({"cnn-width": 0}, "cnn-width=0: must be >= 1"),
        ({"dataset": "fleet"}, "model='cnn': needs an image dataset"),
        ({"dataset": "csv", "data-path": "x.csv", "label-column": "y", "public-columns": "a",
          "private-columns": "b"}, "model='cnn': needs an image dataset"),
        ({"public-loss": "zero"}, "public-loss='zero': on dataset='digits' the public view is the blurred"),
        ({"mode": "corrdp", "model": "logistic", "clipping-quantile": 0.0},
         "mode='corrdp': dataset='digits'"),
        ({"dataset": "images"}, "data-path='': dataset='images' needs an .npz"),
        ({"data-path": "x.npz"}, "data-path='x.npz': dataset='digits' reads no file"),
    ],
)
def test_bad_image_configurations_are_refused_in_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_config({**DIGITS, **overrides})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_refusals_that_need_the_data(tmp_path):
    cfg = load_config({**DIGITS, "blur-kernel": 9})  # radius 4 < 8: fine
    feature_map_for(cfg, load_dataset(cfg.data))
    cfg = load_config({**DIGITS, "blur-kernel": 17})
    with pytest.raises(ValueError, match=r"^blur-kernel=17: its radius 8 must be below the image size 8×8"):
        feature_map_for(cfg, load_dataset(cfg.data))
    with pytest.raises(DataError, match=r"image-pool=16: larger than the images \(8×8\)"):
        load_dataset(load_config({**DIGITS, "image-pool": 16}).data)
    with pytest.raises(DataError, match="data-path='.*nothing.txt': dataset='images' needs an .npz"):
        load_dataset(load_config({"dataset": "images", "data-path": str(tmp_path / "nothing.txt")}).data)
    fleet = load_config({"num-devices": 2, "records-per-device": 20})
    with pytest.raises(ConfigError, match="model='cnn': needs an image dataset"):
        build_model_for(load_config({"model": "cnn", "dataset": "my.mod:load"}, base=fleet).training,
                        load_dataset(fleet.data))
