"""Speed and precision of the FDP accountant (fedfdp.accounting).

Headline: epsilon of 10,000 composed rounds (``q = 1/16``, ``sigma = 0.8``,
``delta = 1e-5``, add/remove) from a fresh accountant.  ``accounting_seconds_10k`` is
the first such call in this process (cold: nothing cached, FFT plans not built),
measured once; the median of further calls (each on a fresh accountant with the
module's caches cleared) is reported next to it.  The reference is Google's
dp-accounting PLD accountant (``value_discretization_interval = 1e-4``), timed the
same way; ``--with-prv`` also times prv-accountant 0.2.0 itself (slow).

Other rows: a few ledgers (one with participation ``p < 1``, referenced by the
binomial mixture of dp-accounting's k-fold PLDs from ``tests/references.py``),
replacement, calibration, the trade-off curve, and the formerly pathological
inputs (bounded memory and time).

Last, the time limits ``tests/test_accounting.py`` used to assert (the tests now
check correctness only): each case's seconds, the former limit and their ratio
(above 1: slower than the tests once allowed)::

    python benchmarks/accounting.py            # table
    python benchmarks/accounting.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedfdp import accounting as acc_mod
from fedfdp.accounting import FDPAccountant, composition, prv

HEADLINE: dict[str, Any] = {"noise_multiplier": 0.8, "sampling_rate": 1 / 16, "rounds": 10_000, "delta": 1e-5}


def _clear_caches() -> None:
    composition._profile.cache_clear()
    prv.log_moments.cache_clear()


def _fresh_bound(
    events: Sequence[tuple[float, ...]], delta: float, relation: str = "add-remove"
) -> tuple[Any, float]:
    """``events``: ``(sigma, q, count)`` or ``(sigma, q, count, participation)``."""
    t0 = time.perf_counter()
    acc = FDPAccountant()
    for sigma, q, n, *p in events:
        acc.compose(acc_mod.SubsampledGaussian(sigma, q, p[0] if p else 1.0), int(n))
    bound = acc.epsilon_bound(delta, relation)
    return bound, time.perf_counter() - t0


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _dp_accounting(events: Sequence[tuple[float, ...]], delta: float, vdi: float) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if any(len(ev) > 3 and ev[3] < 1.0 for ev in events):  # participation: binomial mixture
        import sys
        from pathlib import Path

        root = str(Path(__file__).resolve().parents[1])
        sys.path.insert(0, root)  # first: an unrelated installed "tests" package may shadow ours
        sys.modules.pop("tests", None)
        from tests.references import participation_eps_ref

        ((sigma, q, n, p),) = events
        return participation_eps_ref(sigma, q, p, int(n), delta, vdi)

    acc = pld_privacy_accountant.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=vdi
    )
    for sigma, q, n in events:
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), n)
    return float(acc.get_epsilon(delta))


def _prv_accountant(sigma: float, q: float, rounds: int, delta: float, eps_error: float) -> Any:
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = PRVAccountant(
            prvs=[PoissonSubsampledGaussianMechanism(q, sigma)],
            max_self_compositions=[rounds],
            eps_error=eps_error,
            delta_error=delta / 1000,
        )
        return acc.compute_epsilon(delta, [rounds])


#: Seconds the accounting tests used to allow (``test_participation_speed`` and the
#: pathological-inputs test); measured here, never asserted.
FORMER_TEST_LIMITS = {"participation": 1.0, "pathological": 60.0}


def _pathological_calls() -> list[Callable[[], Any]]:
    """The accountant calls of the bounded-memory test in ``tests/test_accounting.py``
    (every input that once exhausted memory or raised), in its order."""
    eps, cal = acc_mod.epsilon_for, acc_mod.calibrate_noise_multiplier
    return [
        lambda: eps(1e-3, 0.05, 150, 1e-5),
        lambda: eps(1e-3, 0.05, 150, 1e-5, "replacement"),
        lambda: cal(target_epsilon=1e12, sampling_rate=0.05, rounds=150, delta=1e-5),
        lambda: cal(target_epsilon=1e12, sampling_rate=0.05, rounds=150, delta=1e-5, participation=0.3),
        lambda: eps(0.8, 0.05, 150, 1e-300),
        lambda: eps(0.8, 0.05, 150, 5e-324, "replacement"),
        lambda: eps(1.0, 0.05, 10**15, 1e-5),
        lambda: eps(1.0, 1e-300, 150, 1e-5),
        lambda: eps(1e-300, 1.0, 150, 1e-5),
        lambda: eps(1e300, 0.05, 150, 1e-5),
        lambda: eps(1.0, 0.05, 150, 1e-5, eps_error=1e-3),
        lambda: eps(0.1, 1e-3, 1000, 1e-5, eps_error=0.004),
    ]


def former_test_limits() -> list[dict[str, Any]]:
    """Time of each case the tests once limited, with the limit and ``seconds / limit``."""
    rows: list[dict[str, Any]] = []
    _clear_caches()
    _, t = _timed(lambda: acc_mod.epsilon_for(1.34, 0.05, 150, 1.5e-4, participation=0.2))
    rows.append({"what": "participation p=0.2, q=0.05 s=1.34 T=150 d=1.5e-4 (cold)", "seconds": t,
                 "limit": FORMER_TEST_LIMITS["participation"]})
    _clear_caches()
    calls = _pathological_calls()
    _, t = _timed(lambda: [call() for call in calls])
    rows.append({"what": f"pathological inputs ({len(calls)} calls, cold)", "seconds": t,
                 "limit": FORMER_TEST_LIMITS["pathological"]})
    for r in rows:
        r["ratio"] = r["seconds"] / r["limit"]
    return rows


def run(repeats: int, with_prv: bool) -> dict[str, Any]:
    h = HEADLINE
    events = [(h["noise_multiplier"], h["sampling_rate"], h["rounds"])]
    # headline, cold: the very first accountant call of this process
    bound, cold = _fresh_bound(events, h["delta"])
    warm = []
    for _ in range(repeats):
        _clear_caches()
        _, t = _fresh_bound(events, h["delta"])
        warm.append(t)
    ref, ref_t = _timed(lambda: _dp_accounting(events, h["delta"], 1e-4))
    out: dict[str, Any] = {
        "case": h,
        "accounting_seconds_10k": cold,
        "accounting_seconds_10k_warm_median": statistics.median(warm),
        "accounting_seconds_10k_warm_all": warm,
        "epsilon_10k": {"lower": bound.lower, "estimate": bound.estimate, "upper": bound.upper},
        "error_10k": bound.upper - bound.estimate,
        "dp_accounting_epsilon_10k": ref,
        "dp_accounting_seconds_10k": ref_t,
        "dp_accounting_value_discretization_interval": 1e-4,
        "upper_minus_dp_accounting_10k": bound.upper - ref,
        "estimate_minus_dp_accounting_10k": bound.estimate - ref,
    }
    if with_prv:
        args = (h["noise_multiplier"], h["sampling_rate"], h["rounds"], h["delta"], 0.1)
        (lo, est, up), t = _timed(lambda: _prv_accountant(*args))
        out["prv_accountant_eps_error_0.1_10k"] = {"lower": lo, "estimate": est, "upper": up, "seconds": t}

    rows = []
    cases: list[tuple[str, Sequence[tuple[float, ...]], float]] = [
        ("q=1/16 s=0.8 T=10k", events, h["delta"]),
        ("q=0.01 s=1.0 T=1k", [(1.0, 0.01, 1000)], 1e-5),
        ("q=0.001 s=0.6 T=10k d=1e-6", [(0.6, 0.001, 10_000)], 1e-6),
        ("q=0.02 s=1.1 T=10k d=1e-8", [(1.1, 0.02, 10_000)], 1e-8),
        ("q=0.01 s=1.0 T=1k d=1e-11", [(1.0, 0.01, 1000)], 1e-11),
        ("q=1 s=10 T=1k (closed form)", [(10.0, 1.0, 1000)], 1e-5),
        (
            "heterogeneous 4 events",
            [(1.0, 0.01, 500), (0.8, 0.02, 300), (2.0, 0.05, 200), (1.5, 1.0, 3)],
            1e-5,
        ),
        ("q=0.05 s=1.34 p=0.2 T=150 d=1.5e-4", [(1.34, 0.05, 150, 0.2)], 1.5e-4),
        ("q=0.1 s=0.8 p=0.5 T=300 d=1e-5", [(0.8, 0.1, 300, 0.5)], 1e-5),
    ]
    for name, evs, delta in cases:
        _clear_caches()
        b, t = _fresh_bound(evs, delta)
        r, rt = _timed(functools.partial(_dp_accounting, evs, delta, 1e-4))
        rows.append(
            {
                "case": name,
                "seconds": t,
                "lower": b.lower,
                "estimate": b.estimate,
                "upper": b.upper,
                "dp_accounting": r,
                "dp_accounting_seconds": rt,
            }
        )
    out["rows"] = rows

    extra = []
    _clear_caches()
    b, t = _fresh_bound([(1.0, 0.01, 1000)], 1e-5, "replacement")
    extra.append({"what": "replacement eps, q=0.01 s=1.0 T=1k d=1e-5", "value": b.upper, "seconds": t})
    sigma, t = _timed(lambda: acc_mod.calibrate_noise_multiplier(
        target_epsilon=8.0, sampling_rate=1 / 16, rounds=10_000, delta=1e-5))
    extra.append({"what": "calibrate sigma for eps=8, q=1/16, T=10k, d=1e-5", "value": sigma, "seconds": t})
    _clear_caches()
    ledger = [acc_mod.Repeated(acc_mod.SubsampledGaussian(1.0, 0.01), 1000)]
    (_, beta), t = _timed(lambda: acc_mod.tradeoff_curve(ledger))
    what = "trade-off curve (600 alphas), q=0.01 s=1.0 T=1k: min beta"
    extra.append({"what": what, "value": float(np.min(beta)), "seconds": t})
    # formerly pathological inputs: bounded memory and time
    for what, fn in (
        ("sigma=1e-3 q=0.05 T=150 d=1e-5 (was >4 GB)",
         lambda: acc_mod.epsilon_for(1e-3, 0.05, 150, 1e-5).upper),
        ("calibrate target eps=1e12 q=0.05 T=150 (was ~23 GB)",
         lambda: acc_mod.calibrate_noise_multiplier(
             target_epsilon=1e12, sampling_rate=0.05, rounds=150, delta=1e-5)),
        ("sigma=0.8 q=0.05 T=150 d=1e-300 (was math domain error)",
         lambda: acc_mod.epsilon_for(0.8, 0.05, 150, 1e-300).upper),
        ("sigma=0.1 q=1e-3 T=1k eps_error=0.004 (full FFT at the limit)",
         lambda: acc_mod.epsilon_for(0.1, 1e-3, 1000, 1e-5, eps_error=0.004).upper),
    ):
        _clear_caches()
        v, t = _timed(fn)
        extra.append({"what": what, "value": v, "seconds": t})
    out["extra"] = extra
    out["former_test_limits"] = former_test_limits()
    out["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=5, help="warm repeats of the headline")
    parser.add_argument("--with-prv", action="store_true", help="also time prv-accountant (slow)")
    args = parser.parse_args()
    res = run(args.repeats, args.with_prv)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    e = res["epsilon_10k"]
    print("FDP accountant, epsilon of 10,000 rounds (q=1/16, sigma=0.8, delta=1e-5, add/remove)")
    print(f"  cold (first call, fresh accountant): {res['accounting_seconds_10k']:.3f} s")
    warm = res["accounting_seconds_10k_warm_median"]
    print(f"  warm median of {args.repeats} (caches cleared): {warm:.3f} s")
    print(f"  epsilon: lower {e['lower']:.4f}  estimate {e['estimate']:.4f}  upper {e['upper']:.4f}")
    print(f"  error (upper - estimate): {res['error_10k']:.4f}")
    print(
        f"  dp-accounting PLD (vdi 1e-4): {res['dp_accounting_epsilon_10k']:.4f} "
        f"in {res['dp_accounting_seconds_10k']:.3f} s; "
        f"upper - ref = {res['upper_minus_dp_accounting_10k']:.4f}"
    )
    if "prv_accountant_eps_error_0.1_10k" in res:
        p = res["prv_accountant_eps_error_0.1_10k"]
        print(f"  prv-accountant (eps_error 0.1): upper {p['upper']:.4f} in {p['seconds']:.2f} s")
    print()
    cols = ("time s", "lower", "estimate", "upper", "dp-acc", "dp-acc s")
    head = f"{'case':<32}" + "".join(f"{c:>11}" for c in cols)
    print(head)
    print("-" * len(head))
    for r in res["rows"]:
        print(
            f"{r['case']:<32}{r['seconds']:>11.3f}{r['lower']:>11.4f}{r['estimate']:>11.4f}"
            f"{r['upper']:>11.4f}{r['dp_accounting']:>11.4f}{r['dp_accounting_seconds']:>11.3f}"
        )
    print()
    for x in res["extra"]:
        print(f"{x['what']:<56} {x['value']:>10.4f}  {x['seconds']:.3f} s")
    print()
    print("time limits the tests used to assert (seconds / limit; above 1: slower than allowed)")
    for x in res["former_test_limits"]:
        print(f"{x['what']:<56} {x['seconds']:>8.3f} s  limit {x['limit']:>4.0f} s  ratio {x['ratio']:.3f}")


if __name__ == "__main__":
    main()
