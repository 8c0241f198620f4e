"""Measure the five methods of §6.3 on MNIST-5k with the non-federated reference trainer.

Two tasks, both with Ψ = Gaussian blur (kernel 9, σ = 2, reflect, 8-bit output):

``classify``
    The DigitCNN classifier; test accuracy on the held-out 1,000 digits.
``ddpm``
    The class-conditional U-Net DDPM; a Fréchet distance on the penultimate
    features of a DigitCNN trained on the held-out split (NOT Inception FID),
    overall and per class, 1,000 samples (100 per class) against the 1,000
    held-out digits; sample grids as PNG.

``public`` is trained for ``--pretrain-steps`` public steps and its model is the
starting point of ``fdp-dpsgd`` and ``fdp`` (public pre-training costs no
privacy, Remark 2), so their wall times are the public time plus their own.
Private phases: ``--steps`` Poisson-subsampled Gaussian steps at rate
``--rate`` with σ calibrated to ``--epsilon`` (upper bound, add/remove) at
δ = 1/(2N). Coins and noise come from the OS CSPRNG.

Usage (writes ``results.json``, ``log.txt`` and grids to ``--out``)::

    nice python benchmarks/images_reference.py classify --seeds 0 1 2 --out runs/images/classify
    nice python benchmarks/images_reference.py ddpm --seeds 0 --out runs/images/ddpm

On a loaded machine ``--threads 1`` is faster (two threads wait for each other
when one is descheduled). Run with ``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296``
in the environment for the per-record paths' speed (docs/clipping.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from fedfdp.images.blur import GaussianBlur
from fedfdp.images.data import ImageSet, load_mnist5k, split_images
from fedfdp.images.diffusion import DiffusionLoss, NoiseSchedule, sample
from fedfdp.images.fid import class_rows, fid_report, save_grid, train_feature_classifier
from fedfdp.images.models import build_classifier
from fedfdp.images.train import (
    METHODS,
    ClassificationTask,
    DiffusionTask,
    TrainSettings,
    evaluate_classifier,
    train,
)
from fedfdp.images.unet import build_unet


def _log(out: Path, line: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {line}", flush=True)
    with open(out / "log.txt", "a") as f:
        f.write(f"[{stamp}] {line}\n")


def _data(downsample: int = 1, seed: int = 0) -> tuple[ImageSet, ImageSet]:
    """MNIST-5k's training and held-out splits, optionally average-pooled by ``downsample``."""
    data = load_mnist5k()
    if downsample > 1:
        pooled = torch.nn.functional.avg_pool2d(torch.from_numpy(np.array(data.x)), downsample)
        data = ImageSet(f"mnist5k/{downsample}", pooled.numpy(), data.y, data.class_names)
    fed = split_images(data, 1, test_fraction=0.2, seed=seed)
    return fed.train(), fed.test()


def _settings(args: argparse.Namespace, method: str, seed: int) -> TrainSettings:
    private = method in ("dp", "fdp-dpsgd", "fdp")
    if method == "public":
        steps = args.pretrain_steps
    elif method == "nonprivate":
        steps = args.nonprivate_steps
    else:
        steps = args.steps
    return TrainSettings(
        method=method,
        steps=steps,
        sampling_rate=args.rate,
        clipping_norm=args.clip,
        target_epsilon=args.epsilon,
        public_batch_size=args.public_batch,
        pretrain_steps=0,
        alpha=args.alpha,
        learning_rate=args.private_lr if private else args.lr,
        optimizer=args.optimizer,
        momentum=args.momentum,
        chunk_size=args.chunk,
        seed=seed,
    )


def _save(args: argparse.Namespace, out: Path, rows: list[dict]) -> None:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    with open(out / "results.json", "w") as f:
        json.dump({"config": config, "machine": platform.platform(), "rows": rows}, f, indent=1)


def _run_methods(args, out, task, train_set, make_model, evaluate, seed, rows, extra_eval=None) -> None:
    public_model = None
    public_seconds = 0.0
    order = [m for m in ("nonprivate", "public", "dp", "fdp-dpsgd", "fdp") if m in args.methods]
    if ("fdp-dpsgd" in order or "fdp" in order) and "public" not in order:
        order.insert(0, "public")
    for method in order:
        settings = _settings(args, method, seed)
        if method in ("fdp-dpsgd", "fdp"):
            if public_model is None:
                raise RuntimeError("public pre-training missing")
            model = copy.deepcopy(public_model)
        else:
            model = make_model(seed)
        _log(out, f"seed={seed} method={method} start {settings}")
        result = train(model, task, train_set, settings, evaluate=evaluate, log=lambda s: _log(out, "  " + s))
        wall = result.wall_seconds
        if method == "public":
            public_model = copy.deepcopy(model)
            public_seconds = wall
        total = wall + (public_seconds if method in ("fdp-dpsgd", "fdp") else 0.0)
        row = {
            "seed": seed,
            "method": method,
            "epsilon": result.epsilon,
            "delta": result.delta,
            "noise_multiplier": result.noise_multiplier,
            "steps": settings.steps,
            "wall_seconds": wall,
            "wall_seconds_with_pretraining": total,
            **(result.history[-1] if result.history else {}),
        }
        if extra_eval is not None:
            row.update(extra_eval(model, method, seed))
        _log(out, f"seed={seed} method={method} done {json.dumps(row)}")
        rows.append(row)
        _save(args, out, rows)


def classify(args: argparse.Namespace, out: Path) -> None:
    train_set, test_set = _data(args.downsample)
    psi = GaussianBlur(args.kernel, args.blur_sigma)
    task = ClassificationTask(psi)
    blurred_test = ImageSet(
        "blurred", psi(torch.from_numpy(np.array(test_set.x))).numpy(), test_set.y, test_set.class_names
    )

    def make_model(seed: int):
        return build_classifier(
            train_set.shape, 10, width=args.width, generator=torch.Generator().manual_seed(seed)
        )

    def evaluate(model):
        return evaluate_classifier(model, test_set)

    def extra(model, method, seed):
        return {"accuracy_on_blurred_test": evaluate_classifier(model, blurred_test)["accuracy"]}

    rows: list[dict] = []
    for seed in args.seeds:
        _run_methods(args, out, task, train_set, make_model, evaluate, seed, rows, extra)


def ddpm(args: argparse.Namespace, out: Path) -> None:
    train_set, test_set = _data(args.downsample)
    psi = GaussianBlur(args.kernel, args.blur_sigma)
    schedule = NoiseSchedule(args.diffusion_steps, args.schedule)
    task = DiffusionTask(DiffusionLoss(schedule, psi, 10))
    t0 = time.perf_counter()
    feature_net, acc = train_feature_classifier(
        test_set, epochs=args.fid_epochs, generator=torch.Generator().manual_seed(1234)
    )
    _log(
        out,
        f"FID feature classifier trained on the held-out split: accuracy on it {acc:.4f}, "
        f"{time.perf_counter() - t0:.0f} s",
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
        )

    def extra(model, method, seed):
        start = time.perf_counter()
        labels = class_rows(10, args.samples_per_class)
        images = sample(
            model,
            schedule,
            labels,
            train_set.shape,
            torch.Generator().manual_seed(10_000 + seed),
            steps=args.sample_steps,
        )
        seconds = time.perf_counter() - start
        report = fid_report(feature_net, images.numpy(), labels.numpy(), test_set)
        grid = images.view(10, args.samples_per_class, *images.shape[1:])[:, :10].reshape(
            -1, *images.shape[1:]
        )
        save_grid(grid.numpy(), out / f"samples_{method}_seed{seed}.png", nrow=10)
        return {**report.as_dict(), "sampling_seconds": seconds}

    rows: list[dict] = [
        {"reference": "real-train-vs-test", **floor.as_dict()},
        {"reference": "blurred-train-vs-test", **blur_ref.as_dict()},
    ]
    _save(args, out, rows)
    for seed in args.seeds:
        _run_methods(args, out, task, train_set, make_model, None, seed, rows, extra)


def table(out: Path) -> str:
    """Markdown table of a finished (or partial) results.json: mean ± std over seeds."""
    rows = json.loads((out / "results.json").read_text())["rows"]
    lines = []
    refs = [r for r in rows if "reference" in r]
    for r in refs:
        lines.append(f"reference {r['reference']}: FID {r['fid']:.2f}")
    runs = [r for r in rows if "method" in r]
    metric = "accuracy" if any("accuracy" in r for r in runs) else "fid"
    lines.append(f"| method | ε (upper) | σ | seeds | {metric} | wall s (own) | wall s (with pre-training) |")
    lines.append("|---|---|---|---|---|---|---|")
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        vals = np.array([r[metric] for r in mine], dtype=float)
        sigma = mine[0]["noise_multiplier"]
        sigma_text = "—" if sigma is None else f"{sigma:.3f}"
        spread = f" ± {vals.std(ddof=1):.3f}" if len(vals) > 1 else ""
        lines.append(
            f"| {method} | {mine[0]['epsilon']:.3g} | {sigma_text} | {len(mine)} | "
            f"{vals.mean():.3f}{spread} | {np.mean([r['wall_seconds'] for r in mine]):.0f} | "
            f"{np.mean([r['wall_seconds_with_pretraining'] for r in mine]):.0f} |"
        )
    if metric == "fid":
        lines.append("")
        lines.append("| method | " + " | ".join(str(c) for c in range(10)) + " |")
        lines.append("|---|" + "---|" * 10)
        for r in runs:
            per = " | ".join("—" if v is None else f"{v:.1f}" for v in r["fid_per_class"])
            lines.append(f"| {r['method']} (seed {r['seed']}) | {per} |")
    return "\n".join(lines)


def figure(outs: list[Path], path: Path) -> None:
    """Tile the sample grids of finished ``ddpm`` runs (``real.png``, ``blurred.png`` of the
    first, then every method's ``samples_<method>_seed<k>.png`` of each, labelled with its ε)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    panels = [(outs[0] / "real.png", "real digits"), (outs[0] / "blurred.png", "Ψ: blurred")]
    for out in outs:
        saved = json.loads((out / "results.json").read_text())
        rows, alpha = saved["rows"], saved["config"].get("alpha", 1.0)
        for method in METHODS:
            for r in rows:
                if r.get("method") != method or r["seed"] != rows[-1]["seed"]:
                    continue
                eps = "∞" if method == "nonprivate" else f"{r['epsilon']:.3g}"
                name = f"{method} (α = {alpha:g})" if alpha != 1 and method == "fdp" else method
                label = f"{name}, ε = {eps}\nFD {r['fid']:.1f}"
                if method in ("public", "nonprivate") and out != outs[0]:
                    continue
                panels.append((out / f"samples_{method}_seed{r['seed']}.png", label))
    cols = 4
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3 * cols, 3.3 * rows_n))
    for ax in axes.flat:
        ax.axis("off")
    for ax, (png, label) in zip(axes.flat, panels, strict=False):
        ax.imshow(mpimg.imread(png), cmap="gray")
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "task",
        choices=["classify", "ddpm", "table", "figure"],
        help="table: print results.json of --out; figure: tile the sample grids of --out (and --also)",
    )
    parser.add_argument("--also", type=Path, nargs="*", default=[], help="figure: further ddpm outputs")
    parser.add_argument("--figure", type=Path, default=None, help="figure: the PNG to write")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=256 / 4000)
    parser.add_argument("--steps", type=int, default=None, help="private steps (accounted)")
    parser.add_argument("--nonprivate-steps", type=int, default=None)
    parser.add_argument("--pretrain-steps", type=int, default=None, help="public steps (the public model)")
    parser.add_argument("--public-batch", type=int, default=256)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--private-lr", type=float, default=None)
    parser.add_argument("--optimizer", default=None, choices=["sgd", "adam"])
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--kernel", type=int, default=9)
    parser.add_argument("--blur-sigma", type=float, default=2.0)
    parser.add_argument("--width", type=int, default=32, help="classifier width")
    parser.add_argument("--base", type=int, default=32, help="U-Net base width")
    parser.add_argument("--mults", type=int, nargs="+", default=[1, 2, 2])
    parser.add_argument("--diffusion-steps", type=int, default=1000)
    parser.add_argument("--schedule", default="linear", choices=["linear", "cosine"])
    parser.add_argument("--sample-steps", type=int, default=100)
    parser.add_argument("--samples-per-class", type=int, default=100)
    parser.add_argument("--fid-epochs", type=int, default=30, help="epochs of the FID feature network")
    parser.add_argument("--downsample", type=int, default=1, help="average-pool the digits by this factor")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.task == "table":
        print(table(args.out))
        return
    if args.task == "figure":
        figure([args.out, *args.also], args.figure or args.out / "samples.png")
        return
    defaults = {
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
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    args.out.mkdir(parents=True, exist_ok=True)
    _log(args.out, f"start {vars(args)}")
    (classify if args.task == "classify" else ddpm)(args, args.out)
    _log(args.out, "done")


if __name__ == "__main__":
    main()
