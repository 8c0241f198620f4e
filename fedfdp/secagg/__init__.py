"""Secure aggregation for an untrusted server (design: ``secagg_design.md``).

SecAgg+ (Bonawitz et al. 2017, sparse graph of Bell et al. 2020) as pure state
machines, its cryptographic primitives, and the fixed-point encoding into Z/2³²Z. No
module here imports Flower; the ClientApp handlers and the strategy's round driver
wrap these objects.

Security model: honest-but-curious server colluding with fewer than ``t`` clients of a
neighbourhood; computational assumptions X25519 (CDH), HKDF-SHA256, AES-256 as a PRF,
AES-256-GCM as an AEAD. Out of scope: a malicious server that substitutes keys.
"""

from fedfdp.secagg.client_session import ClientSession
from fedfdp.secagg.crypto import KeyPair, KeyPurpose, Share, combine_shares, prg_uint32, share_secret
from fedfdp.secagg.encoding import choose_scale, decode, default_scale, encode, from_ring, quantize, to_ring
from fedfdp.secagg.errors import (
    AuthenticationError,
    MessageError,
    ReconstructionError,
    RequestRefused,
    SecAggError,
    SessionStateError,
    Stage,
    ThresholdError,
    TooFewSurvivors,
)
from fedfdp.secagg.messages import (
    CollectReply,
    CollectRequest,
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
    "KeyPair",
    "KeyPurpose",
    "KeysReply",
    "KeysRequest",
    "MessageError",
    "ReconstructionError",
    "RequestRefused",
    "SecAggError",
    "ServerSession",
    "SessionStateError",
    "SetupReply",
    "SetupRequest",
    "Share",
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
