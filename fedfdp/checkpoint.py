"""Checkpoints and the write-ahead privacy ledger: budgets that survive crashes
and cannot be lost.

A run directory holds

``ledger.json``
    Every privacy charge of the run: ``(round, attempt, σ, q, participation)``
    per charged round, and the accountant state they compose to. It is written
    durably (temporary file, fsync, rename, fsync of the directory) **before**
    a private round draws its batches and noise — write-ahead — so a crash can
    never release a noisy aggregate whose cost is not on disk. It is never reset.
``checkpoint.pt``
    After each completed round: the round, model and optimizer state, the
    metrics so far, the configuration, and what the ledger must contain at
    that point (:class:`LedgerSummary`: the number of charges, the ``(σ, q,
    participation)`` of each, a SHA-256 digest of them).

On resume (:func:`verify_resume`) the ledger is authoritative and is checked
against the checkpoint and the resolved privacy plan. It is refused, naming
the file and the mismatch, when it is missing, empty, zeroed or rolled back
(fewer charges than the checkpoint records), edited (digest or a charge's σ,
q or participation differs), or inconsistent with its own accountant state.
So deleting, truncating or editing the ledger can never make a resumed run
report a smaller ε than the uninterrupted run would.

A private round that was charged but not checkpointed (the crash happened
inside it) is run again with a new ``attempt`` number and charged again. With
secret entropy the re-run draws fresh batches and noise anyway; in the
reproducible mode the attempt number gives fresh seeded streams. Reusing the
old noise on possibly different inputs would reveal their difference without
noise; charging twice keeps ε a valid upper bound (it overstates the cost of
the aborted attempt, which may never have been released).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedfdp.config import ORCHESTRATION_KEYS, ConfigError
from fedfdp.outputs import atomic_write

LEDGER_FILE = "ledger.json"
CHECKPOINT_FILE = "checkpoint.pt"
_LEDGER_VERSION = 2

#: Keys that may differ between the run that wrote a checkpoint and the resuming one:
#: the configuration's orchestration section.
RESUMABLE_KEYS = ORCHESTRATION_KEYS


class CheckpointMismatch(ConfigError):
    """A checkpoint or ledger that must not be resumed from; the message names the file."""


@dataclass(frozen=True)
class Charge:
    """One composed privacy event: round, attempt, and the event's parameters."""

    round: int
    attempt: int
    noise_multiplier: float
    sampling_rate: float
    participation: float = 1.0

    def as_list(self) -> list[float | int]:
        return [self.round, self.attempt, self.noise_multiplier, self.sampling_rate, self.participation]

    @classmethod
    def from_list(cls, item: Sequence[Any]) -> Charge:
        if not isinstance(item, list | tuple) or len(item) != 5:
            raise ValueError(f"charge {item!r}: expected [round, attempt, sigma, q, participation]")
        r, a, s, q, p = item
        for name, v in (("round", r), ("attempt", a)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "round" else 0):
                raise ValueError(f"charge {item!r}: bad {name} {v!r}")
        for name, v in (("sigma", s), ("q", q), ("participation", p)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not float(v) > 0:
                raise ValueError(f"charge {item!r}: bad {name} {v!r}")
        return cls(int(r), int(a), float(s), float(q), float(p))


def digest(charges: Sequence[Charge]) -> str:
    """SHA-256 of the charges in canonical JSON."""
    doc = json.dumps([c.as_list() for c in charges], separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


@dataclass
class Ledger:
    """Write-ahead record of every privacy charge of a run.

    Attributes
    ----------
    accountant : dict
        ``FDPAccountant.state_dict()`` after the charges.
    charges : list of Charge
        One entry per composed event, in order.
    """

    accountant: dict[str, Any]
    charges: list[Charge] = field(default_factory=list)

    def attempts(self, round_: int) -> int:
        """How many times ``round_`` has been charged."""
        return sum(1 for c in self.charges if c.round == round_)

    def summary(self) -> LedgerSummary:
        """What a checkpoint records of this ledger."""
        return LedgerSummary.of(self.charges)


@dataclass(frozen=True)
class LedgerSummary:
    """What the ledger must contain at a checkpoint: the number of charges, the
    parameters of each (merged runs of equal ones) and their digest."""

    charges: int
    events: tuple[tuple[float, float, float, int], ...]
    digest: str

    @classmethod
    def of(cls, charges: Sequence[Charge]) -> LedgerSummary:
        events: list[tuple[float, float, float, int]] = []
        for c in charges:
            key = (c.noise_multiplier, c.sampling_rate, c.participation)
            if events and events[-1][:3] == key:
                events[-1] = (*key, events[-1][3] + 1)
            else:
                events.append((*key, 1))
        return cls(len(charges), tuple(events), digest(charges))

    def as_dict(self) -> dict[str, Any]:
        return {"charges": self.charges, "events": [list(e) for e in self.events], "digest": self.digest}

    @classmethod
    def from_dict(cls, doc: Any) -> LedgerSummary:
        if not isinstance(doc, dict) or set(doc) != {"charges", "events", "digest"}:
            raise ValueError(f"ledger summary {doc!r}: malformed")
        events = tuple((float(s), float(q), float(p), int(n)) for s, q, p, n in doc["events"])
        return cls(int(doc["charges"]), events, str(doc["digest"]))


def write_ledger(run_dir: str | Path, ledger: Ledger) -> None:
    """Durably write ``run_dir/ledger.json`` (see :func:`fedfdp.outputs.atomic_write`)."""
    doc = {
        "version": _LEDGER_VERSION,
        "accountant": ledger.accountant,
        "charges": [c.as_list() for c in ledger.charges],
    }
    atomic_write(Path(run_dir) / LEDGER_FILE, json.dumps(doc, indent=1).encode())


def read_ledger(run_dir: str | Path) -> Ledger | None:
    """Read ``run_dir/ledger.json`` (None if absent); refuse a malformed one."""
    path = Path(run_dir) / LEDGER_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("version") != _LEDGER_VERSION:
            raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else None!r}, "
                             f"expected {_LEDGER_VERSION}")
        if not isinstance(doc.get("accountant"), dict) or not isinstance(doc.get("charges"), list):
            raise ValueError("needs 'accountant' (object) and 'charges' (list)")
        return Ledger(dict(doc["accountant"]), [Charge.from_list(c) for c in doc["charges"]])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointMismatch(f"{path}: malformed privacy ledger ({exc}); refusing to resume") from exc


def save_checkpoint(run_dir: str | Path, state: Mapping[str, Any]) -> None:
    """Durably write ``run_dir/checkpoint.pt``."""
    buf = io.BytesIO()
    torch.save(dict(state), buf)
    atomic_write(Path(run_dir) / CHECKPOINT_FILE, buf.getvalue())


_CHECKPOINT_KEYS = frozenset({"round", "config", "num-records", "model", "optimizer", "rows", "ledger"})


def load_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """Load ``run_dir/checkpoint.pt`` (None if absent); refuse, naming the file,
    one that cannot be read or lacks a key."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise CheckpointMismatch(f"{path}: unreadable checkpoint ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
    if not isinstance(ckpt, dict) or not set(ckpt) >= _CHECKPOINT_KEYS:
        keys = sorted(_CHECKPOINT_KEYS - set(ckpt)) if isinstance(ckpt, dict) else "all"
        raise CheckpointMismatch(f"{path}: not a fedfdp checkpoint (missing {keys})")
    return ckpt


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume under a configuration that differs in any key other
    than :data:`RESUMABLE_KEYS`; the message lists the differing keys."""
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    diff = sorted(k for k in keys if saved.get(k) != current.get(k))
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in diff)
        raise CheckpointMismatch(f"checkpoint written under a different configuration ({detail})")


@dataclass(frozen=True)
class ExpectedEvent:
    """The ``(σ, q, participation)`` every charge of the resolved plan carries."""

    noise_multiplier: float
    sampling_rate: float
    participation: float


def verify_ledger(
    run_dir: str | Path,
    ledger: Ledger | None,
    summary: LedgerSummary | None,
    expected: ExpectedEvent | None,
    replay: Any,
) -> None:
    """Refuse a ledger that is not exactly what the run charged.

    Parameters
    ----------
    ledger
        The ledger on disk (None: absent).
    summary
        What the checkpoint records of the ledger (None: no checkpoint).
    expected
        The resolved plan's event (None: a plan that charges nothing).
    replay
        ``replay(charges) -> accountant state``: the accountant state the
        charges compose to, to compare with the ledger's own.
    """
    path = Path(run_dir) / LEDGER_FILE
    charges = ledger.charges if ledger is not None else []
    if summary is not None and summary.charges > 0:
        if ledger is None:
            raise CheckpointMismatch(
                f"{path}: missing, but {Path(run_dir) / CHECKPOINT_FILE} records {summary.charges} "
                "privacy charges; refusing to resume (the budget would restart)"
            )
        if len(charges) < summary.charges:
            raise CheckpointMismatch(
                f"{path}: {len(charges)} charges, the checkpoint records {summary.charges}: the ledger "
                "is empty, zeroed or rolled back; refusing to resume"
            )
        if digest(charges[: summary.charges]) != summary.digest:
            raise CheckpointMismatch(
                f"{path}: its first {summary.charges} charges differ from those the checkpoint "
                "recorded (digest mismatch): the ledger was edited; refusing to resume"
            )
    for c in charges:
        if expected is None:
            raise CheckpointMismatch(f"{path}: holds charges but this configuration charges nothing")
        got = (c.noise_multiplier, c.sampling_rate, c.participation)
        want = (expected.noise_multiplier, expected.sampling_rate, expected.participation)
        if got != want:
            raise CheckpointMismatch(
                f"{path}: round {c.round} was charged with sigma={got[0]}, q={got[1]}, "
                f"participation={got[2]}; the resolved plan has sigma={want[0]}, q={want[1]}, "
                f"participation={want[2]}; refusing to resume"
            )
    if ledger is not None:
        state = replay(charges)
        if state.get("ledger") != ledger.accountant.get("ledger"):
            raise CheckpointMismatch(
                f"{path}: the accountant state does not match the charges listed; refusing to resume"
            )
