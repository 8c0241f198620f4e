"""The ghost engine: per-record norms without per-record gradients, then book-keeping.

Mechanism
---------
Forward hooks keep each supported layer's input ``a`` and its output's gradient
edge; one backward pass of ``sum_i L_i`` computes only the output gradients ``g``.
Per-record squared norms ``||g_i||^2`` are assembled layer by layer
(:mod:`fedfdp.clipping.ghost_layers`), and the clipped sum
``S = sum_i g_i min(1, C/||g_i||)`` of Algorithm 1 (Remark 1) by book-keeping (one
weighted GEMM per layer).  L2 sensitivity ``C`` under add/remove (Definition 6),
as for every engine.  The engine refuses (``GhostUnsupportedError``) models whose
trainable parameters are not all owned by a layer of :func:`supported_layers` or
are used outside that layer's ``forward``: their gradients would be incomplete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge

from fedfdp.clipping.common import (
    Batch,
    ClipMethod,
    ClippedSum,
    GhostUnsupportedError,
    checked_losses,
    clip_coefficients,
    direct_trainable,
    grad_or_zeros,
    stacked_forward,
)
from fedfdp.clipping.ghost_layers import Capture, layer_terms

# Layers with trainable parameters that the ghost engine handles. Matched by
# exact type: a subclass may use its parameters differently in ``forward``.
_GHOST_TYPES: tuple[type, ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Embedding,
    nn.LayerNorm,
    nn.GroupNorm,
)


def supported_layers() -> tuple[type, ...]:
    """Layer types with trainable parameters that the ghost engine supports.

    Returns
    -------
    tuple of type
        ``Linear``, ``Conv1d``, ``Conv2d``, ``Embedding`` (without ``max_norm``
        or ``scale_grad_by_freq``), ``LayerNorm`` and ``GroupNorm``, matched by
        exact type. Modules without trainable parameters (activations,
        pooling, ``Flatten``, ``Dropout``, ...) are always allowed. Other
        modules with trainable parameters make ``method="auto"`` use the vmap
        engine.
    """
    return _GHOST_TYPES


def ghost_problem(model: nn.Module) -> str | None:
    """Why the ghost engine cannot run on ``model`` (None: it can)."""
    owners: dict[int, str] = {}
    for name, module in model.named_modules():
        own = direct_trainable(module)
        if not own:
            continue
        label = f"{name or '<root>'!r} ({type(module).__name__})"
        if type(module) not in _GHOST_TYPES:
            return f"module {label} has trainable parameters and is not a supported layer"
        if isinstance(module, nn.Embedding) and (module.max_norm is not None or module.scale_grad_by_freq):
            return f"module {label} uses max_norm or scale_grad_by_freq"
        for p in own:
            if id(p) in owners:
                return f"a parameter is shared by modules {owners[id(p)]} and {label}"
            owners[id(p)] = label
    return None


def ghost_clipped_sum(batch: Batch, clip: float, bookkeeping: bool = True) -> ClippedSum:
    """Ghost clipping.

    One forward pass (K inputs stacked into K·n rows) with forward hooks that
    keep each supported layer's input ``a`` and its output's gradient edge;
    one backward pass of ``Σ_i L_i`` that computes only the gradients at those
    edges (``g``), not the weight gradients. Record ``i``'s weight gradient in
    a linear layer is ``Σ_p g_{i,p} a_{i,p}ᵀ`` over the "copies × positions"
    axis ``p``, so ``‖·‖² = Σ_{p,q} (a_{i,p}·a_{i,q})(g_{i,p}·g_{i,q})`` (ghost
    norm, cost ~P²) or, when cheaper, the per-record gradient is instantiated
    (cost ~d_in·d_out). The clipped sum is ``Σ_{i,p} c_i g_{i,p} a_{i,p}ᵀ``
    (book-keeping, one GEMM per layer) or, with ``bookkeeping=False``, a second
    backward of ``Σ_i c_i L_i``.
    """
    model, xs, targets, loss_fn, params = batch
    n = batch.n
    hooked = [m for m in model.modules() if direct_trainable(m)]
    captures: list[Capture] = []
    copies = [1]

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not isinstance(output, torch.Tensor) or not output.requires_grad:
            return  # e.g. called under no_grad: contributes nothing
        x = args[0] if args else None
        rows = copies[0] * n
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != rows:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise GhostUnsupportedError(
                f"{type(module).__name__} received input {shape} in a forward pass of "
                f"{rows} rows; the ghost engine needs the record axis first"
            )
        in_node = get_gradient_edge(x).node if x.requires_grad else None
        captures.append(
            Capture(module, x.detach(), get_gradient_edge(output), copies[0], output.grad_fn, in_node)
        )

    handles = [m.register_forward_hook(hook) for m in hooked]
    try:
        outs = stacked_forward(model, xs, copies, on_retry=captures.clear)
    finally:
        for h in handles:
            h.remove()
    losses = checked_losses(loss_fn, outs, targets, n)
    total = losses.sum()
    _check_graph(total, captures, {id(p) for p in params})

    out_grads: Sequence[torch.Tensor | None] = (None,) * len(captures)
    if captures and total.requires_grad:
        out_grads = torch.autograd.grad(
            total, [c.edge for c in captures], allow_unused=True, retain_graph=not bookkeeping
        )
    by_module: dict[nn.Module, list[tuple[Capture, torch.Tensor]]] = {}
    for cap, g in zip(captures, out_grads, strict=True):
        if g is not None:
            by_module.setdefault(cap.module, []).append((cap, g))

    dtype, device = params[0].dtype, params[0].device
    terms = [layer_terms(m, calls, n) for m, calls in by_module.items()]
    norm2 = torch.zeros(n, dtype=dtype, device=device)
    for t in terms:
        norm2 += t.norm2
    norms = norm2.clamp(min=0).sqrt()
    coef = clip_coefficients(norms, clip)

    if not bookkeeping and losses.requires_grad:
        grads = torch.autograd.grad((losses * coef).sum(), params, allow_unused=True)
        return ClippedSum(grad_or_zeros(grads, params), norms, ClipMethod.GHOST)

    sums: dict[int, torch.Tensor] = {}
    for t in terms:
        for key, value in t.build(coef).items():
            sums[key] = sums[key] + value if key in sums else value
    grads_out = [
        sums[id(p)].reshape(p.shape).to(p.dtype) if id(p) in sums else torch.zeros_like(p) for p in params
    ]
    return ClippedSum(grads_out, norms, ClipMethod.GHOST)


def _check_graph(root: torch.Tensor, captures: list[Capture], param_ids: set[int]) -> None:
    """Refuse if a trainable parameter is reached other than through a hooked call.

    Walks the autograd graph from the loss; at a hooked module's output node it
    jumps straight to that call's input node, skipping the module's internals.
    Reaching a trainable parameter's accumulator means the parameter is used
    outside its module's ``forward`` (e.g. ``F.linear(x, self.fc.weight)``), so
    the captured activations would miss part of its gradient.
    """
    jump: dict[Any, Any] = {c.out_node: c.in_node for c in captures}
    stack = [root.grad_fn]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in jump:
            stack.append(jump[node])
            continue
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) in param_ids:
            raise GhostUnsupportedError(
                f"a trainable parameter of shape {tuple(variable.shape)} is used outside the "
                "forward of a supported layer"
            )
        stack.extend(fn for fn, _ in node.next_functions if fn is not None)
