r"""Sample quality: a Fréchet distance on a small digit classifier's features, and PNG grids.

**This is not the Inception FID** of Heusel et al. (2017) and its numbers are
not comparable with published FIDs (the FDP paper's AFHQ/LSUN numbers
included). It is the same *formula* on other features: the penultimate
activations (``f`` = 128 values after ReLU) of a :class:`~fedfdp.images.models.DigitCNN`
trained on real digits (:func:`train_feature_classifier`),

.. math::

    \mathrm{FD}(A, B) = \lVert μ_A − μ_B \rVert^2
        + \operatorname{tr}\bigl(Σ_A + Σ_B − 2 (Σ_A^{1/2} Σ_B Σ_A^{1/2})^{1/2}\bigr),

with ``μ, Σ`` the mean and (unbiased) covariance of the features of each set
(computed in float64; the matrix square root by symmetric eigendecomposition,
negative eigenvalues from rounding set to 0). It is 0 for two identical sets,
grows with the distance between the feature distributions, and is biased
upwards for small sets (compare sets of equal size). Per-class distances compare
the samples generated for class ``c`` with the real images of class ``c``.

The feature classifier is a measuring instrument, trained without privacy on
whatever images the caller passes (the measurement scripts use the held-out
split, never the training records of the private models); it is not released
and sits outside every privacy guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedfdp.contribution import CPU, model_device
from fedfdp.images.data import ImageSet, ImageShape
from fedfdp.images.diffusion import DiffusionLoss, draw_noise, mse_per_record, sample
from fedfdp.images.models import DigitCNN, build_classifier

__all__ = [
    "FIDReport",
    "FeatureStats",
    "GenerationEvaluation",
    "class_rows",
    "feature_stats",
    "fid_report",
    "frechet_distance",
    "image_features",
    "save_grid",
    "train_feature_classifier",
]


@dataclass(frozen=True, eq=False)
class FeatureStats:
    """Mean ``(f,)`` and covariance ``(f, f)`` of a set's features (float64), and its size."""

    mean: np.ndarray
    cov: np.ndarray
    count: int


def _sqrt_psd(a: np.ndarray) -> np.ndarray:
    vals, vecs = np.linalg.eigh((a + a.T) / 2)
    return (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T


def frechet_distance(a: FeatureStats, b: FeatureStats) -> float:
    """Fréchet distance between the Gaussians ``N(μ_a, Σ_a)`` and ``N(μ_b, Σ_b)`` (formula above)."""
    if a.mean.shape != b.mean.shape:
        raise ValueError(f"feature sizes differ: {a.mean.shape} vs {b.mean.shape}")
    root_a = _sqrt_psd(a.cov)
    middle = root_a @ b.cov @ root_a
    vals = np.linalg.eigvalsh((middle + middle.T) / 2)
    cross = float(np.sqrt(np.clip(vals, 0, None)).sum())
    diff = a.mean - b.mean
    value = float(diff @ diff + np.trace(a.cov) + np.trace(b.cov) - 2 * cross)
    return max(value, 0.0)


@torch.no_grad()
def image_features(model: DigitCNN, images: np.ndarray | torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """Penultimate features ``(n, f)`` (float64) of images ``(n, C, H, W)`` in [0, 1]."""
    x = images.float() if isinstance(images, torch.Tensor) else torch.from_numpy(np.array(images, np.float32))
    was_training = model.training
    model.eval()
    try:
        parts = [model.features(x[s : s + batch_size]).double() for s in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
    if not parts:
        return np.zeros((0, model.head.in_features))
    return torch.cat(parts).numpy()


def feature_stats(features: np.ndarray) -> FeatureStats:
    """Mean and unbiased covariance of ``features`` ``(n, f)``, ``n >= 2``."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"features of shape {f.shape}: need (n, f) with n >= 2")
    return FeatureStats(f.mean(0), np.cov(f, rowvar=False), f.shape[0])


@dataclass(frozen=True)
class FIDReport:
    """Feature-space Fréchet distances: ``overall`` and per class (``None``: too few samples)."""

    overall: float
    per_class: tuple[float | None, ...]
    generated: int
    reference: int

    def as_dict(self) -> dict[str, object]:
        """Plain values for JSON."""
        return {
            "fid": self.overall,
            "fid_per_class": list(self.per_class),
            "generated": self.generated,
            "reference": self.reference,
        }


def fid_report(
    model: DigitCNN,
    generated: np.ndarray | torch.Tensor,
    generated_labels: np.ndarray | torch.Tensor,
    reference: ImageSet,
    *,
    min_per_class: int = 10,
) -> FIDReport:
    """Overall and per-class Fréchet distances of ``generated`` to ``reference``.

    Per class ``c``: the generated images labelled ``c`` against the reference
    images of class ``c`` (``None`` when either has fewer than
    ``min_per_class``).
    """
    gen = image_features(model, generated)
    ref = image_features(model, reference.x)
    gy = np.asarray(generated_labels)
    overall = frechet_distance(feature_stats(gen), feature_stats(ref))
    per_class: list[float | None] = []
    for c in range(reference.num_classes):
        a, b = gen[gy == c], ref[reference.y == c]
        if len(a) < max(2, min_per_class) or len(b) < max(2, min_per_class):
            per_class.append(None)
        else:
            per_class.append(frechet_distance(feature_stats(a), feature_stats(b)))
    return FIDReport(overall, tuple(per_class), len(gen), len(ref))


def train_feature_classifier(
    data: ImageSet,
    *,
    epochs: int = 20,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    width: int = 32,
    generator: torch.Generator,
) -> tuple[DigitCNN, float]:
    """Train the FID feature network (non-private, Adam; a :class:`DigitCNN` of ``width``
    channels, 128 features) on ``data``.

    Returns the model (eval mode) and its accuracy on ``data`` itself (a
    sanity check, not a generalisation estimate). Batches are shuffled with
    ``generator``.
    """
    model = build_classifier(data.shape, data.num_classes, width=width, generator=generator)
    x, y = data.tensors()
    opt = torch.optim.Adam(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for s in range(0, len(y), batch_size):
            idx = order[s : s + batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(x).argmax(1) == y).double().mean())
    return model, acc


#: Epochs and width of the Fréchet distance's feature network in a run's evaluation
#: (cheap: it is trained once per run, on the held-out split).
FEATURE_EPOCHS, FEATURE_WIDTH = 5, 16
# spawn keys of the evaluation's public streams under the run seed
_EVAL_ROOT, _FEATURES, _SAMPLER, _HELD_OUT_DRAW = 9, 0, 1, 2


def _eval_generator(seed: int, purpose: int) -> torch.Generator:
    seq = np.random.SeedSequence(entropy=seed, spawn_key=(_EVAL_ROOT, purpose))
    return torch.Generator().manual_seed(int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1)))


@dataclass(eq=False)
class GenerationEvaluation:
    """``evaluate(round, model)`` of a diffusion run (``model = "ddpm"``): generation and
    the Fréchet distance as an evaluation step of the run loop.

    Reports ``loss``, the diffusion loss ``ℓ`` on up to ``samples`` held-out records
    (one fixed draw of ``(t, ε)`` per run, so rounds compare), and ``fd``, the Fréchet
    distance (:func:`frechet_distance`) between ``samples`` images generated with
    ``steps`` sampler steps (class-balanced labels, one fixed sampler stream per run) and
    the held-out images, on the 128 penultimate features of a :class:`DigitCNN` trained
    on the held-out split (``FEATURE_EPOCHS`` epochs, ``FEATURE_WIDTH`` channels) — not
    Inception FID. The feature
    network and the held-out statistics are computed at the first evaluation and kept in
    memory. Every stream derives from the public ``seed``. Evaluation reads held-out
    records only; it is a measurement, outside the guarantee, and releases nothing the
    ledger charges.
    """

    loss: DiffusionLoss
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    samples: int = 200
    steps: int = 50
    seed: int = 0
    _features: DigitCNN | None = field(default=None, init=False, repr=False)
    _reference: FeatureStats | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("samples", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if len(self.test_y) < 2:
            raise ValueError(f"the held-out split has {len(self.test_y)} image(s); the Fréchet distance "
                             "needs at least two")

    @property
    def shape(self) -> ImageShape:
        """The images' ``(C, H, W)``."""
        return ImageShape(*self.test_x.shape[1:])

    def feature_network(self) -> DigitCNN:
        """The feature network, trained once on the held-out split (public seed)."""
        if self._features is None:
            names = tuple(str(k) for k in range(self.num_classes))
            held_out = ImageSet("held-out", np.asarray(self.test_x, dtype=np.float32),
                                np.asarray(self.test_y, dtype=np.int64), names)
            self._features, _ = train_feature_classifier(held_out, epochs=FEATURE_EPOCHS, width=FEATURE_WIDTH,
                                                         generator=_eval_generator(self.seed, _FEATURES))
            self._reference = feature_stats(image_features(self._features, held_out.x))
        return self._features

    @torch.no_grad()
    def held_out_loss(self, model: nn.Module) -> float:
        """The mean diffusion loss ``ℓ`` on up to ``samples`` held-out records."""
        n = min(self.samples, len(self.test_y))
        x = torch.from_numpy(np.array(self.test_x[:n], dtype=np.float32))
        y = torch.from_numpy(np.array(self.test_y[:n], dtype=np.int64))
        draw = draw_noise(n, self.shape, self.loss.schedule, _eval_generator(self.seed, _HELD_OUT_DRAW))
        was_training = model.training
        model.eval()
        try:
            (inputs,) = self.loss.full_inputs(x, y, draw)  # drawn on the CPU, run on the model's device
            return float(mse_per_record(model(inputs.to(model_device(model))).to(CPU), draw.noise).mean())
        finally:
            model.train(was_training)

    def __call__(self, round_: int, model: nn.Module) -> dict[str, float]:
        """``{"loss": ..., "fd": ...}`` of ``model`` after round ``round_``."""
        features = self.feature_network()
        labels = torch.arange(self.samples) % self.num_classes
        steps = min(self.steps, self.loss.schedule.steps)
        images = sample(model, self.loss.schedule, labels, self.shape, _eval_generator(self.seed, _SAMPLER),
                        steps=steps)
        if self._reference is None:  # set with the feature network
            raise RuntimeError("no held-out feature statistics")
        generated = feature_stats(image_features(features, images))
        return {"loss": self.held_out_loss(model), "fd": frechet_distance(generated, self._reference)}


def save_grid(
    images: np.ndarray | torch.Tensor,
    path: str | Path,
    *,
    nrow: int = 10,
    padding: int = 1,
    scale: int = 2,
) -> Path:
    """Write images ``(n, C, H, W)`` in [0, 1] as one PNG grid, ``nrow`` per row.

    Grey images are written grey, three channels as RGB; the gaps are white.
    Uses matplotlib's image writer (no figure). Returns the path.
    """
    from matplotlib import image as mpimg

    a = np.asarray(images, dtype=np.float32)
    if a.ndim != 4 or a.shape[1] not in (1, 3) or len(a) == 0:
        raise ValueError(f"save_grid: images of shape {a.shape}; need (n, 1 or 3, H, W), n >= 1")
    if nrow < 1 or padding < 0 or scale < 1:
        raise ValueError(f"save_grid: nrow={nrow}, padding={padding}, scale={scale}: need >= 1, >= 0, >= 1")
    n, c, h, w = a.shape
    rows = -(-n // nrow)
    grid = np.ones((c, rows * (h + padding) + padding, nrow * (w + padding) + padding), dtype=np.float32)
    for i in range(n):
        r, k = divmod(i, nrow)
        top, left = padding + r * (h + padding), padding + k * (w + padding)
        grid[:, top : top + h, left : left + w] = np.clip(a[i], 0, 1)
    grid = grid.repeat(scale, axis=1).repeat(scale, axis=2)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if c == 1:
        mpimg.imsave(path, grid[0], cmap="gray", vmin=0.0, vmax=1.0)
    else:
        mpimg.imsave(path, grid.transpose(1, 2, 0))
    return path


def class_rows(num_classes: int, per_class: int) -> torch.Tensor:
    """Labels ``0,0,..,1,1,..`` (``per_class`` each): one grid row per class with ``nrow = per_class``."""
    return torch.arange(num_classes).repeat_interleave(per_class)
