"""Cost of the exact discrete Gaussian sampler (fedfdp.secagg.noise) against numpy.

Headline: ``sampler_ratio_1e6``, the median over ``--repeats`` interleaved repetitions
of ``sample_discrete_gaussian(1e8, 10**6)`` (default stream: the OS CSPRNG keys the
AES-CTR keystream) divided by ``numpy.random.default_rng().normal(size=10**6)`` timed
right before it, in the same process. The spread is the ratios' minimum, quartiles
and maximum. Also per-row ratios for other ``(σ², n)`` and the draws per second.
The per-``σ²`` table is built by one untimed warm-up call (its cost is
``table_seconds``, cached afterwards)::

    python benchmarks/sampler.py               # table
    python benchmarks/sampler.py --json        # one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import numpy as np

from fedfdp.secagg.noise import sample_discrete_gaussian

ROWS = ((1e8, 10**6), (1e8, 82_000), (16.0, 10**6), (121_700.4839**2, 10**6))


def _time(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"min": min(values), "q1": q[0], "median": statistics.median(values), "q3": q[2],
            "max": max(values)}


def measure(repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng()
    res: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_average": os.getloadavg()[0],
        "repeats": repeats,
    }
    rows: list[dict[str, Any]] = []
    for variance, n in ROWS:
        t_table = _time(lambda v=variance: sample_discrete_gaussian(v, 1))
        ratios, seconds, normal = [], [], []
        for _ in range(repeats):
            a = _time(lambda n=n: rng.normal(size=n))
            b = _time(lambda v=variance, n=n: sample_discrete_gaussian(v, n))
            ratios.append(b / a)
            seconds.append(b)
            normal.append(a)
        rows.append({
            "variance": variance, "draws": n, "table_seconds": t_table,
            "ratio": _spread(ratios), "seconds": _spread(seconds), "numpy_seconds": _spread(normal),
            "draws_per_second": n / statistics.median(seconds),
        })
    res["rows"] = rows
    head = rows[0]
    res["sampler_ratio_1e6"] = head["ratio"]["median"]
    res["sampler_ratio_1e6_spread"] = head["ratio"]
    res["sampler_seconds_1e6"] = head["seconds"]["median"]
    res["numpy_seconds_1e6"] = head["numpy_seconds"]["median"]
    res["load_average_after"] = os.getloadavg()[0]
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=15,
                        help="interleaved repetitions per row (default 15)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: must be >= 1")
    res = measure(args.repeats)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{res['machine']}, load {res['load_average']:.2f} -> {res['load_average_after']:.2f}, "
          f"{res['repeats']} interleaved repetitions")
    print(f"{'sigma^2':>14} {'draws':>9} {'ratio median [min, q1, q3, max]':>44} {'ms':>8} {'Mdraws/s':>9}")
    for r in res["rows"]:
        q = r["ratio"]
        print(f"{r['variance']:14.6g} {r['draws']:9d} {q['median']:8.2f} "
              f"[{q['min']:.2f}, {q['q1']:.2f}, {q['q3']:.2f}, {q['max']:.2f}]".ljust(78)
              + f"{r['seconds']['median'] * 1e3:8.1f} {r['draws_per_second'] / 1e6:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
