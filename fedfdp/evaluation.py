"""Server-side evaluation on held-out records (never on private training data:
metrics computed on training records are outside the guarantee)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on held-out records."""
    if len(y) == 0:
        return float("nan"), float("nan")
    logits = model(torch.as_tensor(x))
    target = torch.as_tensor(y, dtype=torch.long)
    loss = F.cross_entropy(logits, target).item()
    acc = (logits.argmax(1) == target).float().mean().item()
    return acc, loss
