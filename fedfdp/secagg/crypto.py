"""Cryptographic primitives of SecAgg+: key agreement, key derivation, authenticated
encryption, Shamir sharing of 32-byte secrets and the mask PRG.

Everything here calls the maintained ``cryptography`` library directly (X25519,
HKDF-SHA256, AES-256-GCM, AES-256-CTR); Shamir sharing is numpy over GF(2³¹ − 1)
(:mod:`fedfdp.secagg.shamir`, every secret of a call at once); Flower's
secure-aggregation helpers are not used.

Security model
--------------
The protocol built on these primitives (:mod:`fedfdp.secagg.session`; Bonawitz et
al., CCS 2017, with the sparse neighbour graph of Bell et al., CCS 2020) protects the
clients' inputs from a server that may deviate from the protocol and collude with
fewer than ``t`` clients of any neighbourhood (identities and the consistency check:
:mod:`fedfdp.secagg.identity`). It rests on computational assumptions: the
hardness of the computational Diffie-Hellman problem on Curve25519 (X25519), HKDF
with HMAC-SHA256 as a key-derivation function, AES-256 as a pseudo-random function
(the CTR keystream of the masks), the IND-CPA/INT-CTXT security of AES-256-GCM, and
HMAC-SHA256 as a MAC (the confirmations between neighbours). Shamir sharing is
information-theoretic: fewer than ``t`` shares reveal nothing. Out of scope: poisoning
by clients.

Secrets (private keys, seeds, Shamir coefficients, nonces) come from the operating
system's CSPRNG only: X25519 private keys, :func:`random_secret`, the AEAD nonces and
the Shamir coefficients (:func:`fedfdp.secagg.shamir.random_elements`) read
:func:`os.urandom`. Nothing here takes a seed.

Domain separation
-----------------
Every symmetric key is ``HKDF-SHA256(ikm, salt=None, info)`` with
``info = b"fedfdp/secagg/v1/" + purpose + b"/" + round ‖ first ‖ second`` (three
8-byte big-endian integers), so keys for different purposes, rounds or node pairs are
independent. Pairwise mask keys use the *sorted* pair (both ends derive the same
key); encryption keys use the directed pair (source, destination). Mask keys (pairwise
and self) take the round digest — the hash of the model and parameters the node
received (:func:`fedfdp.secagg.identity.round_digest`) — as the HKDF salt: a node sent
a different model than its neighbours derives different masks, so their masks do not
cancel and the sum reveals nothing of its input (the model-inconsistency attack of
Pasquini et al., CCS 2022, yields noise).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from enum import Enum

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedfdp.secagg import shamir
from fedfdp.secagg.errors import AuthenticationError

#: Length of every secret, key and public key handled here, in bytes.
KEY_BYTES = 32
#: Length of an AES-GCM nonce (prepended to each ciphertext), in bytes.
NONCE_BYTES = 12
#: Length of an AES-GCM authentication tag, in bytes.
TAG_BYTES = 16
#: Length of a :class:`Share`'s value: one 4-byte element of GF(2³¹ − 1) per 30-bit
#: limb of the secret (:mod:`fedfdp.secagg.shamir`).
SHARE_VALUE_BYTES = shamir.SHARE_VALUE_BYTES
#: Length of a serialised :class:`Share`: a 2-byte index and its value.
SHARE_BYTES = 2 + SHARE_VALUE_BYTES
#: Largest Shamir share index (it is serialised on two bytes).
MAX_SHARES = shamir.MAX_INDEX
#: Largest node id (Flower node ids are unsigned 64-bit integers).
MAX_NODE_ID = 2**64 - 1
#: Length of an HMAC-SHA256 tag, in bytes.
MAC_BYTES = 32

_INFO_PREFIX = b"fedfdp/secagg/v1/"
_SHARE_WORDS = struct.Struct(f">{shamir.LIMBS}I")
_U64 = 2**64


class KeyPurpose(Enum):
    """What a derived symmetric key is used for (part of the HKDF info string)."""

    #: Pairwise mask PRG key from the X25519 secret of the mask key pairs.
    MASK = "pair-mask"
    #: Self-mask PRG key from a node's seed ``b_u``.
    SELF_MASK = "self-mask"
    #: AES-GCM key for the share ciphertexts, from the encryption key pairs.
    ENCRYPTION = "share-encryption"
    #: HMAC key of two neighbours' confirmations, from the encryption key pairs.
    CONFIRMATION = "confirmation"


def _u64(name: str, value: int) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value < _U64:
        raise ValueError(f"{name}={value!r}: must be an integer in [0, 2**64)")
    return int(value).to_bytes(8, "big")


def _key(name: str, value: bytes) -> bytes:
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise ValueError(f"{name}: must be {KEY_BYTES} bytes, got {got}")
    return value


def random_secret() -> bytes:
    """32 bytes from the operating system's CSPRNG (a seed ``b_u``)."""
    return os.urandom(KEY_BYTES)


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair.

    Attributes
    ----------
    private : X25519PrivateKey
    public : bytes
        The 32-byte raw public key (what is sent to the server).
    """

    private: X25519PrivateKey
    public: bytes

    @staticmethod
    def generate() -> KeyPair:
        """A fresh key pair whose private key is 32 bytes of :func:`os.urandom`
        (X25519 clamps them, RFC 7748 §5).
        """
        return KeyPair.from_private_bytes(os.urandom(KEY_BYTES))

    @staticmethod
    def from_private_bytes(raw: bytes) -> KeyPair:
        """The key pair whose raw private key is ``raw`` (32 bytes)."""
        private = X25519PrivateKey.from_private_bytes(_key("private key", raw))
        return KeyPair(private, private.public_key().public_bytes_raw())

    def private_bytes(self) -> bytes:
        """The raw 32-byte private key (what is secret-shared)."""
        return self.private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def agree(self, peer_public: bytes) -> bytes:
        """The X25519 shared secret with the holder of ``peer_public``.

        Raises
        ------
        ValueError
            ``peer_public`` is not 32 bytes, or is a low-order point (all-zero secret).
        """
        peer = X25519PublicKey.from_public_bytes(_key("peer public key", peer_public))
        return self.private.exchange(peer)


def derive_key(secret: bytes, purpose: KeyPurpose, round_: int, first: int, second: int,
               salt: bytes | None = None) -> bytes:
    """A 32-byte key ``HKDF-SHA256(secret, salt, info(purpose, round_, first, second))``.

    Parameters
    ----------
    secret : bytes
        Input keying material: an X25519 shared secret or a seed (32 bytes).
    purpose : KeyPurpose
    round_ : int
        Round number (binds the key to one round).
    first, second : int
        Node ids. The caller orders them: sorted for a pairwise mask key,
        (source, destination) for an encryption key, (u, u) for a self mask.
    salt : bytes, optional
        HKDF salt (the round digest for mask keys); None: HKDF's default.
    """
    if not isinstance(purpose, KeyPurpose):
        raise ValueError(f"purpose={purpose!r}: must be a KeyPurpose")
    info = (
        _INFO_PREFIX
        + purpose.value.encode()
        + b"/"
        + _u64("round", round_)
        + _u64("first node id", first)
        + _u64("second node id", second)
    )
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info)
    return hkdf.derive(_key("secret", secret))


def pair_mask_key(shared_secret: bytes, round_: int, u: int, v: int, *, digest: bytes) -> bytes:
    """The pairwise mask key of nodes ``u`` and ``v`` (symmetric in ``u``, ``v``) for the
    round digest ``digest`` (the HKDF salt).
    """
    if u == v:
        raise ValueError(f"u=v={u}: a pairwise mask needs two distinct nodes")
    lo, hi = (u, v) if u < v else (v, u)
    return derive_key(shared_secret, KeyPurpose.MASK, round_, lo, hi, salt=_key("digest", digest))


def self_mask_key(seed: bytes, round_: int, u: int, *, digest: bytes) -> bytes:
    """The key of node ``u``'s self mask, derived from its seed ``b_u`` and the round digest."""
    return derive_key(seed, KeyPurpose.SELF_MASK, round_, u, u, salt=_key("digest", digest))


def encryption_key(shared_secret: bytes, round_: int, src: int, dst: int) -> bytes:
    """The AES-256-GCM key for shares sent from ``src`` to ``dst`` in ``round_``."""
    return derive_key(shared_secret, KeyPurpose.ENCRYPTION, round_, src, dst)


def confirmation_key(shared_secret: bytes, round_: int, u: int, v: int) -> bytes:
    """The HMAC key with which neighbours ``u`` and ``v`` authenticate their confirmations
    to each other in ``round_`` (symmetric in ``u``, ``v``; from the encryption key pairs,
    whose public halves each signed with its roster identity).
    """
    if u == v:
        raise ValueError(f"u=v={u}: a confirmation key needs two distinct nodes")
    lo, hi = (u, v) if u < v else (v, u)
    return derive_key(shared_secret, KeyPurpose.CONFIRMATION, round_, lo, hi)


#: HKDF's salt when none is given: ``HashLen`` zero bytes (RFC 5869 §2.2).
_NO_SALT = bytes(32)
_ROUND_PAIR = struct.Struct(">QQQ")


def neighbour_keys(shared_secret: bytes, round_: int, u: int, v: int) -> tuple[bytes, bytes, bytes]:
    """Node ``u``'s three keys with its neighbour ``v`` from the X25519 secret of their
    encryption key pairs: the confirmation key, the key of the shares ``u`` sends ``v``
    and the key of the shares ``v`` sends ``u`` — byte for byte
    :func:`confirmation_key` ``(s, round_, u, v)``, :func:`encryption_key`
    ``(s, round_, u, v)`` and ``(s, round_, v, u)``, with one HKDF-Extract for the three
    (RFC 5869: ``PRK = HMAC(0³², s)``, each key ``HMAC(PRK, info ‖ 1)``).
    """
    if u == v:
        raise ValueError(f"u=v={u}: neighbour keys need two distinct nodes")
    if not all(type(x) is int and 0 <= x < _U64 for x in (round_, u, v)):
        for name, x in (("round", round_), ("u", u), ("v", v)):
            _u64(name, x)  # names a bad value (a numpy integer in range passes)
    lo, hi = (u, v) if u < v else (v, u)
    pairs = (_ROUND_PAIR.pack(round_, lo, hi), _ROUND_PAIR.pack(round_, u, v), _ROUND_PAIR.pack(round_, v, u))
    prk = hmac.digest(_NO_SALT, _key("secret", shared_secret), "sha256")
    purposes = (KeyPurpose.CONFIRMATION, KeyPurpose.ENCRYPTION, KeyPurpose.ENCRYPTION)
    confirm, send, receive = (
        hmac.digest(prk, _INFO_PREFIX + purpose.value.encode() + b"/" + pair + b"\x01", "sha256")
        for purpose, pair in zip(purposes, pairs, strict=True))
    return confirm, send, receive


def mac(key: bytes, message: bytes) -> bytes:
    """``HMAC-SHA256(key, message)`` (:data:`MAC_BYTES` bytes)."""
    return hmac.new(_key("key", key), message, hashlib.sha256).digest()


def mac_matches(key: bytes, message: bytes, tag: bytes) -> bool:
    """True when ``tag`` is :func:`mac` of ``message`` under ``key`` (constant-time compare)."""
    return hmac.compare_digest(mac(key, message), tag)


def _associated_data(round_: int, src: int, dst: int) -> bytes:
    return (
        _INFO_PREFIX
        + b"share/"
        + _u64("round", round_)
        + _u64("source node id", src)
        + _u64("destination node id", dst)
    )


def seal(key: bytes, plaintext: bytes, *, round_: int, src: int, dst: int) -> bytes:
    """AES-256-GCM encryption of ``plaintext`` with associated data (round, src, dst).

    Returns ``nonce ‖ ciphertext ‖ tag`` with a fresh random 12-byte nonce, i.e.
    ``len(plaintext) + 28`` bytes.
    """
    nonce = os.urandom(NONCE_BYTES)
    aad = _associated_data(round_, src, dst)
    return nonce + AESGCM(_key("key", key)).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, sealed: bytes, *, round_: int, src: int, dst: int) -> bytes:
    """Inverse of :func:`seal`.

    Raises
    ------
    AuthenticationError
        The bytes were altered, or the key, round, source or destination differ from
        those used to seal them.
    """
    if not isinstance(sealed, bytes) or len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise AuthenticationError(
            f"ciphertext from node {src} to node {dst}: too short", field="ciphertexts", node_id=src
        )
    aad = _associated_data(round_, src, dst)
    try:
        return AESGCM(_key("key", key)).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag:
        raise AuthenticationError(
            f"ciphertext from node {src} to node {dst} in round {round_} fails authentication "
            "(tampered, or wrong key or associated data)",
            field="ciphertexts",
            node_id=src,
        ) from None


@dataclass(frozen=True)
class Share:
    """One Shamir share of a 32-byte secret (:mod:`fedfdp.secagg.shamir`).

    Attributes
    ----------
    index : int
        The evaluation point, in [1, 65535].
    value : bytes
        :data:`SHARE_VALUE_BYTES` bytes: the values at ``index`` of the polynomials of
        the secret's nine limbs, each a big-endian 4-byte element of GF(2³¹ − 1).

    Raises
    ------
    ValueError
        An index out of range, a value of another length, or a word that is not a field
        element (below 2³¹ − 1): a malformed share is refused when it is built.
    """

    index: int
    value: bytes

    def __post_init__(self) -> None:
        if (
            isinstance(self.index, bool)
            or not isinstance(self.index, int)
            or not 1 <= self.index <= MAX_SHARES
        ):
            raise ValueError(f"share index={self.index!r}: must be an integer in [1, {MAX_SHARES}]")
        if not isinstance(self.value, bytes) or len(self.value) != SHARE_VALUE_BYTES:
            got = f"{len(self.value)} bytes" if isinstance(self.value, bytes) else type(self.value).__name__
            raise ValueError(f"share value: must be {SHARE_VALUE_BYTES} bytes, got {got}")
        if max(_SHARE_WORDS.unpack(self.value)) >= shamir.PRIME:
            raise ValueError(f"share value: a word is not an element of GF(2**31 - 1) (must be < "
                             f"{shamir.PRIME})")

    def to_bytes(self) -> bytes:
        """``index`` (2 bytes, big-endian) followed by ``value``: :data:`SHARE_BYTES` bytes."""
        return self.index.to_bytes(2, "big") + self.value

    @staticmethod
    def from_bytes(raw: bytes) -> Share:
        """Inverse of :meth:`to_bytes`."""
        if not isinstance(raw, bytes) or len(raw) != SHARE_BYTES:
            raise ValueError(f"share: must be {SHARE_BYTES} bytes")
        return Share(int.from_bytes(raw[:2], "big"), raw[2:])


def share_secrets(secrets: list[bytes] | tuple[bytes, ...], threshold: int, count: int) -> list[list[Share]]:
    """Split each 32-byte secret into ``count`` shares, any ``threshold`` of which recover
    it, all at once: ``out[i][j]`` is secret ``i``'s share at index ``j + 1``.

    Fewer than ``threshold`` shares carry no information about the secret (fresh uniform
    coefficients from the OS CSPRNG for every limb of every secret).
    """
    if not secrets:
        return []
    for secret in secrets:
        _key("secret", secret)
    values = shamir.split(shamir.to_limbs(list(secrets)), threshold, count)  # (count, secrets, limbs)
    raw = values.astype(">u4")
    return [[Share(j + 1, raw[j, i].tobytes()) for j in range(count)] for i in range(len(secrets))]


def share_secret(secret: bytes, threshold: int, count: int) -> list[Share]:
    """Split one 32-byte secret into ``count`` shares with indices ``1..count``, any
    ``threshold`` of which recover it (:func:`share_secrets`).
    """
    return share_secrets([secret], threshold, count)[0]


class InconsistentShares(ValueError):
    """Shares that reconstruct no 32-byte secret; ``group`` is the position of the first
    such group in the call to :func:`combine_many`.
    """

    def __init__(self, message: str, group: int) -> None:
        super().__init__(message)
        self.group = group


def combine_many(groups: list[list[Share]] | tuple[list[Share], ...]) -> list[bytes]:
    """The secret of each group of shares (Lagrange interpolation at 0).

    Groups are batched by their set of indices: the Lagrange coefficients are computed
    once per set and applied to every group with it. Each group holds exactly the
    threshold's number of shares with distinct indices; with fewer, the result is
    unrelated to the secret (or refused as inconsistent).

    Raises
    ------
    ValueError
        A group without shares or with repeated indices.
    InconsistentShares
        A group's shares reconstruct no 32-byte secret (some share is not what was
        dealt); names the group's position.
    """
    out: list[bytes | None] = [None] * len(groups)
    by_indices: dict[tuple[int, ...], list[int]] = {}
    for g, shares in enumerate(groups):
        indices = tuple(s.index for s in shares)
        if not indices:
            raise ValueError(f"shares of group {g}: at least one share is needed")
        if len(set(indices)) != len(indices):
            raise ValueError(f"share indices={list(indices)} of group {g}: must be distinct")
        by_indices.setdefault(indices, []).append(g)
    for indices, members in by_indices.items():
        blob = b"".join(s.value for g in members for s in groups[g])
        values = shamir.decode_elements(blob).reshape(len(members), len(indices), shamir.LIMBS)
        limbs = shamir.interpolate(indices, values.transpose(1, 0, 2))
        valid = shamir.limbs_valid(limbs)
        if not valid.all():
            first = members[int(np.argmin(valid))]
            raise InconsistentShares(f"shares of group {first}: inconsistent (they reconstruct no "
                                     f"{KEY_BYTES}-byte secret)", first)
        for g, secret in zip(members, shamir.from_limbs(limbs), strict=True):
            out[g] = secret
    return [s for s in out if s is not None]


def combine_shares(shares: list[Share] | tuple[Share, ...]) -> bytes:
    """The secret whose polynomials pass through ``shares`` (:func:`combine_many` of one
    group).
    """
    if not shares:
        raise ValueError("shares: at least one share is needed")
    return combine_many([list(shares)])[0]


def prg_uint32(key: bytes, dim: int) -> np.ndarray:
    """The mask ``PRG(key)``: ``dim`` words of the AES-256-CTR keystream under ``key``.

    The keystream (counter block starting at zero; each key is used for one mask only)
    is read as little-endian ``uint32``. Every word is uniform on [0, 2³²) under the
    PRF assumption on AES, with no modular bias because the word size equals the ring.
    """
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 0:
        raise ValueError(f"dim={dim!r}: must be an integer >= 0")
    encryptor = Cipher(algorithms.AES(_key("key", key)), modes.CTR(bytes(16))).encryptor()
    stream = encryptor.update(bytes(4 * int(dim))) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32, copy=True)
