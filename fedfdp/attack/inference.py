"""The attack's mechanics: candidate cells, priors and ``Ball``, the model's view of
each candidate, the loss / prior / calibrated guesses and their statistics
against ``Ball`` (see :mod:`fedfdp.attack` for the threat model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import nn

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
    ``P(cell)`` ``(K,)`` and the label-conditional ``P(cell | y)`` ``(C, K)``.
    """
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
    candidate written into its private columns: ``(n, K)``.
    """
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
    label are the record's own: what the attacker of Theorem 4 knows.
    """
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
    stays visible.
    """
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
