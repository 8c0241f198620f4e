"""Small models for tabular sensor records.

All are built from standard layers supported by the fast clipping engine
(Linear, Conv1d, activations; no BatchNorm, which mixes records and breaks the
per-record sensitivity). Initialisation draws from an explicit generator.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _init_(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """PyTorch's default Linear/Conv init (uniform ±1/√fan_in), from ``generator``."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv1d):
                fan_in = module.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in)
                module.weight.uniform_(-bound, bound, generator=generator)
                if module.bias is not None:
                    module.bias.uniform_(-bound, bound, generator=generator)
    return model


def build_model(
    name: str, in_features: int, num_classes: int, *, hidden_size: int = 64, seed: int = 0
) -> nn.Module:
    """Build a classifier that maps ``(n, in_features)`` to ``(n, num_classes)`` logits.

    Parameters
    ----------
    name : str
        ``logistic`` (softmax regression) or ``mlp`` (two hidden ReLU layers).
    in_features, num_classes, hidden_size : int
    seed : int
        Initialisation seed (explicit generator; global RNG untouched).
    """
    if in_features < 1 or num_classes < 2:
        raise ValueError(f"in_features={in_features}, num_classes={num_classes}: need >= 1 and >= 2")
    if name == "logistic":
        model: nn.Module = nn.Sequential(nn.Linear(in_features, num_classes))
    elif name == "mlp":
        model = nn.Sequential(
            nn.Linear(in_features, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, num_classes),
        )
    else:
        raise ValueError(f"model={name!r}: must be logistic or mlp")
    gen = torch.Generator().manual_seed(seed)
    return _init_(model, gen)
