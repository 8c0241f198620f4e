"""``results.csv`` and ``interrupted.csv`` of ``fedfdp compare``: columns, reading,
restart keys and appending.

``results.csv``: one row per finished run; the file is rewritten atomically after
every run. A sweep started again skips the runs already there (same mode, target ε
and seed) and refuses rows of the same run under another configuration hash, or a
malformed file: nothing is ever overwritten. ``resumed_after_round`` is the
checkpoint an interrupted run was resumed from (empty for a run that started
fresh).

``interrupted.csv``: one row per interrupted run that could not be resumed and was
kept aside (its directory renamed, never removed), with why, and the budget its
ledger records (``epsilon``: upper bound at ``delta`` under ``relation``, over
``charges`` charges; ``note`` when it cannot be accounted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfdp.config import ConfigError

if TYPE_CHECKING:
    from simulations.compare_plan import RunSpec

RESULTS_FILE = "results.csv"
RESULT_COLUMNS = (
    "dataset",
    "mode",
    "target_epsilon",
    "epsilon",
    "epsilon_corrdp",
    "delta",
    "relation",
    "seed",
    "accuracy",
    "balanced_accuracy",
    "auc",
    "loss",
    "fd",
    "rounds",
    "pretrain_rounds",
    "private_rounds",
    "noise_multiplier",
    "num_records",
    "engine",
    "seconds",
    "noise_source",
    "config_hash",
    "resumed_after_round",
)
REQUIRED_COLUMNS = ("dataset", "mode", "target_epsilon", "epsilon", "seed", "accuracy", "config_hash")


def read_results(out: Path):  # -> pd.DataFrame
    """``results.csv`` of ``out`` (empty frame if none); a malformed file is an error."""
    import pandas as pd

    path = out / RESULTS_FILE
    if not path.exists():
        return pd.DataFrame(columns=list(RESULT_COLUMNS))
    try:
        frame = pd.read_csv(path)
    except Exception as exc:
        raise ConfigError(
            f"--out={str(out)!r}: {RESULTS_FILE} is malformed ({type(exc).__name__}: {exc}); "
            "move it away or choose another --out (it is never overwritten)"
        ) from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"--out={str(out)!r}: {RESULTS_FILE} lacks columns {missing}; not a results file of "
            "fedfdp compare — move it away or choose another --out (it is never overwritten)"
        )
    scored = frame["accuracy"].notna() | (frame["fd"].notna() if "fd" in frame else False)
    bad = ~scored | frame["mode"].isna() | frame["seed"].isna()
    if bad.any():
        raise ConfigError(
            f"--out={str(out)!r}: {RESULTS_FILE} row {int(bad.idxmax()) + 2} is incomplete; "
            "move the file away or fix it (it is never overwritten)"
        )
    return frame


def _key_of_row(row: Mapping[str, Any]) -> tuple[str, float | None, int]:
    eps = row["target_epsilon"]
    eps = None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(eps)
    return (str(row["mode"]), eps, int(row["seed"]))


def done_runs(frame, runs: Sequence[RunSpec]) -> set[tuple[str, float | None, int]]:
    """Keys of ``runs`` already in ``frame``; a row for a run under another
    configuration is an error (the results would mix two experiments).
    """
    wanted = {r.key: r for r in runs}
    done = set()
    for row in frame.to_dict("records"):
        key = _key_of_row(row)
        run = wanted.get(key)
        if run is None:
            continue
        if str(row["config_hash"]) != run.config_hash:
            raise ConfigError(
                f"results.csv already holds mode={key[0]!r}, target-epsilon={key[1]}, seed={key[2]} "
                f"from another configuration (hash {row['config_hash']} != {run.config_hash}); "
                "use another --out for a different experiment"
            )
        done.add(key)
    return done


def append_result(out: Path, row: Mapping[str, Any]) -> None:
    """Add one row to ``results.csv`` (whole file rewritten atomically)."""
    import pandas as pd

    from fedfdp.outputs import atomic_write

    frame = read_results(out)
    new = pd.DataFrame([{c: row.get(c) for c in RESULT_COLUMNS}])
    frame = new if frame.empty else pd.concat([frame, new], ignore_index=True)
    atomic_write(out / RESULTS_FILE, frame.to_csv(index=False).encode())


INTERRUPTED_FILE = "interrupted.csv"
INTERRUPTED_COLUMNS = ("run", "kept_at", "reason", "charges", "epsilon", "delta", "relation", "note")


def read_interrupted(out: Path) -> list[dict[str, Any]]:
    """The rows of ``out/interrupted.csv`` (none if absent), numbers parsed; a
    malformed file is an error (never overwritten).
    """
    import csv

    path = out / INTERRUPTED_FILE
    if not path.exists():
        return []
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or set(reader.fieldnames) != set(INTERRUPTED_COLUMNS):
                raise ValueError(f"columns {reader.fieldnames}, expected {list(INTERRUPTED_COLUMNS)}")
            rows: list[dict[str, Any]] = []
            for row in reader:
                item: dict[str, Any] = dict(row)
                item["charges"] = int(row["charges"]) if row["charges"] else None
                for key in ("epsilon", "delta"):
                    item[key] = float(row[key]) if row[key] else math.nan
                rows.append(item)
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        raise ConfigError(
            f"--out={str(out)!r}: {INTERRUPTED_FILE} is malformed ({exc}); move it away or fix it "
            "(it is never overwritten)"
        ) from exc
    return rows


def append_interrupted(out: Path, row: Mapping[str, Any]) -> None:
    """Add one row to ``interrupted.csv`` (whole file rewritten atomically)."""
    import csv
    import io

    from fedfdp.outputs import atomic_write

    rows = [*read_interrupted(out), dict(row)]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(INTERRUPTED_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({c: _cell(r.get(c)) for c in INTERRUPTED_COLUMNS})
    atomic_write(out / INTERRUPTED_FILE, buf.getvalue().encode())


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else value
