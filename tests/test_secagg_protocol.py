"""SecAgg+ as pure state machines (fedfdp.secagg): exact modular sums with dropouts at
every stage, the server's view (uniform masked vectors, no individual input held), the
client's refusals, threshold and survivor failures, message validation, the crypto
primitives against independent references, and the fixed-point encoding (error bounds,
unbiasedness, the coupled-rounding sensitivity bound, wrap-around).

References are independent of the code under test: sums of the raw inputs in uint64 /
Python ints, the RFC 5869 HKDF written with ``hmac``, PyCryptodome's AES-CTR for the
mask keystream, hand-computed scales, and closed-form rounding variances.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import os
from collections.abc import Iterable

import numpy as np
import pytest
from Crypto.Cipher import AES
from scipy import stats

from fedfdp.entropy import OSBits, SeededBits
from fedfdp.secagg.client_session import ClientSession
from fedfdp.secagg.crypto import (
    KeyPair,
    KeyPurpose,
    confirmation_key,
    derive_key,
    encryption_key,
    mac,
    mac_matches,
    neighbour_keys,
    open_sealed,
    pair_mask_key,
    prg_uint32,
    random_secret,
    seal,
    self_mask_key,
)
from fedfdp.secagg.encoding import (
    choose_scale,
    decode,
    default_scale,
    encode,
    from_ring,
    headroom,
    quantize,
    randomized_round,
    to_ring,
)
from fedfdp.secagg.errors import (
    AuthenticationError,
    ConsistencyError,
    MessageError,
    ReconstructionError,
    RequestRefused,
    SessionStateError,
    Stage,
    ThresholdError,
    TooFewSurvivors,
)
from fedfdp.secagg.graph import graph_seed, neighbour_graph, ring_order
from fedfdp.secagg.identity import NodeTrust, Roster, SigningKey, advertisement
from fedfdp.secagg.messages import (
    SHARE_PLAINTEXT_BYTES,
    CollectReply,
    CollectRequest,
    ConfirmReply,
    ConfirmRequest,
    KeysReply,
    KeysRequest,
    SetupReply,
    UnmaskRequest,
)
from fedfdp.secagg.server_session import AggregateResult, ServerSession
from fedfdp.secagg.session import default_neighbours, default_threshold

U32 = 2**32
K32, S64 = b"\x00" * 32, b"\x00" * 64
SPECIAL = np.array([0, 2**31 - 1, 2**31, 2**32 - 1], dtype=np.uint32)
STAGES = (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT, Stage.UNMASK)


#: The run of every session here, and the digest every node "received" with the model.
RUN = 5
DIGEST = hashlib.sha256(b"fedfdp test: the round's model").digest()


# -- identities: every node a roster member ---------------------------------------------

_SIGNING_KEYS: dict[int, SigningKey] = {}


def signing_key(u: int) -> SigningKey:
    """Node ``u``'s long-term key (one per id for the test process, from the OS CSPRNG)."""
    return _SIGNING_KEYS.setdefault(u, SigningKey.generate())


def roster_for(ids: Iterable[int]) -> Roster:
    """The roster of the nodes ``ids``: what reaches each node outside the server."""
    return Roster({f"node-{u}": signing_key(u).public for u in ids})


def client_for(u: int, ids: Iterable[int], *, min_survivors: int = 3, run: int = RUN,
               roster: Roster | None = None, after_round: int = -1) -> ClientSession:
    """Node ``u``'s session, trusting the roster of ``ids`` (or ``roster``)."""
    trust = NodeTrust(signing_key(u), roster or roster_for(ids), min_survivors)
    return ClientSession(u, trust, run=run, after_round=after_round)


def clients_for(ids: Iterable[int], **kw: object) -> dict[int, ClientSession]:
    members = sorted(ids)
    return {u: client_for(u, members, **kw) for u in members}  # type: ignore[arg-type]


def confirmed(server: ServerSession, clients: dict[int, ClientSession],
              confirms: dict[int, ConfirmRequest], skip: Iterable[int] = ()) -> dict[int, UnmaskRequest]:
    """The unmask requests after every survivor (but ``skip``) confirmed."""
    gone = set(skip)
    return server.receive_confirm([clients[u].confirm(r) for u, r in confirms.items() if u not in gone],
                                  DIGEST)


# -- a driver: one round, in process ---------------------------------------------------


@dataclasses.dataclass
class Round:
    server: ServerSession
    clients: dict[int, ClientSession]
    masked: dict[int, np.ndarray]
    unmask_requests: dict[int, UnmaskRequest]
    confirm_requests: dict[int, ConfirmRequest] = dataclasses.field(default_factory=dict)


def node_ids(n: int, rng: np.random.Generator) -> list[int]:
    """Distinct unsigned 64-bit ids, including the extremes 1 and 2**64 - 1."""
    ids = {1, 2**64 - 1}
    while len(ids) < n:
        ids.add(int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)))
    return sorted(ids)


def inputs(ids: Iterable[int], d: int, rng: np.random.Generator) -> dict[int, np.ndarray]:
    out = {}
    for u in ids:
        x = rng.integers(0, U32, d, dtype=np.uint64).astype(np.uint32)
        x[: SPECIAL.size] = SPECIAL
        out[u] = x
    return out


def reference_sum(xs: dict[int, np.ndarray], members: Iterable[int]) -> np.ndarray:
    """Σ x_u mod 2³² in uint64 (no uint32 wrap-around involved)."""
    total = np.zeros(next(iter(xs.values())).size, dtype=np.uint64)
    for u in members:
        total += xs[u].astype(np.uint64)
    return (total % np.uint64(U32)).astype(np.uint64)


def start(ids: list[int], d: int, **kw: object) -> ServerSession:
    return ServerSession(kw.pop("round_", 7), ids, d, **kw)  # type: ignore[arg-type]


def run_round(
    server: ServerSession, xs: dict[int, np.ndarray], drop: dict[Stage, set[int]] | None = None
) -> tuple[AggregateResult, Round]:
    """Drive every stage; nodes in ``drop[stage]`` do not answer that stage."""
    drop = drop or {}
    clients = clients_for(server.sampled)
    rnd = Round(server, clients, {}, {})
    reqs = server.setup_requests()
    reps = [clients[u].setup(r) for u, r in reqs.items() if u not in drop.get(Stage.SETUP, set())]
    keys = server.receive_setup(reps)
    reps2 = [clients[u].share_keys(r) for u, r in keys.items() if u not in drop.get(Stage.SHARE_KEYS, set())]
    coll = server.receive_keys(reps2)
    reps3 = []
    for u, r in coll.items():
        if u in drop.get(Stage.COLLECT, set()):
            continue
        reply = clients[u].collect(r, xs[u], DIGEST)
        rnd.masked[u] = reply.masked
        reps3.append(reply)
    rnd.confirm_requests = server.receive_collect(reps3)
    unm = confirmed(server, clients, rnd.confirm_requests)
    rnd.unmask_requests = unm
    reps4 = [clients[u].unmask(r) for u, r in unm.items() if u not in drop.get(Stage.UNMASK, set())]
    return server.receive_unmask(reps4), rnd


def far_apart(server: ServerSession, count: int) -> list[int]:
    """Up to ``count`` nodes pairwise at graph distance > 2: every neighbourhood then
    contains at most one of them, so dropping them keeps every count >= k - 1 >= t."""
    chosen: list[int] = []
    for u in sorted(server.sampled):
        close = server.neighbourhood(u).union(*(server.neighbourhood(v) for v in server.neighbours(u)))
        if not close & set(chosen):
            chosen.append(u)
        if len(chosen) == count:
            break
    return chosen


def ks_for(n: int) -> list[int]:
    return sorted({k for k in (3, 5, default_neighbours(n), n if n % 2 else n - 1) if 3 <= k <= n})


# -- exact sums ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(5, 13))
def test_exact_modular_sum_with_a_dropout_at_each_stage(n):
    rng = np.random.default_rng(1000 + n)
    d = 24
    ids = node_ids(n, rng)
    xs = inputs(ids, d, rng)
    for k in ks_for(n):
        scenarios: list[dict[Stage, set[int]]] = [{}]
        for stage in STAGES:
            scenarios.append({stage: {ids[(k + len(scenarios)) % n]}})
        for drop in scenarios:
            server = start(ids, d, neighbours=k)
            result, rnd = run_round(server, xs, drop)
            dropped = {s: next(iter(v)) for s, v in drop.items()}
            expected_u3 = set(ids) - {
                dropped[s] for s in (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT) if s in dropped
            }
            assert set(result.u3) == expected_u3, (n, k, drop)
            assert set(result.u1) == set(ids) - ({dropped[Stage.SETUP]} if Stage.SETUP in dropped else set())
            assert result.u1 >= result.u2 >= result.u3
            np.testing.assert_array_equal(result.total.astype(np.uint64), reference_sum(xs, result.u3))
            # dead = U2 - U3: a node that dropped before sending its shares is never "dead"
            listed_dead = set().union(*(set(r.dead) for r in rnd.unmask_requests.values()))
            assert listed_dead <= set(result.u2) - set(result.u3)
            if Stage.COLLECT in dropped:
                assert listed_dead == {dropped[Stage.COLLECT]}
            else:
                assert listed_dead == set()


@pytest.mark.parametrize("n", [11, 12, 16])
def test_exact_sum_with_dropouts_at_all_stages_in_one_round(n):
    rng = np.random.default_rng(2000 + n)
    d = 40
    ids = node_ids(n, rng)
    xs = inputs(ids, d, rng)
    server = start(ids, d, neighbours=5)  # single gaps shorter than ⌊k/2⌋: the survivors stay connected
    chosen = far_apart(server, 4)
    assert len(chosen) >= 2
    drop = {stage: {u} for stage, u in zip(STAGES, chosen, strict=False)}
    result, _ = run_round(server, xs, drop)
    gone = set().union(*(drop.get(s, set()) for s in STAGES[:3]))
    assert set(result.u3) == set(ids) - gone
    np.testing.assert_array_equal(result.total.astype(np.uint64), reference_sum(xs, result.u3))


def test_extreme_inputs_sum_exactly():
    """Every node sends 2**32 - 1 (or 2**31): the sum wraps many times and is still exact."""
    ids = [3, 9, 27, 81, 243, 2**64 - 1]
    d = 8
    xs = {u: np.full(d, 2**32 - 1, dtype=np.uint32) for u in ids}
    xs[ids[0]][:] = 2**31
    result, _ = run_round(start(ids, d, neighbours=5), xs)
    expected = (sum(int(xs[u][0]) for u in ids)) % U32
    assert result.total.tolist() == [expected] * d


def test_default_parameters():
    # k = min(n, 2*ceil(log2 n) + 1), made odd; t = floor(k/2) + 1 (hand-computed)
    assert [default_neighbours(n) for n in (3, 4, 5, 6, 8, 10, 16, 17, 100, 1000)] == [
        3,
        3,
        5,
        5,
        7,
        9,
        9,
        11,
        15,
        21,
    ]
    assert [default_threshold(k) for k in (3, 5, 7, 15)] == [2, 3, 4, 8]
    s = ServerSession(0, list(range(10, 110)), 4)
    assert (s.neighbour_count, s.threshold, s.min_survivors) == (15, 8, 8)
    # the ring: every node has k - 1 distinct neighbours, symmetric, never itself
    for u in s.sampled:
        assert len(s.neighbours(u)) == 14 and u not in s.neighbours(u)
        assert all(u in s.neighbours(v) for v in s.neighbours(u))


def test_the_ring_is_derived_not_drawn_by_the_server():
    """The graph is a function of (round, k, parties): the same inputs give the same graph
    on every side, another round a different one (171 possible neighbour pairs for node 1
    in a ring of 20 with k = 3), and every node derives its neighbours from its setup
    request alone."""
    ids = list(range(1, 21))
    assert len({tuple(sorted(ServerSession(0, ids, 4, neighbours=3).neighbours(1))) for _ in range(5)}) == 1
    rings = {tuple(sorted(ServerSession(r, ids, 4, neighbours=3).neighbours(1))) for r in range(30)}
    assert len(rings) > 5
    server = ServerSession(3, ids, 4, neighbours=5)
    graph = neighbour_graph(3, 5, ids)
    assert all(graph[u] == server.neighbours(u) for u in ids)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"neighbours": 4}, "neighbours=4"),
        ({"neighbours": 9}, "neighbours=9"),
        ({"neighbours": 5, "threshold": 2}, "threshold=2"),
        ({"neighbours": 5, "threshold": 6}, "threshold=6"),
        ({"neighbours": 5, "min_survivors": 2}, "min_survivors=2"),
        ({"neighbours": 5, "min_survivors": 8}, "min_survivors=8"),
    ],
)
def test_server_parameters_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        ServerSession(0, list(range(7)), 4, **kw)


def test_too_few_or_duplicate_nodes_refused():
    with pytest.raises(ValueError, match="at least 3"):
        ServerSession(0, [1, 2], 4)
    with pytest.raises(ValueError, match="duplicate"):
        ServerSession(0, [1, 2, 2, 3], 4)
    with pytest.raises(ValueError, match="node_ids"):
        ServerSession(0, [1, 2, 2**64], 4)


# -- the server's view ---------------------------------------------------------------------


def test_masked_vectors_look_uniform():
    """χ² test of the top 8 bits of 10⁶ masked coordinates; inputs are all zero or
    all 2³¹ (maximally structured). Rejects uniformity at level 1e-4."""
    n, d = 5, 200_000
    ids = [11, 22, 33, 44, 55]
    xs = {u: np.full(d, 0 if i % 2 else 2**31, dtype=np.uint32) for i, u in enumerate(ids)}
    _, rnd = run_round(start(ids, d, neighbours=5), xs, {Stage.UNMASK: {33}})
    top = np.concatenate([rnd.masked[u] >> np.uint32(24) for u in ids])
    assert top.size == n * d
    counts = np.bincount(top, minlength=256)
    p = stats.chisquare(counts).pvalue
    assert p > 1e-4, p
    # the same test does reject the raw inputs
    raw = np.concatenate([xs[u] >> np.uint32(24) for u in ids])
    assert stats.chisquare(np.bincount(raw, minlength=256) + 0.0).pvalue < 1e-4


def _arrays_and_bytes(obj: object, seen: set[int] | None = None) -> Iterable[object]:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray | bytes | bytearray):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _arrays_and_bytes(k, seen)
            yield from _arrays_and_bytes(v, seen)
    elif isinstance(obj, list | tuple | set | frozenset):
        for v in obj:
            yield from _arrays_and_bytes(v, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _arrays_and_bytes(getattr(obj, f.name), seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            yield from _arrays_and_bytes(v, seen)


def _assert_holds_no_individual(
    server: ServerSession, xs: dict[int, np.ndarray], masked: dict[int, np.ndarray]
):
    found = list(_arrays_and_bytes(server))
    for u, x in xs.items():
        raw = x.tobytes()
        for obj in found:
            if isinstance(obj, np.ndarray):
                assert not (obj.shape == x.shape and np.array_equal(obj, x)), f"server holds x_{u}"
                if u in masked:
                    assert not (obj.shape == x.shape and np.array_equal(obj, masked[u])), (
                        f"server holds y_{u}"
                    )
            elif isinstance(obj, bytes | bytearray):
                assert raw not in bytes(obj), f"server holds the bytes of x_{u}"


def test_server_never_holds_an_individual_input():
    rng = np.random.default_rng(5)
    ids = node_ids(9, rng)
    d = 64
    xs = inputs(ids, d, rng)
    server = start(ids, d, neighbours=5)  # t = 3: any two losses leave every count >= 3
    drop = {Stage.COLLECT: {ids[0]}, Stage.UNMASK: {ids[1]}}
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    replies = [clients[u].collect(r, xs[u], DIGEST) for u, r in coll.items() if u not in drop[Stage.COLLECT]]
    masked = {r.node_id: np.array(r.masked) for r in replies}
    unm = confirmed(server, clients, server.receive_collect(replies))
    del replies
    _assert_holds_no_individual(server, xs, masked)  # mid-round: only the running sum
    result = server.receive_unmask(
        [clients[u].unmask(r) for u, r in unm.items() if u not in drop[Stage.UNMASK]]
    )
    _assert_holds_no_individual(server, xs, masked)
    np.testing.assert_array_equal(result.total.astype(np.uint64), reference_sum(xs, result.u3))
    # and the walk does find what it looks for: a server that kept a reply would fail
    server.leak = [masked[next(iter(masked))]]  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="server holds y_"):
        _assert_holds_no_individual(server, xs, masked)


# -- refusals and failures -------------------------------------------------------------------


def _to_unmask(n: int = 7, k: int = 5, drop_collect: bool = True):
    ids = list(range(100, 100 + n))
    d = 16
    xs = inputs(ids, d, np.random.default_rng(n))
    server = start(ids, d, neighbours=k)
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    dead = ids[0] if drop_collect else None
    conf = server.receive_collect([clients[u].collect(r, xs[u], DIGEST)
                                   for u, r in coll.items() if u != dead])
    unm = confirmed(server, clients, conf)
    return server, clients, unm, xs, dead


def test_node_listed_live_and_dead_is_refused():
    _, clients, unm, _, dead = _to_unmask()
    v = next(u for u, r in unm.items() if dead in r.dead)
    honest = unm[v]
    greedy = dataclasses.replace(honest, live=(*honest.live, dead))
    with pytest.raises(RequestRefused, match="both live and dead"):
        clients[v].unmask(greedy)
    # the session is over: even the honest request is refused now
    with pytest.raises(RequestRefused):
        clients[v].unmask(honest)
    # a live neighbour listed both ways (its seed share and its key share) is refused too
    w = next(u for u, r in unm.items() if u != v and len(r.live) > 1)
    other = next(x for x in unm[w].live if x != w)
    with pytest.raises(RequestRefused, match="both live and dead"):
        clients[w].unmask(dataclasses.replace(unm[w], dead=(*unm[w].dead, other)))


def test_node_listed_as_dead_in_its_own_request_is_refused():
    _, clients, unm, _, _ = _to_unmask()
    v = next(iter(unm))
    r = unm[v]
    with pytest.raises(RequestRefused, match="as dead"):
        clients[v].unmask(dataclasses.replace(r, live=tuple(x for x in r.live if x != v), dead=(*r.dead, v)))


def test_second_unmask_is_refused():
    _, clients, unm, _, _ = _to_unmask()
    v = next(iter(unm))
    reply = clients[v].unmask(unm[v])
    assert set(reply.b_owners) == set(unm[v].live)
    with pytest.raises(RequestRefused, match="already answered unmask"):
        clients[v].unmask(unm[v])
    with pytest.raises(RequestRefused):
        clients[v].unmask(dataclasses.replace(unm[v], live=unm[v].live[:1]))


def test_unknown_ids_in_unmask_request_rejected():
    _, clients, unm, _, _ = _to_unmask()
    v = next(iter(unm))
    with pytest.raises(MessageError, match="unknown ids") as err:
        clients[v].unmask(dataclasses.replace(unm[v], dead=(*unm[v].dead, 999)))
    assert err.value.field == "dead"


def _isolate(server: ServerSession) -> tuple[int, set[int]]:
    """A node and its two ring neighbours (k = 3): dropping both leaves it alone."""
    a = min(server.sampled)
    return a, set(server.neighbours(a))


@pytest.mark.parametrize("stage", STAGES)
def test_fewer_than_t_live_neighbours_fails_the_stage(stage):
    ids = list(range(1, 8))
    d = 8
    xs = inputs(ids, d, np.random.default_rng(3))
    server = start(ids, d, neighbours=3)  # t = 2
    a, pair = _isolate(server)
    with pytest.raises(ThresholdError) as err:
        run_round(server, xs, {stage: pair})
    e = err.value
    assert (e.stage, e.node_id, e.live, e.threshold) == (stage, a, 1, 2)
    assert f"node {a}" in str(e) and "t=2" in str(e)
    assert server.failed
    with pytest.raises(SessionStateError):
        server.receive_unmask([])


def test_client_refuses_to_share_with_fewer_than_t():
    ids = [1, 2, 3, 4, 5, 6, 7]
    server = start(ids, 4, neighbours=5)
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    req = keys[5]
    one = dataclasses.replace(req, ids=req.ids[:1], pk_mask=req.pk_mask[:1], pk_enc=req.pk_enc[:1],
                              identities=req.identities[:1], signatures=req.signatures[:1])
    with pytest.raises(ThresholdError, match="node 5 has 2 members") as err:
        clients[5].share_keys(one)
    assert err.value.stage is Stage.SHARE_KEYS


def test_client_refuses_minority_threshold():
    ids = [1, 2, 3, 4, 5, 6, 7]
    c = client_for(5, ids)
    req = start(ids, 4, neighbours=5).setup_requests()[5]
    with pytest.raises(RequestRefused, match="threshold t=2"):
        c.setup(dataclasses.replace(req, threshold=2))


def test_below_min_survivors_no_share_is_asked():
    ids = list(range(1, 10))
    d = 8
    xs = inputs(ids, d, np.random.default_rng(4))
    server = start(ids, d, neighbours=5, min_survivors=8)
    gone = {ids[0], ids[1]}  # two losses: every neighbourhood (k = 5, t = 3) still has >= 3
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    replies = [clients[u].collect(r, xs[u], DIGEST) for u, r in coll.items() if u not in gone]
    with pytest.raises(TooFewSurvivors, match="7 nodes survive, fewer than min_survivors=8") as err:
        server.receive_collect(replies)
    assert (err.value.stage, err.value.survivors, err.value.minimum) == (Stage.COLLECT, 7, 8)
    assert server.failed
    # no unmask request exists anywhere in the server, and nothing can be unmasked
    assert not any(isinstance(o, UnmaskRequest) for o in _objects(server))
    assert not any(isinstance(o, np.ndarray) for o in _arrays_and_bytes(server))
    with pytest.raises(SessionStateError):
        server.receive_unmask([])
    # the clients still hold their shares, unasked
    assert all(not c.finished for u, c in clients.items() if u not in gone)


def test_disconnected_survivors_abort_before_any_unmask_request():
    """Two gaps of ⌊k/2⌋ dead nodes cut the ring into two arcs: every threshold holds, yet
    the server aborts at collect (ConsistencyError) and no request of the unmask stage
    exists."""
    ids = list(range(1, 15))
    d = 8
    xs = inputs(ids, d, np.random.default_rng(6))
    server = start(ids, d, neighbours=5)  # h = 2, t = 3
    ring = ring_order(graph_seed(7, 5, ids), ids)
    gone = {ring[3], ring[4], ring[10], ring[11]}
    with pytest.raises(ConsistencyError, match="disconnected"):
        run_round(server, xs, {Stage.COLLECT: gone})
    assert server.failed
    assert not any(isinstance(o, ConfirmRequest | UnmaskRequest) for o in _objects(server))


def _objects(obj: object, seen: set[int] | None = None) -> Iterable[object]:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    children: Iterable[object] = ()
    if isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset):
        children = obj
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        children = vars(obj).values()
    for c in children:
        yield from _objects(c, seen)


def test_too_few_survivors_at_setup():
    ids = list(range(1, 8))
    server = start(ids, 4, neighbours=3, min_survivors=6)
    clients = clients_for(ids)
    reps = [clients[u].setup(r) for u, r in server.setup_requests().items() if u not in (1, 2)]
    with pytest.raises(TooFewSurvivors) as err:
        server.receive_setup(reps)
    assert err.value.stage is Stage.SETUP and err.value.survivors == 5


def test_out_of_order_calls_refused():
    server = start([1, 2, 3], 4)
    with pytest.raises(SessionStateError, match="receive_keys"):
        server.receive_keys([])
    c = client_for(1, [1, 2, 3])
    with pytest.raises(RequestRefused, match="collect request refused"):
        c.collect(CollectRequest(7, 1, (), ()), np.zeros(4, np.uint32), DIGEST)


# -- tampering and validation ----------------------------------------------------------------


def _to_collect(n: int = 6):
    ids = list(range(1, n + 1))
    d = 8
    server = start(ids, d, neighbours=5)
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    return server, clients, coll, d


def test_tampered_ciphertext_is_rejected():
    _, clients, coll, d = _to_collect()
    v, r = next(iter(coll.items()))
    bad = bytearray(r.ciphertexts[1])
    bad[40] ^= 0x01
    tampered = dataclasses.replace(r, ciphertexts=(r.ciphertexts[0], bytes(bad), *r.ciphertexts[2:]))
    with pytest.raises(AuthenticationError, match=f"from node {r.srcs[1]} to node {v}") as err:
        clients[v].collect(tampered, np.zeros(d, np.uint32), DIGEST)
    assert err.value.node_id == r.srcs[1] and err.value.field == "ciphertexts"


def test_ciphertext_under_wrong_associated_data_is_rejected():
    _, clients, coll, d = _to_collect()
    v, r = next(iter(coll.items()))
    # swap two senders: each ciphertext is now presented as coming from the other node
    swapped = dataclasses.replace(r, ciphertexts=(r.ciphertexts[1], r.ciphertexts[0], *r.ciphertexts[2:]))
    with pytest.raises(AuthenticationError):
        clients[v].collect(swapped, np.zeros(d, np.uint32), DIGEST)
    # a ciphertext meant for another destination
    _, clients2, coll2, _ = _to_collect()
    a, b = sorted(coll2)[:2]
    shared = sorted(set(coll2[a].srcs) & set(coll2[b].srcs))[0]
    forwarded = dict(zip(coll2[a].srcs, coll2[a].ciphertexts, strict=True))[shared]
    cts = tuple(
        forwarded if s == shared else c for s, c in zip(coll2[b].srcs, coll2[b].ciphertexts, strict=True)
    )
    with pytest.raises(AuthenticationError):
        clients2[b].collect(dataclasses.replace(coll2[b], ciphertexts=cts), np.zeros(d, np.uint32), DIGEST)


def test_aead_binds_round_source_destination_and_key():
    key = random_secret()
    ct = seal(key, b"share", round_=3, src=1, dst=2)
    assert open_sealed(key, ct, round_=3, src=1, dst=2) == b"share"
    for kw in (
        {"round_": 4, "src": 1, "dst": 2},
        {"round_": 3, "src": 2, "dst": 1},
        {"round_": 3, "src": 1, "dst": 3},
    ):
        with pytest.raises(AuthenticationError):
            open_sealed(key, ct, **kw)
    with pytest.raises(AuthenticationError):
        open_sealed(random_secret(), ct, round_=3, src=1, dst=2)
    for i in range(len(ct)):
        bad = bytearray(ct)
        bad[i] ^= 0x80
        with pytest.raises(AuthenticationError):
            open_sealed(key, bytes(bad), round_=3, src=1, dst=2)
    assert ct != seal(key, b"share", round_=3, src=1, dst=2)  # fresh nonce each time


def test_replies_are_validated_and_a_bad_reply_leaves_the_server_unchanged():
    ids = [1, 2, 3, 4, 5]
    server = start(ids, 8, neighbours=5)
    clients = clients_for(ids)
    reps = [clients[u].setup(r) for u, r in server.setup_requests().items()]
    with pytest.raises(MessageError, match="duplicate sender") as err:
        server.receive_setup([*reps, reps[0]])
    assert err.value.field == "node_id"
    with pytest.raises(MessageError, match="unknown id") as err:
        server.receive_setup([*reps, dataclasses.replace(reps[0], node_id=99)])
    assert err.value.field == "node_id"
    with pytest.raises(MessageError, match="round=8") as err:
        server.receive_setup([dataclasses.replace(reps[0], round=8)])
    assert err.value.field == "round"
    copied = reps[0].pk_mask  # node 2 advertises (and signs) node 1's mask key
    sig = signing_key(2).sign(advertisement(RUN, 7, 2, copied, reps[1].pk_enc))
    with pytest.raises(MessageError, match="repeats a public key") as err:
        server.receive_setup([reps[0], dataclasses.replace(reps[1], pk_mask=copied, signature=sig)])
    with pytest.raises(MessageError, match="not its identity's signature") as err:
        server.receive_setup([reps[0], dataclasses.replace(reps[1], pk_mask=KeyPair.generate().public)])
    assert (err.value.field, err.value.node_id) == ("signature", 2)
    keys = server.receive_setup(reps)  # unchanged by the failed calls
    kreps = [clients[u].share_keys(r) for u, r in keys.items()]
    with pytest.raises(MessageError, match="dsts") as err:
        server.receive_keys(
            [dataclasses.replace(kreps[0], dsts=kreps[0].dsts[:-1], ciphertexts=kreps[0].ciphertexts[:-1])]
        )
    assert err.value.field == "dsts" and err.value.node_id == kreps[0].node_id
    coll = server.receive_keys(kreps)
    creps = [clients[u].collect(r, np.zeros(8, np.uint32), DIGEST) for u, r in coll.items()]
    with pytest.raises(MessageError, match="length 7, expected d=8") as err:
        server.receive_collect([CollectReply(7, 1, np.zeros(7, np.uint32))])
    assert err.value.field == "masked"
    conf = server.receive_collect(creps)
    crep = [clients[u].confirm(r) for u, r in conf.items()]
    with pytest.raises(MessageError, match="not a confirmation") as err:
        server.receive_confirm(crep, hashlib.sha256(b"another model").digest())
    assert err.value.field == "signature"
    unm = server.receive_confirm(crep, DIGEST)
    ureps = [clients[u].unmask(r) for u, r in unm.items()]
    first = ureps[0].b_shares[0]
    wrong_index = ((int.from_bytes(first[:2], "big") % 5) + 1).to_bytes(2, "big") + first[2:]
    forged = dataclasses.replace(ureps[0], b_shares=(wrong_index, *ureps[0].b_shares[1:]))
    with pytest.raises(MessageError, match="index") as err:
        server.receive_unmask([forged, *ureps[1:]])
    assert err.value.field == "b_shares"
    result = server.receive_unmask(ureps)
    assert result.total.tolist() == [0] * 8


def _to_unmask_replies(ids: list[int], d: int = 8):
    server = start(ids, d, neighbours=5)
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    conf = server.receive_collect([clients[u].collect(r, np.ones(d, np.uint32), DIGEST)
                                   for u, r in coll.items()])
    unm = confirmed(server, clients, conf)
    return server, [clients[u].unmask(r) for u, r in unm.items()]


def test_a_share_word_outside_the_field_is_a_malformed_unmask_reply():
    """A share value whose 4-byte word is not below 2^31 - 1 is refused in one line naming
    the field and the node; the server's state is unchanged (the honest replies then unmask)."""
    server, ureps = _to_unmask_replies([1, 2, 3, 4, 5])
    first = ureps[0].b_shares[0]
    outside = first[:2] + b"\xff\xff\xff\xff" + first[6:]
    forged = dataclasses.replace(ureps[0], b_shares=(outside, *ureps[0].b_shares[1:]))
    with pytest.raises(MessageError, match="element") as err:
        server.receive_unmask([forged, *ureps[1:]])
    assert (err.value.field, err.value.node_id) == ("b_shares", ureps[0].node_id)
    assert server.receive_unmask(ureps).total.tolist() == [5] * 8


def test_inconsistent_seed_shares_fail_the_round_naming_the_node():
    """Field elements, right index, but not the dealt share: the reconstruction is refused.
    Node 1's share of its own seed has index 1, one of the t = 3 lowest {1, 2, 3} used, whose
    Lagrange coefficient at 0 is 2·3 / ((2 − 1)(3 − 1)) = 3 (by hand): adding 3⁻¹·2³⁰ to the
    top limb's share adds exactly 2³⁰ to the top limb, which must be below 2¹⁶."""
    server, ureps = _to_unmask_replies([1, 2, 3, 4, 5])
    r = ureps[0]
    owner = r.b_owners[0]
    assert (r.node_id, owner, r.b_shares[0][:2]) == (1, 1, b"\x00\x01")
    p = 2**31 - 1
    raw = bytearray(r.b_shares[0])
    top = int.from_bytes(raw[-4:], "big")
    raw[-4:] = ((top + pow(3, -1, p) * 2**30) % p).to_bytes(4, "big")
    replies = [dataclasses.replace(r, b_shares=(bytes(raw), *r.b_shares[1:])), *ureps[1:]]
    with pytest.raises(ReconstructionError, match=f"seed shares of node {owner}") as err:
        server.receive_unmask(replies)
    assert "inconsistent" in str(err.value) and server.failed


def test_client_refuses_shares_outside_the_field_naming_the_sender():
    ids = [1, 2, 3, 4, 5]
    server = start(ids, 8, neighbours=5)
    clients = clients_for(ids)
    reps = {u: clients[u].setup(r) for u, r in server.setup_requests().items()}
    keys = server.receive_setup(list(reps.values()))
    kreps = [clients[u].share_keys(r) for u, r in keys.items()]
    coll = server.receive_keys(kreps)
    # node 2 (honest keys, but a bad dealer) seals a share pair with a word >= p to node 1,
    # under the key node 1 derived for it (read from node 1's exported state)
    victim, dealer = 1, 2
    key_from_dealer = ClientSession.restore(clients[victim].export_state())._open_keys[dealer]
    plain = (1).to_bytes(2, "big") + b"\xff" * (SHARE_PLAINTEXT_BYTES - 2)
    ct = seal(key_from_dealer, plain, round_=7, src=dealer, dst=victim)
    req = coll[victim]
    cts = tuple(ct if s == dealer else c for s, c in zip(req.srcs, req.ciphertexts, strict=True))
    with pytest.raises(MessageError, match="from node 2 are malformed") as err:
        clients[victim].collect(CollectRequest(7, victim, req.srcs, cts), np.zeros(8, np.uint32), DIGEST)
    assert (err.value.field, err.value.node_id) == ("ciphertexts", dealer)
    with pytest.raises(RequestRefused):  # the session ended: nothing more answered
        clients[victim].confirm(ConfirmRequest(7, victim, tuple(ids), ()))


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: SetupReply(1, 2, 0, b"\x00" * 31, b"\x00" * 32, K32, S64), "pk_mask"),
        (lambda: SetupReply(1, 2, 0, b"\x00" * 32, "x" * 32, K32, S64), "pk_enc"),  # type: ignore[arg-type]
        (lambda: SetupReply(1, -2, 0, b"\x00" * 32, b"\x00" * 32, K32, S64), "node_id"),
        (lambda: SetupReply(2**64, 2, 0, b"\x00" * 32, b"\x00" * 32, K32, S64), "round"),
        (lambda: SetupReply(1, 2, 0, K32, K32, K32, S64[:-1]), "signature"),
        (lambda: SetupReply(1, 2, 0, K32, K32, S64, S64), "identity"),
        (lambda: KeysRequest(1, 2, (3, 3), (K32,) * 2, (K32,) * 2, (K32,) * 2, (S64,) * 2), "ids"),
        (lambda: KeysRequest(1, 2, (3, 4), (K32,), (K32,) * 2, (K32,) * 2, (S64,) * 2), "pk_mask"),
        (lambda: KeysRequest(1, 2, (3, 4), (K32,) * 2, (K32,) * 2, (K32,) * 2, (S64,)), "signatures"),
        (lambda: UnmaskRequest(1, 2, (3, 4), (), (3, 4), (K32,)), "macs"),
        (lambda: UnmaskRequest(1, 2, (3, 4), (), (3,), (S64,)), "macs"),
        (lambda: ConfirmReply(1, 2, S64, (3, 4), (K32,)), "macs"),
        (lambda: ConfirmReply(1, 2, K32), "signature"),
        (lambda: KeysReply(1, 2, (3,), (b"\x00" * 93,)), "ciphertexts"),
        (lambda: CollectReply(1, 2, np.zeros(4, np.int64)), "masked"),
        (lambda: CollectReply(1, 2, np.zeros((2, 2), np.uint32)), "masked"),
        (lambda: UnmaskRequest(1, 2, (True,), (), (), ()), "live"),
    ],
)
def test_message_fields_are_validated(make, field):
    """Construction checks types, lengths (keys 32 bytes, signatures 64) and parallel tuples."""
    with pytest.raises(MessageError) as err:
        make()
    assert err.value.field == field
    assert field in str(err.value)


def test_request_for_another_node_or_round_refused():
    server = start([1, 2, 3, 4, 5], 4)
    reqs = server.setup_requests()
    with pytest.raises(MessageError, match="addressed to another node"):
        client_for(2, [1, 2, 3, 4, 5]).setup(reqs[1])
    c = client_for(1, [1, 2, 3, 4, 5])
    c.setup(reqs[1])
    with pytest.raises(MessageError, match="round=8"):
        c.share_keys(KeysRequest(8, 1, (), (), (), (), ()))


# -- primitives against independent references ---------------------------------------------


def test_prg_is_the_aes256_ctr_keystream_read_as_uint32():
    key = bytes(range(32))
    d = 1000
    ref = AES.new(key, AES.MODE_CTR, nonce=b"", initial_value=0).encrypt(bytes(4 * d))
    expected = [int.from_bytes(ref[4 * i : 4 * i + 4], "little") for i in range(d)]
    assert prg_uint32(key, d).tolist() == expected


def test_distinct_keys_give_distinct_masks():
    d = 16
    masks = {prg_uint32(random_secret(), d).tobytes() for _ in range(2000)}
    assert len(masks) == 2000
    # keys that agree after XOR-folding to 32 bits (Flower 1.41's seed) still differ
    key = bytearray(random_secret())
    other = bytearray(key)
    for word in (0, 1):
        other[4 * word] ^= 0x01
    a, b = prg_uint32(bytes(key), 4096), prg_uint32(bytes(other), 4096)
    fold = lambda k: np.bitwise_xor.reduce(np.frombuffer(bytes(k), "<u4"))  # noqa: E731
    assert fold(key) == fold(other)
    assert np.mean(a != b) > 0.99
    # pair keys: symmetric in the pair, distinct across pairs, rounds and purposes
    s = random_secret()
    assert pair_mask_key(s, 1, 5, 9, digest=DIGEST) == pair_mask_key(s, 1, 9, 5, digest=DIGEST)
    derived = {
        pair_mask_key(s, 1, 5, 9, digest=DIGEST),
        pair_mask_key(s, 2, 5, 9, digest=DIGEST),
        pair_mask_key(s, 1, 5, 10, digest=DIGEST),
        pair_mask_key(s, 1, 5, 9, digest=bytes(32)),  # another model: another mask
        self_mask_key(s, 1, 5, digest=DIGEST),
        encryption_key(s, 1, 5, 9),
        encryption_key(s, 1, 9, 5),
    }
    assert len(derived) == 7


def test_hkdf_matches_rfc5869_with_the_documented_info_layout():
    ikm = random_secret()

    def hkdf(ikm: bytes, info: bytes) -> bytes:  # RFC 5869, salt absent, L = 32
        prk = hmac.new(b"\x00" * 32, ikm, hashlib.sha256).digest()
        return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()

    info = (
        b"fedfdp/secagg/v1/pair-mask/"
        + (3).to_bytes(8, "big")
        + (4).to_bytes(8, "big")
        + (2**64 - 1).to_bytes(8, "big")
    )
    assert derive_key(ikm, KeyPurpose.MASK, 3, 4, 2**64 - 1) == hkdf(ikm, info)
    # mask keys: the round digest is the HKDF salt (RFC 5869's PRK = HMAC(salt, ikm))
    prk = hmac.new(DIGEST, ikm, hashlib.sha256).digest()
    assert pair_mask_key(ikm, 3, 2**64 - 1, 4, digest=DIGEST) == hmac.new(prk, info + b"\x01",
                                                                           hashlib.sha256).digest()


def test_neighbour_keys_are_the_three_hkdf_keys_of_the_pair():
    """One extract for a node's three keys with a neighbour: byte for byte the keys
    derived one by one (the ``cryptography`` package's HKDF), from both ends."""
    a, b = KeyPair.generate(), KeyPair.generate()
    s = a.agree(b.public)
    for round_, u, v in ((3, 5, 9), (0, 2**64 - 1, 1), (2**64 - 1, 7, 6)):
        mine = neighbour_keys(s, round_, u, v)
        assert mine == (confirmation_key(s, round_, u, v), encryption_key(s, round_, u, v),
                        encryption_key(s, round_, v, u))
        theirs = neighbour_keys(s, round_, v, u)
        assert (theirs[0], theirs[1], theirs[2]) == (mine[0], mine[2], mine[1])
    with pytest.raises(ValueError, match="distinct"):
        neighbour_keys(s, 1, 4, 4)
    with pytest.raises(ValueError, match=r"^v=-1: must be an integer"):
        neighbour_keys(s, 1, 4, -1)
    with pytest.raises(ValueError, match=r"^round=True: must be an integer"):
        neighbour_keys(s, True, 4, 5)
    with pytest.raises(ValueError, match="secret: must be 32 bytes"):
        neighbour_keys(s[:31], 1, 4, 5)


def test_confirmation_keys_are_pairwise_and_tags_are_hmac_sha256():
    """Both neighbours derive one confirmation key (distinct from their encryption keys and
    from another round's); a tag is RFC 2104 HMAC-SHA256, written here with hashlib alone."""
    a, b = KeyPair.generate(), KeyPair.generate()
    k_ab = confirmation_key(a.agree(b.public), 3, 5, 9)
    assert k_ab == confirmation_key(b.agree(a.public), 3, 9, 5)
    shared = a.agree(b.public)
    assert k_ab not in {confirmation_key(shared, 4, 5, 9), encryption_key(shared, 3, 5, 9),
                        encryption_key(shared, 3, 9, 5)}
    msg = b"a confirmation"
    block = k_ab + bytes(32)
    inner = hashlib.sha256(bytes(x ^ 0x36 for x in block) + msg).digest()
    assert mac(k_ab, msg) == hashlib.sha256(bytes(x ^ 0x5C for x in block) + inner).digest()
    assert mac_matches(k_ab, msg, mac(k_ab, msg)) and not mac_matches(k_ab, msg + b"!", mac(k_ab, msg))


def test_x25519_agreement_is_symmetric_and_keyed():
    a, b, c = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    assert a.agree(b.public) == b.agree(a.public)
    assert a.agree(b.public) != a.agree(c.public)
    assert KeyPair.from_private_bytes(a.private_bytes()).public == a.public
    with pytest.raises(ValueError):
        a.agree(bytes(32))  # low-order point


# -- encoding -------------------------------------------------------------------------------


def test_default_scale_and_headroom():
    # 2^ceil(log2(1000 sqrt d)), by hand: d = 1 -> 1000 -> 1024; 1e4 -> 1e5 -> 2^17; 1e5 -> 316228 -> 2^19
    assert default_scale(1) == 1024.0
    assert default_scale(10_000) == 2.0**17
    assert default_scale(100_000) == 2.0**19
    # 2^17 * 20000 > 2^31 but 2^16 * 20000 + 10 < 2^31
    assert choose_scale(10_000, max_records=20_000, parties=10) == 2.0**16
    assert choose_scale(10_000, max_records=100, parties=10) == 2.0**17
    # noise calibrated in integer units at the scale: sigma_loc(s) = 3 (s + 100)
    # 2^17 * 16350 < 2^31, but not with the noise's 7 sd (8.7e6) on top: the noise halves s
    assert choose_scale(10_000, max_records=16_350, parties=10) == 2.0**17
    s = choose_scale(10_000, max_records=16_350, parties=10, local_noise_std=lambda s: 3 * (s + 100))
    assert s == 2.0**16
    need = lambda s: s * 16_350 + 10 + 7 * 3 * (s + 100) * math.sqrt(10)  # noqa: E731
    assert need(s) < 2**31 <= need(2 * s)
    assert headroom(s, max_records=16_350, parties=10, local_noise_std=3 * (s + 100)) == pytest.approx(
        need(s)
    )
    with pytest.raises(ValueError, match="headroom"):
        choose_scale(4, max_records=2**31, parties=3)


def test_randomized_round_bounds_and_exact_fractions():
    y = np.array([0.0, 0.25, -0.25, 2.5, -2.5, np.nextafter(3.0, 0.0), -(2.0**52) + 0.5, 2.0**52 - 0.5, 1e-3])
    for u in (np.zeros_like(y), np.full_like(y, np.nextafter(1.0, 0.0)), np.full_like(y, 0.5)):
        r = randomized_round(y, u)
        assert r.dtype == np.int64
        diff = [int(ri) - yi for ri, yi in zip(r.tolist(), y.tolist(), strict=True)]
        assert all(abs(x) < 1 for x in diff)
        assert np.all((r == np.floor(y)) | (r == np.ceil(y)))
    with pytest.raises(ValueError, match="finite"):
        randomized_round(np.array([np.inf]), np.array([0.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        randomized_round(np.array([0.5]), np.array([1.0]))


def test_quantisation_error_bounds_and_no_bias():
    """n clients, no noise: |x̂ − Σx| < n·C/s everywhere; the rounding error is
    unbiased (total error within 5 sd of 0, sd from the closed-form Σ f(1−f)) and its
    mean square matches Σ f(1−f) within 5 %."""
    rng = np.random.default_rng(11)
    n, d, clip = 10, 20_000, 1.5
    records = rng.integers(1, 50, n)
    s = choose_scale(d, max_records=int(records.sum()), parties=n)
    xs = []
    for b in records:
        x = rng.standard_normal(d)
        xs.append(x / np.linalg.norm(x) * clip * b * rng.uniform(0.1, 1.0))
    stream = SeededBits(np.random.SeedSequence(12))  # test randomness, not secret
    z = [quantize(x, clip=clip, scale=s, stream=stream) for x in xs]
    ring = np.zeros(d, np.uint64)
    for zi in z:
        ring += to_ring(zi).astype(np.uint64)
    total = (ring % np.uint64(U32)).astype(np.uint32)
    xhat = decode(total, clip=clip, scale=s)
    truth = np.sum(xs, axis=0)
    assert np.max(np.abs(xhat - truth)) < n * clip / s
    y = [x * (s / clip) for x in xs]
    err = np.sum([zi - yi for zi, yi in zip(z, y, strict=True)], axis=0)  # integer units
    frac = [yi - np.floor(yi) for yi in y]
    var = np.sum([f * (1 - f) for f in frac], axis=0)
    assert abs(err.sum()) < 5 * math.sqrt(var.sum())
    assert abs(np.sum(err**2) / var.sum() - 1) < 0.05
    assert np.mean(var) <= n / 4


def test_quantize_uses_its_stream_and_fresh_os_bits_differ():
    x = np.linspace(-1, 1, 1000)
    a = quantize(x, clip=1.0, scale=10.5, stream=SeededBits(np.random.SeedSequence(3)))
    b = quantize(x, clip=1.0, scale=10.5, stream=SeededBits(np.random.SeedSequence(3)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(
        encode(x, clip=1.0, scale=10.5, stream=OSBits()), encode(x, clip=1.0, scale=10.5, stream=OSBits())
    )


def test_coupled_rounding_sensitivity_under_adversarial_shifts():
    """‖R(y+v) − R(y)‖ ≤ ‖v‖ + √d with a shared U, for shifts chosen knowing y and U
    (flip every coordinate with a tiny v; push fractions to the edges; random
    directions of norm s), and per coordinate |Δ_j − v_j| < 1."""
    rng = np.random.default_rng(21)
    d = 2_000
    y = rng.uniform(-50, 50, d)
    u = rng.uniform(0, 1, d)
    f = y - np.floor(y)
    eps = 1e-9
    shifts = {
        # push each fraction just past U (rounding flips up at almost no cost in ||v||)
        "flip_up": np.where(u >= f, (u - f) + eps, 0.0),
        # push each fraction to just below U from above (flips down)
        "flip_down": np.where(u < f, -(f - u) - eps, 0.0),
        "near_integers": np.round(rng.uniform(-3, 3, d)) + rng.choice([-eps, eps], d),
        "random_norm_s": (lambda g: g / np.linalg.norm(g) * 1024.0)(rng.standard_normal(d)),
        "zero": np.zeros(d),
    }
    for name, v in shifts.items():
        delta = (randomized_round(y + v, u) - randomized_round(y, u)).astype(np.float64)
        vv = (y + v) - y  # the shift actually applied in floating point
        assert np.all(np.abs(delta - vv) < 1), name
        assert np.linalg.norm(delta) <= np.linalg.norm(vv) + math.sqrt(d), name
    # the adversarial flips come close to the bound (it is tight up to ||v||)
    delta = randomized_round(y + shifts["flip_up"], u) - randomized_round(y, u)
    assert np.linalg.norm(delta) > 0.6 * math.sqrt(d)


def test_wrap_around_decodes_correctly():
    edge = np.array([2**31 - 1, -(2**31 - 1), -(2**31), 0, 1, -1], dtype=np.int64)
    np.testing.assert_array_equal(from_ring(to_ring(edge)), edge)
    # parts that overflow on the way, whose total is at the edges
    parts = [
        np.array([2**31 - 1, -(2**31 - 1), 2**31 - 1, -(2**31 - 1)], dtype=np.int64),
        np.array([2**31 - 1, -(2**31 - 1), -5, 5], dtype=np.int64),
        np.array([-(2**31 - 1), 2**31 - 1, 5, -5], dtype=np.int64),
    ]
    acc = np.zeros(4, dtype=np.uint64)
    for p in parts:
        acc += to_ring(p).astype(np.uint64)
    ring = (acc % np.uint64(U32)).astype(np.uint32)
    np.testing.assert_array_equal(from_ring(ring), np.sum(parts, axis=0))
    assert decode(ring, clip=2.0, scale=4.0).tolist() == [
        (2**31 - 1) / 2,
        -(2**31 - 1) / 2,
        (2**31 - 1) / 2,
        -(2**31 - 1) / 2,
    ]
    with pytest.raises(ValueError, match="uint32"):
        from_ring(np.array([1], dtype=np.int64))


def test_end_to_end_encode_mask_aggregate_decode():
    rng = np.random.default_rng(31)
    ids = list(range(40, 48))
    d, clip = 500, 2.0
    s = choose_scale(d, max_records=len(ids) * 20, parties=len(ids))
    xs = {u: rng.uniform(-1, 1, d) * clip * 20 / math.sqrt(d) for u in ids}
    encoded = {u: encode(xs[u], clip=clip, scale=s, stream=OSBits()) for u in ids}
    server = start(ids, d, neighbours=5)  # t = 3: any two losses leave every count >= 3
    gone = ids[:2]
    result, _ = run_round(server, encoded, {Stage.COLLECT: {gone[0]}, Stage.UNMASK: {gone[1]}})
    xhat = decode(result.total, clip=clip, scale=s)
    truth = np.sum([xs[u] for u in result.u3], axis=0)
    assert gone[0] not in result.u3 and gone[1] in result.u3
    assert np.max(np.abs(xhat - truth)) < len(result.u3) * clip / s


def test_secrets_are_read_from_os_urandom(monkeypatch):
    """Keys, seeds and nonces come from os.urandom (the OS CSPRNG), nothing else."""
    calls: list[int] = []

    def fake(n: int) -> bytes:
        calls.append(n)
        return bytes([7]) * n

    monkeypatch.setattr(os, "urandom", fake)
    assert random_secret() == bytes([7]) * 32
    # X25519 clamps the 32 bytes (RFC 7748 §5): clear bits 0-2 of byte 0 and bit 7 of byte 31, set bit 6
    expected = bytearray([7]) * 32
    expected[0] &= 0xF8
    expected[31] = (expected[31] & 0x7F) | 0x40
    assert KeyPair.from_private_bytes(bytes(expected)).public == KeyPair.generate().public
    assert seal(bytes(32), b"x", round_=0, src=0, dst=1)[:12] == bytes([7]) * 12
    assert calls == [32, 32, 12]


# -- the one vocabulary of stages -----------------------------------------------------


def test_the_stages_are_one_vocabulary_from_messages_to_flower_actions():
    """Stage names the stage in messages, its Flower train action (the ClientApp registers
    ``train.sa_setup`` … ``train.sa_unmask``), the wire's STAGES and the stage's message
    classes: one enum, in protocol order."""
    from fedfdp.secagg import messages
    from fedfdp.secagg.wire import MESSAGE_TYPES, REPLY_TO, STAGE_MESSAGES
    from fedfdp.secagg.wire import STAGES as WIRE_STAGES

    assert list(Stage) == list(STAGES)
    assert [s.value for s in Stage] == ["setup", "share_keys", "collect", "unmask"]
    assert WIRE_STAGES == ("sa_setup", "sa_keys", "sa_collect", "sa_unmask")
    assert [s.message_type for s in Stage] == ["train.sa_setup", "train.sa_keys", "train.sa_collect",
                                               "train.sa_unmask"]
    assert all(Stage.from_action(s.action) is s for s in Stage)
    with pytest.raises(ValueError, match="action='sa_reveal': not a secure-aggregation stage"):
        Stage.from_action("sa_reveal")
    pairs = {
        Stage.SETUP: (messages.SetupRequest, messages.SetupReply),
        Stage.SHARE_KEYS: (messages.KeysRequest, messages.KeysReply),
        Stage.COLLECT: (messages.CollectRequest, messages.CollectReply),
        Stage.UNMASK: (messages.UnmaskRequest, messages.UnmaskReply),
    }
    assert pairs == STAGE_MESSAGES
    # the unmask stage's first exchange, the consistency check, travels with its action
    assert {**dict(pairs.values()), messages.ConfirmRequest: messages.ConfirmReply} == REPLY_TO
    assert len(MESSAGE_TYPES) == 10 and MESSAGE_TYPES["ConfirmReply"] is messages.ConfirmReply


@pytest.mark.parametrize("stage", [Stage.SHARE_KEYS, Stage.COLLECT, Stage.UNMASK])
def test_a_client_refuses_a_stage_out_of_order_naming_it(stage):
    """A fresh session answers only setup: any later stage's request is refused, naming the
    stage as the messages name it."""
    client = client_for(5, [4, 5, 6])
    with pytest.raises(RequestRefused, match=f"node 5: {stage.value} request refused, its session is new"):
        if stage is Stage.SHARE_KEYS:
            client.share_keys(KeysRequest(0, 5, (), (), (), (), ()))
        elif stage is Stage.COLLECT:
            client.collect(CollectRequest(0, 5, (), ()), np.zeros(0, np.uint32), DIGEST)
        else:
            client.unmask(UnmaskRequest(0, 5, (), (), (), ()))


def test_a_round_restored_from_its_state_before_every_stage_sums_exactly():
    """Each node is rebuilt from its exported state before every stage (a node restarted
    mid-round): the state is a fixed point of restore/export, the sum exact with a
    dropout at collect, and a cut or padded state is refused in one line."""
    rng = np.random.default_rng(5)
    ids = node_ids(9, rng)
    xs = inputs(ids, 16, rng)
    server = start(ids, 16, neighbours=5)
    clients = clients_for(ids)

    def again(u: int) -> ClientSession:
        raw = clients[u].export_state()
        back = ClientSession.restore(raw)
        assert back.export_state() == raw
        for bad in (raw[:-1], raw + b"\x00", raw[:20]):
            with pytest.raises(ValueError, match=r"^client session state: unreadable") as err:
                ClientSession.restore(bad)
            assert "\n" not in str(err.value)
        clients[u] = back
        return back

    keys = server.receive_setup([again(u).setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([again(u).share_keys(r) for u, r in keys.items()])
    gone = ids[3]
    conf = server.receive_collect([again(u).collect(r, xs[u], DIGEST) for u, r in coll.items() if u != gone])
    unm = server.receive_confirm([again(u).confirm(r) for u, r in conf.items()], DIGEST)
    result = server.receive_unmask([again(u).unmask(r) for u, r in unm.items()])
    live = [u for u in ids if u != gone]
    assert sorted(result.u3) == live
    np.testing.assert_array_equal(result.total.astype(np.uint64), reference_sum(xs, live))


def test_the_signed_confirmation_has_the_documented_layout():
    """Label, run, round, then each set as its count and its sorted ids (8 bytes each,
    big-endian), then the digest; an id outside 64 bits is refused, naming the set."""
    from fedfdp.secagg.identity import confirmation

    def u64(x: int) -> bytes:
        return x.to_bytes(8, "big")

    live, dead = [2**64 - 1, 0, 17, 17], [5]
    want = (b"fedfdp/secagg/v1/confirmation/" + u64(3) + u64(9) + u64(3) + u64(0) + u64(17)
            + u64(2**64 - 1) + u64(1) + u64(5) + DIGEST)
    assert confirmation(3, 9, live, dead, DIGEST) == want
    assert confirmation(3, 9, (), (), DIGEST).endswith(u64(0) + u64(0) + DIGEST)
    with pytest.raises(ValueError, match=r"^dead=18446744073709551616: must be an integer"):
        confirmation(3, 9, live, [2**64], DIGEST)
    with pytest.raises(ValueError, match=r"^live=-1: must be an integer"):
        confirmation(3, 9, [-1, 4], dead, DIGEST)
