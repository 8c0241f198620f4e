"""Seconds per round of the FDP simulation with a large fleet, relative to Flower's FedAvg.

One run of Flower's simulation engine (``flwr.simulation.run_simulation``, Ray
backend, the project's backend settings: one CPU per client) with
``--devices`` virtual SuperNodes (one device each, as ``fedfdp run`` does)
serves both workloads, in alternating blocks of ``--rounds`` rounds
(FDP, FedAvg, FDP, FedAvg, ... ``--repeats`` times), so that both see the same
Ray workers and the same phases of a shared machine:

``fdp``
    :class:`strategies.fdp_strategy.FDPStrategy` with the project's defaults
    (logistic model on the synthetic fleet, ``eval-every = 1``,
    ``checkpoint-every = 1``, an output directory) and
    ``clients-per-round = --per-round``; the real ClientApp
    (:func:`clients.client_app.make_client_app`) computes each device's
    clipped private and public sums.
``fedavg``
    ``flwr.serverapp.strategy.FedAvg`` (``fraction-train = per-round/devices``,
    no federated evaluation) with the same model; its ClientApp returns the
    arrays it received as its update.

Before the first block the ServerApp waits until all SuperNodes have
registered (nodes register lazily; FedAvg would otherwise sample from the few
registered first). The first FDP block also runs FDPStrategy's registration
(it queries every node for its device sizes) in batches of ``--query-batch``
nodes (``FDPStrategy.register_nodes(grid, batch=...)``, default 100; one
batch of 1000 timed out here); later FDP blocks reuse that registry. A round
is timed from one ``configure_train`` to the next
(the last one to the end of the block), so it includes everything the
strategy does per round (FDP: budget check, ledger write, noise, accounting,
server-side evaluation, checkpoint, metrics file). The first ``--warmup``
rounds of every block are reported but left out of the per-round medians.
``round_ratio_vs_fedavg`` is the median FDP round over the median FedAvg
round. Times are wall-clock (Flower's polling and Ray's messaging are what a
round costs), so a loaded machine makes them noisy: compare within one run.

Memory: the peak, over the run, of the summed RSS of this process and all its
descendants (Ray's GCS, raylet and workers), sampled every 0.25 s
(``psutil`` if installed, ``/proc`` otherwise); RSS counts shared pages once
per process, so the sum is an upper bound (the summed PSS is reported too).

``--overhead`` (default on) also times, without Flower, the FDP strategy's own
per-round work against the number of registered devices (20, 1000, 10000).

    python benchmarks/fleet.py              # table
    python benchmarks/fleet.py --json       # {"round_ratio_vs_fedavg": ..., "peak_rss_mb": ...}
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
from typing import Any

import torch

from benchmarks.timing import quartiles

PAGE = os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------- #
# memory of the process tree
# --------------------------------------------------------------------------- #


def _children_proc(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = [root], [root]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        tree += frontier
    return tree


def _proc_memory(pid: int, with_pss: bool) -> tuple[int, int]:
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE
        if with_pss:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss = int(line.split()[1]) * 1024
                        break
    except (OSError, ValueError, IndexError):
        pass
    return rss, pss


def tree_memory(root: int, with_pss: bool = True) -> tuple[int, int, int]:
    """(summed RSS, summed PSS, processes) of ``root`` and its descendants, bytes."""
    try:
        import psutil

        proc = psutil.Process(root)
        pids = [root] + [c.pid for c in proc.children(recursive=True)]
    except ImportError:
        pids = _children_proc(root)
    except Exception:  # the process tree changed while walking it
        pids = [root]
    rss = pss = 0
    for pid in pids:
        r, p = _proc_memory(pid, with_pss)
        rss += r
        pss += p
    return rss, pss, len(pids)


class MemoryMonitor(threading.Thread):
    """Peak summed RSS/PSS of the process tree, sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_rss = self.peak_pss = self.peak_procs = 0
        self._halt = threading.Event()
        self._tick = 0

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def sample(self) -> None:
        self._tick += 1
        rss, pss, procs = tree_memory(os.getpid(), with_pss=self._tick % 4 == 1)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, procs)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()


# --------------------------------------------------------------------------- #
# the simulation: FDP and FedAvg blocks on one engine
# --------------------------------------------------------------------------- #


def _fleet_config(args: argparse.Namespace, out_dir: str) -> Any:
    from fedfdp.config import load_config

    return load_config(
        {
            "num-devices": args.devices,
            "records-per-device": args.records,
            "clients-per-round": args.per_round,
            "num-rounds": args.rounds,
            "progress": False,
            "out-dir": out_dir,
            "seed": args.seed,
            "node-wait-timeout": args.node_wait,
        }
    )


def make_client_app(cfg: Any) -> Any:
    """FDP messages go to the project's ClientApp; others are echoed (FedAvg)."""
    from benchmarks.echo import fdp_or_echo
    from clients.client_app import make_client_app as fdp_client_app

    return fdp_or_echo(fdp_client_app(cfg.to_flat()))


def make_server_app(args: argparse.Namespace, log: dict[str, Any]) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    from fedfdp.data import load_dataset
    from fedfdp.models import build_model_for
    from fedfdp.run_plan import build_plan
    from strategies.fdp_strategy import FDPStrategy

    class TimedFDP(FDPStrategy):
        marks: list[float]

        def register_nodes(self, grid: Grid, batch: int = args.query_batch) -> None:
            if self.registry:  # reused from the first FDP block
                return
            t = time.perf_counter()
            super().register_nodes(grid, batch=batch)
            log["fdp_registration_s"] += time.perf_counter() - t

        def configure_train(
            self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
        ) -> Iterable[Message]:
            self.marks.append(time.perf_counter())
            return super().configure_train(server_round, arrays, config, grid)

    class TimedFedAvg(FedAvg):
        marks: list[float]

        def configure_train(
            self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
        ) -> Iterable[Message]:
            self.marks.append(time.perf_counter())
            return super().configure_train(server_round, arrays, config, grid)

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        t0 = time.perf_counter()
        deadline = t0 + args.node_wait
        while len(list(grid.get_node_ids())) < args.devices:
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    f"only {len(list(grid.get_node_ids()))} of {args.devices} nodes registered"
                )
            time.sleep(0.05)
        log["node_wait_s"] = time.perf_counter() - t0
        registry = None
        for repeat in range(args.repeats):
            for kind in ("fdp", "fedavg"):
                start = time.perf_counter()
                if kind == "fdp":
                    cfg = _fleet_config(args, tempfile.mkdtemp(prefix="fleet-bench-"))
                    plan = build_plan(cfg, load_dataset(cfg.data))
                    strat = TimedFDP(plan)
                    strat.marks = []
                    if registry is not None:
                        strat.registry = dict(registry)
                    strat.start(grid, ArrayRecord(plan.model.state_dict()))
                    registry = strat.registry
                    log["fdp_rows"] = len(strat.rows)
                else:
                    cfg = _fleet_config(args, "")
                    model = build_model_for(cfg.training, load_dataset(cfg.data))
                    fed = TimedFedAvg(
                        fraction_train=args.per_round / args.devices,
                        fraction_evaluate=0.0,
                        min_train_nodes=args.per_round,
                        min_evaluate_nodes=0,
                        min_available_nodes=args.devices,
                    )
                    fed.marks = []
                    fed.start(grid, ArrayRecord(model.state_dict()), num_rounds=args.rounds)
                    strat = fed  # type: ignore[assignment]
                end = time.perf_counter()
                marks = strat.marks
                rounds = [b - a for a, b in zip(marks, [*marks[1:], end], strict=True)]
                log["blocks"].append(
                    {
                        "kind": kind,
                        "repeat": repeat,
                        "before_first_round_s": marks[0] - start if marks else None,
                        "rounds_s": rounds,
                    }
                )

    return app


def run_fleet(args: argparse.Namespace) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    from simulations.flower_processes import quiet_flower

    quiet_flower(False)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    log: dict[str, Any] = {"blocks": [], "fdp_registration_s": 0.0}
    cfg = _fleet_config(args, "")
    backend: dict[str, Any] = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"logging_level": "ERROR", "log_to_driver": False},
    }
    monitor = MemoryMonitor()
    monitor.start()
    t0 = time.perf_counter()
    run_simulation(
        server_app=make_server_app(args, log),
        client_app=make_client_app(cfg),
        num_supernodes=args.devices,
        backend_config=backend,
        verbose_logging=False,
    )
    total = time.perf_counter() - t0
    monitor.stop()
    if len(log["blocks"]) != 2 * args.repeats:
        raise RuntimeError(
            f"the simulation finished {len(log['blocks'])} of {2 * args.repeats} blocks: {log}"
        )

    def steady(kind: str) -> list[float]:
        return [r for b in log["blocks"] if b["kind"] == kind for r in b["rounds_s"][args.warmup :]]

    def first(kind: str) -> list[float]:
        return [r for b in log["blocks"] if b["kind"] == kind for r in b["rounds_s"][: args.warmup]]

    fdp, fedavg = steady("fdp"), steady("fedavg")
    fdp_med, fedavg_med = statistics.median(fdp), statistics.median(fedavg)
    return {
        "round_ratio_vs_fedavg": fdp_med / fedavg_med,
        "peak_rss_mb": monitor.peak_rss / 2**20,
        "peak_pss_mb": monitor.peak_pss / 2**20,
        "peak_processes": monitor.peak_procs,
        "fdp_round_s": fdp_med,
        "fedavg_round_s": fedavg_med,
        "fdp_round_quartiles_s": quartiles(fdp),
        "fedavg_round_quartiles_s": quartiles(fedavg),
        "fdp_first_rounds_s": first("fdp"),
        "fedavg_first_rounds_s": first("fedavg"),
        "node_wait_s": log["node_wait_s"],
        "fdp_registration_s": log["fdp_registration_s"],
        "fdp_setup_before_round_1_s": [
            b["before_first_round_s"] for b in log["blocks"] if b["kind"] == "fdp"
        ],
        "total_s": total,
        "blocks": log["blocks"],
    }


# --------------------------------------------------------------------------- #
# the FDP strategy's own per-round work, against the number of devices
# --------------------------------------------------------------------------- #


#: ``configure`` includes the budget check and the write-ahead charge of the ledger.
STEPS = ("configure", "aggregate", "evaluate", "checkpoint", "metrics")


def strategy_overhead(
    device_counts: list[int], records: int, per_round: int, rounds: int
) -> list[dict[str, Any]]:
    """Time FDPStrategy's per-round steps in-process (no Flower runtime) with
    ``d`` registered devices; client replies are computed outside the timers."""
    torch.set_num_threads(1)
    return [_overhead_for(d, records, per_round, rounds) for d in device_counts]


def _overhead_for(devices: int, records: int, per_round: int, rounds: int) -> dict[str, Any]:
    from flwr.app import ArrayRecord, ConfigRecord

    from clients.client_app import reply_message
    from clients.node_runtime import NodeRecords
    from fedfdp import protocol as P
    from fedfdp.config import load_config
    from fedfdp.data import load_dataset
    from fedfdp.evaluation import evaluate
    from fedfdp.outputs import write_metrics
    from fedfdp.run_loop import RunLoop
    from fedfdp.run_plan import build_plan
    from simulations.auditing.inprocess import node_train, set_identity
    from strategies.fdp_strategy import FDPStrategy

    cfg = load_config(
        {
            "num-devices": devices,
            "records-per-device": records,
            "clients-per-round": per_round,
            "num-rounds": 150,
            "progress": False,
            "out-dir": tempfile.mkdtemp(prefix="fleet-overhead-"),
        }
    )
    t = time.perf_counter()
    set_identity()
    data = load_dataset(cfg.data)
    plan = build_plan(cfg, data, num_devices=len(data.devices))
    strat = FDPStrategy(plan)
    strat.registry = {d: ([d], [len(dev)]) for d, dev in enumerate(data.devices)}  # node id = device id
    strat.resolve()
    loop = RunLoop(plan, strat.engine)
    setup = time.perf_counter() - t

    def client_reply(msg: Any) -> Any:
        """The real client computation for one train message (node = device)."""
        node = msg.metadata.dst_node_id
        records = NodeRecords.partition_of(data, node, len(data.devices))
        state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
        return reply_message(msg, *node_train(cfg, records, state, msg.content.config_records[P.CONFIG]))
    steps: dict[str, list[float]] = {k: [] for k in STEPS}

    def timed(key: str, fn: Any, *a: Any) -> Any:
        t = time.thread_time()
        res = fn(*a)
        steps[key].append(time.thread_time() - t)
        return res

    def checkpoint(r: int) -> None:
        """What the run loop writes after a round (a checkpoint every round here)."""
        if plan.files is not None:
            plan.files.checkpoint(loop.checkpoint(r))

    def configure(r: int, arrays: ArrayRecord) -> list[Any]:
        return list(strat.configure_train(r, arrays, ConfigRecord(), None))  # type: ignore[arg-type]

    rows: list[dict[str, Any]] = []
    for r in range(1, rounds + 1):
        msgs = timed("configure", configure, r, ArrayRecord(strat.model.state_dict()))
        replies = [client_reply(m) for m in msgs]
        outcome = timed("aggregate", strat.collect, r, replies)
        acc, loss = timed("evaluate", evaluate, strat.model, data.test_x, data.test_y)
        timed("checkpoint", checkpoint, r)
        rows.append({"round": r, "phase": "fdp", "epsilon": outcome.epsilon, "accuracy": acc, "loss": loss})
        timed("metrics", write_metrics, cfg.run.out_dir, rows)
    med = {k: 1e3 * statistics.median(v[1:]) for k, v in steps.items()}
    return {"devices": devices, "setup_s": setup, "ms": med, "total_ms": sum(med.values())}


# --------------------------------------------------------------------------- #


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=10, help="clients-per-round")
    parser.add_argument("--records", type=int, default=20, help="records-per-device")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per block")
    parser.add_argument("--repeats", type=int, default=2, help="FDP/FedAvg block pairs")
    parser.add_argument("--warmup", type=int, default=1, help="first rounds of each block left out")
    parser.add_argument("--node-wait", type=float, default=600.0, help="seconds to wait for all nodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--query-batch", type=int, default=100, help="nodes per registration query batch")
    parser.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.rounds:
        parser.error("--warmup must be in [0, --rounds)")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    res = run_fleet(args)
    if args.overhead:
        res["strategy_overhead"] = strategy_overhead([20, 1000, 10000], args.records, args.per_round, 8)
    res["env"] = {
        "devices": args.devices,
        "clients_per_round": args.per_round,
        "records_per_device": args.records,
        "rounds_per_block": args.rounds,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "cpu_count": os.cpu_count(),
        "load_avg_1m_end": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "memory_source": "psutil" if _has_psutil() else "/proc",
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(
        f"{args.devices} devices, {args.per_round} per round, {args.records} records/device, "
        f"{args.repeats}x({args.rounds} FDP + {args.rounds} FedAvg rounds), "
        f"first {args.warmup} of each block left out; "
        f"load {res['env']['load_avg_1m_end']:.1f} on {os.cpu_count()} cores"
    )
    q1, q2 = res["fdp_round_quartiles_s"], res["fedavg_round_quartiles_s"]
    print(f"  FDP round     {res['fdp_round_s']:.3f} s (IQR {q1[0]:.3f}-{q1[1]:.3f})")
    print(f"  FedAvg round  {res['fedavg_round_s']:.3f} s (IQR {q2[0]:.3f}-{q2[1]:.3f})")
    print(f"  round_ratio_vs_fedavg = {res['round_ratio_vs_fedavg']:.2f} (target <= 1.5)")
    print(
        f"  left out: first rounds FDP {_fmt(res['fdp_first_rounds_s'])} s, "
        f"FedAvg {_fmt(res['fedavg_first_rounds_s'])} s"
    )
    print(
        f"  node registration (all {args.devices} nodes known to the SuperLink) {res['node_wait_s']:.1f} s; "
        f"FDP device-size queries {res['fdp_registration_s']:.1f} s; "
        f"FDP setup before round 1 {_fmt(res['fdp_setup_before_round_1_s'])} s"
    )
    print(
        f"  peak memory of the process tree: RSS {res['peak_rss_mb']:.0f} MB, "
        f"PSS {res['peak_pss_mb']:.0f} MB ({res['peak_processes']} processes; "
        f"target 24 GiB = 24576 MB); total {res['total_s']:.0f} s"
    )
    if "strategy_overhead" in res:
        print("\nFDPStrategy per-round work without Flower (ms CPU, median):")
        keys = list(res["strategy_overhead"][0]["ms"])
        print(f"  {'devices':>8}" + "".join(f"{k:>13}" for k in keys) + f"{'total':>9}")
        for row in res["strategy_overhead"]:
            print(
                f"  {row['devices']:>8}"
                + "".join(f"{row['ms'][k]:>13.2f}" for k in keys)
                + f"{row['total_ms']:>9.1f}"
            )


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _has_psutil() -> bool:
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
