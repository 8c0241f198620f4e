"""The hardened Gaussian sampler and the mechanism: a σ test that accepts the right σ
and rejects σ×2/3 and σ×3/2, normality, and independence of the input."""

import numpy as np
import pytest
import torch
from scipy import stats

from fedfdp.entropy import OSBits, SeededEntropy
from fedfdp.mechanisms import SUMMANDS, GaussianSumMechanism, gaussian_noise, standard_normals


def variance_matches(samples: np.ndarray, std: float, alpha: float = 1e-6) -> bool:
    """Two-sided chi-square test of H0: Var = std² (known mean 0) at level alpha."""
    n = samples.size
    stat = float((samples.astype(np.float64) ** 2).sum() / std**2)
    lo, hi = stats.chi2.ppf(alpha / 2, n), stats.chi2.ppf(1 - alpha / 2, n)
    return lo <= stat <= hi


def _released_noise(sigma: float, clip: float) -> np.ndarray:
    mech = GaussianSumMechanism(sigma, clip)
    zero = [torch.zeros(50, 40), torch.zeros(100)]
    out = mech.privatize(zero, OSBits())
    return np.concatenate([t.numpy().ravel() for t in out])


def test_noise_scale_accepts_right_sigma_rejects_wrong():
    sigma, clip = 1.3, 0.7
    samples = np.concatenate([_released_noise(sigma, clip) for _ in range(5)])  # 10.5k draws
    assert variance_matches(samples, sigma * clip)
    assert not variance_matches(samples, sigma * clip * 2 / 3)
    assert not variance_matches(samples, sigma * clip * 3 / 2)


def test_hardened_normals_are_standard_normal():
    """200k draws of the 4-sum construction: Kolmogorov–Smirnov against N(0, 1)
    (p > 1e-4), and the fourth moment within 5 s.e. of 3 (a sum that was not
    normalised, or a draw reused, would show)."""
    z = standard_normals(OSBits(), 200_000)
    assert stats.kstest(z, "norm").pvalue > 1e-4
    m4 = np.mean(z**4)
    assert abs(m4 - 3.0) < 5 * np.sqrt(96 / len(z))  # Var(Z^4) = 105 - 9
    assert SUMMANDS == 4


def test_noise_is_fresh_unless_seeded_and_independent_of_input():
    mech = GaussianSumMechanism(2.0, 1.0)
    a = mech.privatize([torch.zeros(1000)], OSBits())[0]
    b = mech.privatize([torch.zeros(1000)], OSBits())[0]
    assert not torch.equal(a, b)
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 5 / np.sqrt(1000)
    # seeded streams (reproducible mode) repeat exactly; the noise does not depend on the input
    base = [torch.full((10,), 3.0)]
    c = mech.privatize(base, SeededEntropy(4).noise(1, 0))[0] - 3.0
    d = mech.privatize([torch.zeros(10)], SeededEntropy(4).noise(1, 0))[0]
    torch.testing.assert_close(c, d)


def test_noise_is_added_in_float64_and_rounded_once():
    mech = GaussianSumMechanism(1e-3, 1.0)
    s = torch.full((5,), 1.0, dtype=torch.float32)
    z = gaussian_noise([s.shape], mech.std, SeededEntropy(0).noise(1, 0))[0]
    out = mech.privatize([s], SeededEntropy(0).noise(1, 0))[0]
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, (s.double() + z).float(), rtol=0, atol=0)


@pytest.mark.parametrize(("sigma", "clip"), [(-1.0, 1.0), (1.0, 0.0), (float("inf"), 1.0)])
def test_bad_parameters(sigma, clip):
    with pytest.raises(ValueError, match="must be finite and > 0"):
        GaussianSumMechanism(sigma, clip)
    with pytest.raises(ValueError, match="noise std=-1"):
        gaussian_noise([torch.Size([2])], -1.0, OSBits())
