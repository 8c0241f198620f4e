"""Large simulations on a Ray cluster (docs/deploy.md, section 10), on one machine.

A Ray head (``ray start --head``) and a second Ray node joining it (``ray start
--address``) are started as two raylets on this machine; ``fedfdp run`` with
``RAY_ADDRESS`` set must join that cluster (not start a Ray of its own) and
place the simulation's ClientApp actors on both nodes: the head has 1 CPU, the
joining node 2, and each actor takes 1 CPU, so 3 devices need both nodes.
Evidence comes from the cluster's own logs: each raylet logs the worker
processes it starts, and each ClientApp actor's worker log names its actor class.

``ray stop --force`` in ``finally`` stops every Ray process of this machine
started by ``ray start`` (the test suite runs nothing else on Ray concurrently).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from tests.deploy_helpers import free_ports

BIN = Path(sys.executable).parent


def _ray(*args: str, timeout: float = 120.0, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "ray"), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.mark.slow
def test_fedfdp_run_spreads_clients_over_a_ray_cluster(tmp_path):
    # Ray's socket paths must stay short (AF_UNIX limit): a temp dir directly under /tmp.
    temp = Path(tempfile.mkdtemp(prefix="fdpray", dir="/tmp"))
    (port,) = free_ports(1)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        head = _ray("start", "--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard=false",
                    "--temp-dir", str(temp), "--disable-usage-stats", env=env)
        assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-2000:]
        found = re.search(r"ray start --address='([^']+)'", head.stdout + head.stderr)
        assert found, head.stdout[-2000:]
        address = found.group(1)
        node = _ray("start", "--address", address, "--num-cpus", "2", "--disable-usage-stats", env=env)
        assert node.returncode == 0, node.stdout[-2000:] + node.stderr[-2000:]

        out = tmp_path / "run"
        run = subprocess.run(
            [str(BIN / "fedfdp"), "run", "--out", str(out), "--set", "num-devices=3", "--set", "num-rounds=2",
             "--set", "records-per-device=60", "--set", "progress=false"],
            capture_output=True, text=True, timeout=400, env={**env, "RAY_ADDRESS": address}, check=False,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert list(pd.read_csv(out / "metrics.csv")["round"]) == [1, 2]

        logs = temp / "session_latest" / "logs"
        actors = {
            int(f.name.rsplit("-", 1)[1].split(".")[0])
            for f in logs.glob("worker-*.out")
            if "ClientAppActor" in f.read_text(errors="replace")
        }
        assert len(actors) >= 3, sorted(p.name for p in logs.iterdir())
        raylets = sorted(logs.glob("raylet*.out"))
        assert len(raylets) == 2, raylets  # the head's and the joining node's
        started = {
            r.name: {int(p) for p in re.findall(r"Started worker process with pid (\d+)", r.read_text())}
            for r in raylets
        }
        hosts = {name: pids & actors for name, pids in started.items()}
        assert all(hosts.values()), hosts  # ClientApp actors ran on both nodes
    finally:
        _ray("stop", "--force", timeout=60, env=env)
        shutil.rmtree(temp, ignore_errors=True)
