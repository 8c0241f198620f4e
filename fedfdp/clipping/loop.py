"""The plain (unclipped) sum and the per-record loop engine, the reference for tests.

Mechanism
---------
``loop_clipped_sum``: one backward per record, ``g_i`` over all trainable parameters jointly,
scaled by ``min(1, C/||g_i||)`` and summed: the clipped sum of Algorithm 1 (Remark 1),
L2 sensitivity ``C`` under add/remove (Definition 6).  ``plain_sum``: ``sum_i g_i`` from
one ordinary backward, for the non-private and public parts (no clipping, no
sensitivity bound; norms are NaN).
"""

from __future__ import annotations

import math

import torch

from fedfdp.clipping.common import (
    Batch,
    ClipMethod,
    ClippedSum,
    checked_losses,
    clip_coefficients,
    grad_or_zeros,
    stacked_forward,
    tensor_sum,
)


def plain_sum(batch: Batch) -> ClippedSum:
    model, xs, targets, loss_fn, params = batch
    n = batch.n
    total = checked_losses(loss_fn, stacked_forward(model, xs), targets, n).sum()
    grads = torch.autograd.grad(total, params, allow_unused=True)
    norms = torch.full((n,), math.nan, dtype=params[0].dtype, device=params[0].device)
    return ClippedSum(grad_or_zeros(grads, params), norms, ClipMethod.PLAIN)


def loop_clipped_sum(batch: Batch, clip: float) -> ClippedSum:
    model, xs, targets, loss_fn, params = batch
    sums, norms = batch.accumulators()
    for i in range(batch.n):
        outs = [model(x[i : i + 1]) for x in xs]
        loss = checked_losses(loss_fn, outs, targets[i : i + 1], 1).sum()
        grads = grad_or_zeros(torch.autograd.grad(loss, params, allow_unused=True), params)
        norm = torch.sqrt(tensor_sum(g.detach().square().sum() for g in grads))
        norms[i] = norm
        if torch.isfinite(norm):
            coef = clip_coefficients(norm, clip)
            for s, g in zip(sums, grads, strict=True):
                s.add_(g * coef)
    return ClippedSum(sums, norms, ClipMethod.LOOP)
