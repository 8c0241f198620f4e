"""The ledger's running counts: a charge costs the same at every length.

Properties, not timings (speed is measured by ``benchmarks/ledger.py``): a charge
through the round engine reads a fixed number of the ledger's entries whatever its
length and never reads ``ledger.jsonl`` back (it appends one line); the running counts
agree with a plain scan of the entries after any sequence of appends, replacements and
truncations; the file a ledger written charge by charge leaves is the one written whole.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, SupportsIndex

import torch

from fedfdp import build_plan, load_config
from fedfdp.accounting import SubsampledGaussian
from fedfdp.ledger import (
    DEFAULT_CHECKPOINT_EVERY,
    LEDGER_FILE,
    Entry,
    EntryKind,
    Ledger,
    read_ledger,
    write_ledger,
)
from fedfdp.round_engine import RoundEngine

EVENT = SubsampledGaussian(1.0, 0.05)

#: ``(path, mode)`` of every file opened while a test records (an audit hook: Python's
#: own record of ``open``, nothing replaced).
_OPENED: list[tuple[str, Any]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _OPENED is not None:
        _OPENED.append((str(args[0]), args[1] if len(args) > 1 else None))


sys.addaudithook(_audit)


class CountingEntries(list[Entry]):
    """A list that counts the entries read out of it (by iteration or index)."""

    read = 0

    def __iter__(self) -> Iterator[Entry]:
        for entry in super().__iter__():
            self.read += 1
            yield entry

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        got = super().__getitem__(index)
        self.read += len(got) if isinstance(got, list) else 1
        return got


def _engine(tmp_path: Path, charged: int, extra: int) -> tuple[RoundEngine, CountingEntries]:
    """An engine writing to ``tmp_path``, resumed from a ledger of ``charged`` charges
    whose entries count their reads.
    """
    cfg = load_config({"noise-multiplier": 1.0, "num-rounds": charged + extra, "progress": False,
                       "out-dir": str(tmp_path)})
    plan = build_plan(cfg, model=torch.nn.Linear(4, 2), num_devices=3)
    engine = plan.engine([100, 80, 120])
    m = engine.mechanism
    start = Ledger.start(m.to_dict(), m.digest())
    for r in range(1, charged + 1):
        start.append_charge(r, 0, EVENT)
    entries = CountingEntries(start.entries)
    ledger = Ledger(entries)
    assert plan.files is not None
    plan.files.write_ledger(ledger)
    engine.restore_ledger(ledger)
    return engine, entries


def _charges(engine: RoundEngine, entries: CountingEntries, tmp_path: Path, first: int,
             count: int) -> tuple[int, list[tuple[str, Any]], list[int]]:
    """Charge rounds ``first ...`` through the engine; the entries read, the files
    opened and the ledger file's size before the first charge and after each.
    """
    global _OPENED
    path = tmp_path / LEDGER_FILE
    entries.read = 0
    opened: list[tuple[str, Any]] = []
    sizes = [path.stat().st_size]
    _OPENED = opened
    try:
        for r in range(first, first + count):
            engine.begin_round(r)
            sizes.append(path.stat().st_size)
    finally:
        _OPENED = None
    return entries.read, opened, sizes


def test_a_charge_reads_as_many_entries_at_every_length_and_never_reads_the_file_back(tmp_path):
    count = 20
    reads = {}
    for charged in (10, 1000):
        run = tmp_path / str(charged)
        engine, entries = _engine(run, charged, count)
        read, opened, sizes = _charges(engine, entries, run, charged + 1, count)
        reads[charged] = read
        ledger_opens = [mode for path, mode in opened if Path(path).name == LEDGER_FILE]
        # one append a charge, never a read or a rewrite
        assert len(ledger_opens) == count, ledger_opens
        assert all(set(str(m)) <= set("ab") for m in ledger_opens), ledger_opens
        # each charge appends exactly its own line
        on_disk = read_ledger(run)
        assert on_disk is not None and on_disk.head() == engine.ledger.head()
        lines = (run / LEDGER_FILE).read_bytes().splitlines(keepends=True)
        assert [len(line) for line in lines[-count:]] == [b - a for a, b in itertools.pairwise(sizes)]
        assert len(on_disk.charges) == charged + count
        assert [e.body["attempt"] for e in on_disk.charges[-count:]] == [0] * count
    assert reads[10] == reads[1000]  # nothing rescanned: the same work at 10 and at 1,010 charges
    assert reads[1000] <= 3 * count  # a charge reads its new entry a few times (chain, counts, write)


def _reference(entries: list[Entry], upto: int | None = None) -> tuple[dict[int, int], int, int]:
    """Attempts per round, charges, ``checkpoint-every``: a plain scan of the entries."""
    attempts: dict[int, int] = {}
    charges = 0
    for e in entries:
        if e.kind in (EntryKind.MECHANISM, EntryKind.SESSION):
            continue
        charges += 1
        r = e.body.get("round")
        if r is not None:
            attempts[r] = attempts.get(r, 0) + 1
    every = DEFAULT_CHECKPOINT_EVERY
    for e in entries[:upto]:
        if e.kind is EntryKind.SESSION:
            every = e.body["checkpoint_every"]
    return attempts, charges, every


def _check(ledger: Ledger) -> None:
    attempts, charges, every = _reference(list(ledger.entries))
    assert ledger.head().charges == charges == len(ledger.charges)
    assert ledger.head().entries == len(ledger.entries)
    assert {r: ledger.attempts(r) for r in range(0, 12)} == {r: attempts.get(r, 0) for r in range(0, 12)}
    assert ledger.checkpoint_every() == every
    n = len(ledger.entries)
    for upto in range(-n - 2, n + 3):
        assert ledger.checkpoint_every(upto) == _reference(list(ledger.entries), upto)[2], upto


def test_the_running_counts_agree_with_a_scan_after_any_appends_replacements_and_cuts():
    rng = random.Random(7)
    for _ in range(30):
        ledger = Ledger.start({"mode": "dp"}, "d" * 64)
        for _ in range(rng.randrange(1, 40)):
            kind = rng.random()
            if kind < 0.6:
                r = rng.randrange(1, 10)
                ledger.append_charge(r, ledger.attempts(r), EVENT)
            elif kind < 0.7:
                ledger.append_unrecorded(EVENT, rng.randrange(1, 3), "test")
            elif kind < 0.85:
                ledger.append_session(rng.randrange(0, 5))
            elif kind < 0.92:  # the entries list replaced by a shorter one
                ledger.entries = ledger.entries[: rng.randrange(1, len(ledger.entries) + 1)]
            else:  # cut in place, then appended to directly
                del ledger.entries[rng.randrange(1, len(ledger.entries) + 1):]
            _check(ledger)
        again = Ledger.from_dict(ledger.to_dict())
        _check(again)
        assert again.head() == ledger.head()


def test_a_ledger_written_charge_by_charge_is_the_file_written_whole(tmp_path):
    ledger = Ledger.start({"mode": "dp", "estimates": []}, "e" * 64)
    write_ledger(tmp_path / "step", ledger)
    for r in range(1, 30):
        ledger.append_charge(r, 0, EVENT)
        if r % 7 == 0:
            ledger.append_session(r % 4)
            ledger.append_charge(r, 1, EVENT)
        write_ledger(tmp_path / "step", ledger)
    whole = Ledger.from_dict(ledger.to_dict())  # nothing on disk: written whole
    write_ledger(tmp_path / "whole", whole)
    step = (tmp_path / "step" / LEDGER_FILE).read_bytes()
    assert step == (tmp_path / "whole" / LEDGER_FILE).read_bytes()
    # the format, independently: the header line, then each entry's compact JSON line
    expected = [{"fedfdp-ledger": 3}] + [{"kind": e.kind.value, **e.body, "prev": e.prev, "hash": e.hash}
                                         for e in ledger.entries]
    assert step == b"".join(json.dumps(d, separators=(",", ":")).encode() + b"\n" for d in expected)
