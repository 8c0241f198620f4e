"""Empirical privacy: the statistics of a canary audit, and attribute inference.

Canary audit (lower bound on ε)
-------------------------------
A mechanism ``M`` is ``(ε, δ)``-FDP for a neighbouring relation when, for every
pair of neighbouring worlds ``W1, W2`` and every event ``E``,
``Pr[M(W1) ∈ E] ≤ e^ε Pr[M(W2) ∈ E] + δ`` and the same with the worlds
swapped. The worlds are

* **replacement** (Def. 5 of the FDP paper): two datasets that differ only in
  one record's private features (same ``Ψ``);
* **add/remove** (Def. 6): ``W1 = M(S ∪ {x})`` and ``W2 = sim(S, Ψ(x))``, the
  simulator of Algorithm 2 (appendix) — ``x``'s private contribution absent,
  its public features still in the public batch.

A distinguishing test that says "world 1" on ``E`` has false-positive rate
``FPR = Pr[M(W2) ∈ E]`` and false-negative rate ``FNR = 1 − Pr[M(W1) ∈ E]``,
so ``(ε, δ)``-FDP forces both

    ε ≥ log((1 − δ − FNR) / FPR)   and   ε ≥ log((1 − δ − FPR) / FNR).

From ``n`` independent trials in each world the audit replaces ``FPR`` and
``FNR`` by one-sided Clopper–Pearson **upper** bounds at level ``α/2`` each
(``α = 0.05``: a union bound makes both hold together with probability
``≥ 95%``). On that event the true rates are at most the bounds, the right-hand
sides only decrease, and so

    ε_lb = max(log((1 − δ − FNR_ub) / FPR_ub), log((1 − δ − FPR_ub) / FNR_ub), 0)

is a 95% lower bound on the ε of the implemented mechanism at ``δ``. If it
exceeds the ε the accountant claims (Theorem 5 for add/remove, Prop. 1 for
replacement), the implementation is not the accounted mechanism. The test's
statistic and threshold must not be fitted on the trials they are evaluated
on: :func:`choose_test` picks them on separate calibration trials.

Attribute inference (Theorem 4)
-------------------------------
For a training record the attacker knows ``Ψ(x)`` and the label and guesses
its private features from a finite candidate set by the model's loss
(:func:`loss_guesses`). Theorem 4 bounds the success probability of *any*
attacker by ``1 − f(Ball)``, where ``f`` is the mechanism's trade-off function
and ``Ball`` is the success probability of the best guess made without the
model (Def. 8; :func:`prior_guesses` estimates it from data the attacker may
use: public features and labels of other records, never the target's private
value).

Nothing here imports Flower: the harness that drives the client and strategy
lives in :mod:`simulations.audit`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
    "AuditResult",
    "EpsilonLowerBound",
    "Test",
    "attribute_attack",
    "candidate_losses",
    "cell_priors",
    "choose_test",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "evaluate_test",
]

#: Default total confidence level of the audit (split α/2 per error rate).
ALPHA = 0.05


# --------------------------------------------------------------------------------------
# Clopper–Pearson
# --------------------------------------------------------------------------------------


def _check_counts(k: int, n: int) -> tuple[int, int]:
    if isinstance(k, bool) or isinstance(n, bool):
        raise ValueError(f"k={k!r}, n={n!r}: counts must be integers")
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"k={k}, n={n}: need n >= 1 and 0 <= k <= n")
    return k, n


def _check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha={alpha!r}: must be in (0, 1)")
    return a


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper confidence bound on a binomial rate.

    With probability at least ``1 − alpha`` over ``k ~ Bin(n, p)``, ``p`` is at
    most the returned value: the ``1 − alpha`` quantile of ``Beta(k + 1, n − k)``
    (``1`` when ``k = n``; ``1 − alpha^(1/n)`` when ``k = 0``).
    """
    k, n = _check_counts(k, n)
    a = _check_alpha(alpha)
    if k == n:
        return 1.0
    if k == 0:
        return float(-math.expm1(math.log(a) / n))
    return float(stats.beta.ppf(1.0 - a, k + 1, n - k))


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower confidence bound on a binomial rate:
    the ``alpha`` quantile of ``Beta(k, n − k + 1)`` (``0`` when ``k = 0``,
    ``alpha^(1/n)`` when ``k = n``)."""
    k, n = _check_counts(k, n)
    a = _check_alpha(alpha)
    if k == 0:
        return 0.0
    if k == n:
        return float(math.exp(math.log(a) / n))
    return float(stats.beta.ppf(a, k, n - k + 1))


# --------------------------------------------------------------------------------------
# ε lower bound from a test's error counts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpsilonLowerBound:
    """A 95% (``1 − alpha``) lower bound on ε at ``delta`` from one test's errors.

    Attributes
    ----------
    epsilon : float
        ``max(log((1 − δ − FNR_ub)/FPR_ub), log((1 − δ − FPR_ub)/FNR_ub), 0)``.
    fpr, fnr : float
        Observed error rates (world 2 called world 1; world 1 called world 2).
    fpr_upper, fnr_upper : float
        One-sided Clopper–Pearson upper bounds, each at level ``alpha/2``.
    false_positives, negatives, false_negatives, positives : int
        The counts: trials in world 2 (negatives) and world 1 (positives).
    delta, alpha : float
    """

    epsilon: float
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float
    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    delta: float
    alpha: float


def _log_ratio(num: float, den: float) -> float:
    if num <= 0.0:
        return 0.0
    if den <= 0.0:
        return math.inf
    return math.log(num / den)


def epsilon_lower_bound(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    alpha: float = ALPHA,
) -> EpsilonLowerBound:
    """Lower confidence bound on ε from a distinguishing test's error counts.

    Parameters
    ----------
    false_positives, negatives : int
        World-2 trials the test called world 1, out of ``negatives``.
    false_negatives, positives : int
        World-1 trials the test called world 2, out of ``positives``.
    delta : float
        The δ of the ``(ε, δ)`` statement, in ``[0, 1)``.
    alpha : float
        Total error probability; ``alpha/2`` goes to each Clopper–Pearson
        bound, so both hold together with probability ``≥ 1 − alpha`` (union
        bound) and the returned ε is then below the mechanism's true ε.

    Returns
    -------
    EpsilonLowerBound
    """
    fp, nn_ = _check_counts(false_positives, negatives)
    fn, np_ = _check_counts(false_negatives, positives)
    d = float(delta)
    if not 0.0 <= d < 1.0:
        raise ValueError(f"delta={delta!r}: must be in [0, 1)")
    a = _check_alpha(alpha)
    fpr_ub = clopper_pearson_upper(fp, nn_, a / 2)
    fnr_ub = clopper_pearson_upper(fn, np_, a / 2)
    eps = max(_log_ratio(1.0 - d - fnr_ub, fpr_ub), _log_ratio(1.0 - d - fpr_ub, fnr_ub), 0.0)
    return EpsilonLowerBound(
        epsilon=eps,
        fpr=fp / nn_,
        fnr=fn / np_,
        fpr_upper=fpr_ub,
        fnr_upper=fnr_ub,
        false_positives=fp,
        negatives=nn_,
        false_negatives=fn,
        positives=np_,
        delta=d,
        alpha=a,
    )


# --------------------------------------------------------------------------------------
# choosing the test on calibration trials
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Test:
    """A threshold test on one of several candidate statistics.

    Says "world 1" when ``sign · score[statistic] > threshold``.
    """

    statistic: str
    sign: float
    threshold: float

    def decide(self, scores: np.ndarray) -> np.ndarray:
        """Boolean "world 1" decisions for an array of that statistic's scores."""
        return self.sign * np.asarray(scores, dtype=float) > self.threshold


def choose_test(
    positives: dict[str, np.ndarray],
    negatives: dict[str, np.ndarray],
    delta: float,
    alpha: float = ALPHA,
    max_candidates: int = 2000,
    sizes: tuple[int, int] | None = None,
) -> tuple[Test, float]:
    """Pick the statistic, direction and threshold on calibration trials.

    For every statistic (a name mapping to per-trial scores in world 1,
    ``positives``, and world 2, ``negatives``) and both directions, the
    threshold that maximises :func:`epsilon_lower_bound` on these calibration
    trials is found; the best of all is returned with its calibration ε. Only
    the chosen test is then evaluated on separate trials
    (:func:`evaluate_test`), so the final bound pays for no search.

    Scores may be infinite: ``-inf`` always says "world 2" and ``+inf`` always
    "world 1" (with ``sign = -1`` the roles swap, which gives the complementary
    test: a statistic ``T if E else -inf`` yields both "E and T > t" and
    "not (E and T < t)").

    ``sizes = (positives, negatives)`` of the trials the test will be
    evaluated on: the bound is then projected to that many trials, with error
    rates estimated as ``(k + 1/2)/(n + 1)`` (so a threshold no calibration
    trial crossed is not taken for a perfect one). Without it the bound is
    computed on the calibration counts themselves.
    """
    if set(positives) != set(negatives) or not positives:
        raise ValueError("positives and negatives must name the same, non-empty set of statistics")
    best: tuple[Test, float] | None = None
    for name in positives:
        pos = np.asarray(positives[name], dtype=float)
        neg = np.asarray(negatives[name], dtype=float)
        if len(pos) == 0 or len(neg) == 0:
            raise ValueError(f"statistic {name!r}: no calibration trials")
        for sign in (1.0, -1.0):
            t, e = _search(sign * pos, sign * neg, delta, alpha, max_candidates, sizes)
            if best is None or e > best[1]:
                best = (Test(name, sign, t), e)
    assert best is not None
    return best


def _search(
    pos: np.ndarray,
    neg: np.ndarray,
    delta: float,
    alpha: float,
    max_candidates: int,
    sizes: tuple[int, int] | None = None,
) -> tuple[float, float]:
    """Best threshold over (at most ``max_candidates``) quantiles of the pooled scores."""
    n_pos, n_neg = len(pos), len(neg)
    pooled = np.concatenate([pos, neg])
    pooled = np.unique(pooled[np.isfinite(pooled)])
    if len(pooled) == 0:
        return math.inf, 0.0
    if len(pooled) > max_candidates:
        pooled = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, max_candidates)))
    ps, ns = np.sort(pos), np.sort(neg)
    tp = n_pos - np.searchsorted(ps, pooled, side="right")
    fp = n_neg - np.searchsorted(ns, pooled, side="right")
    best_t, best_e = math.inf, 0.0
    for t, a, b in zip(pooled, tp, fp, strict=True):
        fn = n_pos - int(a)
        if sizes is None:
            e = epsilon_lower_bound(int(b), n_neg, fn, n_pos, delta, alpha).epsilon
        else:
            tp_n, tn_n = sizes
            fp_p = min(tn_n, round((int(b) + 0.5) / (n_neg + 1) * tn_n))
            fn_p = min(tp_n, round((fn + 0.5) / (n_pos + 1) * tp_n))
            e = epsilon_lower_bound(fp_p, tn_n, fn_p, tp_n, delta, alpha).epsilon
        if e > best_e:
            best_t, best_e = float(t), e
    return best_t, best_e


def evaluate_test(
    test: Test,
    positives: np.ndarray,
    negatives: np.ndarray,
    delta: float,
    alpha: float = ALPHA,
) -> EpsilonLowerBound:
    """Apply a fixed test to fresh trials and bound ε (:func:`epsilon_lower_bound`)."""
    pos = test.decide(positives)
    neg = test.decide(negatives)
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("evaluate_test: need trials in both worlds")
    return epsilon_lower_bound(int(neg.sum()), len(neg), int((~pos).sum()), len(pos), delta, alpha)


@dataclass(frozen=True)
class AuditResult:
    """Outcome of one audit: the bound, the claim and how they compare."""

    epsilon_lower: float
    epsilon_claimed: float
    relation: str
    delta: float
    trials: int
    test: Test
    bound: EpsilonLowerBound
    calibration_epsilon: float

    @property
    def violated(self) -> bool:
        """Whether the lower bound exceeds the claimed ε (the implementation is
        not the accounted mechanism, with 95% confidence)."""
        return self.epsilon_lower > self.epsilon_claimed


# --------------------------------------------------------------------------------------
# attribute inference (Theorem 4)
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


@torch.no_grad()
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
            loss = torch.nn.functional.cross_entropy(
                model(rows), yb.repeat_interleave(k), reduction="none"
            )
            out[s : s + step] = loss.view(len(xb), k).double().numpy()
    finally:
        model.train(was_training)
    return out


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
    prior_marginal : float
        Success of always guessing the marginal mode (no model, no label).
    prior_label : float
        Success of guessing the mode of ``P(cell | y)`` (no model).
    ball : float
        ``Ball`` of Def. 8 at radius 0, averaged over the targets:
        ``mean_i max_c P(c | y_i)`` (Theorem 4's prior; ``Ψ`` tells nothing
        more about the private features than the label under the fleet's
        generative model).
    targets : int
    """

    loss_attack: float
    bayes_attack: float
    prior_marginal: float
    prior_label: float
    ball: float
    targets: int


def attribute_attack(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    private_index: Sequence[int],
    grid: AttributeGrid,
    marginal: np.ndarray,
    conditional: np.ndarray,
) -> AttackOutcome:
    """Attribute inference on target records ``(x, y)`` (Theorem 4's setting).

    For each target the attacker knows ``Ψ(x)`` (the public columns) and the
    label and guesses the cell of its private features among
    ``grid.candidates()`` by the model's loss (:func:`candidate_losses`).
    ``marginal`` and ``conditional`` (:func:`cell_priors`, from a reference
    population, never from the targets) give the model-free baselines and
    ``Ball``. Success means the guessed cell is the target's true cell.
    """
    x = np.asarray(x)
    y = np.asarray(y, dtype=np.int64)
    if len(y) == 0:
        raise ValueError("attribute_attack: no target records")
    truth = grid.cell(x[:, list(private_index)])
    losses = candidate_losses(model, x, y, private_index, grid.candidates())
    with np.errstate(divide="ignore"):
        log_marginal = np.log(np.asarray(marginal, dtype=float))
    loss_guess = losses.argmin(1)
    bayes_guess = (log_marginal[None, :] - losses).argmax(1)
    label_mode = np.asarray(conditional).argmax(1)
    return AttackOutcome(
        loss_attack=float(np.mean(loss_guess == truth)),
        bayes_attack=float(np.mean(bayes_guess == truth)),
        prior_marginal=float(np.mean(truth == int(np.argmax(marginal)))),
        prior_label=float(np.mean(label_mode[y] == truth)),
        ball=float(np.mean(np.asarray(conditional).max(1)[y])),
        targets=len(y),
    )


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


def reference_priors(cfg: Config, grid: AttributeGrid, spec: FeatureSpec, num_classes: int):
    """``P(cell)`` and ``P(cell | y)`` from records the attacker may know
    without the model: for the fleet, a fresh draw of the same generative
    model (another data seed, 40,000 records), never the training records."""
    from fedfdp.data import make_fleet

    if cfg.data.dataset != "fleet":
        raise ValueError(f"dataset={cfg.data.dataset!r}: the attribute attack supports the fleet only")
    ref = make_fleet(200, 250, seed=cfg.data.data_seed + 1_000_003, test_fraction=0.2)
    x = np.concatenate([d.x for d in ref.devices])
    y = np.concatenate([d.y for d in ref.devices])
    return cell_priors(grid, x[:, spec.private_index], y, num_classes)


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
        assert plan.noise_multiplier is not None
        acc.compose(plan.noise_multiplier, plan.sampling_rate, rounds)
    return acc


def attribute_attack_run(run_dir: str | Path) -> dict[str, Any]:
    """Attribute inference on the training records of a ``fedfdp run`` directory.

    Loads ``DIR/config.toml`` and the final model ``DIR/model.pt`` (a
    state_dict); without ``model.pt`` the model is trained here with the
    centralised reference (:func:`fedfdp.algorithm.run_centralised`, same
    configuration and seed). Theorem 4's bound ``1 − f(Ball)`` comes from the
    run's ledger (``ledger.json``) or, without one, from the ledger the
    configuration implies: ``1`` for ``nonprivate`` (no guarantee) and
    ``Ball`` itself for ``public`` (ε = 0).
    """
    from fedfdp.accounting import attribute_inference_bound
    from fedfdp.algorithm import build_model_for, evaluate, run_centralised
    from fedfdp.data import load_dataset

    run_dir = Path(run_dir)
    cfg = read_run(run_dir)
    data = load_dataset(cfg.data)
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
    grid = fleet_grid() if cfg.data.dataset == "fleet" else None
    if grid is None or tuple(data.spec.private) != grid.columns:
        raise ValueError(
            "the attribute attack needs the fleet's private columns (heart_rate, latitude, longitude)"
        )
    marginal, conditional = reference_priors(cfg, grid, data.spec, data.num_classes)
    x = np.concatenate([d.x for d in data.devices])
    y = np.concatenate([d.y for d in data.devices])
    pi = list(data.spec.private_index)
    train = attribute_attack(model, x, y, pi, grid, marginal, conditional)
    held = attribute_attack(model, data.test_x, data.test_y, pi, grid, marginal, conditional)
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
    best = max(train.loss_attack, train.bayes_attack)
    return {
        "run": str(run_dir),
        "mode": cfg.privacy.mode,
        "model_source": source,
        "epsilon": epsilon,
        "accuracy": accuracy,
        "targets": train.targets,
        "cells": grid.size,
        "success_loss": train.loss_attack,
        "success_bayes": train.bayes_attack,
        "success": best,
        "heldout_success_bayes": held.bayes_attack,
        "prior_marginal": train.prior_marginal,
        "prior_label": train.prior_label,
        "ball": train.ball,
        "bound": bound,
        "within_bound": best <= bound,
        # (success − marginal prior) in standard errors of the prior's rate over the targets
        "advantage_z": (best - train.prior_marginal)
        / math.sqrt(max(train.prior_marginal * (1 - train.prior_marginal), 1e-12) / train.targets),
    }
