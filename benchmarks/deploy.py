"""Seconds per round of a real deployment on loopback: fedfdp vs a bare Flower app (issue 16).

A SuperLink and ``--nodes`` SuperNodes (real ``flower-superlink`` /
``flower-supernode`` processes, :class:`tests.deploy_helpers.Deployment`, every
Flower process with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``) run, one
after the other and ``--repeats`` times in turn, ``flwr run`` submissions of
one staged Flower App whose components are this module's ``server_app`` and
``client_app``:

``fdp``
    the project's ServerApp body (:func:`strategies.server_app.run_server`:
    registration, σ, FDPStrategy, evaluation, checkpoints) and ClientApp
    (:data:`clients.client_app.app`) on the default fleet (20 devices of 200
    records, partition ``k`` of the SuperNodes), ``--rounds`` rounds.
``echo``
    bare Flower: ``flwr.serverapp.strategy.FedAvg`` (every node, every round)
    with the same model; the ClientApp returns the arrays it received.

Each ServerApp times its rounds (FDP: from one ``begin_round`` to the next;
FedAvg: from one ``configure_train`` to the next) and writes them to a file;
the first ``--warmup`` rounds of a run are left out.

How the SuperNodes run ClientApps (``--clientapp``):

``subprocess``
    Flower's default (``--isolation subprocess``): the SuperNode starts a
    SuperExec that starts one ``flwr-clientapp`` process per message.
``worker``
    ``--isolation process`` with one long-lived ``python -m clients.worker``
    per SuperNode, which runs every message in the same process (data, model
    and feature map built once per run: :func:`clients.client_app.node_runtime`).

``--flower-polling`` replaces FDPStrategy's own reply polling by Flower's
``Grid.send_and_receive`` (3 s between polls on a deployment), i.e. the
strategy as it was before issue 16.

``--what-if-fast-supernode`` (a measurement, not a setup to deploy) starts each
SuperNode through a launcher that shortens fixed waits of Flower 1.41's
SuperNode loop (``flwr/supernode/start_client_internal.py``): 3 s after a pull
that found no message (every round waits for it, since the next round's
message cannot exist when the SuperNode pulls right after sending its reply),
0.5 s between checks for the ClientApp's reply, and the 1 s first backoff
when a message's objects are not yet uploaded; all become 20 ms, and so does
the ServerApp Grid's backoff for a reply's objects. The difference to a normal
run is Flower's share that no app can remove.

    python benchmarks/deploy.py --rounds 6 --repeats 2
    python benchmarks/deploy.py --clientapp subprocess --flower-polling   # the old setup
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENV = "FEDFDP_DEPLOY_BENCH"
REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- #
# the staged app's components (run inside the deployment's processes)
# --------------------------------------------------------------------------- #


def _settings() -> dict[str, Any]:
    """This run's settings: the file the environment names (the driver rewrites it per run)."""
    with open(os.environ[ENV]) as f:
        return json.load(f)


def _make_server_app() -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        logging.getLogger("flwr").setLevel(logging.WARNING)
        s = _settings()
        if s.get("what_if_fast_supernode"):
            _fast_object_pulls()
        marks: list[float] = []
        log: dict[str, Any] = {"workload": s["workload"]}
        t0 = time.perf_counter()
        try:
            if s["workload"] == "fdp":
                from fedfdp.config import load_config
                from fedfdp.data import load_server_data
                from fedfdp.run_plan import build_plan
                from strategies import fdp_strategy

                if s.get("flower_polling"):
                    fdp_strategy.exchange = lambda grid, msgs, timeout: list(  # type: ignore[assignment]
                        grid.send_and_receive(msgs, timeout=timeout))
                parts = log["parts_s"] = {"configure": [], "exchange": [], "collect": []}
                exchange = fdp_strategy.exchange

                def timed_exchange(*a: Any, **k: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return exchange(*a, **k)
                    finally:
                        parts["exchange"].append(time.perf_counter() - t)

                fdp_strategy.exchange = timed_exchange

                class TimedFDP(fdp_strategy.FDPStrategy):
                    """The strategy, its round start marked and its parts timed."""

                    def configure_train(self, *a: Any, **k: Any) -> Any:
                        marks.append(time.perf_counter())
                        t = time.perf_counter()
                        try:
                            return super().configure_train(*a, **k)
                        finally:
                            parts["configure"].append(time.perf_counter() - t)

                    def collect(self, *a: Any, **k: Any) -> Any:
                        t = time.perf_counter()
                        try:
                            return super().collect(*a, **k)
                        finally:
                            parts["collect"].append(time.perf_counter() - t)

                cfg = load_config(dict(context.run_config))
                plan = build_plan(cfg, load_server_data(cfg.data))
                TimedFDP(plan).start(grid, ArrayRecord(plan.model.state_dict()), num_rounds=plan.num_rounds)
            else:
                from flwr.serverapp.strategy import FedAvg

                from fedfdp.config import load_config
                from fedfdp.data import load_server_data
                from fedfdp.models import build_model_for

                class TimedFedAvg(FedAvg):
                    def configure_train(
                        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                    ) -> Iterable[Message]:
                        marks.append(time.perf_counter())
                        return super().configure_train(server_round, arrays, config, grid)

                cfg = load_config(dict(context.run_config))
                nodes = int(s["nodes"])
                while len(list(grid.get_node_ids())) < nodes:
                    time.sleep(0.1)
                model = build_model_for(cfg.training, load_server_data(cfg.data))
                TimedFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes,
                            min_evaluate_nodes=0, min_available_nodes=nodes).start(
                    grid, ArrayRecord(model.state_dict()), num_rounds=cfg.privacy.num_rounds)
        finally:
            end = time.perf_counter()
            log["before_first_round_s"] = marks[0] - t0 if marks else None
            log["rounds_s"] = [b - a for a, b in zip(marks, [*marks[1:], end], strict=True)]
            with open(s["result"], "w") as f:
                json.dump(log, f)

    return app


def _make_client_app() -> Any:
    from benchmarks.echo import fdp_or_echo
    from clients.client_app import app as fdp

    return fdp_or_echo(fdp)


server_app = _make_server_app()
client_app = _make_client_app()


# --------------------------------------------------------------------------- #
# the driver
# --------------------------------------------------------------------------- #


#: ``python -c`` source of the what-if SuperNode: Flower's SuperNode with its idle
#: (3 s) and reply-check (0.5 s) sleeps shortened to 20 ms.
FAST_SUPERNODE = (
    "from clients.flower_adapter import shorten_supernode_waits, run_flower_supernode; "
    "shorten_supernode_waits(0.02, initial_backoff=0.02, backoff_cap=0.25); run_flower_supernode()"
)


def _fast_object_pulls() -> None:
    """What-if: the ServerApp's Grid retries a reply's not-yet-uploaded objects after
    20 ms (Flower: 1 s, doubling)."""
    from clients.flower_adapter import shorten_grid_object_pulls

    shorten_grid_object_pulls(initial_backoff=0.02, backoff_cap=0.25)


def stage(dest: Path) -> Path:
    """The project's Flower App with this module as its components."""
    sys.path.insert(0, str(REPO))
    from tests.deploy_helpers import stage_app

    app = stage_app(dest)
    (app / "benchmarks").mkdir()
    shutil.copy2(Path(__file__), app / "benchmarks" / "deploy.py")
    text = (app / "pyproject.toml").read_text()
    for kind in ("server", "client"):
        text = re.sub(rf'(?m)^{kind}app = ".*"$', f'{kind}app = "benchmarks.deploy:{kind}_app"', text)
    (app / "pyproject.toml").write_text(text)
    return app


def run_deploy(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.deploy_helpers import Deployment

    root = Path(tempfile.mkdtemp(prefix="fedfdp-deploy-bench-"))
    results: dict[str, list[dict[str, Any]]] = {"fdp": [], "echo": []}
    settings_file = root / "settings.json"
    os.environ[ENV] = str(settings_file)  # the SuperLink's children (the ServerApps) inherit it
    try:
        with Deployment(root / "d") as d:
            d.start_superlink()
            for k in range(args.nodes):
                launcher = [sys.executable, "-c", FAST_SUPERNODE] if args.what_if_fast_supernode else None
                d.start_supernode(k, args.nodes, worker=args.clientapp == "worker", launcher=launcher)
            app = stage(root / "app")
            n = 0
            for repeat in range(args.repeats):
                for workload in ("fdp", "echo"):
                    result = root / f"{workload}-{repeat}.json"
                    settings = {"workload": workload, "result": str(result), "nodes": args.nodes,
                                "flower_polling": args.flower_polling,
                                "what_if_fast_supernode": args.what_if_fast_supernode}
                    settings_file.write_text(json.dumps(settings))
                    out = root / f"out-{n}"
                    n += 1
                    t0 = time.perf_counter()
                    res = d.run_app(app, {"num-rounds": args.rounds, "out-dir": str(out), "progress": False,
                                          "node-wait-timeout": 120.0}, timeout=args.timeout)
                    wall = time.perf_counter() - t0
                    if res.returncode != 0 or not result.is_file():
                        tail = f"{res.stdout[-3000:]}\n{d.logs()[-6000:]}"
                        raise RuntimeError(f"{workload} run failed:\n{tail}")
                    log = json.loads(result.read_text())
                    log["wall_s"] = wall
                    results[workload].append(log)
            cpu = d.cpu_seconds()
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(root, ignore_errors=True)

    def steady(kind: str) -> list[float]:
        return [r for log in results[kind] for r in log["rounds_s"][args.warmup:]]

    fdp, echo = steady("fdp"), steady("echo")
    return {
        "fdp_round_s": statistics.median(fdp),
        "echo_round_s": statistics.median(echo),
        "fdp_over_echo": statistics.median(fdp) / statistics.median(echo),
        "fdp_rounds_s": [log["rounds_s"] for log in results["fdp"]],
        "echo_rounds_s": [log["rounds_s"] for log in results["echo"]],
        "fdp_before_first_round_s": [log["before_first_round_s"] for log in results["fdp"]],
        "fdp_parts_median_s": {
            k: statistics.median([x for log in results["fdp"] for x in log["parts_s"][k][1:]])
            for k in ("configure", "exchange", "collect")
        },
        "fdp_run_wall_s": [log["wall_s"] for log in results["fdp"]],
        "echo_run_wall_s": [log["wall_s"] for log in results["echo"]],
        "deployment_cpu_s": cpu,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per run")
    parser.add_argument("--repeats", type=int, default=2, help="fdp/echo run pairs")
    parser.add_argument("--warmup", type=int, default=1, help="first rounds of each run left out")
    parser.add_argument("--clientapp", choices=("subprocess", "worker"), default="worker")
    parser.add_argument("--flower-polling", action="store_true",
                        help="FDPStrategy waits with Flower's send_and_receive (before issue 16)")
    parser.add_argument("--superexec-poll", type=float, default=None, metavar="S",
                        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the SuperNodes' SuperExec (Flower: 1 s)")
    parser.add_argument("--what-if-fast-supernode", action="store_true",
                        help="SuperNodes with Flower's fixed 3 s / 0.5 s sleeps shortened (a measurement)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per flwr run")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    if args.superexec_poll is not None:  # inherited by every process the deployment starts
        os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(args.superexec_poll)
    res = run_deploy(args)
    res["env"] = {"nodes": args.nodes, "rounds": args.rounds, "repeats": args.repeats, "warmup": args.warmup,
                  "clientapp": args.clientapp, "flower_polling": args.flower_polling,
                  "what_if_fast_supernode": args.what_if_fast_supernode,
                  "superexec_poll": args.superexec_poll,
                  "load_avg_1m_start": load, "load_avg_1m_end": os.getloadavg()[0],
                  "cpu_count": os.cpu_count()}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    e = res["env"]
    polling = "Flower send_and_receive" if args.flower_polling else "FDPStrategy.exchange"
    print(f"{args.nodes} loopback SuperNodes, ClientApps: {args.clientapp}; strategy polling: {polling}; "
          f"{args.repeats} x {args.rounds} rounds per app (first {args.warmup} left out); "
          f"load {e['load_avg_1m_start']:.1f} -> {e['load_avg_1m_end']:.1f}")
    for name, key in (("fedfdp round", "fdp"), ("bare Flower ", "echo")):
        runs = [[round(r, 2) for r in x] for x in res[f"{key}_rounds_s"]]
        print(f"  {name}  {res[f'{key}_round_s']:.2f} s   (runs {runs})")
    parts = ", ".join(f"{k} {v:.2f} s" for k, v in res["fdp_parts_median_s"].items())
    print(f"  fedfdp round parts (medians): {parts}; the rest: evaluation, checkpoint, metrics")
    print(f"  fedfdp / bare Flower = {res['fdp_over_echo']:.2f}; fedfdp before round 1: "
          f"{[round(x, 1) for x in res['fdp_before_first_round_s']]} s")


if __name__ == "__main__":
    main()
