"""Who takes part in secure aggregation, and what they sign: long-term Ed25519 keys, the
roster, and the two signed statements of a round.

A server that relays public keys can swap them (and then open the shares a node
encrypts for "its neighbour"), add sybil nodes of its own, or tell different nodes
different stories. The defence of Bonawitz et al. (CCS 2017, §active security; the
malicious variant of Bell et al., CCS 2020) is a public-key infrastructure and a
consistency round, both here:

* every party holds a long-term :class:`SigningKey` (Ed25519, 32 bytes from the OS
  CSPRNG, kept in the node's own state directory, never sent anywhere);
* a :class:`Roster` of the parties' public keys reaches every node *outside* the
  server (a file its node configuration names; in a simulation the orchestrator
  writes it, standing in for the deployment's authority). A key advertisement signed
  by a key that is not on the roster is refused (no sybils); one signed by a roster
  key binds the node's X25519 keys to it (no key swap);
* :func:`advertisement` is what a node signs at setup (its two X25519 public keys,
  under the run, the round and its node id), and :func:`confirmation` what it signs
  before unmasking (the run, the round, the survivor set, the dead set and the digest
  of the model and round parameters it received, :func:`round_digest`). A node
  unmasks only when, with itself, ``t`` live members of its neighbourhood confirmed
  the same (their signatures go to the server; to each other they send HMAC tags
  under pairwise keys their signed advertisements authenticate:
  :class:`~fedfdp.secagg.client_session.ClientSession`).

Every signed message starts with a domain-separation label and encodes every integer
as 8 bytes and every set as its sorted members preceded by their count, so no two
statements share an encoding.

:class:`NodeTrust` is everything a node brings to a round from outside the server: its
signing key, the roster and the smallest survivor set it will unmask for. It is the one
argument through which a node policy (``clients.secagg_handlers``) configures a
:class:`~fedfdp.secagg.client_session.ClientSession`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "IDENTITY_BYTES",
    "SIGNATURE_BYTES",
    "SIGNING_KEY_FILE",
    "NodeTrust",
    "Roster",
    "SigningKey",
    "advertisement",
    "confirmation",
    "round_digest",
    "verify",
]

#: Length of an Ed25519 public key (a party's identity), in bytes.
IDENTITY_BYTES = 32
#: Length of an Ed25519 signature, in bytes.
SIGNATURE_BYTES = 64
#: Length of a :func:`round_digest`, in bytes.
DIGEST_BYTES = 32
#: The file of a party's signing key in its state directory.
SIGNING_KEY_FILE = "secagg-signing.key"

_LABEL = b"fedfdp/secagg/v1/"
_ROSTER_VERSION = 1


def _u64(name: str, value: int) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value < 2**64:
        raise ValueError(f"{name}={value!r}: must be an integer in [0, 2**64)")
    return int(value).to_bytes(8, "big")


def _set(name: str, values: Iterable[int]) -> bytes:
    members = sorted({int(v) for v in values})
    if not members or (members[0] >= 0 and members[-1] < 2**64):  # every id in range: packed at once
        return struct.pack(f">{1 + len(members)}Q", len(members), *members)
    return _u64(f"{name} count", len(members)) + b"".join(_u64(name, v) for v in members)


class SigningKey:
    """A party's long-term Ed25519 signing key.

    Generated from :func:`os.urandom` (:meth:`generate`), stored in the party's own
    state directory with owner-only permissions (:meth:`save`, :meth:`load`,
    :meth:`load_or_create`); only :attr:`public` ever leaves the party.
    """

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public: bytes = private.public_key().public_bytes_raw()

    @staticmethod
    def generate() -> SigningKey:
        """A fresh key from 32 bytes of the OS CSPRNG."""
        return SigningKey(Ed25519PrivateKey.from_private_bytes(os.urandom(32)))

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return self._private.sign(message)

    def to_bytes(self) -> bytes:
        """The raw 32-byte private key, for the party's own storage only (its state
        directory, its ``Context.state``); :meth:`from_bytes` is the inverse.
        """
        return self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    @staticmethod
    def from_bytes(raw: bytes) -> SigningKey:
        """The key whose raw private key is ``raw`` (32 bytes)."""
        if not isinstance(raw, bytes) or len(raw) != 32:
            raise ValueError("signing key: must be 32 bytes")
        return SigningKey(Ed25519PrivateKey.from_private_bytes(raw))

    def save(self, path: str | Path) -> None:
        """Write the raw private key to ``path`` (mode 0600, created; never overwritten).

        Raises
        ------
        FileExistsError
            ``path`` exists (a party's identity is not replaced silently).
        """
        raw = self.to_bytes()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())

    @staticmethod
    def load(path: str | Path) -> SigningKey:
        """The key :meth:`save` wrote. ``ValueError`` (naming the path) when unreadable."""
        from fedfdp.input_files import regular_file

        regular_file(path, "signing key")  # a FIFO or a device would never end
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"signing key {str(path)!r}: cannot be read ({exc.strerror})") from None
        if len(raw) != 32:
            raise ValueError(f"signing key {str(path)!r}: {len(raw)} bytes, expected 32")
        return SigningKey.from_bytes(raw)

    @staticmethod
    def load_or_create(path: str | Path) -> SigningKey:
        """The key at ``path``, generated and saved there first if there is none."""
        if not Path(path).exists():
            # another process of the same node may create it first
            with contextlib.suppress(FileExistsError):
                SigningKey.generate().save(path)
        return SigningKey.load(path)

    def __repr__(self) -> str:  # never the private key
        return f"SigningKey(public={self.public.hex()[:16]}…)"


def verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """True when ``signature`` is ``public``'s Ed25519 signature of ``message``."""
    if len(public) != IDENTITY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Roster:
    """The parties of a deployment: name → Ed25519 public key (32 bytes), one key each.

    The roster comes to each node from outside the server (a file named in its node
    configuration); the server cannot add to it.

    Attributes
    ----------
    parties : mapping of str to bytes
    """

    parties: Mapping[str, bytes]
    _keys: frozenset[bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.parties, Mapping) or not self.parties:
            raise ValueError("roster: must name at least one party")
        parties = dict(self.parties)
        for name, key in parties.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"roster: party name {name!r} must be a non-empty string")
            if not isinstance(key, bytes) or len(key) != IDENTITY_BYTES:
                raise ValueError(f"roster: the key of party {name!r} must be {IDENTITY_BYTES} bytes")
        keys = list(parties.values())
        if len(set(keys)) != len(keys):
            raise ValueError("roster: two parties share one key")
        object.__setattr__(self, "parties", parties)
        object.__setattr__(self, "_keys", frozenset(keys))

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def digest(self) -> bytes:
        """SHA-256 of the roster's canonical encoding (its sorted keys)."""
        return hashlib.sha256(_LABEL + b"roster/" + b"".join(sorted(self._keys))).digest()

    def to_file(self, path: str | Path) -> None:
        """Write the roster as TOML: ``version = 1`` and a ``[parties]`` table of
        ``"name" = "hex key"`` lines (written whole: a temporary file, then renamed).
        """
        lines = [f"version = {_ROSTER_VERSION}", "", "[parties]"]
        lines += [f"{json.dumps(n)} = \"{k.hex()}\"" for n, k in sorted(self.parties.items())]
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.replace(target)

    @staticmethod
    def from_file(path: str | Path) -> Roster:
        """The roster :meth:`to_file` wrote. ``ValueError`` naming the path when unreadable."""
        from fedfdp.input_files import regular_file

        regular_file(path, "roster")  # a FIFO or a device would never end
        try:
            doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            if doc.get("version") != _ROSTER_VERSION:
                raise ValueError(f"version {doc.get('version')!r}, expected {_ROSTER_VERSION}")
            return Roster({str(n): bytes.fromhex(k) for n, k in doc["parties"].items()})
        except OSError as exc:
            raise ValueError(f"roster {str(path)!r}: cannot be read ({exc.strerror})") from None
        except (AttributeError, KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"roster {str(path)!r}: unreadable ({exc})") from None


@dataclass(frozen=True)
class NodeTrust:
    """What a node brings to every round from outside the server.

    Attributes
    ----------
    signing_key : SigningKey
        The node's long-term key (its public half must be on the roster).
    roster : Roster or None
        The parties whose key advertisements and confirmations the node accepts. None:
        the node has no roster, so it checks each advertisement against the identity it
        names only — a server that swaps keys or adds sybils is *not* caught (the
        graph, consistency and survivor checks still hold). A deployment names one.
    min_survivors : int
        The smallest survivor set the node unmasks for (the honest-share floor plus
        the colluders the node tolerates: ``n_h + t_c``); at least 3.
    """

    signing_key: SigningKey
    roster: Roster | None
    min_survivors: int

    def __post_init__(self) -> None:
        if not isinstance(self.signing_key, SigningKey):
            raise ValueError(f"signing_key={self.signing_key!r}: must be a SigningKey")
        if self.roster is not None and not isinstance(self.roster, Roster):
            raise ValueError(f"roster={self.roster!r}: must be a Roster or None")
        m = self.min_survivors
        if isinstance(m, bool) or not isinstance(m, int) or m < 3:
            raise ValueError(f"min_survivors={m!r}: must be an integer >= 3")
        if self.roster is not None and self.signing_key.public not in self.roster:
            raise ValueError("signing_key: this node's own key is not on its roster")

    def to_dict(self) -> dict[str, Any]:
        """The trust as JSON-able values, its private key included: for the node's own
        storage between stages only (:meth:`from_dict` is the inverse).
        """
        roster = None if self.roster is None else {n: k.hex() for n, k in self.roster.parties.items()}
        return {"signing_key": self.signing_key.to_bytes().hex(), "roster": roster,
                "min_survivors": self.min_survivors}

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> NodeTrust:
        """The trust :meth:`to_dict` wrote."""
        roster = doc["roster"]
        return NodeTrust(SigningKey.from_bytes(bytes.fromhex(doc["signing_key"])),
                         None if roster is None else Roster({n: bytes.fromhex(k) for n, k in roster.items()}),
                         int(doc["min_survivors"]))


def advertisement(run: int, round_: int, node_id: int, pk_mask: bytes, pk_enc: bytes) -> bytes:
    """What a node signs at setup: its two X25519 public keys under (run, round, node id)."""
    return _LABEL + b"advertisement/" + _u64("run", run) + _u64("round", round_) + _u64(
        "node_id", node_id) + bytes(pk_mask) + bytes(pk_enc)


def confirmation(run: int, round_: int, live: Iterable[int], dead: Iterable[int], digest: bytes) -> bytes:
    """What a node signs before unmasking: the survivor set ``live`` (U3), the dead set
    (U2 − U3) and the :func:`round_digest` it received, under (run, round).
    """
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"digest: must be {DIGEST_BYTES} bytes")
    return (_LABEL + b"confirmation/" + _u64("run", run) + _u64("round", round_) + _set("live", live)
            + _set("dead", dead) + bytes(digest))


def round_digest(arrays: Mapping[str, np.ndarray], **parameters: float) -> bytes:
    """SHA-256 of the model a node received and the round's common parameters.

    ``arrays``: the model's arrays by name (name, dtype, shape and bytes of each, in
    sorted name order); ``parameters``: the round's numbers every node must share
    (the clipping norm, the scale, the local noise std), by name, as float64.
    Two nodes sent different models or parameters get different digests, so their
    confirmations disagree (Pasquini et al., CCS 2022).
    """
    h = hashlib.sha256(_LABEL + b"round-digest/")
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        for part in (name.encode(), a.dtype.str.encode(), repr(a.shape).encode()):
            h.update(len(part).to_bytes(8, "big") + part)
        h.update(a.nbytes.to_bytes(8, "big"))
        h.update(a.tobytes())
    for name in sorted(parameters):
        h.update(name.encode() + b"=" + np.float64(parameters[name]).tobytes())
    return h.digest()
