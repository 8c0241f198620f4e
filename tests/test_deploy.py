"""Real deployments on loopback: ``flower-superlink``, ``flower-supernode`` and ``flwr run``.

Each test starts its own SuperLink and SuperNodes on free 127.0.0.1 ports
(:class:`tests.deploy_helpers.Deployment`), runs the fedfdp Flower App with
``flwr run APP CONNECTION --stream`` and reads ``metrics.csv``, which the
ServerApp writes to ``out-dir`` (always an absolute path: the ServerApp runs
in a subprocess of the SuperLink and resolves a relative path against the
SuperLink's working directory, not the caller's).

The ``deployment`` fixture cleans up whatever happens: every process runs in
its own process group, every wait is bounded, the groups are killed in
``finally`` and the fixture fails if any process is left.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import ssl
import subprocess
import time

import pandas as pd
import pytest

from fedfdp.budget import Budget
from fedfdp.checkpoint import load_checkpoint, read_ledger
from fedfdp.config import load_config
from fedfdp.data import load_dataset
from fedfdp.mechanism import FDP_ACCOUNTING
from simulations.sites import split_sites
from tests.deploy_helpers import (
    HOST,
    REPO,
    Deployment,
    make_node_key,
    make_tls,
    stage_app,
    wait_until,
)
from tests.mechanism_helpers import resolve
from tests.site_tables import DECLARED, trips

# Small and quick: 3 devices of ~60 records, one per SuperNode.
RUN = {
    "clipping-quantile": 0,  # a fixed C: the expected ε below is per σ (adaptive C: test_quantile_clipping)
    "num-devices": 3,
    "records-per-device": 60,
    "public-batch-size": 32,
    "target-epsilon": 3.0,
    "progress": True,  # the ServerApp's progress bar (eps=...) reaches the stream
    "node-wait-timeout": 90.0,
}
RUN_TIMEOUT = 240.0  # seconds for one `flwr run` to finish (a loaded 2-core machine)


def _metrics(out) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv")


def _node_id(proc) -> int:
    """The node id a SuperNode logged when it connected."""
    line = wait_until(
        lambda: next((ln for ln in proc.text().splitlines() if "SuperNode ID:" in ln), None),
        60,
        what=f"{proc.name} connected",
    )
    return int(line.rsplit(":", 1)[1])


def _expected_epsilons(run_config: dict, rounds: int) -> list[float]:
    """ε after each of ``rounds`` charged rounds for the run's σ, q, δ and N: one full event
    per round, whoever replied. (The accountant itself is tested against independent
    references in tests/test_accounting.py; here the point is what the deployed server
    charges.)"""
    cfg = load_config(run_config)
    return _expected_epsilons_for_n(run_config, load_dataset(cfg.data).num_records, rounds)


def _expected_epsilons_for_n(run_config: dict, num_records: int, rounds: int) -> list[float]:
    mechanism = resolve(load_config(run_config), num_records)
    budget = Budget(mechanism, FDP_ACCOUNTING.new())
    event = mechanism.event
    assert event is not None  # a private run
    return [budget.spend(event) for _ in range(rounds)]


def test_cleanup_kills_whole_process_groups(tmp_path):
    """The fixture's cleanup: a process and its children (same group) are gone after close()."""
    d = Deployment(tmp_path)
    try:
        p = d.spawn("tree", ["sh", "-c", "sleep 300 & sleep 300 & wait"])
        wait_until(lambda: len(d.leftover()) >= 3, 10, what="process tree started")
    finally:
        d.close(grace=2.0)
    assert not d.leftover()
    assert p.popen.returncode is not None


@pytest.mark.slow
def test_flwr_run_on_superlink_and_three_supernodes(deployment, tmp_path):
    """The deployment path: a real SuperLink, three SuperNodes (partition-id=K
    num-partitions=3), `flwr run` against it; every round's metrics and ε arrive."""
    d = deployment()
    d.start_superlink()
    nodes = [d.start_supernode(k, 3) for k in range(3)]
    app = stage_app(tmp_path / "app")
    out = tmp_path / "out"
    cfg = {**RUN, "num-rounds": 3, "out-dir": str(out)}
    t0 = time.monotonic()
    res = d.run_app(app, cfg, timeout=RUN_TIMEOUT)
    assert res.returncode == 0, res.stdout[-3000:] + d.logs()
    m = _metrics(out)
    assert list(m["round"]) == [1, 2, 3], res.stdout[-3000:]
    assert (m["replies"] == 3).all() and (m["rejected"] == 0).all() and (m["asked"] == 3).all()
    eps = m["epsilon"].to_numpy()
    assert (eps[1:] > eps[:-1]).all() and 2.5 < eps[-1] <= 3.0
    assert eps == pytest.approx(_expected_epsilons(cfg, 3), rel=1e-9)
    assert m["accuracy"].between(0, 1).all() and m["loss"].notna().all()
    resolved = (out / "config.toml").read_text()
    assert "num-nodes = 3" in resolved
    # the stream: the run started on this SuperLink and the ServerApp's progress reached us
    assert "Successfully started run" in res.stdout
    assert f"eps={eps[-1]:.3g}" in res.stdout, res.stdout[-3000:]
    assert all(n.alive() for n in nodes)
    # `flwr run --stream` exits 0 whatever the outcome: Flower's own record of the run
    r = d.cli(["ls", d.connection, "--format", "json"])
    runs = json.loads(r.stdout[r.stdout.index("{") :])["runs"]
    assert [run["status"] for run in runs] == ["finished:completed"], runs
    print(f"deployment run: {time.monotonic() - t0:.1f}s")


@pytest.mark.slow
def test_supernodes_read_their_own_data_files(deployment, tmp_path):
    """Each SuperNode trains on its own file only (`--node-config "... data-path='...'"`,
    data-location='node'); the server evaluates on its held-out file (test-path) and
    learns N from the nodes' counts. The table is split into site files by `fedfdp sites`."""
    table = trips()
    table.to_csv(tmp_path / "trips.csv", index=False)
    folder = tmp_path / "sites"
    index = split_sites(tmp_path / "trips.csv", "phone", folder, test_fraction=0.25, seed=1)
    d = deployment()
    d.start_superlink()
    nodes = [
        d.start_supernode(k, 3, node_config={"data-path": str(folder / f"site-{k}.csv")}) for k in range(3)
    ]
    out = tmp_path / "out"
    cfg = {
        **DECLARED,
        "data-location": "node",
        "test-path": str(folder / "heldout.csv"),
        "num-devices": 3,
        "num-rounds": 2,
        "public-batch-size": 32,
        "target-epsilon": 3.0,
        "progress": True,
        "node-wait-timeout": 90.0,
        "out-dir": str(out),
    }
    res = d.run_app(stage_app(tmp_path / "app"), cfg, timeout=RUN_TIMEOUT)
    assert res.returncode == 0, res.stdout[-3000:] + d.logs()
    m = _metrics(out)
    assert list(m["round"]) == [1, 2], res.stdout[-3000:] + d.logs()
    assert (m["replies"] == 3).all() and (m["rejected"] == 0).all()
    resolved = (out / "config.toml").read_text()
    assert f"num-records = {int(index['train_rows'].sum())}" in resolved  # the sites' rows, nothing else
    assert m["epsilon"].to_numpy() == pytest.approx(
        _expected_epsilons_for_n(cfg, int(index["train_rows"].sum()), 2), rel=1e-9
    )
    assert m["accuracy"].between(0, 1).all() and m["loss"].notna().all()
    assert all(n.alive() for n in nodes)


@pytest.mark.slow
def test_tls_and_supernode_auth_refuse_unlisted_key(deployment, tmp_path):
    """TLS with a CA and server certificate made here; SuperNode authentication on.
    Three SuperNodes whose public keys were registered (`flwr supernode register`)
    train; a fourth with an unregistered key is refused and never counted."""
    tls = make_tls(tmp_path / "certs")
    d = deployment(tls=tls, supernode_auth=True)
    d.start_superlink()

    # The SuperLink serves our certificate, verified against our CA, for 127.0.0.1.
    ctx = ssl.create_default_context(cafile=str(tls.ca_cert))
    with socket.create_connection((HOST, d.port), timeout=10) as raw, ctx.wrap_socket(
        raw, server_hostname=HOST
    ) as s:
        cert = s.getpeercert()
        assert cert is not None and ("IP Address", HOST) in cert["subjectAltName"]

    keys = [make_node_key(tmp_path / "keys", f"node{k}") for k in range(4)]
    registered = []
    for _, public in keys[:3]:
        r = d.cli(["supernode", "register", str(public), d.connection, "--format", "json"])
        assert r.returncode == 0, r.stdout
        registered.append(int(json.loads(r.stdout[r.stdout.index("{") :])["node-id"]))
    nodes = [d.start_supernode(k, 3, private_key=keys[k][0]) for k in range(3)]
    # (had it been accepted, its partition-id=2 would clash with node 2's: the run would fail)
    rogue = d.start_supernode(2, 3, name="rogue", private_key=keys[3][0])

    # The unregistered SuperNode is refused: it exits with Flower's activation error.
    wait_until(lambda: not rogue.alive(), 90, what="unregistered SuperNode refused")
    assert rogue.popen.returncode != 0
    assert "Failed to activate SuperNode" in rogue.text(), rogue.text()[-2000:]

    out = tmp_path / "out"
    cfg = {**RUN, "num-rounds": 1, "out-dir": str(out)}
    res = d.run_app(stage_app(tmp_path / "app"), cfg, timeout=RUN_TIMEOUT)
    assert res.returncode == 0, res.stdout[-3000:] + d.logs()
    m = _metrics(out)
    assert list(m["round"]) == [1]
    assert (m["replies"] == 3).all() and (m["rejected"] == 0).all() and (m["asked"] == 3).all()
    assert "num-nodes = 3" in (out / "config.toml").read_text()
    assert sorted(_node_id(n) for n in nodes) == sorted(registered)
    # The SuperLink knows exactly the registered nodes, all online.
    r = d.cli(["supernode", "list", d.connection, "--format", "json"])
    assert r.returncode == 0, r.stdout
    listed = json.loads(r.stdout[r.stdout.index("{") :])["nodes"]
    assert sorted(int(n["node-id"]) for n in listed) == sorted(registered)
    assert {n["status"] for n in listed} == {"online"}


@pytest.mark.slow
def test_bad_reply_and_killed_supernode(deployment, tmp_path):
    """Faults through the real deployment path, in one run of a test-only app (the real
    ClientApp, plus a tamper switch read from the node config: tests/tamper_client_app.py).

    - SuperNode 1 sends NaN private arrays every round: its reply is rejected, the stream
      names the node and the reason, `rejected == 1`, and nothing it sent reaches the model
      (finite loss) or the accounting.
    - SuperNode 2 is killed (SIGKILL, with its ClientApp) while it trains round 2: the round
      ends at `round-timeout` with what arrived, the record says who was asked and who
      replied, and the round is still charged in full at rate q (docs/deploy.md: a lost
      node is data-independent, so each record's inclusion probability is <= q).
    """
    d = deployment()
    d.start_superlink()
    good = d.start_supernode(0, 3)
    bad = d.start_supernode(1, 3, node_config={"tamper": "nan"})
    victim = d.start_supernode(2, 3)
    app = stage_app(
        tmp_path / "tamper-app",
        clientapp="tamper_client_app:app",
        extra_files=[REPO / "tests" / "tamper_client_app.py"],
    )
    out = tmp_path / "out"
    cfg = {**RUN, "num-rounds": 2, "out-dir": str(out), "round-timeout": 45.0}  # > 2x a loaded round
    run = d.start_run(app, cfg)

    def round_two_started() -> bool:
        if not run.alive():
            raise RuntimeError(f"run ended early:\n{run.text()[-3000:]}")
        done = (out / "metrics.csv").is_file() and len(_metrics(out)) >= 1
        # one ClientApp process per message: the query, round 1, then round 2
        return done and victim.text().count("Start `flwr-clientapp` process") >= 3

    wait_until(round_two_started, RUN_TIMEOUT, what="round 2 in progress on the victim")
    d.kill(victim, signal.SIGKILL)
    assert run.popen.wait(timeout=RUN_TIMEOUT) == 0, run.text()[-3000:]
    stream = run.text()
    m = _metrics(out)
    assert list(m["round"]) == [1, 2], stream[-3000:]
    assert m["asked"].tolist() == [3, 3]
    assert m["rejected"].tolist() == [1, 1], stream[-3000:]
    assert m["replies"].tolist() == [2, 1], stream[-3000:]  # round 2: only node 0's reply
    bad_id = _node_id(bad)
    for r in (1, 2):
        assert f"round {r}: rejected reply from node {bad_id}:" in stream, stream[-3000:]
    assert "contains NaN or Inf" in stream
    assert m["loss"].notna().all() and m["public_loss"].notna().all()
    assert m["epsilon"].to_numpy() == pytest.approx(_expected_epsilons(cfg, 2), rel=1e-9)
    assert good.alive() and bad.alive()


def _charged(ledger):
    """The ledger's charges as [round, attempt] pairs."""
    return [[c.round, c.body.get("attempt")] for c in ledger.charges]


@pytest.mark.slow
def test_server_killed_mid_run_and_resumed_from_checkpoint(deployment, tmp_path):
    """The server goes down inside round 2 (SIGKILL to the SuperLink's process group: the
    SuperLink, its SuperExec and the ServerApp). The SuperLink restarts from its database
    (`--database`: the SuperNodes keep their registration and reconnect), and
    `flwr run ... resume=true` continues from the round-1 checkpoint. Round 2 was charged
    before it drew its batches (write-ahead ledger), so it is run again with fresh
    randomness and charged again: no round's privacy cost is lost or undercounted."""
    d = deployment()
    database = d.root / "superlink.db"
    link = d.start_superlink(database=database)
    for k in range(3):
        d.start_supernode(k, 3)
    app = stage_app(tmp_path / "app")
    out = tmp_path / "out"
    # a fixed σ and no ε cap, so the re-charged round does not stop the run at the budget
    cfg = {**RUN, "num-rounds": 2, "out-dir": str(out), "noise-multiplier": 0.8, "target-epsilon": ""}
    first = d.start_run(app, cfg)

    def round_two_charged() -> bool:
        if not first.alive():
            raise RuntimeError(f"run ended early:\n{first.text()[-3000:]}")
        ledger = read_ledger(out) if (out / "ledger.jsonl").is_file() else None
        return ledger is not None and [2, 0] in _charged(ledger)

    wait_until(round_two_charged, RUN_TIMEOUT, what="round 2 charged")
    server = d.processes_of(link)  # the SuperLink, its SuperExec (own session), the ServerApp
    assert any("flwr-serverapp" in cmd for _, cmd in server), server
    d.kill(link, signal.SIGKILL)
    wait_until(lambda: not d.processes_of(link), 15, what="server processes gone")
    with contextlib.suppress(subprocess.TimeoutExpired):
        first.popen.wait(timeout=30)  # the CLI loses its log stream
    d.kill(first, signal.SIGKILL)
    checkpoint = load_checkpoint(out)
    assert checkpoint is not None and checkpoint.round == 1
    assert _charged(read_ledger(out)) == [[1, 0], [2, 0]]

    d.start_superlink(database=database, name="superlink-restarted")
    res = d.run_app(app, {**cfg, "resume": True}, timeout=RUN_TIMEOUT)
    assert res.returncode == 0, res.stdout[-3000:] + d.logs()
    assert "resuming" in res.stdout, res.stdout[-3000:]
    m = _metrics(out)
    assert list(m["round"]) == [1, 2], res.stdout[-3000:]
    assert (m["replies"] == 3).all() and (m["asked"] == 3).all()
    assert _charged(read_ledger(out)) == [[1, 0], [2, 0], [2, 1]]
    eps = _expected_epsilons(cfg, 3)  # three charges: round 2's aborted attempt counts
    assert m["epsilon"].to_numpy() == pytest.approx([eps[0], eps[2]], rel=1e-9)


def _worker_tasks(d: Deployment, name: str) -> list[str]:
    """The ``task N (...)`` lines a SuperNode's long-lived ClientApp worker logged."""
    proc = next(p for p in d.procs if p.name == f"{name}-worker")
    return [ln for ln in proc.text().splitlines() if "fedfdp.worker: task " in ln]


@pytest.mark.slow
def test_long_lived_clientapp_workers_serve_every_round(deployment, tmp_path):
    """`flower-supernode --isolation process` with one `python -m clients.worker` per
    SuperNode: every message of the run (the registration query and each round) is
    answered by that one process, so the node's data, model and feature map are built
    once; the run's metrics and ε are those of the default setup. A second run with
    another app (FAB) on the same SuperNodes is served too (the worker loads that FAB).
    One SuperNode holds two devices' files (a site with several devices)."""
    table = trips()
    table.to_csv(tmp_path / "trips.csv", index=False)
    folder = tmp_path / "sites"
    index = split_sites(tmp_path / "trips.csv", "phone", folder, test_fraction=0.25, seed=1)
    d = deployment()
    d.start_superlink()
    d.start_supernode(0, 2, worker=True, node_config={"device-ids": "0,2",
                                                      "data-path": f"{folder}/site-{{device}}.csv"})
    d.start_supernode(1, 2, worker=True, node_config={"device-ids": "1", "data-path": f"{folder}/site-1.csv"})
    cfg = {**DECLARED, "data-location": "node", "test-path": str(folder / "heldout.csv"), "num-devices": 3,
           "num-rounds": 3, "public-batch-size": 32, "target-epsilon": 3.0, "progress": True,
           "node-wait-timeout": 90.0}
    for run, app_name in enumerate(("app", "app2")):
        app = stage_app(tmp_path / app_name)
        if run:  # another FAB: the worker must drop the first one's modules and load this one
            (app / "strategies" / "extra_marker.py").write_text("# makes the FAB differ\n")
        out = tmp_path / f"out{run}"
        res = d.run_app(app, {**cfg, "out-dir": str(out)}, timeout=RUN_TIMEOUT)
        assert res.returncode == 0, res.stdout[-3000:] + d.logs()
        m = _metrics(out)
        assert list(m["round"]) == [1, 2, 3], res.stdout[-3000:] + d.logs()
        assert (m["replies"] == 2).all() and (m["asked"] == 2).all() and (m["rejected"] == 0).all()
        assert m["epsilon"].to_numpy() == pytest.approx(
            _expected_epsilons_for_n(cfg, int(index["train_rows"].sum()), 3), rel=1e-9)
    for k in range(2):
        # per run: 1 query + 3 rounds, all in the one worker (its log line follows the reply)
        tasks = wait_until(lambda k=k: (t := _worker_tasks(d, f"supernode-{k}")) and len(t) >= 8 and t, 30,
                           what=f"supernode-{k}'s worker logged 8 tasks")
        assert len(tasks) == 2 * 4, d.logs()
        assert all("(completed)" in t for t in tasks), tasks
    # the SuperNodes started no ClientApp process of their own
    assert not any("flwr-clientapp" in cmd for _, cmd in d.processes_of(d.procs[1]))
