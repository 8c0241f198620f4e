"""Speed of the FDP client step as the project runs it, relative to a plain step.

The FDP step is :func:`fedfdp.contribution.node_contribution` with phase
``fdp`` and the record privacy unit, exactly what a Flower client runs per
device and round: Poisson private batch (``q = 1`` by default: all 256 records;
``--poisson``: a device of 4096 records at ``q = 1/16``, one fixed draw of
about 256), its public views, per-record clipping of the private loss
``ℓ(x) − ℓ(view)`` to ``C``, and an unclipped public gradient of
``ℓ(view)`` on an independent uniform batch of 256 records (its own views).
The unit is one plain forward+backward of 256 records (mean cross-entropy, one
``autograd.grad``), timed in the same process, interleaved round by round with
the other variants. A ratio is the median over rounds of a call's time over
the plain step's time in the same round (paired, so that slow phases of a
shared machine cancel); ``ratio_of_minima`` in the JSON is the other usual
estimator.

Rows per model (all ÷ the plain step):

- ``fdp-step``: the headline, ``node_contribution`` end to end.
- ``private``: its clipped private sum alone
  (``clipped_grad_sum(model, [x, view], y, ℓ_priv, C)``, views prebuilt).
- ``public``: its public forward+backward alone (views prebuilt).
- ``views``: building one private and one public view of 256 records
  (``PublicView``: copy, padding draws, column writes).
- ``plain-2n`` / ``plain-3n``: an unclipped forward+backward of the 2·256
  rows of the private part (x and its view) / of all 3·256 rows the step
  evaluates the model on: the GEMM floors of the private part and of the whole
  step for any exact method.

``fdp-step − private − public − views`` is the rest (sampling, indexing,
streams, summing).

Models: ``mlp`` (600-300-100, Purchase100 shape: 600 binary inputs, 100
classes, 100 public columns, Gaussian padding), ``logistic`` (the project's
default: the synthetic fleet's 58 inputs, 55 public, 5 classes, zero padding),
``cnn`` (a small 1-D CNN on 6×100 sensor windows, channels 3-5 private,
Gaussian padding; the flat input is unflattened by the model so the feature
map works column-wise), ``cnn2d`` (Conv2d + GroupNorm on 1×16×16 images, the
right half private, Gaussian padding), ``embed`` (Embedding + LayerNorm over
20 categorical columns of 50 values, 5 private, zero padding: the private
columns' view is category 0). Together they cover the ghost engine's layers
(Linear, Conv1d/Conv2d, Embedding, LayerNorm/GroupNorm).

Clock: ``cpu`` (default) is the CPU time of the calling thread with torch at
one thread, as Flower's clients run (``torch.set_num_threads(1)``); robust to
other processes on a shared machine, which inflate wall-clock times. ::

    python benchmarks/step.py               # table
    python benchmarks/step.py --json        # {"fdp_step_ratio": ..., "models": {...}}

``fdp_step_ratio`` is the MLP's FDP step over its floor, ``plain-3n``: one
unclipped forward+backward, with ``reduction="sum"``, of the 3·256 rows the step
evaluates the model on (the private batch, its views and the public batch's views),
paired round by round (target ≤ 1.3). The JSON names it (``floor``). It is a floor
for the model's GEMMs only: the step must also return two separate sums (the
clipped private one over 2·256 rows and the public one over 256, so two
weight-gradient GEMMs per layer where the floor has one), and draw the Gaussian
padding of its views; ``two_sums_ratio`` is the step over ``plain-2n + plain``
(the same two sums unclipped, without the views), paired per round, for that
reading. The step over a plain forward+backward of 256 records is kept beside it
as ``fdp_step_ratio_vs_plain``; every model reports all three (``floor_ratio``,
``two_sums_ratio`` and ``ratio["fdp-step"]``).

``--proposed-view-fix`` measures a what-if: the change to ``fedfdp/features.py``
proposed in docs/performance.md (column positions computed once per
``FeatureSpec`` instead of one ``tuple.index`` per column on every call;
``index_copy_`` instead of an advanced-index assignment), patched in for this
process only, after checking that it builds the same views bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.timing import Clock, interleaved_samples, malloc_env_set, pick_clock, quartiles
from fedfdp.clipping import clipped_grad_sum
from fedfdp.contribution import ClientParts, DeviceTask, RoundSettings, node_contribution
from fedfdp.entropy import SeededEntropy
from fedfdp.features import FeatureSpec, PublicView
from fedfdp.losses import FeatureMap
from fedfdp.models import build_model
from fedfdp.modes import PHASES, Mode
from fedfdp.sampling import PublicStreams, poisson_sample, uniform_sample

BATCH = 256
#: What ``fdp_step_ratio`` divides by (module docstring).
FLOOR = ("plain-3n: one unclipped forward+backward (cross-entropy, reduction='sum', one autograd.grad) of "
         "the 3·256 rows the step evaluates the model on (private batch, its views, the public batch's "
         "views), timed in the same round")
TARGET = 1.3


@dataclass
class Case:
    name: str
    model: nn.Module
    decomposition: FeatureMap
    x: np.ndarray  # the device's records (float32)
    y: np.ndarray
    rate: float  # Poisson rate of the private batch


def _spec(n_cols: int, public: np.ndarray) -> FeatureSpec:
    cols = tuple(f"c{i:03d}" for i in range(n_cols))
    pub = set(int(i) for i in public)
    return FeatureSpec(
        cols, tuple(cols[i] for i in sorted(pub)), tuple(c for i, c in enumerate(cols) if i not in pub)
    )


def make_cases(records: int, rate: float, seed: int, names: list[str]) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = []
    if "mlp" in names:
        # Purchase100 shape: 600 binary purchase flags (sparse), 100 public at random.
        x = (rng.random((records, 600)) < 0.15).astype(np.float32)
        spec = _spec(600, rng.choice(600, 100, replace=False))
        model = build_model("mlp", 600, 100, hidden_sizes=(300,), seed=seed)
        dec = FeatureMap(PublicView(spec, "gaussian"))
        cases.append(Case("mlp-600-300-100", model, dec, x, rng.integers(0, 100, records), rate))
    if "logistic" in names:
        # the synthetic fleet's shape: 55 public readings, 3 private, 5 classes
        x = rng.normal(size=(records, 58)).astype(np.float32)
        spec = _spec(58, np.arange(55))
        model = build_model("logistic", 58, 5, seed=seed)
        dec = FeatureMap(PublicView(spec, "zero"))
        cases.append(Case("logistic-58-5", model, dec, x, rng.integers(0, 5, records), rate))
    if "cnn" in names:
        # 6 sensor channels x 100 steps, flattened channel-major; channels 3-5 private
        x = rng.normal(size=(records, 600)).astype(np.float32)
        spec = _spec(600, np.arange(300))
        gen = torch.Generator().manual_seed(seed)
        model = nn.Sequential(
            nn.Unflatten(1, (6, 100)),
            nn.Conv1d(6, 32, 5),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(32, 64, 5),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
            nn.Linear(64, 6),
        )
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-0.1, 0.1, generator=gen)
        dec = FeatureMap(PublicView(spec, "gaussian"))
        cases.append(Case("cnn1d-6x100", model, dec, x, rng.integers(0, 6, records), rate))
    if "cnn2d" in names:
        # 1x16x16 images flattened row-major; the right half of every row private
        x = rng.normal(size=(records, 256)).astype(np.float32)
        spec = _spec(256, np.array([r * 16 + c for r in range(16) for c in range(8)]))
        gen = torch.Generator().manual_seed(seed)
        model = nn.Sequential(
            nn.Unflatten(1, (1, 16, 16)),
            nn.Conv2d(1, 16, 3, padding=1),
            nn.GroupNorm(4, 16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.GroupNorm(4, 32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-0.1, 0.1, generator=gen)
        dec = FeatureMap(PublicView(spec, "gaussian"))
        cases.append(Case("cnn2d-gn-16x16", model, dec, x, rng.integers(0, 10, records), rate))
    if "embed" in names:
        # 20 categorical columns of 50 values (as float codes), the last 5 private
        x = rng.integers(0, 50, size=(records, 20)).astype(np.float32)
        spec = _spec(20, np.arange(15))
        gen = torch.Generator().manual_seed(seed)
        model = nn.Sequential(
            _Codes(),
            nn.Embedding(50, 16),
            nn.LayerNorm(16),
            nn.Flatten(),
            nn.Linear(20 * 16, 64),
            nn.ReLU(),
            nn.Linear(64, 5),
        )
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-0.1, 0.1, generator=gen)
        dec = FeatureMap(PublicView(spec, "zero"))
        cases.append(Case("embed-ln-20x50", model, dec, x, rng.integers(0, 5, records), rate))
    return cases


class _Codes(nn.Module):
    """Float category codes to the indices an Embedding takes (no parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.long()


def apply_proposed_view_fix(cases: list[Case]) -> None:
    """Patch the proposed ``fedfdp/features.py`` change into this process (what-if)."""
    import fedfdp.features as features

    def built(case: Case) -> torch.Tensor:
        view = case.decomposition.view
        if view is None:
            raise RuntimeError(f"{case.name}: its feature map has no public view")
        return view(torch.as_tensor(case.x), torch.Generator().manual_seed(1))

    before = [built(c) for c in cases]

    def index(spec: FeatureSpec, which: str) -> torch.Tensor:
        cache = spec.__dict__.setdefault("_bench_index", {})
        if which not in cache:
            pos = {c: i for i, c in enumerate(spec.columns)}
            cache[which] = torch.tensor([pos[c] for c in getattr(spec, which)], dtype=torch.long)
        return cache[which]

    def view(self: PublicView, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        out = x.clone()
        idx = index(self.spec, "private").to(x.device)
        if self.method == "gaussian":
            if generator is None:
                raise ValueError("public-loss='gaussian': an explicit torch.Generator is required")
            shape = (x.shape[0], len(idx))
            out.index_copy_(1, idx, torch.randn(shape, generator=generator, dtype=x.dtype, device=x.device))
        elif self.method == "zero":
            out.index_fill_(1, idx, 0.0)
        else:
            assert self.statistics is not None
            values = torch.tensor(self.statistics.values, dtype=x.dtype, device=x.device)
            out.index_copy_(1, idx, values.expand(x.shape[0], -1).contiguous())
        return out

    features.PublicView.__call__ = view  # type: ignore[method-assign]
    after = [built(c) for c in cases]
    if not all(torch.equal(a, b) for a, b in zip(before, after, strict=True)):
        raise RuntimeError("the proposed view construction differs from fedfdp.features")


CLOCK: Clock = time.thread_time


def time_interleaved(fns: dict[str, Callable[[], object]], seconds: float) -> dict[str, list[float]]:
    """Per-call times (by ``CLOCK``) of each function, calling them round-robin."""
    return interleaved_samples(fns, seconds, CLOCK, min_rounds=9, max_rounds=400)


def bench(case: Case, seconds: float, max_norm: float) -> dict[str, object]:
    model, dec = case.model, case.decomposition
    phase = PHASES[Mode.FDP]
    params = [p for p in model.parameters() if p.requires_grad]
    xt = torch.as_tensor(case.x)
    yt = torch.as_tensor(case.y, dtype=torch.long)
    x0, y0 = xt[:BATCH], yt[:BATCH]

    # fixed draws (seeded secrets): the same batches every call
    secrets = SeededEntropy(0)
    parts = ClientParts(secrets=secrets)
    settings = RoundSettings(round=1, attempt=0, phase=phase, sampling_rate=case.rate, clipping_norm=max_norm)
    task = DeviceTask(0, case.x, case.y, True, BATCH)
    s, pub_s = secrets.device(1, 0, 0), PublicStreams.for_device(0, 1, 0)
    priv_idx = torch.as_tensor(poisson_sample(len(case.y), case.rate, s.coins))
    pub_idx = torch.as_tensor(uniform_sample(len(case.y), BATCH, pub_s.sample))
    private_inputs = dec.private_inputs(xt[priv_idx], s.padding)
    public_inputs = dec.public_inputs(xt[pub_idx], pub_s.padding)
    y_priv, y_pub = yt[priv_idx], yt[pub_idx]
    x2, y2 = torch.cat(private_inputs), torch.cat([y_priv, y_priv])
    x3, y3 = torch.cat([*private_inputs, *public_inputs]), torch.cat([y_priv, y_priv, y_pub])

    def plain() -> object:
        return torch.autograd.grad(F.cross_entropy(model(x0), y0), params)

    def fdp_step() -> object:
        return node_contribution(model, dec, settings, [task], parts)

    def private() -> object:
        return clipped_grad_sum(model, private_inputs, y_priv, dec.private_loss, max_norm)

    def public() -> object:
        losses = dec.public_loss([model(u) for u in public_inputs], y_pub)
        return torch.autograd.grad(losses.sum(), params)

    def views() -> object:
        st, pt = secrets.device(1, 0, 0), PublicStreams.for_device(0, 1, 0)
        return dec.private_inputs(x0, st.padding), dec.public_inputs(x0, pt.padding)

    def plain_2n() -> object:
        return torch.autograd.grad(F.cross_entropy(model(x2), y2, reduction="sum"), params)

    def plain_3n() -> object:
        return torch.autograd.grad(F.cross_entropy(model(x3), y3, reduction="sum"), params)

    fns = {
        "plain": plain,
        "fdp-step": fdp_step,
        "private": private,
        "public": public,
        "views": views,
        "plain-2n": plain_2n,
        "plain-3n": plain_3n,
    }
    samples = time_interleaved(fns, seconds)
    med = {k: statistics.median(v) for k, v in samples.items()}
    # Paired ratios: each call over the plain step of the same round, so that
    # slow phases of a shared machine cancel; the median over rounds.
    paired = {
        k: sorted(t / p for t, p in zip(v, samples["plain"], strict=True))
        for k, v in samples.items()
        if k != "plain"
    }

    floor = sorted(t / p for t, p in zip(samples["fdp-step"], samples["plain-3n"], strict=True))
    two_sums = sorted(t / (p2 + p1) for t, p2, p1 in zip(samples["fdp-step"], samples["plain-2n"],
                                                         samples["plain"], strict=True))
    return {
        "model": case.name,
        "private_records": len(priv_idx),
        "public_records": BATCH,
        "plain_ms": 1e3 * med["plain"],
        "rounds": len(samples["plain"]),
        "ms": {k: 1e3 * v for k, v in med.items()},
        "ratio": {k: statistics.median(v) for k, v in paired.items()},
        "ratio_quartiles": {k: quartiles(v) for k, v in paired.items()},
        "ratio_of_minima": {k: min(v) / min(samples["plain"]) for k, v in samples.items() if k != "plain"},
        # the step over its floor (all 3·256 rows, unclipped, one sum), paired per round
        "floor_ratio": statistics.median(floor),
        "floor_ratio_quartiles": quartiles(floor),
        # the step over the same two sums unclipped (plain-2n + plain), paired per round
        "two_sums_ratio": statistics.median(two_sums),
        "two_sums_ratio_quartiles": quartiles(two_sums),
        "clipping_method": private().method,  # type: ignore[attr-defined]
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--models", default="mlp,logistic,cnn,cnn2d,embed",
                        help="comma-separated: mlp,logistic,cnn,cnn2d,embed")
    parser.add_argument(
        "--poisson", action="store_true", help="4096 records at q=1/16 (fixed draw) instead of q=1"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="time budget per model")
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (cpu clock needs 1)")
    parser.add_argument(
        "--proposed-view-fix", action="store_true", help="what-if: patch in the proposed features.py change"
    )
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = pick_clock(parser, args.clock, args.threads)
    records, rate = (4096, 1 / 16) if args.poisson else (BATCH, 1.0)
    names = args.models.split(",")
    cases = make_cases(records, rate, args.seed, names)
    if args.proposed_view_fix:
        apply_proposed_view_fix(cases)
    results = [bench(c, args.seconds, args.max_norm) for c in cases]
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "machine": platform.machine(),
        "malloc_env": malloc_env_set(),
        "private_sampling": "q=1/16 of 4096 (fixed draw)" if args.poisson else "q=1 of 256",
        "max_norm": args.max_norm,
        "proposed_view_fix": args.proposed_view_fix,
    }
    out: dict[str, object] = {"env": env, "models": {r["model"]: r for r in results}}
    mlp = next((r for r in results if str(r["model"]).startswith("mlp")), None)
    if mlp is not None:
        out["fdp_step_ratio"] = mlp["floor_ratio"]
        out["fdp_step_ratio_quartiles"] = mlp["floor_ratio_quartiles"]
        out["floor"] = FLOOR
        out["target"] = TARGET
        out["two_sums_ratio"] = mlp["two_sums_ratio"]
        out["fdp_step_ratio_vs_plain"] = mlp["ratio"]["fdp-step"]  # type: ignore[index]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"torch {env['torch']}, {env['threads']} thread(s), clock {env['clock']}, malloc env "
        f"{'set' if env['malloc_env'] else 'not set'}, private batch {env['private_sampling']}, "
        f"C={args.max_norm}, load {env['load_avg_1m']:.1f} on {env['cpu_count']} cores"
        + (", WHAT-IF: proposed features.py view fix patched in" if args.proposed_view_fix else "")
    )
    cols = ["fdp-step", "private", "public", "views", "plain-2n", "plain-3n"]
    head = (
        f"{'model':<18}{'priv':>6}{'plain ms':>10}" + "".join(f"{c:>11}" for c in cols) + f"{'step IQR':>14}"
        + f"{'÷ floor':>9}{'floor IQR':>12}{'÷ 2 sums':>10}  clipping"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        ratio, q = r["ratio"], r["ratio_quartiles"]["fdp-step"]  # type: ignore[index]
        fq: Any = r["floor_ratio_quartiles"]
        print(
            f"{r['model']:<18}{r['private_records']:>6}{r['plain_ms']:>10.3f}"
            + "".join(f"{ratio[c]:>10.2f}x" for c in cols)  # type: ignore[index]
            + f"{q[0]:>8.2f}-{q[1]:.2f}"
            + f"{r['floor_ratio']:>8.2f}x{fq[0]:>7.2f}-{fq[1]:.2f}"
            + f"{r['two_sums_ratio']:>9.2f}x  {r['clipping_method']}"
        )
    if "fdp_step_ratio" in out:
        print(f"\nfdp_step_ratio (MLP, ÷ the 3·256-row floor plain-3n) = {out['fdp_step_ratio']:.2f} "
              f"(target <= {TARGET}); ÷ the two sums unclipped (plain-2n + plain) = "
              f"{out['two_sums_ratio']:.2f}; ÷ a plain step of 256 records = "
              f"{out['fdp_step_ratio_vs_plain']:.2f}")


if __name__ == "__main__":
    main()
