"""The cost of secure aggregation (fedfdp.secagg): round ratios, bytes, crypto.

Default (``python benchmarks/secagg.py [--json]``): the figures of the secagg section of
``docs/performance.md``, measured in one run. Every round is driven in process by the
real strategy and the real ClientApp (``tests/test_secagg_flower.py``'s ``ClientAppGrid``:
one ``Context`` per node, as a SuperNode keeps it), every message and reply sent
through Flower's protobuf form and back; a round's cost is the CPU time of the whole
process (``time.process_time``: the server, every node, the serialisation), for each
round after the first of a run::

    secagg_round_ratio_100     secagg ÷ plain CPU per round, 100 parties (100 devices of
                               40 records), the default model (logistic, d = 295), k = 15
    secagg_round_ratio_1e6     the same at 10 parties with an MLP of d = 964,405
                               (hidden-sizes = [1000, 900])
    secagg_overhead_vs_flower  fedfdp's (secagg − plain) per round ÷ Flower 1.42's
                               (SecAggPlusWorkflow − plain FedAvg) for legacy clients that
                               return the same d, 10 parties, the same k and t
    bytes_per_coordinate       a collect reply's serialised size ÷ d (masked uint32
                               vector + public float32 sum + the secagg record)
    server_unmask_cpu_s_100    the server's receive_unmask, 100 parties, k = 15, d = 295

Plain runs use a fixed C (``clipping-quantile = 0``), as secure aggregation does. Each
ratio is ``--repeats`` interleaved repetitions (plain and secagg runs alternate, which
comes first alternating too), ``--timed-rounds`` timed rounds per run; the median ratio
is reported with every repetition's. ``meta`` gives the machine and the load average.

``--crypto``: the crypto cost of one round of the sessions alone. For each configuration
(n parties, k neighbours, dimension d, with no dropout or with one node dropping at
collect, which makes the server reconstruct its mask key and remove its k − 1 pairwise
masks), one round is driven through :class:`~fedfdp.secagg.ServerSession` and n
:class:`~fedfdp.secagg.ClientSession`; every call is timed with ``perf_counter`` (wall
time on a shared machine: take the median of ``--repeats``)::

    server_s         all server calls of the round (setup_requests .. receive_unmask)
    client_mean_s    one client's five calls (key generation and its signature, checking
                     the neighbours' signed keys, sharing, encryption, decryption,
                     masking, the signed consistency check, unmasking), mean over clients
    client_max_s     the slowest client
    upload_B         bytes one client sends (public keys, ciphertexts, the uint32
                     vector, its unmask shares): the private part is 4·d + small
    server_unmask_cpu_s  the CPU time of receive_unmask

The inputs are random uint32 vectors (the encoding is not part of the crypto cost).
Run::

    python benchmarks/secagg.py --json                  # the ratios
    python benchmarks/secagg.py --crypto [--json]       # the crypto table

``--simulation``: the per-round overhead of ``aggregation = "secagg"`` over plain
aggregation in ``fedfdp run`` on Flower's simulation engine (``--parties`` SuperNodes,
default 10, on the default fleet): each aggregation is run for ``--rounds`` rounds and
for 1 + ``--rounds`` rounds; the difference of the two wall times is ``--rounds``
rounds without the start-up (SuperLink, Ray, data), so the overhead per round is
``(Δ_secagg − Δ_plain) / rounds``. ``--devices`` / ``--records-per-device`` set the fleet
(100 parties need at least 100 devices: ``--parties 100 --devices 100 --records-per-device
40``, ``k = 15`` neighbours by default).

``--accuracy``: held-out accuracy of ``fdp`` at ε = 2 (the default target) with a
trusted server (adaptive clipping, the default recipe; and a fixed C) and with secure
aggregation (fixed C; ``secagg-min-survivors`` = all parties, and 80 %), over
``--seeds`` seeds, on the default fleet with ``--parties`` nodes, run by the real
strategy and the real ClientApp in process (``tests/flower_helpers.py``: the same code
as a simulation, without Ray).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

#: The repository root: the in-process grids live in its tests package, and every package
#: (fedfdp, clients, strategies) is imported from this tree, never half from an installed copy.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: an unrelated installed "tests" package may shadow ours

from fedfdp.secagg import ClientSession, NodeTrust, Roster, ServerSession, SigningKey  # noqa: E402

#: The run of the benchmark's sessions, and the digest of the model every node "received".
RUN = 1
DIGEST = bytes(range(32))
_IDENTITIES: dict[int, SigningKey] = {}

CONFIGS = [(10, 7), (10, 9), (100, 15)]
DIMS = [10_000, 100_000]


def _upload(*msgs: Any) -> int:
    total = 0
    for m in msgs:
        for v in vars(m).values():
            if isinstance(v, bytes):
                total += len(v)
            elif isinstance(v, np.ndarray):
                total += v.nbytes
            elif isinstance(v, tuple):
                total += sum(len(x) if isinstance(x, bytes) else 8 for x in v)
            else:
                total += 8
    return total


def one_round(n: int, k: int, d: int, drop_at_collect: bool, rng: np.random.Generator) -> dict[str, float]:
    ids = [int(x) for x in rng.choice(2**31, n, replace=False)]
    xs = {u: rng.integers(0, 2**32, d, dtype=np.uint64).astype(np.uint32) for u in ids}
    # long-term identities: made once per party, not per round (kept between calls)
    keys_of = {u: _IDENTITIES.setdefault(u, SigningKey.generate()) for u in ids}
    roster = Roster({f"node-{u}": key.public for u, key in keys_of.items()})
    clients = {u: ClientSession(u, NodeTrust(keys_of[u], roster, 3), run=RUN) for u in ids}
    ctime: dict[int, float] = defaultdict(float)
    up: dict[int, int] = defaultdict(int)
    stime = 0.0

    def srv(fn: Any, *a: Any) -> Any:
        nonlocal stime
        t0 = time.perf_counter()
        out = fn(*a)
        stime += time.perf_counter() - t0
        return out

    def cli(u: int, fn: Any, *a: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*a)
        ctime[u] += time.perf_counter() - t0
        up[u] += _upload(out)
        return out

    t0 = time.perf_counter()
    server = ServerSession(1, ids, d, neighbours=k)
    stime += time.perf_counter() - t0
    reqs = srv(server.setup_requests)
    keys = srv(server.receive_setup, [cli(u, clients[u].setup, r) for u, r in reqs.items()])
    coll = srv(server.receive_keys, [cli(u, clients[u].share_keys, r) for u, r in keys.items()])
    gone = ids[0] if drop_at_collect else None
    conf = srv(
        server.receive_collect,
        [cli(u, clients[u].collect, r, xs[u], DIGEST) for u, r in coll.items() if u != gone],
    )
    unm = srv(server.receive_confirm, [cli(u, clients[u].confirm, r) for u, r in conf.items()], DIGEST)
    answers = [cli(u, clients[u].unmask, r) for u, r in unm.items()]
    c0 = time.process_time()
    result = srv(server.receive_unmask, answers)
    unmask_cpu = time.process_time() - c0
    expected = np.zeros(d, dtype=np.uint64)
    for u in result.u3:
        expected += xs[u].astype(np.uint64)
    if not np.array_equal(result.total.astype(np.uint64), expected % np.uint64(2**32)):
        raise RuntimeError(f"n={n} k={k} d={d}: wrong sum")
    live = [u for u in ids if u != gone]
    return {
        "server_s": stime,
        "client_mean_s": statistics.fmean(ctime[u] for u in live),
        "client_max_s": max(ctime[u] for u in live),
        "upload_B": statistics.fmean(up[u] for u in live),
        "server_unmask_cpu_s": unmask_cpu,
    }


# ------------------------------------------------------------------- round ratios


#: The two workloads of the ratios: (parties, configuration keys shared by both runs).
WORKLOADS: dict[str, tuple[int, dict[str, Any]]] = {
    # the default model (logistic regression on the fleet, d = 295) at 100 parties
    "100": (100, {"num-devices": 100, "records-per-device": 40}),
    # a ~1e6-parameter MLP (58 -> 1000 -> 900 -> 5: d = 964,405) at 10 parties
    "1e6": (10, {"model": "mlp", "hidden-sizes": [1000, 900]}),
}


def _wire_copy(msg: Any) -> Any:
    """``msg`` with its content sent through Flower's protobuf form and back (what a
    SuperLink does to every message), and the content's serialised size."""
    from clients.flower_adapter import wire_round_trip

    if msg.has_error():
        return msg, 0
    msg.content, size = wire_round_trip(msg.content)
    return msg, size


def round_cpu(parties: int, settings: dict[str, Any], rounds: int) -> dict[str, Any]:
    """One run in process (the real strategy, the real ClientApp on an in-process grid,
    every message and reply through protobuf): the CPU seconds of the whole process in
    each round after the first (``time.process_time``: the server, every node and the
    serialisation), and the serialised bytes of each collect-stage reply."""
    from flwr.app import ArrayRecord

    import fedfdp.run_loop as run_loop
    from fedfdp.config import load_config
    from fedfdp.data import load_dataset
    from fedfdp.run_plan import build_plan
    from strategies.fdp_strategy import FDPStrategy
    from tests.test_secagg_flower import ClientAppGrid

    reply_bytes: dict[str, list[int]] = defaultdict(list)

    class WireGrid(ClientAppGrid):
        def answer(self, msg: Any) -> Any:
            msg, _ = _wire_copy(msg)
            reply, size = _wire_copy(super().answer(msg))
            reply_bytes[msg.metadata.message_type].append(size)
            return reply

    cfg = load_config({"progress": False, "seed": 0, "eval-every": 10**6, "num-rounds": 1 + rounds,
                       **settings})
    data = load_dataset(cfg.data)
    strat = FDPStrategy(build_plan(cfg, data, num_devices=len(data.devices)))
    times: list[float] = []
    original = run_loop.RunLoop.run

    def timed(self: Any, step: Any, **kw: Any) -> Any:
        def each(r: int) -> Any:
            start = time.process_time()
            try:
                return step(r)
            finally:
                times.append(time.process_time() - start)
        return original(self, each, **kw)

    run_loop.RunLoop.run = timed  # type: ignore[method-assign]  # the benchmark's own timer
    try:
        strat.start(WireGrid(cfg, partitions=parties), ArrayRecord(strat.model.state_dict()))
    finally:
        run_loop.RunLoop.run = original  # type: ignore[method-assign]
    mechanism = strat.mechanism
    dim = sum(int(p.numel()) for p in strat.model.parameters() if p.requires_grad)
    if len(times) != 1 + rounds or mechanism is None:
        raise RuntimeError(f"{settings}: {len(times)} rounds ran, not {1 + rounds}")
    return {"round_cpu_s": times[1:], "dimension": dim, "reply_bytes": dict(reply_bytes)}


def round_ratio(name: str, reps: int, rounds: int) -> dict[str, Any]:
    """secagg ÷ plain CPU per round for workload ``name``, the two interleaved: ``reps``
    pairs of runs (plain first in even pairs, secagg first in odd ones), ``rounds`` timed
    rounds each; one ratio per pair (median round ÷ median round)."""
    parties, shared = WORKLOADS[name]
    kinds = {
        "plain": {**shared, "clipping-quantile": 0},  # a fixed C, as under secagg
        "secagg": {**shared, "aggregation": "secagg", "secagg-min-survivors": parties},
    }
    ratios: list[float] = []
    per_kind: dict[str, list[float]] = defaultdict(list)
    collect: list[int] = []
    dim = 0
    for rep in range(reps):
        order = ("plain", "secagg") if rep % 2 == 0 else ("secagg", "plain")
        med = {}
        for kind in order:
            out = round_cpu(parties, kinds[kind], rounds)
            med[kind] = statistics.median(out["round_cpu_s"])
            per_kind[kind] += out["round_cpu_s"]
            dim = out["dimension"]
            if kind == "secagg":
                collect += out["reply_bytes"].get("train.sa_collect", [])
        ratios.append(med["secagg"] / med["plain"])
    return {
        "ratio": statistics.median(ratios), "ratios": ratios, "min": min(ratios), "max": max(ratios),
        "n": reps, "rounds_per_run": rounds, "parties": parties, "dimension": dim,
        "plain_round_cpu_s": statistics.median(per_kind["plain"]),
        "secagg_round_cpu_s": statistics.median(per_kind["secagg"]),
        "collect_reply_bytes": statistics.median(collect) if collect else None,
    }


def flower_round_cpu(parties: int, dim: int, secagg: bool, rounds: int) -> list[float]:
    """Flower 1.42's own secure aggregation for comparison: ``DefaultWorkflow`` with
    ``SecAggPlusWorkflow`` (or without it: plain FedAvg) over ``parties`` legacy
    ``NumPyClient`` s that return a ``dim``-vector (with ``secaggplus_mod``), on the same
    in-process grid with protobuf round trips; ``k`` and ``t`` as fedfdp's defaults for
    ``parties``. CPU seconds of the whole process per round after the first (from one
    ``configure_fit`` to the next)."""
    from flwr.app import Context, RecordDict

    from clients.flower_adapter import legacy_secaggplus

    flower = legacy_secaggplus()
    ClientApp, secaggplus_mod = flower.ClientApp, flower.secaggplus_mod
    NumPyClient: Any = flower.NumPyClient  # a base class from Flower's legacy API
    ndarrays_to_parameters = flower.ndarrays_to_parameters
    LegacyContext, ServerConfig = flower.LegacyContext, flower.ServerConfig
    DefaultWorkflow, SecAggPlusWorkflow, Run = flower.DefaultWorkflow, flower.SecAggPlusWorkflow, flower.Run
    FedAvg: Any = flower.FedAvg  # a base class from Flower's legacy API

    from fedfdp.config import load_config
    from fedfdp.secagg import default_neighbours, default_threshold
    from tests.flower_helpers import InProcessGrid

    class Client(NumPyClient):
        def fit(self, parameters: Any, config: Any) -> Any:
            return [p + np.float32(0.01) for p in parameters], 1, {}

    app = ClientApp(client_fn=lambda context: Client().to_client(), mods=[secaggplus_mod] if secagg else [])

    class FlowerGrid(InProcessGrid):
        def __init__(self) -> None:
            super().__init__(load_config({"progress": False}))
            self.contexts: dict[int, Context] = {}

        def get_node_ids(self) -> list[int]:
            return list(range(1, parties + 1))

        def answer(self, msg: Any) -> Any:
            node = msg.metadata.dst_node_id
            ctx = self.contexts.setdefault(node, Context(run_id=1, node_id=node, node_config={},
                                                         state=RecordDict(), run_config={}))
            msg, _ = _wire_copy(msg)  # Flower's workflow shares one content between messages
            return _wire_copy(app(msg, ctx))[0]

    stamps: list[float] = []

    class Timed(FedAvg):
        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            stamps.append(time.process_time())
            return super().configure_fit(server_round, parameters, client_manager)

    strategy = Timed(fraction_fit=1.0, min_fit_clients=parties, min_available_clients=parties,
                     fraction_evaluate=0.0,
                     initial_parameters=ndarrays_to_parameters([np.zeros(dim, dtype=np.float32)]))
    k = default_neighbours(parties)
    context = LegacyContext(context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                            run_config={}),
                            config=ServerConfig(num_rounds=1 + rounds), strategy=strategy)
    fit = SecAggPlusWorkflow(num_shares=k, reconstruction_threshold=default_threshold(k)) if secagg else None
    grid = FlowerGrid()
    grid.set_run(Run.create_empty(run_id=1))
    DefaultWorkflow(fit_workflow=fit)(grid, context)
    stamps.append(time.process_time())
    return [b - a for a, b in itertools.pairwise(stamps[1:])]


def overhead_vs_flower(parties: int, reps: int, rounds: int) -> dict[str, Any]:
    """fedfdp's secagg overhead per round (secagg − plain CPU, default model, ``d = 295``)
    ÷ Flower's SecAggPlusWorkflow overhead (secagg − plain FedAvg) for the same ``d``,
    parties, ``k`` and ``t``; the four runs interleaved in each of ``reps`` repetitions."""
    ratios, own, theirs = [], [], []
    settings: dict[str, dict[str, Any]] = {"plain": {"clipping-quantile": 0},
                "secagg": {"aggregation": "secagg", "secagg-min-survivors": parties}}
    for _ in range(reps):
        med: dict[str, float] = {}
        for kind, cfg in settings.items():
            out = round_cpu(parties, cfg, rounds)
            med[f"fedfdp-{kind}"] = statistics.median(out["round_cpu_s"])
            dim = out["dimension"]
            flower = flower_round_cpu(parties, dim, kind == "secagg", rounds)
            med[f"flower-{kind}"] = statistics.median(flower)
        own.append(med["fedfdp-secagg"] - med["fedfdp-plain"])
        theirs.append(med["flower-secagg"] - med["flower-plain"])
        ratios.append(own[-1] / theirs[-1])
    return {"ratio": statistics.median(ratios), "ratios": ratios, "min": min(ratios), "max": max(ratios),
            "n": reps, "rounds_per_run": rounds, "parties": parties, "dimension": dim,
            "fedfdp_overhead_cpu_s": statistics.median(own),
            "flower_overhead_cpu_s": statistics.median(theirs)}


def _fedfdp_run(out: str, sets: list[str], parties: int) -> float:
    """Wall seconds of one ``fedfdp run`` on the simulation engine."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "simulations.cli", "run", "--out", out, "--supernodes", str(parties)]
    for item in ["progress=false", *sets]:
        cmd += ["--set", item]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"fedfdp run failed: {proc.stderr[-2000:]}")
    return elapsed


def simulation_overhead(parties: int, rounds: int, devices: int | None = None,
                        records_per_device: int | None = None) -> dict[str, Any]:
    """Per-round wall time of plain and secagg rounds in ``fedfdp run`` (module docstring).

    ``devices`` / ``records_per_device``: ``num-devices`` / ``records-per-device`` (default:
    the fleet's, 20 devices; more parties than devices need more devices, e.g. 100 devices of
    40 records for 100 parties)."""
    import tempfile

    fleet = [f"num-devices={devices}"] if devices is not None else []
    fleet += [f"records-per-device={records_per_device}"] if records_per_device is not None else []
    secagg = ["aggregation=secagg", f"secagg-min-survivors={parties}"]
    out: dict[str, Any] = {"parties": parties, "rounds": rounds, "devices": devices,
                           "records_per_device": records_per_device}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("plain", ["clipping-quantile=0"]), ("secagg", secagg)):
            times = []
            for r in (1, 1 + rounds):
                times.append(_fedfdp_run(f"{tmp}/{name}-{r}", [f"num-rounds={r}", *fleet, *extra], parties))
            out[f"{name}_per_round_s"] = (times[1] - times[0]) / rounds
            out[f"{name}_wall_s"] = times
    out["overhead_per_round_s"] = out["secagg_per_round_s"] - out["plain_per_round_s"]
    return out


def accuracy(parties: int, seeds: int) -> list[dict[str, Any]]:
    """Final held-out accuracy and ε of fdp at ε = 2, trusted vs secure aggregation."""
    from flwr.app import ArrayRecord

    from fedfdp.config import load_config
    from fedfdp.data import load_dataset
    from fedfdp.run_plan import build_plan
    from strategies.fdp_strategy import FDPStrategy
    from tests.test_secagg_flower import ClientAppGrid

    variants: dict[str, dict[str, Any]] = {
        "trusted, adaptive C (default)": {},
        "trusted, fixed C": {"clipping-quantile": 0},
        "secagg, n_min = all": {"aggregation": "secagg", "secagg-min-survivors": parties},
        "secagg, n_min = 80 %": {"aggregation": "secagg",
                                 "secagg-min-survivors": max(3, round(0.8 * parties))},
    }
    rows = []
    for name, extra in variants.items():
        for seed in range(seeds):
            cfg = load_config({"progress": False, "seed": seed, "eval-every": 150, **extra})
            data = load_dataset(cfg.data)
            strat = FDPStrategy(build_plan(cfg, data, num_devices=len(data.devices)))
            grid = ClientAppGrid(cfg, partitions=parties)  # as fedfdp run --supernodes parties
            start = time.perf_counter()
            strat.start(grid, ArrayRecord(strat.model.state_dict()))
            last = strat.rows[-1]
            plan = strat.mechanism
            if plan is None:
                raise RuntimeError(f"{name}, seed {seed}: the strategy resolved no mechanism")
            rows.append({"variant": name, "seed": seed, "accuracy": last["accuracy"],
                         "epsilon": last["epsilon"], "rounds": last["round"],
                         "wall_s": time.perf_counter() - start, "sigma": plan.noise_multiplier})
    return rows


def ratios(reps: int, rounds: int, as_json: bool) -> None:
    """The four figures of the secagg section of docs/performance.md, in one run."""
    load_before = os.getloadavg()
    started = time.perf_counter()
    r100 = round_ratio("100", reps, rounds)
    r1e6 = round_ratio("1e6", reps, rounds)
    flower = overhead_vs_flower(10, reps, rounds)
    rng = np.random.default_rng(0)  # public inputs only
    unmask = [one_round(100, 15, 295, False, rng)["server_unmask_cpu_s"] for _ in range(reps)]
    per_coord = {str(r["dimension"]): r["collect_reply_bytes"] / r["dimension"] for r in (r100, r1e6)}
    report = {
        "secagg_round_ratio_100": r100,
        "secagg_round_ratio_1e6": r1e6,
        "secagg_overhead_vs_flower": flower,
        "bytes_per_coordinate": {"value": per_coord[str(r1e6["dimension"])], "by_dimension": per_coord,
                                 "what": "serialised collect-stage reply (protobuf) / d"},
        "server_unmask_cpu_s_100": {"median": statistics.median(unmask), "min": min(unmask),
                                    "max": max(unmask), "n": reps, "k": 15, "d": 295},
        "meta": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "load_average_before": load_before, "load_average_after": os.getloadavg(),
                 "wall_s": time.perf_counter() - started,
                 "command": f"python benchmarks/secagg.py --json --repeats {reps} --timed-rounds {rounds}"},
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for key in ("secagg_round_ratio_100", "secagg_round_ratio_1e6", "secagg_overhead_vs_flower"):
        r = report[key]
        print(f"{key}: {r['ratio']:.2f} (n = {r['n']}, {r['min']:.2f}-{r['max']:.2f})")
    print(f"bytes_per_coordinate: {report['bytes_per_coordinate']['by_dimension']}")
    print(f"server unmask at 100 parties: {report['server_unmask_cpu_s_100']['median']:.3f} CPU-s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved repetitions of each ratio (--crypto: rounds per configuration)")
    parser.add_argument("--timed-rounds", type=int, default=3,
                        help="rounds timed per run of a ratio (after one untimed round)")
    parser.add_argument("--crypto", action="store_true", help="the crypto cost table (sessions only)")
    parser.add_argument("--simulation", action="store_true", help="per-round overhead in fedfdp run")
    parser.add_argument("--accuracy", action="store_true", help="fdp at ε = 2: trusted vs secagg")
    parser.add_argument("--parties", type=int, default=10, help="SuperNodes (--simulation, --accuracy)")
    parser.add_argument("--rounds", type=int, default=20, help="extra rounds timed (--simulation)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds (--accuracy)")
    parser.add_argument("--devices", type=int, default=None,
                        help="num-devices (--simulation; default the fleet's 20, at least --parties)")
    parser.add_argument("--records-per-device", type=int, default=None,
                        help="records-per-device (--simulation; default the fleet's)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: must be >= 1")
    if args.timed_rounds < 1:
        parser.error(f"--timed-rounds={args.timed_rounds}: must be >= 1")
    if args.simulation:
        report = simulation_overhead(args.parties, args.rounds, args.devices, args.records_per_device)
        print(json.dumps(report, indent=2))
        return
    if args.accuracy:
        for result in accuracy(args.parties, args.seeds):
            print(json.dumps(result))
        return
    if not args.crypto:
        ratios(args.repeats, args.timed_rounds, args.json)
        return
    rng = np.random.default_rng(0)  # public inputs only; every secret comes from the OS CSPRNG
    rows = []
    for n, k in CONFIGS:
        for d in DIMS:
            for drop in (False, True):
                runs = [one_round(n, k, d, drop, rng) for _ in range(args.repeats)]
                row: dict[str, Any] = {"n": n, "k": k, "t": k // 2 + 1, "d": d, "dropout_at_collect": drop}
                for key in runs[0]:
                    row[key] = statistics.median(r[key] for r in runs)
                rows.append(row)
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    print(
        f"SecAgg+ crypto per round (median of {args.repeats}; {meta['cpus']} CPUs, Python {meta['python']})"
    )
    cols = [("n", 4), ("k", 3), ("t", 3), ("d", 7), ("dropout", 8)]
    cols += [("server s", 9), ("client s", 9), ("max cl s", 9), ("upload B", 10)]
    print(" ".join(f"{name:>{w}}" for name, w in cols))
    for r in rows:
        cells = [
            str(r["n"]),
            str(r["k"]),
            str(r["t"]),
            str(r["d"]),
            "collect" if r["dropout_at_collect"] else "-",
        ]
        cells += [f"{r['server_s']:.3f}", f"{r['client_mean_s']:.4f}", f"{r['client_max_s']:.4f}"]
        cells += [f"{r['upload_B']:.0f}"]
        print(" ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols, strict=True)))


if __name__ == "__main__":
    main()
