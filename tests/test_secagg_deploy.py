"""Secure aggregation on a real deployment: ``flower-superlink`` with TLS and SuperNode
authentication, five authenticated ``flower-supernode`` processes on loopback, ``flwr run``
(slow: real processes).

One run of ``aggregation = "secagg"`` with ``secagg-min-survivors = 3`` (below the five
SuperNodes) and a test-only ClientApp (``tests/secagg_deploy_app.py``: the real ClientApp,
with one SuperNode that stops inside the collect stage and one inside the unmask stage of
round 1 and write a marker file there). When a marker appears the test kills that SuperNode
with SIGKILL, by pid (the SuperNode and the ClientApp process it started), so:

* round 1 loses node A in the collect stage (``|U3| = 4 ≥ n_min``: charged, unmasked with
  A's pairwise masks removed) and node B in the unmask stage (after the charge: the three
  live nodes' shares reconstruct what is needed);
* round 2 runs on the three live nodes (``= n_min``).

Checked, as the protocol guarantees them whatever the timing (a healthy SuperNode that
misses a stage's timeout on a busy machine is a dropout like any other): the run completes;
every completed round unmasked at least ``n_min`` masked vectors and never the killed
nodes' (at most 4 in round 1, at most 3 in round 2); every completed round is charged (a try
that unmasks after its charge and then fails stays charged: nothing is released uncharged),
each charge the planned event of ``[resolved] event`` (``n_h = n_min − t_c = 3``); the ε the run
printed and wrote equals the ledger's replay (``fedfdp account --run``, and routes A and B
recomputed directly from the ledger's events); the model is finite; the killed processes
are gone (by pid) and no process of the deployment is left.

A second run (:func:`test_node_policies_on_tls_with_supernode_auth_and_a_killed_supernode`,
docs/deploy.md "Node policies in a deployment") starts six SuperNodes, each with its own
``node-policy`` file and ``node-state`` directory in its ``--node-config`` (signing keys and
roster written first by :func:`simulations.identities.write_identities`), kills one inside
``sa_collect`` after its write-ahead charge and gives one a budget below one round's ε; it
compares every node's ledger with the server's, charge by charge.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedfdp.accounting.distributed import DistributedDiscreteGaussian, route_a_epsilon, route_b_epsilon
from fedfdp.ledger import read_ledger
from simulations.identities import write_identities
from tests.deploy_helpers import REPO, Deployment, make_node_key, make_tls, stage_app, wait_until

pytestmark = pytest.mark.slow

SUPERNODES = 5
COLLECT_VICTIM = 3  # partition-id of the SuperNode killed in the collect stage
UNMASK_VICTIM = 4  # ... and of the one killed in the unmask stage
#: secagg-timeout: seconds the server waits for one stage's replies. A killed node costs the
#: run this wait at each stage it misses; a healthy node must answer within it, ClientApp
#: start-up included, however busy the machine (20 s lost every node's setup reply under load).
STAGE_TIMEOUT = 60.0
RUN_TIMEOUT = 900.0


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _kill_at_marker(d: Deployment, run, victim, marker: Path) -> list[int]:
    """Wait for ``marker``, SIGKILL ``victim`` (its SuperNode and the ClientApp it started,
    by pid), check that every one of those pids is gone; return them."""

    def reached() -> bool:
        if not run.alive():
            raise RuntimeError(f"run ended early:\n{run.text()[-3000:]}")
        return marker.is_file()

    wait_until(reached, RUN_TIMEOUT, what=f"{marker.name} written")
    handler = int(marker.read_text())
    pids = [pid for pid, _ in d.processes_of(victim)]
    assert victim.popen.pid in pids and handler in pids, (pids, handler)  # the hung ClientApp is its child
    d.kill(victim, signal.SIGKILL)
    wait_until(lambda: not any(_alive(p) for p in pids), 15, what=f"{victim.name}'s processes gone")
    return pids


def test_secagg_on_tls_with_supernode_auth_and_killed_supernodes(deployment, tmp_path):
    tls = make_tls(tmp_path / "certs")
    d = deployment(tls=tls, supernode_auth=True)
    d.start_superlink()
    keys = [make_node_key(tmp_path / "keys", f"node{k}") for k in range(SUPERNODES)]
    for _, public in keys:
        r = d.cli(["supernode", "register", str(public), d.connection, "--format", "json"])
        assert r.returncode == 0, r.stdout
    markers = tmp_path / "markers"
    markers.mkdir()
    hang = {COLLECT_VICTIM: "sa_collect", UNMASK_VICTIM: "sa_unmask"}
    nodes = [
        d.start_supernode(k, SUPERNODES, private_key=keys[k][0],
                          node_config={"hang-at": hang[k], "marker-dir": str(markers)} if k in hang else None)
        for k in range(SUPERNODES)
    ]
    app = stage_app(tmp_path / "app", clientapp="secagg_deploy_app:app",
                    extra_files=[REPO / "tests" / "secagg_deploy_app.py"])
    out = tmp_path / "out"
    cfg = {
        "num-devices": SUPERNODES, "records-per-device": 60, "public-batch-size": 32, "num-rounds": 2,
        "aggregation": "secagg", "secagg-min-survivors": 3, "secagg-timeout": STAGE_TIMEOUT,
        "progress": True, "node-wait-timeout": 90.0, "out-dir": str(out),
    }
    t0 = time.monotonic()
    run = d.start_run(app, cfg)
    collect_pids = _kill_at_marker(d, run, nodes[COLLECT_VICTIM], markers / f"sa_collect-p{COLLECT_VICTIM}")
    unmask_pids = _kill_at_marker(d, run, nodes[UNMASK_VICTIM], markers / f"sa_unmask-p{UNMASK_VICTIM}")
    assert run.popen.wait(timeout=RUN_TIMEOUT) == 0, run.text()[-3000:] + d.logs()
    elapsed = time.monotonic() - t0
    stream = run.text()

    # the run completed both rounds, each on at least n_min = 3 masked vectors and never on the
    # killed nodes' (A lost at collect in round 1, A and B gone in round 2); how many healthy
    # nodes made each stage's timeout depends on the machine's load, not on the protocol
    m = pd.read_csv(out / "metrics.csv")
    assert list(m["round"]) == [1, 2], stream[-3000:] + d.logs()
    assert m["asked"].tolist() == [5, 5], m.to_string()
    replies = m["replies"].tolist()
    assert 3 <= replies[0] <= 4 and replies[1] == 3, m.to_string()
    # every completed round charged, each charge the planned event (n_h = n_min - t_c = 3)
    resolved = tomllib.loads((out / "config.toml").read_text())["resolved"]
    ledger = read_ledger(out)
    assert ledger is not None
    charged = []
    for c in ledger.charges:
        assert c.round is not None  # every charge names its round
        charged.append(c.round)
    assert set(charged) == {1, 2} and charged == sorted(charged), charged
    events = [e for e in ledger.events() if isinstance(e, DistributedDiscreteGaussian)]
    assert len(events) == len(ledger.events()) == len(charged)
    assert all(e.to_dict() == resolved["event"] for e in events) and events[0].honest_parties == 3
    # the printed ε is the ledger's replay: routes A and B from the events, and fedfdp account
    delta = resolved["delta"]
    replayed = min(route_a_epsilon(events, delta).upper, route_b_epsilon(events, delta))
    assert m["epsilon"].iloc[-1] == pytest.approx(replayed, rel=1e-9)
    account = subprocess.run(
        [sys.executable, "-m", "simulations.cli", "account", "--run", str(out), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert account.returncode == 0, account.stderr
    assert json.loads(account.stdout)["epsilon"] == m["epsilon"].iloc[-1]
    printed = re.findall(r"eps=([0-9.]+)", stream)
    assert printed and float(printed[-1]) == pytest.approx(replayed, rel=5e-3), stream[-3000:]
    # the model is finite
    model = torch.load(out / "model.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in model.values())
    # the killed SuperNodes' processes stay gone; the others served the whole run
    assert not any(_alive(p) for p in collect_pids + unmask_pids)
    assert all(n.alive() for k, n in enumerate(nodes) if k not in hang)
    r = d.cli(["ls", d.connection, "--format", "json"])
    runs = json.loads(r.stdout[r.stdout.index("{"):])["runs"]
    assert [x["status"] for x in runs] == ["finished:completed"], runs

    # what the deployment printed (kept in the test log: pytest -s)
    wanted = ("secagg", "secure aggregation", "round", "dropped", "eps=", "epsilon", "charged", "Success")
    lines = [ln for ln in stream.splitlines() if any(w in ln for w in wanted)]
    print(f"\n--- deployment stream ({elapsed:.1f}s, pids killed: collect {collect_pids}, "
          f"unmask {unmask_pids}) ---")
    print("\n".join(lines[-40:]))
    print(m[["round", "asked", "replies", "epsilon", "accuracy"]].to_string(index=False))
    assert math.isfinite(m["loss"].iloc[-1])
    assert os.path.isfile(out / "ledger.jsonl")


# ------------------------------------------------------- node policies in a deployment
POLICY_NODES = 6
HEALTHY = (0, 1, 2, 3)
KILLED = 4  # killed inside sa_collect of round 1, after its write-ahead charge (reply computed, never sent)
POOR = 5  # its policy's max-epsilon is below one round's ε: it refuses every collect
NODE_DELTA = 1e-6  # the δ every node's policy states its budget at (not the server's)
POOR_EPSILON = 0.5


def _write_policy(path: Path, *, max_epsilon: float, roster: Path) -> Path:
    """A site's policy file: the server's floor of honest shares, no colluders, the roster."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'max-epsilon = {max_epsilon!r}\ndelta = {NODE_DELTA!r}\nrelation = "add-remove"\n'
                    f'min-honest-shares = 3\nmax-colluders = 0\nroster = "{roster}"\n')
    return path


def _account(capsys: pytest.CaptureFixture[str], folder: Path, *extra: str) -> dict:
    """``fedfdp account --run FOLDER --json [EXTRA]`` (the operator's command, its entry point
    called in this process: a subprocess per ledger costs ~10 s of start-up on a busy machine)."""
    from simulations.cli import main as fedfdp_main

    capsys.readouterr()
    assert fedfdp_main(["account", "--run", str(folder), "--json", *extra]) == 0
    return dict(json.loads(capsys.readouterr().out))


def _entries(folder: Path) -> list[tuple[int | None, dict]]:
    """``(round, event)`` of every charge in the ledger in ``folder`` (none when it has none)."""
    ledger = read_ledger(folder)
    return [] if ledger is None else [(c.round, c.body["event"]) for c in ledger.charges]


def test_node_policies_on_tls_with_supernode_auth_and_a_killed_supernode(deployment, tmp_path, capsys):
    """Every SuperNode started with its own ``node-policy`` and ``node-state`` in its
    ``--node-config`` (the roster and each node's signing key written beforehand, standing in
    for the deployment authority), TLS and SuperNode authentication, one SuperNode killed
    inside ``sa_collect`` of round 1 after its write-ahead charge, one whose budget is below
    one round's ε. Checked: the run completes; every node's charges are, entry by entry,
    charges of the server's ledger (same round, same event), in this run; a node that took
    part in every charged round replays at the server's δ to exactly the server's ε; the
    killed node keeps the charge of the round it died in (its vector never sent); the poor
    node refused every collect and charged nothing."""
    tls = make_tls(tmp_path / "certs")
    d = deployment(tls=tls, supernode_auth=True)
    d.start_superlink()
    keys = [make_node_key(tmp_path / "keys", f"node{k}") for k in range(POLICY_NODES)]
    for _, public in keys:
        r = d.cli(["supernode", "register", str(public), d.connection, "--format", "json"])
        assert r.returncode == 0, r.stdout
    # the deployment authority: each site's signing key in its own node-state, the roster
    sites = {k: tmp_path / "sites" / f"site-{k}" for k in range(POLICY_NODES)}
    states = {k: site / "state" for k, site in sites.items()}
    roster_path = tmp_path / "authority" / "roster.toml"
    roster_path.parent.mkdir()
    roster = write_identities({f"node-{k}": states[k] for k in states}, roster_path)
    assert len(roster) == POLICY_NODES
    markers = tmp_path / "markers"
    markers.mkdir()
    nodes = []
    for k in range(POLICY_NODES):
        policy = _write_policy(sites[k] / "policy.toml", roster=roster_path,
                               max_epsilon=POOR_EPSILON if k == POOR else 50.0)
        config: dict[str, object] = {"node-policy": str(policy), "node-state": str(states[k])}
        if k == KILLED:
            config.update({"hang-at": "sa_collect", "hang-when": "after", "marker-dir": str(markers)})
        nodes.append(d.start_supernode(k, POLICY_NODES, private_key=keys[k][0], node_config=config))
    app = stage_app(tmp_path / "app", clientapp="secagg_deploy_app:app",
                    extra_files=[REPO / "tests" / "secagg_deploy_app.py"])
    out = tmp_path / "out"
    cfg = {
        "num-devices": POLICY_NODES, "records-per-device": 60, "public-batch-size": 32, "num-rounds": 2,
        "aggregation": "secagg", "secagg-min-survivors": 3, "secagg-timeout": STAGE_TIMEOUT,
        "progress": True, "node-wait-timeout": 90.0, "out-dir": str(out),
    }
    t0 = time.monotonic()
    run = d.start_run(app, cfg)
    killed_pids = _kill_at_marker(d, run, nodes[KILLED], markers / f"sa_collect-p{KILLED}")
    assert run.popen.wait(timeout=RUN_TIMEOUT) == 0, run.text()[-3000:] + d.logs()
    elapsed = time.monotonic() - t0
    stream = run.text()
    run_id = int(re.findall(r"started run (\d+)", stream)[0])

    # the run finished both rounds, never on the killed or the poor node's vector
    m = pd.read_csv(out / "metrics.csv")
    assert list(m["round"]) == [1, 2], stream[-3000:] + d.logs()
    assert all(3 <= r <= len(HEALTHY) for r in m["replies"]), m.to_string()
    r = d.cli(["ls", d.connection, "--format", "json"])
    assert [x["status"] for x in json.loads(r.stdout[r.stdout.index("{"):])["runs"]] == ["finished:completed"]
    # the poor node's refusal is the reason the server logged
    assert re.search(rf"node budget: this round would take ε above max-epsilon={POOR_EPSILON:g}", stream), \
        stream[-3000:]
    server_entries = _entries(out)
    assert {rnd for rnd, _ in server_entries} == {1, 2}, server_entries
    server = _account(capsys, out)
    assert server["epsilon"] == m["epsilon"].iloc[-1]
    server_delta = server["delta"]
    assert server_delta != NODE_DELTA

    rows = []
    full = 0
    for k in range(POLICY_NODES):
        mine = _entries(states[k])
        ledger = read_ledger(states[k])
        if ledger is not None:  # a node's ledger is stated at its own terms, every charge in this run
            assert ledger.mechanism == {"ledger": "node", "relation": "add-remove", "delta": NODE_DELTA}
            assert {c.body["run"] for c in ledger.charges} <= {run_id}
        # event by event: each charge is one of the server's (same round, same event), none twice
        left = list(server_entries)
        for entry in mine:
            assert entry in left, (k, entry, server_entries)
            left.remove(entry)
        rounds = [rnd for rnd, _ in mine]
        if k == POOR:
            assert mine == [], mine  # refused before charging anything
            rows.append((k, "refused", 0, 0.0, 0.0))
            continue
        own = _account(capsys, states[k])
        at_server = _account(capsys, states[k], "--delta", repr(server_delta))
        assert own["charges"] == at_server["charges"] == len(mine) and own["delta"] == NODE_DELTA
        if k == KILLED:  # died after its round-1 charge: the charge stays (write-ahead), nothing later
            assert rounds == [1], mine
            assert at_server["epsilon"] == pytest.approx(m["epsilon"].iloc[0], rel=1e-9)
        elif mine == server_entries:  # took part in every charged round: exactly the server's ε
            full += 1
            assert at_server["epsilon"] == server["epsilon"], (k, at_server, server)
        role = "killed" if k == KILLED else "healthy"
        rows.append((k, role, len(mine), own["epsilon"], at_server["epsilon"]))
    assert full >= 1, rows
    assert not any(_alive(p) for p in killed_pids)
    assert all(nodes[k].alive() for k in (*HEALTHY, POOR))

    table = [f"node  role     charges  ε at node δ={NODE_DELTA:g}  ε at server δ={server_delta:.3g}  "
             f"server ε",
             *(f"{k:>4}  {role:<7}  {n:>7}  {own:>17.6f}  {srv:>20.6f}  {server['epsilon']:.6f}"
               for k, role, n, own, srv in rows)]
    wanted = ("dropped", "eps=", "node budget", "Success")
    lines = [ln for ln in stream.splitlines() if any(w in ln for w in wanted)]
    with capsys.disabled():  # shown with pytest -s (capsys holds the account reports above)
        print(f"\n--- node policies in a deployment ({elapsed:.1f}s, run {run_id}, node {KILLED} killed in "
              f"sa_collect of round 1: pids {killed_pids}) ---")
        print("\n".join(lines[-20:]))
        print(m[["round", "asked", "replies", "epsilon", "accuracy"]].to_string(index=False))
        print("\n".join(table))
