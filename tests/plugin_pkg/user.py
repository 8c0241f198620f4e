"""A user's own model and data, named by import path in a configuration."""

import numpy as np
import torch
from torch import nn

from fedfdp import DeviceData, FederatedData
from fedfdp.features import FeatureSpec


class TwoLayer(nn.Module):
    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(d, 8), nn.Tanh(), nn.Linear(8, k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build(in_features: int, num_classes: int) -> nn.Module:
    return TwoLayer(in_features, num_classes)


def not_a_model(in_features: int, num_classes: int) -> str:
    return "nope"


def load(cfg) -> FederatedData:
    rng = np.random.default_rng(cfg.data_seed)
    spec = FeatureSpec(("speed", "heading", "lat"), ("speed", "heading"), ("lat",))
    devices = []
    for _ in range(cfg.num_devices):
        x = rng.normal(size=(30, 3)).astype(np.float32)
        devices.append(DeviceData(x, (x[:, 0] + x[:, 2] > 0).astype(np.int64)))
    tx = rng.normal(size=(40, 3)).astype(np.float32)
    return FederatedData("mine", spec, tuple(devices), tx, (tx[:, 0] + tx[:, 2] > 0).astype(np.int64),
                         class_names=("no", "yes"), public_loss="zero")
