"""Fixed-point encoding of a client's clipped private sum into the ring Z/2³²Z, and the
decoding of the aggregate.

Client side (secagg_design.md §3, §4.1)::

    y = (s / C) · x                      scale: C is the clipping norm, s the scale
    z = R(y) = ⌊y + U⌋,  U ~ Unif[0,1)^d unbiased randomized rounding (CSPRNG bits)
    (z + discrete Gaussian noise) mod 2³²   ring element, then masked by SecAgg+

Server side: ``Y = Σ z_i mod 2³²`` is read as a signed integer
``Y − 2³²·[Y ≥ 2³¹]`` and multiplied by ``C/s``.

Sensitivity
-----------
Neighbouring relation: add/remove one record, which changes one client's clipped sum
``x`` by ``g`` with ``‖g‖₂ ≤ C``, so ``y`` moves by ``v = (s/C)·g`` with ``‖v‖₂ ≤ s``.
Coupling both worlds on the same ``U``, every coordinate of ``R(y + v) − R(y)`` is
within 1 of ``v_j`` (strictly), hence ``‖R(y + v) − R(y)‖₂ ≤ ‖v‖₂ + √d ≤ s + √d``
surely. This is the shift ``Δ = s + √d`` of the design note's dominating pair (§3,
"Sensitivity"; the coupling argument, not DDG's conditional rounding). The rounding is
computed as ``⌊y⌋ + [U < y − ⌊y⌋]``, which is ``⌊y + (1 − U)⌋`` up to the null event
``U = frac(y)``: the fractional part ``y − ⌊y⌋`` is exact in floating point, so the
per-coordinate bound ``|R(y) − y| < 1`` and the coupling bound above hold exactly for
the floating-point ``y`` (no rounding error of ``y + U`` enters). The scaling
``(s/C)·x`` itself is a floating-point product (relative error ≤ 2⁻⁵³, ``s`` a power
of two).

Randomness
----------
``U`` is secret (knowing it and ``z`` narrows ``y`` down): it comes from the AES-256-CTR
keystream (:class:`fedfdp.secagg.keystream.Keystream`) under a 256-bit key read from a
:class:`fedfdp.entropy.BitStream` held by the client, i.e. the OS CSPRNG
(:class:`fedfdp.entropy.OSBits`) outside the reproducible test mode: one key per call,
never leaving it, and ``d`` words expanded at about a nanosecond per byte instead of
``8d`` bytes of system calls. Each ``U_j`` has 53 random bits
(:func:`fedfdp.entropy.uniforms`), so the rounding is unbiased up to 2⁻⁵³ per coordinate
(AES-256 as a pseudorandom function; the sensitivity bound above holds for every ``U``).

Wrap-around
-----------
Reduction mod 2³² is post-processing: it can cost accuracy (when the true aggregate
leaves [−2³¹, 2³¹)), never privacy. :func:`choose_scale` picks ``s`` so that it does
not happen unless the noise exceeds ``tail`` standard deviations.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedfdp.entropy import BitStream, uniforms
from fedfdp.secagg.keystream import Keystream
from fedfdp.validate import at_least, count, finite, positive

#: Bits of the ring Z/2^b Z.
MODULUS_BITS = 32
#: The ring's modulus 2³².
MODULUS = 2**MODULUS_BITS
#: Half the modulus: decoded values lie in [−HALF, HALF).
HALF = 2 ** (MODULUS_BITS - 1)
#: Default target ``s/√d`` of :func:`default_scale` (rounding adds ``√d/s ≈ 0.1 %`` to Δ).
SCALE_PER_ROOT_DIM = 1000.0
#: Largest magnitude accepted in :func:`randomized_round` (exact integers in float64).
_MAX_ABS = 2.0**53


def default_scale(dim: int) -> float:
    """The largest candidate scale ``s = 2^⌈log₂(1000·√d)⌉`` (a power of two)."""
    d = count("dim", dim)
    return float(2 ** math.ceil(math.log2(SCALE_PER_ROOT_DIM * math.sqrt(d))))


def headroom(
    scale: float,
    *,
    max_records: int,
    parties: int,
    local_noise_std: float = 0.0,
    tail: float = 7.0,
) -> float:
    """Worst-case magnitude of one coordinate of the aggregate, in integer units.

    ``s·B + n + tail·σ_loc·√n``: each client's scaled clipped sum has coordinates of
    magnitude at most ``s·B_i`` (``B_i`` records of norm ≤ C), rounding adds less than
    1 per client, and the sum of ``n`` independent noises that are each
    ``σ_loc²``-sub-Gaussian (true of N_ℤ(0, σ_loc²): Canonne, Kamath, Steinke 2020)
    exceeds ``tail·σ_loc·√n`` in magnitude with probability at most
    ``2·exp(−tail²/2)`` (≈ 4.6e−11 per coordinate at ``tail = 7``).

    Parameters
    ----------
    scale : float
        ``s``.
    max_records : int
        Public upper bound ``B`` on the total number of records whose clipped gradients
        enter the aggregate (e.g. the total record count ``N``).
    parties : int
        Number ``n`` of clients whose encodings are summed.
    local_noise_std : float
        Each client's noise parameter ``σ_loc`` in integer units (0: none).
    tail : float
        Number of standard deviations of the noise sum to leave room for.
    """
    s = positive("scale", scale)
    b = count("max_records", max_records, 0)
    n = count("parties", parties)
    sigma = at_least("local_noise_std", finite("local_noise_std", local_noise_std), 0.0)
    t = at_least("tail", finite("tail", tail), 0.0)
    return s * b + n + t * sigma * math.sqrt(n)


def choose_scale(
    dim: int,
    *,
    max_records: int,
    parties: int,
    local_noise_std: float | Callable[[float], float] = 0.0,
    tail: float = 7.0,
) -> float:
    """The scale ``s``: :func:`default_scale`, halved until :func:`headroom` ``< 2³¹``.

    A pure function of public quantities (dimension, a public bound on the record
    count, the number of parties, the noise level), so the server and every client
    compute the same ``s``.

    Parameters
    ----------
    dim : int
        ``d``.
    max_records, parties, tail
        As in :func:`headroom`.
    local_noise_std : float or callable
        ``σ_loc`` in integer units, or a function of ``s`` returning it (the noise is
        usually calibrated in integer units at the chosen scale, e.g.
        ``σ_loc(s) = σ·(s + √d)/√n_h``).

    Returns
    -------
    float
        A power of two ``≥ 1``.

    Raises
    ------
    ValueError
        No power of two ``s ≥ 1`` passes the headroom check.
    """
    s = default_scale(dim)
    noise: Callable[[float], float] = (
        local_noise_std if callable(local_noise_std) else (lambda _s: float(local_noise_std))
    )
    while s >= 1.0:
        need = headroom(s, max_records=max_records, parties=parties, local_noise_std=noise(s), tail=tail)
        if need < HALF:
            return s
        s /= 2.0
    raise ValueError(
        f"max_records={max_records}, parties={parties}: no scale s >= 1 keeps the aggregate within "
        f"±2^{MODULUS_BITS - 1} (headroom check failed)"
    )


def randomized_round(values: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Unbiased randomized rounding ``R(y) = ⌊y⌋ + [u < y − ⌊y⌋]`` as ``int64``.

    ``E[R(y)] = y`` for ``u ~ Unif[0,1)`` and ``|R(y) − y| < 1`` for every ``u``;
    passing the same ``u`` to two inputs gives the coupling of the module docstring.

    Parameters
    ----------
    values : numpy.ndarray
        Finite floats ``y`` with ``|y| < 2⁵³``.
    u : numpy.ndarray
        Uniforms in [0, 1), same shape.
    """
    y = np.asarray(values, dtype=np.float64)
    uu = np.asarray(u, dtype=np.float64)
    if y.shape != uu.shape:
        raise ValueError(f"u: shape {uu.shape} differs from the values' shape {y.shape}")
    if not np.all(np.isfinite(y)) or (y.size and float(np.max(np.abs(y))) >= _MAX_ABS):
        raise ValueError("values: must be finite with magnitude < 2**53")
    if uu.size and (float(uu.min()) < 0.0 or float(uu.max()) >= 1.0):
        raise ValueError("u: must lie in [0, 1)")
    low = np.floor(y)
    return low.astype(np.int64) + (uu < (y - low)).astype(np.int64)


def quantize(x: np.ndarray, *, clip: float, scale: float, stream: BitStream) -> np.ndarray:
    """``R((s/C)·x)`` as ``int64``, with the rounding uniforms drawn from ``stream``.

    Parameters
    ----------
    x : numpy.ndarray
        The client's clipped private sum (flattened, float).
    clip : float
        Clipping norm ``C``.
    scale : float
        ``s`` (from :func:`choose_scale`).
    stream : fedfdp.entropy.BitStream
        The client's secret bits (``OSBits()`` outside the reproducible test mode): the
        key of the rounding's keystream is read from it.
    """
    c = positive("clip", clip)
    s = positive("scale", scale)
    flat = np.asarray(x, dtype=np.float64).ravel()
    return randomized_round(flat * (s / c), uniforms(Keystream(stream), flat.size))


def to_ring(z: np.ndarray) -> np.ndarray:
    """``z mod 2³²`` as ``uint32`` (two's-complement wrap of ``int64``)."""
    arr = np.asarray(z)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"z: must be an integer array, got dtype {arr.dtype}")
    return (arr.astype(np.int64) & np.int64(MODULUS - 1)).astype(np.uint32)


def encode(x: np.ndarray, *, clip: float, scale: float, stream: BitStream) -> np.ndarray:
    """:func:`quantize` then :func:`to_ring`, without noise (for noise, add it to the
    ``int64`` output of :func:`quantize` before :func:`to_ring`).
    """
    return to_ring(quantize(x, clip=clip, scale=scale, stream=stream))


def from_ring(total: np.ndarray) -> np.ndarray:
    """A ring element read as a signed integer in [−2³¹, 2³¹): ``Y − 2³²·[Y ≥ 2³¹]`` (``int64``)."""
    arr = np.asarray(total)
    if arr.dtype != np.uint32:
        raise ValueError(f"total: must be a uint32 array, got dtype {arr.dtype}")
    signed = arr.astype(np.int64)
    return signed - np.int64(MODULUS) * (signed >= HALF)


def decode(total: np.ndarray, *, clip: float, scale: float) -> np.ndarray:
    """The aggregate in the original units: ``(C/s)·from_ring(total)`` (``float64``)."""
    c = positive("clip", clip)
    s = positive("scale", scale)
    return from_ring(total).astype(np.float64) * (c / s)
