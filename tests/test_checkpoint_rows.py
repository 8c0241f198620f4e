"""A checkpoint's rows encoded row by row (fedfdp.checkpoint.EncodedRows): the same file.

The reference is ``json.dumps`` of the whole meta, as the checkpoint was written before;
the rows grow in place as a run's do, and a configuration string that holds the
placeholder does not confuse the splice.
"""

from __future__ import annotations

import json
import math

import torch

from fedfdp.checkpoint import CHECKPOINT_FILE, Checkpoint, EncodedRows, load_checkpoint, save_checkpoint
from fedfdp.ledger import Head


def _checkpoint(round_: int, rows, config) -> Checkpoint:
    return Checkpoint(round=round_, config=config, num_records=100, mechanism_digest="ab" * 32,
                      head=Head(2, "cd" * 32, 1), rows=rows, clipping_norm=0.5, every=1,
                      model={"w": torch.arange(4.0)}, optimizer={})


def _meta(path) -> str:
    return torch.load(path / CHECKPOINT_FILE, weights_only=True)["meta"]


def test_rows_encoded_once_give_the_same_meta(tmp_path):
    config = {"mode": "fdp", "note": "\x00rows\x00 in a user's string", "seed": 3}
    rows: list[dict] = []
    encoded = EncodedRows()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for r in range(1, 30):
        rows.append({"round": r, "phase": "fdp", "epsilon": 0.1 * r, "accuracy": math.nan if r % 3 else 0.5,
                     "replies": 10, "text": 'a "quoted", one'})
        ckpt = _checkpoint(r, rows, config)
        save_checkpoint(tmp_path / "a", ckpt, encoded)
        meta = _meta(tmp_path / "a")
        assert meta == json.dumps(ckpt.meta())  # byte for byte what the whole encoding writes
        save_checkpoint(tmp_path / "b", ckpt)
        assert _meta(tmp_path / "b") == meta
    loaded = load_checkpoint(tmp_path / "a")
    assert loaded is not None and loaded.config == config and len(loaded.rows) == 29
    assert loaded.rows[-1]["text"] == 'a "quoted", one'
    # a resumed run's rows are a new list: encoded from the start
    resumed = [dict(r) for r in rows[:10]]
    resumed[0]["phase"] = "changed"
    ckpt = _checkpoint(10, resumed, config)
    save_checkpoint(tmp_path / "a", ckpt, encoded)
    assert _meta(tmp_path / "a") == json.dumps(ckpt.meta())
