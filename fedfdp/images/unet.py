"""A small class-conditional U-Net for denoising diffusion (noise prediction).

The network takes **one packed tensor per record** so that it fits the
per-record clipping API (``outputs[k] = model(inputs[k])``,
:func:`fedfdp.clipping.clipped_grad_sum`): row ``i`` is
``[x_t (C·H·W values), t, y]`` (:func:`fedfdp.images.diffusion.pack`), and the
output is the predicted noise ``(n, C, H, W)``. Class ``y = K`` means "no
class" (an unconditional pass).

Layers: ``Conv2d``, ``GroupNorm``, ``Linear``, ``Embedding`` and
parameter-free modules only, each parameter used inside its own module's
``forward``; so the ghost engine clips it exactly (``method="auto"`` runs ghost
clipping). No BatchNorm (it mixes records), no attention (its fused
``MultiheadAttention`` parameters are not ghost-supported and 7×7 digits do
not need it).

Architecture (base width ``b``, multipliers ``m``): a sinusoidal embedding of
``t`` through ``Linear → SiLU → Linear`` plus a class embedding gives the
conditioning vector; ``conv_in``; per resolution one residual block (GroupNorm,
SiLU, 3×3 conv, conditioning added per channel, GroupNorm, SiLU, 3×3 conv; a
1×1 conv on the skip when widths differ), then a stride-2 conv; two blocks in
the middle; on the way up, per resolution, nearest upsampling + 3×3 conv,
concatenation with the skip, one residual block; GroupNorm, SiLU and a
zero-initialised 3×3 conv out. With ``b = 48``, ``m = (1, 2, 2)`` the model has
about 1.5 M parameters at 28×28 on one channel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedfdp.images.data import ImageShape
from fedfdp.images.models import group_count, init_parameters

__all__ = ["UNet", "build_unet", "timestep_embedding"]


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal embedding ``[cos(t·f_k), sin(t·f_k)]``, ``f_k = max_period^(−k/(dim/2))``."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=t.dtype, device=t.device) / half)
    args = t[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class _ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, c_emb: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(group_count(c_in, groups), c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.emb = nn.Linear(c_emb, c_out)
        self.norm2 = nn.GroupNorm(group_count(c_out, groups), c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(emb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class UNet(nn.Module):
    """Class-conditional noise predictor on packed inputs (module docstring).

    Parameters
    ----------
    shape : ImageShape
        Image shape ``(C, H, W)``.
    num_classes : int
        ``K >= 1``; the embedding has ``K + 1`` rows (the last: no class).
    base : int
        Base width ``b``.
    mults : sequence of int
        Width multiplier per resolution; ``len(mults) − 1`` downsamplings.
    groups : int
        GroupNorm groups (reduced to a divisor of each width).
    """

    def __init__(
        self,
        shape: ImageShape,
        num_classes: int,
        base: int = 48,
        mults: Sequence[int] = (1, 2, 2),
        groups: int = 8,
    ) -> None:
        super().__init__()
        mults = tuple(int(m) for m in mults)
        if num_classes < 1 or base < 1 or not mults or min(mults) < 1:
            raise ValueError(
                f"UNet(num_classes={num_classes}, base={base}, mults={mults}): need positive sizes"
            )
        self.shape = shape
        self.num_classes = num_classes
        self.base = base
        c_emb = 4 * base
        self.time1 = nn.Linear(base, c_emb)
        self.time2 = nn.Linear(c_emb, c_emb)
        self.label = nn.Embedding(num_classes + 1, c_emb)
        self.conv_in = nn.Conv2d(shape.channels, base, 3, padding=1)
        widths = [base * m for m in mults]
        self.down = nn.ModuleList()
        self.downsample = nn.ModuleList()
        c = base
        for i, w in enumerate(widths):
            self.down.append(_ResBlock(c, w, c_emb, groups))
            c = w
            if i < len(widths) - 1:
                self.downsample.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
        self.mid1 = _ResBlock(c, c, c_emb, groups)
        self.mid2 = _ResBlock(c, c, c_emb, groups)
        self.up = nn.ModuleList()
        self.upsample = nn.ModuleList()
        for i in reversed(range(len(widths))):
            if i < len(widths) - 1:
                self.upsample.append(nn.Conv2d(c, c, 3, padding=1))
            self.up.append(_ResBlock(c + widths[i], widths[i], c_emb, groups))
            c = widths[i]
        self.norm_out = nn.GroupNorm(group_count(c, groups), c)
        self.conv_out = nn.Conv2d(c, shape.channels, 3, padding=1)

    def unpack(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_t (n, C, H, W), t (n,) float, y (n,) long)`` from ``(n, C·H·W + 2)``."""
        size = self.shape.size
        if packed.dim() != 2 or packed.shape[1] != size + 2:
            raise ValueError(f"UNet input {tuple(packed.shape)}: need (n, {size + 2}) packed [x_t, t, y]")
        x = packed[:, :size].reshape(-1, *self.shape.as_tuple())
        t = packed[:, size]
        y = packed[:, size + 1].round().long().clamp(0, self.num_classes)
        return x, t, y

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        """Predicted noise ``(n, C, H, W)``."""
        x, t, y = self.unpack(packed)
        emb = self.time2(F.silu(self.time1(timestep_embedding(t, self.base))))
        emb = F.silu(emb + self.label(y))
        h = self.conv_in(x)
        skips = []
        for i, block in enumerate(self.down):
            h = block(h, emb)
            skips.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
        h = self.mid2(self.mid1(h, emb), emb)
        for j, block in enumerate(self.up):
            skip = skips.pop()
            if j > 0:
                h = self.upsample[j - 1](F.interpolate(h, size=skip.shape[-2:], mode="nearest"))
            h = block(torch.cat([h, skip], dim=1), emb)
        return self.conv_out(F.silu(self.norm_out(h)))


def build_unet(
    shape: ImageShape,
    num_classes: int,
    *,
    base: int = 48,
    mults: Sequence[int] = (1, 2, 2),
    groups: int = 8,
    generator: torch.Generator,
) -> UNet:
    """A :class:`UNet` initialised from ``generator``; the output conv starts at zero."""
    model = init_parameters(UNet(shape, num_classes, base, mults, groups), generator)
    with torch.no_grad():
        model.conv_out.weight.zero_()
        if model.conv_out.bias is not None:
            model.conv_out.bias.zero_()
    return model
