"""The closed choices of the configuration, as enums.

Every choice is an :class:`enum.StrEnum`, so a member *is* the string it is
written as: ``Mode.FDP == "fdp"``, it hashes like ``"fdp"``, it is written as
``"fdp"`` to TOML, JSON and Flower run configs, and ``f"{Mode.FDP}"`` is
``fdp``. Its ``repr`` is the TOML literal (``'fdp'``), so an error message
reads ``mode='fdp'`` as it did with plain strings. The parsers
(:mod:`fedfdp.config.values`) turn the strings of a TOML file into members; the
dataclass fields (:mod:`fedfdp.config.schema`) hold members; code compares
against members (``p.mode is Mode.FDP``), never literals.

``model`` and ``dataset`` are not closed (an import path to your own builder or
loader is accepted): they stay strings, with the built-in names in
:data:`MODELS` and :data:`DATASETS`.
"""

from __future__ import annotations

from enum import StrEnum


class Choice(StrEnum):
    """A closed configuration choice; ``repr`` is the TOML literal (``'fdp'``)."""

    def __repr__(self) -> str:
        return repr(self.value)


class Mode(Choice):
    """``mode``: what each round computes and what its ε means (``fedfdp.modes``).

    Examples
    --------
    >>> Mode("fdp-dpsgd") is Mode.FDP_DPSGD, Mode.DP == "dp", Mode.PUBLIC.is_private
    (True, True, False)
    """

    NONPRIVATE = "nonprivate"
    PUBLIC = "public"
    DP = "dp"
    FDP = "fdp"
    FDP_DPSGD = "fdp-dpsgd"
    CORRDP = "corrdp"

    @property
    def is_private(self) -> bool:
        """Whether the mode adds noise and spends ε (``dp``, ``fdp``, ``fdp-dpsgd``, ``corrdp``)."""
        return self in PRIVATE_MODES


class PrivacyUnit(Choice):
    """``privacy-unit``: what one neighbour differs by."""

    RECORD = "record"
    DEVICE = "device"


class PublicLoss(Choice):
    """``public-loss``: how the public view Ψ-input of a table row is built.

    (Named after its key: :class:`fedfdp.features.PublicView` is the view itself.)
    """

    AUTO = "auto"
    GAUSSIAN = "gaussian"
    ZERO = "zero"
    MEAN = "mean"
    LABEL_FREE = "label-free"


class Optimizer(Choice):
    """``optimizer``: the server's optimiser."""

    SGD = "sgd"
    ADAM = "adam"


class DataLocation(Choice):
    """``data-location``: ``central`` (every node loads the dataset the run names
    and serves its partition) or ``node`` (each SuperNode reads its own file,
    named in its node config).
    """

    CENTRAL = "central"
    NODE = "node"


class Aggregation(Choice):
    """``aggregation``: who may see the sum of the clipped private gradients.

    ``plain``: the server receives each node's sum and adds the noise (a trusted
    server). ``secagg``: secure aggregation (SecAgg+) with distributed discrete
    Gaussian noise; the server sees only the noisy sum over the survivors
    (``docs/secagg_accounting.md``).
    """

    PLAIN = "plain"
    SECAGG = "secagg"


class ClipShares(Choice):
    """``corrdp-clip-shares``: per-block clipping shares of CorrDP-SGD."""

    PROPORTIONAL = "proportional"
    EQUAL = "equal"


class PrivateStatistics(Choice):
    """``private-statistics``: what a private column without a declared encoding gets.

    ``declared`` (the default) refuses the run: every private column's range or
    categories, and a private label's classes, must be declared. ``estimate``
    releases a differentially private estimate of each undeclared numeric range
    (:mod:`fedfdp.data.private_statistics`), charged to the run's ledger.
    """

    DECLARED = "declared"
    ESTIMATE = "estimate"


class TvFloor(Choice):
    """``corrdp-tv-floor`` as a word: ``paper``, the floor ``(m_s/m)²`` of Eq. (3)
    (otherwise the key is a number in [0, 1]).
    """

    PAPER = "paper"


MODES: tuple[Mode, ...] = tuple(Mode)
PRIVATE_MODES: tuple[Mode, ...] = (Mode.DP, Mode.FDP, Mode.FDP_DPSGD, Mode.CORRDP)
PUBLIC_LOSSES: tuple[PublicLoss, ...] = tuple(PublicLoss)
PRIVACY_UNITS: tuple[PrivacyUnit, ...] = tuple(PrivacyUnit)
OPTIMIZERS: tuple[Optimizer, ...] = tuple(Optimizer)
DATA_LOCATIONS: tuple[DataLocation, ...] = tuple(DataLocation)
CLIP_SHARES: tuple[ClipShares, ...] = tuple(ClipShares)
AGGREGATIONS: tuple[Aggregation, ...] = tuple(Aggregation)
#: The modes ``aggregation = "secagg"`` serves: those whose private part is one clipped,
#: noised sum of record gradients (``corrdp`` noises per block, ``public`` and
#: ``nonprivate`` release no noisy sum).
SECAGG_MODES: tuple[Mode, ...] = (Mode.DP, Mode.FDP, Mode.FDP_DPSGD)
#: ``corrdp-tv-floor`` meaning the paper's floor ``(m_s/m)²`` of Eq. (3).
PAPER_FLOOR = TvFloor.PAPER
#: Built-in models (``model`` also takes an import path ``package.module:build``).
MODELS = ("mlp", "logistic", "cnn", "ddpm")
#: Built-in datasets (``dataset`` also takes an import path ``package.module:load``).
DATASETS = ("fleet", "watch", "storms", "purchase100", "criteo", "csv", "cps1988", "health-insurance",
            "nlswork", "hmda", "correlated", "mnist5k", "digits", "photos", "images")
#: Image datasets (``(C, H, W)`` records; Ψ = the Gaussian blur of ``blur-kernel``, ``blur-sigma``).
IMAGE_DATASETS = ("mnist5k", "digits", "photos", "images")
