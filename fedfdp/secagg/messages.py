"""The eight messages of one SecAgg+ round, as plain validated dataclasses.

Each stage is a request from the server to one client and the client's reply:

========== ======================= ====================== ===================================
stage      server → client         client → server        content
========== ======================= ====================== ===================================
setup      :class:`SetupRequest`   :class:`SetupReply`    parties, k, t, d / run and two public
                                                          keys, signed with the node's identity
share_keys :class:`KeysRequest`    :class:`KeysReply`     neighbours' signed keys / share
                                                          ciphertexts
collect    :class:`CollectRequest` :class:`CollectReply`  ciphertexts for it / masked vector
unmask     :class:`ConfirmRequest` :class:`ConfirmReply`  survivor and dead sets / signature,
                                                          a tag for each live neighbour
           :class:`UnmaskRequest`  :class:`UnmaskReply`   live and dead lists with the live
                                                          neighbours' tags / shares
========== ======================= ====================== ===================================

The unmask stage is two exchanges: the consistency check (every survivor signs the
survivor set, the dead set and the digest of what it received, and authenticates the
same to each live neighbour) and then the unmask proper, which a node answers only
with ``t`` matching confirmations from its neighbourhood.

Fields are ints, bytes, tuples of ints or bytes (parallel tuples instead of
mappings) and one ``uint32`` array, so the Flower layer can serialise them into a
``ConfigRecord`` and an ``ArrayRecord`` without knowing the protocol. Node ids are
unsigned 64-bit integers. Construction validates what a message can check on its own
(types, byte lengths, parallel lengths, duplicate ids) and raises
:class:`~fedfdp.secagg.errors.MessageError` naming the field; the sessions check the
rest (round, addressee, known ids) on receipt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfdp.secagg.crypto import (
    KEY_BYTES,
    MAC_BYTES,
    MAX_NODE_ID,
    NONCE_BYTES,
    SHARE_BYTES,
    SHARE_VALUE_BYTES,
    TAG_BYTES,
)
from fedfdp.secagg.errors import MessageError
from fedfdp.secagg.identity import IDENTITY_BYTES, SIGNATURE_BYTES

#: Plaintext of one encrypted share pair: share index (2 bytes), the b-share's and the
#: sk-share's values (:data:`~fedfdp.secagg.crypto.SHARE_VALUE_BYTES` each).
SHARE_PLAINTEXT_BYTES = 2 + 2 * SHARE_VALUE_BYTES
#: Length of one share ciphertext: nonce, encrypted plaintext, tag.
CIPHERTEXT_BYTES = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + TAG_BYTES


def _int(msg: object, name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise MessageError(
            f"{type(msg).__name__}.{name}={value!r}: must be an integer in [{lo}, {hi}]", field=name
        )
    return int(value)


def _ids(msg: object, name: str, values: Any) -> tuple[int, ...]:
    if not isinstance(values, tuple | list):
        raise MessageError(f"{type(msg).__name__}.{name}: must be a tuple of node ids", field=name)
    if all(type(v) is int for v in values) and (not values or 0 <= min(values) <= max(values) <= MAX_NODE_ID):
        out = tuple(values)  # plain ints in range: what the per-id check below accepts, checked at once
    else:
        out = tuple(_int(msg, name, v, 0, MAX_NODE_ID) for v in values)
    if len(set(out)) != len(out):
        dup = sorted({v for v in out if out.count(v) > 1})
        raise MessageError(f"{type(msg).__name__}.{name}: duplicate node ids {dup}", field=name)
    return out


def _blob(msg: object, name: str, value: Any, length: int) -> bytes:
    if not isinstance(value, bytes) or len(value) != length:
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise MessageError(f"{type(msg).__name__}.{name}: must be {length} bytes, got {got}", field=name)
    return value


def _blobs(msg: object, name: str, values: Any, length: int, count: int, parallel: str) -> tuple[bytes, ...]:
    if not isinstance(values, tuple | list):
        raise MessageError(f"{type(msg).__name__}.{name}: must be a tuple of bytes", field=name)
    if len(values) != count:
        raise MessageError(
            f"{type(msg).__name__}.{name}: {len(values)} entries for {count} in {parallel}", field=name
        )
    if all(type(v) is bytes and len(v) == length for v in values):
        return tuple(values)  # what the per-item check below accepts, checked at once
    return tuple(_blob(msg, name, v, length) for v in values)


def _header(msg: Any) -> None:
    object.__setattr__(msg, "round", _int(msg, "round", msg.round, 0, MAX_NODE_ID))
    object.__setattr__(msg, "node_id", _int(msg, "node_id", msg.node_id, 0, MAX_NODE_ID))


@dataclass(frozen=True)
class SetupRequest:
    """Stage 0, server → client: the round's parameters and who takes part.

    The node derives its neighbours itself
    (:func:`fedfdp.secagg.graph.neighbour_graph` of ``round``, ``degree`` and
    ``parties``).

    Attributes
    ----------
    round : int
    node_id : int
        The addressee.
    parties : tuple of int
        Every node sampled for the round (the addressee included).
    degree : int
        ``k``: each node's neighbourhood size (itself included; odd).
    threshold : int
        Shamir threshold ``t``.
    dim : int
        Length ``d`` of the vector to aggregate.
    """

    round: int
    node_id: int
    parties: tuple[int, ...]
    degree: int
    threshold: int
    dim: int

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "parties", _ids(self, "parties", self.parties))
        object.__setattr__(self, "degree", _int(self, "degree", self.degree, 3, 2**16 - 1))
        object.__setattr__(self, "threshold", _int(self, "threshold", self.threshold, 1, 2**16 - 1))
        object.__setattr__(self, "dim", _int(self, "dim", self.dim, 1, 2**40))


@dataclass(frozen=True)
class SetupReply:
    """Stage 0, client → server: the node's two X25519 public keys (32 bytes each), signed.

    Attributes
    ----------
    round, node_id : int
    run : int
        The node's run (bound into its signatures: another run's messages are refused).
    pk_mask : bytes
        Public key of the pairwise-mask key pair.
    pk_enc : bytes
        Public key of the share-encryption key pair.
    identity : bytes
        The node's long-term Ed25519 public key (on the roster).
    signature : bytes
        ``identity``'s signature of :func:`fedfdp.secagg.identity.advertisement`
        (run, round, node id, both keys).
    """

    round: int
    node_id: int
    run: int
    pk_mask: bytes
    pk_enc: bytes
    identity: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "run", _int(self, "run", self.run, 0, MAX_NODE_ID))
        _blob(self, "pk_mask", self.pk_mask, KEY_BYTES)
        _blob(self, "pk_enc", self.pk_enc, KEY_BYTES)
        _blob(self, "identity", self.identity, IDENTITY_BYTES)
        _blob(self, "signature", self.signature, SIGNATURE_BYTES)


@dataclass(frozen=True)
class KeysRequest:
    """Stage 1, server → client: the signed key advertisements of the neighbours that
    answered setup.

    Attributes
    ----------
    round, node_id : int
    ids : tuple of int
        Neighbours in U1.
    pk_mask, pk_enc : tuple of bytes
        Their public keys, parallel to ``ids``.
    identities, signatures : tuple of bytes
        Their Ed25519 identities and advertisement signatures, parallel to ``ids``.
    """

    round: int
    node_id: int
    ids: tuple[int, ...]
    pk_mask: tuple[bytes, ...]
    pk_enc: tuple[bytes, ...]
    identities: tuple[bytes, ...]
    signatures: tuple[bytes, ...]

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "ids", _ids(self, "ids", self.ids))
        n = len(self.ids)
        object.__setattr__(self, "pk_mask", _blobs(self, "pk_mask", self.pk_mask, KEY_BYTES, n, "ids"))
        object.__setattr__(self, "pk_enc", _blobs(self, "pk_enc", self.pk_enc, KEY_BYTES, n, "ids"))
        object.__setattr__(self, "identities",
                           _blobs(self, "identities", self.identities, IDENTITY_BYTES, n, "ids"))
        object.__setattr__(self, "signatures",
                           _blobs(self, "signatures", self.signatures, SIGNATURE_BYTES, n, "ids"))


@dataclass(frozen=True)
class KeysReply:
    """Stage 1, client → server: one share ciphertext per neighbour in U1.

    Attributes
    ----------
    round, node_id : int
        ``node_id`` is the sender (the source of every ciphertext).
    dsts : tuple of int
        Destinations.
    ciphertexts : tuple of bytes
        :data:`CIPHERTEXT_BYTES` each, parallel to ``dsts``.
    """

    round: int
    node_id: int
    dsts: tuple[int, ...]
    ciphertexts: tuple[bytes, ...]

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "dsts", _ids(self, "dsts", self.dsts))
        object.__setattr__(
            self,
            "ciphertexts",
            _blobs(self, "ciphertexts", self.ciphertexts, CIPHERTEXT_BYTES, len(self.dsts), "dsts"),
        )


@dataclass(frozen=True)
class CollectRequest:
    """Stage 2, server → client: the ciphertexts addressed to the node by neighbours in U2.

    Attributes
    ----------
    round, node_id : int
    srcs : tuple of int
        Senders.
    ciphertexts : tuple of bytes
        Parallel to ``srcs``.
    """

    round: int
    node_id: int
    srcs: tuple[int, ...]
    ciphertexts: tuple[bytes, ...]

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "srcs", _ids(self, "srcs", self.srcs))
        object.__setattr__(
            self,
            "ciphertexts",
            _blobs(self, "ciphertexts", self.ciphertexts, CIPHERTEXT_BYTES, len(self.srcs), "srcs"),
        )


@dataclass(frozen=True)
class CollectReply:
    """Stage 2, client → server: the masked vector ``y_u`` (``uint32``, length ``d``).

    Attributes
    ----------
    round, node_id : int
    masked : numpy.ndarray
        One-dimensional ``uint32`` array (a read-only copy is kept).
    """

    round: int
    node_id: int
    masked: np.ndarray

    def __post_init__(self) -> None:
        _header(self)
        m = self.masked
        if not isinstance(m, np.ndarray) or m.dtype != np.uint32 or m.ndim != 1:
            desc = f"{m.dtype} array of shape {m.shape}" if isinstance(m, np.ndarray) else type(m).__name__
            raise MessageError(
                f"CollectReply.masked: must be a one-dimensional uint32 array, got {desc}",
                field="masked",
                node_id=self.node_id,
            )
        frozen = m.copy()
        frozen.setflags(write=False)
        object.__setattr__(self, "masked", frozen)


@dataclass(frozen=True)
class ConfirmRequest:
    """Stage 3 (first exchange), server → client: the round's survivor and dead sets,
    for the node to check and sign.

    Attributes
    ----------
    round, node_id : int
    live : tuple of int
        U3: every node whose masked vector is in the sum.
    dead : tuple of int
        U2 − U3: every node that shared its keys but sent no masked vector.
    """

    round: int
    node_id: int
    live: tuple[int, ...]
    dead: tuple[int, ...]

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "live", _ids(self, "live", self.live))
        object.__setattr__(self, "dead", _ids(self, "dead", self.dead))


@dataclass(frozen=True)
class ConfirmReply:
    """Stage 3 (first exchange), client → server: the node's confirmation of
    :func:`fedfdp.secagg.identity.confirmation` (run, round, both sets, the digest of
    the model and parameters it received), signed for the server and authenticated for
    each live neighbour.

    Attributes
    ----------
    round, node_id : int
    signature : bytes
        The node's Ed25519 signature of the confirmation (the server checks it before
        it charges the round).
    dsts : tuple of int
        Its live neighbours.
    macs : tuple of bytes
        For each, the HMAC of the confirmation under their pairwise confirmation key
        (:func:`fedfdp.secagg.crypto.confirmation_key`), parallel to ``dsts``.
    """

    round: int
    node_id: int
    signature: bytes
    dsts: tuple[int, ...] = ()
    macs: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        _header(self)
        _blob(self, "signature", self.signature, SIGNATURE_BYTES)
        object.__setattr__(self, "dsts", _ids(self, "dsts", self.dsts))
        object.__setattr__(self, "macs", _blobs(self, "macs", self.macs, MAC_BYTES, len(self.dsts), "dsts"))


@dataclass(frozen=True)
class UnmaskRequest:
    """Stage 3, server → client: which neighbours survived collect and which died, with
    the confirmations of the live ones.

    Attributes
    ----------
    round, node_id : int
    live : tuple of int
        Members of the node's neighbourhood in U3 (the node itself included): their
        self-mask seed shares are asked for.
    dead : tuple of int
        Neighbours in U2 − U3: their mask-key shares are asked for.
    signers : tuple of int
        The live neighbours that confirmed (with the node itself, at least ``t``; none:
        the node refuses).
    macs : tuple of bytes
        Their :class:`ConfirmReply` tags addressed to this node, parallel to ``signers``.
    """

    round: int
    node_id: int
    live: tuple[int, ...]
    dead: tuple[int, ...]
    signers: tuple[int, ...] = ()
    macs: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "live", _ids(self, "live", self.live))
        object.__setattr__(self, "dead", _ids(self, "dead", self.dead))
        object.__setattr__(self, "signers", _ids(self, "signers", self.signers))
        object.__setattr__(self, "macs",
                           _blobs(self, "macs", self.macs, MAC_BYTES, len(self.signers), "signers"))


@dataclass(frozen=True)
class UnmaskReply:
    """Stage 3, client → server: the shares asked for.

    Attributes
    ----------
    round, node_id : int
    b_owners : tuple of int
        Live nodes whose self-mask seed share follows.
    b_shares : tuple of bytes
        Serialised :class:`~fedfdp.secagg.crypto.Share` (:data:`SHARE_BYTES` each).
    sk_owners : tuple of int
        Dead nodes whose mask private-key share follows.
    sk_shares : tuple of bytes
    """

    round: int
    node_id: int
    b_owners: tuple[int, ...]
    b_shares: tuple[bytes, ...]
    sk_owners: tuple[int, ...]
    sk_shares: tuple[bytes, ...]

    def __post_init__(self) -> None:
        _header(self)
        object.__setattr__(self, "b_owners", _ids(self, "b_owners", self.b_owners))
        object.__setattr__(
            self,
            "b_shares",
            _blobs(self, "b_shares", self.b_shares, SHARE_BYTES, len(self.b_owners), "b_owners"),
        )
        object.__setattr__(self, "sk_owners", _ids(self, "sk_owners", self.sk_owners))
        object.__setattr__(
            self,
            "sk_shares",
            _blobs(self, "sk_shares", self.sk_shares, SHARE_BYTES, len(self.sk_owners), "sk_owners"),
        )
