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

Under ``aggregation = "secagg"`` it simulates the protocol's **noise**, not the protocol:
each private round's sum carries what the secure sum of ``n_min``
(``secagg-min-survivors``) parties would — their discrete Gaussians ``N_Z(0, σ_loc²)``,
drawn by :func:`fedfdp.secagg.party.noisy_contribution` from the OS CSPRNG, added in the
ring of 2³² and decoded at scale ``s`` — with no keys, masks, dropouts or node policies
(:data:`SECAGG_NOTE`); the protocol itself runs on Flower (``fedfdp run``). The ledger
is the run's either way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
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
    from fedfdp.secagg.plan import SecAggPlan

#: What the centralised engine says once under ``aggregation = "secagg"`` (module docstring).
SECAGG_NOTE = ("aggregation='secagg' on the centralised engine: each private sum carries the noise of "
               "{parties} parties' discrete Gaussians (the protocol's noise), but no protocol runs (no keys, "
               "masks, dropouts or node policies); fedfdp run without --centralised runs it on Flower")

log = logging.getLogger(__name__)


def secure_sum_noise(private_sum: Sequence[torch.Tensor], plan: SecAggPlan, clipping_norm: float,
                     ) -> list[torch.Tensor]:
    """``private_sum`` as the secure sum of ``plan.min_survivors`` parties would release it:
    the sum encoded at scale ``s`` (randomized rounding) with the first party's discrete
    Gaussian, every other party's discrete Gaussian on an empty share, all added in the
    ring of 2³² and decoded (:func:`fedfdp.secagg.party.noisy_contribution`,
    :func:`fedfdp.secagg.encoding.decode`). Every draw from the OS CSPRNG. The noise is
    the protocol's (``n_min`` shares of ``N_Z(0, σ_loc²)``, so ``√n_min·σ_loc·C/s`` per
    coordinate, at least the ``σC`` the accounting charges for ``n_min − t_c`` honest
    shares); the rounding is one party's rather than each party's (variance at most
    ``1/4`` integer unit per coordinate and party, next to ``σ_loc² ≫ 1``).
    """
    from fedfdp.secagg.encoding import decode
    from fedfdp.secagg.party import noisy_contribution

    flat = np.concatenate([t.detach().double().numpy().ravel() for t in private_sum])
    total = noisy_contribution(flat, clip=clipping_norm, scale=plan.scale, local_sigma=plan.local_sigma)
    empty = np.zeros_like(flat)
    for _ in range(1, int(plan.min_survivors)):  # uint32 sums wrap mod 2³², as in the ring
        total = total + noisy_contribution(empty, clip=clipping_norm, scale=plan.scale,
                                           local_sigma=plan.local_sigma)
    values = decode(total, clip=clipping_norm, scale=plan.scale)
    out, at = [], 0
    for t in private_sum:
        size = t.numel()
        out.append(torch.from_numpy(values[at:at + size].astype(np.float32).reshape(t.shape)))
        at += size
    return out


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
    secagg = engine.mechanism.secagg
    if secagg is not None:
        log.warning(SECAGG_NOTE.format(parties=secagg.min_survivors))

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
        private = contrib.private_sum
        if secagg is not None and state.phase.noise:  # the parties' noise, whatever was sampled
            if private is None:
                private = [torch.zeros(shape) for shape in engine.shapes.values()]
            private = secure_sum_noise(private, secagg, state.clipping_norm)
        return engine.finish_round(
            [private] if private is not None else [],
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
