"""The secret keystream of fedfdp.secagg.keystream against AES itself.

Reference: AES-256-CTR's keystream is the AES encryption of the successive counter
blocks ``nonce (8 bytes, big-endian) || counter (8 bytes, big-endian)``; here each block
is encrypted on its own in ECB mode under the key the keystream read from its source
(the source's first 4 words, little-endian).
"""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedfdp.entropy import SeededBits
from fedfdp.secagg.keystream import KEY_WORDS, Keystream


def source(seed: int) -> SeededBits:
    return SeededBits(np.random.SeedSequence(seed))


def reference(seed: int, nonce: int, words: int) -> np.ndarray:
    key = source(seed).words(KEY_WORDS).astype("<u8").tobytes()
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    blocks = b"".join(nonce.to_bytes(8, "big") + i.to_bytes(8, "big") for i in range((words + 1) // 2))
    return np.frombuffer(enc.update(blocks), dtype="<u8")[:words]


@pytest.mark.parametrize("seed", [0, 7])
def test_the_words_are_aes_ctr_under_the_key_read_from_the_source(seed: int) -> None:
    keys = Keystream(source(seed))
    got = np.concatenate([keys.words(1), keys.words(4), keys.words(0), keys.words(11)])
    assert np.array_equal(got, reference(seed, 0, 16))
    assert keys.generated == 16
    assert np.array_equal(keys.lane(1).words(6), reference(seed, 1, 6))


def test_lanes_and_keys_differ() -> None:
    a = Keystream(source(1))
    assert not np.array_equal(a.words(8), a.lane(1).words(8))
    assert not np.array_equal(Keystream(source(1)).words(8), Keystream(source(2)).words(8))


@pytest.mark.parametrize("bad", [0, -1, True, 2**64])
def test_a_bad_lane_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="index"):
        Keystream(source(0)).lane(bad)


def test_a_bad_count_is_refused() -> None:
    with pytest.raises(ValueError, match="n="):
        Keystream(source(0)).words(-1)
