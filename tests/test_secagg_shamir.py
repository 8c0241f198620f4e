"""Shamir sharing over GF(2³¹ − 1) (fedfdp.secagg.shamir, fedfdp.secagg.crypto).

References are independent of the code under test: Lagrange interpolation with Python
integers and ``pow(·, −1, p)`` (exact, no numpy), the polynomial evaluated by hand from
its coefficients, and PyCryptodome's Shamir over GF(2¹²⁸) on the same random secrets.
Statistical tests state their tolerance (false-failure probability per test).
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from Crypto.Protocol.SecretSharing import Shamir
from scipy import stats

from fedfdp.secagg import shamir
from fedfdp.secagg.crypto import (
    SHARE_BYTES,
    SHARE_VALUE_BYTES,
    InconsistentShares,
    Share,
    combine_many,
    combine_shares,
    random_secret,
    share_secret,
    share_secrets,
)

P = 2**31 - 1


def reference_combine(shares: list[Share]) -> bytes:
    """Lagrange at 0 with Python integers, limb by limb, then the 30-bit limbs reassembled."""
    xs = [s.index for s in shares]
    ys = [[int.from_bytes(s.value[4 * j : 4 * j + 4], "big") for j in range(9)] for s in shares]
    value = 0
    for j in range(9):
        limb = 0
        for i, xi in enumerate(xs):
            num = den = 1
            for m, xm in enumerate(xs):
                if m != i:
                    num, den = num * xm % P, den * (xm - xi) % P
            limb = (limb + ys[i][j] * num * pow(den, -1, P)) % P
        value |= limb << (30 * j)
    return value.to_bytes(32, "big")


def test_the_field_is_a_prime_below_2_31():
    assert shamir.PRIME == P
    assert all(pow(a, P - 1, P) == 1 for a in (2, 3, 5, 7, 11, 13, 1234567))  # Fermat witnesses
    assert P < 2**31 and (P - 1) * (P - 1) < 2**63  # products fit uint64 (and int64)
    assert SHARE_VALUE_BYTES == 36 and SHARE_BYTES == 38


@pytest.mark.parametrize(("t", "k"), [(1, 1), (2, 3), (3, 5), (8, 15), (11, 21)])
def test_reconstruction_matches_the_python_integer_reference(t, k):
    rng = np.random.default_rng(t * 100 + k)  # public: which subsets are tried
    for secret in (random_secret(), bytes(32), b"\xff" * 32):
        shares = share_secret(secret, t, k)
        assert [s.index for s in shares] == list(range(1, k + 1))
        for _ in range(5):
            pick = [shares[i] for i in rng.choice(k, t, replace=False)]
            assert reference_combine(pick) == secret
            assert combine_shares(pick) == secret
            assert Share.from_bytes(pick[0].to_bytes()) == pick[0]


def test_every_t_subset_reconstructs_and_shares_lie_on_one_polynomial():
    t, k = 3, 7
    secret = random_secret()
    shares = share_secret(secret, t, k)
    subsets = list(itertools.combinations(shares, t))
    assert combine_many([list(s) for s in subsets]) == [secret] * len(subsets)
    # degree t - 1: the polynomial through the first t shares predicts every other share
    for j in range(9):
        xs = [s.index for s in shares[:t]]
        ys = [int.from_bytes(s.value[4 * j : 4 * j + 4], "big") for s in shares[:t]]
        for other in shares[t:]:
            x = other.index
            pred = 0
            for i, xi in enumerate(xs):
                num = den = 1
                for m, xm in enumerate(xs):
                    if m != i:
                        num, den = num * (x - xm) % P, den * (xi - xm) % P
                pred = (pred + ys[i] * num * pow(den, -1, P)) % P
            assert pred == int.from_bytes(other.value[4 * j : 4 * j + 4], "big")


def test_the_same_secrets_as_pycryptodome_on_random_inputs():
    """PyCryptodome's Shamir over GF(2^128) (each 16-byte half) and ours over GF(2^31 - 1)
    recover the same secrets from the same choice of t indices, on random secrets."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        secret = os.urandom(32)
        t = int(rng.integers(1, 8))
        k = int(rng.integers(t, 16))
        pick = sorted(int(i) for i in rng.choice(k, t, replace=False))
        ours = share_secret(secret, t, k)
        theirs = [Shamir.split(t, k, secret[:16], ssss=False), Shamir.split(t, k, secret[16:], ssss=False)]
        expected = b"".join(Shamir.combine([theirs[h][i] for i in pick], ssss=False) for h in (0, 1))
        assert combine_shares([ours[i] for i in pick]) == expected == secret


def test_batched_sharing_is_independent_per_secret():
    secrets = [bytes(32)] * 4
    out = share_secrets(secrets, 3, 5)
    assert [len(s) for s in out] == [5] * 4
    assert len({s[0].value for s in out}) == 4  # fresh coefficients for every secret
    assert combine_many([s[:3] for s in out]) == secrets


def test_large_indices_and_extreme_values_do_not_overflow():
    secret = b"\xff" * 32
    limbs = shamir.to_limbs([secret])
    values = shamir.split(limbs, 3, shamir.MAX_INDEX)  # indices up to 65535
    assert values.dtype == np.uint64 and int(values.max()) < P
    top = [Share(x, shamir.encode_elements(values[x - 1, 0])) for x in (65533, 65534, 65535)]
    assert reference_combine(top) == secret == combine_shares(top)
    # many shares: the accumulation of reduced products stays exact
    big = share_secret(secret, 300, 400)
    assert combine_shares(big[100:]) == secret == reference_combine(big[100:])


def test_fewer_than_t_shares_do_not_recover_the_secret():
    secret = random_secret()
    shares = share_secret(secret, 4, 7)
    for pick in itertools.combinations(shares, 3):
        try:
            got = combine_shares(list(pick))
        except InconsistentShares:
            continue  # almost surely: the limbs do not fit their 30 bits
        assert got != secret


@pytest.mark.parametrize("t", [2, 4])
def test_t_minus_1_shares_are_uniform_whatever_the_secret(t):
    """Chi-square of the t − 1 shares' elements in 32 equal bins, for the all-zero and the
    all-ones secret (1,200 splits each, 9·(t − 1) elements per split), against the uniform
    law and against each other. Tolerance: each p-value > 1e-6 (false failure < 3e-6)."""
    n = 1200
    counts = []
    for secret in (bytes(32), b"\xff" * 32):
        limbs = shamir.to_limbs([secret] * n)
        values = shamir.split(limbs, t, t + 2)[1:t]  # indices 2..t: t - 1 shares
        bins = (values.ravel() * 32 // P).astype(np.int64)
        counts.append(np.bincount(bins, minlength=32))
        assert stats.chisquare(counts[-1]).pvalue > 1e-6
    assert stats.chi2_contingency(np.array(counts)).pvalue > 1e-6


def test_coefficients_come_from_the_os_csprng_not_numpy():
    np.random.seed(0)
    a = share_secret(bytes(32), 3, 5)
    np.random.seed(0)
    b = share_secret(bytes(32), 3, 5)
    assert a[0].value != b[0].value
    state = np.random.get_state()[1].copy()  # type: ignore[index]
    share_secret(bytes(32), 3, 5)
    assert np.array_equal(np.random.get_state()[1], state)  # type: ignore[index]
    elements = shamir.random_elements((100_000,))
    assert int(elements.max()) < P and elements.dtype == np.uint64


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (b"\x00" * 35, "36 bytes"),
        (b"\x7f\xff\xff\xff" + bytes(32), "element"),  # 2^31 - 1 = p is not an element
        (b"\xff\xff\xff\xff" + bytes(32), "element"),
    ],
)
def test_malformed_share_values_are_refused(value, match):
    with pytest.raises(ValueError, match=match):
        Share(1, value)
    with pytest.raises(ValueError):
        Share.from_bytes(b"\x00\x01" + value)
    with pytest.raises(ValueError, match="index"):
        Share(0, bytes(36))


def test_a_tampered_share_is_detected_or_changes_the_secret():
    secret = random_secret()
    shares = share_secret(secret, 3, 5)
    raw = bytearray(shares[0].value)
    raw[3] ^= 1
    bad = Share(shares[0].index, bytes(raw))
    try:
        got = combine_shares([bad, *shares[1:3]])
    except InconsistentShares as err:
        assert err.group == 0
    else:
        assert got != secret
    with pytest.raises(ValueError, match="distinct"):
        combine_shares([shares[0], shares[0], shares[1]])
