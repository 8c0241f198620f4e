"""The canary audit's analysis: statistics per canary group, the test chosen on
calibration rounds, the bound on the others, the claim, and the result record.

The trials come from :mod:`simulations.auditing.canaries`; the statistics
(Clopper–Pearson, the ε lower bound, the test search) from :mod:`fedfdp.audit`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedfdp.accounting import FDPAccountant, SubsampledGaussian
from fedfdp.audit import AuditResult, choose_test, evaluate_test
from fedfdp.config import ConfigError
from fedfdp.mechanism import ResolvedMechanism
from simulations.auditing.bugs import planted
from simulations.auditing.canaries import (
    ALONE,
    COUNTED,
    CROWD,
    GROUP_NAMES,
    MATES,
    RELATION_WORLDS,
    WORLD1,
    AuditSetup,
    Observations,
    audited_plan,
    collect,
    design,
)


def claimed_epsilon(plan: ResolvedMechanism, relation: str) -> float:
    """ε the run's accountant claims for one round of its plan at ``plan.delta``
    (add/remove: Theorem 5, with the plan's participation; replacement: Prop. 1).
    """
    if not isinstance(plan.event, SubsampledGaussian):
        raise RuntimeError("the audited plan charges no subsampled Gaussian")
    acc = FDPAccountant()
    acc.compose(plan.event)
    return acc.epsilon(plan.delta, relation)


def group_statistics(
    obs: Observations, mask: np.ndarray, group: int, drawn: float, shifts: tuple[float, float] = (1.0, 0.0)
) -> dict[str, np.ndarray]:
    """The candidate statistics of ``group``'s trials in ``mask``.

    ``shifts = (ρ/σ, 1/σ_b)``: the counted canary's mean shift, when sampled, on its
    coordinate (units of ``σC``) and on the count (units of ``σ_b``); their
    Neyman–Pearson combination has unit variance and shift ``√(ρ²/σ² + 1/σ_b²)``
    (``1/σ_eff`` at ``ρ = 1``).
    """
    m = mask & (obs.group == group)
    t = obs.projection[m]
    out = {"projection": t, "projection-minus-seeded-noise": t - obs.predicted[m]}
    if group in (ALONE, CROWD):
        out["projection-if-public"] = np.where(obs.public[m] >= 1, t, -np.inf)
    if group == MATES:
        out["projection-if-drawn"] = np.where(obs.mates[m] > drawn, t, -np.inf)
    if group == COUNTED and np.all(np.isfinite(obs.count[m])):
        a, b = shifts
        count = obs.count[m]
        out["count"] = count
        out["projection-and-count"] = (a * t + b * count) / math.hypot(a, b)
        out["count-minus-public-noise"] = count - obs.count_predicted[m]
    return out


def analyse(obs: Observations, setup: AuditSetup, plan: ResolvedMechanism, relation: str) -> AuditResult:
    """Choose the test on the calibration rounds, bound ε on the others."""
    w2 = RELATION_WORLDS[relation]
    cal = obs.round < max(1, round(setup.calibration * setup.rounds))
    # a drawn device's mates add ≈ q·mates·C on their coordinate: half of it, in units of σC
    drawn = 0.5 * setup.sampling_rate * setup.mate_count / setup.noise_multiplier
    count_noise = plan.clipping.count_noise
    shifts = (setup.counted_norm / setup.noise_multiplier, 1.0 / count_noise if count_noise else 0.0)
    best = None
    for group in GROUP_NAMES:
        if not np.any(obs.group == group):
            continue
        stats_ = group_statistics(obs, cal, group, drawn, shifts)
        w = obs.world[cal & (obs.group == group)]
        if not np.any(w == WORLD1) or not np.any(w == w2):
            continue
        w_held = obs.world[~cal & (obs.group == group)]
        sizes = (int(np.sum(w_held == WORLD1)), int(np.sum(w_held == w2)))
        if min(sizes) == 0:
            continue
        test, e = choose_test(
            {s: v[w == WORLD1] for s, v in stats_.items()},
            {s: v[w == w2] for s, v in stats_.items()},
            setup.delta,
            setup.alpha,
            sizes=sizes,
        )
        if best is None or e > best[2]:
            best = (group, test, e)
    if best is None:
        raise RuntimeError("no calibration trials in both worlds: increase rounds")
    group, test, cal_eps = best
    held = ~cal
    stats_ = group_statistics(obs, held, group, drawn, shifts)
    w = obs.world[held & (obs.group == group)]
    bound = evaluate_test(
        test, stats_[test.statistic][w == WORLD1], stats_[test.statistic][w == w2], setup.delta,
        setup.alpha,
    )
    test = dataclasses.replace(test, statistic=f"{GROUP_NAMES[group]}/{test.statistic}")
    return AuditResult(
        epsilon_lower=bound.epsilon,
        epsilon_claimed=claimed_epsilon(plan, relation),
        relation=relation,
        delta=setup.delta,
        trials=bound.positives + bound.negatives,
        test=test,
        bound=bound,
        calibration_epsilon=cal_eps,
    )


def run_audit(
    setup: AuditSetup | None = None,
    relations: Sequence[str] = ("add-remove",),
    bug: str | None = None,
) -> list[dict[str, Any]]:
    """Run the canary audit; one result dictionary per relation (see :func:`result_dict`)."""
    setup = setup or AuditSetup()
    for r in relations:
        if r not in RELATION_WORLDS:
            raise ValueError(f"relation={r!r}: must be add-remove or replacement")
    planted(bug)
    start = time.perf_counter()
    des = design(setup)
    plan = audited_plan(des, bug)
    if setup.counted and not plan.clipping.adaptive:
        raise ConfigError(
            f"counted={setup.counted}: the counted canary needs adaptive clipping, but clipping-quantile="
            f"{'auto' if setup.clipping_quantile is None else setup.clipping_quantile} resolves to a fixed C "
            "here (give a quantile in (0, 1), or fillers so that the recipe picks one)"
        )
    obs = collect(des, relations, bug)
    seconds = time.perf_counter() - start
    return [result_dict(analyse(obs, setup, plan, r), setup, bug, seconds, obs.rejected, plan)
            for r in relations]


def result_dict(
    res: AuditResult, setup: AuditSetup, bug: str | None, seconds: float, rejected: int = 0,
    plan: ResolvedMechanism | None = None,
) -> dict[str, Any]:
    """The JSON record of one audit. ``violated``: the lower bound exceeds the
    claim, or the server rejected replies (an honest node never sends one).
    """
    b = res.bound
    violated = res.violated or rejected > 0
    if res.violated:
        verdict = "FAIL: lower bound above the claim"
    elif rejected:
        verdict = f"FAIL: the server rejected {rejected} replies"
    else:
        verdict = "pass"
    return {
        "epsilon_lower": round(res.epsilon_lower, 4),
        "epsilon_claimed": round(res.epsilon_claimed, 4),
        "relation": res.relation,
        "delta": res.delta,
        "trials": res.trials,
        "bug": bug,
        "violated": violated,
        "verdict": verdict,
        "rejected_replies": rejected,
        "positives": b.positives,
        "negatives": b.negatives,
        "false_positive_rate": b.fpr,
        "false_negative_rate": b.fnr,
        "fpr_upper": b.fpr_upper,
        "fnr_upper": b.fnr_upper,
        "alpha": b.alpha,
        "confidence": "Clopper-Pearson, alpha/2 on each error rate",
        "test": {"statistic": res.test.statistic, "sign": res.test.sign, "threshold": res.test.threshold},
        "calibration_epsilon": round(res.calibration_epsilon, 4),
        "rounds": setup.rounds,
        "canaries": {"alone": setup.alone, "twins": setup.twins, "crowd": setup.crowd, "mates": setup.mates,
                     "counted": setup.counted, "twin_count": setup.twin_count, "crowd_size": setup.crowd_size,
                     "mate_count": setup.mate_count, "fillers": setup.fillers},
        "clipping": {
            "quantile": "auto" if setup.clipping_quantile is None else setup.clipping_quantile,
            "resolved_quantile": plan.clipping.quantile if plan is not None else None,
            "count_noise": plan.clipping.count_noise if plan is not None else None,
            "accounted_noise_multiplier": plan.accounted_noise_multiplier if plan is not None else None,
        },
        "sampling_rate": setup.sampling_rate,
        "device_sampling_rate": setup.device_sampling_rate,
        "noise_multiplier": setup.noise_multiplier,
        "clipping_norm": setup.clipping_norm,
        "seed": setup.seed,
        "secrets": "os-csprng" if setup.secret_seed is None else f"seeded ({setup.secret_seed})",
        "seconds": round(seconds, 1),
    }
