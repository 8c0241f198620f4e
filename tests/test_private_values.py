"""No refusal, log line or written file quotes a private value (issue 30, point 2).

A unique mark is put in one cell that the run's relation protects (a private column; under
``dp`` any column and the label; the label under label-DP) and fed through every refusal
path of the csv, parquet and per-site loaders and of ``private-statistics = "estimate"``.
The real CLI runs in-process (``simulations.cli.main``, stdout and stderr captured, its
traceback files sent to a folder of the test's own); the mark must appear in none of
stdout, stderr or any file written. The refusal still names the column and the kind of
problem, and the number of such cells; never the cell's row, which would say *which*
record holds the bad value (the project's rule: a protected cell is named by its column
and a count only, ``fedfdp.data.encoding.bad_cells``). A cell the relation discloses (Ψ
under FDP) may be quoted with its row, and is (the control).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fedfdp.config import load_config
from fedfdp.data import DataError, load_dataset, load_server_data, load_site
from simulations.cli import main

MARK = "ZQX7731MARK"
NUMBER_MARK = 987654321

DECLARED: dict[str, str] = {
    "public-ranges": "speed=-4:4", "public-categories": "colour=red|blue",
    "private-ranges": "age=18:66", "private-categories": "job=a|b", "label-classes": "0|1",
}


def _table(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame({
        "speed": rng.normal(size=n).round(4),
        "colour": rng.choice(["red", "blue"], n),
        "age": rng.integers(18, 66, n),
        "job": rng.choice(["a", "b"], n),
        "label": rng.integers(0, 2, n),
    })


def _marked(column: str, value: object = MARK, row: int = 11) -> pd.DataFrame:
    frame = _table()
    frame[column] = frame[column].astype(object)
    frame.loc[row, column] = value
    return frame


def _write(frame: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".parquet":
        frame.astype({c: str for c in frame.columns if frame[c].dtype == object}).to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    return path


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The CLI's traceback files land in ``tmp_path / "tmp"`` (scanned with the rest)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    yield tmp_path


def _written(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*")
                     if p.is_file() and p.suffix not in (".csv", ".parquet"))


def _cli(root: Path, data: Path, capsys: pytest.CaptureFixture[str], **keys: Any) -> tuple[int, str]:
    settings = {"dataset": "csv", "data-path": str(data), "public-columns": "speed,colour",
                "private-columns": "age,job", "label-column": "label", "num-devices": 4, "num-rounds": 2,
                "noise-multiplier": 1.0, "model": "logistic", "progress": False, **keys}
    argv = ["run", "--centralised", "--out", str(root / "out")]
    for k, v in settings.items():
        argv += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out + captured.err + _written(root)


def _without(*names: str) -> dict[str, str]:
    return {k: v for k, v in DECLARED.items() if k not in names}


#: name -> (the marked table, the keys, the column the refusal names).
REFUSALS: dict[str, tuple[Callable[[], pd.DataFrame], dict[str, Any], str]] = {
    "fdp: text in a declared private range": (lambda: _marked("age"), {"mode": "fdp", **DECLARED}, "age"),
    "fdp, estimate: text in an undeclared numeric private column": (
        lambda: _marked("age"),
        {"mode": "fdp", "private-statistics": "estimate", **_without("private-ranges")}, "age"),
    "dp: text in a declared public range": (lambda: _marked("speed"), {"mode": "dp", **DECLARED}, "speed"),
    "dp, estimate: text in an undeclared numeric public column": (
        lambda: _marked("speed"),
        {"mode": "dp", "private-statistics": "estimate", **_without("public-ranges")}, "speed"),
    "dp: a label outside the declared classes": (
        lambda: _marked("label"), {"mode": "dp", **DECLARED}, "label"),
    "dp: a numeric label outside the declared classes": (
        lambda: _marked("label", NUMBER_MARK), {"mode": "dp", **DECLARED}, "label"),
    "label-DP: a label outside the declared classes": (
        lambda: _marked("label"), {"mode": "fdp", "public-loss": "label-free", **DECLARED}, "label"),
}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_names_the_column_and_never_the_marked_value_or_its_row(isolated, capsys, case, suffix):
    make, keys, column = REFUSALS[case]
    data = _write(make(), isolated / f"t{suffix}")
    status, seen = _cli(isolated, data, capsys, **keys)
    assert status == 2, seen[-2000:]
    assert MARK not in seen and str(NUMBER_MARK) not in seen
    assert not re.search(r"row \d", seen)  # the marked record's position is not shown either
    assert column in seen and ("not numbers" in seen or "not declared" in seen)
    assert "Traceback" not in seen


def test_control_a_disclosed_cell_is_quoted_with_its_row(isolated, capsys):
    """Under FDP the public columns are Ψ, disclosed: the refusal may help fix the file."""
    data = _write(_marked("speed"), isolated / "t.csv")
    status, seen = _cli(isolated, data, capsys, mode="fdp", **_without("public-ranges"))
    assert status == 2
    assert MARK in seen and "data row 12" in seen  # the frame's row 11 is data row 12


def test_a_malformed_line_holding_a_mark_is_refused_without_it(isolated, capsys):
    data = isolated / "t.csv"
    _write(_table(), data)
    lines = data.read_text().splitlines()
    lines[9] += f",{MARK}"  # one field too many
    data.write_text("\n".join(lines) + "\n")
    status, seen = _cli(isolated, data, capsys, mode="dp", **DECLARED)
    assert status == 2
    assert MARK not in seen


def test_an_extreme_private_value_in_a_run_that_trains_leaves_no_trace(isolated, capsys):
    """Declared ranges clip it; the run's files (config.toml, ledger, metrics, model) and its
    output hold no copy of the value."""
    data = _write(_marked("age", NUMBER_MARK), isolated / "t.csv")
    status, seen = _cli(isolated, data, capsys, mode="fdp", **DECLARED)
    assert status == 0, seen[-2000:]
    assert (isolated / "out" / "metrics.csv").is_file()
    assert str(NUMBER_MARK) not in seen


# --------------------------------------------------------------- the site loaders


def _site_config(test_path: Path, **keys: str) -> Any:
    return load_config({"dataset": "csv", "data-location": "node", "test-path": str(test_path),
                        "public-columns": "speed,colour", "private-columns": "age,job",
                        "label-column": "label", "num-devices": 2, "model": "logistic", **DECLARED, **keys})


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize(("mode", "column", "value"), [
    ("fdp", "age", MARK), ("fdp", "age", "inf"), ("fdp", "job", MARK), ("dp", "speed", MARK),
    ("dp", "label", MARK), ("dp", "label", NUMBER_MARK),
])
def test_the_site_and_held_out_loaders_never_quote_a_protected_cell(tmp_path, capsys, suffix, mode, column,
                                                                      value):
    site = _write(_marked(column, value), tmp_path / f"site{suffix}")
    cfg = _site_config(site, mode=mode)
    for load in (lambda: load_site(cfg.data, str(site)), lambda: load_server_data(cfg.data)):
        if column == "job":  # an undeclared category of a text column encodes to no category
            load()
            continue
        with pytest.raises(DataError) as err:
            load()
        text = str(err.value) + capsys.readouterr().err
        assert column in text
        assert str(value) not in text and not re.search(r"row \d", text)


# ------------------------------------------------------- the packaged file formats under dp


def _criteo_file(path: Path, label: str = "1", integer: str = "7") -> Path:
    lines = ["\t".join([str(i % 2), *(["5"] * 13), *(["ab12cd34"] * 26)]) for i in range(40)]
    lines[9] = "\t".join([label, integer, *(["5"] * 12), *(["ab12cd34"] * 26)])
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("label", "integer"), [(MARK, "7"), ("1", MARK)])
def test_criteo_under_dp_never_quotes_a_field(tmp_path, label, integer):
    path = _criteo_file(tmp_path / "day_0", label, integer)
    cfg = load_config({"dataset": "criteo", "data-path": str(path), "mode": "dp", "num-devices": 2})
    with pytest.raises(DataError) as err:
        load_dataset(cfg.data)
    assert MARK not in str(err.value) and ("label" in str(err.value) or "I1" in str(err.value))


def test_purchase_under_dp_never_quotes_a_label_or_a_feature(tmp_path):
    rows = ["1," + ",".join(["0"] * 600)] * 20
    for bad, field in ((f"{NUMBER_MARK}," + ",".join(["0"] * 600), "label"),
                       ("1," + ",".join([MARK] + ["0"] * 599), "Purchase100")):
        path = tmp_path / "dataset_purchase"
        path.write_text("\n".join([*rows, bad]) + "\n")
        cfg = load_config({"dataset": "purchase100", "data-path": str(path), "mode": "dp", "num-devices": 2})
        with pytest.raises(DataError) as err:
            load_dataset(cfg.data)
        text = str(err.value)
        assert MARK not in text and str(NUMBER_MARK) not in text and field in text


@pytest.mark.parametrize("column", ["label", "colour", "speed"])
def test_a_rare_marked_value_under_dp_estimates_trains_and_leaves_no_trace(isolated, capsys, column):
    """Under dp with private-statistics = estimate a marked rare label, public category or extreme
    value is a record like any other: the run trains (no refusal that would single it out) and
    neither its output nor its files (config.toml's released estimates, the ledger, metrics, the
    model) hold the mark."""
    frame = _table(1000)  # every bucket that holds the bulk of a column clears the threshold
    frame[column] = frame[column].astype(object)
    frame.loc[11, column] = NUMBER_MARK if column == "speed" else MARK
    data = _write(frame, isolated / "t.csv")
    keys = {k: v for k, v in DECLARED.items() if k.startswith("private")}
    status, seen = _cli(isolated, data, capsys, mode="dp", **{"private-statistics": "estimate"}, **keys)
    assert status == 0, seen[-2000:]
    assert MARK not in seen and str(NUMBER_MARK) not in seen
    # the released estimates: the common values only (the marked one is held by one record)
    written = (isolated / "out" / "config.toml").read_text()
    assert 'estimated-categories = "colour=blue|red,label=0|1"' in written


def test_a_file_that_is_not_utf8_is_refused_without_its_bytes(isolated, capsys):
    data = isolated / "t.csv"
    _write(_table(), data)
    raw = data.read_bytes().replace(b"red", "r\u00e9d".encode("latin-1"), 1)  # one cell not UTF-8
    data.write_bytes(raw)
    status, seen = _cli(isolated, data, capsys, mode="dp", **DECLARED)
    assert status == 2
    assert "not UTF-8" in seen and "0xe9" not in seen and "\\xe9" not in seen
