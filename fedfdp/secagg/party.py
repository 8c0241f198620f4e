"""What one secure-aggregation party contributes in the collect stage, before masking.

``contribution(x) = (R((s/C)·x) + e) mod 2³²`` with ``x`` the party's clipped private
sum (over its secret Poisson sample), ``R`` unbiased randomized rounding and
``e ~ N_Z(0, σ_loc²)^d`` the exact discrete Gaussian (Canonne, Kamath, Steinke 2020),
both drawn from the party's own OS CSPRNG (:class:`fedfdp.entropy.OSBits`), never from
anything in the configuration. Privacy: add/remove of one record moves the honest
parties' rounded sum by at most ``Δ = s + √d`` in L2 (coupled rounding); the sum of
``n_h`` honest noises is accounted by
:class:`~fedfdp.accounting.distributed.DistributedDiscreteGaussian`
(``docs/secagg_accounting.md``, route A proved there, route B the papers' RDP bound).

Timing: the server sees when the reply arrives. The noise is drawn first, with a
public amount of work (:mod:`fedfdp.secagg.noise`, "Fixed work"), then the rounding,
``d`` uniforms whatever ``x``; ``x`` itself comes from a batch laid out in public
slots (:class:`fedfdp.contribution.BatchShape`).
"""

from __future__ import annotations

import numpy as np

from fedfdp.accounting.distributed import MIN_LOCAL_SIGMA
from fedfdp.contribution import SLOT_OVERFLOW
from fedfdp.entropy import BitStream, OSBits
from fedfdp.secagg.encoding import quantize, to_ring
from fedfdp.secagg.noise import sample_discrete_gaussian, work_failure_bound
from fedfdp.validate import count

__all__ = ["noisy_contribution", "timing_failure"]


def noisy_contribution(
    x: np.ndarray, *, clip: float, scale: float, local_sigma: float, stream: BitStream | None = None
) -> np.ndarray:
    """``(R((s/C)·x) + N_Z(0, σ_loc²)^d) mod 2³²`` as ``uint32`` (module docstring).

    Parameters
    ----------
    x : numpy.ndarray
        The clipped private sum, flattened (``d`` floats).
    clip, scale : float
        ``C`` and ``s``.
    local_sigma : float
        ``σ_loc`` in integer units, at least ``MIN_LOCAL_SIGMA``.
    stream : BitStream, optional
        The party's secret bits; default its OS CSPRNG.

    Raises
    ------
    ValueError
        ``σ_loc < MIN_LOCAL_SIGMA`` (such a request is refused: its noise would not be
        accounted), or a malformed input.
    """
    if not local_sigma >= MIN_LOCAL_SIGMA:
        raise ValueError(f"local_sigma={local_sigma!r}: below {MIN_LOCAL_SIGMA}, refused")
    bits = stream if stream is not None else OSBits()
    flat = np.asarray(x, dtype=np.float64).ravel()
    noise = sample_discrete_gaussian(float(local_sigma) ** 2, flat.size, bits)  # public work, first
    return to_ring(quantize(flat, clip=clip, scale=scale, stream=bits) + noise)


def timing_failure(local_sigma: float, dimension: int, slot_counts: int = 1) -> float:
    """An upper bound on the probability that one party's collect stage in one round does
    more than its public amount of work, so that its reply time may show something secret:
    a Poisson batch beyond its public slots (:data:`fedfdp.contribution.SLOT_OVERFLOW` per
    slot count: one for the record unit, one per device for the device unit) or the
    noise sampler beyond its public counts (:func:`fedfdp.secagg.noise.work_failure_bound`).

    Against a server that also times the replies, a run whose timing-free guarantee is
    ``(ε, δ)`` is ``(ε, δ + (1 + e^ε)·β)``, ``β`` the sum of this bound over every party and
    round (``docs/secagg_accounting.md`` §10).

    Examples
    --------
    >>> timing_failure(1.0e4, 100_000) < 2.0**-60
    True
    """
    slots = count("slot_counts", slot_counts, 1)
    return slots * SLOT_OVERFLOW + work_failure_bound(float(local_sigma) ** 2, dimension)
