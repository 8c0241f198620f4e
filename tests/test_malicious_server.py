"""A server that deviates from SecAgg+ is caught by the nodes (fedfdp.secagg: identities,
the derived graph, the signed consistency check, the survivor floor, no partial sums).

The adversary here is a server of its own: it builds the protocol's own messages (the
dataclasses of :mod:`fedfdp.secagg.messages`) as it likes, runs nodes it controls as
real :class:`~fedfdp.secagg.ClientSession` objects, and uses the honest
:class:`~fedfdp.secagg.ServerSession` where it does not deviate (e.g. fed only the
replies it pretends arrived). Nothing in production code knows it is being tested.

Each attack is first shown to work where it does (the control): against a node whose
trust lacks the check's input — a roster that holds the adversary's keys, no roster, a
floor at the protocol's minimum — or, for the two-gap partial sum, from exactly what an
unmask releases when every threshold holds, computed from the nodes' own secrets. Then
it is caught, and the node releases nothing more (no shares, or fewer than ``t`` of a
target's). Expected values are the raw inputs summed in uint64 (no code under test).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message

from clients.client_app import make_client_app
from fedfdp.config import load_config
from fedfdp.data import load_dataset
from fedfdp.run_plan import build_plan
from fedfdp.secagg.client_session import ClientSession
from fedfdp.secagg.crypto import (
    SHARE_VALUE_BYTES,
    KeyPair,
    Share,
    combine_shares,
    encryption_key,
    open_sealed,
    pair_mask_key,
    prg_uint32,
    seal,
    self_mask_key,
    share_secret,
)
from fedfdp.secagg.errors import ConsistencyError, MessageError, RequestRefused
from fedfdp.secagg.graph import graph_seed, is_connected, ring_order
from fedfdp.secagg.identity import NodeTrust, Roster, SigningKey, advertisement
from fedfdp.secagg.messages import (
    CollectRequest,
    ConfirmRequest,
    KeysRequest,
    SetupReply,
    UnmaskReply,
    UnmaskRequest,
)
from fedfdp.secagg.server_session import ServerSession
from fedfdp.secagg.session import default_neighbours
from fedfdp.secagg.wire import SECAGG, from_wire, to_wire
from simulations.identities import write_identities
from strategies.fdp_strategy import FDPStrategy
from tests.flower_helpers import InProcessGrid, node_context
from tests.test_secagg_protocol import (
    DIGEST,
    RUN,
    client_for,
    clients_for,
    inputs,
    reference_sum,
    roster_for,
    signing_key,
    start,
)

ROUND = 7
#: The digest of another model (sent to one node only).
OTHER_DIGEST = hashlib.sha256(b"fedfdp test: a crafted model").digest()


def u32(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.uint64) % np.uint64(2**32)).astype(np.uint32)


def _random_share_pair() -> bytes:
    """Two share values of random secrets (what a server inventing shares sends)."""
    return b"".join(share_secret(os.urandom(32), 1, 1)[0].value for _ in range(2))


def shares_of(replies: list[UnmaskReply], owner: int, kind: str) -> list[Share]:
    """The ``kind`` ('b' or 'sk') shares of ``owner`` in ``replies``."""
    out = []
    for r in replies:
        owners, blobs = (r.b_owners, r.b_shares) if kind == "b" else (r.sk_owners, r.sk_shares)
        out += [Share.from_bytes(b) for o, b in zip(owners, blobs, strict=True) if o == owner]
    return out


# -- key swap ------------------------------------------------------------------------------


def _swap_keys(trust_sybils: bool, *, sign_as_sybils: bool) -> dict:
    """The server relays X25519 keys of its own as every neighbour's of the victim (node 4).

    ``sign_as_sybils``: the advertisements are signed by identities of the server's own
    (one per neighbour; on the victim's roster when ``trust_sybils``); else the real
    neighbours' identities and signatures are kept over the swapped keys.
    """
    ids = list(range(1, 8))
    server = start(ids, 16, neighbours=5)  # t = 3, four neighbours each
    victim = 4
    nbrs = tuple(sorted(server.neighbours(victim)))
    evil = {w: KeyPair.generate() for w in nbrs}
    sybil = {w: SigningKey.generate() for w in nbrs}
    roster = roster_for(ids)
    if trust_sybils:
        roster = Roster({**roster.parties, **{f"server-{w}": sybil[w].public for w in nbrs}})
    clients = clients_for(ids)
    clients[victim] = client_for(victim, ids, roster=roster)
    setups = {u: clients[u].setup(r) for u, r in server.setup_requests().items()}
    pks = tuple(evil[w].public for w in nbrs)
    if sign_as_sybils:
        identities = tuple(sybil[w].public for w in nbrs)
        signatures = tuple(sybil[w].sign(advertisement(RUN, ROUND, w, evil[w].public, evil[w].public))
                           for w in nbrs)
    else:
        identities = tuple(setups[w].identity for w in nbrs)
        signatures = tuple(setups[w].signature for w in nbrs)
    request = KeysRequest(ROUND, victim, nbrs, pks, pks, identities, signatures)
    return {"client": clients[victim], "request": request, "evil": evil, "nbrs": nbrs,
            "setup": setups[victim]}


def test_key_swap_works_when_the_roster_holds_the_servers_keys_and_is_refused_otherwise():
    rng = np.random.default_rng(11)
    # control: the victim's roster holds the server's identities (as if they were parties):
    # it shares with the server's keys, which opens every share, rebuilds the victim's seed
    # and strips its masks — the victim's input, exactly
    att = _swap_keys(True, sign_as_sybils=True)
    client, nbrs, evil, setup = att["client"], att["nbrs"], att["evil"], att["setup"]
    keys = client.share_keys(att["request"])
    opened = []
    for w, ct in zip(keys.dsts, keys.ciphertexts, strict=True):
        plain = open_sealed(encryption_key(evil[w].agree(setup.pk_enc), ROUND, 4, w), ct, round_=ROUND, src=4,
                            dst=w)
        opened.append(Share(int.from_bytes(plain[:2], "big"), plain[2 : 2 + SHARE_VALUE_BYTES]))
    seed = combine_shares(opened[:3])
    index = {v: i + 1 for i, v in enumerate(sorted({*nbrs, 4}))}
    cts = tuple(seal(encryption_key(evil[w].agree(setup.pk_enc), ROUND, w, 4),
                     index[w].to_bytes(2, "big") + _random_share_pair(), round_=ROUND, src=w, dst=4)
                for w in nbrs)
    x = inputs([4], 16, rng)[4]
    y = client.collect(CollectRequest(ROUND, 4, nbrs, cts), x, DIGEST).masked
    got = y - prg_uint32(self_mask_key(seed, ROUND, 4, digest=DIGEST), 16)
    for w in nbrs:
        mask = prg_uint32(pair_mask_key(evil[w].agree(setup.pk_mask), ROUND, 4, w, digest=DIGEST), 16)
        got = got - mask if w > 4 else got + mask
    np.testing.assert_array_equal(got, x)  # the attack works

    # caught: the real roster refuses the server's identities; nothing is encrypted
    att = _swap_keys(False, sign_as_sybils=True)
    with pytest.raises(RequestRefused, match="not on the roster"):
        att["client"].share_keys(att["request"])
    assert att["client"].finished
    with pytest.raises(RequestRefused):
        att["client"].collect(CollectRequest(ROUND, 4, (), ()), np.zeros(16, np.uint32), DIGEST)
    # caught: the neighbours' real identities and signatures over swapped keys
    att = _swap_keys(False, sign_as_sybils=False)
    with pytest.raises(RequestRefused, match="not signed by its identity"):
        att["client"].share_keys(att["request"])
    # caught: one neighbour's identity relayed for two of them (the honest keys otherwise)
    ids = list(range(1, 8))
    server = start(ids, 16, neighbours=5)
    clients = clients_for(ids)
    r = server.receive_setup([clients[u].setup(q) for u, q in server.setup_requests().items()])[4]
    with pytest.raises(RequestRefused, match="uses the identity of node"):
        clients[4].share_keys(dataclasses.replace(r, identities=(r.identities[0], *r.identities[:-1])))


# -- sybils -------------------------------------------------------------------------------------


def _drive(server: ServerSession, clients: dict[int, ClientSession], xs: dict[int, np.ndarray]):
    """Every node answers every stage honestly; returns the aggregate."""
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    conf = server.receive_collect([clients[u].collect(r, xs[u], DIGEST) for u, r in coll.items()])
    unm = server.receive_confirm([clients[u].confirm(r) for u, r in conf.items()], DIGEST)
    return server.receive_unmask([clients[u].unmask(r) for u, r in unm.items()])


def test_sybils_isolate_a_node_without_a_roster_and_are_refused_with_one():
    """The server fills a round with six nodes of its own (own keys, known inputs) around
    one real node: without a roster the sum minus the sybils' inputs is the target's input;
    with the deployment's roster the target refuses the sybils' advertisements."""
    rng = np.random.default_rng(12)
    target, sybils = 1, [2, 3, 4, 5, 6, 7]
    ids = [target, *sybils]
    xs = inputs(ids, 32, rng)
    sybil_keys = {u: SigningKey.generate() for u in sybils}

    def sybil(u: int) -> ClientSession:
        return ClientSession(u, NodeTrust(sybil_keys[u], None, 3), run=RUN)

    # control: a node with no roster (NodeTrust.roster is None)
    roster_less = ClientSession(target, NodeTrust(signing_key(target), None, 3), run=RUN)
    clients = {target: roster_less, **{u: sybil(u) for u in sybils}}
    result = _drive(start(ids, 32, neighbours=5), clients, xs)
    others = reference_sum(xs, sybils)
    np.testing.assert_array_equal(u32(result.total.astype(np.uint64) - others + np.uint64(2**32)), xs[target])

    # caught: the target's roster names the real parties (the server's nodes are not there)
    real = Roster({f"party-{i}": (signing_key(target) if i == 0 else SigningKey.generate()).public
                   for i in range(7)})
    clients = {target: client_for(target, ids, roster=real), **{u: sybil(u) for u in sybils}}
    server = start(ids, 32, neighbours=5)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    with pytest.raises(RequestRefused, match="not on the roster"):
        clients[target].share_keys(keys[target])
    assert clients[target].finished  # no share ciphertext, no masked vector, no share ever


# -- a different model to one node ---------------------------------------------------------------


def test_a_different_model_to_one_node_is_caught_and_its_input_stays_masked():
    """Node v receives another model (digest) than its neighbours. Its masks are keyed
    by what it received, so they do not cancel: the aggregate minus everyone else's
    input is not x_v; the honest server sees v's confirmation fail; v refuses to unmask
    on its neighbours' confirmations."""
    rng = np.random.default_rng(13)
    ids = list(range(1, 10))
    d = 64
    xs = inputs(ids, d, rng)
    v = 5
    digest = {u: OTHER_DIGEST if u == v else DIGEST for u in ids}
    # control: the same model everywhere decodes exactly
    exact = _drive(start(ids, d, neighbours=5), clients_for(ids), xs)
    np.testing.assert_array_equal(exact.total.astype(np.uint64), reference_sum(xs, ids))

    server = start(ids, d, neighbours=5)
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    conf = server.receive_collect([clients[u].collect(r, xs[u], digest[u]) for u, r in coll.items()])
    confirms = {u: clients[u].confirm(r) for u, r in conf.items()}
    # the honest server: v's confirmation does not match what it sent
    with pytest.raises(MessageError, match=f"signature of node {v}") as err:
        server.receive_confirm(list(confirms.values()), DIGEST)
    assert err.value.node_id == v
    # the adversary leaves v's confirmation out and asks v with its neighbours' signatures
    unm = server.receive_confirm([c for u, c in confirms.items() if u != v], DIGEST)
    signers = tuple(sorted(server.neighbours(v)))
    forged = UnmaskRequest(ROUND, v, tuple(sorted(server.neighbourhood(v))), (), signers,
                           tuple(confirms[u].macs[confirms[u].dsts.index(v)] for u in signers))
    with pytest.raises(RequestRefused, match="did not confirm the same"):
        clients[v].unmask(forged)
    result = server.receive_unmask([clients[u].unmask(r) for u, r in unm.items()])
    rest = reference_sum(xs, [u for u in ids if u != v])
    isolated = u32(result.total.astype(np.uint64) - rest + np.uint64(2**32))
    assert np.mean(isolated == xs[v]) < 0.05  # masks left in: noise, not x_v


# -- a survivor set that isolates a node ---------------------------------------------------------


def _isolate(floor: int) -> tuple[ClientSession, ServerSession, dict, list[UnmaskReply] | None]:
    """Full graph of 7 (k = 7, t = 4): target 1, colluders 2-4 (their inputs known), honest
    5-7 pretended dead after collect. U3 = {1, 2, 3, 4} is connected and meets every
    threshold; the sum over it minus the colluders' inputs is x_1."""
    rng = np.random.default_rng(14)
    ids = list(range(1, 8))
    xs = inputs(ids, 16, rng)
    server = start(ids, 16, neighbours=7, min_survivors=4)  # the adversary's own minimum
    clients = clients_for(ids)
    clients[1] = client_for(1, ids, min_survivors=floor)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    replies = [clients[u].collect(r, xs[u], DIGEST) for u, r in coll.items()]
    kept = [r for r in replies if r.node_id <= 4]  # 5, 6, 7 "timed out"
    conf = server.receive_collect(kept)
    confirms = []
    for u, r in conf.items():
        try:
            confirms.append(clients[u].confirm(r))
        except RequestRefused:
            assert u == 1
    if len(confirms) < 4:
        return clients[1], server, xs, None
    unm = server.receive_confirm(confirms, DIGEST)
    return clients[1], server, xs, [clients[u].unmask(r) for u, r in unm.items()]


def test_a_survivor_set_that_isolates_a_node_is_refused_below_its_floor():
    # control: a node whose floor is the protocol's minimum (3) unmasks for U3 = {1, 2, 3, 4}
    _, server, xs, shares = _isolate(3)
    assert shares is not None
    result = server.receive_unmask(shares)
    colluders = reference_sum(xs, [2, 3, 4])
    np.testing.assert_array_equal(u32(result.total.astype(np.uint64) - colluders + np.uint64(2**32)), xs[1])
    # caught: a node that assumes 2 honest shares and 3 colluders needs 5 survivors
    target, server, _, shares = _isolate(5)
    assert shares is None and target.finished
    with pytest.raises(RequestRefused):
        target.unmask(UnmaskRequest(ROUND, 1, (1, 2, 3, 4), (5, 6, 7)))
    # the colluders alone hold 3 < t = 4 shares of the target's seed: nothing to rebuild
    assert server.threshold == 4


# -- replayed or reordered stages ----------------------------------------------------------------


def test_replayed_and_reordered_stages_are_refused():
    rng = np.random.default_rng(15)
    ids = list(range(1, 10))
    xs = inputs(ids, 8, rng)
    server = start(ids, 8, neighbours=7)  # t = 4: three losses leave every count >= 4
    clients = clients_for(ids)
    setup_requests = server.setup_requests()
    keys = server.receive_setup([clients[u].setup(r) for u, r in setup_requests.items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    # reordered: unmask before the consistency check, collect twice, confirm twice
    with pytest.raises(RequestRefused, match="unmask request refused, its session is keys shared"):
        clients[1].unmask(UnmaskRequest(ROUND, 1, (1,), ()))
    conf = server.receive_collect([clients[u].collect(r, xs[u], DIGEST) for u, r in coll.items() if u != 1])
    with pytest.raises(RequestRefused, match="collect request refused"):
        clients[2].collect(coll[2], xs[2], DIGEST)
    confirms = {u: clients[u].confirm(r) for u, r in conf.items() if u not in (2, 3)}
    clients[3].confirm(conf[3])  # node 3 confirms (its answer lost) ...
    with pytest.raises(RequestRefused, match="its session is confirmed"):
        clients[3].confirm(conf[3])  # ... and refuses to confirm again
    unm = server.receive_confirm(list(confirms.values()), DIGEST)
    replies = [clients[u].unmask(r) for u, r in unm.items()]
    result = server.receive_unmask(replies)
    np.testing.assert_array_equal(result.total.astype(np.uint64), reference_sum(xs, result.u3))
    v = replies[0].node_id
    with pytest.raises(RequestRefused, match="already answered unmask"):
        clients[v].unmask(unm[v])  # replayed unmask

    # replayed round: a node that unmasked round 7 refuses round 7 (or earlier) again; the
    # control: without that memory (after_round = -1) the replay is accepted
    assert clients[v].after_round == ROUND
    fresh = client_for(v, ids, after_round=ROUND)
    with pytest.raises(RequestRefused, match="not after round 7"):
        fresh.setup(setup_requests[v])
    with pytest.raises(RequestRefused, match="not after round 7"):
        client_for(v, ids, after_round=ROUND).setup(start(ids, 8, neighbours=7, round_=3).setup_requests()[v])
    forgetful = client_for(v, ids)
    forgetful.setup(setup_requests[v])  # the control: accepted
    later = client_for(v, ids, after_round=ROUND)
    later.setup(start(ids, 8, neighbours=7, round_=ROUND + 1).setup_requests()[v])

    # confirmations of another round, or of another run, do not verify
    def to_unmask(round_: int, run: int):
        srv = start(ids, 8, neighbours=7, round_=round_)
        cl = clients_for(ids, run=run)
        k = srv.receive_setup([cl[u].setup(r) for u, r in srv.setup_requests().items()])
        c = srv.receive_keys([cl[u].share_keys(r) for u, r in k.items()])
        f = srv.receive_collect([cl[u].collect(r, xs[u], DIGEST) for u, r in c.items()])
        return cl, srv.receive_confirm([cl[u].confirm(r) for u, r in f.items()], DIGEST)

    # (a node's tags of round 7, run 5, replayed into round 8 or into run 6)
    _, old = to_unmask(ROUND, RUN)
    for round_, run in ((ROUND + 1, RUN), (ROUND, RUN + 1)):
        cl, new = to_unmask(round_, run)
        u = next(iter(new))
        assert len(new[u].signers) == len(old[u].signers) == 6  # k = 7: six neighbours each
        with pytest.raises(RequestRefused, match="did not confirm the same"):
            cl[u].unmask(dataclasses.replace(new[u], macs=old[u].macs))


# -- two gaps: the partial sum -------------------------------------------------------------------


def test_two_gaps_in_the_ring_release_an_arcs_sum_today_and_are_refused_now():
    """30 nodes, k = 11 (h = 5, t = 6), 10 dropped at collect in two gaps of 5: every
    threshold holds, yet the live graph is two arcs of 10. Control: the seeds of the live
    nodes and the mask keys of the dead ones (what an unmask releases, taken here from the
    nodes' own state) give the exact sum of one arc. Now: the honest server aborts before
    any unmask request; an adversary that asks anyway is refused by every node, and a
    survivor set of one arc (connected) is refused below the nodes' floor of 20."""
    rng = np.random.default_rng(16)
    ids = list(range(1, 31))
    d = 32
    k = default_neighbours(30)
    assert k == 11
    xs = inputs(ids, d, rng)
    ring = ring_order(graph_seed(ROUND, k, ids), ids)
    gone = {ring[i] for i in (*range(0, 5), *range(15, 20))}
    arc = [ring[i] for i in range(5, 15)]
    live = set(ids) - gone

    def round_until_collect(floor: int):
        server = start(ids, d)
        clients = clients_for(ids, min_survivors=floor)
        setups = {u: clients[u].setup(r) for u, r in server.setup_requests().items()}
        keys = server.receive_setup(list(setups.values()))
        coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
        secrets = {u: ClientSession.restore(clients[u].export_state()) for u in ids}
        masked = {u: clients[u].collect(r, xs[u], DIGEST) for u, r in coll.items() if u in live}
        return server, clients, setups, secrets, masked

    server, clients, setups, secrets, masked = round_until_collect(20)
    # every threshold holds: the old guards would not fire
    t = server.threshold
    assert all(len(server.neighbourhood(u) & live) >= t for u in live)
    assert all(len(server.neighbours(w) & live) >= t for w in gone)
    assert not is_connected({u: server.neighbours(u) for u in ids}, live)

    # control: the arc's sum from the live seeds and the dead mask keys
    total = np.zeros(d, np.uint32)
    for u in arc:
        total += masked[u].masked
        seed = secrets[u]._seed
        assert seed is not None
        total -= prg_uint32(self_mask_key(seed, ROUND, u, digest=DIGEST), d)
        for w in sorted(server.neighbours(u) & gone):
            dead_key = secrets[w]._mask_keys
            assert dead_key is not None
            mask = prg_uint32(pair_mask_key(dead_key.agree(setups[u].pk_mask), ROUND, u, w, digest=DIGEST), d)
            total = total - mask if w > u else total + mask
    np.testing.assert_array_equal(total.astype(np.uint64), reference_sum(xs, arc))

    # now: the honest server aborts at collect, before any request of the unmask stage
    with pytest.raises(ConsistencyError, match="disconnected"):
        server.receive_collect(list(masked.values()))
    assert server.failed
    # an adversary asks anyway: every node refuses, nothing is signed, nothing unmasked
    survivors, dead = tuple(sorted(live)), tuple(sorted(gone))
    for u in survivors:
        with pytest.raises(ConsistencyError, match="disconnected"):
            clients[u].confirm(ConfirmRequest(ROUND, u, survivors, dead))
        assert clients[u].finished
    # and a survivor set of one arc only (connected, 10 < 20): refused by the floor
    server, clients, _, _, masked = round_until_collect(20)
    others = tuple(sorted(set(ids) - set(arc)))
    for u in arc:
        with pytest.raises(RequestRefused, match="fewer than the 20"):
            clients[u].confirm(ConfirmRequest(ROUND, u, tuple(sorted(arc)), others))


def test_a_node_checks_the_survivor_sets_against_the_shares_it_received():
    """The confirm request must account for every neighbour whose shares the node holds
    (live or dead) and for no other; a node is never both; it is itself live."""
    rng = np.random.default_rng(17)
    ids = list(range(1, 10))
    xs = inputs(ids, 8, rng)
    server = start(ids, 8, neighbours=5)
    clients = clients_for(ids)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    coll = server.receive_keys([clients[u].share_keys(r) for u, r in keys.items()])
    conf = server.receive_collect([clients[u].collect(r, xs[u], DIGEST) for u, r in coll.items()])
    a, b, c, e = list(conf)[:4]
    nb = sorted(server.neighbours(a))
    with pytest.raises(RequestRefused, match="both live and dead"):
        clients[a].confirm(dataclasses.replace(conf[a], dead=(nb[0],)))
    with pytest.raises(RequestRefused, match="as live"):
        clients[b].confirm(dataclasses.replace(conf[b], live=tuple(u for u in conf[b].live if u != b),
                                               dead=(b,)))
    hidden = sorted(server.neighbours(c))[0]  # a neighbour that shared, listed nowhere
    with pytest.raises(RequestRefused, match="as sharing keys"):
        clients[c].confirm(dataclasses.replace(conf[c], live=tuple(u for u in conf[c].live if u != hidden)))
    with pytest.raises(MessageError, match="unknown ids"):
        clients[e].confirm(dataclasses.replace(conf[e], dead=(999,)))


def test_a_setup_naming_too_few_parties_or_a_wrong_graph_is_refused():
    ids = list(range(1, 8))
    server = start(ids, 8, neighbours=5)
    req = server.setup_requests()[1]
    with pytest.raises(RequestRefused, match="7 parties, fewer than the 8"):
        client_for(1, ids, min_survivors=8).setup(req)
    with pytest.raises(RequestRefused, match="degree k=4"):
        client_for(1, ids).setup(dataclasses.replace(req, degree=4))
    with pytest.raises(MessageError, match="does not list this node"):
        client_for(1, ids).setup(dataclasses.replace(req, parties=(2, 3, 4, 5, 6, 7, 8)))


def test_an_honest_server_drops_an_advertisement_its_identity_did_not_sign():
    ids = list(range(1, 6))
    server = start(ids, 8)
    clients = clients_for(ids)
    reps = [clients[u].setup(r) for u, r in server.setup_requests().items()]
    forged = SetupReply(reps[0].round, reps[0].node_id, reps[0].run, KeyPair.generate().public,
                        reps[0].pk_enc, reps[0].identity, reps[0].signature)
    with pytest.raises(MessageError, match="not its identity's signature") as err:
        server.receive_setup([forged, *reps[1:]])
    assert err.value.node_id == reps[0].node_id
    assert isinstance(server.receive_setup(reps), dict)


def test_signing_keys_and_rosters_persist_and_refuse_bad_files(tmp_path):
    key = SigningKey.load_or_create(tmp_path / "node" / "key")
    assert SigningKey.load_or_create(tmp_path / "node" / "key").public == key.public
    assert (os.stat(tmp_path / "node" / "key").st_mode & 0o777) == 0o600
    with pytest.raises(FileExistsError):
        key.save(tmp_path / "node" / "key")
    (tmp_path / "short").write_bytes(b"x" * 31)
    with pytest.raises(ValueError, match="31 bytes, expected 32"):
        SigningKey.load(tmp_path / "short")
    roster = Roster({"a": key.public, "b": SigningKey.generate().public})
    roster.to_file(tmp_path / "roster.toml")
    assert Roster.from_file(tmp_path / "roster.toml") == roster
    assert key.public in roster and len(roster) == 2
    (tmp_path / "bad.toml").write_text('version = 1\n[parties]\na = "zz"\n')
    with pytest.raises(ValueError, match="bad.toml"):
        Roster.from_file(tmp_path / "bad.toml")
    with pytest.raises(ValueError, match="share one key"):
        Roster({"a": key.public, "b": key.public})
    with pytest.raises(ValueError, match="not on its roster"):
        NodeTrust(SigningKey.generate(), roster, 3)
    with pytest.raises(ValueError, match="min_survivors=2"):
        NodeTrust(key, roster, 2)
    assert "SigningKey(public=" in repr(key) and key.to_bytes().hex() not in repr(key)


def test_the_session_state_round_trips_with_its_trust():
    ids = list(range(1, 6))
    server = start(ids, 8)
    clients = clients_for(ids, min_survivors=4)
    keys = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    restored = {u: ClientSession.restore(c.export_state()) for u, c in clients.items()}
    assert all(r.trust.min_survivors == 4 and r.trust.roster == roster_for(ids) for r in restored.values())
    coll = server.receive_keys([restored[u].share_keys(r) for u, r in keys.items()])
    assert all(len(r.srcs) >= server.threshold - 1 for r in coll.values())


def test_the_orchestrator_writes_each_nodes_key_in_its_own_folder_and_the_roster(tmp_path):
    dirs = {f"node-{p}": tmp_path / "node-state" / f"node-{p}" for p in range(3)}
    roster = write_identities(dirs, tmp_path / "roster.toml")
    assert Roster.from_file(tmp_path / "roster.toml") == roster and len(roster) == 3
    again = write_identities(dirs, tmp_path / "roster.toml")  # keys are kept, not replaced
    assert again == roster
    for name, folder in dirs.items():
        assert SigningKey.load(folder / "secagg-signing.key").public == roster.parties[name]


# -- the real ClientApp: nodes whose policy names a roster -----------------------------------------


def _policy_run(tmp_path, roster_parties: range, *, sybil_keys: bool = False):
    """A secagg round of the real strategy against the real ClientApp, every node with a
    policy naming a roster that :func:`simulations.identities.write_identities` wrote for the
    parties ``roster_parties`` (``sybil_keys``: the server relays keys of its own in sa_keys)."""
    cfg = load_config({"dataset": "fleet", "num-devices": 4, "records-per-device": 60, "num-rounds": 1,
                       "aggregation": "secagg", "secagg-min-survivors": 3, "progress": False,
                       "round-timeout": 30.0, "secagg-timeout": 30.0, "node-wait-timeout": 10.0,
                       "noise-multiplier": 1.0})
    state = tmp_path / "nodes"
    write_identities({f"node-{p}": state / f"node-{p}" for p in roster_parties}, tmp_path / "roster.toml")
    policy = tmp_path / "policy.toml"
    policy.write_text('max-epsilon = 50.0\ndelta = 1e-5\nmin-honest-shares = 3\nmax-colluders = 0\n'
                      'roster = "roster.toml"\n')
    app = make_client_app(cfg.to_flat(), nodes={"node-policy": str(policy), "node-state": str(state)})
    evil = KeyPair.generate()

    class Grid(InProcessGrid):
        def __init__(self) -> None:
            super().__init__(cfg)
            self.contexts: dict[int, Context] = {}
            self.refusals: list[str] = []

        def answer(self, msg: Message) -> Message:
            node = msg.metadata.dst_node_id
            context = self.contexts.setdefault(node, node_context(cfg, node))
            rec = msg.content.config_records.get(SECAGG)
            if sybil_keys and rec is not None and rec.get("type") == "KeysRequest":
                relayed = from_wire(KeysRequest, rec)
                swapped = dataclasses.replace(relayed, pk_enc=(evil.public,) * len(relayed.pk_enc))
                msg.content[SECAGG] = ConfigRecord({**dict(rec), **to_wire(swapped)})
            try:
                return app(msg, context)
            except Exception as exc:
                self.refusals.append(str(exc))
                return Message(error=Error(code=0, reason=str(exc)), reply_to=msg)

    data = load_dataset(cfg.data)
    plan = build_plan(cfg, data, num_devices=len(data.devices), evaluate=lambda r, m: {})
    strat = FDPStrategy(plan)
    grid = Grid()
    strat.start(grid, ArrayRecord(copy.deepcopy(plan.model.state_dict())))
    return strat, grid, state


def test_nodes_with_a_roster_in_their_policy_run_and_refuse_what_it_does_not_list(tmp_path):
    strat, grid, state = _policy_run(tmp_path, range(4))
    assert strat.stop_reason is None and len(strat.rows) == 1 and grid.refusals == []
    assert all((state / f"node-{p}" / "secagg-signing.key").is_file() for p in range(4))
    # a node whose key the roster does not list refuses in one line; the others go on
    strat, grid, _ = _policy_run(tmp_path / "three", range(3))
    assert strat.stop_reason is None and len(strat.rows) == 1
    assert grid.refusals and all("is not on the roster" in r and "\n" not in r for r in grid.refusals)
    # a server that relays its own encryption keys: every node refuses, nothing is charged
    strat, grid, _ = _policy_run(tmp_path / "swap", range(4), sybil_keys=True)
    assert strat.stop_reason is not None and strat.ledger is not None and strat.ledger.charges == []
    assert any("a swapped key" in r for r in grid.refusals)


def test_the_round_driver_aborts_a_disconnected_round_uncharged(caplog: pytest.LogCaptureFixture) -> None:
    """14 SuperNodes, k = 5 (h = 2), the nodes at two ring gaps of 2 fail at collect: every
    threshold holds, the survivors (10 >= n_min) are two arcs. The real strategy aborts
    each try before the charge; after 3 tries the run stops with nothing charged and the
    model untouched."""
    cfg = load_config({"dataset": "fleet", "num-devices": 14, "records-per-device": 20, "num-rounds": 1,
                       "aggregation": "secagg", "secagg-min-survivors": 8, "secagg-neighbours": 5,
                       "progress": False, "round-timeout": 30.0, "secagg-timeout": 30.0,
                       "node-wait-timeout": 10.0, "noise-multiplier": 1.0})
    app = make_client_app(cfg.to_flat())
    ring = ring_order(graph_seed(1, 5, range(14)), range(14))
    gone = {ring[i] for i in (0, 1, 7, 8)}

    class Grid(InProcessGrid):
        def __init__(self) -> None:
            super().__init__(cfg)
            self.contexts: dict[int, Context] = {}
            self.asked: list[str] = []

        def answer(self, msg: Message) -> Message:
            node = msg.metadata.dst_node_id
            context = self.contexts.setdefault(node, node_context(cfg, node))
            self.asked.append(msg.metadata.message_type)
            if node in gone and msg.metadata.message_type == "train.sa_collect":
                return Message(error=Error(code=0, reason="dropped"), reply_to=msg)
            return app(msg, context)

    data = load_dataset(cfg.data)
    plan = build_plan(cfg, data, num_devices=len(data.devices), evaluate=lambda r, m: {})
    initial = copy.deepcopy(plan.model.state_dict())
    strat = FDPStrategy(plan)
    grid = Grid()
    strat.start(grid, ArrayRecord(copy.deepcopy(plan.model.state_dict())))
    assert strat.stop_reason is not None and "aborted 3 times" in strat.stop_reason
    assert strat.ledger is not None and strat.ledger.charges == []
    assert grid.asked.count("train.sa_unmask") == 0  # not even the consistency check was sent
    logged = [r.getMessage() for r in caplog.records]
    aborts = [m for m in logged if "no unmask, no step, nothing charged" in m]
    assert len(aborts) == 3 and all("graph is disconnected" in m for m in aborts)
    assert all(np.array_equal(initial[k], v) for k, v in strat.model.state_dict().items())
