"""metrics.csv row by row (fedfdp.metrics_table, fedfdp.outputs.MetricsFile).

The reference is pandas itself: ``DataFrame.from_records(rows)`` with the project's
leading columns first, ``to_csv(index=False)`` — what the run wrote before the table was
kept row by row. Random tables cover integers, floats (NaN, inf, tiny and huge), numpy
scalars, booleans, text with commas and quotes, missing values and columns that appear
late; the incremental file must equal the reference after every round and append (same
inode, no rewrite) whenever the new row changes no column.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest

from fedfdp.outputs import METRIC_COLUMNS, MetricsFile, write_metrics


def reference(rows) -> str:
    """pandas' rendering with the leading columns first."""
    frame = pd.DataFrame.from_records([dict(r) for r in rows])
    ordered = [c for c in METRIC_COLUMNS if c in frame.columns]
    frame = frame[ordered + [c for c in frame.columns if c not in ordered]]
    return frame.to_csv(index=False)


def _value(rng: np.random.Generator, kind: str):
    if kind == "int":
        return int(rng.integers(-5, 10**6)) if rng.random() < 0.9 else np.int64(rng.integers(0, 50))
    if kind == "float":
        choice = rng.random()
        if choice < 0.05:
            return math.nan
        if choice < 0.08:
            return math.inf if rng.random() < 0.5 else -math.inf
        if choice < 0.15:
            return float(rng.choice([1e-300, 5e-7, 1e16, 123456789.0, 0.1, 3.0]))
        if choice < 0.25:
            return np.float64(rng.normal())
        return float(rng.normal() * 10.0 ** int(rng.integers(-8, 8)))
    if kind == "bool":
        return bool(rng.random() < 0.5)
    return str(rng.choice(["fdp", "dp", 'a "quoted", text', "add-remove", "x,y", ""]))


def _rows(seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    pool = {"round": "int", "phase": "text", "epsilon": "float", "accuracy": "float", "replies": "int",
            "noise_source": "text", "fd": "float", "flag": "bool", "count": "int", "note": "text"}
    late = {name: int(rng.integers(0, n)) for name in pool}  # a column's first row
    rows = []
    for i in range(n):
        row = {}
        for name, kind in pool.items():
            if i < late[name] and name not in ("round", "epsilon"):
                continue
            if rng.random() < 0.08 and name not in ("round",):
                continue  # missing in this row
            row[name] = i + 1 if name == "round" else _value(rng, kind)
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed", range(25))
def test_every_prefix_of_a_random_table_is_pandas_rendering(seed, tmp_path):
    rows = _rows(seed, 2 + seed * 3)
    path = tmp_path / "metrics.csv"
    file = MetricsFile(path)
    live: list[dict] = []
    appended = 0
    for row in rows:
        inode = os.stat(path).st_ino if path.exists() else None
        live.append(row)
        file.write(live)
        assert path.read_text() == reference(live), len(live)
        appended += os.stat(path).st_ino == inode
    if seed >= 10:
        assert appended > 0  # the append path ran (and was checked) on the longer tables


def test_a_run_shaped_table_renders_as_pandas(tmp_path):
    """The run loop's own columns: integer counts, NaN accuracy on rounds without
    evaluation, an fd column that appears at the first evaluation."""
    rows = []
    for r in range(1, 31):
        row = {"round": r, "phase": "fdp", "epsilon": 0.01 * r ** 0.5, "delta": 1e-5,
               "relation": "add-remove", "accuracy": 0.5 + r / 100 if r % 5 == 0 else math.nan,
               "loss": math.nan, "public_loss": 1.0 / r,
               "replies": 10, "rejected": 0, "asked": 10, "missing": 0, "noise_multiplier": 1.1,
               "normaliser": 3.2, "clipping_norm": 1.0, "noise_source": "os-csprng"}
        if r % 5 == 0:
            row["fd"] = 10.0 / r
        rows.append(row)
    assert write_metrics(tmp_path, rows).read_text() == reference(rows)


def test_the_file_appends_a_row_that_changes_no_column_and_rewrites_otherwise(tmp_path):
    path = tmp_path / "metrics.csv"
    file = MetricsFile(path)
    rows: list[dict] = []
    appended = rewritten = 0
    last_inode = None
    for r in range(1, 41):
        row = {"round": r, "epsilon": 0.1 * r, "replies": 10, "phase": "fdp"}
        if r == 15:
            row["fd"] = 1.5  # a column appears: rewrite
        if r == 25:
            del row["replies"]  # an integer column meets a missing value: rewrite (now floats)
        rows.append(row)
        file.write(rows)
        assert path.read_text() == reference(rows), r
        inode = os.stat(path).st_ino
        if last_inode is not None:
            if inode == last_inode:
                appended += 1
            else:
                rewritten += 1
        last_inode = inode
    assert rewritten == 2 and appended == 37
    # a resumed run hands over a new list (its checkpoint's rows): the file is rewritten from it
    resumed = [dict(row) for row in rows[:20]]
    file.write(resumed)
    assert path.read_text() == reference(resumed) and os.stat(path).st_ino != last_inode
    resumed.append({"round": 21, "epsilon": 2.1, "replies": 10, "phase": "fdp", "fd": 0.5})
    inode = os.stat(path).st_ino
    file.write(resumed)
    assert path.read_text() == reference(resumed) and os.stat(path).st_ino == inode


def test_a_removed_file_is_written_whole_again(tmp_path):
    path = tmp_path / "metrics.csv"
    file = MetricsFile(path)
    rows = [{"round": 1, "epsilon": 0.5}]
    file.write(rows)
    path.unlink()
    rows.append({"round": 2, "epsilon": 0.7})
    file.write(rows)
    assert path.read_text() == reference(rows)
