"""The vmap engine: per-record gradients by ``torch.func.vmap(grad(...))``, in chunks.

Mechanism
---------
Record ``i``'s gradient ``g_i`` (all trainable parameters jointly) is instantiated
for a chunk of records, scaled by ``min(1, C/||g_i||)`` and summed: the clipped sum
of Algorithm 1 (Remark 1), L2 sensitivity ``C`` under add/remove (Definition 6).
Any model of standard torch operations that is separable per record works;
``VmapUnsupportedError`` lets ``method="auto"`` fall back to the loop.
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

from fedfdp.clipping.common import (
    CHUNK_ELEMENTS,
    Batch,
    ClipMethod,
    ClippedSum,
    VmapUnsupportedError,
    checked_losses,
    clip_coefficients,
)


def vmap_clipped_sum(batch: Batch, clip: float) -> ClippedSum:
    model, xs, targets, loss_fn, params = batch
    n = batch.n
    trainable_ids = {id(p) for p in params}
    named = [(name, p) for name, p in model.named_parameters() if id(p) in trainable_ids]
    names = [name for name, _ in named]
    frozen = {
        name: p.detach()
        for name, p in model.named_parameters(remove_duplicate=False)
        if id(p) not in trainable_ids
    }
    buffers = {name: b for name, b in model.named_buffers(remove_duplicate=False)}

    def record_loss(
        weights: dict[str, torch.Tensor], xs_i: tuple[torch.Tensor, ...], y_i: torch.Tensor
    ) -> torch.Tensor:
        # functional_call ties shared parameters (tie_weights=True).
        outs = [functional_call(model, (weights, frozen, buffers), (x.unsqueeze(0),)) for x in xs_i]
        return checked_losses(loss_fn, outs, y_i.unsqueeze(0), 1).sum()

    per_record = vmap(grad(record_loss), in_dims=(None, 0, 0), randomness="different")
    weights = {name: p.detach() for name, p in named}
    size = sum(p.numel() for p in params)
    chunk = max(1, min(n, CHUNK_ELEMENTS // max(size, 1)))
    sums, norms = batch.accumulators()
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        try:
            g = per_record(weights, tuple(x[start:stop] for x in xs), targets[start:stop])
        except (RuntimeError, NotImplementedError) as exc:
            # e.g. nn.GRU/LSTM: in-place updates of an unbatched initial state
            raise VmapUnsupportedError(str(exc).split("\n")[0]) from exc
        flat = [g[name].reshape(stop - start, -1) for name in names]
        norm = torch.sqrt(sum(f.square().sum(1) for f in flat))
        norms[start:stop] = norm
        coef = clip_coefficients(norm, clip)
        for s, f in zip(sums, flat, strict=True):
            s.view(-1).add_(coef @ f)
    return ClippedSum(sums, norms, ClipMethod.VMAP)
