"""Image sets and their device splits: the containers every image source fills.

Every image set holds ``x`` as ``(N, C, H, W)`` **float32 in [0, 1]** (not
normalised: the models and the diffusion loss rescale themselves) and ``y`` as
``(N,)`` int64 class indices ``0..K-1``. Arrays are read-only. The sources
(MNIST-5k, scikit-learn's digits and photographs, users' NPZ and PNG files) are
in :mod:`fedfdp.images.sources`.

Splits
------
:func:`split_images` holds out a class-stratified test split (server-side
evaluation only) and spreads the rest over devices IID or with per-class
``Dirichlet(α)`` proportions, using the project's one implementation of those
splits (:func:`fedfdp.data.split.split_records`,
:func:`fedfdp.data.split.holdout_records`). All randomness comes from an
explicit ``numpy.random.Generator`` derived from ``seed``; a split is public
(data-independent apart from the labels' class sizes, which the split discloses
and the FDP threat model treats as public, like ``N``).

Errors
------
Bad values raise :class:`ImageDataError` (a
:class:`~fedfdp.data.split.DataError`) with one line naming the set and the
value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedfdp.data.split import (
    DataError,
    data_rng,
    holdout_records,
    split_records,
)

__all__ = [
    "MAX_CHANNELS",
    "DeviceImages",
    "FederatedImages",
    "ImageDataError",
    "ImageSet",
    "ImageShape",
    "as_image_set",
    "split_images",
]

#: Most channels an image may have.
MAX_CHANNELS = 4
_STREAM_TEST, _STREAM_DEVICES = 0, 1


class ImageDataError(DataError):
    """Bad image data (file, shape, channels, values, labels, split); the message
    names the file or key and the value.
    """


# --------------------------------------------------------------------------- #
# containers
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ImageShape:
    """Shape of one image, ``(channels, height, width)``.

    Raises
    ------
    ValueError
        A dimension that is not a positive integer, or more than 4 channels.
    """

    channels: int
    height: int
    width: int

    def __post_init__(self) -> None:
        for name in ("channels", "height", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"image {name}={value!r}: must be an integer >= 1")
            object.__setattr__(self, name, int(value))
        if self.channels > MAX_CHANNELS:
            raise ValueError(f"image channels={self.channels}: at most {MAX_CHANNELS}")

    @property
    def size(self) -> int:
        """Values per image, ``C·H·W``."""
        return self.channels * self.height * self.width

    def as_tuple(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        return (self.channels, self.height, self.width)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _check_xy(x: np.ndarray, y: np.ndarray, num_classes: int, where: str) -> None:
    if not isinstance(x, np.ndarray) or x.ndim != 4:
        shape = getattr(x, "shape", type(x).__name__)
        raise ImageDataError(f"{where}: x has shape {shape}; need (N, C, H, W)")
    try:
        ImageShape(*x.shape[1:])
    except ValueError as exc:
        raise ImageDataError(f"{where}: {exc} (x has shape {x.shape})") from None
    if x.dtype != np.float32:
        raise ImageDataError(f"{where}: x has dtype {x.dtype}; need float32 in [0, 1]")
    if x.size and not np.isfinite(x).all():
        raise ImageDataError(f"{where}: x has non-finite values")
    if x.size and (x.min() < 0 or x.max() > 1):
        raise ImageDataError(f"{where}: x has values in [{x.min():g}, {x.max():g}]; need [0, 1]")
    if not isinstance(y, np.ndarray) or y.ndim != 1 or len(y) != len(x):
        shape = getattr(y, "shape", type(y).__name__)
        raise ImageDataError(f"{where}: y has shape {shape}; need ({len(x)},)")
    if y.dtype != np.int64:
        raise ImageDataError(f"{where}: y has dtype {y.dtype}; need int64 class indices")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ImageDataError(f"{where}: labels in [{y.min()}, {y.max()}]; need 0..{num_classes - 1}")


@dataclass(frozen=True, eq=False)
class ImageSet:
    """Labelled images: ``x`` ``(N, C, H, W)`` float32 in [0, 1], ``y`` ``(N,)`` int64.

    Parameters
    ----------
    name : str
        Where the images came from (for messages and reports).
    x, y : np.ndarray
        Stored read-only.
    class_names : tuple of str
        ``K >= 2`` names; ``y`` holds indices into them.

    Raises
    ------
    ImageDataError
        Wrong shapes or dtypes, values outside [0, 1], labels outside ``0..K-1``,
        fewer than two classes.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    class_names: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_names", tuple(str(c) for c in self.class_names))
        if len(self.class_names) < 2:
            raise ImageDataError(f"{self.name}: {len(self.class_names)} class(es); need at least two")
        _check_xy(self.x, self.y, len(self.class_names), self.name)
        object.__setattr__(self, "x", _readonly(self.x))
        object.__setattr__(self, "y", _readonly(self.y))

    @property
    def shape(self) -> ImageShape:
        """Shape of one image."""
        return ImageShape(*self.x.shape[1:])

    @property
    def num_classes(self) -> int:
        """``K``."""
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.y)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` as torch tensors (copies: the arrays here are read-only)."""
        return torch.from_numpy(np.array(self.x)), torch.from_numpy(np.array(self.y))


@dataclass(frozen=True, eq=False)
class DeviceImages:
    """One device's training images (same layout as :class:`ImageSet`)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.ndim != 4 or self.y.ndim != 1 or len(self.x) != len(self.y):
            raise ImageDataError(
                f"device images x={self.x.shape}, y={self.y.shape}: need (n, C, H, W) and (n,)"
            )
        object.__setattr__(self, "x", _readonly(self.x))
        object.__setattr__(self, "y", _readonly(self.y))

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True, eq=False)
class FederatedImages:
    """Images split over devices, with a held-out test split.

    Attributes
    ----------
    name : str
    devices : tuple of DeviceImages
        Training images per device (the only images training touches).
    test_x, test_y : np.ndarray
        Held-out split: server-side evaluation (and FID reference) only.
    class_names : tuple of str
    """

    name: str
    devices: tuple[DeviceImages, ...]
    test_x: np.ndarray
    test_y: np.ndarray
    class_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.devices:
            raise ImageDataError(f"{self.name}: no devices")
        shapes = {d.x.shape[1:] for d in self.devices} | {self.test_x.shape[1:]}
        if len(shapes) != 1:
            raise ImageDataError(f"{self.name}: devices and test split disagree on image shape {shapes}")
        _check_xy(self.test_x, self.test_y, len(self.class_names), f"{self.name} (test split)")
        object.__setattr__(self, "test_x", _readonly(self.test_x))
        object.__setattr__(self, "test_y", _readonly(self.test_y))

    @property
    def shape(self) -> ImageShape:
        """Shape of one image."""
        return ImageShape(*self.test_x.shape[1:])

    @property
    def num_classes(self) -> int:
        """``K``."""
        return len(self.class_names)

    @property
    def num_records(self) -> int:
        """Training images over all devices (``N``, public)."""
        return sum(len(d) for d in self.devices)

    def train(self) -> ImageSet:
        """All devices' training images as one set (for the centralised reference)."""
        x = np.concatenate([d.x for d in self.devices])
        y = np.concatenate([d.y for d in self.devices])
        return ImageSet(self.name, x, y, self.class_names)

    def test(self) -> ImageSet:
        """The held-out split as an :class:`ImageSet`."""
        return ImageSet(f"{self.name} (test)", self.test_x, self.test_y, self.class_names)


# --------------------------------------------------------------------------- #
# splits
# --------------------------------------------------------------------------- #


def split_images(
    data: ImageSet,
    num_devices: int = 1,
    *,
    dirichlet_alpha: float = 0.0,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> FederatedImages:
    """Hold out a test split and spread the rest over devices.

    Parameters
    ----------
    data : ImageSet
    num_devices : int
        Devices ``D >= 1``.
    dirichlet_alpha : float
        0: IID (a random permutation cut into ``D`` near-equal parts); ``α > 0``:
        each class's images spread over the devices with ``Dirichlet(α)``
        proportions (non-IID label mixes; small ``α``, few classes per device).
    test_fraction : float
        In ``(0, 1)``: ``round(test_fraction · n_c)`` images of every class ``c``
        are held out (class-stratified).
    seed : int
        Public data seed (test split and device split have separate streams).

    Raises
    ------
    ImageDataError
        Bad arguments, an empty test split, a device without images, a class
        absent from the training split.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ImageDataError(f"num-devices={num_devices!r}: must be an integer >= 1")
    alpha = float(dirichlet_alpha)
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ImageDataError(f"dirichlet-alpha={dirichlet_alpha!r}: must be finite and >= 0 (0 = IID)")
    frac = float(test_fraction)
    if not 0 < frac < 1:
        raise ImageDataError(f"test-fraction={test_fraction!r}: must be in (0, 1)")
    test = holdout_records(data.y, frac, data_rng(seed, _STREAM_TEST))
    if not test.any():
        raise ImageDataError(f"test-fraction={frac}: dataset {data.name!r} has an empty held-out split")
    train = np.flatnonzero(~test)
    y_train = data.y[train]
    if len(np.unique(y_train)) < 2:
        raise ImageDataError(f"test-fraction={frac}: the training split of {data.name!r} has a single class")
    try:
        device = split_records(
            y_train, num_devices, alpha, data_rng(seed, _STREAM_DEVICES), dataset=data.name
        )
    except DataError as exc:
        raise ImageDataError(str(exc)) from None
    devices = []
    for d in range(num_devices):
        idx = train[device == d]
        if len(idx) == 0:
            raise ImageDataError(f"num-devices={num_devices}: device {d} of {data.name!r} has no images")
        devices.append(DeviceImages(data.x[idx], data.y[idx]))
    return FederatedImages(data.name, tuple(devices), data.x[test], data.y[test], data.class_names)


def as_image_set(
    name: str, x: np.ndarray, y: Sequence[int] | np.ndarray, class_names: Sequence[str]
) -> ImageSet:
    """Validate arrays already in memory (``(N, C, H, W)`` in [0, 1], labels 0..K-1)."""
    return ImageSet(name, np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64), tuple(class_names))
