"""The clipped sum of Algorithm 1's private gradient: entry point and engine choice.

Mechanism
---------
:func:`clipped_grad_sum` returns ``S = sum_i g_i min(1, C/||g_i||)`` over the
records of a batch, ``g_i`` being record ``i``'s gradient over all trainable
parameters jointly (Algorithm 1, clipping in place of a Lipschitz bound as allowed
by Remark 1).

Sensitivity and relation
------------------------
Under add/remove (Definition 6) one record changes ``S`` by ``g_i min(1, C/||g_i||)``,
of norm at most ``C``; a record whose gradient is not finite contributes 0, which
keeps that bound.  The Gaussian mechanism of Theorem 5 is calibrated to it.  Under
replacement the sensitivity is ``2C`` (handled by Prop. 1 in the accountant).

Validation refuses bad ``max_norm``, inputs, targets and methods, and modules that
mix records (BatchNorm in training mode).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from fedfdp.clipping.common import (
    Batch,
    ClipMethod,
    ClippedSum,
    GhostUnsupportedError,
    LossFn,
    VmapUnsupportedError,
)
from fedfdp.clipping.ghost import ghost_clipped_sum, ghost_problem
from fedfdp.clipping.loop import loop_clipped_sum, plain_sum
from fedfdp.clipping.vmap import vmap_clipped_sum

__all__ = ["METHODS", "ClipMethod", "clipped_grad_sum"]

#: Accepted values of ``method``.
METHODS: tuple[ClipMethod, ...] = (ClipMethod.AUTO, ClipMethod.GHOST, ClipMethod.VMAP, ClipMethod.LOOP)


def clipped_grad_sum(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    targets: torch.Tensor,
    loss_fn: LossFn,
    max_norm: float | None,
    method: ClipMethod | str = ClipMethod.AUTO,
) -> ClippedSum:
    """Sum of per-record gradients, each clipped to L2 norm ``max_norm``.

    Implements the private gradient of Algorithm 1, step 4 of the FDP paper
    with per-record clipping (Remark 1): record ``i``'s gradient
    ``g_i = ∇_w L_i(w)`` over all trainable parameters jointly is scaled by
    ``min(1, C/‖g_i‖)`` and the results are summed. Adding or removing one
    record (add/remove neighbours, Def. 6) changes the sum by at most ``C`` in
    L2 norm: the sensitivity the Gaussian mechanism is calibrated to.

    Parameters
    ----------
    model : torch.nn.Module
        Must treat records independently: no module may mix the records of a
        batch (``BatchNorm`` in training mode or without running statistics
        is refused). Its ``training`` flag is left as it is (Dropout in
        training mode works, with the model's own randomness). Parameters with
        ``requires_grad=False`` are skipped. Nothing is left on the model: no
        hooks, no ``.grad``.
    inputs : sequence of torch.Tensor
        ``K >= 1`` tensors, each ``(n, ...)``; record ``i`` is
        ``(inputs[0][i], ..., inputs[K-1][i])``, e.g. ``[x, public_view(x)]``.
        When all have the same shape and dtype they are concatenated into one
        forward pass of ``K·n`` rows.
    targets : torch.Tensor
        ``(n, ...)`` targets, typically ``(n,)`` class indices.
    loss_fn : callable
        ``loss_fn(outputs, targets) -> (n,)`` per-record losses, with
        ``outputs[k] = model(inputs[k])``. Must be separable per record
        (``reduction="none"``) and depend on the parameters only through
        ``outputs``. FDP: ``ce(outputs[0], y) - ce(outputs[1], y)``.
    max_norm : float or None
        Clipping bound ``C > 0`` (finite). ``None``: no clipping, the plain sum
        ``Σ_i g_i`` from one ordinary backward (``norms`` are then NaN and
        ``method`` is ``"plain"``).
    method : ClipMethod or str
        Engine (one of :data:`METHODS`; its string is accepted). ``"auto"`` uses
        ghost clipping when every module owning
        trainable parameters is in :func:`supported_layers`, vmap otherwise.

    Returns
    -------
    ClippedSum
        ``grads`` (the clipped sum), ``norms`` (before clipping), ``method``.

    Raises
    ------
    ValueError
        Invalid ``max_norm``, ``inputs``, ``targets`` or ``method``; a module
        that mixes records (BatchNorm); ``method="ghost"`` on an unsupported
        model; ``loss_fn`` not returning ``(n,)``.
    """
    method = _check_method(method)
    clip = _check_max_norm(max_norm)
    xs, n = _check_inputs(inputs, targets)
    _refuse_batch_mixing(model)
    params = [p for p in model.parameters() if p.requires_grad]
    xs = [x.detach() for x in xs]
    targets = targets.detach()

    resolved: ClipMethod
    if clip is None:
        resolved = ClipMethod.PLAIN
    elif method is ClipMethod.AUTO:
        resolved = ClipMethod.GHOST if ghost_problem(model) is None else ClipMethod.VMAP
    else:
        resolved = method
        if method is ClipMethod.GHOST:
            problem = ghost_problem(model)
            if problem is not None:
                raise ValueError(f"method='ghost' cannot handle this model: {problem}")

    if n == 0 or not params:
        dtype = params[0].dtype if params else torch.get_default_dtype()
        device = params[0].device if params else xs[0].device
        norms = torch.zeros(n, dtype=dtype, device=device)
        if clip is None:
            norms = torch.full((n,), math.nan, dtype=dtype, device=device)
        return ClippedSum([torch.zeros_like(p) for p in params], norms, resolved)

    batch = Batch(model, xs, targets, loss_fn, params)
    with torch.enable_grad():
        if clip is None:  # resolved == "plain"
            return plain_sum(batch)
        if resolved is ClipMethod.LOOP:
            return loop_clipped_sum(batch, clip)
        result = _batched(batch, clip, method, resolved)
        # A record whose gradient is not finite (NaN/inf loss) contributes 0,
        # which keeps the sensitivity C; multiplying its NaNs by 0 would not,
        # so the others are summed again without it. Norms are unchanged.
        if math.isfinite(float(result.norms.sum())):  # every norm finite (one reduction)
            return result
        bad = ~torch.isfinite(result.norms)
        while bad.any():
            keep = (~bad).nonzero().squeeze(1)
            if keep.numel() == 0:
                return ClippedSum([torch.zeros_like(p) for p in params], result.norms, result.method)
            sub = _batched(batch.subset(keep), clip, method, result.method)
            bad_sub = ~torch.isfinite(sub.norms)
            if not bad_sub.any():
                return ClippedSum(sub.grads, result.norms, result.method)
            bad = bad.clone()
            bad[keep[bad_sub]] = True  # possible with dropout in training mode
        return result


def _batched(batch: Batch, clip: float, method: ClipMethod, resolved: ClipMethod) -> ClippedSum:
    """Run the ghost or vmap engine, falling back as ``method`` allows."""
    if resolved is ClipMethod.LOOP:
        return loop_clipped_sum(batch, clip)
    if resolved is ClipMethod.GHOST:
        try:
            return ghost_clipped_sum(batch, clip)
        except GhostUnsupportedError as exc:
            if method is ClipMethod.GHOST:
                raise ValueError(f"method='ghost' cannot handle this model: {exc}") from None
    try:
        return vmap_clipped_sum(batch, clip)
    except VmapUnsupportedError as exc:
        if method is ClipMethod.VMAP:
            raise ValueError(f"method='vmap' cannot handle this model: {exc}; use method='loop'") from exc
        return loop_clipped_sum(batch, clip)


# --------------------------------------------------------------------------- #
# validation
# --------------------------------------------------------------------------- #


def _check_method(method: ClipMethod | str) -> ClipMethod:
    if method not in METHODS:
        raise ValueError(f"method={method!r}: must be one of {tuple(str(m) for m in METHODS)}")
    return ClipMethod(method)


def _check_max_norm(max_norm: float | None) -> float | None:
    if max_norm is None:
        return None
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real):
        raise ValueError(f"max_norm={max_norm!r}: must be a finite number > 0 or None")
    value = float(max_norm)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"max_norm={max_norm!r}: must be a finite number > 0 or None")
    return value


def _check_inputs(inputs: Sequence[torch.Tensor], targets: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, Sequence):
        raise ValueError(
            f"inputs must be a list or tuple of tensors (K of them, e.g. [x, view]), "
            f"got {type(inputs).__name__}"
        )
    xs = list(inputs)
    if not xs:
        raise ValueError("inputs=[]: need at least one input tensor")
    for k, x in enumerate(xs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            what = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"inputs[{k}]={what}: must be a tensor with a leading record axis")
    if not isinstance(targets, torch.Tensor) or targets.dim() == 0:
        what = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets)
        raise ValueError(f"targets={what}: must be a tensor of shape (n, ...)")
    n = targets.shape[0]
    sizes = [x.shape[0] for x in xs]
    if any(s != n for s in sizes):
        raise ValueError(
            f"leading sizes of inputs {sizes} and targets ({n}) must all be equal (one row per record)"
        )
    return xs, n


def _refuse_batch_mixing(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and (
            module.training or not module.track_running_stats
        ):
            raise ValueError(
                f"module {name or '<root>'!r} ({type(module).__name__}) normalises over the "
                "batch, so one record's gradient depends on the other records and the "
                "per-record sensitivity C does not hold; use GroupNorm or LayerNorm"
            )
