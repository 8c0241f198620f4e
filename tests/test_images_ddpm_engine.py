"""``model = "ddpm"`` on the main engine: a DDPM trained through the same run plan,
round engine, sampling plan, noise, ledger and aggregation as every other model.

* The loss split enters through the engines' one seam (``FeatureMap.terms``):
  ``ℓ_priv + ℓ_pub = ℓ`` record by record against the closed-form forward process.
* Each record's ``(t, ε)`` is keyed by (seed, round, part, device, index): unchanged
  when the batch around it changes; through the real private sum, adding a record
  adds exactly that record's clipped gradient (sensitivity ``C``), padded or not.
* The ledger charges a ddpm run as a classifier's at the same settings.
* ``public`` trains on Ψ(x) only: two training sets with the same blur give the same model.
* ``fd`` in ``metrics.csv`` at evaluation rounds; ``fedfdp compare`` reports it.
* The Flower path (real client and strategy code) and the centralised engine end at the
  same model and ledger.
* Refusals in one line.
"""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("sklearn")

from fedfdp.algorithm import run_centralised
from fedfdp.config import ConfigError, Mode, PrivacyUnit, load_config
from fedfdp.contribution import (
    ClientParts,
    DeviceTask,
    PrivateBatch,
    PublicBatch,
    RoundSettings,
    node_contribution,
    private_clipped_sum,
    public_gradient_sum,
    public_shape,
    trainable,
)
from fedfdp.data import DeviceData, load_dataset
from fedfdp.images import GaussianBlur, UNet
from fedfdp.images.diffusion import DiffusionFeatureMap, pack
from fedfdp.losses import LossPart, RecordKeys
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.run_plan import evaluation_for, feature_map_for, mechanism_for
from tests.mechanism_helpers import ledger_doc

DDPM = {
    "dataset": "digits", "model": "ddpm", "unet-width": 4, "diffusion-steps": 25, "num-devices": 4,
    "blur-kernel": 5, "blur-sigma": 1.0, "eval-samples": 20, "sampler-steps": 4, "progress": False,
}
T = 25


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _alpha_bars(steps: int) -> torch.Tensor:
    """The linear schedule in closed form (Ho et al.: 1e-4 .. 0.02 at T = 1000, scaled by 1000/T)."""
    betas = torch.linspace(1e-4 * 1000 / steps, 0.02 * 1000 / steps, steps, dtype=torch.float64)
    return torch.cumprod(1 - betas, 0)


def _model(cfg, data, seed: int = 0) -> torch.nn.Module:
    """The configured U-Net in float64, its zero-initialised output layer moved off zero."""
    model = build_model_for(cfg.training, data).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _records(data, device: int, index) -> tuple[torch.Tensor, torch.Tensor]:
    dev = data.devices[device]
    return (torch.as_tensor(dev.x[index]).double(), torch.as_tensor(dev.y[index], dtype=torch.long))


def test_the_split_adds_up_per_record_in_the_engine_seam():
    cfg = load_config(DDPM)
    data = load_dataset(cfg.data)
    fmap = feature_map_for(cfg, data)
    assert isinstance(fmap, DiffusionFeatureMap) and not fmap.classifier
    model = _model(cfg, data)
    assert isinstance(model, UNet) and model.base == 4
    index = np.arange(12)
    x, y = _records(data, 1, index)
    keys = RecordKeys.of(cfg.training.seed, 3, 1, index)
    blur = GaussianBlur(5, 1.0)
    ab = _alpha_bars(T)

    def reference(images: torch.Tensor, inputs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """ε_w(x_t) − ε squared, x_t rebuilt from the formula with the row's own t."""
        t = inputs[:, -2].round().long()
        assert torch.equal(inputs[:, -1].long(), y)  # the label is packed (public)
        a = ab[t].view(-1, 1, 1, 1)
        x_t = a.sqrt() * (2 * images - 1) + (1 - a).sqrt() * noise
        torch.testing.assert_close(inputs, pack(x_t, t, y), rtol=0, atol=1e-12)
        return (model(pack(x_t, t, y)) - noise).square().flatten(1).mean(1)

    with torch.no_grad():
        private = fmap.terms(LossPart.PRIVATE, x, y, None, keys)
        assert len(private.inputs) == 2 and private.targets.shape == x.shape
        l_priv = private.loss([model(v) for v in private.inputs], private.targets)
        full = reference(x, private.inputs[0], private.targets)
        public = reference(blur(x), private.inputs[1], private.targets)  # same t, same ε
        torch.testing.assert_close(l_priv + public, full, rtol=0, atol=1e-12)
        assert float((full - public).abs().min()) > 0
        # the public part: the blurred images under its own draw; the full part: the images
        pub = fmap.terms(LossPart.PUBLIC, x, y, None, keys)
        torch.testing.assert_close(pub.loss([model(pub.inputs[0])], pub.targets),
                                   reference(blur(x), pub.inputs[0], pub.targets), rtol=0, atol=1e-12)
        whole = fmap.terms(LossPart.FULL, x, y, None, keys)
        torch.testing.assert_close(whole.loss([model(whole.inputs[0])], whole.targets),
                                   reference(x, whole.inputs[0], whole.targets), rtol=0, atol=1e-12)
    # the draws are standard normal noise and uniform timesteps (a loose statistical check:
    # 12 records × 64 pixels; mean within 5 standard errors of 0, variance within 25 %)
    eps = private.targets.flatten()
    assert abs(float(eps.mean())) < 5 / math.sqrt(eps.numel()) and abs(float(eps.var()) - 1) < 0.25
    with pytest.raises(ValueError, match="record keys"):
        fmap.terms(LossPart.PRIVATE, x, y, None, None)
    with pytest.raises(ValueError, match="terms"):
        fmap.private_inputs(x, None)


def test_a_records_draw_does_not_depend_on_its_batch():
    cfg = load_config(DDPM)
    data = load_dataset(cfg.data)
    fmap = feature_map_for(cfg, data)
    seed = cfg.training.seed

    def row_of(part, index, record=7, round_=2, device=2):
        x, y = _records(data, device, index)
        terms = fmap.terms(part, x, y, torch.Generator().manual_seed(len(index)),
                           RecordKeys.of(seed, round_, device, index))
        at = list(index).index(record)
        return [v[at] for v in terms.inputs], terms.targets[at]

    for part in LossPart:
        alone = row_of(part, [7])
        for batch in ([3, 7, 11], list(range(40)), [7, 0]):
            inputs, target = row_of(part, batch)
            assert torch.equal(target, alone[1])
            assert all(torch.equal(a, b) for a, b in zip(inputs, alone[0], strict=True))
    # another part, round or device draws afresh
    base = row_of(LossPart.PRIVATE, [7])[1]
    for other in (row_of(LossPart.PUBLIC, [7])[1], row_of(LossPart.PRIVATE, [7], round_=3)[1],
                  row_of(LossPart.PRIVATE, [7], device=3)[1]):
        assert not torch.equal(other, base)

    # through the real private sum: adding record r adds exactly r's clipped gradient
    model = _model(cfg, data, seed=1)
    phase, clip = PHASES[Mode.FDP], 1e-3  # every record's gradient is clipped

    def clipped(index, shape=False):
        x, y = _records(data, 0, index)
        batch = PrivateBatch(x, y, torch.Generator().manual_seed(len(index)), len(data.devices[0]),
                             keys=RecordKeys.of(seed, 4, 0, index))
        batches = public_shape([batch], PrivacyUnit.RECORD, 0.05) if shape else [batch]
        out = private_clipped_sum(model, fmap, phase, batches, clip)
        return torch.cat([g.flatten() for g in out.grads])

    others = [2, 5, 8, 13, 21]
    with_r, without, only = clipped([*others, 17]), clipped(others), clipped([17])
    torch.testing.assert_close(with_r - without, only, rtol=0, atol=1e-12)
    assert abs(float(only.norm()) - clip) < 1e-9  # sensitivity C
    # a public batch shape (zero rows weighing 0) changes nothing but the order of additions
    torch.testing.assert_close(clipped([*others, 17], shape=True), with_r, rtol=0, atol=1e-12)

    # and through a node's whole contribution (its keys built by node_contribution), with
    # the private batch chosen through the sampler seam
    def node_sum(index):
        def sampler(n, rate, public_count, secrets, public):
            return np.asarray(index, dtype=np.int64), np.empty(0, dtype=np.int64)

        dev = data.devices[0]
        task = DeviceTask(0, dev.x.astype(np.float64), dev.y, True, 0)
        settings = RoundSettings(round=4, attempt=0, phase=phase, sampling_rate=0.05, clipping_norm=clip,
                                 public_seed=seed)
        out = node_contribution(model, fmap, settings, [task], ClientParts(batches=sampler))
        assert out.private_sum is not None
        return torch.cat([g.flatten() for g in out.private_sum])

    torch.testing.assert_close(node_sum([*others, 17]), with_r, rtol=0, atol=1e-12)
    torch.testing.assert_close(node_sum([*others, 17]) - node_sum(others), node_sum([17]), rtol=0, atol=1e-12)


def test_the_ledger_charges_a_ddpm_run_as_a_classifiers():
    settings = {"mode": "fdp", "target-epsilon": 2.0, "num-rounds": 2, "sampling-rate": 0.05,
                "public-batch-size": 16, "clipping-quantile": 0.0, "reproducible-noise": True, "seed": 3}
    cnn = {k: v for k, v in DDPM.items() if k not in ("model", "unet-width", "diffusion-steps",
                                                      "eval-samples", "sampler-steps")}
    cfgs = {"cnn": load_config({**cnn, "model": "cnn", "cnn-width": 4, "hidden-size": 8, **settings}),
            "ddpm": load_config({**DDPM, **settings})}
    data = load_dataset(cfgs["ddpm"].data)
    mechanisms = {k: mechanism_for(c, data) for k, c in cfgs.items()}
    assert mechanisms["ddpm"].event == mechanisms["cnn"].event
    sigma = mechanisms["ddpm"].noise_multiplier
    assert sigma is not None and sigma == mechanisms["cnn"].noise_multiplier and sigma > 0
    rows = {k: run_centralised(c, data)[1] for k, c in cfgs.items()}
    assert [r["epsilon"] for r in rows["ddpm"]] == [r["epsilon"] for r in rows["cnn"]]
    assert 1.5 < rows["ddpm"][-1]["epsilon"] <= 2.0
    assert [r["noise_multiplier"] for r in rows["ddpm"]] == [r["noise_multiplier"] for r in rows["cnn"]]


def test_public_mode_trains_on_the_blurred_images_only():
    cfg = load_config({**DDPM, "mode": "public", "num-rounds": 2, "public-batch-size": 32,
                       "eval-every": 2, "learning-rate": 0.5})
    data = load_dataset(cfg.data)
    blur = GaussianBlur(5, 1.0)
    # D': every training image moved by 1e-6 where its 8-bit blur stays the same
    devices, moved = [], 0
    for dev in data.devices:
        x = torch.as_tensor(dev.x)
        shifted = (x + torch.where(x < 0.5, 1e-6, -1e-6)).float()
        same = (blur(shifted) == blur(x)).flatten(1).all(1)
        moved += int(same.sum())
        devices.append(DeviceData(torch.where(same.view(-1, 1, 1, 1), shifted, x).numpy(), dev.y))
    other = dataclasses.replace(data, devices=tuple(devices))
    assert moved > 0.9 * data.num_records
    models = [run_centralised(cfg, d)[0] for d in (data, other)]
    for a, b in zip(trainable(models[0]), trainable(models[1]), strict=True):
        assert torch.equal(a, b)
    fresh = trainable(build_model_for(cfg.training, data))
    assert any(not torch.equal(a, b) for a, b in zip(trainable(models[0]), fresh, strict=True))
    # the full loss (what dp and fdp differentiate) does see D' differ from D
    fmap = feature_map_for(cfg, data)
    keys = RecordKeys.of(0, 1, 0, range(8))
    y = torch.as_tensor(data.devices[0].y[:8])
    xs = [torch.as_tensor(d.devices[0].x[:8]) for d in (data, other)]
    full = [fmap.terms(LossPart.FULL, x, y, None, keys).inputs[0] for x in xs]
    assert not torch.equal(full[0], full[1])
    batches = [PublicBatch(x, y, torch.Generator(), keys) for x in xs]
    public = [public_gradient_sum(models[0], fmap, [b])[0] for b in batches]
    assert all(torch.equal(a, b) for a, b in zip(*public, strict=True))


def test_fd_in_metrics_and_compare(tmp_path, capsys):
    from simulations.cli import main

    sweep = tmp_path / "ddpm.toml"
    sweep.write_text(
        'modes = ["public", "fdp"]\ntarget-epsilons = [4.0]\nseeds = [0]\nnum-rounds = 3\n'
        "sampling-rate = 0.05\npublic-batch-size = 16\neval-every = 2\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in DDPM.items() if k != "progress")
    )
    out = tmp_path / "out"
    args = ["compare", "--config", str(sweep), "--out", str(out), "--no-progress", "--metric", "fd"]
    assert main(args) == 0
    assert "Fréchet distance" in capsys.readouterr().out
    frame = pd.read_csv(out / "results.csv")
    assert sorted(frame["mode"]) == ["fdp", "public"]
    assert (frame["fd"] > 0).all() and frame["accuracy"].isna().all()
    assert frame.loc[frame["mode"] == "public", "epsilon"].iloc[0] == 0
    assert 3.5 < frame.loc[frame["mode"] == "fdp", "epsilon"].iloc[0] <= 4.0
    metrics = pd.read_csv(out / "runs" / "fdp_eps4_seed0" / "metrics.csv")
    assert metrics["fd"].isna().tolist() == [True, False, False]  # rounds 2 (eval-every) and 3 (last)
    assert (metrics["loss"].notna() == metrics["fd"].notna()).all()
    summary = (out / "summary.md").read_text()
    assert "Fréchet distance" in summary and "Accuracy" not in summary


@pytest.mark.slow
def test_flower_path_and_centralised_engine_agree_on_ddpm(tmp_path):
    """Real client + strategy code in process vs the centralised engine: same ε per
    round, same ledger, same model (fdp with a pre-training round, reproducible streams)."""
    from tests.flower_helpers import InProcessGrid, registered_strategy

    base = {**DDPM, "mode": "fdp", "noise-multiplier": 1.2, "sampling-rate": 0.05, "public-batch-size": 16,
            "num-rounds": 3, "public-pretrain-rounds": 1, "seed": 5, "reproducible-noise": True,
            "eval-every": 3}
    flower_cfg = load_config({**base, "out-dir": str(tmp_path / "flower")})
    strat = registered_strategy(flower_cfg)
    strat.registry = {}
    strat.start(InProcessGrid(flower_cfg))
    model, central_rows = run_centralised(load_config({**base, "out-dir": str(tmp_path / "central")}))
    assert [r["epsilon"] for r in strat.rows] == [r["epsilon"] for r in central_rows]
    assert central_rows[-1]["epsilon"] > 0
    ledgers = [ledger_doc(tmp_path / d) for d in ("flower", "central")]
    assert ledgers[0]["entries"] == ledgers[1]["entries"] and len(ledgers[0]["entries"]) - 1 == 2
    for a, b in zip(trainable(strat.model), trainable(model), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)
    fresh = trainable(build_model_for(flower_cfg.training, load_dataset(flower_cfg.data)))
    assert any(not torch.equal(a.detach(), b.detach()) for a, b in zip(trainable(model), fresh, strict=True))
    for d in ("flower", "central"):
        fd = pd.read_csv(tmp_path / d / "metrics.csv")["fd"]
        assert fd.iloc[-1] > 0


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"dataset": "fleet", "blur-kernel": 9, "blur-sigma": 2.0}, "model='ddpm': needs an image dataset"),
        ({"diffusion-steps": 20}, "diffusion-steps=20: must be > 20"),
        ({"sampler-steps": 30}, "sampler-steps=30: must be at most diffusion-steps=25"),
        ({"unet-width": 0}, "unet-width=0: must be >= 1"),
        ({"model": "cnn"}, "unet-width=4: has no effect with model='cnn'"),
    ],
)
def test_refusals(overrides, fragment):
    given = {**DDPM, **overrides}
    if given.get("dataset") == "fleet":
        given = {k: v for k, v in given.items() if not k.startswith("blur-")}
    with pytest.raises(ConfigError) as err:
        load_config(given)
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_secure_aggregation_trains_a_ddpm_through_the_real_round_driver():
    """The real ClientApp and secagg round driver in process: each node's private sum in a
    public number of rows (zero rows weighing 0), masked; the ledger charges the
    distributed event; the model moves; ``fd`` is evaluated."""
    from fedfdp.accounting.distributed import DistributedDiscreteGaussian
    from tests.test_secagg_flower import run_strategy, secagg_config

    cfg = secagg_config(**{k: v for k, v in DDPM.items() if k != "progress"},
                        **{"num-rounds": 2, "mode": "fdp", "public-batch-size": 16, "eval-every": 2})
    strat, _grid, initial = run_strategy(cfg, evaluate=evaluation_for(cfg, load_dataset(cfg.data)))
    assert strat.stop_reason is None and [r["round"] for r in strat.rows] == [1, 2]
    assert strat.ledger is not None
    events = strat.ledger.events()
    assert len(events) == 2 and all(isinstance(e, DistributedDiscreteGaussian) for e in events)
    assert strat.rows[-1]["fd"] > 0
    assert any(not torch.equal(initial[k], v) for k, v in strat.model.state_dict().items())


def test_a_colour_ddpm_trains_on_the_engine():
    """The colour path: scikit-learn's photographs (3 channels), Ψ blurring each channel
    on its own, a 3-channel U-Net, fdp charged and an FD measured on 3-channel samples."""
    cfg = load_config({**DDPM, "dataset": "photos", "image-pool": 4, "mode": "fdp", "num-rounds": 2,
                       "target-epsilon": 4.0, "sampling-rate": 0.1, "public-batch-size": 16,
                       "eval-every": 2, "eval-samples": 8})
    data = load_dataset(cfg.data)
    assert data.image_shape == (3, 8, 8) and data.class_names == ("china", "flower")
    blur = GaussianBlur(5, 1.0)
    x = torch.as_tensor(data.devices[0].x[:6])
    each = torch.cat([blur(x[:, c : c + 1]) for c in range(3)], dim=1)
    assert torch.equal(blur(x), each)  # no channel leaks into another
    assert not torch.equal(blur(x)[:, 0], blur(x)[:, 1])
    model, rows = run_centralised(cfg, data)
    assert isinstance(model, UNet)
    assert 3.0 < rows[-1]["epsilon"] <= 4.0 and math.isfinite(rows[-1]["fd"]) and rows[-1]["fd"] > 0
