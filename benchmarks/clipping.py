"""Speed of per-record clipping (fedfdp.clipping) relative to a plain step.

For each model, the unit is one plain forward+backward of ``--batch`` records
with mean cross-entropy, measured in the same process. Reported ratios:

- ``ghost`` / ``ghost-2pass`` / ``vmap``: ``clipped_grad_sum`` on ``--batch``
  private records with K=2 inputs (x and its public view) and the FDP loss
  ``ce(model(x), y) - ce(model(v), y)``. ``ghost-2pass`` is the ghost engine
  with a second backward of ``Σ c_i L_i`` instead of book-keeping.
- ``ghost-k1``: ghost clipping of the full loss with one input per record
  (the ``dp`` mode).
- ``fdp-step``: ghost clipped sum above plus an ordinary public
  forward+backward of ``--batch`` public views (Algorithm 1, steps 2-4 of one
  client): the project target is <= 2.5.
- ``loop``: one backward per record, on ``--loop-batch`` records, relative to a
  plain step on ``--loop-batch`` records.
- ``opacus-ghost-k1``: Opacus' ghost clipping (``GradSampleModuleFastGradientClipping``
  with ``use_ghost_clipping=True``, ``DPLossFastGradientClipping``, sum reduction, no
  noise) of the same full loss with one input per record as ``ghost-k1``: forward,
  its two backward passes, the clipped sum left in ``.grad`` (checked equal to
  ``ghost-k1``'s to ``rtol = 1e-4`` first; ``opacus_agrees`` in the JSON). Present only
  where ``opacus`` imports (it is not a dependency of the project). Opacus has no
  form of the FDP loss's two inputs per record, so the comparison is the ``dp`` mode's.

Timings interleave the methods round by round and report the median. Run with
``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296`` in the
environment to avoid glibc's allocator overhead on per-record paths::

    python benchmarks/clipping.py            # table
    python benchmarks/clipping.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.timing import Clock, interleaved_samples, malloc_env_set, pick_clock
from fedfdp.clipping import clipped_grad_sum
from fedfdp.clipping.common import Batch
from fedfdp.clipping.ghost import ghost_clipped_sum


@dataclass
class Case:
    """A model with private inputs, their public views and public-batch views."""

    name: str
    model: nn.Module
    x: torch.Tensor
    view: torch.Tensor
    y: torch.Tensor
    public_view: torch.Tensor
    public_y: torch.Tensor


@dataclass
class Row:
    case: str
    method: str
    batch: int
    ms: float
    plain_ms: float
    ratio: float


def fdp_loss(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """ℓ_priv = ce(model(x), y) − ce(model(v), y), per record."""
    return F.cross_entropy(outputs[0], y, reduction="none") - F.cross_entropy(outputs[1], y, reduction="none")


def ce_loss(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """Full loss, one input per record (the ``dp`` mode)."""
    return F.cross_entropy(outputs[0], y, reduction="none")


def make_cases(n: int, seed: int) -> list[Case]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # parameter initialisation only (benchmark, not library code)

    def gaussian_pad(x: torch.Tensor, private: slice) -> torch.Tensor:
        v = x.clone()
        v[:, private] = torch.randn(v[:, private].shape, generator=gen)
        return v

    cases = []
    # Purchase100-like: 600 binary features, the first 100 public, 100 classes.
    mlp = nn.Sequential(nn.Linear(600, 300), nn.ReLU(), nn.Linear(300, 100))
    x = (torch.rand(n, 600, generator=gen) < 0.3).float()
    xp = (torch.rand(n, 600, generator=gen) < 0.3).float()
    cases.append(
        Case(
            "mlp-600-300-100",
            mlp,
            x,
            gaussian_pad(x, slice(100, None)),
            torch.randint(0, 100, (n,), generator=gen),
            gaussian_pad(xp, slice(100, None)),
            torch.randint(0, 100, (n,), generator=gen),
        )
    )
    # Sensor windows: 6 channels x 100 steps, channels 3-5 private, 6 classes.
    cnn = nn.Sequential(
        nn.Conv1d(6, 32, 5),
        nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Conv1d(32, 64, 5),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(64, 6),
    )
    x = torch.randn(n, 6, 100, generator=gen)
    xp = torch.randn(n, 6, 100, generator=gen)
    cases.append(
        Case(
            "cnn1d-6x100",
            cnn,
            x,
            gaussian_pad(x, slice(3, None)),
            torch.randint(0, 6, (n,), generator=gen),
            gaussian_pad(xp, slice(3, None)),
            torch.randint(0, 6, (n,), generator=gen),
        )
    )
    # Logistic regression: 20 features (10 private), 2 classes.
    logreg = nn.Linear(20, 2)
    x = torch.randn(n, 20, generator=gen)
    xp = torch.randn(n, 20, generator=gen)
    cases.append(
        Case(
            "logreg-20",
            logreg,
            x,
            gaussian_pad(x, slice(10, None)),
            torch.randint(0, 2, (n,), generator=gen),
            gaussian_pad(xp, slice(10, None)),
            torch.randint(0, 2, (n,), generator=gen),
        )
    )
    return cases


CLOCK: Clock = time.perf_counter


def time_interleaved(fns: dict[str, Callable[[], object]], seconds: float) -> dict[str, float]:
    """Median seconds per call (by ``CLOCK``), calling the functions round-robin."""
    samples = interleaved_samples(fns, seconds, CLOCK, min_rounds=7, max_rounds=500)
    return {k: statistics.median(v) for k, v in samples.items()}


#: Whether Opacus' clipped sum equals ``ghost-k1``'s, by case (cases where it ran).
AGREES: dict[str, bool] = {}


def opacus_ghost_k1(case: Case, c: float) -> Callable[[], list[torch.Tensor]] | None:
    """One call of Opacus' ghost clipping of the full loss on a copy of ``case.model``
    (the clipped sum of per-record gradients, no noise); None without ``opacus``.
    """
    try:
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
    except ImportError:
        return None
    import copy

    gsm = GradSampleModuleFastGradientClipping(copy.deepcopy(case.model), max_grad_norm=c,
                                               use_ghost_clipping=True, loss_reduction="sum")
    params = [p for p in gsm.parameters() if p.requires_grad]
    opt = DPOptimizerFastGradientClipping(torch.optim.SGD(params, lr=0.0), noise_multiplier=0.0,
                                          max_grad_norm=c, expected_batch_size=len(case.y),
                                          loss_reduction="sum")
    criterion = DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss(reduction="sum"),
                                           loss_reduction="sum")

    def call() -> list[torch.Tensor]:
        opt.zero_grad(set_to_none=True)
        criterion(gsm(case.x), case.y).backward()
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]

    return call


def bench_case(case: Case, args: argparse.Namespace) -> list[Row]:
    model = case.model
    params = [p for p in model.parameters() if p.requires_grad]
    n = case.x.shape[0]
    c = args.max_norm

    def plain(x: torch.Tensor = case.x, y: torch.Tensor = case.y) -> object:
        loss = F.cross_entropy(model(x), y)
        return torch.autograd.grad(loss, params)

    def private(method: str) -> Callable[[], object]:
        return lambda: clipped_grad_sum(model, [case.x, case.view], case.y, fdp_loss, c, method)

    def ghost_2pass() -> object:
        with torch.enable_grad():
            batch = Batch(model, [case.x, case.view], case.y, fdp_loss, params)
            return ghost_clipped_sum(batch, c, bookkeeping=False)

    def fdp_step() -> object:
        s = clipped_grad_sum(model, [case.x, case.view], case.y, fdp_loss, c, "ghost")
        loss = F.cross_entropy(model(case.public_view), case.public_y, reduction="sum")
        return s, torch.autograd.grad(loss, params)

    def ghost_k1() -> object:
        return clipped_grad_sum(model, [case.x], case.y, ce_loss, c, "ghost")

    fns: dict[str, Callable[[], object]] = {
        "plain": plain,
        "ghost-k1": ghost_k1,
        "ghost": private("ghost"),
        "ghost-2pass": ghost_2pass,
        "fdp-step": fdp_step,
    }
    opacus = opacus_ghost_k1(case, c)
    if opacus is not None:
        ours = clipped_grad_sum(model, [case.x], case.y, ce_loss, c, "ghost").grads
        theirs = opacus()
        AGREES[case.name] = all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(ours, theirs,
                                                                                             strict=True))
        fns["opacus-ghost-k1"] = opacus
    times = time_interleaved(fns, args.seconds)
    rows = [
        Row(case.name, k, n, 1e3 * t, 1e3 * times["plain"], t / times["plain"])
        for k, t in times.items()
        if k != "plain"
    ]
    if not args.skip_vmap:
        vt = time_interleaved({"plain": plain, "vmap": private("vmap")}, args.seconds)
        rows.append(Row(case.name, "vmap", n, 1e3 * vt["vmap"], 1e3 * vt["plain"], vt["vmap"] / vt["plain"]))
    m = min(args.loop_batch, n)
    xs, vs, ys = case.x[:m], case.view[:m], case.y[:m]
    lt = time_interleaved(
        {
            "plain": lambda: plain(xs, ys),
            "loop": lambda: clipped_grad_sum(model, [xs, vs], ys, fdp_loss, c, "loop"),
        },
        args.seconds / 2,
    )
    rows.append(Row(case.name, "loop", m, 1e3 * lt["loop"], 1e3 * lt["plain"], lt["loop"] / lt["plain"]))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--loop-batch", type=int, default=32)
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per timing group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-vmap", action="store_true")
    parser.add_argument("--cases", default="", help="comma-separated case-name prefixes")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: CPU time of the calling thread (needs --threads 1); robust to other "
        "processes competing for the cores",
    )
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = pick_clock(parser, args.clock, args.threads)

    cases = make_cases(args.batch, args.seed)
    if args.cases:
        wanted = args.cases.split(",")
        cases = [c for c in cases if any(c.name.startswith(w) for w in wanted)]
    rows = [row for case in cases for row in bench_case(case, args)]
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "malloc_env": malloc_env_set(),
        "max_norm": args.max_norm,
        "clock": args.clock,
    }
    if args.json:
        print(json.dumps({"env": env, "rows": [asdict(r) for r in rows], "opacus_agrees": AGREES}, indent=2))
        return
    print(
        f"torch {env['torch']}, {env['threads']} threads, malloc env "
        f"{'set' if env['malloc_env'] else 'NOT set'}, C={args.max_norm}, clock {args.clock}"
    )
    print(f"{'case':<18} {'method':<16} {'batch':>5} {'ms':>9} {'plain ms':>9} {'ratio':>7}")
    for r in rows:
        print(f"{r.case:<18} {r.method:<16} {r.batch:>5} {r.ms:>9.3f} {r.plain_ms:>9.3f} {r.ratio:>7.2f}")
    if AGREES:
        print("opacus-ghost-k1 equals ghost-k1 (rtol 1e-4): "
              + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in AGREES.items()))


if __name__ == "__main__":
    main()
