"""Checkpoints and the write-ahead privacy ledger: budgets that survive crashes.

A run directory holds

``ledger.json``
    The accountant's ledger plus the list of charged ``(round, attempt)``
    pairs. It is written (atomically) **before** a private round draws its
    batches and noise — write-ahead — so a crash can never release a noisy
    aggregate whose cost is not on disk. It is never reset.
``checkpoint.pt``
    After each completed round (atomically): the round number, model and
    optimizer state, the metrics so far and the resolved privacy plan. Generator
    states need no saving: every stream is derived from ``(seed, round,
    attempt, ...)`` (:mod:`fedfdp.sampling`).

On resume the ledger is authoritative. A private round that was charged but
not checkpointed (the crash happened inside it) is run again with a new
``attempt`` number, hence fresh batches and fresh noise, and charged again.
Reusing the old noise on possibly different inputs would reveal their
difference without noise, and reusing the old batch would break the
independence of subsampling that composition assumes; charging twice keeps ε
a valid upper bound (it overstates the cost of the aborted attempt, which may
never have been released).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedfdp.outputs import atomic_write

LEDGER_FILE = "ledger.json"
CHECKPOINT_FILE = "checkpoint.pt"

#: Keys that may differ between the run that wrote a checkpoint and the resuming one.
RESUMABLE_KEYS = frozenset({
    "out-dir", "progress", "eval-every", "node-wait-timeout", "round-timeout",
    "checkpoint-every", "resume",
})


class CheckpointMismatch(ValueError):
    """A checkpoint was written under a different configuration."""


@dataclass
class Ledger:
    """Write-ahead record of every privacy charge of a run.

    Attributes
    ----------
    accountant : dict
        ``FDPAccountant.state_dict()``.
    charges : list of [round, attempt]
        One entry per composed event, in order.
    """

    accountant: dict[str, Any]
    charges: list[list[int]] = field(default_factory=list)

    def attempts(self, round_: int) -> int:
        """How many times ``round_`` has been charged."""
        return sum(1 for r, _ in self.charges if r == round_)


def write_ledger(run_dir: str | Path, ledger: Ledger) -> None:
    """Atomically write ``run_dir/ledger.json``."""
    doc = {"accountant": ledger.accountant, "charges": ledger.charges}
    atomic_write(Path(run_dir) / LEDGER_FILE, json.dumps(doc, indent=1).encode())


def read_ledger(run_dir: str | Path) -> Ledger | None:
    """Read ``run_dir/ledger.json`` (None if absent); refuse a malformed one."""
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        charges = [[int(r), int(a)] for r, a in doc["charges"]]
        return Ledger(dict(doc["accountant"]), charges)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointMismatch(f"{path}: malformed privacy ledger ({exc}); refusing to resume") from exc


def save_checkpoint(run_dir: str | Path, state: Mapping[str, Any]) -> None:
    """Atomically write ``run_dir/checkpoint.pt``."""
    buf = io.BytesIO()
    torch.save(dict(state), buf)
    atomic_write(Path(run_dir) / CHECKPOINT_FILE, buf.getvalue())


def load_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """Load ``run_dir/checkpoint.pt`` (None if absent)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume under a configuration that differs in any key other
    than :data:`RESUMABLE_KEYS`; the message lists the differing keys."""
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    diff = sorted(k for k in keys if saved.get(k) != current.get(k))
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in diff)
        raise CheckpointMismatch(f"checkpoint written under a different configuration ({detail})")
