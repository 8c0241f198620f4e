"""Algorithm 1 of the FDP paper on one machine: the centralised engine.

It runs exactly the two halves the federated form runs — the node half
(:func:`fedfdp.contribution.node_contribution`, here one node holding every
device) and the server half (:class:`fedfdp.server.FDPServer`: sampling plan,
write-ahead ledger, noise, normaliser, optimizer step, checkpoints, outputs) —
without Flower's transport. Every sampling mode of the Flower path (record or
device unit, Poisson devices, a fixed count of nodes) runs here through the
same :class:`~fedfdp.sampling_plan.SamplingPlan`, with one node per device as
``fedfdp run`` deploys them, so one federated round equals one centralised
round when both draw from the same (reproducible) streams
(tests/test_equivalence.py).

It is the quick way to compare modes (``fedfdp compare``'s default engine) and
to run long experiments (``fedfdp run --centralised``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fedfdp.config import Config
from fedfdp.contribution import ClientParts, DeviceTask, RoundSettings, node_contribution
from fedfdp.data import FederatedData, load_dataset
from fedfdp.evaluation import check_run_inputs, require_inputs
from fedfdp.losses import FeatureMap, build_decomposition
from fedfdp.models import build_model_for
from fedfdp.parts import client_parts_for, server_parts_for
from fedfdp.server import EvaluateFn, FDPServer, RoundOutcome, ServerParts, held_out_evaluation


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
        Injected components (the audit's seams); by default those the mode needs
        (:mod:`fedfdp.parts`), drawing their secret randomness as the
        configuration says (:func:`fedfdp.entropy.run_secrets`).

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
    model = model if model is not None else build_model_for(cfg, data)
    if evaluate_fn is None:
        evaluate_fn = held_out_evaluation(data.test_x, data.test_y)
    if server_parts is None:
        server_parts = server_parts_for(cfg, data)
    server = FDPServer(cfg, model, evaluate_fn=evaluate_fn, parts=server_parts)
    server.resolve(data.sizes.tolist())
    client = client_parts if client_parts is not None else client_parts_for(cfg, data)
    decomposition = feature_map if feature_map is not None else build_decomposition(cfg, data)
    check_run_inputs(model, data, decomposition)  # width, classes, labels, finite inputs, the view
    p = cfg.privacy

    def step(r: int) -> RoundOutcome:
        state = server.begin_round(r)
        settings = RoundSettings(
            round=r,
            attempt=state.attempt,
            phase=state.phase,
            sampling_rate=p.sampling_rate,
            clipping_norm=state.clipping_norm,
            unit=p.privacy_unit,
            public_seed=cfg.training.seed,
        )
        plan = state.plan
        tasks = [
            DeviceTask(int(d), data.devices[d].x, data.devices[d].y, bool(plan.private[d]),
                       int(plan.public_counts[d]))
            for d in plan.asked()
        ]
        contrib = node_contribution(server.model, decomposition, settings, tasks, client)
        outcome = server.finish_round(
            [contrib.private_sum] if contrib.private_sum is not None else [],
            [contrib.public_sum] if contrib.public_sum is not None else [],
            contrib.public_count,
            contrib.public_loss_sum,
            unclipped=contrib.unclipped_count,
        )
        return outcome

    rows = server.run(step)
    return server.model, rows
