"""How much of an image does Ψ = blur disclose? Deconvolve it and see.

FDP protects only what Ψ(x) does not determine. This script reconstructs MNIST
digits from their blurred images by linear deconvolution and reports the
root-mean-square pixel error (pixels in [0, 1]):

* the exact blur in float32 (``levels=None``, the paper's Ψ as written),
  inverted by solving the linear system, then rounded to 8 bits: how many
  pixels come back exactly;
* the 8-bit blurred image (``levels=256``, the default Ψ), inverted with
  Tikhonov regularisation ``x̂ = argmin ‖Bx − b‖² + λ‖x‖²`` over a grid of λ
  (the best λ is chosen on the same images: an optimistic attacker, which is
  the right side to err on).

A linear deconvolution is a weak attacker (no image prior); the errors it
reaches are upper bounds on what Ψ hides, not lower bounds.

Usage::

    python benchmarks/images_psi_disclosure.py [--images 200] [--kernel 9] [--sigma 2.0] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from fedfdp.images.blur import GaussianBlur, blur_singular_values
from fedfdp.images.sources import load_mnist5k


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--kernel", type=int, default=9)
    parser.add_argument("--sigma", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_mnist5k()
    n = args.images
    x = np.array(data.x[:n], dtype=np.float64).reshape(n, -1).T  # (784, n)
    exact = GaussianBlur(args.kernel, args.sigma, levels=None)
    side = data.shape.height
    basis = torch.eye(side * side, dtype=torch.float64).view(-1, 1, side, side)
    matrix = exact(basis).view(side * side, side * side).T.numpy()  # column k = blur of e_k
    u, s, vt = np.linalg.svd(matrix)

    def rmse(a: np.ndarray) -> float:
        return float(np.sqrt(((a - x) ** 2).mean()))

    def tikhonov(b: np.ndarray, lam: float) -> np.ndarray:
        return np.clip(vt.T @ ((s / (s**2 + lam))[:, None] * (u.T @ b)), 0, 1)

    blurred = matrix @ x
    float32 = blurred.astype(np.float32).astype(np.float64)
    inverse = np.clip(np.linalg.solve(matrix, float32), 0, 1)
    eight_bit = (
        GaussianBlur(args.kernel, args.sigma, levels=256)(torch.from_numpy(x.T.reshape(n, 1, side, side)))
        .numpy()
        .reshape(n, -1)
        .T
    )
    grid = [10.0**k for k in range(-12, 0)]
    per_lambda = {lam: rmse(tikhonov(eight_bit, lam)) for lam in grid}
    best = min(per_lambda, key=per_lambda.__getitem__)
    result = {
        "images": n,
        "kernel_size": args.kernel,
        "sigma": args.sigma,
        "smallest_singular_value": float(s.min()),
        "fraction_singular_values_below_1_255": float(
            (blur_singular_values(exact, side, side) < 1 / 255).mean()
        ),
        "rmse_blurred_image_vs_original": rmse(blurred),
        "rmse_float32_blur_inverted": rmse(inverse),
        "fraction_pixels_exact_after_8bit_rounding": float(
            (np.round(inverse * 255) == np.round(x * 255)).mean()
        ),
        "rmse_8bit_blur_best_tikhonov": per_lambda[best],
        "best_lambda": best,
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            print(f"{key:48s} {value:.4g}" if isinstance(value, float) else f"{key:48s} {value}")


if __name__ == "__main__":
    main()
