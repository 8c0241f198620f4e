"""Containers for federated datasets: devices' training records and a held-out test split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedfdp.features import FeatureSpec, PublicStatistics


@dataclass(frozen=True)
class DeviceData:
    """Training records of one device — the data protocol.

    ``x``: ``(n, ...)`` float32 inputs, one row per record (a feature vector,
    or an image ``(C, H, W)``); ``y``: ``(n,)`` int64 class labels. Your loader
    returns one per device; the feature map says which part of ``x`` is public.

    Examples
    --------
    >>> import numpy as np
    >>> from fedfdp import DeviceData
    >>> dev = DeviceData(np.zeros((3, 5), dtype=np.float32), np.array([0, 1, 1]))
    >>> len(dev), dev.y.dtype
    (3, dtype('int64'))
    """

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        x, y = np.asarray(self.x), np.asarray(self.y)
        if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"device data shapes x={x.shape}, y={y.shape}: need (n, ...) and (n,)")
        if not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"device labels dtype {y.dtype}: must be integer class indices")
        object.__setattr__(self, "x", x.astype(np.float32, copy=False))
        object.__setattr__(self, "y", y.astype(np.int64, copy=False))

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class FederatedData:
    """A dataset split over devices, with a held-out test set.

    Attributes
    ----------
    name : str
    spec : FeatureSpec or None
        Which columns are public (Ψ) and which private; ``None`` for images, whose
        Ψ is not a set of columns but the blur of the whole image (``image_shape``).
    devices : tuple of DeviceData
        Training records per device (the only records training touches).
    test_x, test_y : np.ndarray
        Held-out split, used only for server-side evaluation.
    class_names : tuple of str
    public_statistics : PublicStatistics or None
        Public constants for ``mean`` imputation, if the dataset declares them.
    public_loss : str
        The public-loss construction used when the configuration says
        ``public-loss = "auto"``: zero masking (every private column at the
        centre of its encoding) unless the dataset declares another; Gaussian
        padding, the paper's Purchase100 choice, lost to it on every table
        measured (docs/algorithm.md).
    input_bound : float or None
        A declared (public) bound ``|x_k| ≤ input_bound`` on every input, if the
        dataset has one (the synthetic ``correlated`` data: ``1/√m``); CorrDP-SGD
        clamps inputs to it (``corrdp-feature-bound``).
    image_shape : (C, H, W) or None
        Image datasets: every record's ``x`` is a ``(C, H, W)`` image in [0, 1] and the
        public view is its Gaussian blur (``blur-kernel``, ``blur-sigma``, ``blur-levels``;
        :func:`fedfdp.losses.build_decomposition`); ``None`` for tables.
    estimated_ranges : tuple of (column, low, high)
        Ranges of private columns released by ``private-statistics = "estimate"``
        (Gaussian-noised, charged to the ledger; :mod:`fedfdp.data.private_statistics`),
        which :func:`fedfdp.run_plan.resolve_released` writes into the run's configuration
        (``estimated-ranges``) so that every process encodes alike.
    estimated_categories : tuple of (column, categories)
        The same for text columns (a noisy thresholded histogram; ``estimated-categories``).

    Your own data plugs in as one of these (no change to ``fedfdp/data``): in
    Python, pass it to :func:`fedfdp.run_centralised`; in a configuration, name
    a loader ``dataset = "package.module:load"`` with
    ``load(cfg: DataConfig) -> FederatedData`` (``docs/datasets.md``).

    Examples
    --------
    >>> import numpy as np
    >>> from fedfdp import DeviceData, FederatedData
    >>> from fedfdp.features import FeatureSpec
    >>> rng = np.random.default_rng(0)
    >>> devices = tuple(DeviceData(rng.normal(size=(20, 3)), rng.integers(0, 2, 20)) for _ in range(4))
    >>> data = FederatedData("mine", FeatureSpec(("a", "b", "c"), ("a", "b"), ("c",)), devices,
    ...                      rng.normal(size=(10, 3)).astype(np.float32), rng.integers(0, 2, 10),
    ...                      class_names=("no", "yes"))
    >>> data.num_records, data.num_features, data.num_classes
    (80, 3, 2)
    """

    name: str
    spec: FeatureSpec | None
    devices: tuple[DeviceData, ...]
    test_x: np.ndarray
    test_y: np.ndarray
    class_names: tuple[str, ...]
    public_statistics: PublicStatistics | None = None
    public_loss: str = "zero"
    input_bound: float | None = None
    image_shape: tuple[int, int, int] | None = None
    estimated_ranges: tuple[tuple[str, float, float], ...] = ()
    estimated_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"name={self.name!r}: must be a string")
        if self.spec is not None and not isinstance(self.spec, FeatureSpec):
            raise ValueError(f"spec={self.spec!r}: must be a FeatureSpec (or None for images)")
        if (self.spec is None) == (self.image_shape is None):
            raise ValueError(
                f"dataset {self.name!r}: give a FeatureSpec (a table) or an image_shape (images), "
                "exactly one"
            )
        if isinstance(self.devices, DeviceData) or not isinstance(self.devices, tuple | list):
            raise ValueError(f"devices={type(self.devices).__name__}: must be a tuple of DeviceData")
        object.__setattr__(self, "devices", tuple(self.devices))
        wrong = next((d for d in self.devices if not isinstance(d, DeviceData)), None)
        if wrong is not None:
            raise ValueError(f"devices: an element is a {type(wrong).__name__}, not a DeviceData")
        if isinstance(self.class_names, str) or not isinstance(self.class_names, tuple | list):
            raise ValueError(f"class_names={self.class_names!r}: must be a tuple of class names, one per "
                             "class (not one string)")
        object.__setattr__(self, "class_names", tuple(self.class_names))
        if len(self.class_names) < 2 or len(set(self.class_names)) != len(self.class_names):
            raise ValueError(f"class_names={self.class_names!r}: a classifier needs at least two distinct "
                             "class names")
        self._check_shapes()

    def _check_shapes(self) -> None:
        """The held-out split has one label per input; every record has the same shape
        (the spec's width for a table, ``image_shape`` for images).
        """
        tx, ty = np.shape(self.test_x), np.shape(self.test_y)
        if len(tx) < 2 or len(ty) != 1 or tx[0] != ty[0]:
            raise ValueError(f"test_x shape {tx}, test_y shape {ty}: the held-out split needs (n, ...) "
                             "inputs and (n,) labels, one label per input")
        want = (tuple(self.image_shape) if self.image_shape is not None
                else (len(self.spec.columns),) if self.spec is not None else tx[1:])
        for where, shape in (("test_x", tx), *((f"device {i}", np.shape(d.x)) for i, d in
                                               enumerate(self.devices))):
            if tuple(shape[1:]) != want:
                raise ValueError(f"{where}: records of shape {tuple(shape[1:])}, but the "
                                 f"{'image_shape' if self.image_shape is not None else 'spec'} says {want}")

    @property
    def is_image(self) -> bool:
        """Whether records are ``(C, H, W)`` images (Ψ = blur) rather than table rows."""
        return self.image_shape is not None

    @property
    def num_features(self) -> int:
        """Input width (``C·H·W`` for images)."""
        if self.image_shape is not None:
            c, h, w = self.image_shape
            return c * h * w
        if self.spec is None:  # refused in __post_init__; kept for type narrowing
            raise RuntimeError(f"dataset {self.name!r} has neither a spec nor an image shape")
        return len(self.spec.columns)

    @property
    def num_classes(self) -> int:
        """Number of labels."""
        return len(self.class_names)

    @property
    def sizes(self) -> np.ndarray:
        """Training records per device (public: dataset sizes are disclosed)."""
        return np.array([len(d) for d in self.devices], dtype=np.int64)

    @property
    def num_records(self) -> int:
        """``N``: training records over all devices."""
        return int(self.sizes.sum())

    def partition(self, partition_id: int, num_partitions: int) -> tuple[int, ...]:
        """Devices served by Flower partition ``partition_id`` of ``num_partitions``.

        Device ``d`` goes to partition ``d mod num_partitions``; with as many
        partitions as devices each SuperNode holds exactly one device.
        """
        if not 0 <= partition_id < num_partitions:
            raise ValueError(f"partition-id={partition_id}: must be in [0, num-partitions={num_partitions})")
        return tuple(range(partition_id, len(self.devices), num_partitions))
