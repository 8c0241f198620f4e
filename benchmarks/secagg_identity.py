"""What identities and the consistency check cost a SecAgg+ round: CPU time of one
in-process round (:func:`benchmarks.secagg.one_round`: every server and client call, no
network, no dropout) with signatures, the derived graph and the signed consistency
check, against the same round of the code before them.

The code before is a plain copy of an earlier commit (its own ``benchmarks/secagg.py``
drives its own sessions)::

    mkdir /tmp/secagg-before
    git archive a7f2337~1 | tar -x -C /tmp/secagg-before
    python benchmarks/secagg_identity.py --before /tmp/secagg-before

Each measurement is a fresh process (``time.process_time``: every thread of it) that
warms up with one round and then times ``--repeats`` rounds; the two versions alternate
``--alternations`` times so that the machine's load falls on both. Reported: the median
CPU seconds per round of each and their ratio (now ÷ before), for 10 parties (``k = 9``)
and 100 parties (``k = 15``) at ``d = --dim``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_DRIVER = """
import json, sys, time
import numpy as np
import fedfdp
from benchmarks.secagg import one_round
n, k, d, repeats = (int(v) for v in sys.argv[1:5])
rng = np.random.default_rng(0)
one_round(n, k, d, False, rng)
times = []
for _ in range(repeats):
    t0 = time.process_time()
    one_round(n, k, d, False, rng)
    times.append(time.process_time() - t0)
print(json.dumps({"times": times, "fedfdp": fedfdp.__file__}))
"""


def measure(tree: Path, n: int, k: int, d: int, repeats: int) -> list[float]:
    """CPU seconds of ``repeats`` rounds in a fresh process running the code in ``tree``."""
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(n), str(k), str(d), str(repeats)], cwd=tree,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(out["fedfdp"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"{tree}: imported fedfdp from {out['fedfdp']}")
    return list(out["times"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="a copy of the code before (module docstring)")
    parser.add_argument("--dim", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--alternations", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    now = Path(__file__).resolve().parents[1]
    rows = []
    for n, k in ((10, 9), (100, 15)):
        times: dict[str, list[float]] = {"before": [], "now": []}
        reps = args.repeats if n <= 10 else max(1, args.repeats // 3)
        for _ in range(args.alternations):
            times["before"] += measure(args.before, n, k, args.dim, reps)
            times["now"] += measure(now, n, k, args.dim, reps)
        before, after = statistics.median(times["before"]), statistics.median(times["now"])
        rows.append({"parties": n, "k": k, "dim": args.dim, "before_cpu_s": before, "now_cpu_s": after,
                     "ratio": after / before, "samples": len(times["now"])})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'parties':>7} {'k':>3} {'d':>7} {'before s':>9} {'now s':>9} {'ratio':>6} {'samples':>7}")
    for r in rows:
        print(f"{r['parties']:>7} {r['k']:>3} {r['dim']:>7} {r['before_cpu_s']:>9.3f} {r['now_cpu_s']:>9.3f} "
              f"{r['ratio']:>6.3f} {r['samples']:>7}")


if __name__ == "__main__":
    main()
