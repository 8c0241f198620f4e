"""SecAgg+ for one round as two pure state machines: the client's
(:class:`fedfdp.secagg.client_session.ClientSession`) and the server's
(:class:`fedfdp.secagg.server_session.ServerSession`); this module holds the protocol,
its security model and what both sides share (defaults, ids; the graph is
:mod:`fedfdp.secagg.graph`, identities :mod:`fedfdp.secagg.identity`).

The protocol is the secure aggregation of Bonawitz et al. (CCS 2017) on the sparse
neighbour graph of Bell et al. (CCS 2020), with the active-security additions of both
(signed keys, a consistency check), in four stages (messages in
:mod:`fedfdp.secagg.messages`):

0. **setup.** The server names the ``n`` sampled nodes, ``k`` (odd, default
   ``min(n, 2⌈log₂ n⌉ + 1)``) and ``t``. Every node derives the ring from a hash of
   (round, ``k``, nodes) and takes the ``⌊k/2⌋`` nodes on either side as neighbours;
   its *neighbourhood* ``N[u]`` is itself plus those ``k − 1`` nodes. Each node draws
   two X25519 key pairs, one for masks and one for encryption, and sends both public
   keys signed with its long-term Ed25519 identity. Responders: U1.
1. **share_keys.** Each node in U1 receives its neighbours' signed public keys, checks
   each against its roster (a distinct roster identity, a valid signature), draws a
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
   Mask keys are salted with the digest of the model and parameters the node received.
3. **unmask.** The dead nodes are ``U2 − U3``: a node that dropped before sending its
   shares is in no ``S_u``, its masks were never added, and nothing is recovered for
   it. First the consistency check: each node in U3 receives U3 and ``U2 − U3``,
   checks them (disjoint, itself live, at least its floor, a connected graph,
   consistent with the shares it holds) and confirms them with the digest (signed for
   the server, an HMAC for each live neighbour). Then each node that confirmed is
   asked for the ``b``-shares of the live members of its neighbourhood and the key
   shares of its dead neighbours, and answers once, when ``t`` members of its
   neighbourhood (itself included) confirmed the same. The
   server reconstructs each ``b_u`` (``u`` in U3) and each dead node's mask private
   key from ``t`` shares, removes the self masks and the pairwise masks that live
   nodes shared with dead ones, and obtains ``Σ_{u ∈ U3} x_u mod 2³²``.

Security model
--------------
A server that may deviate from the protocol, possibly colluding with fewer than ``t``
clients of any neighbourhood; the nodes hold a roster of the parties' identities that
the server cannot change. Its view is the signed public keys, ciphertexts it cannot
open, the masked vectors (one-time pads under the PRF assumption on AES), ``b_u`` for
``u`` in U3 and the mask keys of dead nodes: no node has both its ``b_u`` and its mask
key revealed, because a client refuses an unmask request that lists a node as both
live and dead, answers only one unmask request, and ``t > k/2``. Swapped keys and
sybils fail the roster check; a survivor set that differs between nodes fails the
confirmations; a disconnected survivor set (whose components' sums the unmasked
secrets would reveal) or one below a node's floor is refused. The server learns the sum
over a connected U3 of at least the nodes' floor, and the sets U1 ⊇ U2 ⊇ U3; the
:class:`ServerSession` never holds an individual unmasked input (it keeps only the
running sum of masked vectors). Computational assumptions: X25519 (CDH), Ed25519
(EUF-CMA), HKDF-SHA256, HMAC-SHA256 and SHA-256, AES-256 as a PRF, AES-256-GCM as an
AEAD (:mod:`fedfdp.secagg.crypto`). Out of scope: poisoning by clients; a node without a
roster cannot tell sybils or swapped keys from parties.

Failure rules
-------------
* After every stage, every node still needed must have at least ``t`` live members
  in its neighbourhood (the holders of its shares), else
  :class:`~fedfdp.secagg.errors.ThresholdError` naming the node and counts.
* Fewer survivors than ``min_survivors`` at any stage raises
  :class:`~fedfdp.secagg.errors.TooFewSurvivors`; after collect, the server raises it
  *before* producing any unmask request. A disconnected U3, or a confirming node with
  fewer than ``t`` confirmations in its neighbourhood, raises
  :class:`~fedfdp.secagg.errors.ConsistencyError`, also before any request for shares.
* A malformed reply (wrong length, unknown id, duplicate sender, wrong round) raises
  :class:`~fedfdp.secagg.errors.MessageError` naming the field, and leaves the
  server's state unchanged (the caller may drop that reply and call again). Threshold
  and survivor failures end the server session.
* A client that refuses or rejects a request wipes its secrets and answers nothing
  more in that round.

Arithmetic is in ``uint32`` with numpy's wrap-around, i.e. modulo 2³².
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedfdp.secagg.crypto import (
    MAX_NODE_ID,
)


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


def check_node_id(name: str, value: Any) -> int:
    """``value`` as a node id (an integer in ``[0, 2**64)``), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value <= MAX_NODE_ID:
        raise ValueError(f"{name}={value!r}: must be an integer in [0, 2**64)")
    return int(value)


