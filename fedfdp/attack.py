"""Attribute inference on a trained model: Theorem 4 of the FDP paper, measured.

Threat model (Def. 7 of ``fdp_protected_attributes.txt``)
---------------------------------------------------------
A target record ``x`` with label ``y`` is in the training set. The attacker
sees the trained model ``θ``, knows the target's public features ``Ψ(x) = u``
and its label (label and Ψ are disclosed by design), and guesses the private
features. Here the private features are discretised into the cells of an
:class:`AttributeGrid`; a guess succeeds when it names the target's cell
(``d`` = "same cell", ``ρ = 0``).

What the attacker may know besides ``θ``, ``Ψ(x)`` and ``y``: the training
*algorithm* and its configuration (as for any DP mechanism), and the data's
*generative model*, from which it draws fresh records of its own (another data
seed). It never sees the training records' private values.

Bound (Theorem 4, Def. 8)
-------------------------
For a mechanism that is feature ``f``-DP (add/remove, Def. 6), every attacker's
success on ``x ∼ X | Ψ(X) = u`` is at most ``1 − f(Ball(X, u))``, where
``Ball`` is the success of the best guess made **without** the model:
``max_c P(c | u)``. On the fleet the private readings depend on ``Ψ(x)`` only
through the label, so ``Ball = max_c P(c | y)``, estimated on a fresh draw of
the generative model (:func:`reference_priors`). Averaged over the targets, by
convexity of ``f``, mean success ``≤ 1 − f(mean Ball)``;
:func:`fedfdp.accounting.attribute_inference_bound` computes it from a run's
ledger.

Attacks
-------
* **loss** — the candidate with the smallest model loss;
* **loss + marginal prior** — maximise ``log P(c) − loss(c)``;
* **calibrated** (likelihood ratio against reference models, in the spirit of
  LiRA, Carlini et al. 2022) — maximise
  ``log P(c | y) + λ·(s_θ(c) − mean_r s_r(c))``, where ``s(c)`` is the model's
  logit-scaled confidence in the true label with candidate ``c`` written into
  the private columns (:func:`candidate_margins`) and the ``s_r`` come from
  *reference models* trained by the attacker with the same algorithm and
  configuration on fresh draws of the generative model (its own data seeds
  and randomness; :func:`train_references`). A model that only generalises
  behaves like the references on a target, the correction averages out and the
  attack is the prior's guess (success ``≈ Ball``); only what the model
  memorised about the target itself can lift it above ``Ball``. ``λ`` is
  chosen without the targets (:func:`choose_weight`): leave-one-out over the
  reference models, each attacked on its own training records (the attacker
  generated them, so it knows their private values).

Everything here is independent of Flower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import nn

from fedfdp.accounting import FDPAccountant
from fedfdp.config import Config, load_config
from fedfdp.features import FeatureSpec
from fedfdp.modes import PHASES

__all__ = [
    "AttackOutcome",
    "AttributeGrid",
    "Reference",
    "attribute_attack",
    "attribute_attack_run",
    "calibrated_scores",
    "candidate_losses",
    "candidate_margins",
    "cell_priors",
    "choose_weight",
    "excess_over_ball",
    "fleet_grid",
    "pool_results",
    "read_run",
    "reference_priors",
    "run_accountant",
    "train_references",
]

#: Data-seed offset of the population the priors (and ``Ball``) are estimated on.
PRIOR_SEED_OFFSET = 1_000_003
#: Data-seed and run-seed offset of the attacker's reference models.
REFERENCE_SEED_OFFSET = 2_000_003


# --------------------------------------------------------------------------------------
# candidates and priors
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttributeGrid:
    """A discretisation of the private features into cells (the attacker's candidates).

    One axis per private column: ``edges[i]`` are the inner bin edges of
    column ``columns[i]`` (ascending; values below the first edge fall in bin
    0, values above the last in the last bin) and ``centres[i]`` the value the
    attacker writes into the column for each bin. A cell is one bin per axis;
    cells are numbered in C order.
    """

    columns: tuple[str, ...]
    edges: tuple[np.ndarray, ...]
    centres: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if not (len(self.columns) == len(self.edges) == len(self.centres)) or not self.columns:
            raise ValueError("AttributeGrid: need one edges and one centres array per column")
        for col, e, c in zip(self.columns, self.edges, self.centres, strict=True):
            e, c = np.asarray(e), np.asarray(c)
            if len(c) != len(e) + 1 or np.any(np.diff(e) <= 0):
                raise ValueError(
                    f"AttributeGrid column {col!r}: need ascending edges and len(edges) + 1 centres"
                )

    @property
    def shape(self) -> tuple[int, ...]:
        """Bins per axis."""
        return tuple(len(c) for c in self.centres)

    @property
    def size(self) -> int:
        """Number of cells (candidates)."""
        return int(np.prod(self.shape))

    def cell(self, values: np.ndarray) -> np.ndarray:
        """Cell index of each row of private values ``(n, P)``."""
        v = np.asarray(values, dtype=float)
        if v.ndim != 2 or v.shape[1] != len(self.columns):
            raise ValueError(f"values with shape {v.shape}: need (n, {len(self.columns)})")
        idx = [np.searchsorted(np.asarray(e), v[:, i], side="right") for i, e in enumerate(self.edges)]
        return np.ravel_multi_index(idx, self.shape).astype(np.int64)

    def candidates(self) -> np.ndarray:
        """The candidate private values, one row per cell ``(K, P)``, in cell order."""
        mesh = np.meshgrid(*[np.asarray(c, dtype=np.float32) for c in self.centres], indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)


def cell_priors(
    grid: AttributeGrid, values: np.ndarray, labels: np.ndarray, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Empirical cell distribution of a reference population: the marginal
    ``P(cell)`` ``(K,)`` and the label-conditional ``P(cell | y)`` ``(C, K)``."""
    cells = grid.cell(values)
    labels = np.asarray(labels, dtype=np.int64)
    marginal = np.bincount(cells, minlength=grid.size) / max(len(cells), 1)
    conditional = np.zeros((num_classes, grid.size))
    for c in range(num_classes):
        mask = labels == c
        conditional[c] = np.bincount(cells[mask], minlength=grid.size) / max(int(mask.sum()), 1)
    return marginal, conditional


# --------------------------------------------------------------------------------------
# the model's view of each candidate
# --------------------------------------------------------------------------------------


@torch.no_grad()
def _per_candidate(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    private_index: Sequence[int],
    candidates: np.ndarray,
    statistic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batch_rows: int = 65536,
) -> np.ndarray:
    """``statistic(logits, labels)`` of the model on each record with each
    candidate written into its private columns: ``(n, K)``."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    cand = torch.as_tensor(np.asarray(candidates, dtype=np.float32))
    idx = torch.as_tensor(np.asarray(private_index, dtype=np.int64))
    k = len(cand)
    step = max(1, batch_rows // max(k, 1))
    out = np.empty((len(y), k), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(y), step):
            xb = torch.as_tensor(x[s : s + step])
            yb = torch.as_tensor(y[s : s + step])
            rows = xb.repeat_interleave(k, dim=0)
            rows[:, idx] = cand.repeat(len(xb), 1)
            value = statistic(model(rows), yb.repeat_interleave(k))
            out[s : s + step] = value.view(len(xb), k).double().numpy()
    finally:
        model.train(was_training)
    return out


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits, labels, reduction="none")


def _logit_margin(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    z = logits.double()
    true = z.gather(1, labels[:, None])[:, 0]
    others = z.scatter(1, labels[:, None], -math.inf).logsumexp(1)
    return true - others


def candidate_losses(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    private_index: Sequence[int],
    candidates: np.ndarray,
    batch_rows: int = 65536,
) -> np.ndarray:
    """Cross-entropy of the model on each record with each candidate written
    into its private columns: ``(n, K)``. The public columns (``Ψ(x)``) and the
    label are the record's own: what the attacker of Theorem 4 knows."""
    return _per_candidate(model, x, y, private_index, candidates, _cross_entropy, batch_rows)


def candidate_margins(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    private_index: Sequence[int],
    candidates: np.ndarray,
    batch_rows: int = 65536,
) -> np.ndarray:
    """Logit-scaled confidence in the true label, ``log p_y − log(1 − p_y)``
    (computed as ``z_y − logsumexp_{j≠y} z_j``), for each record and candidate:
    ``(n, K)``.

    The statistic LiRA uses: unlike the cross-entropy (``−log p_y``), it does not
    saturate at 0 when the model fits a record perfectly, so memorisation
    stays visible."""
    return _per_candidate(model, x, y, private_index, candidates, _logit_margin, batch_rows)


# --------------------------------------------------------------------------------------
# the attack
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttackOutcome:
    """Success rates of attribute inference on a set of target records.

    Attributes
    ----------
    loss_attack : float
        The guess is the candidate with the smallest model loss.
    bayes_attack : float
        The guess maximises ``−loss + log P(cell)``: the model's likelihood of
        the label times the population's marginal distribution of the private
        features (which the attacker may know without the model).
    calibrated_attack : float or None
        The guess maximises ``log P(cell | y) + λ·(s_θ − mean_r s_r)`` (logit
        margins of the target model and of the reference models); ``None``
        without reference models.
    prior_marginal : float
        Success of always guessing the marginal mode (no model, no label).
    prior_label : float
        Success of guessing the mode of ``P(cell | y)`` (no model): the
        realised success of Ball's guess on these targets.
    ball : float
        ``Ball`` of Def. 8 at radius 0, averaged over the targets:
        ``mean_i max_c P(c | y_i)`` (Theorem 4's prior; ``Ψ`` tells nothing
        more about the private features than the label under the fleet's
        generative model).
    targets : int
    """

    loss_attack: float
    bayes_attack: float
    calibrated_attack: float | None
    prior_marginal: float
    prior_label: float
    ball: float
    targets: int

    @property
    def best(self) -> float:
        """The highest success among the attacks (what is held against the bound)."""
        rates = [self.loss_attack, self.bayes_attack]
        if self.calibrated_attack is not None:
            rates.append(self.calibrated_attack)
        return max(rates)


def calibrated_scores(
    target: np.ndarray, references: Sequence[np.ndarray], log_prior: np.ndarray, weight: float = 1.0
) -> np.ndarray:
    """``log P(c | y) + weight·(s_θ(c) − mean_r s_r(c))`` per target and candidate ``(n, K)``.

    ``target`` and each of ``references`` are :func:`candidate_margins` of the
    attacked model and of the reference models on the same targets;
    ``log_prior`` is ``log P(c | y_i)`` per target. Without references the
    score is the prior alone (Ball's guess).
    """
    score = np.array(log_prior, dtype=float, copy=True)
    if len(references):
        score += weight * (np.asarray(target) - np.mean(np.stack(references), axis=0))
    return score


def attribute_attack(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    private_index: Sequence[int],
    grid: AttributeGrid,
    marginal: np.ndarray,
    conditional: np.ndarray,
    references: Sequence[nn.Module] = (),
    weight: float = 1.0,
) -> AttackOutcome:
    """Attribute inference on target records ``(x, y)`` (Theorem 4's setting).

    For each target the attacker knows ``Ψ(x)`` (the public columns) and the
    label and guesses the cell of its private features among
    ``grid.candidates()`` from the model's output on each candidate
    (:func:`candidate_losses`, :func:`candidate_margins`). ``marginal`` and
    ``conditional`` (:func:`cell_priors`, from a reference population, never
    from the targets) give the model-free baselines and ``Ball``;
    ``references`` (models the attacker trained itself on fresh data, never on
    the targets) calibrate the target model's margins (the *calibrated*
    attack, weight ``λ = weight``). Success means the guessed cell is the
    target's true cell.
    """
    x = np.asarray(x)
    y = np.asarray(y, dtype=np.int64)
    if len(y) == 0:
        raise ValueError("attribute_attack: no target records")
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"weight={weight!r}: must be finite and >= 0")
    conditional = np.asarray(conditional, dtype=float)
    truth = grid.cell(x[:, list(private_index)])
    cand = grid.candidates()
    losses = candidate_losses(model, x, y, private_index, cand)
    with np.errstate(divide="ignore"):
        log_marginal = np.log(np.asarray(marginal, dtype=float))
        log_conditional = np.log(conditional)
    loss_guess = losses.argmin(1)
    bayes_guess = (log_marginal[None, :] - losses).argmax(1)
    calibrated = None
    if len(references):
        target = candidate_margins(model, x, y, private_index, cand)
        refs = [candidate_margins(r, x, y, private_index, cand) for r in references]
        guess = calibrated_scores(target, refs, log_conditional[y], weight).argmax(1)
        calibrated = float(np.mean(guess == truth))
    label_mode = conditional.argmax(1)
    return AttackOutcome(
        loss_attack=float(np.mean(loss_guess == truth)),
        bayes_attack=float(np.mean(bayes_guess == truth)),
        calibrated_attack=calibrated,
        prior_marginal=float(np.mean(truth == int(np.argmax(marginal)))),
        prior_label=float(np.mean(label_mode[y] == truth)),
        ball=float(np.mean(conditional.max(1)[y])),
        targets=len(y),
    )


def excess_over_ball(success: float, ball: float, n: int) -> tuple[float, float]:
    """How far a success rate on ``n`` targets lies above ``Ball``: the z-score
    ``(success − Ball)/√(Ball(1 − Ball)/n)`` and the one-sided binomial p-value
    of ``Pr[Bin(n, Ball) ≥ n·success]``.

    Without the model no guess succeeds with probability above ``max_c P(c | y_i)``
    on target ``i``, so the number of successes of a model-free attacker is
    stochastically at most ``Bin(n, Ball)`` when the per-target priors are
    equal, and has mean ``≤ n·Ball`` in general; a small p-value means the
    model told the attacker something about the targets' private features.
    """
    if n < 1 or not 0.0 < ball < 1.0:
        return math.nan, math.nan
    k = round(success * n)
    z = (success - ball) / math.sqrt(ball * (1 - ball) / n)
    p = float(stats.binom.sf(k - 1, n, ball))
    return z, p


# --------------------------------------------------------------------------------------
# attribute inference on a run's model
# --------------------------------------------------------------------------------------


def fleet_grid() -> AttributeGrid:
    """Candidate cells of the fleet's private features: heart rate in five
    bins (edges 80, 100, 120, 140 bpm; candidates 70, 90, 110, 130, 155 bpm)
    × latitude × longitude in a 6 × 6 grid of 4 km cells over [−1.2, 1.2]²
    (1 unit ≈ 10 km; values outside fall in the edge cells): 180 cells."""
    from fedfdp.data import fleet

    # the fleet's declared (public) scaling of heart rate: (bpm − shift) / scale
    shift, scale = fleet._SHIFT["heart_rate"], fleet._SCALE["heart_rate"]
    hr_edges = (np.array([80.0, 100.0, 120.0, 140.0]) - shift) / scale
    hr_centres = (np.array([70.0, 90.0, 110.0, 130.0, 155.0]) - shift) / scale
    loc_edges = np.linspace(-1.2, 1.2, 7)[1:-1]
    loc_centres = np.linspace(-1.0, 1.0, 6)
    return AttributeGrid(
        columns=("heart_rate", "latitude", "longitude"),
        edges=(hr_edges, loc_edges, loc_edges),
        centres=(hr_centres, loc_centres, loc_centres),
    )


def reference_priors(
    cfg: Config, grid: AttributeGrid, spec: FeatureSpec, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``P(cell)`` and ``P(cell | y)`` from records the attacker may know
    without the model: for the fleet, a fresh draw of the same generative
    model (another data seed, 40,000 records), never the training records."""
    from fedfdp.data import make_fleet

    if cfg.data.dataset != "fleet":
        raise ValueError(f"dataset={cfg.data.dataset!r}: the attribute attack supports the fleet only")
    ref = make_fleet(200, 250, seed=cfg.data.data_seed + PRIOR_SEED_OFFSET, test_fraction=0.2)
    x = np.concatenate([d.x for d in ref.devices])
    y = np.concatenate([d.y for d in ref.devices])
    return cell_priors(grid, x[:, spec.private_index], y, num_classes)


@dataclass(frozen=True)
class Reference:
    """A reference model and the records it was trained on (the attacker's own draw)."""

    model: nn.Module
    x: np.ndarray
    y: np.ndarray


def train_references(cfg: Config, count: int) -> list[Reference]:
    """The attacker's reference models: ``count`` runs of the same algorithm
    and configuration (:func:`fedfdp.algorithm.run_centralised`) on fresh draws
    of the generative model, with data seeds and run seeds of the attacker's
    own (``REFERENCE_SEED_OFFSET + k``: initialisation, batch sampling and
    noise are not the run's secret randomness). None of them sees a training
    record. They depend on the configuration but not on the run's data seed or
    seed, so runs that differ only in those share them; they are trained once
    per process (a data seed equal to a reference's would make that fleet a
    reference's: avoid seeds from ``REFERENCE_SEED_OFFSET`` on)."""
    from fedfdp.algorithm import run_centralised
    from fedfdp.data import load_dataset

    recipe = load_config({"data-seed": 0, "seed": 0, "out-dir": ""}, base=cfg)
    cached = _REFERENCES.get(recipe, [])
    for k in range(len(cached), count):
        ref_cfg = load_config(
            {"data-seed": REFERENCE_SEED_OFFSET + k, "seed": REFERENCE_SEED_OFFSET + k, "progress": False},
            base=recipe,
        )
        data = load_dataset(ref_cfg.data)
        model, _ = run_centralised(ref_cfg, data)
        x = np.concatenate([d.x for d in data.devices])
        y = np.concatenate([d.y for d in data.devices])
        cached.append(Reference(model, x, y))
    _REFERENCES[recipe] = cached
    return cached[:count]


#: Reference models trained in this process, per configuration (data seed and seed zeroed).
_REFERENCES: dict[Config, list[Reference]] = {}
#: λ chosen on them, per configuration and number of references.
_WEIGHTS: dict[tuple[Config, int], tuple[float, dict[float, float]]] = {}


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


def read_run(run_dir: Path) -> Config:
    """The configuration of a run directory (``config.toml``; the ``[resolved]``
    table it also holds is dropped, it is recomputed from the configuration)."""
    from fedfdp.config import read_toml
    from fedfdp.outputs import CONFIG_FILE

    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--run {str(run_dir)!r}: no {CONFIG_FILE} (not a fedfdp run directory)")
    mapping = {k: v for k, v in read_toml(path).items() if not isinstance(v, dict)}
    mapping["progress"] = False
    return load_config(mapping)


def run_accountant(run_dir: Path, cfg: Config, private_rounds: int | None) -> FDPAccountant | None:
    """The run's ledger (``ledger.json``), or the ledger its configuration implies."""
    from fedfdp.budget import plan_privacy
    from fedfdp.checkpoint import read_ledger
    from fedfdp.data import load_dataset

    if not cfg.privacy.is_private:
        return None
    ledger = read_ledger(run_dir)
    acc = FDPAccountant()
    if ledger is not None:
        acc.load_state_dict(ledger.accountant)
        return acc
    plan = plan_privacy(cfg, load_dataset(cfg.data).num_records)
    rounds = plan.private_rounds if private_rounds is None else private_rounds
    if rounds > 0:
        if plan.noise_multiplier is None:
            raise ValueError("noise multiplier unresolved for a private run")
        acc.compose(plan.noise_multiplier, plan.sampling_rate, rounds)
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
    (``ledger.json``) or, without one, from the ledger the configuration
    implies: ``1`` for ``nonprivate`` (no guarantee) and ``Ball`` itself for
    ``public`` (ε = 0).
    """
    from fedfdp.accounting import attribute_inference_bound
    from fedfdp.algorithm import build_model_for, evaluate, run_centralised
    from fedfdp.data import load_dataset

    if references < 0:
        raise ValueError(f"references={references}: must be >= 0")
    run_dir = Path(run_dir)
    cfg = read_run(run_dir)
    data = load_dataset(cfg.data)
    grid = fleet_grid() if cfg.data.dataset == "fleet" else None
    if grid is None or tuple(data.spec.private) != grid.columns:
        raise ValueError(
            "the attribute attack needs the fleet's private columns (heart_rate, latitude, longitude)"
        )
    model_path = run_dir / "model.pt"
    private_rounds = None
    if model_path.is_file():
        model = build_model_for(cfg, data)
        model.load_state_dict(torch.load(model_path, map_location="cpu", weights_only=True))
        source = "model.pt"
    else:
        model, records = run_centralised(cfg, data)
        private_rounds = sum(1 for r in records if PHASES[r.phase].noise)
        source = "trained here (centralised reference)"
    marginal, conditional = reference_priors(cfg, grid, data.spec, data.num_classes)
    refs = train_references(cfg, references)
    weight_success: dict[float, float] = {}
    if weight is None:
        if references == 1:
            raise ValueError("references=1: choosing the weight needs >= 2 references (or give a weight)")
        if refs:
            key = (load_config({"data-seed": 0, "seed": 0, "out-dir": ""}, base=cfg), references)
            if key not in _WEIGHTS:  # the references are shared by such runs, and so is λ
                _WEIGHTS[key] = choose_weight(refs, data.spec.private_index, grid, conditional)
            weight, weight_success = _WEIGHTS[key]
        else:
            weight = 0.0
    x = np.concatenate([d.x for d in data.devices])
    y = np.concatenate([d.y for d in data.devices])
    pi = list(data.spec.private_index)
    ref_models = [r.model for r in refs]
    train = attribute_attack(model, x, y, pi, grid, marginal, conditional, ref_models, weight)
    held = attribute_attack(
        model, data.test_x, data.test_y, pi, grid, marginal, conditional, ref_models, weight
    )
    acc = run_accountant(run_dir, cfg, private_rounds)
    if cfg.privacy.mode == "nonprivate":
        bound, epsilon = 1.0, math.inf
    elif acc is None:
        bound, epsilon = train.ball, 0.0
    else:
        from fedfdp.budget import plan_privacy

        bound = attribute_inference_bound(acc, train.ball)
        epsilon = acc.epsilon(plan_privacy(cfg, data.num_records).delta)
    accuracy, _ = evaluate(model, data.test_x, data.test_y)
    train_acc, _ = evaluate(model, x, y)
    out: dict[str, Any] = {
        "run": str(run_dir),
        "mode": cfg.privacy.mode,
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
