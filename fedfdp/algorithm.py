"""Algorithm 1 of the FDP paper on one machine: the reference implementation.

This runs the same two halves the federated form runs —
:func:`fedfdp.contribution.device_contribution` (client side) and
:func:`fedfdp.update.combine_gradient` (server side) — over the union of all
devices' records, as if it were a single device. The Flower strategy must
match it: one federated round equals one centralised step when both are fed
the same batches and the same noise draw (tests/test_equivalence.py).

It is also the quick way to compare modes without Flower's machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedfdp.accounting import PrivacyBudgetExhausted
from fedfdp.budget import Budget, plan_privacy
from fedfdp.config import Config
from fedfdp.contribution import device_contribution, trainable
from fedfdp.data import FederatedData, load_dataset
from fedfdp.features import PublicView
from fedfdp.losses import LossDecomposition
from fedfdp.models import build_model
from fedfdp.modes import phase_for_round
from fedfdp.sampling import DeviceStreams, ServerStreams
from fedfdp.update import RoundNoise, apply_gradient, build_optimizer, combine_gradient

#: Device id the centralised reference uses for the union of all records.
UNION_DEVICE = 2**30


def build_decomposition(cfg: Config, data: FederatedData) -> LossDecomposition:
    """The (ℓ_priv, ℓ_pub) pair the configuration selects for ``data``.

    ``public-loss = "label-free"`` selects label-DP: ``Ψ(x, y) = x`` replaces
    the dataset's own split (every input column becomes public, the label
    private) and ``ℓ_pub = logsumexp(wᵀx)`` (paper, Section 5).
    """
    method = cfg.privacy.public_loss
    if method == "auto":
        method = data.public_loss
    if method == "label-free":
        if cfg.training.model != "logistic":
            raise ValueError(f"public-loss='label-free': needs model='logistic', got {cfg.training.model!r}")
        return LossDecomposition.label_dp(data.spec.columns)
    stats = data.public_statistics if method == "mean" else None
    if method == "mean" and stats is None:
        raise ValueError(f"public-loss='mean': dataset {data.name!r} declares no public statistics")
    return LossDecomposition(PublicView(data.spec, method, stats))


def build_model_for(cfg: Config, data: FederatedData) -> nn.Module:
    """The configured model for ``data``'s input width and classes (seeded by ``seed``)."""
    return build_model(
        cfg.training.model,
        data.num_features,
        data.num_classes,
        hidden_size=cfg.training.hidden_size,
        seed=cfg.run.seed,
        hidden_sizes=cfg.training.hidden_sizes,
    )


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on held-out records."""
    if len(y) == 0:
        return float("nan"), float("nan")
    logits = model(torch.as_tensor(x))
    target = torch.as_tensor(y, dtype=torch.long)
    loss = F.cross_entropy(logits, target).item()
    acc = (logits.argmax(1) == target).float().mean().item()
    return acc, loss


@dataclass(frozen=True)
class RoundRecord:
    """Per-round record of a run (ε: add/remove upper bound at ``delta``)."""

    round: int
    phase: str
    epsilon: float
    delta: float
    accuracy: float
    loss: float
    public_loss: float


def run_centralised(
    cfg: Config,
    data: FederatedData | None = None,
    *,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> tuple[nn.Module, list[RoundRecord]]:
    """Run Algorithm 1 (or the configured baseline) on the union of the devices.

    Stops early, cleanly, if a round would exceed ``max-epsilon``.
    """
    data = data if data is not None else load_dataset(cfg.data)
    x = np.concatenate([d.x for d in data.devices])
    y = np.concatenate([d.y for d in data.devices])
    n = len(y)
    plan = plan_privacy(cfg, n)
    budget = Budget(plan)
    model = build_model_for(cfg, data)
    params = trainable(model)
    optimizer = build_optimizer(
        params, cfg.training.optimizer, cfg.training.learning_rate, cfg.training.momentum
    )
    decomposition = build_decomposition(cfg, data)
    p, seed = cfg.privacy, cfg.run.seed
    records: list[RoundRecord] = []
    for r in range(1, cfg.training.num_rounds + 1):
        phase = phase_for_round(p.mode, p.public_pretrain_rounds, r)
        if phase.noise:
            try:
                budget.check()
            except PrivacyBudgetExhausted:
                break
        contrib = device_contribution(
            model,
            decomposition,
            phase,
            x,
            y,
            sampling_rate=p.sampling_rate,
            clipping_norm=p.clipping_norm,
            public_count=min(p.public_batch_size, n),
            streams=DeviceStreams.for_round(seed, r, UNION_DEVICE),
        )
        noise = None
        if phase.noise:
            if plan.noise_multiplier is None:
                raise ValueError("noise multiplier unresolved: this plan spends no privacy")
            noise = RoundNoise(
                plan.noise_multiplier, p.clipping_norm, ServerStreams.for_round(seed, r).noise
            )
        grad, _ = combine_gradient(
            phase,
            [contrib.private_sum] if contrib.private_sum is not None else [],
            [contrib.public_sum] if contrib.public_sum is not None else [],
            contrib.public_count,
            shapes=[q.shape for q in params],
            expected_batch_size=p.sampling_rate * n,
            alpha=cfg.training.alpha,
            noise=noise,
        )
        apply_gradient(params, optimizer, grad)
        eps = budget.spend() if phase.noise else budget.epsilon()
        acc = loss = float("nan")
        if r % cfg.run.eval_every == 0 or r == cfg.training.num_rounds:
            acc, loss = evaluate(model, data.test_x, data.test_y)
        pub_loss = (
            contrib.public_loss_sum / contrib.public_count if contrib.public_count else float("nan")
        )
        rec = RoundRecord(r, phase.name, eps, plan.delta, acc, loss, pub_loss)
        records.append(rec)
        if on_round is not None:
            on_round(rec)
    return model, records
