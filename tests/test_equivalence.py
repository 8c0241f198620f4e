"""One federated round (real client + strategy code) equals one centralised step of
Algorithm 1 on the union of the devices' batches, with the same noise draw."""

import numpy as np
import pytest
import torch

from fedfdp.algorithm import build_decomposition, build_model_for
from fedfdp.config import load_config
from fedfdp.contribution import private_batch_sum, public_batch_sum, trainable
from fedfdp.data import load_dataset
from fedfdp.modes import PHASES
from fedfdp.sampling import (
    DeviceStreams,
    ServerStreams,
    allocate_public_batch,
    poisson_sample,
    uniform_sample,
)
from fedfdp.update import RoundNoise, apply_gradient, build_optimizer, combine_gradient
from tests.flower_helpers import client_reply, registered_strategy, train_messages


@pytest.mark.parametrize("mode", ["fdp", "dp", "public", "nonprivate"])
def test_federated_round_equals_centralised_step(mode):
    cfg = load_config(
        {
            "mode": mode,
            "num-devices": 4,
            "records-per-device": 60,
            "noise-multiplier": 1.5,
            "target-epsilon": 0,
            "sampling-rate": 0.2,
            "public-batch-size": 40,
            "public-loss": "zero",
            "clipping-norm": 0.5,
            "alpha": 2.0,
            "seed": 3,
            "progress": False,
        }
    )
    strat = registered_strategy(cfg)
    before = [p.detach().clone() for p in strat.params]
    replies = [client_reply(cfg, m) for m in train_messages(strat, 1)]
    strat.aggregate_train(1, replies)
    federated = [p.detach().clone() for p in strat.params]

    # Centralised reference: the union of the same batches, one step.
    data = load_dataset(cfg.data)
    phase = PHASES[mode]
    sizes = data.sizes
    alloc = allocate_public_batch(
        sizes,
        min(40, int(sizes.sum())) if phase.public else 0,
        ServerStreams.for_round(3, 1).sampling,
    )
    px, py, ux, uy = [], [], [], []
    for d, dev in enumerate(data.devices):
        s = DeviceStreams.for_round(3, 1, d)
        i = poisson_sample(len(dev), 0.2, s.private)
        j = uniform_sample(len(dev), int(alloc[d]), s.public)
        px.append(dev.x[i])
        py.append(dev.y[i])
        ux.append(dev.x[j])
        uy.append(dev.y[j])
    model = build_model_for(cfg, data)
    params = trainable(model)
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p.detach(), b)
    dec = build_decomposition(cfg, data)
    gen = torch.Generator()
    priv = pub = None
    if phase.has_private:
        priv = private_batch_sum(
            model,
            dec,
            phase,
            torch.as_tensor(np.concatenate(px)),
            torch.as_tensor(np.concatenate(py)),
            clipping_norm=0.5,
            padding=gen,
            clip_method="loop",
        )
    n_pub = 0
    if phase.public:
        pub, _ = public_batch_sum(
            model,
            dec,
            torch.as_tensor(np.concatenate(ux)),
            torch.as_tensor(np.concatenate(uy)),
            padding=gen,
        )
        n_pub = int(alloc.sum())
    noise = (
        RoundNoise(strat.plan.noise_multiplier, 0.5, ServerStreams.for_round(3, 1).noise)
        if phase.noise
        else None
    )
    grad, _ = combine_gradient(
        phase,
        [priv] if priv else [],
        [pub] if pub else [],
        n_pub,
        shapes=[p.shape for p in params],
        expected_batch_size=0.2 * data.num_records,
        alpha=2.0,
        noise=noise,
    )
    opt = build_optimizer(params, "sgd", cfg.training.learning_rate, cfg.training.momentum)
    apply_gradient(params, opt, grad)
    for f, c, b in zip(federated, params, before, strict=True):
        assert not torch.equal(f, b)  # the round did move the model
        torch.testing.assert_close(f, c.detach(), rtol=1e-4, atol=1e-5)
