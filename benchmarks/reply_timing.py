"""Does a secure-aggregation node's reply time depend on its secret batch or noise?

Two measurements (a benchmark, not a test: ratios and correlations within one run).

``collect``: the collect stage's data-dependent work, timed per call — the node's
contribution (:func:`fedfdp.contribution.node_contribution`: Poisson batch, per-record
clipped private sum with the FDP views) and the party's noisy encoding
(:func:`fedfdp.secagg.party.noisy_contribution`: the exact discrete Gaussian, the
rounding, mod 2³²). The masking that follows is the same work whatever the data (one
AES-CTR keystream per neighbour) and is left out. The realised batch size ``|B|`` is
set through the seam a normal run uses (``ClientParts.batches``: a sampler that draws
exactly ``k`` records while the public rate ``q`` stays the run's), swept over
``0 .. slots`` (``slots``: the Poisson batch's 1 − 2⁻⁸⁰ quantile at the node's ``n``
and ``q``), each size ``--reps`` times in a shuffled order. Reported: Pearson ``r`` of
time with ``|B|`` (95 % CI, Fisher z) and the least-squares slope in ms per record
(95 % CI, t).

``sampler``: :func:`fedfdp.secagg.noise.sample_discrete_gaussian` alone, per call,
against the magnitude of what it drew — one draw per call (``d = 1``: vs ``|x|/σ``) and
``d = 10⁴`` per call (vs the mean ``|x|/σ`` of the call): its time, and its work as
the number of keystream words it drew (exact, immune to the machine's noise).

Both clocks are recorded: ``cpu`` (the thread's CPU time, robust to the other
processes of a shared machine) and ``wall`` (``perf_counter``: what the server sees,
noisier). Run on the code of any commit — before and after a change — with the same
script (it adapts to the absence of ``BatchShape``)::

    python benchmarks/reply_timing.py --json after.json
    git worktree add /tmp/base <commit>
    PYTHONPATH=/tmp/base python benchmarks/reply_timing.py --json before.json
    git worktree remove /tmp/base
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from scipy import stats


def pearson_and_slope(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Pearson ``r`` (95 % CI by Fisher's z) and the OLS slope of ``y`` on ``x`` (95 % CI)."""
    n = len(x)
    if np.ptp(np.asarray(y, dtype=float)) == 0:  # the same every time: no slope to fit
        return {"n": n, "r": 0.0, "r_lo": 0.0, "r_hi": 0.0, "p": 1.0, "slope": 0.0, "slope_lo": 0.0,
                "slope_hi": 0.0, "mean": float(y[0]), "constant": True}
    fit = stats.linregress(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    r = float(fit.rvalue)
    z, se_z = math.atanh(max(min(r, 0.999999), -0.999999)), 1.0 / math.sqrt(n - 3)
    tq = float(stats.t.ppf(0.975, n - 2))
    return {"n": n, "r": r, "r_lo": math.tanh(z - 1.96 * se_z), "r_hi": math.tanh(z + 1.96 * se_z),
            "p": float(fit.pvalue), "slope": float(fit.slope), "slope_lo": float(fit.slope - tq * fit.stderr),
            "slope_hi": float(fit.slope + tq * fit.stderr), "mean": float(np.mean(y))}


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """``(cpu ms, wall ms, result)`` of one call."""
    c0, w0 = time.thread_time(), time.perf_counter()
    out = fn()
    return (time.thread_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3, out


def collect(reps: int, records: int, rate: float, points: int, public: bool) -> dict[str, Any]:
    from fedfdp.config import load_config
    from fedfdp.contribution import ClientParts, DeviceTask, RoundSettings, node_contribution
    from fedfdp.data import load_dataset
    from fedfdp.modes import PHASES
    from fedfdp.run_plan import build_node_plan
    from fedfdp.secagg.party import noisy_contribution
    from fedfdp.secagg.plan import local_sigma_for

    torch.set_num_threads(1)
    cfg = load_config({"model": "mlp", "num-devices": 1, "records-per-device": records, "sampling-rate": rate,
                       "progress": False})
    data = load_dataset(cfg.data)
    plan = build_node_plan(cfg, data)
    dev = data.devices[0]
    n = len(dev.y)
    slots = int(n * rate)
    while stats.binom.sf(slots, n, rate) > 2.0**-80:  # the 1 - 2⁻⁸⁰ quantile (scipy, not fedfdp's bound)
        slots += 1
    sizes = sorted({round(float(v)) for v in np.linspace(0, slots, points)})
    d = sum(p.numel() for p in plan.model.parameters() if p.requires_grad)
    scale = 2.0 ** math.ceil(math.log2(1000 * math.sqrt(d)))
    sigma = local_sigma_for(1.0, scale, d, 3)
    task = DeviceTask(0, dev.x, dev.y, True, 0)
    phase = next(v for k, v in PHASES.items() if str(getattr(k, "value", k)) == "fdp")
    rng = np.random.default_rng(0)
    k_now = [0]

    def exactly_k(n: int, rate: float, public_count: int, secrets: Any, public: Any) -> tuple[Any, Any]:
        return np.sort(rng.choice(n, size=k_now[0], replace=False)), np.empty(0, dtype=np.int64)

    extra: dict[str, Any] = {}
    if public:
        from fedfdp.contribution import BatchShape
        extra["shape"] = BatchShape.PUBLIC
    parts = ClientParts(batches=exactly_k, **extra)
    state = {k: v.clone() for k, v in plan.model.state_dict().items()}
    round_no = [0]

    def one() -> np.ndarray:
        round_no[0] += 1
        plan.model.load_state_dict(state)
        settings = RoundSettings(round=round_no[0], attempt=0, phase=phase, sampling_rate=rate,
                                 clipping_norm=1.0)
        out = node_contribution(plan.model, plan.feature_map, settings, [task], parts)
        assert out.private_sum is not None
        x = torch.cat([g.reshape(-1) for g in out.private_sum]).double().numpy()
        return noisy_contribution(x, clip=1.0, scale=scale, local_sigma=sigma)

    for k in sizes:  # warm-up
        k_now[0] = k
        one()
    order = [k for k in sizes for _ in range(reps)]
    random.Random(1).shuffle(order)
    ks, cpu, wall = [], [], []
    for k in order:
        k_now[0] = k
        c, w, _ = timed(one)
        ks.append(k)
        cpu.append(c)
        wall.append(w)
    return {"records": n, "rate": rate, "slots": slots, "sizes": sizes, "dimension": d, "local_sigma": sigma,
            "public_shape": public, "cpu": pearson_and_slope(ks, cpu), "wall": pearson_and_slope(ks, wall),
            "cpu_ms_by_size": {str(k): float(np.median([c for kk, c in zip(ks, cpu, strict=True) if kk == k]))
                               for k in sizes}}


def sampler(reps_one: int, reps_many: int, sigmas: list[float]) -> dict[str, Any]:
    from fedfdp.entropy import OSBits
    from fedfdp.secagg.keystream import Keystream
    from fedfdp.secagg.noise import sample_discrete_gaussian

    out: dict[str, Any] = {}
    for sigma in sigmas:
        s2 = sigma * sigma
        for _ in range(20):
            sample_discrete_gaussian(s2, 1)
        for size, reps, unit, scale in ((1, reps_one, "µs", 1e3), (10_000, reps_many, "ms", 1.0)):
            mags, cpu, wall, words = [], [], [], []
            for _ in range(reps):
                keys = Keystream(OSBits())  # keyed by the OS CSPRNG, counting its words
                c, w, x = timed(lambda: sample_discrete_gaussian(s2, size, keys))  # noqa: B023
                mags.append(float(np.abs(x).mean()) / sigma)
                cpu.append(c * scale)
                wall.append(w * scale)
                words.append(float(keys.generated))
            out[f"sigma={sigma:g}/d={size:g}"] = {
                "unit": f"{unit} per mean |x|/σ", "cpu": pearson_and_slope(mags, cpu),
                "wall": pearson_and_slope(mags, wall), "words": pearson_and_slope(mags, words)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("collect", "sampler", "all"), default="all")
    ap.add_argument("--reps", type=int, default=15, help="calls per batch size (collect)")
    ap.add_argument("--records", type=int, default=3000, help="records-per-device of the node's one device")
    ap.add_argument("--rate", type=float, default=0.05, help="the public sampling rate q")
    ap.add_argument("--points", type=int, default=9, help="batch sizes swept in 0..slots")
    ap.add_argument("--shape", choices=("auto", "realised", "public"), default="auto",
                    help="auto: public when the code has BatchShape (after the change)")
    ap.add_argument("--sampler-reps", type=int, default=2000, help="sampler: calls of one draw")
    ap.add_argument("--sampler-calls", type=int, default=1000, help="sampler: calls of 10⁴ draws")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    try:
        import fedfdp.contribution as contribution
        has_shape = hasattr(contribution, "BatchShape")
    except ImportError:  # pragma: no cover
        has_shape = False
    public = args.shape == "public" or (args.shape == "auto" and has_shape)
    import fedfdp
    result: dict[str, Any] = {"fedfdp": str(fedfdp.__file__)}
    if args.part in ("collect", "all"):
        result["collect"] = collect(args.reps, args.records, args.rate, args.points, public)
        c = result["collect"]
        for clock in ("cpu", "wall"):
            s = c[clock]
            lo, hi = s["slope_lo"] * 1e3, s["slope_hi"] * 1e3
            print(f"collect {clock:4s}: r = {s['r']:+.3f} [{s['r_lo']:+.3f}, {s['r_hi']:+.3f}], slope "
                  f"{s['slope'] * 1e3:+.2f} µs/record [{lo:+.2f}, {hi:+.2f}], mean {s['mean']:.1f} ms "
                  f"(|B| 0..{c['sizes'][-1]}, n = {c['records']}, public shape: {c['public_shape']})")
    if args.part in ("sampler", "all"):
        result["sampler"] = sampler(args.sampler_reps, args.sampler_calls, [4.0, 1000.0])
        for name, v in result["sampler"].items():
            for what in ("cpu", "words"):
                s = v[what]
                unit = v["unit"] if what == "cpu" else "words per mean |x|/σ"
                if s.get("constant"):
                    print(f"sampler {name} {what}: the same every call ({s['mean']:.0f})")
                    continue
                print(f"sampler {name} {what}: r = {s['r']:+.3f} [{s['r_lo']:+.3f}, {s['r_hi']:+.3f}], slope "
                      f"{s['slope']:+.3g} {unit} [{s['slope_lo']:+.3g}, {s['slope_hi']:+.3g}], "
                      f"mean {s['mean']:.4g}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
