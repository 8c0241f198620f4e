"""Ψ and the public losses: validation, views independent of private values, exact decomposition."""

import numpy as np
import pytest
import torch

from fedfdp.data import make_fleet
from fedfdp.features import FeatureSpec, PublicStatistics, PublicView
from fedfdp.losses import FeatureMap, cross_entropy
from fedfdp.models import build_model

COLS = ("a", "b", "c", "d")


@pytest.mark.parametrize(
    ("public", "private", "fragment"),
    [
        (("a", "b"), ("b", "c", "d"), "overlap in ['b']"),
        ((), ("a", "b", "c", "d"), "public=[]"),
        (("a", "b", "c", "d"), (), "private=[]"),
        (("a", "z"), ("b", "c", "d"), "unknown column(s) ['z']"),
        (("a",), ("b", "c"), "columns ['d']: neither public nor private"),
        (("a", "a"), ("b", "c", "d"), "duplicated"),
    ],
)
def test_spec_validation(public, private, fragment):
    with pytest.raises(ValueError) as err:
        FeatureSpec(COLS, public, private)
    assert fragment in str(err.value)


def _spec():
    return FeatureSpec(COLS, ("a", "c"), ("b", "d"))


@pytest.mark.parametrize("method", ["gaussian", "zero", "mean"])
def test_view_depends_on_public_columns_only(method):
    spec = _spec()
    stats = PublicStatistics.from_public(spec, [0.5, -1.0]) if method == "mean" else None
    view = PublicView(spec, method, stats)
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, spec.private_index] = torch.randn(50, 2) * 100  # different private values
    v1 = view(x, torch.Generator().manual_seed(5))
    v2 = view(x2, torch.Generator().manual_seed(5))
    assert torch.equal(v1, v2)
    assert torch.equal(v1[:, spec.public_index], x[:, spec.public_index])
    if method == "zero":
        assert (v1[:, spec.private_index] == 0).all()
    if method == "mean":
        assert torch.allclose(v1[:, spec.private_index], torch.tensor([0.5, -1.0]).expand(50, 2))


def test_gaussian_padding_is_standard_normal_and_needs_generator():
    spec = _spec()
    view = PublicView(spec, "gaussian")
    with pytest.raises(ValueError, match="explicit torch.Generator"):
        view(torch.zeros(3, 4))
    pad = view(torch.zeros(20000, 4, dtype=torch.float64), torch.Generator().manual_seed(0))
    draws = pad[:, spec.private_index].numpy().ravel()
    # 40k N(0,1) draws: mean within 5 s.e., variance within 5 s.e. (s.e. of var = sqrt(2/n))
    assert abs(draws.mean()) < 5 / np.sqrt(draws.size)
    assert abs(draws.var() - 1) < 5 * np.sqrt(2 / draws.size)


def test_mean_needs_public_statistics():
    with pytest.raises(ValueError, match="PublicStatistics"):
        PublicView(_spec(), "mean")
    with pytest.raises(ValueError, match="one value per private column"):
        PublicStatistics.from_public(_spec(), [1.0])


@pytest.mark.parametrize("method", ["gaussian", "zero"])
def test_private_plus_public_equals_full_loss(method):
    """ℓ_priv + ℓ_pub == ℓ record by record, with the same view draw."""
    fleet = make_fleet(2, 40, seed=3)
    spec = fleet.spec
    assert spec is not None
    dec = FeatureMap(PublicView(spec, method))
    model = build_model("mlp", len(spec.columns), 5, hidden_size=8).double()
    x = torch.as_tensor(fleet.devices[0].x, dtype=torch.float64)
    y = torch.as_tensor(fleet.devices[0].y)
    inputs = dec.private_inputs(x, torch.Generator().manual_seed(0))
    outs = [model(i) for i in inputs]
    priv = dec.private_loss(outs, y)
    pub = dec.public_loss([outs[1]], y)
    full = cross_entropy([outs[0]], y)
    torch.testing.assert_close(priv + pub, full, rtol=0, atol=1e-12)


def test_label_free_decomposition_gradient():
    """Label-DP: ∇ℓ_priv = −x yᵀ for softmax regression (paper, Section 5)."""
    dec = FeatureMap(None)
    model = torch.nn.Linear(3, 4, bias=False).double()
    x = torch.randn(1, 3, dtype=torch.float64)
    y = torch.tensor([2])
    loss = dec.private_loss([model(x)], y).sum()
    (g,) = torch.autograd.grad(loss, [model.weight])
    expected = -torch.nn.functional.one_hot(y, 4).double().T @ x
    torch.testing.assert_close(g, expected)
    total = dec.private_loss([model(x)], y) + dec.public_loss([model(x)], y)
    torch.testing.assert_close(total, cross_entropy([model(x)], y))
