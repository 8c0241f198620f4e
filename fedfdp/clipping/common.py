"""Shared pieces of the clipping engines: the batch, forward and loss helpers, clip factors.

Mechanism
---------
Every engine computes the clipped sum ``S = sum_i g_i min(1, C/||g_i||)`` of
Algorithm 1 (private gradient, clipping as in Remark 1), whose L2 sensitivity is
``C`` under add/remove (Definition 6); the noise ``N(0, sigma^2 C^2 I)`` of
Theorem 5 is added by the server.  This module holds what they share: the
:class:`ClippedSum` result, the :class:`Batch` they run on, one forward pass over
the ``K`` stacked inputs of a record, the per-record loss check and the clip
coefficients ``min(1, C/||g_i||)`` (0 for a non-finite norm, which keeps the
sensitivity ``C``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import torch
from torch import nn

LossFn = Callable[[Sequence[Any], torch.Tensor], torch.Tensor]

# Elements of a temporary tensor (per-record grads, Gram matrices) per chunk.
CHUNK_ELEMENTS = 1 << 22
# Per-record gradients of one layer up to this size are kept for the clipped sum.
KEEP_ELEMENTS = 1 << 24


class ClipMethod(StrEnum):
    """The engines of the clipped sum (:mod:`fedfdp.clipping`): ``AUTO`` chooses ghost,
    vmap or the loop per model; ``PLAIN`` is what ran without clipping (``max_norm=None``),
    never a choice.
    """

    AUTO = "auto"
    GHOST = "ghost"
    VMAP = "vmap"
    LOOP = "loop"
    PLAIN = "plain"

    def __repr__(self) -> str:  # the literal, as in the messages
        return repr(self.value)


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
    method : ClipMethod
        The engine that ran: ``GHOST``, ``VMAP``, ``LOOP`` or ``PLAIN`` (``max_norm=None``).
    """

    grads: list[torch.Tensor]
    norms: torch.Tensor
    method: ClipMethod


class GhostUnsupportedError(Exception):
    """The ghost engine cannot handle this model (auto falls back to vmap)."""


class VmapUnsupportedError(Exception):
    """torch.func.vmap cannot run this model (auto falls back to the loop)."""


class Batch(NamedTuple):
    """What every engine runs on (unpacks as ``model, xs, targets, loss_fn, params``).

    ``xs`` are the ``K`` input tensors of the records (record ``i`` is
    ``(xs[0][i], ..., xs[K-1][i])``), detached; ``params`` the trainable parameters,
    in ``model.parameters()`` order.
    """

    model: nn.Module
    xs: list[torch.Tensor]
    targets: torch.Tensor
    loss_fn: LossFn
    params: list[nn.Parameter]

    @property
    def n(self) -> int:
        """Number of records."""
        return self.targets.shape[0]

    def subset(self, keep: torch.Tensor) -> Batch:
        """The same batch restricted to the records ``keep``."""
        return Batch(self.model, [x[keep] for x in self.xs], self.targets[keep], self.loss_fn, self.params)

    def accumulators(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Zero sums aligned with ``params`` and an uninitialised ``(n,)`` norm vector."""
        sums = [torch.zeros_like(p) for p in self.params]
        norms = torch.empty(self.n, dtype=self.params[0].dtype, device=self.params[0].device)
        return sums, norms


def direct_trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters(recurse=False) if p.requires_grad]


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


def stacked_forward(
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


def checked_losses(loss_fn: LossFn, outs: list[Any], targets: torch.Tensor, n: int) -> torch.Tensor:
    losses = loss_fn(outs, targets)
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (n,):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses)
        raise ValueError(
            f"loss_fn returned {shape}; it must return per-record losses of shape ({n},) "
            "(use reduction='none')"
        )
    return losses


def clip_coefficients(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """``min(1, C/‖g_i‖)``; a zero norm gives 1, a non-finite norm 0.

    Norms are ``>= 0``, ``+inf`` or NaN: ``C/inf = 0``, and NaN (kept by ``clamp``) is
    mapped to 0; the lower bound 0 keeps a norm of ``-0.0`` (``C/-0.0 = -inf``) at 0.
    Three tensor operations: the engines call this once per batch.
    """
    return torch.nan_to_num((clip / norms).clamp(0.0, 1.0), nan=0.0)


def grad_or_zeros(
    grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]


def tensor_sum(terms: Iterable[torch.Tensor], start: torch.Tensor | None = None) -> torch.Tensor:
    """``start + t_1 + t_2 + ...`` left to right, like the builtin ``sum`` but typed as a
    tensor: without ``start`` the first term starts the sum (``0 + t_1`` would equal
    ``t_1``); no term and no ``start`` is an error.
    """
    total = start
    for t in terms:
        total = t if total is None else total + t
    if total is None:
        raise ValueError("tensor_sum: no terms and no start")
    return total
