"""A party's secret keystream: AES-256 in counter mode, keyed from its secret bits.

A sampler that needs many secret random words per call reads a 256-bit key from the
party's :class:`~fedfdp.entropy.BitStream` (its OS CSPRNG, or the seeded stream under
``reproducible-noise``) and expands it with AES-256-CTR (the ``cryptography``
package). The words are indistinguishable from uniform to anyone without the key
(AES as a pseudorandom permutation; counter mode up to ``2⁶⁴`` blocks per lane), the
key never leaves the call, and the expansion costs about a nanosecond per byte
instead of a system call per read.

Lanes: one key drives independent streams that differ in the nonce (the high 64
bits of the initial counter block), e.g. the public-size work of a sampler on lane 0
and its rare exact refinements on lane 1, so that the words the first lane yields
stay a public count whatever the second one needs.

Examples
--------
>>> import numpy as np
>>> from fedfdp.entropy import SeededBits
>>> ks = Keystream(SeededBits(np.random.SeedSequence(3)))
>>> a = ks.words(4)
>>> a.dtype, a.shape, ks.generated
(dtype('uint64'), (4,), 4)
>>> bool((ks.lane(1).words(4) != a).any())
True
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from fedfdp.entropy import BitStream

__all__ = ["KEY_WORDS", "Keystream"]

#: 64-bit words of the source read for one key (AES-256).
KEY_WORDS = 4


class Keystream:
    """Uniform 64-bit words from AES-256-CTR under a key read from ``source``.

    Implements :class:`~fedfdp.entropy.BitStream`. ``generated`` counts the words this
    lane has yielded (the work it did, in words).

    Parameters
    ----------
    source : BitStream
        The secret bits: :data:`KEY_WORDS` words are read once, as the key.
    """

    def __init__(self, source: BitStream) -> None:
        self._key = np.asarray(source.words(KEY_WORDS), dtype="<u8").tobytes()
        self._lane = 0
        self._enc = _encryptor(self._key, 0)
        self._zeros = np.zeros(0, dtype=np.uint8)
        self.generated = 0

    def lane(self, index: int) -> Keystream:
        """An independent stream under the same key (nonce ``index``, ``>= 1``)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index < 2**64:
            raise ValueError(f"index={index!r}: must be an integer in [1, 2^64)")
        other = object.__new__(Keystream)
        other._key = self._key
        other._lane = index
        other._enc = _encryptor(self._key, index)
        other._zeros = np.zeros(0, dtype=np.uint8)
        other.generated = 0
        return other

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` words of this lane, as ``uint64``."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ValueError(f"n={n!r}: must be an integer >= 0")
        n = int(n)
        nbytes = 8 * n
        if self._zeros.size < nbytes:
            self._zeros = np.zeros(max(nbytes, 2 * self._zeros.size), dtype=np.uint8)
        out = np.empty(n + 2, dtype=np.uint64)  # update_into wants 15 spare bytes
        self._enc.update_into(memoryview(self._zeros.data)[:nbytes], memoryview(out.data).cast("B"))
        self.generated += n
        return out[:n]

    def one(self) -> int:
        """One word as a Python ``int``."""
        return int(self.words(1)[0])


def _encryptor(key: bytes, nonce: int) -> CipherContext:
    block = nonce.to_bytes(8, "big") + bytes(8)
    return Cipher(algorithms.AES(key), modes.CTR(block)).encryptor()
