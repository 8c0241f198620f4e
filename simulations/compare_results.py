"""``results.csv`` of ``fedfdp compare``: its columns, reading, restart keys and appending.

One row per finished run; the file is rewritten atomically after every run. A sweep
started again skips the runs already there (same mode, target ε and seed) and
refuses rows of the same run under another configuration hash, or a malformed
file: nothing is ever overwritten.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfdp.config import ConfigError

if TYPE_CHECKING:
    from simulations.compare import RunSpec

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
    "rounds",
    "pretrain_rounds",
    "private_rounds",
    "noise_multiplier",
    "num_records",
    "engine",
    "seconds",
    "noise_source",
    "config_hash",
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
    bad = frame["accuracy"].isna() | frame["mode"].isna() | frame["seed"].isna()
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
    configuration is an error (the results would mix two experiments)."""
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
