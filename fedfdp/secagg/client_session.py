"""The client's side of one SecAgg+ round (the protocol: :mod:`fedfdp.secagg.session`)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from enum import Enum
from functools import lru_cache
from typing import Any

import numpy as np

from fedfdp.secagg.crypto import (
    SHARE_VALUE_BYTES,
    KeyPair,
    Share,
    mac,
    mac_matches,
    neighbour_keys,
    open_sealed,
    pair_mask_key,
    prg_uint32,
    random_secret,
    seal,
    self_mask_key,
    share_secrets,
)
from fedfdp.secagg.errors import (
    ConsistencyError,
    MessageError,
    RequestRefused,
    Stage,
    ThresholdError,
)
from fedfdp.secagg.graph import graph_seed, is_connected, ring_neighbours, ring_order
from fedfdp.secagg.identity import DIGEST_BYTES, NodeTrust, advertisement, confirmation, verify
from fedfdp.secagg.messages import (
    SHARE_PLAINTEXT_BYTES,
    CollectReply,
    CollectRequest,
    ConfirmReply,
    ConfirmRequest,
    KeysReply,
    KeysRequest,
    SetupReply,
    SetupRequest,
    UnmaskReply,
    UnmaskRequest,
)
from fedfdp.secagg.packing import Reader, pack_blob, pack_id_map, pack_ids, pack_optional
from fedfdp.secagg.session import check_node_id


@lru_cache(maxsize=16)
def _ring(round_: int, degree: int, parties: frozenset[int]) -> tuple[int, ...]:
    """The round's ring (:func:`~fedfdp.secagg.graph.ring_order`): a function of public
    values only, computed once per process for all the nodes it serves.
    """
    return ring_order(graph_seed(round_, degree, parties), parties)


@lru_cache(maxsize=16)
def _connected(ring: tuple[int, ...], degree: int, live: frozenset[int]) -> bool:
    """Whether ``live`` induces a connected subgraph of the ring's graph (public values
    only, so computed once per process for all the nodes it serves).
    """
    return is_connected(ring_neighbours(ring, degree), live)


@lru_cache(maxsize=4096)
def _verified(identity: bytes, advert: bytes, signature: bytes) -> bool:
    """:func:`~fedfdp.secagg.identity.verify` of a neighbour's signed advertisement, memoised
    on the exact bytes: the same check, once per process for a signature that several of
    the nodes it serves verify (the ``k − 1`` neighbours of a node check its one signature).
    """
    return verify(identity, advert, signature)


class _ClientPhase(Enum):
    NEW = "new"
    SET_UP = "set up"
    KEYS_SHARED = "keys shared"
    COLLECTED = "collected"
    CONFIRMED = "confirmed"
    FINISHED = "finished"
    ABORTED = "aborted"


#: The phase a session must be in to answer each stage's request.
_NEXT = {
    Stage.SETUP: _ClientPhase.NEW,
    Stage.SHARE_KEYS: _ClientPhase.SET_UP,
    Stage.COLLECT: _ClientPhase.KEYS_SHARED,
    Stage.UNMASK: _ClientPhase.CONFIRMED,
}


_PHASES = tuple(_ClientPhase)
#: The binary state's version and header (export_state): version, phase, node id, round,
#: run, last unmasked round, degree, threshold, dimension.
_STATE_VERSION = 1
_STATE_HEAD = struct.Struct(">BBQqQqIIQ")

class ClientSession:
    """One client's side of one SecAgg+ round, against a server that may deviate.

    Call :meth:`setup`, :meth:`share_keys`, :meth:`collect` (with the ``uint32`` input
    ``x_u`` and the digest of what the node received), :meth:`confirm` and
    :meth:`unmask` in order, once each, with the server's requests. Any refused or
    invalid request ends the session: its secrets are wiped and every later call
    raises :class:`~fedfdp.secagg.errors.RequestRefused`.

    What the node checks, so that a server that swaps keys, adds sybils, sends
    different models or survivor sets to different nodes, or isolates a node is
    refused before any share leaves (Bonawitz et al. 2017 §active security; Bell et
    al. 2020):

    * setup: the round is later than the last one it unmasked (no replay; the run is
      bound into every signature, so no other run's messages verify), it is among the
      parties, ``k`` and ``t`` are sound, and there are
      at least ``trust.min_survivors`` parties; its neighbours are *derived*
      (:func:`fedfdp.secagg.graph.neighbour_graph`), not taken from the server;
    * share_keys: each neighbour's key advertisement is signed by a distinct roster
      key other than its own (:mod:`fedfdp.secagg.identity`);
    * confirm: the survivor set ``U3`` and dead set are disjoint, include itself as
      live, have at least ``trust.min_survivors`` survivors, induce a connected graph
      (no partial sums), and account exactly for the neighbours whose shares it
      received; it then signs them with the digest of the model and parameters it
      received;
    * unmask: the request lists exactly its neighbourhood's part of the confirmed sets,
      and, with itself, at least ``t`` live members of its neighbourhood confirmed the
      same (a node that drops after collect need not). A neighbour's confirmation
      reaches it as an HMAC under their pairwise key from the X25519 keys that
      neighbour's roster identity signed at setup — the server, which knows neither
      private key, cannot forge it — so checking ``t − 1`` of them costs microseconds,
      not signature verifications. It answers once.

    Secrets (two X25519 private keys, the seed ``b_u``, the Shamir coefficients) come
    from the OS CSPRNG; the private keys and ``b_u`` are dropped after collect, the
    shares after unmask. The long-term signing key is in ``trust``; like every other
    secret it is part of :meth:`export_state`, which stays with the node.

    Parameters
    ----------
    node_id : int
        This node's id (unsigned 64-bit).
    trust : NodeTrust
        The node's signing key, roster and survivor floor: what it brings from outside
        the server (a node policy builds it, ``clients.secagg_handlers``).
    run : int
        The run this node takes part in (bound into every signature).
    after_round : int
        The last round this node unmasked (``-1``: none); a setup for a round not after
        it is a replay and is refused.
    """

    def __init__(self, node_id: int, trust: NodeTrust, *, run: int, after_round: int = -1) -> None:
        self.node_id = check_node_id("node_id", node_id)
        if not isinstance(trust, NodeTrust):
            raise ValueError(f"trust={trust!r}: must be a NodeTrust")
        self.trust = trust
        self._trust_raw: bytes | None = None  # the trust's JSON, written once (export_state)
        self.run = check_node_id("run", run)
        if isinstance(after_round, bool) or not isinstance(after_round, int) or after_round < -1:
            raise ValueError(f"after_round={after_round!r}: must be an integer >= -1")
        self.after_round = after_round
        self._phase = _ClientPhase.NEW
        self._clear()

    def _clear(self) -> None:
        self._round = -1
        self._ring: tuple[int, ...] = ()  # the parties in the round's ring order
        self._degree = 0
        self._neighbours: frozenset[int] = frozenset()
        self._identities: dict[int, bytes] = {}
        self._confirm_keys: dict[int, bytes] = {}
        self._open_keys: dict[int, bytes] = {}  # AES-GCM keys of the shares each neighbour sends
        self._srcs: frozenset[int] = frozenset()
        self._digest: bytes | None = None
        self._live: frozenset[int] = frozenset()
        self._dead: frozenset[int] = frozenset()
        self._threshold = 0
        self._dim = 0
        self._index: dict[int, int] = {}
        self._mask_keys: KeyPair | None = None
        self._enc_keys: KeyPair | None = None
        self._seed: bytes | None = None
        self._peer_pk_mask: dict[int, bytes] = {}
        self._peer_pk_enc: dict[int, bytes] = {}
        self._own_b_share: Share | None = None
        self._held_b: dict[int, Share] = {}
        self._held_sk: dict[int, Share] = {}

    @property
    def round(self) -> int:
        """The round of the session (``-1`` before setup and after it ends)."""
        return self._round

    @property
    def finished(self) -> bool:
        """True once the node has answered unmask (or the session was aborted)."""
        return self._phase in (_ClientPhase.FINISHED, _ClientPhase.ABORTED)

    # -- stages --------------------------------------------------------------------------

    def setup(self, request: SetupRequest) -> SetupReply:
        """Stage 0: check the parameters, derive the neighbours, draw the two key pairs and
        sign their advertisement.
        """
        self._enter(Stage.SETUP, request, SetupRequest)
        try:
            if request.round <= self.after_round:
                raise RequestRefused(f"node {self.node_id}: setup for round {request.round}, not after round "
                                     f"{self.after_round} it already unmasked (a replay); refused")
            parties = frozenset(request.parties)
            if self.node_id not in parties:
                raise MessageError(f"SetupRequest.parties: does not list this node {self.node_id}",
                                   field="parties", node_id=self.node_id)
            n, k, t = len(parties), request.degree, request.threshold
            if k % 2 == 0 or not 3 <= k <= n:
                raise RequestRefused(f"node {self.node_id}: degree k={k} must be odd in [3, n={n}]; refused")
            if not k // 2 + 1 <= t <= k:
                raise RequestRefused(
                    f"node {self.node_id}: threshold t={t} for a neighbourhood of k={k} is outside "
                    f"[{k // 2 + 1}, {k}] (a minority threshold would let the server collect both shares)"
                )
            if n < self.trust.min_survivors:
                raise RequestRefused(f"node {self.node_id}: {n} parties, fewer than the "
                                     f"{self.trust.min_survivors} survivors this node requires; refused")
            self._round = request.round
            self._ring = _ring(self._round, k, parties)
            self._degree = k
            at, half = self._ring.index(self.node_id), k // 2  # ring_neighbours, for this node only
            self._neighbours = frozenset(self._ring[(at + j) % n] for j in range(-half, half + 1) if j != 0)
            self._threshold = t
            self._dim = request.dim
            self._index = {v: i + 1 for i, v in enumerate(sorted(self._neighbours | {self.node_id}))}
            self._mask_keys = KeyPair.generate()
            self._enc_keys = KeyPair.generate()
            signature = self.trust.signing_key.sign(advertisement(
                self.run, self._round, self.node_id, self._mask_keys.public, self._enc_keys.public))
            self._phase = _ClientPhase.SET_UP
            return SetupReply(self._round, self.node_id, self.run, self._mask_keys.public,
                              self._enc_keys.public, self.trust.signing_key.public, signature)
        except BaseException:
            self._abort()
            raise

    def share_keys(self, request: KeysRequest) -> KeysReply:
        """Stage 1: draw ``b_u``, share it and the mask key, encrypt a share pair per neighbour."""
        self._enter(Stage.SHARE_KEYS, request, KeysRequest)
        try:
            self._known("ids", request.ids, self._neighbours)
            self._enough(Stage.SHARE_KEYS, 1 + len(request.ids), "members with public keys")
            if self._mask_keys is None or self._enc_keys is None:  # pragma: no cover - phase guard
                raise RequestRefused(f"node {self.node_id}: no key pairs")
            own = self.trust.signing_key.public
            seen: dict[bytes, int] = {}
            for v, pkm, pke, who, sig in zip(request.ids, request.pk_mask, request.pk_enc, request.identities,
                                             request.signatures, strict=True):
                if self.trust.roster is not None and who not in self.trust.roster:
                    raise RequestRefused(f"node {self.node_id}: neighbour {v}'s identity is not on the "
                                         "roster (a sybil); refused")
                if who == own or who in seen:
                    other = "this node" if who == own else f"node {seen[who]}"
                    raise RequestRefused(f"node {self.node_id}: neighbour {v} uses the identity of {other}; "
                                         "refused")
                seen[who] = v
                if not _verified(who, advertisement(self.run, self._round, v, pkm, pke), sig):
                    raise RequestRefused(f"node {self.node_id}: the key advertisement of neighbour {v} is "
                                         "not signed by its identity (a swapped key); refused")
            self._identities = {v: w for w, v in seen.items()}
            self._peer_pk_mask = dict(zip(request.ids, request.pk_mask, strict=True))
            self._peer_pk_enc = dict(zip(request.ids, request.pk_enc, strict=True))
            self._seed = random_secret()
            k = len(self._index)
            b_shares, sk_shares = share_secrets([self._seed, self._mask_keys.private_bytes()],
                                                self._threshold, k)
            self._own_b_share = b_shares[self._index[self.node_id] - 1]
            cts = []
            for v in request.ids:
                i = self._index[v]
                plaintext = i.to_bytes(2, "big") + b_shares[i - 1].value + sk_shares[i - 1].value
                # one agreement per neighbour: the key of the shares it sends back is derived now
                self._confirm_keys[v], key, self._open_keys[v] = neighbour_keys(
                    self._enc_keys.agree(self._peer_pk_enc[v]), self._round, self.node_id, v)
                cts.append(seal(key, plaintext, round_=self._round, src=self.node_id, dst=v))
            del b_shares, sk_shares
            self._phase = _ClientPhase.KEYS_SHARED
            return KeysReply(self._round, self.node_id, request.ids, tuple(cts))
        except BaseException:
            self._abort()
            raise

    def collect(self, request: CollectRequest, values: np.ndarray, digest: bytes) -> CollectReply:
        """Stage 2: open the neighbours' shares and mask ``values`` (``uint32``, length ``d``).

        ``digest``: :func:`fedfdp.secagg.identity.round_digest` of the model and round
        parameters this node received with the request (it signs it at confirm).

        Raises
        ------
        AuthenticationError
            A ciphertext fails authentication (names its source).
        """
        self._enter(Stage.COLLECT, request, CollectRequest)
        try:
            if (
                not isinstance(values, np.ndarray)
                or values.dtype != np.uint32
                or values.shape != (self._dim,)
            ):
                desc = (
                    f"{values.dtype} array of shape {values.shape}"
                    if isinstance(values, np.ndarray)
                    else type(values).__name__
                )
                raise ValueError(f"values: must be a uint32 array of shape ({self._dim},), got {desc}")
            if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
                raise ValueError(f"digest: must be {DIGEST_BYTES} bytes")
            self._known("srcs", request.srcs, frozenset(self._peer_pk_enc))
            self._enough(Stage.COLLECT, 1 + len(request.srcs), "members that sent shares")
            if self._mask_keys is None or self._enc_keys is None or self._seed is None:  # pragma: no cover
                raise RequestRefused(f"node {self.node_id}: no keys")
            for src, ct in zip(request.srcs, request.ciphertexts, strict=True):
                plain = open_sealed(self._open_keys[src], ct, round_=self._round, src=src, dst=self.node_id)
                index = int.from_bytes(plain[:2], "big")
                try:
                    if len(plain) != SHARE_PLAINTEXT_BYTES or not 1 <= index <= len(self._index):
                        raise ValueError("wrong length or index")
                    b_share = Share(index, plain[2 : 2 + SHARE_VALUE_BYTES])
                    sk_share = Share(index, plain[2 + SHARE_VALUE_BYTES :])
                except ValueError:
                    raise MessageError(
                        f"ciphertexts: the shares from node {src} are malformed",
                        field="ciphertexts",
                        node_id=src,
                    ) from None
                self._held_b[src] = b_share
                self._held_sk[src] = sk_share
            masked = values.copy()
            np.add(
                masked,
                prg_uint32(self_mask_key(self._seed, self._round, self.node_id, digest=digest), self._dim),
                out=masked,
            )
            for v in request.srcs:
                secret = self._mask_keys.agree(self._peer_pk_mask[v])
                key = pair_mask_key(secret, self._round, self.node_id, v, digest=digest)
                mask = prg_uint32(key, self._dim)
                (np.add if v > self.node_id else np.subtract)(masked, mask, out=masked)
            self._mask_keys = self._enc_keys = None
            self._seed = None
            self._peer_pk_mask = {}
            self._peer_pk_enc = {}
            self._open_keys = {}
            self._srcs = frozenset(request.srcs)
            self._digest = digest
            self._phase = _ClientPhase.COLLECTED
            return CollectReply(self._round, self.node_id, masked)
        except BaseException:
            self._abort()
            raise

    def confirm(self, request: ConfirmRequest) -> ConfirmReply:
        """Stage 3, first exchange: check the survivor and dead sets and sign them with the
        round digest (class docstring).

        Raises
        ------
        RequestRefused
            A node both live and dead, this node dead, sets that contradict the shares it
            received, or fewer survivors than ``trust.min_survivors``.
        ConsistencyError
            The survivors' graph is disconnected (unmasking would release partial sums).
        """
        self._enter(Stage.UNMASK, request, ConfirmRequest)
        try:
            live, dead = frozenset(request.live), frozenset(request.dead)
            both = live & dead
            if both:
                raise RequestRefused(
                    f"node {self.node_id}: confirm request lists {sorted(both)} as both live and dead; "
                    "refused")
            if self.node_id not in live:
                raise RequestRefused(f"node {self.node_id}: confirm request does not list this node as live; "
                                     "refused")
            self._known("live", live | dead, frozenset(self._ring))
            if len(live) < self.trust.min_survivors:
                raise RequestRefused(f"node {self.node_id}: {len(live)} survivors, fewer than the "
                                     f"{self.trust.min_survivors} this node requires; refused")
            mine = self._neighbours & (live | dead)
            if mine != self._srcs:
                raise RequestRefused(
                    f"node {self.node_id}: the confirmed sets list neighbours {sorted(mine)} as sharing "
                    f"keys, but it received shares from {sorted(self._srcs)}; refused")
            if not _connected(self._ring, self._degree, live):
                raise ConsistencyError(f"node {self.node_id}: the {len(live)} survivors' graph is "
                                       "disconnected (unmasking would release partial sums); refused")
            if self._digest is None:  # pragma: no cover - set at collect
                raise RequestRefused(f"node {self.node_id}: no round digest")
            self._live, self._dead = live, dead
            statement = confirmation(self.run, self._round, live, dead, self._digest)
            signature = self.trust.signing_key.sign(statement)
            dsts = tuple(sorted(self._neighbours & live))
            macs = tuple(mac(self._confirm_keys[v], statement) for v in dsts)
            self._phase = _ClientPhase.CONFIRMED
            return ConfirmReply(self._round, self.node_id, signature, dsts, macs)
        except BaseException:
            self._abort()
            raise

    def unmask(self, request: UnmaskRequest) -> UnmaskReply:
        """Stage 3: hand over the ``b``-shares of the live nodes and the key shares of the
        dead ones, once, when at least ``t`` live members of its neighbourhood confirmed the
        same sets and digest.

        Raises
        ------
        RequestRefused
            A node listed as both live and dead, this node listed as dead, lists that are
            not its neighbourhood's part of the confirmed sets, a missing or invalid
            confirmation, or a second unmask request.
        """
        self._enter(Stage.UNMASK, request, UnmaskRequest)
        try:
            both = set(request.live) & set(request.dead)
            if both:
                raise RequestRefused(
                    f"node {self.node_id}: unmask request lists {sorted(both)} as both live and dead; refused"
                )
            if self.node_id in request.dead:
                raise RequestRefused(
                    f"node {self.node_id}: unmask request lists this live node as dead; refused"
                )
            self._known("live", request.live, frozenset(self._held_b) | {self.node_id})
            self._known("dead", request.dead, frozenset(self._held_sk))
            want_live = (self._neighbours & self._live) | {self.node_id}
            want_dead = self._neighbours & self._dead
            if set(request.live) != want_live or set(request.dead) != want_dead:
                raise RequestRefused(
                    f"node {self.node_id}: unmask request lists live {sorted(request.live)} and dead "
                    f"{sorted(request.dead)}, not its neighbourhood's part of the confirmed sets; refused")
            self._enough(Stage.UNMASK, len(request.live), "live members listed")
            self._known("signers", request.signers, frozenset(request.live) - {self.node_id})
            self._enough(Stage.UNMASK, 1 + len(request.signers), "live members that confirmed")
            if self._digest is None:  # pragma: no cover - set at collect
                raise RequestRefused(f"node {self.node_id}: no round digest")
            statement = confirmation(self.run, self._round, self._live, self._dead, self._digest)
            # its own confirmation and t − 1 of its neighbours', in order: t agreeing members
            # of its neighbourhood are the guarantee, more add nothing to it
            for u, tag in list(zip(request.signers, request.macs, strict=True))[: self._threshold - 1]:
                key = self._confirm_keys.get(u)
                if key is None or not mac_matches(key, statement, tag):
                    raise RequestRefused(
                        f"node {self.node_id}: live neighbour {u} did not confirm the same survivor set, "
                        "dead set and round digest; refused")
            b_shares = []
            for u in request.live:
                share = self._own_b_share if u == self.node_id else self._held_b[u]
                if share is None:  # pragma: no cover - set at share_keys
                    raise RequestRefused(f"node {self.node_id}: no share of its own seed")
                b_shares.append(share.to_bytes())
            sk_shares = [self._held_sk[w].to_bytes() for w in request.dead]
            reply = UnmaskReply(
                self._round, self.node_id, request.live, tuple(b_shares), request.dead, tuple(sk_shares)
            )
            self.after_round = self._round
            self._clear()
            self._phase = _ClientPhase.FINISHED
            return reply
        except BaseException:
            self._abort()
            raise

    # -- persistence between stages ------------------------------------------------------

    def export_state(self) -> bytes:
        """The session's whole state (its secrets included) as bytes, for the party's own
        storage between stages (a Flower node keeps it in its ``Context.state``, which
        never leaves the node). :meth:`restore` is the inverse.

        A compact binary form (a node writes it at every stage): a version byte and a
        fixed header (phase, node id, round, run, last unmasked round, ``k``, ``t``,
        ``d``), the trust as JSON, then the ring and the node sets as counts of
        big-endian ``u64`` ids, the per-neighbour keys as an id list and their
        concatenated values, and each optional secret length-prefixed.
        """
        if self._trust_raw is None:
            self._trust_raw = json.dumps(self.trust.to_dict()).encode()
        parts = [
            _STATE_HEAD.pack(_STATE_VERSION, _PHASES.index(self._phase), self.node_id, self._round, self.run,
                             self.after_round, self._degree, self._threshold, self._dim),
            pack_blob(self._trust_raw),
            pack_ids(self._ring),
            pack_ids(sorted(self._neighbours)), pack_ids(sorted(self._srcs)),
            pack_ids(sorted(self._live)), pack_ids(sorted(self._dead)),
            pack_id_map(self._identities), pack_id_map(self._confirm_keys), pack_id_map(self._open_keys),
            pack_id_map(self._peer_pk_mask), pack_id_map(self._peer_pk_enc),
            pack_id_map({k: v.to_bytes() for k, v in self._held_b.items()}),
            pack_id_map({k: v.to_bytes() for k, v in self._held_sk.items()}),
            pack_optional(self._digest),
            pack_optional(self._mask_keys.private_bytes() if self._mask_keys is not None else None),
            pack_optional(self._enc_keys.private_bytes() if self._enc_keys is not None else None),
            pack_optional(self._seed),
            pack_optional(self._own_b_share.to_bytes() if self._own_b_share is not None else None),
        ]
        return b"".join(parts)

    @classmethod
    def restore(cls, raw: bytes) -> ClientSession:
        """The session :meth:`export_state` wrote.

        Raises
        ------
        ValueError
            ``raw`` is not such a state.
        """
        try:
            if not isinstance(raw, bytes):
                raise TypeError(f"{type(raw).__name__}, not bytes")
            version, phase, node_id, round_, run, after_round, degree, threshold, dim = (
                _STATE_HEAD.unpack_from(raw, 0))
            if version != _STATE_VERSION:
                raise ValueError(f"version {version}, not {_STATE_VERSION}")
            read = Reader(raw, _STATE_HEAD.size)
            trust_raw = read.blob()
            session = cls(node_id, NodeTrust.from_dict(json.loads(trust_raw.decode())), run=run,
                          after_round=after_round)
            session._trust_raw = trust_raw
            session._phase = _PHASES[phase]
            session._round = round_
            session._degree, session._threshold, session._dim = degree, threshold, dim
            session._ring = read.ids()
            session._neighbours = frozenset(read.ids())
            session._srcs = frozenset(read.ids())
            session._live = frozenset(read.ids())
            session._dead = frozenset(read.ids())
            session._identities = read.id_map()
            session._confirm_keys = read.id_map()
            session._open_keys = read.id_map()
            session._peer_pk_mask = read.id_map()
            session._peer_pk_enc = read.id_map()
            session._held_b = {k: Share.from_bytes(v) for k, v in read.id_map().items()}
            session._held_sk = {k: Share.from_bytes(v) for k, v in read.id_map().items()}
            session._digest = read.optional()
            mask_sk, enc_sk = read.optional(), read.optional()
            session._mask_keys = KeyPair.from_private_bytes(mask_sk) if mask_sk is not None else None
            session._enc_keys = KeyPair.from_private_bytes(enc_sk) if enc_sk is not None else None
            session._seed = read.optional()
            own = read.optional()
            session._own_b_share = Share.from_bytes(own) if own is not None else None
            read.end()
            if session._phase is not _ClientPhase.NEW:
                session._index = {
                    v: i + 1 for i, v in enumerate(sorted(session._neighbours | {session.node_id}))
                }
        except (AttributeError, IndexError, KeyError, TypeError, ValueError, struct.error) as exc:
            raise ValueError(f"client session state: unreadable ({type(exc).__name__}: {exc})") from None
        return session

    # -- helpers -------------------------------------------------------------------------

    def _enter(self, stage: Stage, request: object, cls: type) -> None:
        expected = _ClientPhase.COLLECTED if cls is ConfirmRequest else _NEXT[stage]
        if self._phase is not expected:
            if stage is Stage.UNMASK and self._phase is _ClientPhase.FINISHED:
                reason = "it already answered unmask in this round"
            else:
                reason = f"its session is {self._phase.value}"
            self._abort()
            raise RequestRefused(f"node {self.node_id}: {stage.value} request refused, {reason}")
        if not isinstance(request, cls):
            self._abort()
            raise MessageError(
                f"{stage.value}: got a {type(request).__name__}, expected {cls.__name__}",
                field="type",
                node_id=self.node_id,
            )
        r: Any = request
        if r.node_id != self.node_id:
            self._abort()
            raise MessageError(
                f"{cls.__name__}.node_id={r.node_id}: addressed to another node than {self.node_id}",
                field="node_id",
                node_id=self.node_id,
            )
        if stage is not Stage.SETUP and r.round != self._round:
            self._abort()
            raise MessageError(
                f"{cls.__name__}.round={r.round}: this session is round {self._round}",
                field="round",
                node_id=self.node_id,
            )

    def _known(self, field: str, ids: Iterable[int], allowed: frozenset[int]) -> None:
        unknown = sorted(set(ids) - allowed)
        if unknown:
            raise MessageError(
                f"{field}: unknown ids {unknown} for node {self.node_id}", field=field, node_id=self.node_id
            )

    def _enough(self, stage: Stage, live: int, what: str) -> None:
        if live < self._threshold:
            raise ThresholdError(stage, self.node_id, live, self._threshold, what)

    def _abort(self) -> None:
        self._clear()
        self._phase = _ClientPhase.ABORTED
