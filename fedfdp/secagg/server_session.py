"""The server's side of one SecAgg+ round (the protocol: :mod:`fedfdp.secagg.session`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import numpy as np

from fedfdp.secagg.crypto import (
    InconsistentShares,
    KeyPair,
    Share,
    combine_many,
    pair_mask_key,
    prg_uint32,
    self_mask_key,
)
from fedfdp.secagg.errors import (
    ConsistencyError,
    MessageError,
    ReconstructionError,
    SessionStateError,
    Stage,
    ThresholdError,
    TooFewSurvivors,
)
from fedfdp.secagg.graph import is_connected, neighbour_graph
from fedfdp.secagg.identity import DIGEST_BYTES, advertisement, confirmation, verify
from fedfdp.secagg.messages import (
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
from fedfdp.secagg.session import check_node_id, default_neighbours, default_threshold

_M = TypeVar("_M")


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
    CONFIRM = "awaiting confirm replies"
    UNMASK = "awaiting unmask replies"
    DONE = "done"
    FAILED = "failed"


class ServerSession:
    """The server's side of one SecAgg+ round.

    Usage: :meth:`setup_requests`, then :meth:`receive_setup`, :meth:`receive_keys`,
    :meth:`receive_collect`, :meth:`receive_confirm` and :meth:`receive_unmask`, each
    given the replies that arrived (a missing reply is a dropout) and returning the next
    requests, keyed by addressee; the last returns the :class:`AggregateResult`.

    The neighbour graph is not the server's choice: it is
    :func:`fedfdp.secagg.graph.neighbour_graph` of the round, ``k`` and the sampled
    nodes, which every node recomputes.

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
    run : int, optional
        The run the nodes sign for (their setup replies must name it); default: the run
        most setup replies name (:attr:`run` once setup is received).

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
        run: int | None = None,
    ) -> None:
        self.round = check_node_id("round_", round_)
        self.run: int | None = None if run is None else check_node_id("run", run)
        ids = [check_node_id("node_ids", u) for u in node_ids]
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
        self._nbrs = neighbour_graph(self.round, k, ids)
        self._phase = _ServerPhase.NEW
        self._pk_mask: dict[int, bytes] = {}
        self._identity: dict[int, bytes] = {}
        self._digest = bytes(DIGEST_BYTES)
        self._unmask_asked: dict[int, UnmaskRequest] = {}
        self._masked_sum: np.ndarray | None = None
        self.u1: frozenset[int] = frozenset()
        self.u2: frozenset[int] = frozenset()
        self.u3: frozenset[int] = frozenset()
        self._dead: frozenset[int] = frozenset()

    # -- public views ------------------------------------------------------------------

    def neighbours(self, node_id: int) -> frozenset[int]:
        """The ``k − 1`` neighbours of ``node_id`` in the round's graph (itself excluded)."""
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
            u: SetupRequest(self.round, u, tuple(sorted(self.sampled)), self.neighbour_count, self.threshold,
                            self.dim)
            for u in sorted(self.sampled)
        }

    def receive_setup(self, replies: Iterable[SetupReply]) -> dict[int, KeysRequest]:
        """Stage 0 → 1: record U1 and the signed public keys; one :class:`KeysRequest` per
        node in U1 (a reply whose advertisement is not signed by its identity, or whose
        identity or keys repeat another's, is refused as malformed).
        """
        self._expect(_ServerPhase.SETUP, "receive_setup")
        got = self._by_sender(replies, SetupReply, self.sampled, Stage.SETUP)
        runs = sorted(r.run for r in got.values())
        run = self.run if self.run is not None else max(runs, key=runs.count, default=0)
        seen: dict[bytes, int] = {}
        for u, r in got.items():
            if r.run != run:
                raise MessageError(f"SetupReply.run={r.run} of node {u}: the round's run is {run}",
                                   field="run", node_id=u)
            signed = advertisement(run, self.round, u, r.pk_mask, r.pk_enc)
            if not verify(r.identity, signed, r.signature):
                raise MessageError(f"SetupReply.signature of node {u}: not its identity's signature of its "
                                   "keys", field="signature", node_id=u)
            for name, pk in (("pk_mask", r.pk_mask), ("pk_enc", r.pk_enc), ("identity", r.identity)):
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
        self.run = run
        self._pk_mask = {u: r.pk_mask for u, r in got.items()}
        self._identity = {u: r.identity for u, r in got.items()}
        self._phase = _ServerPhase.KEYS
        out = {}
        for u in sorted(u1):
            ids = tuple(sorted(self._nbrs[u] & u1))
            out[u] = KeysRequest(
                self.round, u, ids, tuple(got[v].pk_mask for v in ids), tuple(got[v].pk_enc for v in ids),
                tuple(got[v].identity for v in ids), tuple(got[v].signature for v in ids),
            )
        return out

    def receive_keys(self, replies: Iterable[KeysReply]) -> dict[int, CollectRequest]:
        """Stage 1 → 2: record U2; forward to each node in U2 the ciphertexts addressed to
        it by its neighbours in U2 (ciphertexts to nodes that dropped are discarded).
        """
        self._expect(_ServerPhase.KEYS, "receive_keys")
        got = self._by_sender(replies, KeysReply, self.u1, Stage.SHARE_KEYS)
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

    def receive_collect(self, replies: Iterable[CollectReply]) -> dict[int, ConfirmRequest]:
        """Stage 2 → 3: record U3 and add up the masked vectors; one :class:`ConfirmRequest`
        per node in U3 (the survivor set U3 and the dead set U2 − U3, for every survivor to
        check and sign).

        Raises
        ------
        TooFewSurvivors
            ``|U3| < min_survivors``: raised before any request of the unmask stage
            exists; the session is over and the masked sum is discarded.
        ThresholdError
            A node of U3 with fewer than ``t`` members of its neighbourhood in U3, or a
            dead node (U2 − U3) with a live neighbour but fewer than ``t`` live ones.
        ConsistencyError
            U3's graph is disconnected: unmasking would release the sums of its parts.
        """
        self._expect(_ServerPhase.COLLECT, "receive_collect")
        got = self._by_sender(replies, CollectReply, self.u2, Stage.COLLECT)
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
        if not is_connected(self._nbrs, u3):
            self._fail()
            raise ConsistencyError(f"stage {Stage.COLLECT.value}: the {len(u3)} survivors' graph is "
                                   "disconnected (unmasking would release partial sums); round aborted")
        total = np.zeros(self.dim, dtype=np.uint32)
        for u in sorted(u3):
            np.add(total, got[u].masked, out=total)
        self.u3 = u3
        self._dead = dead
        self._masked_sum = total
        live, gone = tuple(sorted(u3)), tuple(sorted(self.u2 - u3))
        self._phase = _ServerPhase.CONFIRM
        return {v: ConfirmRequest(self.round, v, live, gone) for v in live}

    def receive_confirm(self, replies: Iterable[ConfirmReply], digest: bytes) -> dict[int, UnmaskRequest]:
        """Stage 3, first exchange → second: check the survivors' signatures of the survivor
        set, the dead set and ``digest`` (the :func:`~fedfdp.secagg.identity.round_digest`
        of what the server sent); one :class:`UnmaskRequest` per survivor that confirmed,
        carrying the tags its neighbours that confirmed addressed to it (a survivor that
        dropped after collect stays in U3: its seed is reconstructed).

        Raises
        ------
        MessageError
            A reply whose signature does not verify (the state is unchanged; drop it and
            call again).
        ConsistencyError
            A survivor that confirmed has fewer than ``t`` confirmations in its
            neighbourhood (it would refuse): the round is aborted before anything is
            unmasked.
        """
        self._expect(_ServerPhase.CONFIRM, "receive_confirm")
        got = self._by_sender(replies, ConfirmReply, self.u3, Stage.UNMASK)
        if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
            raise ValueError(f"digest: must be {DIGEST_BYTES} bytes")
        statement = confirmation(self.run or 0, self.round, self.u3, self.u2 - self.u3, digest)
        for u, r in got.items():
            if not verify(self._identity[u], statement, r.signature):
                raise MessageError(f"ConfirmReply.signature of node {u}: not a confirmation of this round's "
                                   "sets and digest", field="signature", node_id=u)
            if set(r.dsts) != self._nbrs[u] & self.u3:
                raise MessageError(f"ConfirmReply.dsts of node {u}: {sorted(r.dsts)}, expected its live "
                                   f"neighbours {sorted(self._nbrs[u] & self.u3)}", field="dsts", node_id=u)
        confirmed = frozenset(got)
        self._digest = digest
        self._unmask_asked = {}
        for v in sorted(confirmed):
            signers = tuple(sorted(self._nbrs[v] & confirmed))
            if 1 + len(signers) < self.threshold:
                self._fail()
                raise ConsistencyError(f"stage {Stage.UNMASK.value}: node {v} has {1 + len(signers)} "
                                       f"confirmations in its neighbourhood, fewer than t={self.threshold}; "
                                       "round aborted")
            live = tuple(sorted(self.neighbourhood(v) & self.u3))
            dead = tuple(sorted(self._nbrs[v] & self._dead))
            tags = tuple(got[u].macs[got[u].dsts.index(v)] for u in signers)
            self._unmask_asked[v] = UnmaskRequest(self.round, v, live, dead, signers, tags)
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
            A dead node's reconstructed key does not match its published public key, or
            some node's shares are inconsistent (they reconstruct no 32-byte secret).
        """
        self._expect(_ServerPhase.UNMASK, "receive_unmask")
        got = self._by_sender(replies, UnmaskReply, self.u3, Stage.UNMASK)
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
        live, dead = sorted(self.u3), sorted(self._dead)

        seeds = self._reconstruct("seed", live, b_shares)
        keys_raw = self._reconstruct("mask key", dead, sk_shares)
        for u, seed in zip(live, seeds, strict=True):
            key = self_mask_key(seed, self.round, u, digest=self._digest)
            np.subtract(total, prg_uint32(key, self.dim), out=total)
        for w, raw in zip(dead, keys_raw, strict=True):
            keys = KeyPair.from_private_bytes(raw)
            if keys.public != self._pk_mask[w]:
                self._fail()
                raise ReconstructionError(
                    f"stage {Stage.UNMASK.value}: the key shares of node {w} do not reconstruct its "
                    "published mask key"
                )
            for v in sorted(self._nbrs[w] & self.u3):
                key = pair_mask_key(keys.agree(self._pk_mask[v]), self.round, v, w, digest=self._digest)
                mask = prg_uint32(key, self.dim)
                # v added +mask when w > v and -mask when w < v
                (np.subtract if w > v else np.add)(total, mask, out=total)
        total.setflags(write=False)
        result = AggregateResult(total, self.u1, self.u2, self.u3, frozenset(got))
        self._wipe()
        self._phase = _ServerPhase.DONE
        return result

    # -- helpers -------------------------------------------------------------------------

    def _reconstruct(self, what: str, owners: list[int], store: Mapping[int, list[Share]]) -> list[bytes]:
        """Each owner's secret from the ``t`` of its shares with the lowest indices, all at
        once (without dropouts every owner's index set is the same, so one set of Lagrange
        coefficients serves the round); inconsistent shares fail the round.
        """
        t = self.threshold
        try:
            return combine_many([sorted(store[u], key=lambda s: s.index)[:t] for u in owners])
        except InconsistentShares as err:
            self._fail()
            raise ReconstructionError(f"stage {Stage.UNMASK.value}: the {what} shares of node "
                                      f"{owners[err.group]} are inconsistent (they reconstruct no "
                                      "32-byte secret)") from None

    def _expect(self, phase: _ServerPhase, method: str) -> None:
        if self._phase is not phase:
            raise SessionStateError(
                f"{method}: the session of round {self.round} is {self._phase.value}, not {phase.value}"
            )

    def _by_sender(
        self, replies: Iterable[_M], cls: type[_M], asked: frozenset[int], stage: Stage
    ) -> dict[int, _M]:
        out: dict[int, _M] = {}
        for r in replies:
            if not isinstance(r, cls):
                raise MessageError(
                    f"stage {stage.value}: got a {type(r).__name__}, expected {cls.__name__}", field="type"
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
                    f"{cls.__name__}.node_id={u}: unknown id, not asked at stage {stage.value}",
                    field="node_id",
                    node_id=u,
                )
            if u in out:
                raise MessageError(
                    f"{cls.__name__}.node_id={u}: duplicate sender at stage {stage.value}",
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
        self._identity = {}
        self._unmask_asked = {}
        self._masked_sum = None
        self._dead = frozenset()

    def _fail(self) -> None:
        self._wipe()
        self._phase = _ServerPhase.FAILED


