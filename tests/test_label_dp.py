"""Label-DP as a case of FDP: Ψ(x, y) = x, ℓ_pub = logsumexp(wᵀx), ∇ℓ_priv = −y xᵀ."""

import numpy as np
import pytest
import torch

from fedfdp.algorithm import run_centralised
from fedfdp.clipping import clipped_grad_sum
from fedfdp.config import ConfigError, load_config
from fedfdp.data import load_dataset
from fedfdp.features import FeatureSpec, PublicView
from fedfdp.losses import FeatureMap, cross_entropy
from fedfdp.models import build_model
from fedfdp.run_plan import feature_map_for
from tests.model_helpers import linear_layer


def test_label_only_spec():
    spec = FeatureSpec.label_only(("a", "b"))
    assert spec.is_label_only and spec.public == ("a", "b") and spec.private == ()
    assert not spec.label_public
    with pytest.raises(ValueError, match="private=\\[\\]"):
        FeatureSpec(("a", "b"), ("a", "b"), ())  # label public and nothing private: nothing protected
    with pytest.raises(ValueError, match="label-free public loss"):
        PublicView(spec, "zero")
    with pytest.raises(ValueError, match="no column can stay private"):
        FeatureMap(None, FeatureSpec(("a", "b"), ("a",), ("b",)))


def _per_record_grads(model, dec, x, y):
    out = []
    for i in range(len(y)):
        loss = dec.private_loss([model(x[i : i + 1])], y[i : i + 1]).sum()
        out.append([g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))])
    return out


def test_private_gradient_is_minus_y_x_transpose():
    """Closed form (paper, Section 5): ∇_W ℓ_priv = −e_y xᵀ, ∇_b ℓ_priv = −e_y, for any weights."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 2, 1, 3, 2, 0])
    dec = FeatureMap.label_dp([f"c{i}" for i in range(5)])
    for seed in (0, 1):
        model = build_model("logistic", 5, 4, seed=seed).double()
        with torch.no_grad():  # far from the initialisation: the gradient must not change
            linear_layer(model).weight.mul_(10 * (seed + 1))
        for i, (gw, gb) in enumerate(_per_record_grads(model, dec, x, y)):
            onehot = torch.nn.functional.one_hot(y[i], 4).double()
            torch.testing.assert_close(gw, -torch.outer(onehot, x[i]))
            torch.testing.assert_close(gb, -onehot)
            # 1-Lipschitz in (x, 1): the norm is exactly sqrt(|x|^2 + 1)
            norm = torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())
            torch.testing.assert_close(norm, torch.sqrt(x[i].pow(2).sum() + 1))


def test_decomposition_is_exact_and_public_part_is_label_free():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 4, (8,), generator=gen)
    model = build_model("logistic", 3, 4, seed=2).double()
    dec = FeatureMap.label_dp(["a", "b", "c"])
    out = [model(x)]
    torch.testing.assert_close(dec.private_loss(out, y) + dec.public_loss(out, y), cross_entropy(out, y))
    # ℓ_pub does not read the label
    torch.testing.assert_close(dec.public_loss(out, y), dec.public_loss(out, (y + 1) % 4))


def test_clipped_private_sum_matches_closed_form():
    """With C above every sqrt(|x|^2 + 1) nothing is clipped: the sum is −Σ e_y (x, 1)ᵀ."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(20, 4, generator=gen)
    x = x / x.norm(dim=1, keepdim=True)  # |x| = 1: every private gradient has norm sqrt(2)
    y = torch.randint(0, 3, (20,), generator=gen)
    model = build_model("logistic", 4, 3, seed=0)
    dec = FeatureMap.label_dp(["a", "b", "c", "d"])
    got = clipped_grad_sum(model, [x], y, dec.private_loss, 1.5).grads
    onehot = torch.nn.functional.one_hot(y, 3).float()
    torch.testing.assert_close(got[0], -onehot.T @ x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], -onehot.sum(0), rtol=1e-5, atol=1e-5)
    # C = 1: every gradient is scaled by 1/sqrt(2)
    got = clipped_grad_sum(model, [x], y, dec.private_loss, 1.0).grads
    torch.testing.assert_close(got[0], -onehot.T @ x / np.sqrt(2), rtol=1e-4, atol=1e-5)


def test_config_and_decomposition_wiring():
    with pytest.raises(ConfigError, match="public-loss='label-free': needs model='logistic'"):
        load_config({"public-loss": "label-free", "model": "mlp"})
    cfg = load_config({"public-loss": "label-free", "model": "logistic", "num-devices": 2,
                       "records-per-device": 40})
    data = load_dataset(cfg.data)
    dec = feature_map_for(cfg, data)
    assert data.spec is not None
    assert dec.label_free and dec.spec is not None and dec.spec.public == data.spec.columns


def test_label_dp_run_ends_at_target():
    cfg = load_config(
        {"mode": "fdp", "public-loss": "label-free", "model": "logistic", "num-devices": 2,
         "records-per-device": 60, "num-rounds": 4, "target-epsilon": 1.0, "progress": False}
    )
    _, records = run_centralised(cfg)
    assert len(records) == 4 and all(r["phase"] == "fdp" for r in records)
    assert 0.9 < records[-1]["epsilon"] <= 1.0


# --------------------------------------------------------------------------------------
# a private label never reaches the device split or the hold-out (issue 22, item 1)
# --------------------------------------------------------------------------------------


def _label_free_table(tmp_path, labels, name, alpha=0.0):
    """A csv table whose only difference between calls is its labels; the label-DP config."""
    import pandas as pd

    rng = np.random.default_rng(5)
    n = len(labels)
    path = tmp_path / f"{name}.csv"
    pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "y": labels}).to_csv(path, index=False)
    keys = {"dataset": "csv", "data-path": str(path), "public-columns": "a", "private-columns": "b",
            "private-ranges": "b=-10:10",
            "label-column": "y", "label-classes": "0|1|2", "public-loss": "label-free", "mode": "fdp",
            "model": "logistic", "num-devices": 5, "test-fraction": 0.2, "data-seed": 3}
    if alpha:
        keys["dirichlet-alpha"] = alpha
    return load_config(keys)


def _layout(cfg):
    """Device sizes, N, and each device's / the hold-out's rows (column a identifies a row)."""
    data = load_dataset(cfg.data)
    return ([len(d.y) for d in data.devices], data.num_records,
            [tuple(d.x[:, 0].tolist()) for d in data.devices], tuple(data.test_x[:, 0].tolist()))


def test_two_tables_differing_only_in_labels_split_identically_under_label_dp(tmp_path):
    from fedfdp.mechanism import PublicFacts, resolve_mechanism

    n = 300
    rng = np.random.default_rng(11)
    first = rng.integers(0, 3, size=n)
    second = np.where(rng.random(n) < 0.5, (first + 1) % 3, first)  # about half the labels changed
    second[:100] = 0  # and a skewed class mix
    assert (first != second).sum() > 100
    a = _layout(_label_free_table(tmp_path, first, "first"))
    b = _layout(_label_free_table(tmp_path, second, "second"))
    assert a == b  # device sizes, N, which rows on which device, which rows held out
    sizes, num_records = a[0], a[1]
    assert sum(sizes) == num_records and len(set(sizes)) <= 2  # IID: sizes differ by at most one
    cfg = _label_free_table(tmp_path, first, "first")
    resolve_mechanism(cfg, PublicFacts(tuple(sizes), num_params=12))  # accepted: nothing read the labels


def test_a_label_based_split_is_refused_when_the_label_is_private(tmp_path):
    from fedfdp.mechanism import PublicFacts, resolve_mechanism
    from fedfdp.run_plan import resolve_released

    rng = np.random.default_rng(11)
    first = rng.integers(0, 3, size=300)
    second = first.copy()
    second[:150] = 0
    # the Dirichlet split does read the labels (so the test above could fail): sizes differ
    a = _layout(_label_free_table(tmp_path, first, "first", alpha=0.5))
    b = _layout(_label_free_table(tmp_path, second, "second", alpha=0.5))
    assert a[0] != b[0]
    cfg = _label_free_table(tmp_path, first, "first", alpha=0.5)
    expected = r"dirichlet-alpha=0.5: .*label-free.*set dirichlet-alpha = 0"
    with pytest.raises(ConfigError, match=expected):
        resolve_mechanism(cfg, PublicFacts(tuple(a[0]), num_params=12))
    with pytest.raises(ConfigError, match=expected):
        resolve_released(cfg)
    # the same split with the label public (fdp's own Ψ) is accepted
    public = load_config({**cfg.to_flat(), "public-loss": "auto"})
    resolve_mechanism(public, PublicFacts(tuple(a[0]), num_params=12))


def test_watch_under_label_dp_is_refused_naming_its_label_stratified_hold_out():
    from fedfdp.mechanism import PublicFacts, resolve_mechanism

    cfg = load_config({"dataset": "watch", "public-loss": "label-free", "model": "logistic",
                       "num-devices": 10})
    with pytest.raises(ConfigError, match=r"dataset='watch' with public-loss='label-free': its hold-out"):
        resolve_mechanism(cfg, PublicFacts((100,) * 10, num_params=12))


def test_fedfdp_run_refuses_the_dirichlet_split_of_a_private_label_in_one_line_before_writing(tmp_path):
    """The real CLI in a subprocess: exit 2, one line naming the key, no run directory."""
    import subprocess
    import sys

    labels = np.random.default_rng(1).integers(0, 3, size=120)
    cfg = _label_free_table(tmp_path, labels, "t", alpha=0.5)
    out = tmp_path / "run"
    keys = {"dataset": "csv", "data-path": cfg.data.data_path, "public-columns": "a", "private-columns": "b",
            "private-ranges": "b=-10:10", "label-column": "y", "label-classes": "0|1|2",
            "public-loss": "label-free", "mode": "fdp", "model": "logistic", "num-devices": 5,
            "dirichlet-alpha": 0.5, "num-rounds": 2}
    argv = [sys.executable, "-m", "simulations.cli", "run", "--centralised", "--out", str(out),
            *[a for k, v in keys.items() for a in ("--set", f"{k}={v}")]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dirichlet-alpha=0.5: ")
    assert not out.exists()
