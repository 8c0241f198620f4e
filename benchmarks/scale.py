"""Seconds per round with every device in every round: Flower's simulation engine vs the
centralised engine vs bare Flower FedAvg, and the peak memory (issue 16).

One run on Flower's Simulation Runtime, started exactly as ``fedfdp run`` starts
it (:class:`simulations.flower_processes.LocalSimulation`: ``flwr run`` against a SuperLink
in simulation mode; the staged app's components are this module's
``server_app`` and ``client_app``, which time themselves), with
``--supernodes`` virtual SuperNodes (default: one per core, as ``fedfdp run``
picks for a fleet this size), serves three workloads in alternating blocks of
``--rounds`` rounds, so that all of them see the same Ray workers and the same
phases of a shared machine:

``flower``
    :class:`strategies.fdp_strategy.FDPStrategy` (``node_choice="devices"``, as
    ``fedfdp run``) with the project's ClientApp: ``--devices`` devices of
    ``--records`` records (80 % for training), the default logistic model and
    fleet, record-level FDP with every device in every round (q = 0.05,
    public batch 256), ``eval-every = 1``, ``checkpoint-every = 1`` and an
    output directory (metrics.csv, ledger.jsonl, checkpoint.pt every round).
``centralised``
    :func:`fedfdp.algorithm.run_centralised` on the same configuration and
    data, in the same process (the ServerApp's thread), between the Flower
    blocks.
``fedavg``
    bare Flower: ``flwr.serverapp.strategy.FedAvg`` on the same SuperNodes,
    all of them in every round; its ClientApp returns the arrays it received.

The centralised engine runs in the ``flwr-simulation`` process next to the
ServerApp, with torch's default threads, as ``fedfdp run --centralised`` would.
A round is timed from one round's start to the next (FDP: ``begin_round``;
FedAvg: ``configure_train``), so it includes everything the engine does per
round (budget check, ledger, noise, accounting, evaluation, checkpoint,
metrics). The first ``--warmup`` rounds of every block are left out.

Then, unless ``--per-device-fedavg-rounds 0``, a second simulation runs bare
FedAvg the way Flower models a fleet: one echo SuperNode per device, every
one in every round (``--per-device-fedavg-rounds`` rounds, the first left out).

Memory: the peak summed RSS (and PSS) of this process and all its descendants
(Ray's GCS, raylet, workers), sampled every 0.25 s, for each simulation.

    python benchmarks/scale.py --devices 1000            # table
    python benchmarks/scale.py --devices 10000 --json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any, cast

import torch

from benchmarks.fleet import MemoryMonitor
from benchmarks.timing import quartiles


def scale_config(args: argparse.Namespace, out_dir: str, rounds: int) -> Any:
    from fedfdp.config import load_config

    return load_config(
        {
            "num-devices": args.devices,
            "records-per-device": args.records,
            "num-rounds": rounds,
            "noise-multiplier": 1.0,
            "progress": False,
            "out-dir": out_dir,
            "seed": args.seed,
            "node-wait-timeout": args.node_wait,
        }
    )


class Marks:
    """Start times of rounds, per block (thread-safe enough: one ServerApp thread)."""

    def __init__(self) -> None:
        self.current: list[float] | None = None

    def mark(self) -> None:
        if self.current is not None:
            self.current.append(time.perf_counter())


MARKS = Marks()


def _marked_parts() -> Any:
    """Server components whose sampling plan records the start of every FDP round (the
    round engine draws each round's sampling when it begins it: Flower path and
    centralised engine alike), through the seam a normal run uses.
    """
    from fedfdp.round_engine import ServerParts
    from fedfdp.sampling_plan import SamplingPlan

    class MarkedPlan(SamplingPlan):
        def round(self, *args: Any, **kwargs: Any) -> Any:
            MARKS.mark()
            return super().round(*args, **kwargs)

    return ServerParts(sampling_plan=MarkedPlan)


def _timed_fedavg(fraction: float, nodes: int) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Message
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import FedAvg

    class TimedFedAvg(FedAvg):
        def configure_train(
            self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
        ) -> Iterable[Message]:
            MARKS.mark()
            return super().configure_train(server_round, arrays, config, grid)

    return TimedFedAvg(fraction_train=fraction, fraction_evaluate=0.0, min_train_nodes=nodes,
                       min_evaluate_nodes=0, min_available_nodes=nodes)


def _wait_for_nodes(grid: Any, count: int, timeout: float) -> float:
    t0 = time.perf_counter()
    while len(list(grid.get_node_ids())) < count:
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"only {len(list(grid.get_node_ids()))} of {count} nodes registered")
        time.sleep(0.05)
    return time.perf_counter() - t0


def _server_main(grid: Any, args: argparse.Namespace, log: dict[str, Any]) -> None:
    """The three workloads in alternating blocks (module docstring)."""
    from flwr.app import ArrayRecord

    from fedfdp.algorithm import run_centralised
    from fedfdp.data import load_dataset
    from fedfdp.models import build_model_for
    from fedfdp.run_plan import build_plan
    from strategies.fdp_strategy import FDPStrategy, NodeChoice

    log["node_wait_s"] = _wait_for_nodes(grid, args.supernodes, args.node_wait)
    registry = None
    for repeat in range(args.repeats):
        for kind in ("flower", "centralised", "fedavg"):
            start = time.perf_counter()
            MARKS.current = marks = cast(list[float], [])
            if kind == "flower":
                cfg = scale_config(args, tempfile.mkdtemp(prefix="scale-flower-"), args.rounds)
                plan = build_plan(cfg, load_dataset(cfg.data), server_parts=_marked_parts())
                strat = FDPStrategy(plan, node_choice=NodeChoice.DEVICES)
                if registry is not None:
                    strat.registry = dict(registry)
                else:
                    t = time.perf_counter()
                    strat.register_nodes(grid)
                    log["registration_s"] = time.perf_counter() - t
                strat.start(grid, ArrayRecord(plan.model.state_dict()))
                registry = strat.registry
            elif kind == "centralised":
                cfg = scale_config(args, tempfile.mkdtemp(prefix="scale-central-"), args.rounds)
                run_centralised(cfg, load_dataset(cfg.data), server_parts=_marked_parts())
            else:
                cfg = scale_config(args, "", args.rounds)
                model = build_model_for(cfg.training, load_dataset(cfg.data))
                fed = _timed_fedavg(1.0, args.supernodes)
                fed.start(grid, ArrayRecord(model.state_dict()), num_rounds=args.rounds)
            end = time.perf_counter()
            MARKS.current = None
            rounds = [b - a for a, b in zip(marks, [*marks[1:], end], strict=True)]
            log["blocks"].append({"kind": kind, "repeat": repeat, "rounds_s": rounds,
                                  "before_first_round_s": marks[0] - start if marks else None})


def _per_device_main(grid: Any, args: argparse.Namespace, log: dict[str, Any]) -> None:
    """Bare FedAvg on one echo SuperNode per device, all of them every round."""
    from flwr.app import ArrayRecord

    from fedfdp.data import load_dataset
    from fedfdp.models import build_model_for

    log["per_device_node_wait_s"] = _wait_for_nodes(grid, args.devices, args.node_wait)
    cfg = scale_config(args, "", args.per_device_fedavg_rounds)
    model = build_model_for(cfg.training, load_dataset(cfg.data))
    MARKS.current = marks = cast(list[float], [])
    fed = _timed_fedavg(1.0, args.devices)
    fed.start(grid, ArrayRecord(model.state_dict()), num_rounds=args.per_device_fedavg_rounds,
              timeout=args.per_device_timeout)
    end = time.perf_counter()
    MARKS.current = None
    log["per_device_fedavg_rounds_s"] = [b - a for a, b in zip(marks, [*marks[1:], end], strict=True)]


#: The benchmark's settings, passed by the driver to the simulation's processes.
ENV_ARGS = "FEDFDP_SCALE_ARGS"


def _make_server_app() -> Any:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        logging.getLogger("flwr").setLevel(logging.ERROR)  # FedAvg's per-round log lines
        settings = json.loads(os.environ[ENV_ARGS])
        args = argparse.Namespace(**settings["args"])
        log: dict[str, Any] = {"blocks": []}
        try:
            if settings["workload"] == "mixed":
                _server_main(grid, args, log)
            else:
                _per_device_main(grid, args, log)
        finally:
            with open(settings["result"], "w") as f:
                json.dump(log, f)

    return app


def _make_client_app() -> Any:
    """FDP messages go to ``fedfdp run``'s ClientApp; others are echoed (FedAvg)."""
    from benchmarks.echo import fdp_or_echo
    from clients.client_app import simulation_app as fdp

    return fdp_or_echo(fdp)


#: The components of the staged benchmark app (loaded by Flower in the simulation's processes).
server_app = _make_server_app()
client_app = _make_client_app()


def _simulate(
    args: argparse.Namespace, workload: str, nodes: int
) -> tuple[dict[str, Any], float, MemoryMonitor]:
    """Run ``workload`` on ``nodes`` virtual SuperNodes as ``fedfdp run`` would;
    return the ServerApp's log, the wall time and the memory monitor."""
    import shutil

    from simulations.flower_processes import LocalSimulation, stage_simulation_app

    cfg = scale_config(args, "", args.rounds)
    monitor = MemoryMonitor()
    root = tempfile.mkdtemp(prefix="fedfdp-scale-")
    result = os.path.join(root, f"{workload}.json")
    # the SuperLink passes its environment on to the simulation's processes
    os.environ[ENV_ARGS] = json.dumps({"args": vars(args), "workload": workload, "result": result})
    try:
        with LocalSimulation() as sim:
            app = stage_simulation_app(sim.root / "app", cfg)
            (app / "benchmarks").mkdir()
            here = os.path.dirname(os.path.abspath(__file__))
            for name in ("scale.py", "fleet.py", "timing.py"):
                shutil.copy2(os.path.join(here, name), app / "benchmarks" / name)
            text = (app / "pyproject.toml").read_text()
            text = text.replace('"strategies.server_app:simulation_app"', '"benchmarks.scale:server_app"')
            text = text.replace('"clients.client_app:simulation_app"', '"benchmarks.scale:client_app"')
            (app / "pyproject.toml").write_text(text)
            monitor.start()
            t0 = time.perf_counter()
            try:
                sim.run(app, nodes)
            finally:
                total = time.perf_counter() - t0
                monitor.stop()
        with open(result) as f:
            log = json.load(f)
    finally:
        os.environ.pop(ENV_ARGS, None)
        shutil.rmtree(root, ignore_errors=True)
    return log, total, monitor


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    log, total, monitor = _simulate(args, "mixed", args.supernodes)
    if len(log["blocks"]) != 3 * args.repeats:
        raise RuntimeError(f"the simulation finished {len(log['blocks'])} of {3 * args.repeats} blocks")

    def steady(kind: str) -> list[float]:
        return [r for b in log["blocks"] if b["kind"] == kind for r in b["rounds_s"][args.warmup:]]

    flower, central, fedavg = steady("flower"), steady("centralised"), steady("fedavg")
    res: dict[str, Any] = {
        "flower_round_s": _median(flower),
        "centralised_round_s": _median(central),
        "fedavg_same_nodes_round_s": _median(fedavg),
        "flower_over_centralised": _median(flower) / _median(central),
        "flower_over_fedavg_same_nodes": _median(flower) / _median(fedavg),
        "flower_round_quartiles_s": quartiles(flower),
        "centralised_round_quartiles_s": quartiles(central),
        "fedavg_same_nodes_round_quartiles_s": quartiles(fedavg),
        "peak_rss_mb": monitor.peak_rss / 2**20,
        "peak_pss_mb": monitor.peak_pss / 2**20,
        "peak_processes": monitor.peak_procs,
        "node_wait_s": log["node_wait_s"],
        "registration_s": log.get("registration_s"),
        "total_s": total,
        "blocks": log["blocks"],
    }
    if args.per_device_fedavg_rounds:
        log2, total2, monitor2 = _simulate(args, "per-device", args.devices)
        rounds = log2.get("per_device_fedavg_rounds_s", [])
        per_device = _median(rounds[1:] if len(rounds) > 1 else rounds)
        res.update({
            "fedavg_per_device_round_s": per_device,
            "fedavg_per_device_rounds_s": rounds,
            "flower_over_fedavg_per_device": _median(flower) / per_device,
            "fedavg_per_device_node_wait_s": log2.get("per_device_node_wait_s"),
            "fedavg_per_device_peak_rss_mb": monitor2.peak_rss / 2**20,
            "fedavg_per_device_peak_pss_mb": monitor2.peak_pss / 2**20,
            "fedavg_per_device_total_s": total2,
        })
    return res


def _fmt(q: list[float]) -> str:
    return f"{q[0]:.3f}-{q[1]:.3f}" if q else "-"


def main(argv: list[str] | None = None) -> None:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--records", type=int, default=20, help="records-per-device (80 %% for training)")
    parser.add_argument("--supernodes", type=int, default=0,
                        help="virtual SuperNodes (default: one per core)")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per block")
    parser.add_argument("--repeats", type=int, default=2, help="flower/centralised/fedavg block triples")
    parser.add_argument("--warmup", type=int, default=1, help="first rounds of each block left out")
    parser.add_argument("--per-device-fedavg-rounds", type=int, default=None,
                        help="rounds of FedAvg on one echo SuperNode per device (default 3 up to 1000 "
                             "devices, else 0: skipped)")
    parser.add_argument("--per-device-timeout", type=float, default=600.0)
    parser.add_argument("--node-wait", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.supernodes = args.supernodes or min(args.devices, cores)
    if args.per_device_fedavg_rounds is None:
        args.per_device_fedavg_rounds = 3 if args.devices <= 1000 else 0
    if not 0 <= args.warmup < args.rounds:
        parser.error("--warmup must be in [0, --rounds)")
    load_start = os.getloadavg()[0]
    res = run_scale(args)
    res["env"] = {
        "devices": args.devices, "records_per_device": args.records, "supernodes": args.supernodes,
        "rounds_per_block": args.rounds, "repeats": args.repeats, "warmup": args.warmup, "cpu_count": cores,
        "load_avg_1m_start": load_start, "load_avg_1m_end": os.getloadavg()[0],
        "python": platform.python_version(), "torch": torch.__version__,
        "threads": threading.active_count(),
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    e = res["env"]
    print(f"{args.devices} devices x {args.records} records, every device every round, "
          f"{args.supernodes} virtual SuperNodes, {args.repeats} x {args.rounds} rounds per engine (first "
          f"{args.warmup} of each block left out); load {e['load_avg_1m_start']:.1f} -> "
          f"{e['load_avg_1m_end']:.1f} on {cores} cores")
    print(f"  Flower (fedfdp)       {res['flower_round_s']:.3f} s/round "
          f"(IQR {_fmt(res['flower_round_quartiles_s'])})")
    print(f"  centralised engine    {res['centralised_round_s']:.3f} s/round "
          f"(IQR {_fmt(res['centralised_round_quartiles_s'])})")
    print(f"  FedAvg, same nodes    {res['fedavg_same_nodes_round_s']:.3f} s/round "
          f"(IQR {_fmt(res['fedavg_same_nodes_round_quartiles_s'])})")
    print(f"  Flower / centralised = {res['flower_over_centralised']:.2f}; "
          f"Flower / FedAvg on the same nodes = {res['flower_over_fedavg_same_nodes']:.2f}")
    if "fedavg_per_device_round_s" in res:
        print(f"  FedAvg, one echo SuperNode per device: {res['fedavg_per_device_round_s']:.2f} s/round "
              f"(rounds {', '.join(f'{r:.1f}' for r in res['fedavg_per_device_rounds_s'])}); "
              f"Flower (fedfdp) / that = {res['flower_over_fedavg_per_device']:.3f}; "
              f"peak RSS {res['fedavg_per_device_peak_rss_mb']:.0f} MB")
    print(f"  peak memory of the process tree: RSS {res['peak_rss_mb']:.0f} MB, "
          f"PSS {res['peak_pss_mb']:.0f} MB ({res['peak_processes']} processes); "
          f"registration {res['registration_s']:.1f} s; "
          f"total {res['total_s']:.0f} s")


if __name__ == "__main__":
    main()
