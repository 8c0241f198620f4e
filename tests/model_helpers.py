"""Typed access to the layers of the small sequential models the tests build."""

from __future__ import annotations

from torch import nn


def linear_layer(model: nn.Module, index: int = 0) -> nn.Linear:
    """Layer ``index`` of the sequential ``model``; fails the test if it is not a Linear."""
    assert isinstance(model, nn.Sequential), type(model)
    layer = model[index]
    assert isinstance(layer, nn.Linear), layer
    return layer
