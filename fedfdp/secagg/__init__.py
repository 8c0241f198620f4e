"""Secure aggregation for an untrusted server (design: ``secagg_design.md``).

SecAgg+ (Bonawitz et al. 2017, sparse graph of Bell et al. 2020) as pure state
machines, its cryptographic primitives, and the fixed-point encoding into Z/2³²Z. No
module here imports Flower; the ClientApp handlers and the strategy's round driver
wrap these objects.

Security model: a server that may deviate from the protocol (swap keys, add sybils,
send different survivor sets or models to different nodes, unmask a disconnected
survivor set), colluding with fewer than ``t`` clients of a neighbourhood, is caught
by the nodes: signed key advertisements against a roster the server cannot change, a
neighbour graph nobody chooses, and a signed consistency check before unmasking
(:mod:`fedfdp.secagg.identity`, :mod:`fedfdp.secagg.graph`; Bonawitz et al. 2017,
Bell et al. 2020). Computational assumptions X25519 (CDH), Ed25519, HKDF-SHA256,
SHA-256, AES-256 as a PRF, AES-256-GCM as an AEAD. Out of scope: poisoning by clients.
"""

from fedfdp.secagg.client_session import ClientSession
from fedfdp.secagg.crypto import KeyPair, KeyPurpose, Share, combine_shares, prg_uint32, share_secret
from fedfdp.secagg.encoding import choose_scale, decode, default_scale, encode, from_ring, quantize, to_ring
from fedfdp.secagg.errors import (
    AuthenticationError,
    ConsistencyError,
    MessageError,
    ReconstructionError,
    RequestRefused,
    SecAggError,
    SessionStateError,
    Stage,
    ThresholdError,
    TooFewSurvivors,
)
from fedfdp.secagg.identity import NodeTrust, Roster, SigningKey
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
from fedfdp.secagg.server_session import AggregateResult, ServerSession
from fedfdp.secagg.session import default_neighbours, default_threshold

__all__ = [
    "AggregateResult",
    "AuthenticationError",
    "ClientSession",
    "CollectReply",
    "CollectRequest",
    "ConfirmReply",
    "ConfirmRequest",
    "ConsistencyError",
    "KeyPair",
    "KeyPurpose",
    "KeysReply",
    "KeysRequest",
    "MessageError",
    "NodeTrust",
    "ReconstructionError",
    "RequestRefused",
    "Roster",
    "SecAggError",
    "ServerSession",
    "SessionStateError",
    "SetupReply",
    "SetupRequest",
    "Share",
    "SigningKey",
    "Stage",
    "ThresholdError",
    "TooFewSurvivors",
    "UnmaskReply",
    "UnmaskRequest",
    "choose_scale",
    "combine_shares",
    "decode",
    "default_neighbours",
    "default_scale",
    "default_threshold",
    "encode",
    "from_ring",
    "prg_uint32",
    "quantize",
    "share_secret",
    "to_ring",
]
