"""``fedfdp compare``: FDP against its baselines at equal ε — sweeps and reports.

``fedfdp compare --config FILE.toml --out DIR [--set key=value ...] [--engine centralised|flower]``

The TOML file holds every key of ``fedfdp run`` (the base configuration) plus
three sweep lists and optional per-mode overrides::

    modes = ["nonprivate", "public", "dp", "fdp-dpsgd", "fdp"]
    target-epsilons = [1.0, 2.0, 4.0]
    seeds = [0, 1, 2]
    num-rounds = 150                  # any key of `fedfdp run`

    [mode.dp]                         # keys for one mode only (a tuned baseline)
    learning-rate = 0.2
    [mode.fdp-dpsgd]
    public-pretrain-rounds = 30

Every private mode (``dp``, ``fdp-dpsgd``, ``fdp``) runs once per target ε and
seed; its σ is calibrated by :func:`fedfdp.mechanism.resolve_mechanism` (the
accountant's :func:`~fedfdp.accounting.calibrate_noise_multiplier`) so that
its **private** rounds end at, never above, the target — public pre-training
rounds (Remark 2) cost nothing and are not counted. ``nonprivate`` (ε = ∞)
and ``public`` (ε = 0) run once per seed and are drawn as reference lines.
Every run is planned and validated before any starts
(:mod:`simulations.compare_plan`).

Engines
    ``centralised`` (default): :func:`fedfdp.algorithm.run_centralised`, the
    single-machine reference of Algorithm 1. The Flower path is tested to
    match it round for round (``tests/test_equivalence.py``: one federated
    round equals one centralised step on the union of the devices' batches,
    with the same noise draw), so a comparison is the same measurement, fast.
    ``flower``: each run on Flower's simulation engine
    (:func:`simulations.flower_processes.run_simulation_for`, one virtual SuperNode per
    device), as ``fedfdp run`` does.

Outputs in ``DIR``
    ``results.csv``: one row per run (``dataset, mode, target_epsilon,
    epsilon, delta, relation, seed, accuracy, loss, rounds, pretrain_rounds,
    private_rounds, noise_multiplier, num_records, engine, seconds,
    config_hash``), rewritten
    atomically after every run. ``privacy_utility.png``: accuracy against ε per
    mode (mean ± sd over seeds). ``summary.md``: the table of means.
    ``sweep.toml``: the sweep as run. ``runs/<tag>/metrics.csv``: per-round
    metrics of every run.

Restart
    A sweep started again with the same ``--out`` skips the runs already in
    ``results.csv`` (same mode, target ε, seed and configuration hash). A row
    for the same run under a different configuration, or a malformed
    ``results.csv``, stops the sweep with an error; nothing is overwritten.

Interrupted runs (:func:`recover_interrupted`)
    A run stopped before its row was written (Ctrl-C, a crash) leaves its
    directory ``runs/<tag>/``. The sweep started again **resumes** it from its
    checkpoint when the library accepts it (configuration, data, resolved
    mechanism, and the ledger against the checkpoint); the ledger keeps every
    charge, a round charged but not checkpointed is charged again, and the row's
    ``resumed_after_round`` names the checkpoint. Otherwise (refused: the
    sweep's configuration changed, the ledger was edited or rolled back, ...)
    the directory is **kept aside** — renamed ``runs/<tag>.interrupted-<n>``,
    never removed — and the run starts afresh; ``interrupted.csv`` and
    ``summary.md`` record why and the budget its ledger records (ε upper bound,
    relation, δ, charges), spent in addition to the rerun's on the same
    records. No path of ``fedfdp compare`` deletes a run directory or a ledger.

Every ε is the upper end of the accountant's interval, add/remove relation,
at the run's δ (default ``1/(2N)``). Accuracy and loss are measured on the
held-out split, never on training records.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedfdp.config import (
    Config,
    ConfigError,
    Mode,
    load_config,
    load_toml_file,
)
from simulations.compare_plan import RunSpec, Sweep, parse_sweep, plan_runs, validate_runs
from simulations.compare_report import (
    METRIC_TITLES,
    PLOT_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    spent_text,
    write_report,
)
from simulations.compare_results import (
    RESULTS_FILE,
    append_interrupted,
    append_result,
    done_runs,
    read_interrupted,
    read_results,
)

ENGINES = ("centralised", "flower")


# ---------------------------------------------------------------------- interrupted runs


#: ``runs/<tag><KEPT_ASIDE><n>``: an interrupted run that could not be resumed, kept.
KEPT_ASIDE = ".interrupted-"


def recover_interrupted(
    run: RunSpec, out: Path, *, report: Callable[[str], None] = print
) -> tuple[RunSpec, int | None]:
    """What to do with the directory an interrupted run of the sweep left (e.g. after
    Ctrl-C): nothing is ever deleted, a ledger least of all.

    No run files there: ``run`` as planned. A run directory the library accepts to
    resume (:meth:`fedfdp.run_files.RunFiles.verify`: the configuration, the data, the
    resolved mechanism, the ledger against its checkpoint): ``run`` with
    ``resume = true``, so the run continues from its checkpoint and its ledger keeps
    every charge (a round charged but not checkpointed is charged again, and what a
    crashed session may have charged unrecorded is charged pessimistically).
    Otherwise (refused) the directory is renamed ``<tag>.interrupted-<n>`` and recorded in
    ``interrupted.csv`` with the budget its ledger records
    (:func:`record_kept_aside`); ``run`` then starts afresh. ``report`` receives one
    line saying which. Returns the run to execute and the round it resumes after
    (None: from the start).
    """
    from fedfdp.run_files import occupied

    run_dir = Path(run.cfg.run.out_dir)
    if not occupied(run_dir):
        return run, None
    resumed = replace(run, cfg=load_config({"resume": True}, base=run.cfg))
    after, reason = _resume_point(resumed.cfg)
    if after is not None:
        report(f"compare: {run.tag}: resuming the interrupted run after round {after} (its ledger kept)")
        return resumed, after
    kept = keep_aside(run_dir)
    record_kept_aside(out, {kept.name: reason})
    spent = next((r for r in read_interrupted(out) if r["kept_at"] == _relative(kept, out)), None)
    eps = "" if spent is None else f"; its ledger records ε {spent_text(spent)}"
    report(f"compare: {run.tag}: cannot resume the interrupted run ({reason}); kept aside as "
           f"{_relative(kept, out)}{eps}")
    return run, None


def _resume_point(cfg: Config) -> tuple[int | None, str]:
    """The round a run directory can be resumed after (None: it cannot), and why not:
    the checks ``fedfdp run --resume`` makes (:meth:`fedfdp.run_files.RunFiles.verify`
    against the mechanism the run's server resolves).
    """
    from fedfdp.data import load_dataset
    from fedfdp.ledger import LedgerError
    from fedfdp.run_files import RunFiles
    from fedfdp.run_plan import mechanism_for, resolve_released

    run_dir = Path(cfg.run.out_dir)
    data = load_dataset(cfg.data)
    cfg = resolve_released(cfg, data)
    files = RunFiles(run_dir, cfg.run, cfg.to_flat(), cfg.privacy.num_rounds)
    try:
        found = files.verify(mechanism_for(cfg, data))
    except LedgerError as exc:
        return None, _one_line(exc).replace(f"{run_dir}/", "")
    return (found.checkpoint.round if found.checkpoint is not None else 0), ""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def keep_aside(run_dir: Path) -> Path:
    """Rename ``run_dir`` to ``<run_dir>.interrupted-<n>`` (the first free ``n``), in the
    same directory: nothing is copied or removed. Returns the new path.
    """
    n = 1
    while (dest := run_dir.with_name(f"{run_dir.name}{KEPT_ASIDE}{n}")).exists():
        n += 1
    run_dir.rename(dest)
    return dest


def _relative(path: Path, out: Path) -> str:
    try:
        return str(path.relative_to(out))
    except ValueError:
        return str(path)


def record_kept_aside(out: Path, reasons: Mapping[str, str] | None = None) -> None:
    """Add every kept-aside run directory under ``out/runs`` that ``interrupted.csv``
    lacks, with the budget its ledger records (:func:`simulations.run_budget.spent_budget`:
    the ledger read by the library, replayed into the run's accountant, at the run's δ).
    ``reasons`` (directory name → why it was not resumed) — a directory found without
    one (kept aside by a compare that stopped before recording it) says so.
    """
    from simulations.run_budget import spent_budget

    runs_dir = out / "runs"
    if not runs_dir.is_dir():
        return
    known = {r["kept_at"] for r in read_interrupted(out)}
    for kept in sorted(p for p in runs_dir.iterdir() if p.is_dir() and KEPT_ASIDE in p.name):
        where = _relative(kept, out)
        if where in known:
            continue
        tag = kept.name.rsplit(KEPT_ASIDE, 1)[0]
        row: dict[str, Any] = {
            "run": tag, "kept_at": where,
            "reason": (reasons or {}).get(kept.name, "found kept aside (reason not recorded)"),
            "charges": None, "epsilon": math.nan, "delta": math.nan, "relation": "", "note": "",
        }
        try:
            spent = spent_budget(kept)
        except ConfigError as exc:
            why = _one_line(exc).replace(f"{kept}: ", "", 1).replace(f"{kept}/", "")
            row["note"] = f"not accounted: {why}{_last_reported(kept)}"
        else:
            if spent is None:
                row.update(charges=0, epsilon=0.0, note="no privacy ledger: nothing was charged")
            else:
                row.update(charges=spent.charges, epsilon=spent.epsilon, delta=spent.delta,
                           relation=spent.relation)
        append_interrupted(out, row)


def _last_reported(run_dir: Path) -> str:
    """``; its metrics.csv reported ε X after round R``, from the run's last row with
    an ε (a lower bound of what it spent: a round charged after that row is not in it).
    """
    import csv

    try:
        with (run_dir / "metrics.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return ""
    for row in reversed(rows):
        for column in ("epsilon", "epsilon_corrdp"):
            if row.get(column) not in (None, "", "nan"):
                return (f"; its metrics.csv reported {column} {float(row[column]):.4g} after round "
                        f"{row.get('round', '?')} (a lower bound)")
    return ""


# ---------------------------------------------------------------------- running


def run_one(run: RunSpec, engine: str, sigma: float | None) -> dict[str, Any]:
    """Execute one run (resumed when its configuration says ``resume``: see
    :func:`recover_interrupted`); return its results row.
    """
    from fedfdp.algorithm import run_centralised
    from fedfdp.data import load_dataset
    from fedfdp.entropy import noise_source
    from fedfdp.evaluation import METRICS, held_out_metrics
    from fedfdp.run_plan import resolve_released

    data = load_dataset(run.cfg.data)
    cfg = resolve_released(run.cfg, data)  # num-devices = 0: one device per unit of device-column
    run_dir = Path(cfg.run.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # an occupied one is refused by the run unless resumed
    start = time.perf_counter()
    generative = cfg.training.model == "ddpm"  # scored by its last evaluation: loss and fd
    if engine == "centralised":
        model, rows = run_centralised(cfg, data)
        if generative:
            final = rows[-1] if rows else {}
            scores = {m: float(final.get(m, math.nan)) for m in (*METRICS, "fd")}
        else:
            scores = held_out_metrics(model, data.test_x, data.test_y)
        phases = [r["phase"] for r in rows]
        last = rows[-1] if rows else {}
        epsilon = last.get("epsilon", 0.0)
        epsilon_corrdp = last.get("epsilon_corrdp", float("nan"))
        relation = last.get("relation", "add-remove")
        delta = last.get("delta", float("nan"))
    else:
        import pandas as pd

        from simulations.flower_processes import run_simulation_for

        run_simulation_for(cfg)
        metrics = pd.read_csv(run_dir / "metrics.csv")
        evaluated = metrics.dropna(subset=["fd" if generative else "accuracy"])
        if evaluated.empty:
            raise RuntimeError(f"run {run.tag}: the Flower run evaluated no round")
        names = (*METRICS, "fd") if generative else METRICS
        scores = {m: float(evaluated[m].iloc[-1]) if m in evaluated else float("nan") for m in names}
        phases = metrics["phase"].astype(str).tolist()
        epsilon = float(metrics["epsilon"].iloc[-1])
        corrdp = metrics.get("epsilon_corrdp")
        epsilon_corrdp = float(corrdp.iloc[-1]) if corrdp is not None else math.nan
        relation = str(metrics["relation"].iloc[-1])
        delta = float(metrics["delta"].iloc[-1])
    pretrain = sum(p == Mode.PUBLIC for p in phases) if run.mode != Mode.PUBLIC else 0
    return {
        "dataset": cfg.data.dataset,
        "mode": run.mode,
        "target_epsilon": run.target_epsilon,
        "epsilon": epsilon,
        "epsilon_corrdp": epsilon_corrdp,
        "delta": delta,
        "relation": relation,
        "seed": run.seed,
        **scores,
        "rounds": len(phases),
        "pretrain_rounds": pretrain,
        "private_rounds": len(phases) - pretrain if run.mode != Mode.PUBLIC else 0,
        "noise_multiplier": sigma,
        "num_records": data.num_records,
        "engine": engine,
        "seconds": round(time.perf_counter() - start, 2),
        "noise_source": noise_source(cfg.privacy.reproducible_noise),
        "config_hash": run.config_hash,
    }


def run_sweep(
    sweep: Sweep,
    out: Path,
    *,
    engine: str = "centralised",
    progress: bool = True,
    command: str = "",
    title: str = "",
    metric: str | None = None,
) -> Path:
    """Run every run of ``sweep`` not yet in ``out/results.csv``; write the report.

    Returns the path of ``results.csv``.
    """
    import tomli_w
    from tqdm.auto import tqdm

    from fedfdp.outputs import atomic_write, prepare_output_dir

    if engine not in ENGINES:
        raise ConfigError(f"--engine={engine!r}: must be one of {', '.join(ENGINES)}")
    runs = plan_runs(sweep, out.resolve())  # every configuration valid before the folder is made
    out = prepare_output_dir(out.resolve(), "--out")
    frame = read_results(out)  # malformed: error before any work
    done = done_runs(frame, runs)
    sigmas = validate_runs(runs)  # bad data / unreachable ε: error before any run
    atomic_write(out / SWEEP_FILE, tomli_w.dumps(sweep.as_toml()).encode())
    record_kept_aside(out)  # any kept aside by a compare that stopped before recording it
    todo = [r for r in runs if r.key not in done]
    with tqdm(total=len(runs), initial=len(runs) - len(todo), disable=not progress,
              desc="compare", unit="run", dynamic_ncols=True) as bar:
        for run in todo:
            bar.set_postfix_str(run.tag)
            run, after = recover_interrupted(run, out, report=bar.write)
            row = run_one(run, engine, sigmas.get(run.tag))
            append_result(out, {**row, "resumed_after_round": after})
            bar.update(1)
    write_report(out, command=command, title=title, metric=metric)
    return out / RESULTS_FILE


# ---------------------------------------------------------------------- CLI


def cmd_compare(args: argparse.Namespace) -> int:
    """``fedfdp compare``."""
    import torch

    if args.threads < 1:
        raise ConfigError(f"--threads={args.threads}: must be >= 1 (torch threads per run)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if args.report_only:
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out={str(out)!r}: not a directory")
        if read_results(out).empty:
            raise ConfigError(f"--out={str(out)!r}: no {RESULTS_FILE} with results to report on (run the "
                              "sweep first, without --report-only)")
        write_report(out, title=args.title, metric=args.metric)
    else:
        doc: dict[str, Any] = {} if args.config is None else load_toml_file(args.config)
        sweep = parse_sweep(doc, args.set or [])
        command = "fedfdp compare " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else ""
        from simulations.plain_output import plain_stderr

        with plain_stderr():  # redirected: each bar's final line, no CR updates or escape codes
            run_sweep(sweep, out, engine=args.engine, progress=not args.no_progress, command=command,
                      title=args.title, metric=args.metric)
    print(f"wrote {out / RESULTS_FILE}, {out / SUMMARY_FILE}, {out / PLOT_FILE}")
    summary = out / SUMMARY_FILE
    if summary.is_file():
        print(summary.read_text())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``compare`` to the ``fedfdp`` parser."""
    p = sub.add_parser("compare", help="FDP against its baselines at equal ε: sweeps and reports")
    p.add_argument("--config", help="sweep TOML: run keys + modes, target-epsilons, seeds, [mode.NAME]")
    p.add_argument("--out", required=True, help="output directory (restartable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a base or sweep key")
    p.add_argument("--engine", choices=ENGINES, default="centralised",
                   help="centralised reference (default; tested to match Flower) or Flower simulation")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: small models run fastest single-threaded)")
    p.add_argument("--report-only", action="store_true", help="rewrite summary and plot from results.csv")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--title", default="", help="heading of the summary and the plot (one dataset)")
    p.add_argument("--metric", choices=list(METRIC_TITLES), default=None,
                   help="metric of the plot (default: fd when every run is a diffusion model's, "
                        "else accuracy; the summary has every metric)")
    p.set_defaults(func=cmd_compare)
