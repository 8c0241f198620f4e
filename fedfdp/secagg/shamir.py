"""Shamir secret sharing of 32-byte secrets over the prime field GF(2³¹ − 1), in numpy.

A 32-byte secret (a seed ``b_u`` or an X25519 private key) is read as a 256-bit
big-endian integer and cut into :data:`LIMBS` = 9 limbs of :data:`LIMB_BITS` = 30 bits
(the last holds the top 16 bits); each limb is an element of GF(p), ``p = 2³¹ − 1``
(a Mersenne prime), and is shared with its own polynomial of degree ``t − 1`` whose
constant term is the limb and whose other ``t − 1`` coefficients are independent and
uniform on GF(p). A share at index ``x`` (``1 ≤ x ≤ 65535 < p``) is the nine
polynomials' values at ``x``.

Every secret of a call is shared at once (arrays of shape ``(count, secrets, LIMBS)``,
Horner's rule over the ``t − 1`` coefficients), and reconstruction computes the
Lagrange coefficients at zero once per set of indices and applies them to every
secret shared at those indices (one matrix-vector product modulo ``p`` per set).

Arithmetic
----------
Field elements are ``uint64`` values in ``[0, p)``: a product of two is below 2⁶², a
product of an element and an index below 2⁴⁷, so no intermediate overflows; sums of
reduced products are reduced after at most 2¹⁶ terms (< 2⁴⁷). Limbs of 30 bits are
below ``p``, so every secret has exactly one encoding, and a reconstruction whose limbs
do not fit (some limb ≥ 2³⁰, or the top one ≥ 2¹⁶) proves the shares inconsistent: it
is refused (:class:`ValueError`) instead of returning an unrelated secret.

Security
--------
Information-theoretic: for any ``t − 1`` distinct non-zero indices, the shares are
uniform on GF(p)^(9·(t−1)) whatever the secret (the ``t − 1`` random coefficients of
each limb's polynomial are in bijection with its values at those indices). The
coefficients come from the operating system's CSPRNG (:func:`os.urandom`), 31-bit
words with the one value ``≥ p`` rejected and drawn again, so each is exactly uniform;
nothing here takes a seed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

#: The field's prime ``p = 2³¹ − 1``.
PRIME = 2**31 - 1
#: Bits per limb of a secret.
LIMB_BITS = 30
#: Bytes of a shared secret.
SECRET_BYTES = 32
#: Limbs per secret: ``⌈256 / 30⌉``.
LIMBS = -(-8 * SECRET_BYTES // LIMB_BITS)
#: Bytes of one serialised field element (big-endian).
ELEMENT_BYTES = 4
#: Bytes of one share's value: one element per limb.
SHARE_VALUE_BYTES = LIMBS * ELEMENT_BYTES
#: Largest share index (indices travel on two bytes).
MAX_INDEX = 2**16 - 1

_P = np.uint64(PRIME)
_LIMB_MASK = (1 << LIMB_BITS) - 1
_TOP_BITS = 8 * SECRET_BYTES - LIMB_BITS * (LIMBS - 1)


def random_elements(shape: tuple[int, ...]) -> np.ndarray:
    """Independent uniform elements of GF(p) (``uint64``) from :func:`os.urandom`.

    Each is a 31-bit word of the CSPRNG; the one word ``≥ p`` (``2³¹ − 1``) is
    rejected and drawn again, so the result is exactly uniform on ``[0, p)``.
    """
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.uint64)
    filled = 0
    while filled < n:
        need = n - filled
        words = np.frombuffer(os.urandom(4 * need), dtype="<u4") & np.uint32(0x7FFFFFFF)
        ok = words[words < np.uint32(PRIME)]
        out[filled : filled + ok.size] = ok
        filled += ok.size
    return out.reshape(shape)


def to_limbs(secrets: Sequence[bytes]) -> np.ndarray:
    """The limbs of each 32-byte secret, least significant first: ``(len(secrets), LIMBS)``
    ``uint64``.
    """
    out = np.empty((len(secrets), LIMBS), dtype=np.uint64)
    for i, secret in enumerate(secrets):
        if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            got = f"{len(secret)} bytes" if isinstance(secret, bytes) else type(secret).__name__
            raise ValueError(f"secret: must be {SECRET_BYTES} bytes, got {got}")
        value = int.from_bytes(secret, "big")
        out[i] = [(value >> (LIMB_BITS * j)) & _LIMB_MASK for j in range(LIMBS)]
    return out


def limbs_valid(limbs: np.ndarray) -> np.ndarray:
    """Whether each row of ``(secrets, LIMBS)`` limbs encodes a 32-byte secret (every limb
    within its bits), as a boolean array.
    """
    arr = np.asarray(limbs, dtype=np.uint64)
    if arr.ndim != 2 or arr.shape[1] != LIMBS:
        raise ValueError(f"limbs: must have shape (secrets, {LIMBS}), got {arr.shape}")
    return ~((arr[:, :-1] > np.uint64(_LIMB_MASK)).any(axis=1) | (arr[:, -1] >= np.uint64(1 << _TOP_BITS)))


def from_limbs(limbs: np.ndarray) -> list[bytes]:
    """Inverse of :func:`to_limbs`.

    Raises
    ------
    ValueError
        A limb does not fit its bits (the shares it came from are inconsistent).
    """
    arr = np.asarray(limbs, dtype=np.uint64)
    bad = ~limbs_valid(arr)
    if bad.any():
        raise ValueError(f"shares of secret {int(np.argmax(bad))}: inconsistent (they reconstruct no "
                         f"{SECRET_BYTES}-byte secret)")
    out = []
    for row in arr.tolist():
        value = 0
        for j in reversed(range(LIMBS)):
            value = (value << LIMB_BITS) | row[j]
        out.append(value.to_bytes(SECRET_BYTES, "big"))
    return out


def split(limbs: np.ndarray, threshold: int, count: int) -> np.ndarray:
    """Shares at indices ``1..count`` of every limb of every secret, any ``threshold`` of
    which reconstruct: ``(count, secrets, LIMBS)`` ``uint64``, row ``i`` at index ``i + 1``.

    Parameters
    ----------
    limbs : numpy.ndarray
        ``(secrets, LIMBS)`` elements (:func:`to_limbs`).
    threshold : int
        ``t`` in ``[1, count]``: the polynomials have degree ``t − 1``.
    count : int
        Number of shares, in ``[1, MAX_INDEX]``.
    """
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_INDEX:
        raise ValueError(f"count={count!r}: must be an integer in [1, {MAX_INDEX}]")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= count:
        raise ValueError(f"threshold={threshold!r}: must be an integer in [1, count={count}]")
    secrets = np.asarray(limbs, dtype=np.uint64)
    if secrets.ndim != 2 or bool((secrets >= _P).any()):
        raise ValueError("limbs: must be a 2-D array of field elements")
    coefficients = random_elements((threshold - 1, *secrets.shape))
    x = np.arange(1, count + 1, dtype=np.uint64).reshape(count, 1, 1)
    acc = np.broadcast_to(coefficients[-1] if threshold > 1 else secrets, (count, *secrets.shape)).copy()
    # Horner, highest degree first: acc·x < 2⁴⁷, plus an element < 2³¹
    for j in range(threshold - 3, -2, -1):
        term = coefficients[j] if j >= 0 else secrets
        acc *= x
        acc += term
        acc %= _P
    del coefficients
    return acc


def lagrange_at_zero(indices: Sequence[int]) -> np.ndarray:
    """The Lagrange coefficients ``λ_i = Π_{j≠i} x_j / (x_j − x_i)`` mod ``p`` of the
    distinct indices ``x`` at zero (``uint64``), so that ``f(0) = Σ λ_i f(x_i)`` for every
    polynomial of degree below ``len(indices)``.
    """
    xs = [int(x) for x in indices]
    if not xs:
        raise ValueError("indices: at least one share is needed")
    if len(set(xs)) != len(xs):
        raise ValueError(f"share indices={xs}: must be distinct")
    if any(not 1 <= x <= MAX_INDEX for x in xs):
        raise ValueError(f"share indices={xs}: must lie in [1, {MAX_INDEX}]")
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return np.array(out, dtype=np.uint64)


def interpolate(indices: Sequence[int], shares: np.ndarray) -> np.ndarray:
    """Every secret's limbs from its shares at ``indices``: ``shares`` has shape
    ``(len(indices), secrets, LIMBS)``; returns ``(secrets, LIMBS)`` (the same Lagrange
    coefficients for every secret).
    """
    values = np.asarray(shares, dtype=np.uint64)
    if values.ndim != 3 or values.shape[0] != len(indices) or values.shape[2] != LIMBS:
        raise ValueError(f"shares: shape {values.shape} for {len(indices)} indices of {LIMBS} limbs")
    if bool((values >= _P).any()):
        raise ValueError("shares: must be field elements (< 2**31 - 1)")
    lam = lagrange_at_zero(indices)
    total = np.zeros(values.shape[1:], dtype=np.uint64)
    for i in range(len(indices)):  # each product < 2⁶², reduced before it is added
        total += (values[i] * lam[i]) % _P
        if i % 4096 == 4095:
            total %= _P
    total %= _P
    return total


def encode_elements(values: np.ndarray) -> bytes:
    """Field elements as big-endian 4-byte words."""
    return np.asarray(values, dtype=np.uint64).astype(">u4").tobytes()


def decode_elements(raw: bytes) -> np.ndarray:
    """Inverse of :func:`encode_elements` (``uint64``).

    Raises
    ------
    ValueError
        A length that is not a multiple of 4, or a word that is not a field element.
    """
    if len(raw) % ELEMENT_BYTES:
        raise ValueError(f"{len(raw)} bytes: not whole {ELEMENT_BYTES}-byte field elements")
    words = np.frombuffer(raw, dtype=">u4").astype(np.uint64)
    if bool((words >= _P).any()):
        raise ValueError(f"a word is not an element of GF(2**31 - 1) (must be < {PRIME})")
    return words
