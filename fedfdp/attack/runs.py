"""Attribute inference on a run directory's model: the fleet's candidate grid and
priors, the attacker's reference models and its choice of ``λ`` (never on the
targets), the run's accountant for Theorem 4's bound, and pooling of runs per
mode (see :mod:`fedfdp.attack` for the threat model).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedfdp.accounting import FDPAccountant, SubsampledGaussian, ThresholdedHistogram
from fedfdp.attack.inference import (
    AttributeGrid,
    attribute_attack,
    calibrated_scores,
    candidate_margins,
    cell_priors,
    excess_over_ball,
)
from fedfdp.config import DataConfig, Mode, load_config
from fedfdp.features import FeatureSpec
from fedfdp.modes import PHASES
from fedfdp.run_plan import RunPlan, build_plan

#: Data-seed offset of the population the priors (and ``Ball``) are estimated on.
PRIOR_SEED_OFFSET = 1_000_003
#: Data-seed and run-seed offset of the attacker's reference models.
REFERENCE_SEED_OFFSET = 2_000_003


# --------------------------------------------------------------------------------------
# attribute inference on a run's model
# --------------------------------------------------------------------------------------


def fleet_grid() -> AttributeGrid:
    """Candidate cells of the fleet's private features: heart rate in five
    bins (edges 80, 100, 120, 140 bpm; candidates 70, 90, 110, 130, 155 bpm)
    × latitude × longitude in a 6 × 6 grid of 4 km cells over [−1.2, 1.2]²
    (1 unit ≈ 10 km; values outside fall in the edge cells): 180 cells.
    """
    from fedfdp.data import fleet

    heart = fleet.column_scaling("heart_rate")  # declared (public): (bpm − shift) / scale
    hr_edges = heart.encode(np.array([80.0, 100.0, 120.0, 140.0]))
    hr_centres = heart.encode(np.array([70.0, 90.0, 110.0, 130.0, 155.0]))
    loc_edges = np.linspace(-1.2, 1.2, 7)[1:-1]
    loc_centres = np.linspace(-1.0, 1.0, 6)
    return AttributeGrid(
        columns=("heart_rate", "latitude", "longitude"),
        edges=(hr_edges, loc_edges, loc_edges),
        centres=(hr_centres, loc_centres, loc_centres),
    )


def reference_priors(
    data: DataConfig, grid: AttributeGrid, spec: FeatureSpec, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``P(cell)`` and ``P(cell | y)`` from records the attacker may know
    without the model: for the fleet, a fresh draw of the same generative
    model (another data seed, 40,000 records), never the training records.
    """
    from fedfdp.data import make_fleet

    if data.dataset != "fleet":
        raise ValueError(f"dataset={data.dataset!r}: the attribute attack supports the fleet only")
    ref = make_fleet(200, 250, seed=data.data_seed + PRIOR_SEED_OFFSET, test_fraction=0.2)
    x = np.concatenate([d.x for d in ref.devices])
    y = np.concatenate([d.y for d in ref.devices])
    return cell_priors(grid, x[:, spec.private_index], y, num_classes)


@dataclass(frozen=True)
class Reference:
    """A reference model and the records it was trained on (the attacker's own draw)."""

    model: nn.Module
    x: np.ndarray
    y: np.ndarray


def train_references(record: Mapping[str, Any], count: int) -> list[Reference]:
    """The attacker's reference models: ``count`` runs of the same algorithm
    and configuration (``record``, a run's flat configuration; the centralised engine,
    :func:`fedfdp.algorithm.run_plan_centrally`) on fresh draws
    of the generative model, with data seeds and run seeds of the attacker's
    own (``REFERENCE_SEED_OFFSET + k``: initialisation, batch sampling and
    noise are not the run's secret randomness). None of them sees a training
    record. They depend on the configuration but not on the run's data seed or
    seed, so runs that differ only in those share them; they are trained once
    per process (a data seed equal to a reference's would make that fleet a
    reference's: avoid seeds from ``REFERENCE_SEED_OFFSET`` on).
    """
    from fedfdp.algorithm import run_plan_centrally

    recipe = _recipe(record)
    cached = _REFERENCES.get(recipe, [])
    for k in range(len(cached), count):
        plan = build_plan(load_config({**dict(recipe), "data-seed": REFERENCE_SEED_OFFSET + k,
                                       "seed": REFERENCE_SEED_OFFSET + k, "progress": False}))
        model, _ = run_plan_centrally(plan)
        data = plan.data
        if data is None:  # pragma: no cover - build_plan loaded it
            raise RuntimeError("a reference run without data")
        x = np.concatenate([d.x for d in data.devices])
        y = np.concatenate([d.y for d in data.devices])
        cached.append(Reference(model, x, y))
    _REFERENCES[recipe] = cached
    return cached[:count]


def _recipe(record: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The configuration of the reference runs: ``record`` with the data seed and the
    seed zeroed and no output directory (shared by runs that differ only in those).
    """
    flat = {**record, "data-seed": 0, "seed": 0, "out-dir": "", "resume": False}
    return tuple(sorted((k, v if isinstance(v, Hashable) else repr(v)) for k, v in flat.items()))


#: Reference models trained in this process, per configuration (data seed and seed zeroed).
_REFERENCES: dict[tuple[tuple[str, Any], ...], list[Reference]] = {}
#: λ chosen on them, per configuration and number of references.
_WEIGHTS: dict[tuple[tuple[tuple[str, Any], ...], int], tuple[float, dict[float, float]]] = {}


#: The weights λ the attacker tries when it chooses one (:func:`choose_weight`).
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0)


def choose_weight(
    references: Sequence[Reference],
    private_index: Sequence[int],
    grid: AttributeGrid,
    conditional: np.ndarray,
    weights: Sequence[float] = WEIGHTS,
) -> tuple[float, dict[float, float]]:
    """Choose the calibrated attack's weight ``λ`` without the targets:
    leave-one-out over the attacker's own reference models.

    Each reference in turn plays the attacked model, attacked on its own
    training records (whose private values the attacker generated itself),
    calibrated by the other references; ``λ`` is the weight with the highest
    success over all of them (ties: the smaller ``λ``). ``λ = 0`` is always a
    candidate: it is the prior's guess, so a weight above 0 is chosen only
    where calibration helped on the attacker's own models. Needs at least two
    references.

    Returns
    -------
    weight, success : float, dict
        The chosen ``λ`` and the leave-one-out success of every candidate.
    """
    if len(references) < 2:
        raise ValueError(f"choose_weight: need >= 2 references, got {len(references)}")
    conditional = np.asarray(conditional, dtype=float)
    cand = grid.candidates()
    hits = np.zeros(len(weights))
    total = 0
    for j, target in enumerate(references):
        margins = [candidate_margins(r.model, target.x, target.y, private_index, cand) for r in references]
        truth = grid.cell(target.x[:, list(private_index)])
        with np.errstate(divide="ignore"):
            log_prior = np.log(conditional[target.y])
        others = margins[:j] + margins[j + 1 :]
        for i, w in enumerate(weights):
            guess = calibrated_scores(margins[j], others, log_prior, w).argmax(1)
            hits[i] += int(np.sum(guess == truth))
        total += len(target.y)
    success = {float(w): float(h / total) for w, h in zip(weights, hits, strict=True)}
    best = float(weights[int(np.argmax(hits))])  # argmax: the first (smallest) on ties
    return best, success


def read_run(run_dir: Path) -> RunPlan:
    """The plan of a run directory's configuration (``config.toml``; the ``[resolved]``
    table it also holds is dropped, it is recomputed from the configuration), its data
    loaded and its model built afresh; no output directory (nothing is written).
    """
    from fedfdp.config import read_toml
    from fedfdp.outputs import CONFIG_FILE

    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--run {str(run_dir)!r}: no {CONFIG_FILE} (not a fedfdp run directory)")
    mapping = {k: v for k, v in read_toml(path).items() if not isinstance(v, dict)}
    mapping.update({"progress": False, "out-dir": "", "resume": False})
    return build_plan(load_config(mapping))


def run_accountant(run_dir: Path, plan: RunPlan, private_rounds: int | None) -> FDPAccountant | None:
    """The run's ledger (``ledger.jsonl``), or the ledger its plan implies."""
    from fedfdp.ledger import read_ledger

    if plan.data is None:  # pragma: no cover - read_run loads it
        raise ValueError(f"{run_dir}: the attack needs the run's data")
    mechanism, _ = plan.resolve(plan.data.sizes)  # the mechanism the run's server resolved
    if not mechanism.private:
        return None
    ledger = read_ledger(run_dir)
    if ledger is not None:  # every charge ever written
        acc = FDPAccountant()
        for event in ledger.events():
            if not isinstance(event, SubsampledGaussian | ThresholdedHistogram):
                raise ValueError(f"{run_dir}: the attack re-accounts subsampled Gaussian runs (with their "
                                 "released statistics) only")
            acc.compose(event)
        return acc
    acc = FDPAccountant()
    rounds = mechanism.private_rounds if private_rounds is None else private_rounds
    if rounds > 0:
        if not isinstance(mechanism.event, SubsampledGaussian):
            raise ValueError("the attack re-accounts subsampled Gaussian runs only")
        acc.compose(mechanism.event, rounds)
    return acc


def attribute_attack_run(
    run_dir: str | Path, references: int = 4, weight: float | None = None
) -> dict[str, Any]:
    """Attribute inference on the training records of a ``fedfdp run`` directory.

    Loads ``DIR/config.toml`` and the final model ``DIR/model.pt`` (a
    state_dict); without ``model.pt`` the model is trained here with the
    centralised reference (:func:`fedfdp.algorithm.run_centralised`, same
    configuration and seed). ``references`` reference models
    (:func:`train_references`) calibrate the attack (0: no calibrated
    attack); its weight ``λ`` is ``weight``, or, if ``None``, chosen by
    :func:`choose_weight` on the references alone (needs two or more). The
    same attacks run on the held-out records (same devices, not trained on):
    success there that matches success on training records is
    population structure, a gap is memorisation.

    Theorem 4's bound ``1 − f(Ball)`` comes from the run's ledger
    (``ledger.jsonl``) or, without one, from the ledger the configuration
    implies: ``1`` for ``nonprivate`` (no guarantee) and ``Ball`` itself for
    ``public`` (ε = 0).
    """
    from fedfdp.accounting import attribute_inference_bound
    from fedfdp.algorithm import run_plan_centrally
    from fedfdp.evaluation import evaluate

    if references < 0:
        raise ValueError(f"references={references}: must be >= 0")
    run_dir = Path(run_dir)
    plan = read_run(run_dir)
    data = plan.data
    if data is None:  # pragma: no cover - read_run loads it
        raise ValueError(f"{run_dir}: the attack needs the run's data")
    mechanism, _ = plan.resolve(data.sizes)
    data_cfg = plan.config.data
    grid = fleet_grid() if data_cfg.dataset == "fleet" else None
    spec = data.spec
    if grid is None or spec is None or tuple(spec.private) != grid.columns:
        raise ValueError(
            "the attribute attack needs the fleet's private columns (heart_rate, latitude, longitude)"
        )
    model_path = run_dir / "model.pt"
    private_rounds = None
    model: nn.Module
    if model_path.is_file():
        model = plan.model
        model.load_state_dict(torch.load(model_path, map_location="cpu", weights_only=True))
        source = "model.pt"
    else:
        model, rows = run_plan_centrally(plan)
        private_rounds = sum(1 for r in rows if PHASES[r["phase"]].noise)
        source = "trained here (centralised reference)"
    pi = [int(i) for i in spec.private_index]
    marginal, conditional = reference_priors(data_cfg, grid, spec, data.num_classes)
    refs = train_references(plan.record, references)
    weight_success: dict[float, float] = {}
    if weight is None:
        if references == 1:
            raise ValueError("references=1: choosing the weight needs >= 2 references (or give a weight)")
        if refs:
            key = (_recipe(plan.record), references)
            if key not in _WEIGHTS:  # the references are shared by such runs, and so is λ
                _WEIGHTS[key] = choose_weight(refs, pi, grid, conditional)
            weight, weight_success = _WEIGHTS[key]
        else:
            weight = 0.0
    x = np.concatenate([d.x for d in data.devices])
    y = np.concatenate([d.y for d in data.devices])
    ref_models = [r.model for r in refs]
    train = attribute_attack(model, x, y, pi, grid, marginal, conditional, ref_models, weight)
    held = attribute_attack(
        model, data.test_x, data.test_y, pi, grid, marginal, conditional, ref_models, weight
    )
    acc = run_accountant(run_dir, plan, private_rounds)
    if mechanism.mode is Mode.NONPRIVATE:
        bound, epsilon = 1.0, math.inf
    elif acc is None:
        bound, epsilon = train.ball, 0.0
    else:
        bound = attribute_inference_bound(acc, train.ball)
        epsilon = acc.epsilon(mechanism.delta)
    accuracy, _ = evaluate(model, data.test_x, data.test_y)
    train_acc, _ = evaluate(model, x, y)
    out: dict[str, Any] = {
        "run": str(run_dir),
        "mode": mechanism.mode,
        "model_source": source,
        "epsilon": epsilon,
        "accuracy": accuracy,
        "train_accuracy": train_acc,
        "targets": train.targets,
        "heldout_targets": held.targets,
        "cells": grid.size,
        "references": references,
        "weight": weight,
        # leave-one-out success of each candidate weight on the references (when chosen)
        "weight_success": {str(k): v for k, v in weight_success.items()},
        "success_loss": train.loss_attack,
        "success_bayes": train.bayes_attack,
        "success_calibrated": train.calibrated_attack,
        "success": train.best,
        "heldout_success_bayes": held.bayes_attack,
        "heldout_success_calibrated": held.calibrated_attack,
        "heldout_success": held.best,
        "prior_marginal": train.prior_marginal,
        "prior_label": train.prior_label,
        "ball": train.ball,
        "heldout_ball": held.ball,
        "bound": bound,
        "within_bound": train.best <= bound,
        # (best success − marginal prior) in standard errors of the prior's rate over the targets
        "advantage_z": (train.best - train.prior_marginal)
        / math.sqrt(max(train.prior_marginal * (1 - train.prior_marginal), 1e-12) / train.targets),
    }
    if train.calibrated_attack is not None and held.calibrated_attack is not None:
        z, p = excess_over_ball(train.calibrated_attack, train.ball, train.targets)
        hz, hp = excess_over_ball(held.calibrated_attack, held.ball, held.targets)
        out.update(
            calibrated_z_vs_ball=z,
            calibrated_p_vs_ball=p,
            heldout_calibrated_z_vs_ball=hz,
            heldout_calibrated_p_vs_ball=hp,
            train_minus_heldout_z=_two_proportion_z(
                train.calibrated_attack, train.targets, held.calibrated_attack, held.targets
            ),
        )
    return out


def _two_proportion_z(p1: float, n1: int, p2: float, n2: int) -> float:
    """Pooled two-proportion z statistic of ``p1 − p2``."""
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / n1 + 1 / n2))
    return (p1 - p2) / se


_TRAIN_RATES = ("success_loss", "success_bayes", "success_calibrated", "success", "prior_marginal",
                "prior_label", "ball", "bound", "train_accuracy")
_HELD_RATES = ("heldout_success_bayes", "heldout_success_calibrated", "heldout_success", "heldout_ball",
               "accuracy")


def pool_results(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pool :func:`attribute_attack_run` results of runs with the same mode
    (e.g. the same configuration on several data seeds: independent fleets).

    Rates are averaged with the targets as weights (training rates over the
    training records, held-out rates over the held-out records), so a pooled
    rate is the success over all targets together. The pooled bound is the
    same weighted mean of the runs' bounds: Theorem 4 bounds each run's
    expected success, so their weighted mean bounds the pooled one. ``ε`` is
    the largest of the runs'.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["mode"], []).append(r)
    pooled = []
    for mode, rs in groups.items():
        n = sum(r["targets"] for r in rs)
        m = sum(r["heldout_targets"] for r in rs)
        out: dict[str, Any] = {
            "mode": mode,
            "runs": [r["run"] for r in rs],
            "epsilon": max(r["epsilon"] for r in rs),
            "targets": n,
            "heldout_targets": m,
            "cells": rs[0]["cells"],
            "references": rs[0]["references"],
            "weight": rs[0]["weight"],
        }
        for keys, count, total in ((_TRAIN_RATES, "targets", n), (_HELD_RATES, "heldout_targets", m)):
            for key in keys:
                vals = [r[key] for r in rs]
                out[key] = (
                    None if None in vals else sum(v * r[count] for v, r in zip(vals, rs, strict=True)) / total
                )
        out["within_bound"] = out["success"] <= out["bound"]
        out["advantage_z"] = (out["success"] - out["prior_marginal"]) / math.sqrt(
            max(out["prior_marginal"] * (1 - out["prior_marginal"]), 1e-12) / n
        )
        if out["success_calibrated"] is not None and out["heldout_success_calibrated"] is not None:
            z, p = excess_over_ball(out["success_calibrated"], out["ball"], n)
            hz, hp = excess_over_ball(out["heldout_success_calibrated"], out["heldout_ball"], m)
            out.update(
                calibrated_z_vs_ball=z,
                calibrated_p_vs_ball=p,
                heldout_calibrated_z_vs_ball=hz,
                heldout_calibrated_p_vs_ball=hp,
                train_minus_heldout_z=_two_proportion_z(out["success_calibrated"], n,
                                                        out["heldout_success_calibrated"], m),
            )
        pooled.append(out)
    return pooled
