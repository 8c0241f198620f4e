"""The client's side of one SecAgg+ round (the protocol: :mod:`fedfdp.secagg.session`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import Enum
from typing import Any

import numpy as np

from fedfdp.secagg.crypto import (
    KEY_BYTES,
    KeyPair,
    Share,
    encryption_key,
    open_sealed,
    pair_mask_key,
    prg_uint32,
    random_secret,
    seal,
    self_mask_key,
    share_secret,
)
from fedfdp.secagg.errors import (
    MessageError,
    RequestRefused,
    Stage,
    ThresholdError,
)
from fedfdp.secagg.messages import (
    SHARE_PLAINTEXT_BYTES,
    CollectReply,
    CollectRequest,
    KeysReply,
    KeysRequest,
    SetupReply,
    SetupRequest,
    UnmaskReply,
    UnmaskRequest,
)
from fedfdp.secagg.session import check_node_id


class _ClientPhase(Enum):
    NEW = "new"
    SET_UP = "set up"
    KEYS_SHARED = "keys shared"
    COLLECTED = "collected"
    FINISHED = "finished"
    ABORTED = "aborted"


#: The phase a session must be in to answer each stage's request.
_NEXT = {
    Stage.SETUP: _ClientPhase.NEW,
    Stage.SHARE_KEYS: _ClientPhase.SET_UP,
    Stage.COLLECT: _ClientPhase.KEYS_SHARED,
    Stage.UNMASK: _ClientPhase.COLLECTED,
}


class ClientSession:
    """One client's side of one SecAgg+ round.

    Call :meth:`setup`, :meth:`share_keys`, :meth:`collect` (with the ``uint32`` input
    ``x_u``) and :meth:`unmask` in order, once each, with the server's requests. Any
    refused or invalid request ends the session: its secrets are wiped and every later
    call raises :class:`~fedfdp.secagg.errors.RequestRefused`.

    Secrets (two X25519 private keys, the seed ``b_u``, the Shamir coefficients) come
    from the OS CSPRNG; the private keys and ``b_u`` are dropped after collect, the
    shares after unmask.

    Parameters
    ----------
    node_id : int
        This node's id (unsigned 64-bit).
    """

    def __init__(self, node_id: int) -> None:
        self.node_id = check_node_id("node_id", node_id)
        self._phase = _ClientPhase.NEW
        self._clear()

    def _clear(self) -> None:
        self._round = -1
        self._neighbours: frozenset[int] = frozenset()
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
    def finished(self) -> bool:
        """True once the node has answered unmask (or the session was aborted)."""
        return self._phase in (_ClientPhase.FINISHED, _ClientPhase.ABORTED)

    # -- stages --------------------------------------------------------------------------

    def setup(self, request: SetupRequest) -> SetupReply:
        """Stage 0: check the parameters and draw the two key pairs."""
        self._enter(Stage.SETUP, request, SetupRequest)
        try:
            nbrs = frozenset(request.neighbours)
            if self.node_id in nbrs:
                raise MessageError(
                    f"SetupRequest.neighbours: lists this node {self.node_id}",
                    field="neighbours",
                    node_id=self.node_id,
                )
            k = len(nbrs) + 1
            t = request.threshold
            if not k // 2 + 1 <= t <= k:
                raise RequestRefused(
                    f"node {self.node_id}: threshold t={t} for a neighbourhood of k={k} is outside "
                    f"[{k // 2 + 1}, {k}] (a minority threshold would let the server collect both shares)"
                )
            self._round = request.round
            self._neighbours = nbrs
            self._threshold = t
            self._dim = request.dim
            self._index = {v: i + 1 for i, v in enumerate(sorted(nbrs | {self.node_id}))}
            self._mask_keys = KeyPair.generate()
            self._enc_keys = KeyPair.generate()
            self._phase = _ClientPhase.SET_UP
            return SetupReply(self._round, self.node_id, self._mask_keys.public, self._enc_keys.public)
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
            self._peer_pk_mask = dict(zip(request.ids, request.pk_mask, strict=True))
            self._peer_pk_enc = dict(zip(request.ids, request.pk_enc, strict=True))
            self._seed = random_secret()
            k = len(self._index)
            b_shares = share_secret(self._seed, self._threshold, k)
            sk_shares = share_secret(self._mask_keys.private_bytes(), self._threshold, k)
            self._own_b_share = b_shares[self._index[self.node_id] - 1]
            cts = []
            for v in request.ids:
                i = self._index[v]
                plaintext = i.to_bytes(2, "big") + b_shares[i - 1].value + sk_shares[i - 1].value
                key = encryption_key(self._enc_keys.agree(self._peer_pk_enc[v]), self._round, self.node_id, v)
                cts.append(seal(key, plaintext, round_=self._round, src=self.node_id, dst=v))
            del b_shares, sk_shares
            self._phase = _ClientPhase.KEYS_SHARED
            return KeysReply(self._round, self.node_id, request.ids, tuple(cts))
        except BaseException:
            self._abort()
            raise

    def collect(self, request: CollectRequest, values: np.ndarray) -> CollectReply:
        """Stage 2: open the neighbours' shares and mask ``values`` (``uint32``, length ``d``).

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
            self._known("srcs", request.srcs, frozenset(self._peer_pk_enc))
            self._enough(Stage.COLLECT, 1 + len(request.srcs), "members that sent shares")
            if self._mask_keys is None or self._enc_keys is None or self._seed is None:  # pragma: no cover
                raise RequestRefused(f"node {self.node_id}: no keys")
            for src, ct in zip(request.srcs, request.ciphertexts, strict=True):
                key = encryption_key(
                    self._enc_keys.agree(self._peer_pk_enc[src]), self._round, src, self.node_id
                )
                plain = open_sealed(key, ct, round_=self._round, src=src, dst=self.node_id)
                index = int.from_bytes(plain[:2], "big")
                if len(plain) != SHARE_PLAINTEXT_BYTES or not 1 <= index <= len(self._index):
                    raise MessageError(
                        f"ciphertexts: the shares from node {src} are malformed",
                        field="ciphertexts",
                        node_id=src,
                    )
                self._held_b[src] = Share(index, plain[2 : 2 + KEY_BYTES])
                self._held_sk[src] = Share(index, plain[2 + KEY_BYTES :])
            masked = values.copy()
            np.add(
                masked,
                prg_uint32(self_mask_key(self._seed, self._round, self.node_id), self._dim),
                out=masked,
            )
            for v in request.srcs:
                secret = self._mask_keys.agree(self._peer_pk_mask[v])
                mask = prg_uint32(pair_mask_key(secret, self._round, self.node_id, v), self._dim)
                (np.add if v > self.node_id else np.subtract)(masked, mask, out=masked)
            self._mask_keys = self._enc_keys = None
            self._seed = None
            self._peer_pk_mask = {}
            self._peer_pk_enc = {}
            self._phase = _ClientPhase.COLLECTED
            return CollectReply(self._round, self.node_id, masked)
        except BaseException:
            self._abort()
            raise

    def unmask(self, request: UnmaskRequest) -> UnmaskReply:
        """Stage 3: hand over the ``b``-shares of the live nodes and the key shares of the
        dead ones, once.

        Raises
        ------
        RequestRefused
            A node listed as both live and dead, this node listed as dead, or a second
            unmask request.
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
            self._enough(Stage.UNMASK, len(request.live), "live members listed")
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
        """

        def hexmap(m: dict[int, bytes]) -> dict[str, str]:
            return {str(k): v.hex() for k, v in m.items()}

        def shares(m: dict[int, Share]) -> dict[str, str]:
            return {str(k): v.to_bytes().hex() for k, v in m.items()}

        doc = {
            "node_id": str(self.node_id), "phase": self._phase.value, "round": self._round,
            "neighbours": [str(v) for v in sorted(self._neighbours)], "threshold": self._threshold,
            "dim": self._dim,
            "mask_sk": self._mask_keys.private_bytes().hex() if self._mask_keys is not None else None,
            "enc_sk": self._enc_keys.private_bytes().hex() if self._enc_keys is not None else None,
            "seed": self._seed.hex() if self._seed is not None else None,
            "pk_mask": hexmap(self._peer_pk_mask), "pk_enc": hexmap(self._peer_pk_enc),
            "own_b": self._own_b_share.to_bytes().hex() if self._own_b_share is not None else None,
            "held_b": shares(self._held_b), "held_sk": shares(self._held_sk),
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def restore(cls, raw: bytes) -> ClientSession:
        """The session :meth:`export_state` wrote.

        Raises
        ------
        ValueError
            ``raw`` is not such a state.
        """
        try:
            doc = json.loads(raw.decode())
            session = cls(int(doc["node_id"]))
            session._phase = _ClientPhase(doc["phase"])
            session._round = int(doc["round"])
            session._neighbours = frozenset(int(v) for v in doc["neighbours"])
            session._threshold = int(doc["threshold"])
            session._dim = int(doc["dim"])
            if session._phase is not _ClientPhase.NEW:
                session._index = {
                    v: i + 1 for i, v in enumerate(sorted(session._neighbours | {session.node_id}))
                }

            def blob(h: str | None) -> bytes | None:
                return bytes.fromhex(h) if h is not None else None

            mask_sk, enc_sk = blob(doc["mask_sk"]), blob(doc["enc_sk"])
            session._mask_keys = KeyPair.from_private_bytes(mask_sk) if mask_sk is not None else None
            session._enc_keys = KeyPair.from_private_bytes(enc_sk) if enc_sk is not None else None
            session._seed = blob(doc["seed"])
            session._peer_pk_mask = {int(k): bytes.fromhex(v) for k, v in doc["pk_mask"].items()}
            session._peer_pk_enc = {int(k): bytes.fromhex(v) for k, v in doc["pk_enc"].items()}
            own = blob(doc["own_b"])
            session._own_b_share = Share.from_bytes(own) if own is not None else None
            session._held_b = {int(k): Share.from_bytes(bytes.fromhex(v)) for k, v in doc["held_b"].items()}
            session._held_sk = {int(k): Share.from_bytes(bytes.fromhex(v)) for k, v in doc["held_sk"].items()}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"client session state: unreadable ({type(exc).__name__}: {exc})") from None
        return session

    # -- helpers -------------------------------------------------------------------------

    def _enter(self, stage: Stage, request: object, cls: type) -> None:
        expected = _NEXT[stage]
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
