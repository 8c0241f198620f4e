"""Tests for fedfdp.images.blur: Ψ = Gaussian blur, and user-supplied Ψ.

References: the closed-form Gaussian weights, a full 2-D convolution with the
outer-product kernel, scipy.ndimage.gaussian_filter (mode "mirror" is torch's
"reflect"), and the explicit matrix of the blur operator; never the code under
test. Tolerances: float64, absolute 1e-12 unless stated.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage

from fedfdp.clipping import clipped_grad_sum
from fedfdp.images.blur import (
    GaussianBlur,
    blur_singular_values,
    check_public_map,
    gaussian_kernel1d,
)
from fedfdp.images.data import ImageShape
from fedfdp.images.models import build_classifier
from fedfdp.losses import FeatureMap, cross_entropy


def _images(seed: int, n: int = 3, c: int = 2, h: int = 11, w: int = 9) -> torch.Tensor:
    return torch.rand(n, c, h, w, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize(("k", "sigma"), [(1, 1.0), (3, 0.5), (5, 1.0), (9, 2.0), (7, 10.0)])
def test_kernel_closed_form(k: int, sigma: float) -> None:
    w = gaussian_kernel1d(k, sigma)
    r = k // 2
    raw = [math.exp(-(j**2) / (2 * sigma**2)) for j in range(-r, r + 1)]
    expected = torch.tensor([v / sum(raw) for v in raw], dtype=torch.float64)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-15)
    assert abs(float(w.sum()) - 1) < 1e-15 and torch.equal(w, w.flip(0))


def test_delta_image_blurs_to_the_kernel() -> None:
    blur = GaussianBlur(7, 1.3, levels=None)
    x = torch.zeros(1, 1, 15, 15, dtype=torch.float64)
    x[0, 0, 7, 7] = 1.0
    out = blur(x)
    w = gaussian_kernel1d(7, 1.3)
    expected = torch.zeros(15, 15, dtype=torch.float64)
    expected[4:11, 4:11] = torch.outer(w, w)
    torch.testing.assert_close(out[0, 0], expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("padding", ["reflect", "zeros"])
def test_separable_equals_full_2d_convolution(padding: str) -> None:
    blur = GaussianBlur(5, 1.2, padding, levels=None)
    x = _images(0)
    k2 = blur.kernel2d().view(1, 1, 5, 5).expand(2, 1, 5, 5)
    if padding == "reflect":
        ref = F.conv2d(F.pad(x, (2, 2, 2, 2), mode="reflect"), k2, groups=2)
    else:
        ref = F.conv2d(x, k2, padding=2, groups=2)
    torch.testing.assert_close(blur(x), ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize(("k", "sigma"), [(5, 1.0), (9, 2.0)])
def test_against_scipy_gaussian_filter(k: int, sigma: float) -> None:
    blur = GaussianBlur(k, sigma, "reflect", levels=None)
    x = _images(1)
    out = blur(x).numpy()
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            ref = ndimage.gaussian_filter(x[i, c].numpy(), sigma, mode="mirror", radius=k // 2)
            np.testing.assert_allclose(out[i, c], ref, rtol=0, atol=1e-13)


def test_reflect_keeps_constants_and_commutes_with_affine_maps() -> None:
    blur = GaussianBlur(7, 2.0, "reflect", levels=None)
    const = torch.full((1, 1, 9, 9), 0.3, dtype=torch.float64)
    torch.testing.assert_close(blur(const), const, rtol=0, atol=1e-15)
    zero_pad = GaussianBlur(7, 2.0, "zeros", levels=None)
    assert float(zero_pad(const)[0, 0, 0, 0]) < 0.3 * 0.8  # the border darkens
    x = _images(2)
    torch.testing.assert_close(blur(2 * x - 1), 2 * blur(x) - 1, rtol=0, atol=1e-14)


def test_each_record_and_channel_blurred_on_its_own() -> None:
    blur = GaussianBlur(5, 1.5, levels=None)
    x = _images(3, n=4, c=3)
    full = blur(x)
    for i in range(4):
        for c in range(3):
            torch.testing.assert_close(full[i, c], blur(x[i : i + 1, c : c + 1])[0, 0], rtol=0, atol=0)


def test_quantised_output_on_the_grid() -> None:
    x = _images(4)
    exact = GaussianBlur(5, 1.0, levels=None)(x)
    q = GaussianBlur(5, 1.0, levels=16)(x)
    torch.testing.assert_close(q * 15, torch.round(q * 15), rtol=0, atol=1e-12)
    assert float((q - exact).abs().max()) <= 0.5 / 15 + 1e-12
    with pytest.raises(ValueError, match=r"blur-levels=16: quantisation needs inputs in \[0, 1\]"):
        GaussianBlur(5, 1.0, levels=16)(x + 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kernel_size": 4}, r"blur-kernel-size=4: must be an odd integer"),
        ({"kernel_size": 0}, r"blur-kernel-size=0"),
        ({"sigma": 0.0}, r"blur-sigma=0\.0: must be a finite number > 0"),
        ({"sigma": float("nan")}, r"blur-sigma=nan"),
        ({"padding": "circular"}, r"blur-padding='circular'"),
        ({"levels": 1}, r"blur-levels=1"),
    ],
)
def test_blur_refusals(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        GaussianBlur(**kwargs)


def test_reflect_radius_and_batch_checks() -> None:
    with pytest.raises(ValueError, match=r"radius 4 < image size \(3, 3\)"):
        GaussianBlur(9, 2.0)(torch.rand(1, 1, 3, 3))
    with pytest.raises(ValueError, match=r"shape \(3, 3\); need a batch \(n, C, H, W\)"):
        GaussianBlur(3, 1.0)(torch.rand(3, 3))
    with pytest.raises(ValueError, match=r"dtype torch.int64"):
        GaussianBlur(3, 1.0)(torch.zeros(1, 1, 4, 4, dtype=torch.long))


@pytest.mark.parametrize("padding", ["reflect", "zeros"])
def test_singular_values_match_the_explicit_operator(padding: str) -> None:
    blur = GaussianBlur(5, 1.3, padding, levels=None)
    h, w = 6, 5
    basis = torch.eye(h * w, dtype=torch.float64).view(h * w, 1, h, w)
    matrix = blur(basis).view(h * w, h * w).T.numpy()
    expected = np.sort(np.linalg.svd(matrix, compute_uv=False))[::-1]
    np.testing.assert_allclose(blur_singular_values(blur, h, w), expected, rtol=1e-10, atol=1e-14)


def test_default_blur_hides_directions_below_the_quantisation_step() -> None:
    """The documented numbers: the exact blur is invertible (smallest singular
    value ~2e-6 > 0), and ~58% of its singular values are below 1/255."""
    s = blur_singular_values(GaussianBlur(), 28, 28)
    assert 1e-7 < s.min() < 1e-5
    assert 0.5 < float((s < 1 / 255).mean()) < 0.65


# --------------------------------------------------------------------------- #
# the public view depends on Ψ(x) only
# --------------------------------------------------------------------------- #


def _same_psi_pair(seed: int, blur: GaussianBlur) -> tuple[torch.Tensor, torch.Tensor]:
    """Two different images with the same quantised blur.

    ``x2 = x1 + ε·v`` with ``v`` a checkerboard: its blur is small, and ``ε`` is
    chosen so that no blurred pixel crosses a rounding boundary.
    """
    g = torch.Generator().manual_seed(seed)
    x1 = 0.2 + 0.6 * torch.rand(2, 1, 12, 12, generator=g, dtype=torch.float64)
    ii, jj = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    v = ((-1.0) ** (ii + jj)).to(torch.float64).expand_as(x1)
    assert blur.levels is not None  # a quantising blur
    steps = blur.levels - 1
    scaled = blur.blur(x1) * steps
    margin = float((0.5 - (scaled - scaled.round()).abs()).min())
    response = float((blur.blur(v) * steps).abs().max())
    eps = min(0.1, 0.5 * margin / response)
    x2 = x1 + eps * v
    assert float((x2 - x1).abs().max()) > 0
    return x1, x2


@pytest.mark.parametrize("seed", range(8))
def test_public_view_and_loss_depend_only_on_psi(seed: int) -> None:
    """Property: two images with the same Ψ give identical public views and
    public losses (through the project's FeatureMap)."""
    blur = GaussianBlur(5, 1.5, levels=32)
    x1, x2 = _same_psi_pair(seed, blur)
    assert torch.equal(blur(x1), blur(x2))
    decomposition = FeatureMap(view=blur)  # any psi(x, generator) is a view
    model = build_classifier(
        ImageShape(1, 12, 12), 3, width=4, features=8, generator=torch.Generator().manual_seed(seed)
    ).double()
    y = torch.tensor([0, 2])
    views1 = decomposition.public_inputs(x1, None)
    views2 = decomposition.public_inputs(x2, None)
    assert torch.equal(views1[0], views2[0])
    out1 = [model(v) for v in views1]
    out2 = [model(v) for v in views2]
    assert torch.equal(decomposition.public_loss(out1, y), decomposition.public_loss(out2, y))
    # the full loss does see the difference
    assert not torch.equal(cross_entropy([model(x1)], y), cross_entropy([model(x2)], y))


def test_blur_in_the_loss_decomposition_and_clipping() -> None:
    """ℓ_priv + ℓ_pub = ℓ per record, and the private inputs clip like any other."""
    blur = GaussianBlur(5, 1.0)
    decomposition = FeatureMap(view=blur)
    model = build_classifier(
        ImageShape(1, 8, 8), 4, width=4, features=8, generator=torch.Generator().manual_seed(1)
    ).double()
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    private = decomposition.private_inputs(x, None)
    assert torch.equal(private[1], blur(x))
    l_priv = decomposition.private_loss([model(v) for v in private], y)
    l_pub = decomposition.public_loss([model(v) for v in decomposition.public_inputs(x, None)], y)
    torch.testing.assert_close(l_priv + l_pub, cross_entropy([model(x)], y), rtol=0, atol=1e-12)
    ghost = clipped_grad_sum(model, private, y, decomposition.private_loss, 0.05, "ghost")
    loop = clipped_grad_sum(model, private, y, decomposition.private_loss, 0.05, "loop")
    for a, b in zip(ghost.grads, loop.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- #
# user-supplied Ψ
# --------------------------------------------------------------------------- #


def _probe() -> torch.Tensor:
    return torch.rand(4, 1, 6, 6, generator=torch.Generator().manual_seed(9))


def test_user_map_deterministic() -> None:
    def mean_view(x, g):
        return x.mean(dim=(2, 3), keepdim=True).expand_as(x).clone()

    psi = check_public_map(mean_view, _probe(), name="means")
    assert not psi.needs_generator
    x = _probe()
    torch.testing.assert_close(psi(x, None), mean_view(x, None))


def test_user_map_with_generator() -> None:
    def noisy_mean(x, g):
        m = x.mean(dim=(2, 3), keepdim=True).expand_as(x)
        return m + 0.1 * torch.randn(x.shape, generator=g, dtype=x.dtype)

    psi = check_public_map(noisy_mean, _probe(), name="noisy")
    assert psi.needs_generator
    with pytest.raises(ValueError, match=r"'noisy' draws random values: pass an explicit torch.Generator"):
        psi(_probe(), None)
    a = psi(_probe(), torch.Generator().manual_seed(3))
    b = psi(_probe(), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def _inplace(x, g):
    x.mul_(0.5)
    return x.clone()


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda x, g: F.avg_pool2d(x, 2), r"'bad': returned \(4, 1, 3, 3\)"),
        (lambda x, g: x.double(), r"'bad': returned .*torch.float64"),
        (lambda x, g: x - x.mean(0, keepdim=True), r"'bad': the view of a sub-batch differs"),
        (lambda x, g: x * float("nan"), r"'bad': returned non-finite values"),
        (lambda x, g: x + torch.rand(x.shape), r"'bad': differs between two generators seeded alike"),
        (lambda x, g: x.mean(), r"'bad': returned \(\)"),
        (lambda x, g: x.numpy(), r"'bad': returned ndarray, not a tensor"),
        (_inplace, r"'bad': modified its input in place"),
    ],
)
def test_user_map_refusals(fn, match) -> None:
    with pytest.raises(ValueError, match=match):
        check_public_map(fn, _probe(), name="bad")
