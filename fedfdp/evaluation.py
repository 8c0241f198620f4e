"""Server-side evaluation on held-out records (never on private training data:
metrics computed on training records are outside the guarantee).

:func:`held_out_metrics` reports the four numbers every run records:

``accuracy``
    share of correct predictions;
``balanced_accuracy``
    mean over the classes present of each class's recall (a majority-class
    predictor scores ``1/K``, whatever the class balance);
``auc``
    area under the ROC curve of the positive class (binary tasks only, NaN
    otherwise), from the ranks of the predicted probabilities (Mann–Whitney,
    ties counted one half);
``loss``
    log loss: the mean cross-entropy of the predicted probabilities.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: The metrics of :func:`held_out_metrics`, in column order.
METRICS = ("accuracy", "balanced_accuracy", "auc", "loss")


def binary_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of ``scores`` for ``labels ∈ {0, 1}`` (NaN without both classes)."""
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = np.asarray(scores)[order]
    # average ranks over ties
    _, start, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = start + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@torch.no_grad()
def held_out_metrics(model: nn.Module, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy, balanced accuracy, AUC (binary) and log loss on held-out records."""
    if len(y) == 0:
        return dict.fromkeys(METRICS, float("nan"))
    logits = model(torch.as_tensor(x))
    target = torch.as_tensor(y, dtype=torch.long)
    loss = F.cross_entropy(logits, target).item()
    pred = logits.argmax(1).numpy()
    truth = np.asarray(y)
    recalls = [float(np.mean(pred[truth == c] == c)) for c in np.unique(truth)]
    auc = float("nan")
    if logits.shape[1] == 2:
        auc = binary_auc(torch.softmax(logits.double(), 1)[:, 1].numpy(), truth == 1)
    return {
        "accuracy": float(np.mean(pred == truth)),
        "balanced_accuracy": float(np.mean(recalls)),
        "auc": auc,
        "loss": loss if math.isfinite(loss) else float("inf"),
    }


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on held-out records."""
    m = held_out_metrics(model, x, y)
    return m["accuracy"], m["loss"]
