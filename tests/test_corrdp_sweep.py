"""``simulations/corrdp_sweep.py``: the grid, Theorem 3.6's rate ratio (hand-computed
values), and a tiny sweep end to end (tables, excess risk, plot)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fedfdp.config import ConfigError
from simulations.corrdp_sweep import grid_points, main, point_docs, point_tag, theory_ratio


def test_point_docs_declare_tv_and_every_column_sensitive():
    point = {"num-sensitive": 1, "num-insensitive": 2, "correlation": 0.25}
    doc = {"modes": ["dp", "corrdp"], "mode": {"corrdp": {"corrdp-weight-bound": 2.0}}}
    docs = point_docs(doc, point, all_sensitive=True)
    assert list(docs) == ["ms1_rho0.25", "ms1_rho0.25_all-sensitive"]
    assert docs["ms1_rho0.25"]["mode"]["corrdp"] == {"corrdp-weight-bound": 2.0, "insensitive-tv": "*=0.25"}
    every = docs["ms1_rho0.25_all-sensitive"]
    assert every["modes"] == ["corrdp"] and every["correlation"] == 0.25
    assert every["mode"]["corrdp"] == {"corrdp-weight-bound": 2.0, "sensitive-columns": "s0,u0,u1",
                                       "insensitive-tv": ""}
    assert list(point_docs(doc, point, all_sensitive=False)) == ["ms1_rho0.25"]


def test_grid_points_and_refusals():
    points = grid_points({"columns": 20, "num-sensitive": [2, 5], "correlation": [0.0, 1.0]})
    assert points == [
        {"num-sensitive": 2, "num-insensitive": 18, "correlation": 0.0},
        {"num-sensitive": 2, "num-insensitive": 18, "correlation": 1.0},
        {"num-sensitive": 5, "num-insensitive": 15, "correlation": 0.0},
        {"num-sensitive": 5, "num-insensitive": 15, "correlation": 1.0},
    ]
    assert point_tag(points[1]) == "ms2_rho1"
    with pytest.raises(ConfigError, match=r"num-sensitive=\[2, 20\]"):
        grid_points({"columns": 20, "num-sensitive": [2, 20], "correlation": [0.0]})
    with pytest.raises(ConfigError, match="needs columns"):
        grid_points({"num-sensitive": [2], "correlation": [0.0]})


def test_theory_ratio_is_theorem_3_6_over_dp_erm():
    # sqrt(m) / sqrt(m_s + min(sum TV, m_s / 4)), by hand
    assert theory_ratio(20, 2, 0.0) == pytest.approx(math.sqrt(10))  # TV = 0: sqrt(m/m_s)
    assert theory_ratio(20, 2, 18 * 0.25) == pytest.approx(math.sqrt(20 / 2.5))  # capped at m_s/4
    assert theory_ratio(20, 10, 10 * 0.1) == pytest.approx(math.sqrt(20 / 11))
    assert theory_ratio(20, 10, 0.0) == pytest.approx(math.sqrt(2))


@pytest.mark.slow
def test_tiny_sweep_end_to_end(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(
        'modes = ["nonprivate", "dp", "corrdp"]\ntarget-epsilons = [2.0]\nseeds = [0]\n'
        'dataset = "correlated"\nnum-devices = 2\nrecords-per-device = 30\nsampling-rate = 1.0\n'
        'num-rounds = 3\nlabel-signal = 1.0\n'
        '[grid]\ncolumns = 4\nnum-sensitive = [1]\ncorrelation = [0.0, 1.0]\nall-sensitive = true\n'
    )
    out = tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out)]) == 0
    frame = pd.read_csv(out / "corrdp_sweep.csv")
    assert len(frame) == 2 * 4 and set(frame["correlation"]) == {0.0, 1.0}
    assert set(frame["mode"]) == {"nonprivate", "dp", "corrdp", "corrdp-all-sensitive"}
    assert (frame[frame["mode"] == "nonprivate"]["excess_risk"] == 0).all()
    # the training loss is the cross-entropy of the saved model on the training records
    from fedfdp.config import load_config, read_toml
    from fedfdp.data import load_dataset

    run = out / "ms1_rho1" / "runs" / "corrdp_eps2_seed0"
    cfg = load_config(read_toml(run / "config.toml"))
    assert cfg.privacy.insensitive_tv == (("*", 1.0),)  # corrdp declares TV = rho
    data = load_dataset(cfg.data)
    state = torch.load(run / "model.pt")
    weight = next(v for k, v in state.items() if k.endswith("weight"))
    bias = next(v for k, v in state.items() if k.endswith("bias"))
    x = torch.cat([torch.as_tensor(d.x) for d in data.devices])
    y = torch.cat([torch.as_tensor(d.y) for d in data.devices])
    loss = float(F.cross_entropy(x @ weight.T + bias, y))
    row = frame[(frame["mode"] == "corrdp") & (frame["correlation"] == 1.0)].iloc[0]
    assert row["train_loss"] == pytest.approx(loss, rel=1e-5)
    # every column sensitive: the same corrdp code with no insensitive feature
    every_run = out / "ms1_rho1_all-sensitive" / "runs" / "corrdp_eps2_seed0"
    every = load_config(read_toml(every_run / "config.toml"))
    assert every.privacy.sensitive_columns == ("s0", "u0", "u1", "u2")
    assert every.privacy.insensitive_tv == ()
    table = (out / "corrdp_sweep.md").read_text()
    assert "all-sensitive / `corrdp`" in table and "| `corrdp` insensitive |" in table
    # Eq. (3): insensitive std = sigma * sqrt(max(TV, (m_s/m)^2)); m_s/m = 1/4, TV = rho
    corr = frame[frame["mode"] == "corrdp"].set_index("correlation")
    insensitive, sigma = corr["insensitive_noise_multiplier"], corr["noise_multiplier"]
    assert insensitive[0.0] == pytest.approx(sigma[0.0] / 4)
    assert insensitive[1.0] == pytest.approx(sigma[1.0])
    assert "[np." not in table
    assert "| 1/4 | 0 | 2 |" in table and "| 1/4 | 1 | 2 |" in table
    assert (out / "corrdp_sweep.png").stat().st_size > 1000
