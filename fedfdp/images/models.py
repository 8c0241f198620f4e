"""A small CNN classifier for digit images (28×28 MNIST, 8×8 scikit-learn digits).

Built only from layers the ghost clipping engine handles exactly
(:func:`fedfdp.clipping.supported_layers`: ``Conv2d``, ``GroupNorm``,
``Linear``) plus parameter-free modules, so ``clipped_grad_sum(...,
method="auto")`` runs ghost clipping on it. No BatchNorm: it mixes the records
of a batch, so one record's gradient would depend on the others and the
per-record sensitivity ``C`` of Algorithm 1 would not hold. GroupNorm
normalises within one record.

Initialisation draws from an explicit ``torch.Generator`` (PyTorch's default
scheme: weights and biases uniform in ``±1/√fan_in``); no global RNG.
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch
from torch import nn

from fedfdp.images.data import ImageShape

M = TypeVar("M", bound=nn.Module)

__all__ = ["DigitCNN", "build_classifier", "init_parameters"]


def init_parameters(model: M, generator: torch.Generator) -> M:
    """Re-initialise ``model`` from ``generator`` (in place; returns it).

    ``Linear``/``Conv2d``: weight and bias uniform in ``±1/√fan_in`` (PyTorch's
    default bounds); ``Embedding``: ``N(0, 1)``; ``GroupNorm``/``LayerNorm``:
    weight 1, bias 0. Other parameters are left as they are.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d):
                bound = 1.0 / math.sqrt(module.weight[0].numel())
                module.weight.uniform_(-bound, bound, generator=generator)
                if module.bias is not None:
                    module.bias.uniform_(-bound, bound, generator=generator)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0, generator=generator)
            elif isinstance(module, nn.GroupNorm | nn.LayerNorm) and module.weight is not None:
                module.weight.fill_(1.0)
                if module.bias is not None:
                    module.bias.zero_()
    return model


def group_count(channels: int, groups: int) -> int:
    """The largest divisor of ``channels`` that is ``<= groups``."""
    g = max(1, min(groups, channels))
    while channels % g:
        g -= 1
    return g


class DigitCNN(nn.Module):
    """Three 3×3 convolutions with GroupNorm and ReLU, pooled, then two Linear layers.

    ``(n, C, H, W)`` images in [0, 1] → ``(n, K)`` logits. Layout (width ``w``):
    ``conv(C→w) · conv(w→w, stride 2) · conv(w→2w, stride 2)``, each followed
    by ``GroupNorm`` and ReLU; adaptive average pooling to 2×2; ``Linear(8w →
    f)`` + ReLU (the penultimate *features*, used by :mod:`fedfdp.images.fid`);
    ``Linear(f → K)``. Inputs are centred (``x − 0.5``) inside the model.

    Parameters
    ----------
    shape : ImageShape
        Input image shape; any ``H, W >= 1``.
    num_classes : int
        ``K >= 2``.
    width : int
        ``w >= 1`` (default 32: 0.09 M parameters at 28×28 with ``features=128``).
    features : int
        Penultimate width ``f >= 1``.
    groups : int
        GroupNorm groups (reduced to a divisor of the channel count).
    """

    def __init__(
        self, shape: ImageShape, num_classes: int, width: int = 32, features: int = 128, groups: int = 8
    ) -> None:
        super().__init__()
        if num_classes < 2 or width < 1 or features < 1 or groups < 1:
            raise ValueError(
                f"DigitCNN(num_classes={num_classes}, width={width}, features={features}, "
                f"groups={groups}): need num_classes >= 2 and positive sizes"
            )
        self.shape = shape
        c, w = shape.channels, width
        self.body = nn.Sequential(
            nn.Conv2d(c, w, 3, padding=1),
            nn.GroupNorm(group_count(w, groups), w),
            nn.ReLU(),
            nn.Conv2d(w, w, 3, stride=2, padding=1),
            nn.GroupNorm(group_count(w, groups), w),
            nn.ReLU(),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1),
            nn.GroupNorm(group_count(2 * w, groups), 2 * w),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(8 * w, features),
            nn.ReLU(),
        )
        self.head = nn.Linear(features, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate activations ``(n, f)``."""
        return self.body(x - 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, K)``."""
        return self.head(self.features(x))


def build_classifier(
    shape: ImageShape,
    num_classes: int,
    *,
    width: int = 32,
    features: int = 128,
    groups: int = 8,
    generator: torch.Generator,
) -> DigitCNN:
    """A :class:`DigitCNN` initialised from ``generator`` (public randomness)."""
    return init_parameters(DigitCNN(shape, num_classes, width, features, groups), generator)
