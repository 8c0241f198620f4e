"""SecAgg+ for one round as two pure state machines: :class:`ClientSession` and
:class:`ServerSession`.

The protocol is the secure aggregation of Bonawitz et al. (CCS 2017) on the sparse
neighbour graph of Bell et al. (CCS 2020), in four stages (messages in
:mod:`fedfdp.secagg.messages`):

0. **setup.** The server shuffles the ``n`` sampled node ids into a ring with the OS
   CSPRNG and gives each node the ``⌊k/2⌋`` nodes on either side as neighbours
   (``k`` odd, default ``min(n, 2⌈log₂ n⌉ + 1)``); its *neighbourhood* ``N[u]`` is
   itself plus those ``k − 1`` nodes. Each node draws two X25519 key pairs, one for
   masks and one for encryption, and sends both public keys. Responders: U1.
1. **share_keys.** Each node in U1 receives its neighbours' public keys, draws a
   32-byte self-mask seed ``b_u``, splits ``b_u`` and its mask private key into ``k``
   Shamir shares with threshold ``t`` (default ``⌊k/2⌋ + 1``), one per member of
   ``N[u]`` (index = rank of the member's id in ``N[u]``, plus one), and sends each
   neighbour in U1 its pair of shares under AES-256-GCM (key from X25519 and HKDF,
   associated data (round, source, destination)). Responders: U2.
2. **collect.** Each node in U2 receives the ciphertexts of its neighbours in U2,
   checks and stores the shares, and sends
   ``y_u = x_u + PRG(b_u) + Σ_{v ∈ S_u, v > u} PRG(s_uv) − Σ_{v ∈ S_u, v < u} PRG(s_uv)``
   mod 2³², where ``S_u`` are the neighbours whose shares it received (= its
   neighbours in U2) and ``s_uv`` is the pairwise mask key. Responders: U3.
3. **unmask.** The dead nodes are ``U2 − U3``: a node that dropped before sending its
   shares is in no ``S_u``, its masks were never added, and nothing is recovered for
   it. Each node in U3 is asked for the ``b``-shares of the live members of its
   neighbourhood and the key shares of its dead neighbours, and answers once. The
   server reconstructs each ``b_u`` (``u`` in U3) and each dead node's mask private
   key from ``t`` shares, removes the self masks and the pairwise masks that live
   nodes shared with dead ones, and obtains ``Σ_{u ∈ U3} x_u mod 2³²``.

Security model
--------------
Honest-but-curious server, possibly colluding with fewer than ``t`` clients of any
neighbourhood. Its view is the public keys, ciphertexts it cannot open, the masked
vectors (one-time pads under the PRF assumption on AES), ``b_u`` for ``u`` in U3 and
the mask keys of dead nodes: no node has both its ``b_u`` and its mask key revealed,
because a client refuses an unmask request that lists a node as both live and dead,
answers only one unmask request, and ``t > k/2``. The server learns the sum over U3
and the sets U1 ⊇ U2 ⊇ U3; the :class:`ServerSession` never holds an individual
unmasked input (it keeps only the running sum of masked vectors). Computational
assumptions: X25519 (CDH), HKDF-SHA256, AES-256 as a PRF, AES-256-GCM as an AEAD
(:mod:`fedfdp.secagg.crypto`). Out of scope: a malicious server that substitutes
public keys or sends inconsistent live/dead lists to different clients (no PKI, no
consistency round), and poisoning by clients.

Failure rules
-------------
* After every stage, every node still needed must have at least ``t`` live members
  in its neighbourhood (the holders of its shares), else
  :class:`~fedfdp.secagg.errors.ThresholdError` naming the node and counts.
* Fewer survivors than ``min_survivors`` at any stage raises
  :class:`~fedfdp.secagg.errors.TooFewSurvivors`; after collect, the server raises it
  *before* producing any unmask request.
* A malformed reply (wrong length, unknown id, duplicate sender, wrong round) raises
  :class:`~fedfdp.secagg.errors.MessageError` naming the field, and leaves the
  server's state unchanged (the caller may drop that reply and call again). Threshold
  and survivor failures end the server session.
* A client that refuses or rejects a request wipes its secrets and answers nothing
  more in that round.

Arithmetic is in ``uint32`` with numpy's wrap-around, i.e. modulo 2³².
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import numpy as np

from fedfdp.secagg.crypto import (
    KEY_BYTES,
    MAX_NODE_ID,
    KeyPair,
    Share,
    combine_shares,
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
    ReconstructionError,
    RequestRefused,
    SessionStateError,
    Stage,
    ThresholdError,
    TooFewSurvivors,
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

_M = TypeVar("_M")


def default_neighbours(n: int) -> int:
    """Default neighbourhood size ``k``: ``min(n, 2⌈log₂ n⌉ + 1)``, lowered to an odd number.

    Bell et al. (2020) show that ``O(log n)`` neighbours suffice for security and
    correctness with high probability against random dropouts.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise ValueError(f"n={n!r}: secure aggregation needs at least 3 nodes")
    k = min(n, 2 * (n - 1).bit_length() + 1)
    return k if k % 2 == 1 else k - 1


def default_threshold(k: int) -> int:
    """Default Shamir threshold ``t = ⌊k/2⌋ + 1`` (a strict majority of a neighbourhood)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: must be an integer >= 1")
    return k // 2 + 1


def ring_neighbours(ring: Sequence[int], k: int) -> dict[int, frozenset[int]]:
    """Each node's ``k − 1`` neighbours: the ``⌊k/2⌋`` nodes on either side on ``ring``."""
    n = len(ring)
    half = k // 2
    return {
        u: frozenset(ring[(i + j) % n] for j in range(-half, half + 1) if j != 0) for i, u in enumerate(ring)
    }


@dataclass(frozen=True)
class AggregateResult:
    """What the server obtains from a successful round.

    Attributes
    ----------
    total : numpy.ndarray
        ``Σ_{u ∈ U3} x_u mod 2³²`` (``uint32``, read-only).
    u1 : frozenset of int
        Nodes that sent public keys (setup).
    u2 : frozenset of int
        Nodes that sent their share ciphertexts (share_keys).
    u3 : frozenset of int
        Nodes whose masked vector is in the sum (collect).
    responders : frozenset of int
        Nodes that answered unmask.
    """

    total: np.ndarray
    u1: frozenset[int]
    u2: frozenset[int]
    u3: frozenset[int]
    responders: frozenset[int]


class _ServerPhase(Enum):
    NEW = "new"
    SETUP = "awaiting setup replies"
    KEYS = "awaiting share_keys replies"
    COLLECT = "awaiting collect replies"
    UNMASK = "awaiting unmask replies"
    DONE = "done"
    FAILED = "failed"


def _node_id(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value <= MAX_NODE_ID:
        raise ValueError(f"{name}={value!r}: must be an integer in [0, 2**64)")
    return int(value)


class ServerSession:
    """The server's side of one SecAgg+ round.

    Usage: :meth:`setup_requests`, then :meth:`receive_setup`, :meth:`receive_keys`,
    :meth:`receive_collect` and :meth:`receive_unmask`, each given the replies that
    arrived (a missing reply is a dropout) and returning the next requests, keyed by
    addressee; the last returns the :class:`AggregateResult`.

    Parameters
    ----------
    round_ : int
        Round number (bound into every key and ciphertext).
    node_ids : sequence of int
        The sampled nodes (at least 3 distinct unsigned 64-bit ids).
    dim : int
        Length ``d`` of the aggregated vectors.
    neighbours : int, optional
        Neighbourhood size ``k`` (odd, ``3 ≤ k ≤ n``); default :func:`default_neighbours`.
    threshold : int, optional
        Shamir threshold ``t`` with ``⌊k/2⌋ + 1 ≤ t ≤ k``; default :func:`default_threshold`.
        A majority threshold means the shares that reveal a dead node's key and those
        that reveal a live node's seed cannot both come from honest clients' answers
        to one consistent request set.
    min_survivors : int, optional
        The server refuses to unmask (and aborts at any stage) with fewer survivors;
        ``t ≤ min_survivors ≤ n``, default ``t``.

    Raises
    ------
    ValueError
        A parameter out of range (named).
    """

    def __init__(
        self,
        round_: int,
        node_ids: Sequence[int],
        dim: int,
        *,
        neighbours: int | None = None,
        threshold: int | None = None,
        min_survivors: int | None = None,
    ) -> None:
        self.round = _node_id("round_", round_)
        ids = [_node_id("node_ids", u) for u in node_ids]
        if len(set(ids)) != len(ids):
            dup = sorted({u for u in ids if ids.count(u) > 1})
            raise ValueError(f"node_ids: duplicate ids {dup}")
        n = len(ids)
        if n < 3:
            raise ValueError(f"node_ids: {n} nodes, secure aggregation needs at least 3")
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or not 1 <= dim <= 2**40:
            raise ValueError(f"dim={dim!r}: must be an integer in [1, 2**40]")
        self.dim = int(dim)
        k = default_neighbours(n) if neighbours is None else neighbours
        if isinstance(k, bool) or not isinstance(k, int) or k % 2 == 0 or not 3 <= k <= n:
            raise ValueError(f"neighbours={k!r}: must be an odd integer in [3, n={n}]")
        t = default_threshold(k) if threshold is None else threshold
        if isinstance(t, bool) or not isinstance(t, int) or not k // 2 + 1 <= t <= k:
            raise ValueError(f"threshold={t!r}: must be an integer in [⌊k/2⌋+1={k // 2 + 1}, k={k}]")
        m = t if min_survivors is None else min_survivors
        if isinstance(m, bool) or not isinstance(m, int) or not t <= m <= n:
            raise ValueError(f"min_survivors={m!r}: must be an integer in [t={t}, n={n}]")
        self.neighbour_count = k
        self.threshold = t
        self.min_survivors = m
        self.sampled: frozenset[int] = frozenset(ids)
        ring = sorted(ids)
        secrets.SystemRandom().shuffle(ring)
        self._nbrs = ring_neighbours(ring, k)
        self._phase = _ServerPhase.NEW
        self._pk_mask: dict[int, bytes] = {}
        self._unmask_asked: dict[int, UnmaskRequest] = {}
        self._masked_sum: np.ndarray | None = None
        self.u1: frozenset[int] = frozenset()
        self.u2: frozenset[int] = frozenset()
        self.u3: frozenset[int] = frozenset()
        self._dead: frozenset[int] = frozenset()

    # -- public views ------------------------------------------------------------------

    def neighbours(self, node_id: int) -> frozenset[int]:
        """The ``k − 1`` neighbours of ``node_id`` on the ring (itself excluded)."""
        if node_id not in self._nbrs:
            raise ValueError(f"node_id={node_id!r}: not sampled in this round")
        return self._nbrs[node_id]

    def neighbourhood(self, node_id: int) -> frozenset[int]:
        """``N[node_id]``: the node and its neighbours (the holders of its shares)."""
        return self.neighbours(node_id) | {node_id}

    @property
    def failed(self) -> bool:
        """True once the round has failed (threshold or survivor check)."""
        return self._phase is _ServerPhase.FAILED

    # -- stages --------------------------------------------------------------------------

    def setup_requests(self) -> dict[int, SetupRequest]:
        """Stage 0: one :class:`SetupRequest` per sampled node."""
        self._expect(_ServerPhase.NEW, "setup_requests")
        self._phase = _ServerPhase.SETUP
        return {
            u: SetupRequest(self.round, u, tuple(sorted(self._nbrs[u])), self.threshold, self.dim)
            for u in sorted(self.sampled)
        }

    def receive_setup(self, replies: Iterable[SetupReply]) -> dict[int, KeysRequest]:
        """Stage 0 → 1: record U1 and the public keys; one :class:`KeysRequest` per node in U1."""
        self._expect(_ServerPhase.SETUP, "receive_setup")
        got = self._by_sender(replies, SetupReply, self.sampled, "setup")
        seen: dict[bytes, int] = {}
        for u, r in got.items():
            for name, pk in (("pk_mask", r.pk_mask), ("pk_enc", r.pk_enc)):
                if pk in seen:
                    raise MessageError(
                        f"SetupReply.{name} of node {u} repeats a public key of node {seen[pk]}",
                        field=name,
                        node_id=u,
                    )
                seen[pk] = u
        u1 = frozenset(got)
        self._guard(Stage.SETUP, u1, {u: self.neighbourhood(u) & u1 for u in u1}, "live members")
        self.u1 = u1
        self._pk_mask = {u: r.pk_mask for u, r in got.items()}
        self._phase = _ServerPhase.KEYS
        out = {}
        for u in sorted(u1):
            ids = tuple(sorted(self._nbrs[u] & u1))
            out[u] = KeysRequest(
                self.round, u, ids, tuple(got[v].pk_mask for v in ids), tuple(got[v].pk_enc for v in ids)
            )
        return out

    def receive_keys(self, replies: Iterable[KeysReply]) -> dict[int, CollectRequest]:
        """Stage 1 → 2: record U2; forward to each node in U2 the ciphertexts addressed to
        it by its neighbours in U2 (ciphertexts to nodes that dropped are discarded)."""
        self._expect(_ServerPhase.KEYS, "receive_keys")
        got = self._by_sender(replies, KeysReply, self.u1, "share_keys")
        for u, r in got.items():
            expected = self._nbrs[u] & self.u1
            if set(r.dsts) != expected:
                raise MessageError(
                    f"KeysReply.dsts of node {u}: {sorted(r.dsts)}, expected its neighbours in U1 "
                    f"{sorted(expected)}",
                    field="dsts",
                    node_id=u,
                )
        u2 = frozenset(got)
        self._guard(Stage.SHARE_KEYS, u2, {u: self.neighbourhood(u) & u2 for u in u2}, "live members")
        self.u2 = u2
        inbox: dict[int, dict[int, bytes]] = {v: {} for v in u2}
        for u, r in got.items():
            for v, c in zip(r.dsts, r.ciphertexts, strict=True):
                if v in u2:
                    inbox[v][u] = c
        self._phase = _ServerPhase.COLLECT
        return {
            v: CollectRequest(
                self.round, v, tuple(sorted(inbox[v])), tuple(inbox[v][u] for u in sorted(inbox[v]))
            )
            for v in sorted(u2)
        }

    def receive_collect(self, replies: Iterable[CollectReply]) -> dict[int, UnmaskRequest]:
        """Stage 2 → 3: record U3 and add up the masked vectors; one :class:`UnmaskRequest`
        per node in U3.

        Raises
        ------
        TooFewSurvivors
            ``|U3| < min_survivors``: raised before any unmask request exists; the
            session is over and the masked sum is discarded.
        ThresholdError
            A node of U3 with fewer than ``t`` members of its neighbourhood in U3, or a
            dead node (U2 − U3) with a live neighbour but fewer than ``t`` live ones.
        """
        self._expect(_ServerPhase.COLLECT, "receive_collect")
        got = self._by_sender(replies, CollectReply, self.u2, "collect")
        for u, r in got.items():
            if r.masked.shape != (self.dim,):
                raise MessageError(
                    f"CollectReply.masked of node {u}: length {r.masked.shape[0]}, expected d={self.dim}",
                    field="masked",
                    node_id=u,
                )
        u3 = frozenset(got)
        dead = frozenset(w for w in self.u2 - u3 if self._nbrs[w] & u3)
        holders = {u: self.neighbourhood(u) & u3 for u in u3}
        holders.update({w: self._nbrs[w] & u3 for w in dead})
        self._guard(Stage.COLLECT, u3, holders, "live holders of its shares")
        total = np.zeros(self.dim, dtype=np.uint32)
        for u in sorted(u3):
            np.add(total, got[u].masked, out=total)
        self.u3 = u3
        self._dead = dead
        self._masked_sum = total
        self._unmask_asked = {
            v: UnmaskRequest(
                self.round, v, tuple(sorted(self.neighbourhood(v) & u3)), tuple(sorted(self._nbrs[v] & dead))
            )
            for v in sorted(u3)
        }
        self._phase = _ServerPhase.UNMASK
        return dict(self._unmask_asked)

    def receive_unmask(self, replies: Iterable[UnmaskReply]) -> AggregateResult:
        """Stage 3: reconstruct the seeds of U3 and the mask keys of the dead nodes, remove
        every mask, and return the sum over U3.

        Raises
        ------
        ThresholdError
            Fewer than ``t`` shares came back for some node.
        ReconstructionError
            A dead node's reconstructed key does not match its published public key.
        """
        self._expect(_ServerPhase.UNMASK, "receive_unmask")
        got = self._by_sender(replies, UnmaskReply, self.u3, "unmask")
        b_shares: dict[int, list[Share]] = {u: [] for u in self.u3}
        sk_shares: dict[int, list[Share]] = {w: [] for w in self._dead}
        for v, r in got.items():
            asked = self._unmask_asked[v]
            for kind, owners, blobs, allowed, store in (
                ("b", r.b_owners, r.b_shares, asked.live, b_shares),
                ("sk", r.sk_owners, r.sk_shares, asked.dead, sk_shares),
            ):
                extra = set(owners) - set(allowed)
                if extra:
                    raise MessageError(
                        f"UnmaskReply.{kind}_owners of node {v}: {sorted(extra)} were not asked for",
                        field=f"{kind}_owners",
                        node_id=v,
                    )
                for owner, blob in zip(owners, blobs, strict=True):
                    try:
                        share = Share.from_bytes(blob)
                    except ValueError as err:
                        raise MessageError(
                            f"UnmaskReply.{kind}_shares of node {v} for node {owner}: {err}",
                            field=f"{kind}_shares",
                            node_id=v,
                        ) from None
                    index = sorted(self.neighbourhood(owner)).index(v) + 1
                    if share.index != index:
                        raise MessageError(
                            f"UnmaskReply.{kind}_shares of node {v} for node {owner}: index {share.index}, "
                            f"expected {index}",
                            field=f"{kind}_shares",
                            node_id=v,
                        )
                    store[owner].append(share)
        for stage_what, store in (("seed shares returned", b_shares), ("key shares returned", sk_shares)):
            for u in sorted(store):
                if len(store[u]) < self.threshold:
                    self._fail()
                    raise ThresholdError(Stage.UNMASK, u, len(store[u]), self.threshold, stage_what)
        if self._masked_sum is None:  # pragma: no cover - guarded by the phase
            raise SessionStateError("receive_unmask: no masked sum")
        total = self._masked_sum
        t = self.threshold
        for u in sorted(self.u3):
            seed = combine_shares(b_shares[u][:t])
            np.subtract(total, prg_uint32(self_mask_key(seed, self.round, u), self.dim), out=total)
        for w in sorted(self._dead):
            keys = KeyPair.from_private_bytes(combine_shares(sk_shares[w][:t]))
            if keys.public != self._pk_mask[w]:
                self._fail()
                raise ReconstructionError(
                    f"stage unmask: the key shares of node {w} do not reconstruct its published mask key"
                )
            for v in sorted(self._nbrs[w] & self.u3):
                mask = prg_uint32(pair_mask_key(keys.agree(self._pk_mask[v]), self.round, v, w), self.dim)
                # v added +mask when w > v and -mask when w < v
                (np.subtract if w > v else np.add)(total, mask, out=total)
        total.setflags(write=False)
        result = AggregateResult(total, self.u1, self.u2, self.u3, frozenset(got))
        self._wipe()
        self._phase = _ServerPhase.DONE
        return result

    # -- helpers -------------------------------------------------------------------------

    def _expect(self, phase: _ServerPhase, method: str) -> None:
        if self._phase is not phase:
            raise SessionStateError(
                f"{method}: the session of round {self.round} is {self._phase.value}, not {phase.value}"
            )

    def _by_sender(
        self, replies: Iterable[_M], cls: type[_M], asked: frozenset[int], stage: str
    ) -> dict[int, _M]:
        out: dict[int, _M] = {}
        for r in replies:
            if not isinstance(r, cls):
                raise MessageError(
                    f"stage {stage}: got a {type(r).__name__}, expected {cls.__name__}", field="type"
                )
            u: int = r.node_id  # type: ignore[attr-defined]
            rnd: int = r.round  # type: ignore[attr-defined]
            if rnd != self.round:
                raise MessageError(
                    f"{cls.__name__}.round={rnd} from node {u}: expected {self.round}",
                    field="round",
                    node_id=u,
                )
            if u not in asked:
                raise MessageError(
                    f"{cls.__name__}.node_id={u}: unknown id, not asked at stage {stage}",
                    field="node_id",
                    node_id=u,
                )
            if u in out:
                raise MessageError(
                    f"{cls.__name__}.node_id={u}: duplicate sender at stage {stage}",
                    field="node_id",
                    node_id=u,
                )
            out[u] = r
        return out

    def _guard(
        self, stage: Stage, survivors: frozenset[int], holders: Mapping[int, frozenset[int]], what: str
    ) -> None:
        if len(survivors) < self.min_survivors:
            self._fail()
            raise TooFewSurvivors(stage, len(survivors), self.min_survivors)
        for u in sorted(holders):
            if len(holders[u]) < self.threshold:
                self._fail()
                raise ThresholdError(stage, u, len(holders[u]), self.threshold, what)

    def _wipe(self) -> None:
        self._pk_mask = {}
        self._unmask_asked = {}
        self._masked_sum = None
        self._dead = frozenset()

    def _fail(self) -> None:
        self._wipe()
        self._phase = _ServerPhase.FAILED


class _ClientPhase(Enum):
    NEW = "new"
    SET_UP = "set up"
    KEYS_SHARED = "keys shared"
    COLLECTED = "collected"
    FINISHED = "finished"
    ABORTED = "aborted"


_NEXT = {
    "setup": _ClientPhase.NEW,
    "share_keys": _ClientPhase.SET_UP,
    "collect": _ClientPhase.KEYS_SHARED,
    "unmask": _ClientPhase.COLLECTED,
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
        self.node_id = _node_id("node_id", node_id)
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
        self._enter("setup", request, SetupRequest)
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
        self._enter("share_keys", request, KeysRequest)
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
        self._enter("collect", request, CollectRequest)
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
        self._enter("unmask", request, UnmaskRequest)
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

    # -- helpers -------------------------------------------------------------------------

    def _enter(self, stage: str, request: object, cls: type) -> None:
        expected = _NEXT[stage]
        if self._phase is not expected:
            if stage == "unmask" and self._phase is _ClientPhase.FINISHED:
                reason = "it already answered unmask in this round"
            else:
                reason = f"its session is {self._phase.value}"
            self._abort()
            raise RequestRefused(f"node {self.node_id}: {stage} request refused, {reason}")
        if not isinstance(request, cls):
            self._abort()
            raise MessageError(
                f"{stage}: got a {type(request).__name__}, expected {cls.__name__}",
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
        if stage != "setup" and r.round != self._round:
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
