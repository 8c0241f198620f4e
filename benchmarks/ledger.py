"""Cost of one write-ahead charge at every length of the ledger, through the round engine.

A charge is what :meth:`fedfdp.round_engine.RoundEngine.begin_round` does for a private
round before anything of it is drawn: the budget check, the attempt number
(:meth:`fedfdp.ledger.Ledger.attempts`), the chained entry, the accountant's
composition of the event and the durable write of the new line (write, flush, fsync
through the run directory's :class:`~fedfdp.run_files.RunFiles`), then the round's
sampling draw. The benchmark builds two run directories whose ledgers already hold
``10`` and ``10,000`` charges (written whole, then restored into a fresh engine as a
resume does), and times the next ``--charges`` charges of each, alternating between the
two so that slow phases of a shared machine hit both alike (wall clock: a charge waits
on the disk). One repetition is a fresh pair of directories and engines; its ratio is the
median time per charge at 10,000 over the median at 10.

``ledger_charge_ratio_10k`` (the headline; target <= 1.5) is the median ratio over the
repetitions, with their range, for a run without ``max-epsilon`` (the default): the
budget check then composes nothing, and ε is evaluated once per round when the round's
row asks for it, outside the charge. Two other rows:

- ``memory``: the same charges without a run directory (``out-dir`` empty: no fsync),
  so that what the ledger and the engine do in memory is seen without the disk's noise;
- ``max-epsilon``: a run with ``max-epsilon`` set (never reached; its ratio is
  ``ledger_charge_ratio_10k_max_epsilon``, target <= 1.5 too): the budget check compares
  the round with the budget's headroom (:class:`fedfdp.mechanism.Budget`: the rounds left
  below the cap, searched at the first check, the warm-up charge here, and lowered by
  each charge), an integer comparison. Evaluating ε of a longer composition costs more
  (the accountant's numerical composition doubles its way up to ``count`` rounds:
  about ``log2(count)`` steps), so a check that evaluated ε every round would grow with
  the ledger; this row shows that it does not.

``node`` times a node's own charge (:meth:`fedfdp.node_ledger.NodeLedger.charge`: under
its lock, the budget check, the durable line) on node ledgers of 10 and 10,000 charges:
the first charge of a :class:`~fedfdp.node_ledger.NodeLedger` reads, verifies and
replays the whole file (``first_ms_at_*``), the next ones hash it and reuse what the
node kept (``ms_per_charge_at_*``, the median of ``--charges``).

``resume`` times reading and verifying a ledger (every hash, link and event: one pass,
:func:`fedfdp.ledger.read_ledger`) of 1,000 and 10,000 charges, per entry. ::

    python benchmarks/ledger.py            # table
    python benchmarks/ledger.py --json     # {"ledger_charge_ratio_10k": ...,
                                           #  "ledger_charge_ratio_10k_max_epsilon": ..., ...}
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedfdp import build_plan, load_config
from fedfdp.accounting.events import SubsampledGaussian
from fedfdp.checkpoint import CHECKPOINT_FILE, Checkpoint
from fedfdp.ledger import Head, Ledger, read_ledger, write_ledger
from fedfdp.node_ledger import NodeLedger
from fedfdp.node_policy import NodePolicy
from fedfdp.outputs import atomic_write, write_metrics
from fedfdp.round_engine import RoundEngine
from fedfdp.run_files import RunFiles
from fedfdp.run_rows import RowsMark

SHORT, LONG = 10, 10_000


def _engine(charged: int, extra: int, out: Path | None, max_epsilon: float | None) -> RoundEngine:
    """An engine resumed from a ledger of ``charged`` charges, ready for ``extra`` more."""
    values: dict[str, Any] = {"noise-multiplier": 1.0, "num-rounds": charged + extra + 1, "progress": False,
                              "seed": 0}
    if out is not None:
        values["out-dir"] = str(out)
    if max_epsilon is not None:
        values["max-epsilon"] = max_epsilon
    plan = build_plan(load_config(values), model=torch.nn.Linear(4, 2), num_devices=3)
    engine = plan.engine([100, 80, 120])
    mechanism, event = engine.mechanism, engine.mechanism.event
    assert event is not None
    ledger = Ledger.start(mechanism.to_dict(), mechanism.digest())
    for r in range(1, charged + 1):
        ledger.append_charge(r, 0, event)
    if plan.files is not None:
        plan.files.write_ledger(ledger)
    engine.restore_ledger(ledger)
    return engine


def _charge_times(engine: RoundEngine, first: int, count: int) -> Callable[[], float]:
    """``next()`` → wall seconds of one more charge (``begin_round`` of the next round)."""
    rounds = iter(range(first, first + count))

    def one() -> float:
        r = next(rounds)
        t = time.perf_counter()
        engine.begin_round(r)
        return time.perf_counter() - t

    return one


def _repetition(charges: int, variant: str, root: Path) -> dict[str, float]:
    max_epsilon = 1e6 if variant == "max-epsilon" else None
    engines, outs = {}, {}
    for n in (SHORT, LONG):
        outs[n] = None if variant == "memory" else Path(tempfile.mkdtemp(dir=root))
        engines[n] = _engine(n, charges + 1, outs[n], max_epsilon)
    calls = {n: _charge_times(e, n + 1, charges + 1) for n, e in engines.items()}
    for f in calls.values():  # one warm-up charge each
        f()
    times: dict[int, list[float]] = {n: [] for n in calls}
    for _ in range(charges):
        for n, f in calls.items():
            times[n].append(f())
    for n, out in outs.items():  # every charge is on disk, and the chain verifies
        on_disk = read_ledger(out) if out is not None else engines[n].ledger
        assert on_disk is not None and on_disk.head() == engines[n].ledger.head()
    short, long_ = statistics.median(times[SHORT]), statistics.median(times[LONG])
    return {"ms_per_charge_at_10": short * 1e3, "ms_per_charge_at_10k": long_ * 1e3, "ratio": long_ / short}


def _resume(root: Path, sizes: tuple[int, ...] = (1_000, LONG), reps: int = 3) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in sizes:
        engine = _engine(n, 1, None, None)
        run = Path(tempfile.mkdtemp(dir=root))
        write_ledger(run, engine.ledger)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            ledger = read_ledger(run)
            best = min(best, time.perf_counter() - t)
            assert ledger is not None and len(ledger.charges) == n
        out[f"us_per_entry_at_{n}"] = best / (n + 1) * 1e6
    return out


def _node(root: Path, charges: int) -> dict[str, float]:
    policy = NodePolicy(max_epsilon=1e6, delta=1e-5, min_honest_shares=1, max_colluders=0, trust_server=True)
    event = SubsampledGaussian(2.0, 0.01)
    out: dict[str, float] = {}
    for n in (SHORT, LONG):
        state = Path(tempfile.mkdtemp(dir=root))
        NodeLedger(state, policy).charge(1, 1, event)  # the node's terms, then n charges in all
        ledger = read_ledger(state)
        assert ledger is not None
        for r in range(2, n + 1):
            ledger.append_node_charge(1, r, event)
        write_ledger(state, ledger)
        node = NodeLedger(state, policy)
        t = time.perf_counter()
        node.charge(1, n + 1, event)
        out[f"first_ms_at_{n}"] = (time.perf_counter() - t) * 1e3
        times = []
        for r in range(n + 2, n + 2 + charges):
            t = time.perf_counter()
            node.charge(1, r, event)
            times.append(time.perf_counter() - t)
        out[f"ms_per_charge_at_{n}"] = statistics.median(times) * 1e3
    out["ratio"] = out[f"ms_per_charge_at_{LONG}"] / out[f"ms_per_charge_at_{SHORT}"]
    return out


def _row(r: int) -> dict[str, Any]:
    """A run loop's row (the default run's columns; accuracy on every tenth round)."""
    return {"round": r, "phase": "fdp", "epsilon": 0.01 * r ** 0.5, "delta": 1e-5, "relation": "add-remove",
            "accuracy": 0.8 if r % 10 == 0 else float("nan"), "loss": 0.5 if r % 10 == 0 else float("nan"),
            "public_loss": 0.7, "replies": 10, "rejected": 0, "asked": 10, "missing": 0,
            "noise_multiplier": 1.1, "normaliser": 3.2, "clipping_norm": 1.0, "noise_source": "os-csprng"}


def _run_files(root: Path, rounds: int, reps: int) -> dict[str, Any]:
    """A round's files after ``n`` rounds (what the run loop writes each round by default:
    ``rows.jsonl``, ``checkpoint.pt``, ``metrics.csv``) at n = 10 and 10,000: through
    :class:`~fedfdp.run_files.RunFiles` (a row appended to ``rows.jsonl`` and to
    ``metrics.csv``, the checkpoint without the rows), and the earlier whole-file way
    (every row in the checkpoint's JSON, the table rendered whole), for comparison.
    """
    cfg = load_config({"progress": False})
    model = {"w": torch.zeros(295)}

    def checkpoint(rows: list[dict[str, Any]]) -> Checkpoint:
        n = len(rows)
        return Checkpoint(round=n, config={"mode": "fdp"}, num_records=800, mechanism_digest="ab" * 32,
                          head=Head(n + 1, "cd" * 32, n), rows=rows, clipping_norm=1.0, every=1, model=model,
                          optimizer={})

    def per_round(n: int, whole: bool) -> float:
        out = Path(tempfile.mkdtemp(dir=root))
        files = RunFiles(out, cfg.run, {}, n + rounds)
        rows = [_row(r) for r in range(1, n + 1)]
        files.metrics(rows)
        files.checkpoint(checkpoint(rows))
        times = []
        for r in range(n + 1, n + rounds + 1):
            rows.append(_row(r))
            t = time.perf_counter()
            if whole:  # the earlier way: every row in the checkpoint's JSON, the table rendered whole
                meta = {**checkpoint(rows).meta(RowsMark(0, "0" * 64)), "version": 3, "rows": rows}
                buf = io.BytesIO()
                torch.save({"meta": json.dumps(meta), "model": model, "optimizer": {}}, buf)
                atomic_write(out / CHECKPOINT_FILE, buf.getvalue())
                write_metrics(out, rows)
            else:
                files.checkpoint(checkpoint(rows))
                files.metrics(rows)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    doc: dict[str, Any] = {}
    for way in ("appended", "whole"):
        ratios, short, long_ = [], [], []
        for _ in range(reps):
            a, b = per_round(SHORT, way == "whole"), per_round(LONG, way == "whole")
            short.append(a * 1e3)
            long_.append(b * 1e3)
            ratios.append(b / a)
        doc[way] = {"ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                    "ms_per_round_at_10": statistics.median(short),
                    "ms_per_round_at_10k": statistics.median(long_)}
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--charges", type=int, default=10, help="charges timed at each length per repetition")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (fresh directories and engines)")
    parser.add_argument("--variants", default="durable,memory,max-epsilon")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = [v for v in args.variants.split(",") if v]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for variant in variants:
            reps = [_repetition(args.charges, variant, root) for _ in range(args.reps)]
            ratios = [r["ratio"] for r in reps]
            results[variant] = {
                "ratio_median": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
                "ms_per_charge_at_10": statistics.median(r["ms_per_charge_at_10"] for r in reps),
                "ms_per_charge_at_10k": statistics.median(r["ms_per_charge_at_10k"] for r in reps),
                "repetitions": reps,
            }
        resume = _resume(root)
        node = _node(root, args.charges)
        run_files = _run_files(root, args.charges, max(3, args.reps // 2))
    doc = {
        "ledger_charge_ratio_10k": results["durable"]["ratio_median"] if "durable" in results else None,
        "ledger_charge_ratio_10k_max_epsilon": (results["max-epsilon"]["ratio_median"]
                                                if "max-epsilon" in results else None),
        "target": 1.5,
        "measured": "through the round engine (begin_round of a private round: budget check, charge, "
                    "durable write, sampling), wall clock",
        "charges_per_length": args.charges,
        "repetitions": args.reps,
        "variants": results,
        "resume": resume,
        "node": node,
        "run_files_ratio_10k": run_files["appended"]["ratio_median"],
        "run_files": run_files,
        "machine": {"cpus": os.cpu_count(), "load_average": list(os.getloadavg()),
                    "python": platform.python_version(), "torch": torch.__version__},
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{'variant':<12} {'ms/charge at 10':>16} {'at 10,000':>10} {'ratio':>7}  "
          f"range over {args.reps} reps")
    for variant, r in results.items():
        lo, hi = r["ratio_range"]
        print(f"{variant:<12} {r['ms_per_charge_at_10']:>16.3f} {r['ms_per_charge_at_10k']:>10.3f} "
              f"{r['ratio_median']:>7.2f}  {lo:.2f}-{hi:.2f}")
    print("resume (read and verify), us per entry: "
          + ", ".join(f"{k.rsplit('_', 1)[1]} charges {v:.1f}" for k, v in resume.items()))
    print(f"node ledger, ms per charge: at 10 {node['ms_per_charge_at_10']:.1f}, at 10,000 "
          f"{node['ms_per_charge_at_10000']:.1f} (the first, a whole read: {node['first_ms_at_10000']:.1f})")
    for way, r in run_files.items():
        lo, hi = r["ratio_range"]
        print(f"run files ({way}), ms per round: at 10 {r['ms_per_round_at_10']:.1f}, at 10,000 "
              f"{r['ms_per_round_at_10k']:.1f}, ratio {r['ratio_median']:.2f} ({lo:.2f}-{hi:.2f})")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
