"""A node's own ledger and budget: every round it ever charged itself, across runs.

A SuperNode with a policy (:mod:`fedfdp.node_policy`) keeps a :class:`~fedfdp.ledger.Ledger`
in its state directory (node config ``node-state``; ``fedfdp run --node-state DIR``: one
folder per simulated node), the same hash-chained, append-only, write-ahead file as a
run's (``ledger.jsonl``):

* entry 0 is the node's terms, not a run's mechanism: ``{"ledger": "node", "relation",
  "delta"}`` (a policy may later change its ``max-epsilon``, never the δ or the relation
  its past charges are stated at: such a ledger is refused);
* every other entry is a ``node-charge``: the run, the round and the event the node
  charged itself (:func:`fedfdp.node_policy.node_event`).

:meth:`NodeLedger.charge` reads the file afresh (another process of the same node may
have appended: Flower's simulation engine hands a node's messages to any worker), under
an exclusive lock, replays it into the accountant its terms name
(:func:`fedfdp.ledger_replay.replay_ledger`: the distributed accountant, routes A and B),
refuses the round if composing its event would take ε above the policy's ``max-epsilon``
at its δ, and otherwise appends the charge durably (write, flush, fsync) **before** the
node computes or releases anything of the round. A crash after the charge never
un-charges it; a second run on the same state directory continues the ledger, so a
budget spent once is spent for good. ``fedfdp account --run NODE_DIR`` replays it.

A :class:`NodeLedger` keeps what its last charge left on disk: the file's length and
SHA-256, the verified ledger and its accountant. The next charge reads the file's bytes
and hashes them; when they are exactly what it kept, it reuses the ledger and the
accountant (no parse, no verification, no replay: the cost of a charge does not grow
with the ledger's length beyond hashing its bytes); when the file grew (another process
appended), it reads, verifies and replays it whole as before; when the bytes it kept
are no longer the file's first bytes (the file shrank, was edited or replaced), it
refuses the round: a node's ledger is only ever appended to.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedfdp.accounting.events import PrivacyEvent
from fedfdp.accounting.protocol import Accountant
from fedfdp.config import ConfigError
from fedfdp.input_files import optional_file
from fedfdp.ledger import LEDGER_FILE, NODE_LEDGER, Ledger, LedgerError, read_ledger, write_ledger
from fedfdp.ledger_replay import replay_ledger
from fedfdp.node_policy import NodePolicy, RoundRefused

__all__ = ["NodeLedger", "node_terms"]

LOCK_FILE = "ledger.lock"


def node_terms(policy: NodePolicy) -> dict[str, Any]:
    """The first entry of a node's ledger: what its charges are stated at."""
    return {"ledger": NODE_LEDGER, "relation": str(policy.relation), "delta": policy.delta}


def _digest(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class _Written:
    """What a charge left on disk: the file's length and SHA-256, its ledger and accountant."""

    size: int
    sha256: bytes
    ledger: Ledger
    accountant: Accountant[Any]


@dataclass
class _Kept:
    written: _Written | None = None


@dataclass(frozen=True)
class NodeLedger:
    """The ledger of one node in ``state_dir``, under ``policy`` (module docstring)."""

    state_dir: Path
    policy: NodePolicy
    _kept: _Kept = field(default_factory=_Kept, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", Path(self.state_dir))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fh = open(self.state_dir / LOCK_FILE, "a")  # noqa: SIM115 - held for the block
        except OSError as exc:
            raise RoundRefused(f"node state {str(self.state_dir)!r}: not writable ({exc.strerror})") from None
        with fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def read(self) -> Ledger:
        """The node's ledger as on disk (a new one, not yet written, when there is none).

        Raises
        ------
        RoundRefused
            A ledger that is malformed or edited, or stated at other terms than the policy's.
        """
        try:
            ledger = read_ledger(self.state_dir)
        except LedgerError as exc:
            raise RoundRefused(f"node ledger: {exc}") from None
        terms = node_terms(self.policy)
        if ledger is None:
            return Ledger.start(terms, _digest(terms))
        if ledger.mechanism != terms:
            raise RoundRefused(f"node ledger {str(self.state_dir)!r}: its charges are stated at "
                               f"{ledger.mechanism}, the node policy now says {terms}; refusing")
        return ledger

    def epsilon(self) -> float:
        """ε spent by this node so far, at the policy's δ."""
        return float(replay_ledger(self.read()).accountant.epsilon(self.policy.delta))

    def charge(self, run: int, round_: int, event: PrivacyEvent) -> float:
        """Charge ``event`` for ``round_`` of ``run`` durably, before anything of it is
        computed; return the node's ε after it.

        Raises
        ------
        RoundRefused
            The charge would take ε above ``max-epsilon`` (nothing written), or the ledger
            cannot be used.
        """
        with self._locked():
            ledger, acc = self._current()
            p = self.policy
            if acc.would_exceed(event, max_epsilon=p.max_epsilon, delta=p.delta):
                spent = acc.epsilon(p.delta)
                self._keep(ledger, acc)
                raise RoundRefused(f"node budget: this round would take ε above max-epsilon="
                                   f"{p.max_epsilon:g} (spent {spent:.4g} at δ={p.delta:g}); refusing")
            self._kept.written = None  # until the charge is on disk
            ledger.append_node_charge(int(run), int(round_), event)
            write_ledger(self.state_dir, ledger)
            acc.compose(event)
            self._keep(ledger, acc)
            return float(acc.epsilon(p.delta))

    def _bytes(self) -> bytes | None:
        """The ledger file's bytes (None: no file)."""
        path = self.state_dir / LEDGER_FILE
        try:
            if optional_file(path) is None:  # a FIFO or a device is refused, never read
                return None
            return path.read_bytes()
        except (ConfigError, OSError) as exc:
            raise RoundRefused(f"node ledger: {path}: cannot be read ({exc})") from None

    def _current(self) -> tuple[Ledger, Accountant[Any]]:
        """The ledger and its accountant as on disk, under the lock (module docstring).
        A file changed below what was kept is refused, now and at every later charge.
        """
        kept = self._kept.written
        if kept is not None:
            raw = self._bytes()
            if raw is None or len(raw) < kept.size or hashlib.sha256(raw[:kept.size]).digest() != kept.sha256:
                raise RoundRefused(f"node ledger {str(self.state_dir)!r}: its first {kept.size} bytes, which "
                                   "this node wrote and read, changed (the file shrank, was edited or "
                                   "replaced); refusing")
            if len(raw) == kept.size:
                return kept.ledger, kept.accountant
        ledger = self.read()
        return ledger, replay_ledger(ledger).accountant

    def _keep(self, ledger: Ledger, accountant: Accountant[Any]) -> None:
        """Remember the file as it is now, with its ledger and accountant (under the lock)."""
        raw = self._bytes()
        if raw is not None and ledger.persisted == len(ledger.entries):
            self._kept.written = _Written(len(raw), hashlib.sha256(raw).digest(), ledger, accountant)
