"""Tests for fedfdp.images.recipe: the private part's clipping follows the private norms
through a charged noisy count, and reads nothing private otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedfdp.accounting import calibrate_noise_multiplier, epsilon_for
from fedfdp.config import Mode
from fedfdp.entropy import SeededBits
from fedfdp.images.blur import UserPublicMap
from fedfdp.images.data import ImageSet
from fedfdp.images.models import build_classifier
from fedfdp.images.recipe import (
    DEFAULT_RECIPE,
    FIXED_CLIPPING,
    ImageRecipe,
    StepDiagnostics,
    next_clipping_norm,
    unclipped_count,
)
from fedfdp.images.train import ClassificationTask, TrainSettings, train
from fedfdp.mechanisms import standard_normals


@pytest.fixture(autouse=True, scope="module")
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _bits(seed: int) -> SeededBits:
    return SeededBits(np.random.SeedSequence(seed))


def _model(data: ImageSet) -> torch.nn.Module:
    return build_classifier(data.shape, 10, width=4, features=8, generator=torch.Generator().manual_seed(0))


def _block_mean(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Ψ: the mean of every 2×2 block, repeated (a public map that forgets the detail inside a block)."""
    pooled = torch.nn.functional.avg_pool2d(x, 2)
    return pooled.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)


@pytest.fixture(scope="module")
def digits() -> ImageSet:
    pytest.importorskip("sklearn")
    from fedfdp.images.data import load_digits8, split_images

    train_set = split_images(load_digits8(), 1, test_fraction=0.2, seed=0).train()
    return ImageSet("digits-small", train_set.x[:200], train_set.y[:200], train_set.class_names)


def test_recipe_refuses_bad_values() -> None:
    for kwargs, match in [({"rule": "median"}, "rule='median'"), ({"quantile": 1.0}, "quantile=1.0"),
                          ({"learning_rate": 0.0}, "learning_rate=0.0"), ({"budget_share": 0.0},
                                                                          "budget_share=0.0")]:
        with pytest.raises(ValueError, match=match):
            ImageRecipe(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fixed"):
        next_clipping_norm(FIXED_CLIPPING, 1.0, np.ones(3), 1.0, 3.0, _bits(0))


def test_noise_split_composes_to_the_accounted_multiplier() -> None:
    """σ⁻² + σ_b⁻² = σ_eff⁻² (Andrew et al., Thm. 1) and the count takes the share r of it."""
    for accounted in (0.5, 1.3, 7.0):
        sigma, count_std = DEFAULT_RECIPE.noise(accounted)
        assert count_std is not None
        assert sigma ** -2 + count_std ** -2 == pytest.approx(accounted ** -2, rel=1e-12)
        assert count_std ** -2 / accounted ** -2 == pytest.approx(DEFAULT_RECIPE.budget_share, rel=1e-12)
    assert FIXED_CLIPPING.noise(1.3) == (1.3, None)


def test_the_rule_reads_the_norms_only_through_the_count() -> None:
    """Two batches with the same number of norms ≤ C give the same next C (same noise);
    one more unclipped record moves it by exactly exp(−η/E); the formula by hand."""
    rng = np.random.default_rng(0)
    c, e, std = 0.7, 40.0, 3.0
    below = rng.uniform(0.0, c, 12)
    a = np.concatenate([below, rng.uniform(c + 1e-6, 50.0, 30)])
    b = np.concatenate([below * 0.1, rng.uniform(c + 1e-6, 5.0, 30)])  # other values, same count
    assert unclipped_count(a, c) == unclipped_count(b, c) == 12
    got_a = next_clipping_norm(DEFAULT_RECIPE, c, a, std, e, _bits(5))
    got_b = next_clipping_norm(DEFAULT_RECIPE, c, torch.from_numpy(b), std, e, _bits(5))
    assert got_a == got_b
    z = float(standard_normals(_bits(5), 1)[0])
    eta, gamma = DEFAULT_RECIPE.learning_rate, DEFAULT_RECIPE.target(std, e)
    assert got_a == pytest.approx(c * math.exp(-eta * ((12 + std * z) / e - gamma)), rel=1e-12)
    one_more = np.concatenate([a, [c]])  # a norm equal to C is not clipped
    assert next_clipping_norm(DEFAULT_RECIPE, c, one_more, std, e, _bits(5)) == pytest.approx(
        got_a * math.exp(-eta / e), rel=1e-12)
    assert unclipped_count(np.array([np.nan, np.inf, 0.1]), 1.0) == 1  # non-finite: clipped


def test_the_target_quantile_is_capped_where_the_count_cannot_resolve_it() -> None:
    assert DEFAULT_RECIPE.target(1.0, 400.0) == DEFAULT_RECIPE.quantile == 0.9
    assert DEFAULT_RECIPE.target(30.0, 400.0) == pytest.approx(1 - 60 / 400)
    with pytest.raises(ValueError, match="cannot resolve"):
        DEFAULT_RECIPE.target(300.0, 400.0)


def test_the_norm_settles_at_the_quantile() -> None:
    """From C 100× too small, the rule ends within 10 % of the γ-quantile of a fixed
    log-normal norm distribution (batches of ~200, σ_b = 2, 400 steps; the stationary
    spread of log C is about √(η/2·γ(1−γ)/E) ≈ 1.6 %, so 10 % is >5 spreads)."""
    rng = np.random.default_rng(1)
    stream = _bits(2)
    for gamma, true in ((0.5, math.exp(0.0)), (0.9, math.exp(1.2815516 * 0.8))):
        recipe = ImageRecipe(quantile=gamma)
        c = 0.01
        for _ in range(400):
            batch = rng.lognormal(0.0, 0.8, rng.poisson(200))
            c = next_clipping_norm(recipe, c, batch, 2.0, 200.0, stream)
        assert c == pytest.approx(true, rel=0.10), (gamma, c)


def test_private_pixels_change_the_clipping_norm_only_through_the_count(digits: ImageSet) -> None:
    """The brief's property, end to end: two datasets with the same Ψ(x) and labels and other
    private pixels, the same secret stream. Each step's C follows
    C_{t+1} = C_t·exp(−η((count_t + σ_b z_t)/E − γ)); the count's noise z_t implied by the
    released norms and the (private) counts is the same draw in both runs, so nothing but
    the counts told the two runs' norms apart."""
    x = torch.from_numpy(np.array(digits.x, copy=True))
    view = _block_mean(x)
    other = (view + 0.5 * (x - view)).numpy()  # same block means, other detail
    twin = ImageSet("twin", other, digits.y, digits.class_names)
    torch.testing.assert_close(_block_mean(torch.from_numpy(other.copy())), view, rtol=0, atol=1e-6)
    psi = UserPublicMap(_block_mean, "block-mean", needs_generator=False)
    settings = TrainSettings(method=Mode.FDP, steps=12, sampling_rate=0.2, noise_multiplier=1.0,
                             clipping_norm=0.05, public_batch_size=16, learning_rate=0.05,
                             recipe=ImageRecipe(learning_rate=1.0))
    implied, counts = [], []
    for data in (digits, twin):
        model = _model(data)
        seen: list[StepDiagnostics] = []
        result = train(model, ClassificationTask(psi), data, settings, secrets=_bits(9), diagnose=seen.append)
        assert result.count_noise_std is not None
        e, std = 0.2 * len(data), result.count_noise_std
        norms = result.clipping_norms
        assert [d.clipping_norm for d in seen] == norms and norms[0] == 0.05
        eta, gamma = settings.recipe.learning_rate, settings.recipe.target(std, e)
        count = [round(d.batch * (1 - d.fraction_clipped)) for d in seen]
        implied.append([((gamma - math.log(n1 / n0) / eta) * e - k) / std
                        for n0, n1, k in zip(norms, norms[1:], count, strict=False)])
        counts.append(count)
    assert counts[0] != counts[1]  # the private pixels did change the counts
    np.testing.assert_allclose(implied[0], implied[1], rtol=0, atol=1e-9)


def test_epsilon_covers_the_count(digits: ImageSet) -> None:
    """With the recipe ε is the accountant's at σ_eff (calibrated to the target), the
    gradient gets σ = σ_eff/√(1 − r), the count σ_b; a configured σ is the gradient's
    (σ_eff = σ·√(1 − r), as the engine); fixed clipping releases no count."""
    psi = UserPublicMap(_block_mean, "block-mean", needs_generator=False)

    def settings(recipe: ImageRecipe = DEFAULT_RECIPE, sigma: float | None = None) -> TrainSettings:
        return TrainSettings(method=Mode.FDP, steps=3, sampling_rate=0.1, public_batch_size=16, recipe=recipe,
                             noise_multiplier=sigma)

    delta = 1 / (2 * len(digits))
    for recipe in (DEFAULT_RECIPE, FIXED_CLIPPING):
        model = _model(digits)
        result = train(model, ClassificationTask(psi), digits, settings(recipe),
                       secrets=_bits(1))
        sigma_eff = calibrate_noise_multiplier(target_epsilon=8.0, sampling_rate=0.1, rounds=3, delta=delta)
        assert result.accounted_noise_multiplier == pytest.approx(sigma_eff)
        assert result.epsilon == pytest.approx(epsilon_for(sigma_eff, 0.1, 3, delta).upper)
        assert result.epsilon <= 8
        assert result.noise_multiplier is not None
        if recipe.adaptive:
            assert result.noise_multiplier == pytest.approx(sigma_eff / math.sqrt(1 - recipe.budget_share))
            assert result.count_noise_std == pytest.approx(sigma_eff / math.sqrt(recipe.budget_share))
        else:
            assert result.noise_multiplier == pytest.approx(sigma_eff) and result.count_noise_std is None
            assert result.clipping_norms == [1.0] * 3
    model = _model(digits)
    given = train(model, ClassificationTask(psi), digits, settings(sigma=2.0),
                  secrets=_bits(1))
    assert given.noise_multiplier == 2.0
    accounted = given.accounted_noise_multiplier
    assert accounted is not None
    assert accounted == pytest.approx(2.0 * math.sqrt(1 - DEFAULT_RECIPE.budget_share))
    assert given.epsilon == pytest.approx(epsilon_for(accounted, 0.1, 3, delta).upper)


def test_dp_and_fdp_dpsgd_keep_c(digits: ImageSet) -> None:
    psi = UserPublicMap(_block_mean, "block-mean", needs_generator=False)
    for method in (Mode.DP, Mode.FDP_DPSGD):
        model = _model(digits)
        result = train(model, ClassificationTask(psi), digits,
                       TrainSettings(method=method, steps=3, sampling_rate=0.1, noise_multiplier=1.0,
                                     clipping_norm=0.3), secrets=_bits(1))
        assert result.clipping_norms == [0.3] * 3 and result.count_noise_std is None
        assert result.accounted_noise_multiplier == result.noise_multiplier == 1.0


def test_the_engine_uses_the_recipe_for_ddpm_and_keeps_the_classifiers() -> None:
    """``clipping-quantile = "auto"`` in ``fdp``: a ddpm run follows the 0.9-quantile capped by
    its count's noise (the same target as the reference trainer's recipe); a cnn run on the
    same data keeps the noise-level recipe, unchanged."""
    pytest.importorskip("sklearn")
    from fedfdp.config import load_config
    from fedfdp.data import load_dataset
    from fedfdp.quantile_clipping import diffusion_quantile, recipe_quantile, split_noise
    from fedfdp.run_plan import mechanism_for

    base = {"dataset": "digits", "num-devices": 4, "blur-kernel": 5, "blur-sigma": 1.0, "mode": "fdp",
            "target-epsilon": 2.0, "num-rounds": 20, "sampling-rate": 0.1, "progress": False}
    ddpm = load_config({**base, "model": "ddpm", "unet-width": 4, "diffusion-steps": 25, "sampler-steps": 4})
    cnn = load_config({**base, "model": "cnn", "cnn-width": 4, "hidden-size": 8})
    data = load_dataset(ddpm.data)
    m = mechanism_for(ddpm, data)
    expected = 0.1 * m.num_records
    assert m.accounted_noise_multiplier is not None and m.clipping.count_noise is not None
    _, count_std = split_noise(m.accounted_noise_multiplier, ddpm.privacy.clipping_budget_share)
    assert m.clipping.count_noise == pytest.approx(count_std)
    assert m.clipping.quantile == diffusion_quantile(count_std, expected)
    assert m.clipping.quantile == ImageRecipe().target(count_std, expected) > 0.5
    c = mechanism_for(cnn, data)
    assert c.accounted_noise_multiplier is not None
    split, count_c = split_noise(c.accounted_noise_multiplier, cnn.privacy.clipping_budget_share)
    assert c.clipping.quantile == recipe_quantile(split, count_c, c.num_params, expected)
