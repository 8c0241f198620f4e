"""The ``fdp`` recipe for image models on the engine: ``C`` follows a quantile of the
private norms through a charged noisy count, and reads nothing private otherwise.

* ``clipping-quantile`` unset: a ddpm run resolves ``γ = min(0.9, 1 − 2σ_b/(qN))``
  (computed here by hand from the resolved σ_eff and the budget share), a cnn run
  on the same data keeps the noise-level recipe.
* End to end through :func:`fedfdp.run_centralised`: two datasets with the same
  ``Ψ(x)`` and labels and other private pixels, the same (seeded) secret streams.
  Each round's ``C`` follows ``C_{t+1} = C_t·exp(−η((count_t + σ_b z_t)/E − γ))``;
  the count's noise ``z_t`` implied by the released norms and the (private) counts,
  read through the aggregator seam, is the same draw in both runs, so nothing but
  the counts told the two runs' norms apart.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from fedfdp.algorithm import run_centralised
from fedfdp.config import load_config
from fedfdp.contribution import ClientParts, PrivateSum, clipped_private_sum
from fedfdp.data import DeviceData, load_dataset
from fedfdp.entropy import SeededEntropy
from fedfdp.images.blur import UserPublicMap
from fedfdp.images.data import ImageShape
from fedfdp.images.models import build_classifier
from fedfdp.losses import FeatureMap
from fedfdp.quantile_clipping import DIFFUSION_QUANTILE, recipe_quantile, split_noise
from fedfdp.run_plan import mechanism_for

pytest.importorskip("sklearn")


@pytest.fixture(autouse=True, scope="module")
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _block_mean(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Ψ: the mean of every 2×2 block, repeated (a public map that forgets the detail inside a block)."""
    pooled = torch.nn.functional.avg_pool2d(x, 2)
    return pooled.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)


def test_the_engine_uses_the_recipe_for_ddpm_and_keeps_the_classifiers() -> None:
    base = {"dataset": "digits", "num-devices": 4, "blur-kernel": 5, "blur-sigma": 1.0, "mode": "fdp",
            "target-epsilon": 2.0, "num-rounds": 20, "sampling-rate": 0.1, "progress": False}
    ddpm = load_config({**base, "model": "ddpm", "unet-width": 4, "diffusion-steps": 25, "sampler-steps": 4})
    cnn = load_config({**base, "model": "cnn", "cnn-width": 4, "hidden-size": 8})
    data = load_dataset(ddpm.data)
    m = mechanism_for(ddpm, data)
    expected = 0.1 * m.num_records
    assert m.accounted_noise_multiplier is not None and m.clipping.count_noise is not None
    share = ddpm.privacy.clipping_budget_share
    count_std = m.accounted_noise_multiplier / math.sqrt(share)  # σ_b⁻² = r·σ_eff⁻² (Andrew et al.)
    assert m.clipping.count_noise == pytest.approx(count_std, rel=1e-12)
    gamma = min(0.9, 1 - 2 * count_std / expected)  # the cap where the noisy count cannot resolve γ
    assert DIFFUSION_QUANTILE == 0.9 and gamma > 0.5
    assert m.clipping.quantile == pytest.approx(gamma, rel=1e-12)
    c = mechanism_for(cnn, data)
    assert c.accounted_noise_multiplier is not None
    split, count_c = split_noise(c.accounted_noise_multiplier, cnn.privacy.clipping_budget_share)
    assert c.clipping.quantile == recipe_quantile(split, count_c, c.num_params, expected)


def test_private_pixels_change_the_clipping_norm_only_through_the_count() -> None:
    eta, q, rounds = 1.0, 0.2, 12
    cfg = load_config({
        "dataset": "digits", "num-devices": 1, "model": "cnn", "cnn-width": 4, "hidden-size": 8,
        "mode": "fdp",
        "num-rounds": rounds, "sampling-rate": q, "noise-multiplier": 1.0, "clipping-norm": 0.05,
        "clipping-quantile": 0.9, "clipping-learning-rate": eta, "public-batch-size": 16,
        "learning-rate": 0.05, "reproducible-noise": True, "eval-every": rounds, "progress": False,
    })
    data = load_dataset(cfg.data)
    x = torch.from_numpy(np.array(data.devices[0].x, copy=True))
    view = _block_mean(x)
    other = (view + 0.5 * (x - view)).numpy()  # the same block means, other detail
    torch.testing.assert_close(_block_mean(torch.from_numpy(other.copy())), view, rtol=0, atol=1e-6)
    twin = dataclasses.replace(data, devices=(DeviceData(other, data.devices[0].y),))
    psi = UserPublicMap(_block_mean, "block-mean", needs_generator=False)
    m = mechanism_for(cfg, data)
    std, gamma, expected = m.clipping.count_noise, m.clipping.quantile, q * data.num_records
    assert std is not None and gamma == 0.9
    implied, counts = [], []
    for records in (data, twin):
        seen: list[int] = []

        def recorder(model, decomposition, settings, batches, seen=seen) -> PrivateSum:
            out = clipped_private_sum(model, decomposition, settings, batches)
            seen.append(out.unclipped)
            return out

        assert data.image_shape is not None
        model = build_classifier(ImageShape(*data.image_shape), 10, width=4, features=8,
                                 generator=torch.Generator().manual_seed(0))
        parts = ClientParts(secrets=SeededEntropy(cfg.training.seed), aggregate=recorder)
        _, rows = run_centralised(cfg, records, model=model, feature_map=FeatureMap(view=psi),
                                  client_parts=parts)
        norms = [float(r["clipping_norm"]) for r in rows]
        assert norms[0] == 0.05 and len(seen) == rounds
        implied.append([((gamma - math.log(n1 / n0) / eta) * expected - k) / std
                        for n0, n1, k in zip(norms, norms[1:], seen, strict=False)])
        counts.append(seen)
    assert counts[0] != counts[1]  # the private pixels did change the counts
    np.testing.assert_allclose(implied[0], implied[1], rtol=0, atol=1e-9)
