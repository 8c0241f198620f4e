"""Algorithm 1 of the FDP paper on one machine: the centralised engine.

It runs exactly the two halves the federated form runs — the node half
(:func:`fedfdp.contribution.node_contribution`, here one node holding every
device) and the server half (:class:`fedfdp.round_engine.RoundEngine`: sampling plan,
write-ahead ledger, noise, normaliser, optimizer step; the run loop of
:mod:`fedfdp.run_loop`: checkpoints, outputs) — without Flower's transport. Every
sampling mode of the Flower path (record or device unit, Poisson devices, a fixed
count of nodes) runs here through the same :class:`~fedfdp.sampling_plan.SamplingPlan`,
with one node per device as ``fedfdp run`` deploys them, so one federated round equals
one centralised round when both draw from the same (reproducible) streams
(tests/test_equivalence.py).

It is the quick way to compare modes (``fedfdp compare``'s default engine) and
to run long experiments (``fedfdp run --centralised``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from fedfdp.contribution import DeviceTask, RoundSettings, node_contribution
from fedfdp.data import FederatedData, load_dataset
from fedfdp.evaluation import EvaluateFn, check_run_inputs
from fedfdp.losses import FeatureMap
from fedfdp.round_engine import RoundOutcome, ServerParts
from fedfdp.run_loop import RunLoop
from fedfdp.run_plan import RunPlan, build_plan, require_inputs

if TYPE_CHECKING:
    from fedfdp.config import Config
    from fedfdp.contribution import ClientParts


def run_plan_centrally(plan: RunPlan) -> tuple[nn.Module, list[dict[str, Any]]]:
    """Every round of ``plan`` on one machine: the round engine over the data's device
    sizes, and one node holding every device (module docstring). Returns the final model
    and the rows of ``metrics.csv``.
    """
    data = plan.data
    if data is None:
        raise ValueError("the centralised engine needs the plan's data (build_plan(cfg, data))")
    engine = plan.engine(data.sizes.tolist())
    client = plan.client_parts
    feature_map = plan.feature_map
    check_run_inputs(plan.model, data, feature_map)  # width, classes, labels, finite inputs, the view
    sampling = engine.mechanism.sampling

    def step(r: int) -> RoundOutcome:
        state = engine.begin_round(r)
        settings = RoundSettings(
            round=r,
            attempt=state.attempt,
            phase=state.phase,
            sampling_rate=sampling.sampling_rate,
            clipping_norm=state.clipping_norm,
            unit=sampling.unit,
            public_seed=plan.training.seed,
        )
        rounds = state.plan
        tasks = [
            DeviceTask(int(d), data.devices[d].x, data.devices[d].y, bool(rounds.private[d]),
                       int(rounds.public_counts[d]))
            for d in rounds.asked()
        ]
        contrib = node_contribution(engine.model, feature_map, settings, tasks, client)
        return engine.finish_round(
            [contrib.private_sum] if contrib.private_sum is not None else [],
            [contrib.public_sum] if contrib.public_sum is not None else [],
            contrib.public_count,
            contrib.public_loss_sum,
            unclipped=contrib.unclipped_count,
        )

    rows = RunLoop(plan, engine).run(step)
    return engine.model, rows


def run_centralised(
    cfg: Config,
    data: FederatedData | None = None,
    *,
    model: nn.Module | None = None,
    feature_map: FeatureMap | None = None,
    evaluate_fn: EvaluateFn | None = None,
    server_parts: ServerParts | None = None,
    client_parts: ClientParts | None = None,
) -> tuple[nn.Module, list[dict[str, Any]]]:
    """Run ``cfg`` (Algorithm 1 or the configured baseline) on one machine.

    Writes the same files as a Flower run when ``out-dir`` is set (and refuses
    an occupied one unless ``resume``). Stops early, cleanly, before a round
    that would exceed ``max-epsilon``. Returns the final model and the
    per-round rows of ``metrics.csv``.

    Parameters
    ----------
    cfg : Config
    data : FederatedData, optional
        The devices' records and a held-out split (default: the configured dataset).
    model, feature_map, evaluate_fn : optional
        Your own ``nn.Module``, Ψ and held-out evaluation (defaults: the
        configured model, the configured public view, accuracy and loss on
        ``data``'s held-out split).
    server_parts, client_parts : optional
        Injected components (the audit's seams); by default those the mode needs,
        drawing their secret randomness as the configuration says
        (:func:`fedfdp.run_plan.build_plan`).

    Examples
    --------
    >>> from fedfdp import load_config, run_centralised
    >>> cfg = load_config({"num-rounds": 3, "num-devices": 4, "records-per-device": 30, "progress": False})
    >>> model, rows = run_centralised(cfg)
    >>> [r["phase"] for r in rows], rows[-1]["epsilon"] <= 2.0
    (['fdp', 'fdp', 'fdp'], True)
    """
    cfg = require_inputs(cfg, data, model, feature_map)
    data = data if data is not None else load_dataset(cfg.data)
    plan = build_plan(cfg, data, model=model, feature_map=feature_map, evaluate=evaluate_fn,
                      server_parts=server_parts, client_parts=client_parts)
    return run_plan_centrally(plan)
