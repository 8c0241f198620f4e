"""One sampling plan for every engine.

* A federated round (real client + strategy code) equals a step of Algorithm 1
  built here by hand from the samplers, on the union of the same batches with
  the same noise draw (reproducible streams).
* The Flower path and the centralised engine run the same plan in every
  sampling mode (unit × Poisson devices × a fixed count of nodes): the same
  models, normalisers, ε and ledgers, round after round.
"""



import numpy as np
import pytest
import torch

from fedfdp.algorithm import run_centralised
from fedfdp.clipping import ClipMethod
from fedfdp.config import load_config
from fedfdp.contribution import PrivateBatch, private_gradient_sum, public_gradient_sum, trainable
from fedfdp.data import load_dataset
from fedfdp.entropy import SeededEntropy
from fedfdp.mechanisms import GaussianSumMechanism
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.run_plan import feature_map_for
from fedfdp.sampling import (
    PublicStreams,
    allocate_public_batch,
    poisson_sample,
    server_public_rng,
    uniform_sample,
)
from fedfdp.update import RoundNoise, apply_gradient, build_optimizer, combine_gradient
from tests.flower_helpers import InProcessGrid, client_reply, registered_strategy, train_messages
from tests.mechanism_helpers import ledger_doc


@pytest.mark.parametrize("mode", ["fdp", "dp", "public", "nonprivate"])
def test_federated_round_equals_hand_built_step(mode):
    # a key with no effect in the mode is refused (issue 23): give each mode only its own keys
    unused = {"fdp": (), "dp": (), "nonprivate": ("noise-multiplier", "clipping-norm"),
              "public": ("noise-multiplier", "clipping-norm", "sampling-rate")}[mode]
    keys = {
        "mode": mode,
        "num-devices": 4,
        "records-per-device": 60,
        "noise-multiplier": 1.5,
        "sampling-rate": 0.2,
        "public-batch-size": 40,
        "public-loss": "gaussian",
        "clipping-norm": 0.5,
        "alpha": 2.0,
        "seed": 3,
        "reproducible-noise": True,
        "progress": False,
    }
    cfg = load_config({k: v for k, v in keys.items() if k not in unused})
    strat = registered_strategy(cfg)
    before = [p.detach().clone() for p in trainable(strat.model)]
    replies = [client_reply(cfg, m) for m in train_messages(strat, 1)]
    strat.aggregate_train(1, replies)
    federated = [p.detach().clone() for p in trainable(strat.model)]

    # By hand: the union of the same batches, one step.
    data = load_dataset(cfg.data)
    phase = PHASES[mode]
    sizes = data.sizes
    secrets = SeededEntropy(3)
    m = min(40, int(sizes.sum())) if phase.public else 0
    alloc = allocate_public_batch(sizes, m, server_public_rng(3, 1))
    private, public = [], []
    for d, dev in enumerate(data.devices):
        s, pub = secrets.device(1, d, 0), PublicStreams.for_device(3, 1, d)
        i = poisson_sample(len(dev), 0.2, s.coins)
        j = uniform_sample(len(dev), int(alloc[d]), pub.sample)
        xi, yi = torch.as_tensor(dev.x[i]), torch.as_tensor(dev.y[i])
        private.append(PrivateBatch(xi, yi, s.padding, len(dev)))
        public.append((torch.as_tensor(dev.x[j]), torch.as_tensor(dev.y[j]), pub.padding))
    model = build_model_for(cfg.training, data)
    params = trainable(model)
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p.detach(), b)
    dec = feature_map_for(cfg, data)
    priv = pub_sum = None
    if phase.has_private:
        clip = 0.5 if phase.clip else None
        priv = private_gradient_sum(model, dec, phase, private, clip, clip_method=ClipMethod.LOOP)
    n_pub = 0
    if phase.public:
        pub_sum, _, n_pub = public_gradient_sum(model, dec, public)
    noise = RoundNoise(GaussianSumMechanism(1.5, 0.5), secrets.noise(1, 0)) if phase.noise else None
    grad, _ = combine_gradient(
        phase,
        [priv] if priv else [],
        [pub_sum] if pub_sum else [],
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


MODES: dict[str, dict[str, object]] = {
    "record, every device": {},
    "record, 2 of 5 nodes": {"clients-per-round": 2},
    "record, Poisson devices": {"device-sampling-rate": 0.5},
    "device unit, Poisson devices": {"privacy-unit": "device", "device-sampling-rate": 0.5},
}


@pytest.mark.parametrize("name", list(MODES))
@pytest.mark.parametrize("mode", ["fdp", "fdp-dpsgd"])
def test_flower_path_and_centralised_engine_run_the_same_plan(name, mode, tmp_path):
    """5 devices, 4 rounds (1 public pre-training round for fdp-dpsgd): both
    engines write the same ledger.jsonl charges, the same normaliser and ε per
    round, and end at the same model."""
    cfg_map = {
        "mode": mode, "num-devices": 5, "records-per-device": 30, "noise-multiplier": 1.2,
        "sampling-rate": 0.3, "public-batch-size": 12, "num-rounds": 4,
        "public-pretrain-rounds": 1 if mode == "fdp-dpsgd" else 0, "seed": 7, "reproducible-noise": True,
        "progress": False, **MODES[name],
    }
    flower_cfg = load_config({**cfg_map, "out-dir": str(tmp_path / "flower")})
    strat = registered_strategy(flower_cfg)
    strat.registry = {}
    strat.start(InProcessGrid(flower_cfg))
    flower_rows = strat.rows
    central_cfg = load_config({**cfg_map, "out-dir": str(tmp_path / "central")})
    model, central_rows = run_centralised(central_cfg)
    assert len(flower_rows) == len(central_rows) == 4
    for f, c in zip(flower_rows, central_rows, strict=True):
        assert f["phase"] == c["phase"]
        assert f["epsilon"] == c["epsilon"]
        np.testing.assert_allclose(f["normaliser"], c["normaliser"], rtol=1e-12)
    ledgers = [ledger_doc(tmp_path / d) for d in ("flower", "central")]
    # the same mechanism and charges, entry for entry (the hash chains are identical)
    assert ledgers[0]["entries"] == ledgers[1]["entries"]
    assert len(ledgers[0]["entries"]) - 1 == (3 if mode == "fdp-dpsgd" else 4)
    for a, b in zip(trainable(strat.model), trainable(model), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)
