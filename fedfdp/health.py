"""Numerical health of a run: the round engine stops a run whose aggregate, model or
losses leave the finite range (:class:`RunDiverged`, one line naming the round and the
likely setting; the CLI exits with status 2). The round's charge stays in the ledger
(its noise was drawn) and the last good checkpoint stays on disk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedfdp.config import ConfigError

#: A parameter whose magnitude passes this has diverged (float32 overflows at 3.4e38;
#: squares of such weights already overflow in a forward pass).
DIVERGENCE_LIMIT = 1e15


class RunDiverged(ConfigError):
    """The model, the aggregate or a loss left the finite range in a round: the run
    stops (the round's charge stays in the ledger, its noise was drawn; the last good
    checkpoint and no final model are on disk). The message names the round and the
    settings that most likely caused it.
    """


def finite_or_raise(round_: int, what: str, tensors: Sequence[torch.Tensor], likely: str) -> None:
    """Raise :class:`RunDiverged` when any of ``tensors`` holds a NaN, an infinity or a
    magnitude above :data:`DIVERGENCE_LIMIT`.

    One reduction per tensor: ``max |t|`` (NaN propagates through it, so ``not (m <=
    limit)`` catches NaN, infinities and divergence alike); only then is NaN or inf told
    from a finite divergence.
    """
    for t in tensors:
        if not t.numel():
            continue
        m = float(t.detach().abs().max())
        if not m <= DIVERGENCE_LIMIT:
            if not math.isfinite(m):
                raise RunDiverged(f"round {round_}: {what} is not finite (NaN or inf); likely {likely}")
            raise RunDiverged(f"round {round_}: {what} diverged (|value| > {DIVERGENCE_LIMIT:g}); "
                              f"likely {likely}")
