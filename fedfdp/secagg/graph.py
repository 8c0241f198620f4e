"""The neighbour graph of a SecAgg+ round: a ring in an order nobody chooses, and the
connectivity rule that forbids partial sums.

**The graph.** The ``n`` parties sit on a ring and each is joined to the ``h = ⌊k/2⌋``
nodes on either side (``k`` odd). The ring's order is not drawn by the server: it
sorts the parties by ``SHA-256(seed ‖ id)``, where the seed hashes the round, ``k`` and
the set of parties (:func:`graph_seed`). Every node derives its neighbours from the
setup request's public fields itself, so the server cannot place a target among nodes
of its choosing, and nodes agree on the graph without trusting the server. (The server still chooses who is
sampled; each choice yields one fixed graph. Against colluders the guarantee needs
``t_c < t``, a majority threshold, so no placement gives them ``t`` shares.)

**Why connectivity.** The pairwise masks of two live nodes cancel only when both
vectors are summed. If the live nodes' graph falls apart into components, each
component's masks cancel on their own, so from the unmasked seeds and dead keys of
one round the server recovers the sum of *each component* — a partial sum over fewer
parties than the round was charged for (with the ring: two runs of at least ``h``
dead nodes cut it into two arcs). A node therefore unmasks only when the confirmed
survivor set induces a connected graph (:func:`is_connected`), and the server aborts
(uncharged) before asking.

**How often honest dropouts cause it.** On the ring the live set is disconnected
exactly when at least two of the circular gaps between consecutive live nodes hold
``h`` or more dead nodes. :func:`disconnection_probability` computes the probability
exactly for independent dropouts (a transfer over the ring's positions); the numbers
are in ``docs/secagg_accounting.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["disconnection_probability", "graph_seed", "is_connected", "neighbour_graph", "ring_neighbours",
           "ring_order"]

_LABEL = b"fedfdp/secagg/v1/graph/"


def _u64(value: int) -> bytes:
    return int(value).to_bytes(8, "big")


def graph_seed(round_: int, degree: int, parties: Iterable[int]) -> bytes:
    """``SHA-256(label ‖ round ‖ k ‖ |parties| ‖ sorted parties)`` (8-byte integers)."""
    members = sorted(set(int(p) for p in parties))
    body = _u64(round_) + _u64(degree) + _u64(len(members)) + b"".join(_u64(p) for p in members)
    return hashlib.sha256(_LABEL + b"seed/" + body).digest()


def ring_order(seed: bytes, parties: Iterable[int]) -> tuple[int, ...]:
    """The parties sorted by ``SHA-256(seed ‖ id)`` (ties impossible in practice; broken by id)."""
    return tuple(sorted(set(int(p) for p in parties),
                        key=lambda p: (hashlib.sha256(_LABEL + seed + _u64(p)).digest(), p)))


def ring_neighbours(ring: Sequence[int], k: int) -> dict[int, frozenset[int]]:
    """Each node's ``k − 1`` neighbours: the ``⌊k/2⌋`` nodes on either side on ``ring``."""
    n = len(ring)
    half = k // 2
    return {
        u: frozenset(ring[(i + j) % n] for j in range(-half, half + 1) if j != 0) for i, u in enumerate(ring)
    }


def neighbour_graph(round_: int, degree: int, parties: Iterable[int]) -> dict[int, frozenset[int]]:
    """The round's graph: :func:`ring_neighbours` on :func:`ring_order` of :func:`graph_seed`."""
    members = sorted(set(int(p) for p in parties))
    return ring_neighbours(ring_order(graph_seed(round_, degree, members), members), degree)


def is_connected(graph: Mapping[int, frozenset[int]], live: Iterable[int]) -> bool:
    """True when ``live`` (non-empty) induces a connected subgraph of ``graph``."""
    alive = set(live)
    if not alive:
        return False
    start = next(iter(alive))
    seen = {start}
    todo = [start]
    while todo:
        u = todo.pop()
        for v in graph[u]:
            if v in alive and v not in seen:
                seen.add(v)
                todo.append(v)
    return seen == alive


def disconnection_probability(n: int, degree: int, dropout: float) -> float:
    """The probability that the live nodes of a ring of ``n`` with ``k = degree`` induce a
    disconnected graph when each node drops independently with probability ``dropout``.

    Exact: a transfer over positions ``0 … n−1`` keeping the length of the leading dead
    run, of the current dead run (both capped at ``h = ⌊k/2⌋``), whether a live node was
    seen, and the number of closed gaps of length ``≥ h`` (capped at 2); the gap that
    wraps around is the trailing run plus the leading one. Disconnected means at least
    two gaps of length ``≥ h`` (module docstring); an empty or single live set is not
    counted (it fails the survivor floor instead). With ``k ≥ n`` every pair is joined
    and the probability is 0.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise ValueError(f"n={n!r}: must be an integer >= 3")
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 3 or degree % 2 == 0:
        raise ValueError(f"degree={degree!r}: must be an odd integer >= 3")
    if not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout={dropout!r}: must be in [0, 1]")
    h = degree // 2
    if 2 * h >= n - 1:
        return 0.0
    p, q = float(dropout), 1.0 - float(dropout)
    # state: (seen_live, lead, run, big) -> probability; lead/run capped at h, big capped at 2
    states: dict[tuple[bool, int, int, int], float] = {(False, 0, 0, 0): 1.0}
    for _ in range(n):
        nxt: dict[tuple[bool, int, int, int], float] = {}
        for (seen, lead, run, big), pr in states.items():
            # dead here
            key = (seen, lead if seen else min(lead + 1, h), min(run + 1, h) if seen else 0, big)
            nxt[key] = nxt.get(key, 0.0) + pr * p
            # live here: closes the current gap (if a live node was seen before)
            closed = min(big + (1 if seen and run >= h else 0), 2)
            key = (True, lead, 0, closed)
            nxt[key] = nxt.get(key, 0.0) + pr * q
        states = nxt
    total = 0.0
    for (seen, lead, run, big), pr in states.items():
        if not seen:
            continue
        wrap = 1 if min(lead + run, h) >= h else 0
        if big + wrap >= 2:
            total += pr
    return total
