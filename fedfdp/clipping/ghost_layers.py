"""Ghost norms and clipped-sum builders of the supported layers.

Mechanism
---------
For each module hooked by the ghost engine (:mod:`fedfdp.clipping.ghost`), from its
captured inputs ``a`` and output gradients ``g`` (all calls, all stacked record
copies): the per-record squared gradient norms of its parameters, and a builder of
their share of the clipped sum ``S = sum_i c_i g_i`` once the clip coefficients
``c_i = min(1, C/||g_i||)`` are known (Algorithm 1, Remark 1; L2 sensitivity ``C``
under add/remove, Definition 6).

Linear and convolution layers (``o = W a (+ b)`` per position and group) use Gram
matrices over the "copies x positions" axis (ghost norm) or instantiated
per-record gradients, whichever is cheaper; embeddings sum rows per record and
token; LayerNorm and GroupNorm build their small per-record gradients directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedfdp.clipping.common import CHUNK_ELEMENTS, KEEP_ELEMENTS, GhostUnsupportedError, tensor_sum


@dataclass
class Capture:
    """One call of a hooked module during the forward pass."""

    module: nn.Module
    x: torch.Tensor  # the module's input, detached
    edge: Any  # GradientEdge of the module's output
    copies: int  # record copies stacked along the rows (rows = copies · n)
    out_node: Any
    in_node: Any


@dataclass
class _LayerTerms:
    """Per-record squared norms of one module and its clipped-sum builder."""

    norm2: torch.Tensor  # (n,)
    build: Callable[[torch.Tensor], dict[int, torch.Tensor]] = field(repr=False)


def layer_terms(module: nn.Module, calls: list[tuple[Capture, torch.Tensor]], n: int) -> _LayerTerms:
    if isinstance(module, nn.Linear):
        blocks = []
        for cap, g in calls:
            a = cap.x
            if a.dim() < 2:
                raise GhostUnsupportedError("Linear called without a record axis")
            a = a.reshape(cap.copies, n, -1, 1, a.shape[-1])
            blocks.append((a, g.reshape(cap.copies, n, -1, 1, g.shape[-1])))
        return _matrix_terms(module, blocks, n, groups=1)
    if isinstance(module, nn.Conv1d | nn.Conv2d):
        groups = module.groups
        blocks = []
        for cap, g in calls:
            patches = _conv_patches(module, cap.x)  # (R, L, C_in·k)
            go = g.flatten(2)  # (R, C_out, L)
            if patches.shape[1] != go.shape[-1]:
                raise GhostUnsupportedError(f"{type(module).__name__}: unexpected output size")
            d_in, d_out = patches.shape[-1] // groups, go.shape[1] // groups
            a = patches.reshape(cap.copies, n, -1, groups, d_in)
            blocks.append((a, go.transpose(1, 2).reshape(cap.copies, n, -1, groups, d_out)))
        return _matrix_terms(module, blocks, n, groups=groups)
    if isinstance(module, nn.Embedding):
        return _embedding_terms(module, calls, n)
    if isinstance(module, nn.LayerNorm | nn.GroupNorm):
        return _norm_layer_terms(module, calls, n)
    raise GhostUnsupportedError(f"{type(module).__name__} is not supported")  # pragma: no cover


def _conv_patches(module: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """Input patches of a convolution, ``(R, L, C_in·prod(kernel))``.

    The last axis is ordered like ``weight[o].flatten()`` (channel-major).
    """
    nd = 1 if isinstance(module, nn.Conv1d) else 2
    if x.dim() != nd + 2:
        raise GhostUnsupportedError(f"{type(module).__name__} called on unbatched input")
    padding: Any = module.padding
    if module.padding_mode != "zeros":
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
        padding = (0,) * nd
    elif isinstance(padding, str):
        x = F.pad(x, module._reversed_padding_repeated_twice)
        padding = (0,) * nd
    if nd == 2:
        patches = F.unfold(
            x, module.kernel_size, dilation=module.dilation, padding=padding, stride=module.stride
        )
        return patches.transpose(1, 2)
    (kernel,), (dilation,), (stride,) = module.kernel_size, module.dilation, module.stride
    if padding[0]:
        x = F.pad(x, (padding[0], padding[0]))
    span = dilation * (kernel - 1) + 1
    windows = x.unfold(2, span, stride)[..., ::dilation]  # (R, C, L, k), a view
    return windows.permute(0, 2, 1, 3).reshape(x.shape[0], windows.shape[2], -1)


def _matrix_terms(
    module: nn.Linear | nn.Conv1d | nn.Conv2d,
    blocks: list[tuple[torch.Tensor, torch.Tensor]],
    n: int,
    groups: int,
) -> _LayerTerms:
    """Linear-type layer: output ``o = W a (+ b)`` per position and group.

    Each block is ``(a, g)`` with ``a: (copies, n, T, G, I)`` and
    ``g: (copies, n, T, G, O)`` (views of the captured tensors); the per-record
    weight gradient is ``Σ_{copies, T} g aᵀ`` per group.
    """
    weight: torch.Tensor = module.weight
    bias: torch.Tensor | None = module.bias
    a0, g0 = blocks[0]
    dtype = g0.dtype
    d_in, d_out = a0.shape[-1], g0.shape[-1]
    with_weight = weight.requires_grad
    with_bias = bias is not None and bias.requires_grad
    norm2, per_record, folded = _weight_norm2(blocks, n, groups, d_in, d_out, with_weight, with_bias)
    gb = None
    if with_bias and not folded:
        gb = tensor_sum(g.sum(dim=(0, 2)) for _, g in blocks).reshape(n, -1)  # (n, G·O)
        norm2 = norm2 + gb.square().sum(1)

    def build(coef: torch.Tensor) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        coef = coef.to(dtype)
        c = coef.view(1, n, 1, 1, 1)
        w: torch.Tensor | None = None
        b: torch.Tensor | None = None
        if with_weight and per_record is not None:
            w = coef @ per_record.reshape(n, -1)
        for a, g in blocks:
            if not with_weight or per_record is not None:
                break
            if with_bias or d_out <= d_in or groups != 1:
                gc = g * c
                if groups != 1:
                    term = torch.einsum(
                        "rgo,rgi->goi", gc.reshape(-1, groups, d_out), a.reshape(-1, groups, d_in)
                    )
                else:
                    term = gc.reshape(-1, d_out).T @ a.reshape(-1, d_in)
                if with_bias:
                    term_b = gc.sum(dim=(0, 1, 2)).reshape(-1)
                    b = term_b if b is None else b + term_b
            else:
                term = g.reshape(-1, d_out).T @ (a * c).reshape(-1, d_in)
            w = term if w is None else w + term
        if with_weight:
            if w is None:  # blocks holds at least one capture
                raise RuntimeError("ghost norms: a layer was captured without activations")
            out[id(weight)] = w
        if with_bias and bias is not None:
            if b is None:
                g_sum = gb if gb is not None else tensor_sum(g.sum(dim=(0, 2)) for _, g in blocks)
                b = coef @ g_sum.reshape(n, -1)
            out[id(bias)] = b.reshape(-1)
        return out

    return _LayerTerms(norm2, build)


def _weight_norm2(
    blocks: list[tuple[torch.Tensor, torch.Tensor]],
    n: int,
    groups: int,
    d_in: int,
    d_out: int,
    with_weight: bool,
    with_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """Per-record squared gradient norm of a linear-type layer.

    The weight gradient of record ``i`` is ``Σ_p g_p a_pᵀ`` per group, ``p``
    running over the "copies × positions" axis of all blocks (P in all).
    Ghost norm (Gram matrices over ``p``, cost ~P²(I+O) per record) when
    ``P(I+O) <= I·O``, else the per-record gradients are instantiated (cost
    ~P·I·O) and returned, ``(n, G, O, I)``, when they fit in memory, so that
    the clipped sum is a cheap weighted sum of them.

    Returns ``(norm2, per_record_or_None, bias_included)``: with a bias, the
    ghost forms fold it in as an extra input feature equal to 1
    (``‖G‖² + ‖b‖² = Σ_{p,q} (a_p·a_q + 1)(g_p·g_q)``).
    """
    dtype, device = blocks[0][1].dtype, blocks[0][1].device
    positions = sum(a.shape[0] * a.shape[2] for a, _ in blocks)
    if not with_weight:
        return torch.zeros(n, dtype=dtype, device=device), None, False
    extra = 1.0 if with_bias else 0.0
    mlp = groups == 1 and all(a.shape[2] == 1 for a, _ in blocks)
    if positions > 1 and positions * (d_in + d_out) <= d_in * d_out and mlp:
        # one position per copy (MLPs): (n, P, X), a view for one block
        ap = _copies_axis(blocks, 0)
        gp = _copies_axis(blocks, 1)
        gram_a = torch.bmm(ap, ap.transpose(1, 2))
        if with_bias:
            gram_a += 1.0
        gram_g = torch.bmm(gp, gp.transpose(1, 2))
        return (gram_a * gram_g).sum((1, 2)), None, with_bias
    units = [(a[k], g[k]) for a, g in blocks for k in range(a.shape[0])]  # (n, T, G, X)
    if positions == 1:
        a, g = units[0]
        a2 = a.square().sum(-1)
        if with_bias:
            a2 = a2 + 1.0
        return (a2 * g.square().sum(-1)).reshape(n, groups).sum(1), None, with_bias
    if positions * (d_in + d_out) <= d_in * d_out:
        # Gram blocks between units u, v: (n, G, T_u, T_v)
        out = torch.zeros(n, dtype=dtype, device=device)
        for u, (au, gu) in enumerate(units):
            for v in range(u, len(units)):
                av, gv = units[v]
                weight = 1.0 if u == v else 2.0
                size = groups * au.shape[1] * av.shape[1]
                chunk = max(1, CHUNK_ELEMENTS // size)
                for s in range(0, n, chunk):
                    e = min(n, s + chunk)
                    gram_a = au[s:e].permute(0, 2, 1, 3) @ av[s:e].permute(0, 2, 3, 1)
                    gram_g = gu[s:e].permute(0, 2, 1, 3) @ gv[s:e].permute(0, 2, 3, 1)
                    out[s:e] += weight * ((gram_a + extra) * gram_g).sum((1, 2, 3))
        return out, None, with_bias
    # instantiate per-record gradients, in chunks of records if they are large
    keep = n * groups * d_in * d_out <= KEEP_ELEMENTS
    chunk = n if keep else max(1, CHUNK_ELEMENTS // (groups * d_in * d_out))
    out = torch.empty(n, dtype=dtype, device=device)
    w = None
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        w = None
        for a, g in units:
            if groups == 1:
                gt, at = g[s:e, :, 0].transpose(1, 2), a[s:e, :, 0]
                w = torch.bmm(gt, at) if w is None else w.baddbmm_(gt, at)
            else:
                term = g[s:e].permute(0, 2, 3, 1) @ a[s:e].permute(0, 2, 1, 3)
                w = term if w is None else w.add_(term)
        if w is None:  # the loop runs at least once (at least one capture)
            raise RuntimeError("ghost norms: a layer was captured without activations")
        out[s:e] = torch.linalg.vector_norm(w.reshape(e - s, -1), dim=1).square()
    return out, (w if keep else None), False


def _copies_axis(blocks: list[tuple[torch.Tensor, torch.Tensor]], which: int) -> torch.Tensor:
    """Blocks ``(copies, n, 1, 1, X)`` -> ``(n, Σ copies, X)`` (a view for one block)."""
    parts = [b[which].reshape(b[which].shape[0], b[which].shape[1], -1).transpose(0, 1) for b in blocks]
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _embedding_terms(module: nn.Embedding, calls: list[tuple[Capture, torch.Tensor]], n: int) -> _LayerTerms:
    vocab, dim = module.weight.shape
    idx_list, g_list = [], []
    for cap, g in calls:
        idx = cap.x.long().reshape(cap.copies, n, -1)
        g = g.reshape(cap.copies, n, -1, dim)
        if module.padding_idx is not None:
            g = g * (idx != module.padding_idx).unsqueeze(-1).to(g.dtype)
        idx_list.append(idx)
        g_list.append(g)
    record = torch.arange(n, device=idx_list[0].device)
    keys = torch.cat([(record.view(1, n, 1) * vocab + idx).reshape(-1) for idx in idx_list])
    flat_g = torch.cat([g.reshape(-1, dim) for g in g_list])
    uniq, inverse = torch.unique(keys, return_inverse=True)
    rows = torch.zeros(uniq.shape[0], dim, dtype=flat_g.dtype, device=flat_g.device)
    rows.index_add_(0, inverse, flat_g)
    norm2 = torch.zeros(n, dtype=flat_g.dtype, device=flat_g.device)
    norm2.index_add_(0, uniq // vocab, rows.square().sum(1))

    def build(coef: torch.Tensor) -> dict[int, torch.Tensor]:
        w = torch.zeros(vocab, dim, dtype=flat_g.dtype, device=flat_g.device)
        c = coef.to(flat_g.dtype).view(1, n, 1, 1)
        for idx, g in zip(idx_list, g_list, strict=True):
            w.index_add_(0, idx.reshape(-1), (g * c).reshape(-1, dim))
        return {id(module.weight): w}

    return _LayerTerms(norm2, build)


def _norm_layer_terms(
    module: nn.LayerNorm | nn.GroupNorm, calls: list[tuple[Capture, torch.Tensor]], n: int
) -> _LayerTerms:
    """LayerNorm / GroupNorm: per-record gradients are small; build them directly."""
    gw = gb = None
    for cap, g in calls:
        x = cap.x
        if isinstance(module, nn.LayerNorm):
            dims = tuple(range(x.dim() - len(module.normalized_shape), x.dim()))
            mean = x.mean(dim=dims, keepdim=True)
            var = x.var(dim=dims, unbiased=False, keepdim=True)
            xhat = (x - mean) * torch.rsqrt(var + module.eps)
            size = math.prod(module.normalized_shape)
            xhat = xhat.reshape(cap.copies, n, -1, size)
            g = g.reshape(cap.copies, n, -1, size)
            w_i, b_i = (g * xhat).sum(dim=(0, 2)), g.sum(dim=(0, 2))
        else:
            if x.dim() < 2:
                raise GhostUnsupportedError("GroupNorm called without a record axis")
            rows, channels = x.shape[0], x.shape[1]
            xg = x.reshape(rows, module.num_groups, -1)
            mean = xg.mean(dim=-1, keepdim=True)
            var = xg.var(dim=-1, unbiased=False, keepdim=True)
            xhat = ((xg - mean) * torch.rsqrt(var + module.eps)).reshape(rows, channels, -1)
            g = g.reshape(rows, channels, -1)
            w_i = (g * xhat).sum(-1).reshape(cap.copies, n, channels).sum(0)
            b_i = g.sum(-1).reshape(cap.copies, n, channels).sum(0)
        gw = w_i if gw is None else gw + w_i
        gb = b_i if gb is None else gb + b_i
    if gw is None or gb is None:  # the loop runs at least once (at least one capture)
        raise RuntimeError("ghost norms: a normalisation layer was captured without activations")
    weight, bias = module.weight, module.bias
    parts: list[tuple[nn.Parameter, torch.Tensor]] = []
    if weight is not None and weight.requires_grad:
        parts.append((weight, gw))
    if bias is not None and bias.requires_grad:
        parts.append((bias, gb))
    zero = torch.zeros(n, dtype=gw.dtype, device=gw.device)
    norm2 = tensor_sum((per.square().sum(1) for _, per in parts), start=zero)

    def build(coef: torch.Tensor) -> dict[int, torch.Tensor]:
        c = coef.to(gw.dtype)
        return {id(p): c @ per for p, per in parts}

    return _LayerTerms(norm2, build)
