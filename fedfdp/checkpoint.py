"""Checkpoints that load without running code, and the resume rules of the ledger.

``checkpoint.pt`` (after each ``checkpoint-every`` rounds, and once before round 1)
holds tensors only — the model's and the optimizer's state — plus one JSON string of
metadata: the round, the configuration, ``N``, the resolved mechanism's digest, the
ledger :class:`~fedfdp.ledger.Head` it saw, the count and SHA-256 of the rows so far
(kept in ``rows.jsonl``, :mod:`fedfdp.run_rows`; version 3 held the rows themselves) and
the current ``C``.
It is read with ``torch.load(weights_only=True)``: no pickle of arbitrary objects, so
a crafted file cannot execute code (it is refused, naming the file). Its tensors are
CPU tensors whatever device the model trains on (:func:`on_cpu`; so is ``model.pt``'s),
and a resume loads them into the model where it is.

Resume (:func:`verify_resume`) refuses, naming the file, a checkpoint and ledger that
disagree in any combination: either one missing (a ledger with charges but no
checkpoint, or a checkpoint without its ledger), zeroed or malformed, rolled back (the
ledger lacks the head the checkpoint recorded), edited (a hash or link of the chain
differs), written for another mechanism (digest), or a completed round that was never
charged. Charges that the crashed session may have written after the checkpoint and
that are missing from the ledger are charged **pessimistically**: a session writes at
most one charge per private round before its next checkpoint, so the ledger must hold
at least that many after the recorded head; the shortfall is appended as
``unrecorded`` charges before anything else happens (with ``checkpoint-every = 1``,
the default, at most one round per crash). Every resumed session starts by writing a
fresh checkpoint of the head it continues from, so the bound is per session.

A private round that was charged but not checkpointed is run again with a new
``attempt`` number and charged again (fresh secret randomness; reusing the old noise
on possibly different inputs would reveal their difference).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedfdp.config import ORCHESTRATION_KEYS, default_record
from fedfdp.input_files import optional_file
from fedfdp.ledger import LEDGER_FILE, Head, Ledger, LedgerError, read_ledger
from fedfdp.outputs import atomic_write
from fedfdp.run_rows import RowsLog, RowsMark, read_rows

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_VERSION = 4
#: Earlier versions still read: 3 held the rows in its JSON (4 records a mark of ``rows.jsonl``).
READ_VERSIONS = (3, 4)

#: Keys that may differ between the run that wrote a checkpoint and the resuming one:
#: the configuration's orchestration section.
RESUMABLE_KEYS = ORCHESTRATION_KEYS


class CheckpointMismatch(LedgerError):
    """A checkpoint or ledger that must not be resumed from; the message names the file."""


@dataclass(frozen=True)
class Checkpoint:
    """A run's state after ``round`` (module docstring)."""

    round: int
    config: dict[str, Any]
    num_records: int
    mechanism_digest: str
    head: Head
    rows: list[dict[str, Any]]
    clipping_norm: float
    every: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]

    def meta(self, rows: RowsMark) -> dict[str, Any]:
        """The checkpoint's JSON: ``rows`` is what it records of ``rows.jsonl``."""
        return {
            "version": CHECKPOINT_VERSION, "round": self.round, "config": self.config,
            "num-records": self.num_records, "mechanism": self.mechanism_digest, "head": self.head.as_dict(),
            "rows": rows.as_dict(), "clipping-norm": self.clipping_norm,
            "checkpoint-every": self.every,
        }


def on_cpu(state: Any) -> Any:
    """``state`` — a tensor, or dicts, lists and tuples of them (a state dict) — with
    every tensor on the CPU: what the files of a run hold, so a session on any device
    reads them. The same object when it is all on the CPU already; a copied dict keeps
    its type and attributes (a module state dict's ``_metadata``).
    """
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        items = {k: on_cpu(v) for k, v in state.items()}
        if all(items[k] is v for k, v in state.items()):
            return state
        moved = copy.copy(state)
        moved.update(items)
        return moved
    if isinstance(state, (list, tuple)):
        values = [on_cpu(v) for v in state]
        if all(a is b for a, b in zip(values, state, strict=True)):
            return state
        return type(state)(values)
    return state


def save_checkpoint(run_dir: str | Path, ckpt: Checkpoint, rows: RowsLog | None = None) -> None:
    """Durably write ``run_dir/checkpoint.pt`` (tensors and one JSON string), after
    ``rows.jsonl`` holds ``ckpt.rows`` (:class:`~fedfdp.run_rows.RowsLog`: a run keeps
    one, so a checkpoint appends only the rows new since the last; without it the file
    is written whole).
    """
    mark = (rows if rows is not None else RowsLog(run_dir)).write(ckpt.rows)
    buf = io.BytesIO()
    torch.save({"meta": json.dumps(ckpt.meta(mark)), "model": on_cpu(ckpt.model),
                "optimizer": on_cpu(ckpt.optimizer)}, buf)
    atomic_write(Path(run_dir) / CHECKPOINT_FILE, buf.getvalue())


def load_checkpoint(run_dir: str | Path, *, rows: bool = True) -> Checkpoint | None:
    """Load ``run_dir/checkpoint.pt`` (None if absent) without executing code; refuse,
    naming the file, one that cannot be read safely or lacks a field.

    ``rows``: read the rows it counts from ``rows.jsonl`` and check them against its
    mark (:func:`fedfdp.run_rows.read_rows`; a mismatch is refused naming that file);
    ``False`` leaves ``Checkpoint.rows`` empty (what ``fedfdp account`` needs is the head).
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    if optional_file(path) is None:  # a FIFO or a device is refused, never read
        return None
    try:
        with warnings.catch_warnings():  # torch's warnings about a foreign pickle: the refusal says it
            warnings.simplefilter("ignore")
            doc = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's text suggests weights_only=False: never for a user's file
        raise CheckpointMismatch(f"{path}: not a checkpoint fedfdp wrote (torch's tensors-only loader "
                                 "refuses its contents); refusing to load it") from None
    except (OSError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile, AttributeError,
            TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointMismatch(f"{path}: unreadable or unsafe checkpoint ({type(exc).__name__}: "
                                 f"{first[:200]})") from None
    try:
        if not isinstance(doc, dict) or set(doc) != {"meta", "model", "optimizer"}:
            raise ValueError("expected the fields meta, model, optimizer")
        meta = json.loads(doc["meta"])
        if not isinstance(meta, dict) or meta.get("version") not in READ_VERSIONS:
            raise ValueError(f"version {meta.get('version') if isinstance(meta, dict) else None!r}, "
                             f"expected one of {READ_VERSIONS}")
        r = meta["round"]
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"round {r!r}")
        if not isinstance(doc["model"], dict) or not isinstance(doc["optimizer"], dict):
            raise ValueError("model and optimizer must be state dicts")
        if meta["version"] == 3:  # the rows in the JSON
            if not isinstance(meta["rows"], list) or not all(isinstance(x, dict) for x in meta["rows"]):
                raise ValueError("rows must be a list of objects")
            saved_rows: list[dict[str, Any]] = list(meta["rows"]) if rows else []
            mark = None
        else:
            mark = RowsMark.from_dict(meta["rows"])
            saved_rows = []
        ckpt = Checkpoint(
            round=r, config=dict(meta["config"]), num_records=int(meta["num-records"]),
            mechanism_digest=str(meta["mechanism"]), head=Head.from_dict(meta["head"]),
            rows=saved_rows, clipping_norm=float(meta["clipping-norm"]),
            every=int(meta["checkpoint-every"]),
            model=doc["model"], optimizer=doc["optimizer"],
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointMismatch(f"{path}: not a fedfdp checkpoint ({exc})") from None
    if mark is not None and rows:
        ckpt = dataclasses.replace(ckpt, rows=read_rows(run_dir, mark))
    return ckpt


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume under a configuration that differs in any key other
    than :data:`RESUMABLE_KEYS`; the message lists the differing keys.

    A key the checkpoint does not record (written before the key existed) counts as
    its default (:func:`fedfdp.config.default_record`): a new key's default keeps the
    earlier behaviour, so such a run resumes unless the key is now set otherwise.
    """
    defaults = default_record()
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    diff = sorted(k for k in keys if saved.get(k) != current.get(k))
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in diff)
        raise CheckpointMismatch(f"checkpoint written under a different configuration ({detail})")


@dataclass(frozen=True)
class Resume:
    """What :func:`verify_resume` found: the checkpoint (None: start at round 1), the
    verified ledger (None: a new run) and how many charges must be added
    pessimistically before the session starts.
    """

    checkpoint: Checkpoint | None
    ledger: Ledger | None
    unrecorded: int = 0


def session_bound(ckpt_round: int, every: int, num_rounds: int, private_round: Any) -> int:
    """The most charges one session can write after a checkpoint at ``ckpt_round``
    before its next checkpoint: the private rounds up to the next multiple of
    ``every`` (or the last round; ``every = 0``: the last round).
    """
    last = num_rounds if every <= 0 else min(num_rounds, (ckpt_round // every + 1) * every)
    return sum(1 for r in range(ckpt_round + 1, last + 1) if private_round(r))


def verify_resume(
    out: str | Path, flat_config: Mapping[str, Any], digest: str, num_records: int, *,
    resume: bool, num_rounds: int, private_round: Any, occupied: list[str],
) -> Resume:
    """The checks of a resume (module docstring), before anything is drawn or written.

    Parameters
    ----------
    digest
        The resolved mechanism's digest (the ledger's first entry must carry it).
    private_round
        ``private_round(r)``: whether round ``r`` is charged.
    occupied
        The run files already in ``out`` (refused without ``resume``).
    """
    out = Path(out)
    if not resume:
        if occupied:
            raise CheckpointMismatch(
                f"out-dir={str(out)!r} already holds a run ({', '.join(occupied)}): resume it "
                "(fedfdp run --resume DIR, or resume=true) or choose another output directory"
            )
        return Resume(None, None)
    ledger = read_ledger(out)
    ckpt = load_checkpoint(out)
    ledger_path, ckpt_path = out / LEDGER_FILE, out / CHECKPOINT_FILE
    if ledger is None and ckpt is None:
        raise CheckpointMismatch(f"resume=true but out-dir={str(out)!r} holds no checkpoint or ledger")
    if ledger is None:
        raise CheckpointMismatch(f"{ledger_path}: missing, but {ckpt_path} exists; refusing to resume "
                                 "(the budget would restart)")
    if ledger.mechanism_digest != digest:
        raise CheckpointMismatch(f"{ledger_path}: written for another resolved mechanism (digest "
                                 f"{ledger.mechanism_digest[:12]} vs now {digest[:12]}); refusing to resume")
    if ckpt is None:
        if ledger.charges:
            raise CheckpointMismatch(f"{ckpt_path}: missing, but {ledger_path} holds {len(ledger.charges)} "
                                     "charges; refusing to resume")
        return Resume(None, ledger)
    try:
        check_compatible(ckpt.config, flat_config)
    except CheckpointMismatch as exc:
        raise CheckpointMismatch(f"{ckpt_path}: {exc}") from None
    if ckpt.num_records != num_records:
        raise CheckpointMismatch(f"{ckpt_path}: N={ckpt.num_records} training records, the nodes now hold "
                                 f"{num_records}: different data, refusing to resume")
    if ckpt.mechanism_digest != digest:
        raise CheckpointMismatch(f"{ckpt_path}: written for another resolved mechanism; refusing to resume")
    head = ckpt.head
    if len(ledger.entries) < head.entries or ledger.entries[head.entries - 1].hash != head.hash:
        raise CheckpointMismatch(
            f"{ledger_path}: does not contain the head {ckpt_path} recorded ({head.entries} entries, "
            f"{head.charges} charges; found {len(ledger.entries)}): the ledger was rolled back, replaced or "
            "edited; refusing to resume"
        )
    charged = {e.round for e in ledger.entries[: head.entries] if e.round is not None}
    for r in range(1, ckpt.round + 1):
        if private_round(r) and r not in charged:
            raise CheckpointMismatch(f"{ledger_path}: round {r} completed (checkpoint) but was never "
                                     "charged; "
                                     "refusing to resume")
    after = len(ledger.entries) - head.entries
    # the crashed session's checkpoint-every (recorded), not the resuming one's
    unrecorded = max(0, session_bound(ckpt.round, ckpt.every, num_rounds, private_round) - after)
    return Resume(ckpt, ledger, unrecorded)
