r"""Per-record gradients, clipping and summing (the private gradient of Algorithm 1).

This module computes the *clipped sum* of Algorithm 1, step 4 of the FDP paper
(``fdp_protected_attributes.txt``), with clipping in place of a Lipschitz
bound as allowed by Remark 1:

.. math::

    S = \sum_{i \in B} \bar g_i, \qquad
    \bar g_i = g_i \cdot \min\left(1, \frac{C}{\lVert g_i \rVert_2}\right), \qquad
    g_i = \nabla_w L_i(w),

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
Modules
    :mod:`~fedfdp.clipping.clipped_sum` (the entry point, engine choice,
    non-finite records), :mod:`~fedfdp.clipping.common` (shared pieces: the
    batch, forward and loss helpers, clip coefficients),
    :mod:`~fedfdp.clipping.loop` (plain sum and per-record loop),
    :mod:`~fedfdp.clipping.vmap`, :mod:`~fedfdp.clipping.ghost` (hooks, one
    backward, book-keeping) and :mod:`~fedfdp.clipping.ghost_layers` (per-layer
    ghost norms and clipped-sum builders).
"""

from fedfdp.clipping.clipped_sum import METHODS, clipped_grad_sum
from fedfdp.clipping.common import ClipMethod, ClippedSum
from fedfdp.clipping.ghost import supported_layers

__all__ = ["METHODS", "ClipMethod", "ClippedSum", "clipped_grad_sum", "supported_layers"]
