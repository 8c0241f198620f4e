"""Crypto cost of one SecAgg+ round (fedfdp.secagg), in process, no network.

For each configuration (n parties, k neighbours, dimension d, with no dropout or with
one node dropping at collect, which makes the server reconstruct its mask key and
remove its k − 1 pairwise masks), one round is driven through
:class:`~fedfdp.secagg.ServerSession` and n :class:`~fedfdp.secagg.ClientSession`;
every call is timed with ``perf_counter`` (wall time on a shared machine: take the
median of ``--repeats``)::

    server_s         all server calls of the round (setup_requests .. receive_unmask)
    client_mean_s    one client's five calls (key generation and its signature, checking
                     the neighbours' signed keys, sharing, encryption, decryption,
                     masking, the signed consistency check, unmasking), mean over clients
    client_max_s     the slowest client
    upload_B         bytes one client sends (public keys, ciphertexts, the uint32
                     vector, its unmask shares): the private part is 4·d + small

The inputs are random uint32 vectors (the encoding is not part of the crypto cost).
Run::

    python benchmarks/secagg.py             # table
    python benchmarks/secagg.py --json      # machine-readable

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
import json
import os
import platform
import statistics
import time
from collections import defaultdict
from typing import Any

import numpy as np

from fedfdp.secagg import ClientSession, NodeTrust, Roster, ServerSession, SigningKey

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
    result = srv(server.receive_unmask, [cli(u, clients[u].unmask, r) for u, r in unm.items()])
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
    }


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per configuration (median reported)")
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
    if args.simulation:
        report = simulation_overhead(args.parties, args.rounds, args.devices, args.records_per_device)
        print(json.dumps(report, indent=2))
        return
    if args.accuracy:
        for result in accuracy(args.parties, args.seeds):
            print(json.dumps(result))
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
