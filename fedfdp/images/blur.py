"""Ψ for images: a Gaussian blur whose output is the public view.

Section 6.3 of the FDP paper (``fdp_protected_attributes.txt``) takes the
blurred image as the public feature map: ``Ψ(x) = blur(x)``; the public loss is
the model's loss on the blurred image, ``ℓ_pub(w; Ψ(x)) = ℓ(w; blur(x))``,
and ``ℓ_priv = ℓ − ℓ_pub`` (Section 5). Training on blurred images alone is
(0, 0)-FDP; Algorithm 1 clips and noises only ``∇ℓ_priv``.

A public map here is any callable ``psi(x, generator) -> view`` with ``x`` a
batch ``(n, C, H, W)`` and ``view`` of the same shape, dtype and device,
record ``i``'s view depending only on ``Ψ(x_i)`` (and on data-independent
draws from ``generator``): the signature of :class:`fedfdp.features.PublicView`,
so a blur can stand where a tabular view stands: ``fedfdp.losses.FeatureMap(view=GaussianBlur())``
calls ``view(x, generator)``. :class:`GaussianBlur` ignores the generator;
:func:`check_public_map` validates a user-supplied callable on a probe batch.

What the blur discloses
-----------------------
FDP protects only what Ψ does not determine. A Gaussian blur of a float image
is an *invertible* linear map (with reflect padding at 28×28, kernel 9, σ = 2,
its smallest singular value is about 2e-6, not 0), so the exact float output
determines the image and the guarantee would protect almost nothing.
:class:`GaussianBlur` therefore quantises its output to ``levels`` grey levels
(default 256: an 8-bit blurred image, what a published blurred photo is). With
that default about 58% of the blur's singular directions (those with singular
value below the quantisation step 1/255) are no longer determined by Ψ; the
fine detail they carry is what FDP protects. ``levels=None`` gives the exact
blur (the paper's Ψ as written; use it knowing that it discloses nearly
everything). :func:`blur_singular_values` computes the spectrum for any
setting.

Sensitivity and relation
------------------------
Ψ is public by definition: it has no sensitivity and costs no privacy. The
add/remove relation (Def. 6) discloses Ψ of the added record to the simulator;
replacement (Def. 5) is between records with the same Ψ. The label is part of
Ψ whenever the loss on the view uses it (class-conditional models and
classifiers here): ``Ψ(x, y) = (blur(x), y)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "PADDINGS",
    "GaussianBlur",
    "PublicMap",
    "UserPublicMap",
    "apply_view",
    "blur_singular_values",
    "check_public_map",
    "gaussian_kernel1d",
]

#: Accepted padding modes of :class:`GaussianBlur`.
PADDINGS: tuple[str, ...] = ("reflect", "zeros")


class PublicMap(Protocol):
    """``psi(x, generator) -> view``: same shape as ``x``, depends only on Ψ(x)."""

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor: ...


def gaussian_kernel1d(kernel_size: int, sigma: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Normalised 1-D Gaussian weights ``w_j ∝ exp(−j²/(2σ²))``, ``j = −r..r``, ``r = k // 2``.

    Raises
    ------
    ValueError
        ``kernel_size`` not an odd integer >= 1, or ``sigma`` not finite and > 0.
    """
    _check_kernel(kernel_size, sigma)
    r = kernel_size // 2
    j = torch.arange(-r, r + 1, dtype=torch.float64)
    w = torch.exp(-(j**2) / (2.0 * float(sigma) ** 2))
    return (w / w.sum()).to(dtype)


def _check_kernel(kernel_size: int, sigma: float) -> None:
    if (
        isinstance(kernel_size, bool)
        or not isinstance(kernel_size, int)
        or kernel_size < 1
        or kernel_size % 2 == 0
    ):
        raise ValueError(f"blur-kernel-size={kernel_size!r}: must be an odd integer >= 1")
    if (
        isinstance(sigma, bool)
        or not isinstance(sigma, int | float)
        or not (math.isfinite(sigma) and sigma > 0)
    ):
        raise ValueError(f"blur-sigma={sigma!r}: must be a finite number > 0")


@dataclass(frozen=True)
class GaussianBlur:
    """Ψ(x): per-channel Gaussian blur (torch ``conv2d``), optionally quantised.

    The blur is separable: a depthwise ``1×k`` then ``k×1`` convolution with
    the weights of :func:`gaussian_kernel1d`, identical for every channel, in
    the input's dtype.

    Parameters
    ----------
    kernel_size : int
        Odd ``k >= 1``; the radius is ``r = k // 2``.
    sigma : float
        Blur standard deviation in pixels, ``> 0``.
    padding : {"reflect", "zeros"}
        ``"reflect"`` (default) mirrors the image about its edge pixels
        (``d c b | a b c d``), so every output pixel is a weighted *average*
        with weights summing to 1: a constant image stays constant, border
        brightness is kept and ``blur(a·x + b) = a·blur(x) + b`` (the view
        commutes with rescaling [0, 1] to [−1, 1]). ``"zeros"`` darkens the
        border and does not commute with a shift. Reflect needs
        ``r < min(H, W)``.
    levels : int or None
        Quantise the blurred image to ``levels`` equally spaced values of
        [0, 1] (round to nearest; default 256, an 8-bit image): this makes Ψ
        many-to-one, which is what gives FDP something to protect (module
        docstring). Inputs must then lie in [0, 1]. ``None``: the exact blur.

    Raises
    ------
    ValueError
        Bad ``kernel_size``, ``sigma``, ``padding`` or ``levels``.
    """

    kernel_size: int = 9
    sigma: float = 2.0
    padding: str = "reflect"
    levels: int | None = 256

    def __post_init__(self) -> None:
        _check_kernel(self.kernel_size, self.sigma)
        object.__setattr__(self, "sigma", float(self.sigma))
        if self.padding not in PADDINGS:
            raise ValueError(f"blur-padding={self.padding!r}: must be one of {PADDINGS}")
        if self.levels is not None and (
            isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 2
        ):
            raise ValueError(
                f"blur-levels={self.levels!r}: must be an integer >= 2 or None (no quantisation)"
            )

    @property
    def radius(self) -> int:
        """``r = kernel_size // 2``."""
        return self.kernel_size // 2

    def kernel2d(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The ``k×k`` kernel ``w wᵀ`` (sums to 1)."""
        w = gaussian_kernel1d(self.kernel_size, self.sigma, dtype)
        return torch.outer(w, w)

    def blur(self, x: torch.Tensor) -> torch.Tensor:
        """The exact (unquantised) blur of a batch ``(n, C, H, W)``."""
        _check_batch(x, "blur input")
        r = self.radius
        if r == 0:
            return x.clone()
        if self.padding == "reflect" and r >= min(x.shape[-2:]):
            raise ValueError(
                f"blur-kernel-size={self.kernel_size}: reflect padding needs radius {r} < image "
                f"size {tuple(x.shape[-2:])}"
            )
        channels = x.shape[1]
        w = gaussian_kernel1d(self.kernel_size, self.sigma, x.dtype).to(x.device)
        w_row = w.view(1, 1, 1, -1).expand(channels, 1, 1, self.kernel_size)
        w_col = w.view(1, 1, -1, 1).expand(channels, 1, self.kernel_size, 1)
        if self.padding == "reflect":
            y = F.pad(x, (r, r, 0, 0), mode="reflect")
            y = F.conv2d(y, w_row, groups=channels)
            y = F.pad(y, (0, 0, r, r), mode="reflect")
            return F.conv2d(y, w_col, groups=channels)
        y = F.conv2d(x, w_row, padding=(0, r), groups=channels)
        return F.conv2d(y, w_col, padding=(r, 0), groups=channels)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Ψ(x): the blurred (and, with ``levels``, quantised) batch; ``generator`` is unused.

        Record ``i``'s output depends on ``x_i`` only (depthwise convolution
        within the image); no randomness.
        """
        del generator
        out = self.blur(x)
        if self.levels is None:
            return out
        if x.numel() and (float(x.min()) < 0 or float(x.max()) > 1):
            raise ValueError(
                f"blur-levels={self.levels}: quantisation needs inputs in [0, 1], got "
                f"[{float(x.min()):g}, {float(x.max()):g}]"
            )
        steps = self.levels - 1
        return torch.round(out.clamp(0, 1) * steps) / steps


def _check_batch(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{what}: shape {shape}; need a batch (n, C, H, W)")
    if not x.is_floating_point():
        raise ValueError(f"{what}: dtype {x.dtype}; need a floating-point tensor")


def blur_singular_values(blur: GaussianBlur, height: int, width: int) -> np.ndarray:
    """Singular values of the exact blur as a linear map on one ``H×W`` channel.

    The blur is ``B = B_H ⊗ B_W`` (separable), so its singular values are the
    products ``s_i(B_H)·s_j(B_W)``; ``B_H`` is computed by blurring the rows of
    the identity. Sorted in decreasing order, ``H·W`` of them. A value below the
    quantisation step ``1/(levels − 1)`` marks a direction of image space that
    the quantised Ψ no longer determines (informative, not a proof).
    """

    def operator(n: int) -> np.ndarray:
        """The ``n×n`` matrix of the 1-D blur (column ``k`` = blur of ``e_k``)."""
        exact = GaussianBlur(blur.kernel_size, blur.sigma, blur.padding, None)
        basis = torch.eye(n, dtype=torch.float64).view(n, 1, 1, n)  # n images of 1×n
        if exact.padding == "reflect" and exact.radius >= n:
            raise ValueError(f"blur-kernel-size={blur.kernel_size}: radius {exact.radius} >= image size {n}")
        w = gaussian_kernel1d(exact.kernel_size, exact.sigma).view(1, 1, 1, -1)
        r = exact.radius
        if r == 0:
            return np.eye(n)
        if exact.padding == "reflect":
            out = F.conv2d(F.pad(basis, (r, r, 0, 0), mode="reflect"), w)
        else:
            out = F.conv2d(basis, w, padding=(0, r))
        return out.view(n, n).T.numpy()

    s_h = np.linalg.svd(operator(height), compute_uv=False)
    s_w = np.linalg.svd(operator(width), compute_uv=False)
    return np.sort(np.outer(s_h, s_w).ravel())[::-1]


@dataclass(frozen=True)
class UserPublicMap:
    """A user-supplied Ψ, validated on a probe batch (:func:`check_public_map`).

    Parameters
    ----------
    fn : callable
        ``fn(x, generator) -> view``.
    name : str
        For reports.
    needs_generator : bool
        Set by validation: whether ``fn`` draws from the generator.
    """

    fn: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor]
    name: str = "user"
    needs_generator: bool = False

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.needs_generator and generator is None:
            raise ValueError(
                f"public map {self.name!r} draws random values: pass an explicit torch.Generator"
            )
        out = self.fn(x, generator)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"public map {self.name!r}: returned {shape}; need {tuple(x.shape)} {x.dtype}")
        return out


def check_public_map(
    fn: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor],
    probe: torch.Tensor,
    name: str = "user",
    seed: int = 0,
) -> UserPublicMap:
    """Validate a user-supplied Ψ on a probe batch and wrap it.

    Checks (each failure is a one-line ``ValueError`` naming the map):

    * it returns a tensor of the probe's shape, dtype and device, finite;
    * it leaves the probe unchanged (no in-place edit);
    * it is reproducible: two calls without a generator give identical views,
      or else (a map that draws random values) two calls with generators
      seeded alike do; such a map is then refused without a generator;
    * it treats records separately: the view of a sub-batch equals the rows of
      the view of the whole batch (deterministic maps only; a map mixing
      records would let one record's private data reach another's public view).

    What cannot be checked is that the view depends on Ψ(x) only: that is the
    user's declaration of what is public.
    """
    _check_batch(probe, f"public map {name!r} probe")
    if probe.shape[0] < 2:
        raise ValueError(f"public map {name!r}: the probe batch needs at least 2 records")
    before = probe.clone()

    def call(g: torch.Generator | None) -> torch.Tensor:
        out = fn(probe, g)
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"public map {name!r}: returned {type(out).__name__}, not a tensor")
        if out.shape != probe.shape or out.dtype != probe.dtype or out.device != probe.device:
            raise ValueError(
                f"public map {name!r}: returned {tuple(out.shape)} {out.dtype} on {out.device}; "
                f"need the input's {tuple(probe.shape)} {probe.dtype} on {probe.device}"
            )
        if not torch.isfinite(out).all():
            raise ValueError(f"public map {name!r}: returned non-finite values")
        return out

    def seeded() -> torch.Generator:
        return torch.Generator(device=probe.device).manual_seed(seed)

    first: torch.Tensor | None = None
    second: torch.Tensor | None = None
    try:
        first, second = call(None), call(None)
    except ValueError as exc:
        if str(exc).startswith(f"public map {name!r}"):
            raise
    except (TypeError, RuntimeError):
        pass  # a map that needs its generator argument
    if not torch.equal(probe, before):
        raise ValueError(f"public map {name!r}: modified its input in place")
    needs_generator = first is None or second is None or not torch.equal(first, second)
    if first is None or second is None or needs_generator:
        first, second = call(seeded()), call(seeded())
        if not torch.equal(first, second):
            raise ValueError(
                f"public map {name!r}: differs between two generators seeded alike; draw all "
                "randomness from the generator argument"
            )
    else:
        half = probe.shape[0] // 2
        part = fn(probe[:half], None)
        if not isinstance(part, torch.Tensor) or not torch.equal(part, first[:half]):
            raise ValueError(
                f"public map {name!r}: the view of a sub-batch differs from the rows of the full "
                "batch's view; Ψ must treat each record on its own"
            )
    if not torch.equal(probe, before):
        raise ValueError(f"public map {name!r}: modified its input in place")
    return UserPublicMap(fn, name, needs_generator)


def apply_view(psi: PublicMap, x: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """``Ψ`` of every record of ``x``, record ``i``'s randomness from ``generators[i]``.

    A map that draws nothing (:class:`GaussianBlur`, or a validated user map that
    needs no generator) is applied to the whole batch at once; any other map one
    record at a time, so that a record's view does not depend on the records beside it.
    """
    if len(generators) != len(x):
        raise ValueError(f"{len(generators)} generators for {len(x)} records: need one per record")
    if isinstance(psi, GaussianBlur) or getattr(psi, "needs_generator", True) is False:
        return psi(x, None)
    # a map that draws does so with the records' CPU generators: apply it on the CPU
    if len(x) == 0:
        return psi(x.cpu(), torch.Generator().manual_seed(0)).to(x.device)
    return torch.cat([psi(x[i : i + 1].cpu(), g) for i, g in enumerate(generators)]).to(x.device)
