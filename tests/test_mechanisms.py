"""Gaussian noise scale: a test that accepts the right σ and rejects σ×2/3 and σ×3/2."""

import numpy as np
import pytest
import torch
from scipy import stats

from fedfdp.mechanisms import GaussianSumMechanism, gaussian_noise_like


def variance_matches(samples: np.ndarray, std: float, alpha: float = 1e-6) -> bool:
    """Two-sided chi-square test of H0: Var = std² (known mean 0) at level alpha."""
    n = samples.size
    stat = float((samples.astype(np.float64) ** 2).sum() / std**2)
    lo, hi = stats.chi2.ppf(alpha / 2, n), stats.chi2.ppf(1 - alpha / 2, n)
    return lo <= stat <= hi


def _released_noise(sigma: float, clip: float, seed: int) -> np.ndarray:
    mech = GaussianSumMechanism(sigma, clip)
    zero = [torch.zeros(50, 40), torch.zeros(100)]
    out = mech.privatize(zero, torch.Generator().manual_seed(seed))
    return np.concatenate([t.numpy().ravel() for t in out])


def test_noise_scale_accepts_right_sigma_rejects_wrong():
    sigma, clip = 1.3, 0.7
    samples = np.concatenate([_released_noise(sigma, clip, s) for s in range(5)])  # 10.5k draws
    assert variance_matches(samples, sigma * clip)
    assert not variance_matches(samples, sigma * clip * 2 / 3)
    assert not variance_matches(samples, sigma * clip * 3 / 2)


def test_noise_mean_zero_and_independent_of_input():
    out = _released_noise(2.0, 1.0, 0)
    assert abs(out.mean()) < 5 * 2.0 / np.sqrt(out.size)
    mech = GaussianSumMechanism(2.0, 1.0)
    base = [torch.full((10,), 3.0)]
    a = mech.privatize(base, torch.Generator().manual_seed(4))[0] - 3.0
    b = mech.privatize([torch.zeros(10)], torch.Generator().manual_seed(4))[0]
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("sigma", "clip"), [(-1.0, 1.0), (1.0, 0.0), (float("inf"), 1.0)])
def test_bad_parameters(sigma, clip):
    with pytest.raises(ValueError, match="must be finite and > 0"):
        GaussianSumMechanism(sigma, clip)
    with pytest.raises(ValueError, match="noise std=-1"):
        gaussian_noise_like([torch.zeros(2)], -1.0, torch.Generator())
