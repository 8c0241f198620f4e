"""Attribute inference (Theorem 4): the candidate grid, the priors, the attack's
mechanics on a model whose answer is known, and on fleet models: the model
trained without privacy beats the model-free prior, every mode stays under
Theorem 4's bound."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from fedfdp import audit as A
from fedfdp.audit import AttributeGrid, attribute_attack, candidate_losses, cell_priors
from fedfdp.config import load_config
from fedfdp.outputs import write_config
from simulations.cli import main


def test_grid_cells_and_candidates_agree():
    g = A.fleet_grid()
    assert g.shape == (5, 6, 6) and g.size == 180
    cand = g.candidates()
    assert cand.shape == (180, 3)
    assert np.array_equal(g.cell(cand), np.arange(180))  # each candidate lies in its own cell
    # values beyond the grid fall into the edge cells
    far = np.array([[10.0, -5.0, 5.0]], dtype=np.float32)
    assert g.cell(far)[0] == np.ravel_multi_index((4, 0, 5), g.shape)
    with pytest.raises(ValueError, match="ascending"):
        AttributeGrid(("a",), (np.array([1.0, 0.0]),), (np.zeros(3),))


def test_cell_priors_are_distributions():
    g = AttributeGrid(("v",), (np.array([0.0]),), (np.array([-1.0, 1.0]),))
    values = np.array([[-2.0], [-1.0], [3.0], [4.0], [5.0]])
    labels = np.array([0, 0, 1, 1, 1])
    marginal, conditional = cell_priors(g, values, labels, 3)
    assert np.allclose(marginal, [0.4, 0.6])
    assert np.allclose(conditional[0], [1, 0]) and np.allclose(conditional[1], [0, 1])
    assert np.allclose(conditional[2], 0)  # unseen label


class _Oracle(nn.Module):
    """Class-0 logit −(private − public)²: the loss is smallest when the
    candidate equals the record's public column."""

    def forward(self, x):
        z = -((x[:, 1] - x[:, 0]) ** 2)
        return torch.stack([z, torch.zeros_like(z)], dim=1)


def test_attack_mechanics_on_a_known_model():
    g = AttributeGrid(("v",), (np.array([-0.5, 0.5]),), (np.array([-1.0, 0.0, 1.0]),))
    pub = np.array([-1.0, 0.0, 1.0, 1.0], dtype=np.float32)
    priv = np.array([-0.9, 0.1, 0.8, -0.7], dtype=np.float32)  # the last one is a mismatch
    x = np.stack([pub, priv], axis=1)
    y = np.zeros(4, dtype=np.int64)
    losses = candidate_losses(_Oracle(), x, y, [1], g.candidates())
    assert losses.shape == (4, 3)
    marginal = np.array([0.2, 0.5, 0.3])
    conditional = np.array([[0.2, 0.5, 0.3], [1.0, 0.0, 0.0]])
    out = attribute_attack(_Oracle(), x, y, [1], g, marginal, conditional)
    assert out.loss_attack == 0.75  # argmin loss = the public value's cell; 3 of 4 match
    assert out.prior_marginal == 0.25  # the marginal mode (cell 1) is right once
    assert out.ball == pytest.approx(0.5) and out.targets == 4


def _fleet_run(tmp_path, mode, **keys):
    cfg = load_config({"mode": mode, "model": "mlp", "learning-rate": 0.2, "progress": False,
                       "out-dir": str(tmp_path / mode), **keys})
    (tmp_path / mode).mkdir()
    write_config(tmp_path / mode, cfg.to_flat())
    return tmp_path / mode


@pytest.mark.slow
def test_nonprivate_model_beats_the_prior_and_private_modes_stay_under_the_bound(tmp_path, capsys):
    """Fleet, 3,200 training records, 180 candidate cells. Without privacy the
    attack (loss + the population's marginal cell distribution) beats the best
    model-free guess from that distribution by > 5 standard errors; the FDP
    model's success stays under Theorem 4's bound from the run's accountant."""
    dirs = [_fleet_run(tmp_path, "nonprivate"), _fleet_run(tmp_path, "fdp", **{"target-epsilon": 2.0})]
    runs = [arg for d in dirs for arg in ("--run", str(d))]
    plot = str(tmp_path / "attack.png")
    assert main(["audit", "--attack", "attribute", "--json", *runs, "--plot", plot]) == 0
    nonprivate, fdp = json.loads(capsys.readouterr().out)
    n = nonprivate["targets"]
    p0 = nonprivate["prior_marginal"]
    se = np.sqrt(p0 * (1 - p0) / n)
    assert nonprivate["success_bayes"] > p0 + 5 * se
    assert nonprivate["bound"] == 1.0 and nonprivate["epsilon"] == float("inf")
    assert fdp["epsilon"] <= 2.0 + 1e-9
    assert fdp["ball"] <= fdp["bound"] < 1.0
    assert fdp["within_bound"] and fdp["success"] <= fdp["bound"]
    assert (tmp_path / "attack.png").stat().st_size > 1000


@pytest.mark.slow
def test_attack_reads_model_pt(tmp_path):
    """A run directory with model.pt (written by fedfdp run) is attacked as is."""
    from fedfdp.algorithm import build_model_for
    from fedfdp.data import load_dataset

    d = _fleet_run(tmp_path, "public", **{"num-rounds": 3})
    cfg = A.read_run(d)
    model = build_model_for(cfg, load_dataset(cfg.data))
    torch.save(model.state_dict(), d / "model.pt")
    res = A.attribute_attack_run(d)
    assert res["model_source"] == "model.pt" and res["bound"] == pytest.approx(res["ball"])
