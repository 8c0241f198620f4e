"""Per-record gradients, clipping and summing (the private gradient of Algorithm 1).

This module computes the *clipped sum* of Algorithm 1, step 4 of the FDP paper
(``fdp_protected_attributes.txt``), with clipping in place of a Lipschitz
bound as allowed by Remark 1:

.. math::

    S = \\sum_{i \\in B} \\bar g_i, \\qquad
    \\bar g_i = g_i \\cdot \\min\\left(1, \\frac{C}{\\lVert g_i \\rVert_2}\\right), \\qquad
    g_i = \\nabla_w L_i(w),

where the L2 norm runs over *all* trainable parameters jointly and ``L_i`` is
record ``i``'s loss. In FDP, ``L_i = ℓ(model(x_i), y_i) − ℓ(model(v_i), y_i)``
with ``v_i`` a public view of ``x_i``, so one record's loss uses the model on
several inputs; all of them count towards that record's gradient.

Sensitivity
    Every ``‖ḡ_i‖ ≤ C``. Under the add/remove neighbouring relation (Def. 6 of
    the paper; the headline relation of this project) adding or removing one
    record changes ``S`` by exactly ``ḡ_i``, so the L2 sensitivity of ``S`` is
    ``C``. The server adds ``N(0, σ²C²I)`` (Theorem 5). Under replacement the
    sensitivity is ``2C``; Prop. 1 handles that in the accountant.

Engines
    ``"loop"``
        one backward per record; the reference for tests.
    ``"vmap"``
        ``torch.func.vmap(grad(...))`` per-record gradients in chunks; any model
        made of standard torch operations that is separable per record.
    ``"ghost"``
        per-record norms without per-record gradients ("ghost norms") from
        activations captured by forward hooks and output gradients from one
        backward pass that skips the weight gradients; the clipped sum is then
        assembled by book-keeping (one weighted GEMM per layer). Supports the
        layers of :func:`supported_layers` plus any parameter-free module.
    ``"auto"``
        ``"ghost"`` when every module that owns trainable parameters is
        supported, ``"vmap"`` otherwise (per-model fallback), ``"loop"`` when
        torch.func cannot transform the model (``nn.GRU``/``nn.LSTM`` in torch
        2.13: their default initial state is updated in place).

Performance note
    glibc's allocator dominates the per-record paths on small VMs. Setting
    ``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296`` in
    the environment of the process (not from Python; glibc reads them at
    start-up) made these paths 3-5x faster in our measurements, at the price of
    some peak memory. See ``docs/clipping.md``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.func import functional_call, grad, vmap

__all__ = ["METHODS", "ClippedSum", "clipped_grad_sum", "supported_layers"]

#: Accepted values of ``method``.
METHODS: tuple[str, ...] = ("auto", "ghost", "vmap", "loop")

LossFn = Callable[[Sequence[Any], torch.Tensor], torch.Tensor]

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

# Elements of a temporary tensor (per-record grads, Gram matrices) per chunk.
_CHUNK_ELEMENTS = 1 << 22
# Per-record gradients of one layer up to this size are kept for the clipped sum.
_KEEP_ELEMENTS = 1 << 24


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


@dataclass(frozen=True)
class ClippedSum:
    """Result of :func:`clipped_grad_sum`.

    Attributes
    ----------
    grads : list of torch.Tensor
        Aligned with ``[p for p in model.parameters() if p.requires_grad]``,
        same shapes and dtypes: ``Σ_i g_i · min(1, C/‖g_i‖)``. Zeros for an
        empty batch. L2 sensitivity ``C`` under add/remove.
    norms : torch.Tensor
        ``(n,)`` per-record gradient norms before clipping, for tests and
        diagnostics only (never send them anywhere: they are not private).
        NaN when ``max_norm`` is None (the plain path computes no norms).
    method : str
        The engine that ran: ``"ghost"``, ``"vmap"``, ``"loop"`` or ``"plain"``
        (``max_norm=None``).
    """

    grads: list[torch.Tensor]
    norms: torch.Tensor
    method: str


class _GhostUnsupportedError(Exception):
    """The ghost engine cannot handle this model (auto falls back to vmap)."""


class _VmapUnsupportedError(Exception):
    """torch.func.vmap cannot run this model (auto falls back to the loop)."""


# --------------------------------------------------------------------------- #
# public entry point
# --------------------------------------------------------------------------- #


def clipped_grad_sum(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    targets: torch.Tensor,
    loss_fn: LossFn,
    max_norm: float | None,
    method: str = "auto",
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
    method : {"auto", "ghost", "vmap", "loop"}
        Engine. ``"auto"`` uses ghost clipping when every module owning
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
    _check_method(method)
    clip = _check_max_norm(max_norm)
    xs, n = _check_inputs(inputs, targets)
    _refuse_batch_mixing(model)
    params = [p for p in model.parameters() if p.requires_grad]
    xs = [x.detach() for x in xs]
    targets = targets.detach()

    if clip is None:
        resolved = "plain"
    elif method == "auto":
        resolved = "ghost" if _ghost_problem(model) is None else "vmap"
    else:
        resolved = method
        if method == "ghost":
            problem = _ghost_problem(model)
            if problem is not None:
                raise ValueError(f"method='ghost' cannot handle this model: {problem}")

    if n == 0 or not params:
        dtype = params[0].dtype if params else torch.get_default_dtype()
        device = params[0].device if params else xs[0].device
        norms = torch.zeros(n, dtype=dtype, device=device)
        if clip is None:
            norms = torch.full((n,), math.nan, dtype=dtype, device=device)
        return ClippedSum([torch.zeros_like(p) for p in params], norms, resolved)

    with torch.enable_grad():
        if resolved == "plain":
            return _plain(model, xs, targets, loss_fn, params)
        if resolved == "loop":
            return _loop(model, xs, targets, loss_fn, clip, params)
        result = _batched(model, xs, targets, loss_fn, clip, params, method, resolved)
        # A record whose gradient is not finite (NaN/inf loss) contributes 0,
        # which keeps the sensitivity C; multiplying its NaNs by 0 would not,
        # so the others are summed again without it. Norms are unchanged.
        bad = ~torch.isfinite(result.norms)
        while bad.any():
            keep = (~bad).nonzero().squeeze(1)
            if keep.numel() == 0:
                return ClippedSum([torch.zeros_like(p) for p in params], result.norms, result.method)
            sub = _batched(
                model,
                [x[keep] for x in xs],
                targets[keep],
                loss_fn,
                clip,
                params,
                method,
                result.method,
            )
            bad_sub = ~torch.isfinite(sub.norms)
            if not bad_sub.any():
                return ClippedSum(sub.grads, result.norms, result.method)
            bad = bad.clone()
            bad[keep[bad_sub]] = True  # possible with dropout in training mode
        return result


def _batched(
    model: nn.Module,
    xs: list[torch.Tensor],
    targets: torch.Tensor,
    loss_fn: LossFn,
    clip: float,
    params: list[nn.Parameter],
    method: str,
    resolved: str,
) -> ClippedSum:
    """Run the ghost or vmap engine, falling back as ``method`` allows."""
    if resolved == "loop":
        return _loop(model, xs, targets, loss_fn, clip, params)
    if resolved == "ghost":
        try:
            return _ghost(model, xs, targets, loss_fn, clip, params)
        except _GhostUnsupportedError as exc:
            if method == "ghost":
                raise ValueError(f"method='ghost' cannot handle this model: {exc}") from None
    try:
        return _vmap(model, xs, targets, loss_fn, clip, params)
    except _VmapUnsupportedError as exc:
        if method == "vmap":
            raise ValueError(f"method='vmap' cannot handle this model: {exc}; use method='loop'") from exc
        return _loop(model, xs, targets, loss_fn, clip, params)


# --------------------------------------------------------------------------- #
# validation
# --------------------------------------------------------------------------- #


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r}: must be one of {METHODS}")


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


def _direct_trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters(recurse=False) if p.requires_grad]


def _ghost_problem(model: nn.Module) -> str | None:
    """Why the ghost engine cannot run on ``model`` (None: it can)."""
    owners: dict[int, str] = {}
    for name, module in model.named_modules():
        own = _direct_trainable(module)
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


# --------------------------------------------------------------------------- #
# forward helpers
# --------------------------------------------------------------------------- #


class _SplitError(Exception):
    """A model output over ``K·n`` rows cannot be split into K outputs."""


def _split_rows(out: Any, n: int, k: int) -> list[Any]:
    """Split a model output over ``k·n`` rows into ``k`` outputs over ``n`` rows."""
    if isinstance(out, torch.Tensor):
        if out.dim() == 0 or out.shape[0] != k * n:
            raise _SplitError
        return list(out.split(n))
    if isinstance(out, tuple | list):
        parts = [_split_rows(o, n, k) for o in out]
        return [type(out)(p[j] for p in parts) for j in range(k)]
    if isinstance(out, dict):
        parts_d = {key: _split_rows(o, n, k) for key, o in out.items()}
        return [{key: v[j] for key, v in parts_d.items()} for j in range(k)]
    raise _SplitError


def _stackable(xs: list[torch.Tensor]) -> bool:
    first = xs[0]
    return len(xs) > 1 and all(
        x.shape == first.shape and x.dtype == first.dtype and x.device == first.device for x in xs[1:]
    )


def _forward(
    model: nn.Module,
    xs: list[torch.Tensor],
    copies: list[int] | None = None,
    on_retry: Callable[[], None] | None = None,
) -> list[Any]:
    """``[model(x) for x in xs]``, as one forward of ``K·n`` rows when possible.

    ``copies``, when given, is set to ``[K]`` (or ``[1]``) before each model
    call so that hooks know how many record copies the current call holds.
    When the stacked output cannot be split by record (an output without the
    record axis first), the inputs are run one by one after ``on_retry()``.
    """
    n = xs[0].shape[0]
    if _stackable(xs):
        if copies is not None:
            copies[:] = [len(xs)]
        try:
            return _split_rows(model(torch.cat(xs)), n, len(xs))
        except _SplitError:
            if on_retry is not None:
                on_retry()
    outs = []
    for x in xs:
        if copies is not None:
            copies[:] = [1]
        outs.append(model(x))
    return outs


def _losses(loss_fn: LossFn, outs: list[Any], targets: torch.Tensor, n: int) -> torch.Tensor:
    losses = loss_fn(outs, targets)
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (n,):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses)
        raise ValueError(
            f"loss_fn returned {shape}; it must return per-record losses of shape ({n},) "
            "(use reduction='none')"
        )
    return losses


def _coefficients(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """``min(1, C/‖g_i‖)``; a zero norm gives 1, a non-finite norm 0."""
    coef = (clip / norms).clamp(max=1.0)
    return torch.where(torch.isfinite(norms), coef, torch.zeros_like(coef))


def _grad_or_zeros(
    grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]


# --------------------------------------------------------------------------- #
# plain, loop and vmap engines
# --------------------------------------------------------------------------- #


def _plain(
    model: nn.Module,
    xs: list[torch.Tensor],
    targets: torch.Tensor,
    loss_fn: LossFn,
    params: list[nn.Parameter],
) -> ClippedSum:
    n = targets.shape[0]
    total = _losses(loss_fn, _forward(model, xs), targets, n).sum()
    grads = torch.autograd.grad(total, params, allow_unused=True)
    norms = torch.full((n,), math.nan, dtype=params[0].dtype, device=params[0].device)
    return ClippedSum(_grad_or_zeros(grads, params), norms, "plain")


def _loop(
    model: nn.Module,
    xs: list[torch.Tensor],
    targets: torch.Tensor,
    loss_fn: LossFn,
    clip: float,
    params: list[nn.Parameter],
) -> ClippedSum:
    n = targets.shape[0]
    sums = [torch.zeros_like(p) for p in params]
    norms = torch.empty(n, dtype=params[0].dtype, device=params[0].device)
    for i in range(n):
        outs = [model(x[i : i + 1]) for x in xs]
        loss = _losses(loss_fn, outs, targets[i : i + 1], 1).sum()
        grads = _grad_or_zeros(torch.autograd.grad(loss, params, allow_unused=True), params)
        norm = torch.sqrt(sum(g.detach().square().sum() for g in grads))
        norms[i] = norm
        if torch.isfinite(norm):
            coef = _coefficients(norm, clip)
            for s, g in zip(sums, grads, strict=True):
                s.add_(g * coef)
    return ClippedSum(sums, norms, "loop")


def _vmap(
    model: nn.Module,
    xs: list[torch.Tensor],
    targets: torch.Tensor,
    loss_fn: LossFn,
    clip: float,
    params: list[nn.Parameter],
) -> ClippedSum:
    n = targets.shape[0]
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
        return _losses(loss_fn, outs, y_i.unsqueeze(0), 1).sum()

    per_record = vmap(grad(record_loss), in_dims=(None, 0, 0), randomness="different")
    weights = {name: p.detach() for name, p in named}
    size = sum(p.numel() for p in params)
    chunk = max(1, min(n, _CHUNK_ELEMENTS // max(size, 1)))
    sums = [torch.zeros_like(p) for p in params]
    norms = torch.empty(n, dtype=params[0].dtype, device=params[0].device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        try:
            g = per_record(weights, tuple(x[start:stop] for x in xs), targets[start:stop])
        except (RuntimeError, NotImplementedError) as exc:
            # e.g. nn.GRU/LSTM: in-place updates of an unbatched initial state
            raise _VmapUnsupportedError(str(exc).split("\n")[0]) from exc
        flat = [g[name].reshape(stop - start, -1) for name in names]
        norm = torch.sqrt(sum(f.square().sum(1) for f in flat))
        norms[start:stop] = norm
        coef = _coefficients(norm, clip)
        for s, f in zip(sums, flat, strict=True):
            s.view(-1).add_(coef @ f)
    return ClippedSum(sums, norms, "vmap")


# --------------------------------------------------------------------------- #
# ghost engine
# --------------------------------------------------------------------------- #


@dataclass
class _Capture:
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


def _ghost(
    model: nn.Module,
    xs: list[torch.Tensor],
    targets: torch.Tensor,
    loss_fn: LossFn,
    clip: float,
    params: list[nn.Parameter],
    bookkeeping: bool = True,
) -> ClippedSum:
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
    n = targets.shape[0]
    hooked = [m for m in model.modules() if _direct_trainable(m)]
    captures: list[_Capture] = []
    copies = [1]

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not isinstance(output, torch.Tensor) or not output.requires_grad:
            return  # e.g. called under no_grad: contributes nothing
        x = args[0] if args else None
        rows = copies[0] * n
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != rows:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise _GhostUnsupportedError(
                f"{type(module).__name__} received input {shape} in a forward pass of "
                f"{rows} rows; the ghost engine needs the record axis first"
            )
        in_node = get_gradient_edge(x).node if x.requires_grad else None
        captures.append(
            _Capture(module, x.detach(), get_gradient_edge(output), copies[0], output.grad_fn, in_node)
        )

    handles = [m.register_forward_hook(hook) for m in hooked]
    try:
        outs = _forward(model, xs, copies, on_retry=captures.clear)
    finally:
        for h in handles:
            h.remove()
    losses = _losses(loss_fn, outs, targets, n)
    total = losses.sum()
    _check_graph(total, captures, {id(p) for p in params})

    if captures and total.requires_grad:
        out_grads = torch.autograd.grad(
            total, [c.edge for c in captures], allow_unused=True, retain_graph=not bookkeeping
        )
    else:
        out_grads = (None,) * len(captures)
    by_module: dict[nn.Module, list[tuple[_Capture, torch.Tensor]]] = {}
    for cap, g in zip(captures, out_grads, strict=True):
        if g is not None:
            by_module.setdefault(cap.module, []).append((cap, g))

    dtype, device = params[0].dtype, params[0].device
    terms = [_layer_terms(m, calls, n) for m, calls in by_module.items()]
    norm2 = torch.zeros(n, dtype=dtype, device=device)
    for t in terms:
        norm2 += t.norm2
    norms = norm2.clamp(min=0).sqrt()
    coef = _coefficients(norms, clip)

    if not bookkeeping and losses.requires_grad:
        grads = torch.autograd.grad((losses * coef).sum(), params, allow_unused=True)
        return ClippedSum(_grad_or_zeros(grads, params), norms, "ghost")

    sums: dict[int, torch.Tensor] = {}
    for t in terms:
        for key, value in t.build(coef).items():
            sums[key] = sums[key] + value if key in sums else value
    grads_out = [
        sums[id(p)].reshape(p.shape).to(p.dtype) if id(p) in sums else torch.zeros_like(p) for p in params
    ]
    return ClippedSum(grads_out, norms, "ghost")


def _check_graph(root: torch.Tensor, captures: list[_Capture], param_ids: set[int]) -> None:
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
            raise _GhostUnsupportedError(
                f"a trainable parameter of shape {tuple(variable.shape)} is used outside the "
                "forward of a supported layer"
            )
        stack.extend(fn for fn, _ in node.next_functions if fn is not None)


def _layer_terms(module: nn.Module, calls: list[tuple[_Capture, torch.Tensor]], n: int) -> _LayerTerms:
    if isinstance(module, nn.Linear):
        blocks = []
        for cap, g in calls:
            a = cap.x
            if a.dim() < 2:
                raise _GhostUnsupportedError("Linear called without a record axis")
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
                raise _GhostUnsupportedError(f"{type(module).__name__}: unexpected output size")
            d_in, d_out = patches.shape[-1] // groups, go.shape[1] // groups
            a = patches.reshape(cap.copies, n, -1, groups, d_in)
            blocks.append((a, go.transpose(1, 2).reshape(cap.copies, n, -1, groups, d_out)))
        return _matrix_terms(module, blocks, n, groups=groups)
    if isinstance(module, nn.Embedding):
        return _embedding_terms(module, calls, n)
    if isinstance(module, nn.LayerNorm | nn.GroupNorm):
        return _norm_layer_terms(module, calls, n)
    raise _GhostUnsupportedError(f"{type(module).__name__} is not supported")  # pragma: no cover


def _conv_patches(module: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """Input patches of a convolution, ``(R, L, C_in·prod(kernel))``.

    The last axis is ordered like ``weight[o].flatten()`` (channel-major).
    """
    nd = 1 if isinstance(module, nn.Conv1d) else 2
    if x.dim() != nd + 2:
        raise _GhostUnsupportedError(f"{type(module).__name__} called on unbatched input")
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
    module: nn.Module,
    blocks: list[tuple[torch.Tensor, torch.Tensor]],
    n: int,
    groups: int,
) -> _LayerTerms:
    """Linear-type layer: output ``o = W a (+ b)`` per position and group.

    Each block is ``(a, g)`` with ``a: (copies, n, T, G, I)`` and
    ``g: (copies, n, T, G, O)`` (views of the captured tensors); the per-record
    weight gradient is ``Σ_{copies, T} g aᵀ`` per group.
    """
    weight: nn.Parameter = module.weight
    bias: nn.Parameter | None = module.bias
    a0, g0 = blocks[0]
    dtype = g0.dtype
    d_in, d_out = a0.shape[-1], g0.shape[-1]
    with_weight = weight.requires_grad
    with_bias = bias is not None and bias.requires_grad
    norm2, per_record, folded = _weight_norm2(blocks, n, groups, d_in, d_out, with_weight, with_bias)
    gb = None
    if with_bias and not folded:
        gb = sum(g.sum(dim=(0, 2)) for _, g in blocks).reshape(n, -1)  # (n, G·O)
        norm2 = norm2 + gb.square().sum(1)

    def build(coef: torch.Tensor) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        coef = coef.to(dtype)
        c = coef.view(1, n, 1, 1, 1)
        w = b = None
        if with_weight and per_record is not None:
            w = coef @ per_record.reshape(n, -1)
        for a, g in blocks:
            if not with_weight or per_record is not None:
                break
            gc = g * c if (with_bias or d_out <= d_in or groups != 1) else None
            if groups != 1:
                term = torch.einsum(
                    "rgo,rgi->goi", gc.reshape(-1, groups, d_out), a.reshape(-1, groups, d_in)
                )
            elif gc is not None:
                term = gc.reshape(-1, d_out).T @ a.reshape(-1, d_in)
            else:
                term = g.reshape(-1, d_out).T @ (a * c).reshape(-1, d_in)
            w = term if w is None else w + term
            if with_bias:
                term_b = gc.sum(dim=(0, 1, 2)).reshape(-1)
                b = term_b if b is None else b + term_b
        if with_weight:
            out[id(weight)] = w
        if with_bias:
            if b is None:
                g_sum = gb if gb is not None else sum(g.sum(dim=(0, 2)) for _, g in blocks)
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
    units = [(a[k], g[k]) for a, g in blocks for k in range(a.shape[0])]  # (n, T, G, X)
    dtype, device = units[0][1].dtype, units[0][1].device
    positions = sum(a.shape[1] for a, _ in units)
    if not with_weight:
        return torch.zeros(n, dtype=dtype, device=device), None, False
    extra = 1.0 if with_bias else 0.0
    if positions == 1:
        a, g = units[0]
        a2 = a.square().sum(-1)
        if with_bias:
            a2 = a2 + 1.0
        return (a2 * g.square().sum(-1)).reshape(n, groups).sum(1), None, with_bias
    if positions * (d_in + d_out) <= d_in * d_out:
        if groups == 1 and all(a.shape[1] == 1 for a, _ in units):
            # one position per copy (MLPs): (n, P, X), a view for one block
            ap = _copies_axis(blocks, 0)
            gp = _copies_axis(blocks, 1)
            gram_a = torch.bmm(ap, ap.transpose(1, 2))
            if with_bias:
                gram_a += 1.0
            gram_g = torch.bmm(gp, gp.transpose(1, 2))
            return (gram_a * gram_g).sum((1, 2)), None, with_bias
        # Gram blocks between units u, v: (n, G, T_u, T_v)
        out = torch.zeros(n, dtype=dtype, device=device)
        for u, (au, gu) in enumerate(units):
            for v in range(u, len(units)):
                av, gv = units[v]
                weight = 1.0 if u == v else 2.0
                size = groups * au.shape[1] * av.shape[1]
                chunk = max(1, _CHUNK_ELEMENTS // size)
                for s in range(0, n, chunk):
                    e = min(n, s + chunk)
                    gram_a = au[s:e].permute(0, 2, 1, 3) @ av[s:e].permute(0, 2, 3, 1)
                    gram_g = gu[s:e].permute(0, 2, 1, 3) @ gv[s:e].permute(0, 2, 3, 1)
                    out[s:e] += weight * ((gram_a + extra) * gram_g).sum((1, 2, 3))
        return out, None, with_bias
    # instantiate per-record gradients, in chunks of records if they are large
    keep = n * groups * d_in * d_out <= _KEEP_ELEMENTS
    chunk = n if keep else max(1, _CHUNK_ELEMENTS // (groups * d_in * d_out))
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
        assert w is not None
        out[s:e] = torch.linalg.vector_norm(w.reshape(e - s, -1), dim=1).square()
    return out, (w if keep else None), False


def _copies_axis(blocks: list[tuple[torch.Tensor, torch.Tensor]], which: int) -> torch.Tensor:
    """Blocks ``(copies, n, 1, 1, X)`` -> ``(n, Σ copies, X)`` (a view for one block)."""
    parts = [b[which][:, :, 0, 0].transpose(0, 1) for b in blocks]
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _embedding_terms(module: nn.Embedding, calls: list[tuple[_Capture, torch.Tensor]], n: int) -> _LayerTerms:
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
    module: nn.LayerNorm | nn.GroupNorm, calls: list[tuple[_Capture, torch.Tensor]], n: int
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
                raise _GhostUnsupportedError("GroupNorm called without a record axis")
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
    assert gw is not None and gb is not None
    weight, bias = module.weight, module.bias
    parts: list[tuple[nn.Parameter, torch.Tensor]] = []
    if weight is not None and weight.requires_grad:
        parts.append((weight, gw))
    if bias is not None and bias.requires_grad:
        parts.append((bias, gb))
    norm2 = sum(per.square().sum(1) for _, per in parts)

    def build(coef: torch.Tensor) -> dict[int, torch.Tensor]:
        c = coef.to(gw.dtype)
        return {id(p): c @ per for p, per in parts}

    return _LayerTerms(norm2, build)
