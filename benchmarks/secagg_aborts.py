"""How often honest dropouts abort a SecAgg+ round (fedfdp.secagg.graph), measured.

Each of ``n`` parties drops independently with probability ``p`` before sending its
masked vector (the worst stage: its masks are in its neighbours' vectors). Two numbers
per ``(n, p)``, with ``k`` the default neighbourhood (``min(n, 2⌈log₂ n⌉ + 1)``, odd)
and ``t = ⌊k/2⌋ + 1``:

``disconnected``  the probability that the survivors' graph falls apart (the round is
                  aborted so no partial sum is released): exact,
                  :func:`fedfdp.secagg.graph.disconnection_probability`;
``any abort``     the probability that the collect stage aborts for any reason of the
                  protocol — a survivor with fewer than ``t`` live members in its
                  neighbourhood, a dead node with a live neighbour but fewer than ``t``
                  live ones (its key cannot be rebuilt), or a disconnected graph —
                  Monte Carlo over ``--trials`` draws, with its standard error (the
                  survivor floor ``n_min`` is a configuration choice and not included).

Run::

    python benchmarks/secagg_aborts.py              # table
    python benchmarks/secagg_aborts.py --json
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from fedfdp.secagg.graph import disconnection_probability
from fedfdp.secagg.session import default_neighbours, default_threshold


def any_abort(n: int, k: int, p: float, trials: int, rng: np.random.Generator) -> tuple[float, float]:
    """Monte Carlo estimate of P(threshold failure or disconnection) and its standard error."""
    h, t = k // 2, default_threshold(k)
    offsets = [j for j in range(-h, h + 1) if j != 0]
    fails = 0
    done = 0
    while done < trials:
        m = min(20_000, trials - done)
        live = rng.random((m, n)) >= p
        around = sum(np.roll(live, -j, axis=1) for j in offsets)  # live neighbours (itself excluded)
        bad_live = live & (around + 1 < t)
        bad_dead = ~live & (around > 0) & (around < t)
        # disconnected: at least two circular gaps of >= h dead between consecutive live
        # nodes; a gap is counted at the live node on its left (live, then h dead)
        run_dead = np.ones_like(live)
        for j in range(1, h + 1):
            run_dead &= ~np.roll(live, -j, axis=1)
        gaps = (live & run_dead).sum(axis=1)
        fail = bad_live.any(axis=1) | bad_dead.any(axis=1) | (gaps >= 2) | ~live.any(axis=1)
        fails += int(fail.sum())
        done += m
    est = fails / trials
    return est, math.sqrt(max(est * (1 - est), 1.0 / trials) / trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed", type=int, default=0, help="Monte Carlo stream (public: it only measures)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    for n in (10, 30, 100):
        k = default_neighbours(n)
        for p in (0.1, 0.2, 0.3):
            est, se = any_abort(n, k, p, args.trials, rng)
            rows.append({"n": n, "k": k, "t": default_threshold(k), "dropout": p,
                         "disconnected": disconnection_probability(n, k, p), "any_abort": est,
                         "any_abort_se": se})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'n':>4} {'k':>3} {'t':>3} {'p':>5} {'disconnected (exact)':>22} {'any abort (MC ± 1 se)':>26}")
    for r in rows:
        print(f"{r['n']:>4} {r['k']:>3} {r['t']:>3} {r['dropout']:>5} {r['disconnected']:>22.3g} "
              f"{r['any_abort']:>15.4f} ± {r['any_abort_se']:.4f}")


if __name__ == "__main__":
    main()
