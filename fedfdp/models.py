"""Small models for tabular sensor records (image models: :mod:`fedfdp.images.models`).

All are built from standard layers supported by the fast clipping engine
(Linear, Conv1d, activations; no BatchNorm, which mixes records and breaks the
per-record sensitivity). Initialisation draws from an explicit generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedfdp.config import ConfigError

if TYPE_CHECKING:
    from fedfdp.config import TrainingConfig
    from fedfdp.data import FederatedData


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


def mlp(in_features: int, hidden: Sequence[int], num_classes: int) -> nn.Sequential:
    """``Linear → ReLU`` per hidden width, then a Linear output layer.

    ``mlp(600, [300], 100)`` is the paper's 600-300-100 Purchase100 network.
    """
    if not hidden or any(h < 1 for h in hidden):
        raise ValueError(f"hidden-sizes={list(hidden)}: need at least one positive width")
    layers: list[nn.Module] = []
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def build_model(
    name: str,
    in_features: int,
    num_classes: int,
    *,
    hidden_size: int = 64,
    seed: int = 0,
    hidden_sizes: Sequence[int] = (),
) -> nn.Module:
    """Build a classifier that maps ``(n, in_features)`` to ``(n, num_classes)`` logits.

    Parameters
    ----------
    name : str
        ``logistic`` (softmax regression), ``mlp`` (hidden ReLU layers), or an
        import path ``"package.module:build"`` to your own
        ``build(in_features, num_classes) -> nn.Module`` (initialised by you;
        the clipping engine covers Linear, Conv, Embedding and norm layers and
        falls back to exact per-record gradients for the others).
    in_features, num_classes, hidden_size : int
        ``hidden_size``: width of the two hidden layers when ``hidden_sizes`` is empty.
    seed : int
        Initialisation seed (explicit generator; global RNG untouched).
    hidden_sizes : sequence of int
        Widths of the MLP's hidden layers, input side first (e.g. ``(300,)``).
    """
    if in_features < 1 or num_classes < 2:
        raise ValueError(f"in_features={in_features}, num_classes={num_classes}: need >= 1 and >= 2")
    if name in ("cnn", "ddpm"):
        raise ConfigError(f"model={name!r}: an image model, built by build_model_for on an image dataset")
    if name == "logistic":
        model: nn.Module = nn.Sequential(nn.Linear(in_features, num_classes))
    elif name == "mlp":
        model = mlp(in_features, tuple(hidden_sizes) or (hidden_size, hidden_size), num_classes)
    else:
        from fedfdp.user_code import call

        built = call("model", name, in_features, num_classes)
        if not isinstance(built, nn.Module):
            raise ConfigError(f"model={name!r}: returned {type(built).__name__}, not a torch.nn.Module")
        return built
    gen = torch.Generator().manual_seed(seed)
    return _init_(model, gen)


def build_model_for(training: TrainingConfig, data: FederatedData) -> nn.Module:
    """The model ``training`` names for ``data``'s input width and classes (initialised
    from the public run ``seed``).

    Image datasets: ``cnn`` is :class:`fedfdp.images.DigitCNN` (Conv2d + GroupNorm,
    ``cnn-width`` channels, a ``hidden-size`` penultimate layer); ``logistic`` and
    ``mlp`` read the flattened image (``nn.Flatten`` first); a builder of your own
    receives ``C·H·W`` as ``in_features`` and ``(n, C, H, W)`` batches. ``ddpm`` is the
    class-conditional :class:`fedfdp.images.UNet` noise predictor (base width
    ``unet-width``) on packed ``[x_t, t, y]`` inputs (its loss:
    :class:`fedfdp.images.DiffusionFeatureMap`). ``cnn`` and ``ddpm`` on a table are
    refused.
    """
    t = training
    if t.model == "ddpm":
        if data.image_shape is None:
            raise ConfigError(
                f"model='ddpm': needs an image dataset (mnist5k, digits, images); dataset {data.name!r} "
                "is a table"
            )
        from fedfdp.images.data import ImageShape
        from fedfdp.images.unet import build_unet

        return build_unet(ImageShape(*data.image_shape), data.num_classes, base=t.unet_width,
                          generator=torch.Generator().manual_seed(t.seed))
    if t.model == "cnn":
        if data.image_shape is None:
            raise ConfigError(
                f"model='cnn': needs an image dataset (mnist5k, digits, images); dataset {data.name!r} "
                "is a table (use logistic or mlp)"
            )
        from fedfdp.images.data import ImageShape
        from fedfdp.images.models import build_classifier

        return build_classifier(
            ImageShape(*data.image_shape),
            data.num_classes,
            width=t.cnn_width,
            features=t.hidden_size,
            generator=torch.Generator().manual_seed(t.seed),
        )
    model = build_model(
        t.model,
        data.num_features,
        data.num_classes,
        hidden_size=t.hidden_size,
        seed=t.seed,
        hidden_sizes=t.hidden_sizes,
    )
    if data.is_image and t.model in ("logistic", "mlp"):
        return nn.Sequential(nn.Flatten(), model)
    return model
