"""The privacy ledger: a hash chain of everything a run was charged, written ahead.

``ledger.jsonl`` in a run directory is append-only JSON Lines: a header line
(``{"fedfdp-ledger": 3}``), then one entry per line, each carrying the SHA-256
``hash`` of its own content and the ``prev`` hash of the entry before it:

* entry 0, ``mechanism``: the run's :class:`~fedfdp.mechanism.ResolvedMechanism`
  (:meth:`~fedfdp.mechanism.ResolvedMechanism.to_dict`) and its digest;
* ``estimate``: one statistic of private data released with accounted noise before
  training (``private-statistics = "estimate"``: its name and its event), written with
  the mechanism when the ledger starts (:meth:`Ledger.start`), before anything is drawn;
* ``charge``: one private round — its number, its attempt and its event
  (:mod:`fedfdp.accounting.events`) — appended durably (write, flush, fsync) **before**
  the round draws its batches and noise (the first write creates the file atomically:
  temporary file, fsync, rename, fsync of the directory);
* ``unrecorded``: charges that a crashed session may have written after the last
  checkpoint but that are missing from the ledger, charged pessimistically on resume
  (:func:`fedfdp.checkpoint` and :class:`fedfdp.run_files.RunFiles` decide how many);
* ``session``: a session's ``checkpoint-every`` (how many private rounds it may charge
  before its next checkpoint, hence how many a resume charges pessimistically), written
  when a session starts with a value other than the one the chain already says (1 until a
  ``session`` entry says otherwise); a checkpoint whose ``checkpoint-every`` differs from
  the one its head's chain records was edited (:meth:`Ledger.checkpoint_every`);
* ``node-charge``: in a *node's* ledger (:mod:`fedfdp.node_ledger`, one per SuperNode,
  kept across runs), one round the node charged itself before releasing its masked
  vector — the run it belongs to, its round and its event.

The ledger stores events, not tuples: :meth:`Ledger.events` is everything ever
charged, and :func:`fedfdp.ledger_replay.replay_ledger` turns it into the accountant
whose ε the run prints — there is no second copy of the accountant's state to disagree
with.
Nothing here resets or shortens a ledger: appending is the only mutation, and a write
costs one line, not the whole ledger. Appending costs the same at every length: the
ledger keeps running counts beside its entries (the charges, the attempts of each
round, the sessions' ``checkpoint-every``), caught up on the entries appended since
they were last read, so that :meth:`Ledger.attempts`, :meth:`Ledger.head` and the
durable write never rescan the chain or reread the file; reading one (on resume)
verifies the chain once, in one pass. A final line without its newline is a write that
never completed (its fsync did not return, so its round drew nothing): it is ignored
on reading, and the file is rewritten whole at the next write.

What the chain detects: any edit, reordering, truncation below a recorded head, or a
substituted mechanism (each checkpoint records the head it saw; see
:mod:`fedfdp.checkpoint`). What no file can detect: the whole run directory restored
from a consistent older copy (ledger and checkpoint together); keep run directories
on storage that is not rolled back.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from fedfdp.accounting.events import PrivacyEvent, event_from_dict
from fedfdp.config import ConfigError
from fedfdp.outputs import atomic_write

LEDGER_FILE = "ledger.jsonl"
LEDGER_VERSION = 3
GENESIS = "0" * 64


class LedgerError(ConfigError):
    """A ledger or checkpoint that must not be used; the message names the file."""


class EntryKind(StrEnum):
    MECHANISM = "mechanism"
    CHARGE = "charge"
    UNRECORDED = "unrecorded"
    ESTIMATE = "estimate"
    NODE_CHARGE = "node-charge"
    SESSION = "session"


#: ``checkpoint-every`` as a chain says it until a ``session`` entry records another value.
DEFAULT_CHECKPOINT_EVERY = 1


def _canonical(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


#: The ``ledger`` value of a node's ledger's first entry (:mod:`fedfdp.node_ledger`).
NODE_LEDGER = "node"


def is_node_mechanism(mechanism: Any) -> bool:
    """Whether a ledger's first entry is a node's (its policy's terms), not a run's mechanism."""
    return isinstance(mechanism, dict) and mechanism.get("ledger") == NODE_LEDGER


@dataclass(frozen=True)
class Entry:
    """One chained entry: its kind, its body (without ``prev``/``hash``) and hashes."""

    kind: EntryKind
    body: dict[str, Any]
    prev: str
    hash: str

    @property
    def event(self) -> PrivacyEvent | None:
        """The event a charge (or unrecorded charge) composed."""
        if self.kind in (EntryKind.MECHANISM, EntryKind.SESSION):
            return None
        return event_from_dict(self.body["event"])

    @property
    def round(self) -> int | None:
        value = self.body.get("round")
        return int(value) if value is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), **self.body, "prev": self.prev, "hash": self.hash}


def _entry(kind: EntryKind, body: dict[str, Any], prev: str) -> Entry:
    return Entry(kind, body, prev, _hash({"kind": str(kind), **body, "prev": prev}))


@dataclass(frozen=True)
class Head:
    """What a checkpoint records of the ledger: how many entries it had, the hash of
    the last one, and how many of them were charges (of either kind).
    """

    entries: int
    hash: str
    charges: int

    def as_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "hash": self.hash, "charges": self.charges}

    @classmethod
    def from_dict(cls, doc: Any) -> Head:
        if not isinstance(doc, dict) or set(doc) != {"entries", "hash", "charges"}:
            raise ValueError(f"ledger head {doc!r}: malformed")
        entries, charges, digest = doc["entries"], doc["charges"], doc["hash"]
        counts_ok = isinstance(entries, int) and isinstance(charges, int) and 0 <= charges < entries
        if not counts_ok:
            raise ValueError(f"ledger head {doc!r}: bad counts")
        if not (isinstance(digest, str) and len(digest) == 64):
            raise ValueError(f"ledger head {doc!r}: bad hash")
        return cls(entries, digest, charges)


@dataclass
class _Tally:
    """Running counts of a ledger's entries (module docstring): what the ledger's
    questions need, kept up to date by reading each entry once.
    """

    #: The entry list counted (a ledger whose ``entries`` is replaced is counted afresh).
    source: list[Entry] | None = None
    #: How many of ``source`` are counted.
    seen: int = 0
    charges: list[Entry] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)
    #: The index and ``checkpoint_every`` of every ``session`` entry, in order.
    sessions: list[tuple[int, int]] = field(default_factory=list)

    def count(self, index: int, entry: Entry) -> None:
        if entry.kind is EntryKind.SESSION:
            self.sessions.append((index, int(entry.body["checkpoint_every"])))
        elif entry.kind is not EntryKind.MECHANISM:
            self.charges.append(entry)
            r = entry.round
            if r is not None:
                self.attempts[r] = self.attempts.get(r, 0) + 1


@dataclass
class Ledger:
    """The hash-chained, write-ahead privacy ledger of one run (module docstring).

    Examples
    --------
    >>> from fedfdp.accounting.events import SubsampledGaussian
    >>> ledger = Ledger.start({"mode": "dp"}, "d" * 64)
    >>> ledger.append_charge(1, 0, SubsampledGaussian(1.0, 0.05))
    >>> [e.kind.value for e in ledger.entries], ledger.attempts(1)
    (['mechanism', 'charge'], 1)
    >>> Ledger.from_dict(ledger.to_dict()).head() == ledger.head()
    True
    """

    entries: list[Entry] = field(default_factory=list)
    #: How many of ``entries`` are on disk in the file this ledger was read from or
    #: written to (0: the next write creates the file whole).
    persisted: int = 0
    _tally: _Tally = field(default_factory=_Tally, init=False, repr=False, compare=False)

    def _counts(self) -> _Tally:
        """The running counts, caught up on the entries appended since the last call
        (each entry is read once; replacing or shortening ``entries`` starts afresh).
        """
        tally = self._tally
        if tally.source is not self.entries or tally.seen > len(self.entries):
            tally = self._tally = _Tally(self.entries)
        if tally.seen < len(self.entries):
            for i, entry in enumerate(self.entries[tally.seen:], start=tally.seen):
                tally.count(i, entry)
            tally.seen = len(self.entries)
        return tally

    @classmethod
    def start(cls, mechanism: dict[str, Any], digest: str) -> Ledger:
        """A ledger whose first entry is the resolved mechanism, followed by one
        ``estimate`` charge per statistic the mechanism lists under ``estimates``.
        """
        ledger = cls([_entry(EntryKind.MECHANISM, {"mechanism": mechanism, "digest": digest}, GENESIS)])
        for item in mechanism.get("estimates", ()):
            ledger._append(EntryKind.ESTIMATE,
                           {"round": None, "statistic": str(item["statistic"]), "event": item["event"]})
        return ledger

    @property
    def mechanism_digest(self) -> str:
        return str(self.entries[0].body["digest"])

    @property
    def mechanism(self) -> dict[str, Any]:
        return dict(self.entries[0].body["mechanism"])

    @property
    def charges(self) -> list[Entry]:
        """Every charge entry, recorded or pessimistic, in order (a new list)."""
        return list(self._counts().charges)

    def events(self) -> list[PrivacyEvent]:
        """The event of every charge ever written (what the accountant composes)."""
        return [e.event for e in self._counts().charges if e.event is not None]

    def attempts(self, round_: int) -> int:
        """How many times ``round_`` has been charged (a running count: no rescan)."""
        return self._counts().attempts.get(round_, 0)

    def head(self) -> Head:
        return Head(len(self.entries), self.entries[-1].hash, len(self._counts().charges))

    def checkpoint_every(self, entries: int | None = None) -> int:
        """``checkpoint-every`` as the chain's first ``entries`` entries (default all) record
        it: the last ``session`` entry's, else :data:`DEFAULT_CHECKPOINT_EVERY`.
        """
        sessions = self._counts().sessions
        end = len(self.entries) if entries is None else len(range(len(self.entries))[:entries])
        last = bisect.bisect_left(sessions, (end, -1)) - 1  # the last session entry before ``end``
        return sessions[last][1] if last >= 0 else DEFAULT_CHECKPOINT_EVERY

    def append_session(self, checkpoint_every: int) -> None:
        """Chain a session's ``checkpoint-every`` (module docstring)."""
        self._append(EntryKind.SESSION, {"checkpoint_every": int(checkpoint_every)})

    def _append(self, kind: EntryKind, body: dict[str, Any]) -> None:
        self.entries.append(_entry(kind, body, self.entries[-1].hash))

    def append_charge(self, round_: int, attempt: int, event: PrivacyEvent) -> None:
        """Chain one charge of ``event`` for ``round_`` (its ``attempt``-th)."""
        self._append(EntryKind.CHARGE, {"round": round_, "attempt": attempt, "event": event.to_dict()})

    def append_node_charge(self, run: int, round_: int, event: PrivacyEvent) -> None:
        """Chain one round a node charged itself (``run``: the run's id; a node's ledger)."""
        self._append(EntryKind.NODE_CHARGE, {"run": run, "round": round_, "event": event.to_dict()})

    def append_unrecorded(self, event: PrivacyEvent, count: int, reason: str) -> None:
        """Chain ``count`` pessimistic charges of ``event`` (module docstring)."""
        for _ in range(count):
            self._append(EntryKind.UNRECORDED, {"round": None, "event": event.to_dict(), "reason": reason})

    def to_dict(self) -> dict[str, Any]:
        return {"version": LEDGER_VERSION, "entries": [e.as_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, doc: Any) -> Ledger:
        """Parse and verify a ledger (every hash, every link, every event); ``ValueError``
        naming the first entry that does not hold.
        """
        if not isinstance(doc, dict) or doc.get("version") != LEDGER_VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            raise ValueError(f"version {version!r}, expected {LEDGER_VERSION}")
        raw = doc.get("entries")
        if not isinstance(raw, list) or not raw:
            raise ValueError("needs a non-empty 'entries' list")
        entries: list[Entry] = []
        prev = GENESIS
        for i, item in enumerate(raw):
            if not isinstance(item, dict) or not {"kind", "prev", "hash"} <= set(item):
                raise ValueError(f"entry {i}: malformed")
            try:
                kind = EntryKind(item["kind"])
            except ValueError:
                raise ValueError(f"entry {i}: unknown kind {item['kind']!r}") from None
            if (kind is EntryKind.MECHANISM) != (i == 0):
                raise ValueError(f"entry {i}: a ledger starts with its mechanism, and only there")
            body = {k: v for k, v in item.items() if k not in ("kind", "prev", "hash")}
            want = {EntryKind.MECHANISM: {"mechanism", "digest"},
                    EntryKind.CHARGE: {"round", "attempt", "event"},
                    EntryKind.UNRECORDED: {"round", "event", "reason"},
                    EntryKind.ESTIMATE: {"round", "statistic", "event"},
                    EntryKind.NODE_CHARGE: {"run", "round", "event"},
                    EntryKind.SESSION: {"checkpoint_every"}}[kind]
            if set(body) != want:
                raise ValueError(f"entry {i}: expected the fields {sorted(want)}")
            if item["prev"] != prev:
                raise ValueError(f"entry {i}: broken chain (prev hash differs): the ledger was edited")
            entry = Entry(kind, body, prev, str(item["hash"]))
            if _entry(kind, body, prev).hash != entry.hash:
                raise ValueError(f"entry {i}: hash mismatch: the ledger was edited")
            first = (EntryKind.MECHANISM, EntryKind.ESTIMATE)
            if kind is EntryKind.ESTIMATE and (body["round"] is not None or entries[-1].kind not in first):
                raise ValueError(f"entry {i}: an estimate comes right after the mechanism, with no round")
            if kind is EntryKind.CHARGE:
                r, a = body["round"], body["attempt"]
                if isinstance(r, bool) or not isinstance(r, int) or r < 1 or \
                        isinstance(a, bool) or not isinstance(a, int) or a < 0:
                    raise ValueError(f"entry {i}: bad round {r!r} or attempt {a!r}")
            if kind is EntryKind.NODE_CHARGE:
                r, run = body["round"], body["run"]
                if isinstance(r, bool) or not isinstance(r, int) or r < 1 or \
                        isinstance(run, bool) or not isinstance(run, int) or run < 0:
                    raise ValueError(f"entry {i}: bad run {run!r} or round {r!r}")
            if kind is EntryKind.SESSION:
                every = body["checkpoint_every"]
                if isinstance(every, bool) or not isinstance(every, int) or every < 0:
                    raise ValueError(f"entry {i}: bad checkpoint_every {every!r}")
            elif kind is not EntryKind.MECHANISM:
                event_from_dict(body["event"])  # validates
            entries.append(entry)
            prev = entry.hash
        node = is_node_mechanism(entries[0].body["mechanism"])
        for i, entry in enumerate(entries[1:], start=1):
            charged_by_node = entry.kind is EntryKind.NODE_CHARGE
            if charged_by_node != node:
                raise ValueError(f"entry {i}: a {entry.kind.value!r} entry in a "
                                 f"{'node' if node else 'run'}'s ledger")
        listed = entries[0].body["mechanism"].get("estimates", []) if isinstance(
            entries[0].body["mechanism"], dict) else []
        charged = [{"statistic": e.body["statistic"], "event": e.body["event"]}
                   for e in entries if e.kind is EntryKind.ESTIMATE]
        partial = len(charged) < len(listed) and len(entries) > len(charged) + 1  # a round before them all
        if charged != listed[:len(charged)] or partial:
            raise ValueError("its estimate entries differ from the estimates its mechanism lists: the ledger "
                             "was edited")
        return cls(entries)


HEADER = {"fedfdp-ledger": LEDGER_VERSION}


def _line(doc: Any) -> bytes:
    return (json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n").encode()


def write_ledger(run_dir: str | Path, ledger: Ledger) -> None:
    """Durably write ``run_dir/ledger.jsonl``: append the entries not yet on disk
    (write, flush, fsync), or create the file whole (:func:`fedfdp.outputs.atomic_write`).
    """
    path = Path(run_dir) / LEDGER_FILE
    new = ledger.entries[ledger.persisted:]
    if ledger.persisted == 0 or not path.exists():
        atomic_write(path, _line(HEADER) + b"".join(_line(e.as_dict()) for e in ledger.entries))
    elif new:
        with open(path, "ab") as fh:
            fh.write(b"".join(_line(e.as_dict()) for e in new))
            fh.flush()
            os.fsync(fh.fileno())
    ledger.persisted = len(ledger.entries)


def parse_ledger(raw: bytes) -> Ledger:
    """The verified ledger a ``ledger.jsonl`` file holds (:meth:`Ledger.from_dict`); a
    torn final line is ignored (module docstring). ``ValueError`` naming the first
    line or entry that does not hold.
    """
    text = raw.decode("utf-8")
    lines = text.split("\n")
    torn = lines[-1] != ""  # the last write did not complete
    lines = lines[:-1]
    if not lines:
        raise ValueError("empty")
    try:
        header = json.loads(lines[0])
        entries = [json.loads(line) for line in lines[1:]]
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {exc.doc[:40]!r}...: not JSON ({exc.msg})") from None
    if header != HEADER:
        raise ValueError(f"header {str(header)[:80]!r}, expected {HEADER}")
    ledger = Ledger.from_dict({"version": LEDGER_VERSION, "entries": entries})
    ledger.persisted = 0 if torn else len(ledger.entries)
    return ledger


def read_ledger(run_dir: str | Path) -> Ledger | None:
    """Read and verify ``run_dir/ledger.jsonl`` (None if absent); :class:`LedgerError`
    naming the file for one that is malformed, edited or broken.
    """
    from fedfdp.input_files import optional_file

    path = Path(run_dir) / LEDGER_FILE
    if optional_file(path) is None:  # a FIFO or /dev/zero is refused, never read
        return None
    try:
        return parse_ledger(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise LedgerError(f"{path}: not a valid privacy ledger ({exc}); refusing to use it") from None
