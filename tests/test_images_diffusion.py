"""Tests for the DDPM pieces: schedule, loss split, U-Net, ghost clipping, sampler, FID, grids.

References: closed forms (DDPM's linear β, the forward-process formula, the
Fréchet distance of diagonal Gaussians), the per-record clipping loop, and
the identity ℓ_priv + ℓ_pub = ℓ evaluated from separate forward passes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from fedfdp.clipping import clipped_grad_sum
from fedfdp.images.blur import GaussianBlur
from fedfdp.images.data import ImageSet, ImageShape
from fedfdp.images.diffusion import DiffusionLoss, NoiseSchedule, draw_noise, pack, sample
from fedfdp.images.fid import (
    FeatureStats,
    fid_report,
    frechet_distance,
    image_features,
    save_grid,
    train_feature_classifier,
)
from fedfdp.images.unet import UNet, build_unet

SHAPE = ImageShape(1, 8, 8)


@pytest.fixture(autouse=True, scope="module")
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tiny_unet(dtype: torch.dtype = torch.float64, seed: int = 0, zero_out: bool = False) -> UNet:
    model = build_unet(SHAPE, 3, base=8, mults=(1, 2), groups=4, generator=_gen(seed)).to(dtype)
    if not zero_out:  # a zero output conv gives zero gradients upstream: perturb it for the tests
        with torch.no_grad():
            model.conv_out.weight.normal_(0, 0.1, generator=_gen(seed + 1))
    return model


# --------------------------------------------------------------------------- #
# schedule and forward process
# --------------------------------------------------------------------------- #


def test_linear_schedule_is_ddpm() -> None:
    sched = NoiseSchedule(1000, "linear")
    betas = sched.betas()
    assert betas[0] == pytest.approx(1e-4) and betas[-1] == pytest.approx(0.02)
    ab = sched.alpha_bars()
    assert float(ab[0]) == pytest.approx(1 - 1e-4)
    assert float(ab[-1]) == pytest.approx(math.prod(1 - float(b) for b in betas), rel=1e-9)
    assert float(ab[-1]) < 1e-4
    short = NoiseSchedule(100, "linear").betas()  # rescaled by 1000/T
    assert short[-1] == pytest.approx(0.2)


def test_cosine_schedule() -> None:
    sched = NoiseSchedule(200, "cosine")
    ab = sched.alpha_bars()
    assert torch.all(ab[1:] < ab[:-1]) and 0 < float(ab[-1]) < 1e-3
    s, t = 0.008, 50
    f = lambda u: math.cos((u / 200 + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
    assert float(ab[t - 1]) == pytest.approx(f(t) / f(0), rel=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 1}, r"diffusion-steps=1"),
        ({"kind": "sigmoid"}, r"diffusion-schedule='sigmoid'"),
        ({"steps": 10, "beta_end": 0.02}, r"end·1000/T < 1"),
    ],
)
def test_schedule_refusals(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        NoiseSchedule(**kwargs)


def test_noisy_closed_form_and_draws() -> None:
    sched = NoiseSchedule(50)
    loss = DiffusionLoss(sched, GaussianBlur(3, 1.0), 3)
    x = torch.rand(4, 1, 8, 8, generator=_gen(1), dtype=torch.float64)
    draw = draw_noise(4, SHAPE, sched, _gen(2), torch.float64)
    again = draw_noise(4, SHAPE, sched, _gen(2), torch.float64)
    assert torch.equal(draw.t, again.t) and torch.equal(draw.noise, again.noise)
    ab = sched.alpha_bars()
    for i in range(4):
        a = float(ab[draw.t[i]])
        expected = math.sqrt(a) * (2 * x[i] - 1) + math.sqrt(1 - a) * draw.noise[i]
        torch.testing.assert_close(loss.noisy(x, draw)[i], expected, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="explicit torch.Generator"):
        draw_noise(4, SHAPE, sched, None)  # type: ignore[arg-type]


def test_pack_round_trip_through_the_unet() -> None:
    model = _tiny_unet()
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    t = torch.tensor([0, 3, 999, 7, 12])
    y = torch.tensor([0, 1, 2, 3, 1])  # 3 = no class
    packed = pack(x, t, y)
    assert packed.shape == (5, 66)
    x2, t2, y2 = model.unpack(packed)
    assert torch.equal(x2, x) and torch.equal(t2.long(), t) and torch.equal(y2, y)
    assert model(packed).shape == (5, 1, 8, 8)
    with pytest.raises(ValueError, match=r"need \(n, 66\)"):
        model(torch.zeros(2, 65, dtype=torch.float64))


def test_default_unet_size_at_28() -> None:
    model = build_unet(ImageShape(1, 28, 28), 10, generator=_gen(0))
    size = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= size <= 3_000_000
    out = model(pack(torch.zeros(2, 1, 28, 28), torch.tensor([1, 2]), torch.tensor([3, 10])))
    assert out.shape == (2, 1, 28, 28) and torch.equal(out, torch.zeros_like(out))  # zero-init output


# --------------------------------------------------------------------------- #
# the loss split
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("conditional", [True, False])
def test_private_plus_public_is_full_per_record(conditional: bool) -> None:
    sched = NoiseSchedule(100, "cosine")
    blur = GaussianBlur(3, 1.0)
    loss = DiffusionLoss(sched, blur, 3, conditional=conditional)
    model = _tiny_unet()
    x = torch.rand(6, 1, 8, 8, generator=_gen(3), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    draw = draw_noise(6, SHAPE, sched, _gen(4), torch.float64)
    full = loss.full_loss([model(v) for v in loss.full_inputs(x, y, draw)], draw.noise)
    public = loss.public_loss([model(v) for v in loss.public_inputs(x, y, draw)], draw.noise)
    private = loss.private_loss([model(v) for v in loss.private_inputs(x, y, draw)], draw.noise)
    torch.testing.assert_close(private + public, full, rtol=0, atol=1e-12)
    # the public input is the noised blurred image with the same t and ε
    (pub,) = loss.public_inputs(x, y, draw)
    torch.testing.assert_close(pub[:, :64].view(6, 1, 8, 8), loss.noisy(blur(x), draw), rtol=0, atol=0)
    assert torch.equal(pub[:, 64], draw.t.double())
    assert torch.equal(pub[:, 65], y.double() if conditional else torch.full((6,), 3.0, dtype=torch.float64))
    (from_view,) = loss.public_inputs_from_view(blur(x), y, draw)
    assert torch.equal(from_view, pub)


def test_public_loss_sees_only_psi() -> None:
    """Two images with the same quantised blur give the same public inputs and
    loss for the same draw; the full loss differs."""
    blur = GaussianBlur(3, 1.0, levels=8)
    sched = NoiseSchedule(100)
    loss = DiffusionLoss(sched, blur, 3)
    x1 = torch.full((1, 1, 8, 8), 0.5, dtype=torch.float64)
    x2 = x1.clone()
    x2[0, 0, 4, 4] += 0.05  # too small to change any rounded blurred pixel
    assert torch.equal(blur(x1), blur(x2)) and not torch.equal(x1, x2)
    y = torch.tensor([1])
    draw = draw_noise(1, SHAPE, sched, _gen(5), torch.float64)
    model = _tiny_unet()
    p1, p2 = loss.public_inputs(x1, y, draw), loss.public_inputs(x2, y, draw)
    assert torch.equal(p1[0], p2[0])
    assert torch.equal(
        loss.public_loss([model(p1[0])], draw.noise), loss.public_loss([model(p2[0])], draw.noise)
    )
    f1 = loss.full_loss([model(v) for v in loss.full_inputs(x1, y, draw)], draw.noise)
    f2 = loss.full_loss([model(v) for v in loss.full_inputs(x2, y, draw)], draw.noise)
    assert not torch.equal(f1, f2)


def test_labels_checked() -> None:
    loss = DiffusionLoss(NoiseSchedule(100), GaussianBlur(3, 1.0), 3)
    draw = draw_noise(2, SHAPE, loss.schedule, _gen(0))
    with pytest.raises(ValueError, match=r"labels in \[0, 3\]; need 0\.\.2"):
        loss.full_inputs(torch.rand(2, 1, 8, 8), torch.tensor([0, 3]), draw)


@pytest.mark.parametrize("part", ["full", "private"])
def test_unet_ghost_clipping_matches_the_loop(part: str) -> None:
    """The U-Net (Conv2d, GroupNorm, Linear, Embedding) is clipped exactly by ghost."""
    sched = NoiseSchedule(100)
    loss = DiffusionLoss(sched, GaussianBlur(3, 1.0), 3)
    model = _tiny_unet()
    x = torch.rand(5, 1, 8, 8, generator=_gen(6), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1, 0])
    draw = draw_noise(5, SHAPE, sched, _gen(7), torch.float64)
    if part == "full":
        inputs, loss_fn = loss.full_inputs(x, y, draw), loss.full_loss
    else:
        inputs, loss_fn = loss.private_inputs(x, y, draw), loss.private_loss
    norms = clipped_grad_sum(model, inputs, draw.noise, loss_fn, 1e9, "loop").norms
    c = float(norms.median())
    loop = clipped_grad_sum(model, inputs, draw.noise, loss_fn, c, "loop")
    auto = clipped_grad_sum(model, inputs, draw.noise, loss_fn, c, "auto")
    assert auto.method == "ghost"
    torch.testing.assert_close(auto.norms, loop.norms, rtol=1e-9, atol=0)
    for a, b in zip(auto.grads, loop.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-13)


# --------------------------------------------------------------------------- #
# sampler
# --------------------------------------------------------------------------- #


def test_sampler_shapes_range_and_reproducibility() -> None:
    model = _tiny_unet(torch.float32)
    model.train()
    sched = NoiseSchedule(100)
    labels = torch.tensor([0, 1, 2, 3, 0])
    a = sample(model, sched, labels, SHAPE, _gen(1), steps=10, batch_size=2)
    b = sample(model, sched, labels, SHAPE, _gen(1), steps=10, batch_size=2)
    assert a.shape == (5, 1, 8, 8) and a.dtype == torch.float32
    assert float(a.min()) >= 0 and float(a.max()) <= 1
    assert torch.equal(a, b) and model.training
    with pytest.raises(ValueError, match=r"sample steps=0"):
        sample(model, sched, labels, SHAPE, _gen(1), steps=0)


def test_sampler_recovers_a_point_mass() -> None:
    """With the exact noise predictor of a point mass x₀ = 2c − 1, ancestral
    sampling returns c (a closed-form check of the sampler's arithmetic)."""
    c = 0.8
    sched = NoiseSchedule(200, "cosine")
    ab = sched.alpha_bars()

    class Oracle(torch.nn.Module):
        def forward(self, packed: torch.Tensor) -> torch.Tensor:
            x = packed[:, :64].view(-1, 1, 8, 8)
            a = ab[packed[:, 64].long()].float().view(-1, 1, 1, 1)
            return (x - a.sqrt() * (2 * c - 1)) / (1 - a).sqrt()

    out = sample(Oracle(), sched, torch.zeros(3, dtype=torch.long), SHAPE, _gen(2), steps=50)
    torch.testing.assert_close(out, torch.full_like(out, c), rtol=0, atol=1e-4)


# --------------------------------------------------------------------------- #
# FID and grids
# --------------------------------------------------------------------------- #


def test_frechet_distance_closed_form() -> None:
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    v1, v2 = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 0.25])
    a = FeatureStats(mu1, np.diag(v1), 100)
    b = FeatureStats(mu2, np.diag(v2), 100)
    expected = float(((mu1 - mu2) ** 2).sum() + ((np.sqrt(v1) - np.sqrt(v2)) ** 2).sum())
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-12)
    # a rotation of both covariances leaves it unchanged
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    ar = FeatureStats(q @ mu1, q @ np.diag(v1) @ q.T, 100)
    br = FeatureStats(q @ mu2, q @ np.diag(v2) @ q.T, 100)
    assert frechet_distance(ar, br) == pytest.approx(expected, rel=1e-9)


def _digits() -> ImageSet:
    pytest.importorskip("sklearn")
    from fedfdp.images.sources import load_digits8

    return load_digits8()


def test_fid_self_zero_and_blur_larger() -> None:
    data = _digits()
    model, acc = train_feature_classifier(data, epochs=3, generator=_gen(0))
    assert acc > 0.8
    feats = image_features(model, data.x)
    assert feats.shape == (len(data), 128)
    same = fid_report(model, data.x, data.y, data)
    assert same.overall < 1e-6 and all(v is not None and v < 1e-6 for v in same.per_class)
    half = len(data) // 2
    first = ImageSet("a", data.x[:half], data.y[:half], data.class_names)
    real = fid_report(model, data.x[half:], data.y[half:], first).overall
    blurred = GaussianBlur(5, 1.5)(torch.from_numpy(np.array(data.x[half:]))).numpy()
    blurry = fid_report(model, blurred, data.y[half:], first).overall
    assert blurry > 3 * real > 0
    few = fid_report(model, data.x[:30], data.y[:30], data)
    assert few.per_class.count(None) == 10  # 3 per class < min_per_class


def test_save_grid(tmp_path) -> None:
    images = np.random.default_rng(0).random((7, 1, 8, 8)).astype(np.float32)
    path = save_grid(images, tmp_path / "g" / "grid.png", nrow=3, padding=1, scale=2)
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.size == ((3 * 9 + 1) * 2, (3 * 9 + 1) * 2)
    rgb = save_grid(np.zeros((2, 3, 4, 4)), tmp_path / "rgb.png", nrow=2, padding=0, scale=1)
    with Image.open(rgb) as img:
        assert img.size == (8, 4)
    with pytest.raises(ValueError, match=r"save_grid: images of shape \(2, 2, 4, 4\)"):
        save_grid(np.zeros((2, 2, 4, 4)), tmp_path / "x.png")
