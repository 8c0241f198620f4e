"""A checkpoint's rows in rows.jsonl (fedfdp.run_rows): appended per round, checked on resume.

Independent references: the lines are compared with ``json.dumps`` of each row and the
digest with ``hashlib`` over the file's bytes; a version-3 checkpoint (rows inside its
JSON) is written by hand in that format and must still load.
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import pytest
import torch

from fedfdp.checkpoint import CHECKPOINT_FILE, Checkpoint, load_checkpoint, save_checkpoint
from fedfdp.ledger import Head
from fedfdp.run_rows import ROWS_FILE, RowsLog, RowsMismatch


def _checkpoint(rows) -> Checkpoint:
    return Checkpoint(round=len(rows), config={"mode": "fdp", "seed": 3}, num_records=100,
                      mechanism_digest="ab" * 32, head=Head(len(rows) + 1, "cd" * 32, len(rows)), rows=rows,
                      clipping_norm=0.5, every=1, model={"w": torch.arange(4.0)}, optimizer={})


def _row(r: int) -> dict:
    return {"round": r, "phase": "fdp", "epsilon": 0.1 * r, "accuracy": math.nan if r % 3 else 0.5,
            "replies": 10, "text": 'a "quoted", one'}


def _same(a, b) -> bool:
    return json.dumps(a) == json.dumps(b)  # NaN-aware equality


def test_rows_are_appended_each_checkpoint_and_read_back(tmp_path):
    log = RowsLog(tmp_path)
    rows: list[dict] = []
    inode = None
    for r in range(1, 25):
        rows.append(_row(r))
        save_checkpoint(tmp_path, _checkpoint(rows), log)
        text = (tmp_path / ROWS_FILE).read_text()
        assert text == "".join(json.dumps(x) + "\n" for x in rows)
        meta = json.loads(torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["meta"])
        assert meta["version"] == 4 and "rows" in meta and meta["rows"]["count"] == r
        assert meta["rows"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
        if inode is not None:
            assert os.stat(tmp_path / ROWS_FILE).st_ino == inode  # appended, not rewritten
        inode = os.stat(tmp_path / ROWS_FILE).st_ino
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and _same(loaded.rows, rows)
    without = load_checkpoint(tmp_path, rows=False)
    assert without is not None and without.rows == []


def test_lines_after_the_checkpoint_are_ignored_and_dropped_by_the_next_writer(tmp_path):
    rows = [_row(r) for r in range(1, 6)]
    save_checkpoint(tmp_path, _checkpoint(rows))
    with open(tmp_path / ROWS_FILE, "a") as fh:  # a session that stopped before its checkpoint
        fh.write(json.dumps(_row(6)) + "\n" + '{"round": 7, "par')
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and _same(loaded.rows, rows)
    resumed = list(loaded.rows)  # a resumed run's rows: a new list, so the file is written whole
    save_checkpoint(tmp_path, _checkpoint(resumed), RowsLog(tmp_path))
    assert (tmp_path / ROWS_FILE).read_text() == "".join(json.dumps(x) + "\n" for x in rows)


def test_a_crafted_line_that_matches_its_mark_but_is_not_an_object_is_refused(tmp_path):
    save_checkpoint(tmp_path, _checkpoint([_row(1)]))
    (tmp_path / ROWS_FILE).write_text("[1]\n")
    raw = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    meta = json.loads(raw["meta"])
    meta["rows"] = {"count": 1, "sha256": hashlib.sha256(b"[1]\n").hexdigest()}
    torch.save({**raw, "meta": json.dumps(meta)}, tmp_path / CHECKPOINT_FILE)
    with pytest.raises(RowsMismatch, match=r"rows.jsonl: line 1 is not a JSON object"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("bad", [{"count": -1, "sha256": "0" * 64}, {"count": 1, "sha256": "x"},
                                 {"count": 1}, [1, 2], {"count": True, "sha256": "0" * 64}])
def test_a_malformed_mark_is_refused_naming_the_checkpoint(tmp_path, bad):
    save_checkpoint(tmp_path, _checkpoint([_row(1)]))
    raw = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    meta = json.loads(raw["meta"])
    meta["rows"] = bad
    torch.save({**raw, "meta": json.dumps(meta)}, tmp_path / CHECKPOINT_FILE)
    with pytest.raises(Exception, match=r"checkpoint.pt: not a fedfdp checkpoint \(rows"):
        load_checkpoint(tmp_path)


def test_a_version_3_checkpoint_with_its_rows_inside_still_loads(tmp_path):
    rows = [_row(r) for r in range(1, 4)]
    meta = {"version": 3, "round": 3, "config": {"mode": "fdp"}, "num-records": 100, "mechanism": "ab" * 32,
            "head": {"entries": 4, "hash": "cd" * 32, "charges": 3}, "rows": rows, "clipping-norm": 0.5,
            "checkpoint-every": 1}
    torch.save({"meta": json.dumps(meta), "model": {"w": torch.zeros(2)}, "optimizer": {}},
               tmp_path / CHECKPOINT_FILE)
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.round == 3 and _same(loaded.rows, rows)
    assert not (tmp_path / ROWS_FILE).exists()
