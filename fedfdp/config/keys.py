"""The table of configuration keys: one row per key, with what it means for the guarantee.

Every kebab-case key has one :class:`KeySpec`: its section and attribute in the
frozen dataclasses, its value :class:`Kind`, whether it **defines the
guarantee** (:class:`Guarantee`), what "not set" means where the key may be
left unset, and a one-line meaning. Everything else is derived from
:data:`KEYS`: the parsers' dispatch (:mod:`fedfdp.config.values`),
:data:`GUARANTEE_KEYS` (the inputs of the resolved mechanism, in one place),
:data:`ORCHESTRATION_KEYS` (what may change on resume and is not hashed) and the
key reference ``docs/configuration.md`` (:mod:`fedfdp.config.reference`).

A key defines the guarantee when the privacy statement of a run depends on it:
the mode, σ or the ε target, δ and the cap, the clipping decision, the sampling
rates, the rounds, the privacy unit, the public view and Ψ's columns, the data
that decide ``N`` and the device sizes, the model (its parameter count decides
the ``fdp`` recipe's clipping quantile, and with it σ), CorrDP's keys, and
``reproducible-noise`` — with it, the ``seed`` too, because the secret noise
then derives from it (:attr:`Guarantee.IF_REPRODUCIBLE`). The optimiser, α, the
public batch size and the orchestration keys are post-processing of what the
guarantee covers or cost no ε.

"Not set" is ``None`` in the dataclasses and the empty string ``""`` in TOML
files and Flower run configs (TOML has no null, and Flower needs every key
declared in ``pyproject.toml``); ``clipping-quantile`` also reads ``"auto"``
(its recipe) and is written so. ``0`` never means "not set": it is refused where
the key must be positive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from fedfdp.config.choices import (
    DATASETS,
    IMAGE_DATASETS,
    MODELS,
    Aggregation,
    Choice,
    ClipShares,
    DataLocation,
    Mode,
    Optimizer,
    PrivacyUnit,
    PrivateStatistics,
    PublicLoss,
)


class Section(Choice):
    """The frozen dataclass of :class:`fedfdp.config.Config` a key belongs to."""

    PRIVACY = "privacy"
    TRAINING = "training"
    DATA = "data"
    RUN = "run"


class Kind(Choice):
    """The kind of a key's value: which parser reads it and how it is written back.

    Every member has a parser and a writer (:mod:`fedfdp.config.values` checks
    on import that none is missing); an unknown kind is an internal error.
    """

    FLOAT_POS = "float+"          # > 0
    FLOAT0 = "float0"             # >= 0
    FLOAT01 = "float01"           # [0, 1)
    FLOAT01_OPEN = "float01open"  # (0, 1)
    UNIT = "unit0"                # [0, 1]
    PROB = "prob"                 # (0, 1]
    INT_POS = "int+"              # >= 1
    INT0 = "int0"                 # >= 0
    ODD_POS = "odd+"              # odd >= 1
    LEVELS = "levels"             # 0 or >= 2
    BOOL = "bool"
    STR = "str"
    CHOICE = "choice"             # a member of the key's enum
    CHOICE_OR_PATH = "choice-or-path"  # a built-in name or package.module:name
    STRLIST = "strlist"
    INTLIST = "intlist"
    CLASSES = "classes"
    RANGES = "ranges"
    CATEGORIES = "categories"
    TVS = "tvs"
    BINS = "bins"
    FLOOR = "floor"               # "paper" or [0, 1]


class Guarantee(Choice):
    """Whether a key is an input of the resolved mechanism (defines the guarantee)."""

    YES = "yes"
    NO = "no"
    #: Only with ``reproducible-noise = true``: the secret noise derives from it.
    IF_REPRODUCIBLE = "if reproducible-noise"


@dataclass(frozen=True)
class Applies:
    """Where a key has an effect: for each deciding key, the values under which it acts.

    A key with a non-default value outside its scope is refused when the
    configuration is validated (:func:`fedfdp.config.checks.check_applicability`),
    naming the key, the deciding setting and where the key applies: a setting is
    never silently ignored. A deciding value that is an import path (a user's model
    or dataset) is taken to use every key (its code may read it).

    Attributes
    ----------
    when : tuple of (str, tuple of str)
        ``(deciding key, accepted values)`` pairs, all of which must hold, e.g.
        ``(("mode", ("dp", "fdp")),)``.

    Examples
    --------
    >>> only(mode=("dp", "fdp")).text()
    'mode in dp, fdp'
    """

    when: tuple[tuple[str, tuple[str, ...]], ...]

    def admits(self, decider: str, value: str) -> bool:
        """Whether the key may act when ``decider`` has ``value`` (the other deciding
        keys aside).

        Examples
        --------
        >>> only(mode=("dp",)).admits("mode", "public"), only(mode=("dp",)).admits("dataset", "csv")
        (False, True)
        """
        return all(value in accepted for key, accepted in self.when if key == decider)

    def text(self) -> str:
        """Where the key applies, in words (``docs/configuration.md``, ``fedfdp keys``)."""
        return "; ".join(f"{key} in {', '.join(values)}" for key, values in self.when)


def only(**when: Sequence[str]) -> Applies:
    """:class:`Applies` from keyword arguments (``data_location=`` for ``data-location``)."""
    return Applies(tuple((k.replace("_", "-"), tuple(str(v) for v in vs)) for k, vs in when.items()))


@dataclass(frozen=True)
class KeySpec:
    """One configuration key.

    Attributes
    ----------
    key : str
        The kebab-case key.
    section : Section
    attr : str
        The attribute of the section's dataclass.
    kind : Kind
    guarantee : Guarantee
    meaning : str
        One line.
    unset : str or None
        For a key that may be left unset (``None``, written ``""``): what that
        means. ``None``: the key always has a value.
    choice_type : type or None
        The enum of a ``choice`` key (its value is converted to a member).
    names : tuple of str
        The built-in names of a ``choice-or-path`` key.
    unset_word : str
        A second spelling of "not set" besides ``""`` (``clipping-quantile``:
        ``"auto"``), written by :meth:`fedfdp.config.Config.to_flat`.
    applies : Applies or None
        Where the key has an effect (``None``: in every configuration); a
        non-default value elsewhere is refused.
    """

    key: str
    section: Section
    attr: str
    kind: Kind
    guarantee: Guarantee
    meaning: str
    unset: str | None = None
    choice_type: type[Choice] | None = None
    names: tuple[str, ...] = ()
    unset_word: str = ""
    applies: Applies | None = None

    @property
    def choices(self) -> tuple[str, ...]:
        """The accepted words of a ``choice`` or ``choice-or-path`` key."""
        if self.choice_type is not None:
            return tuple(m.value for m in self.choice_type)
        return self.names

    @property
    def optional(self) -> bool:
        """Whether the key may be left unset (``None``; ``""`` in TOML)."""
        return self.unset is not None

    @property
    def defines_guarantee(self) -> bool:
        """Whether the key is an input of the resolved mechanism (always or when reproducible)."""
        return self.guarantee is not Guarantee.NO


P, T, D, R = Section.PRIVACY, Section.TRAINING, Section.DATA, Section.RUN
K = Kind
YES, NO, IF_REPRODUCIBLE = Guarantee.YES, Guarantee.NO, Guarantee.IF_REPRODUCIBLE

#: Where keys have an effect (:class:`Applies`): the noisy modes (σ, the target and the
#: cap, clipping), the modes with a private part (its sampling rate), CorrDP, images.
NOISY = only(mode=tuple(m for m in Mode if m.is_private))
WITH_PRIVATE_PART = only(mode=tuple(m for m in Mode if m is not Mode.PUBLIC))
CORRDP = only(mode=(Mode.CORRDP,))
IMAGES = only(dataset=IMAGE_DATASETS)
#: The ``secagg-*`` keys act only under secure aggregation.
SECAGG = only(aggregation=(Aggregation.SECAGG,))

#: The ε a private mode calibrates σ to when neither ``noise-multiplier`` nor
#: ``target-epsilon`` is set (:attr:`fedfdp.config.PrivacyConfig.calibration_target`).
DEFAULT_TARGET_EPSILON = 2.0


#: Every key, in documentation (and ``pyproject.toml``) order.
KEYS: tuple[KeySpec, ...] = (
    KeySpec("mode", P, "mode", K.CHOICE, YES,
            "what each round computes and what ε means (`nonprivate` ∞, `public` 0, `dp`, `fdp`, "
            "`fdp-dpsgd`, `corrdp`: a CorrDP ε)", choice_type=Mode),
    KeySpec("noise-multiplier", P, "noise_multiplier", K.FLOAT_POS, YES,
            "σ: the noise on the private sum has std σ·C; give it or `target-epsilon`, not both",
            unset="σ is calibrated to the calibration target", applies=NOISY),
    KeySpec("target-epsilon", P, "target_epsilon", K.FLOAT_POS, YES,
            "ε (add/remove, at `delta`, upper bound) the private rounds end at, not above; σ is calibrated",
            unset=f"{DEFAULT_TARGET_EPSILON} when noise-multiplier is unset too, else none", applies=NOISY),
    KeySpec("max-epsilon", P, "max_epsilon", K.FLOAT_POS, YES,
            "hard budget: a round that would take ε above it is refused",
            unset="the calibration target when σ is calibrated, no cap when σ is given", applies=NOISY),
    KeySpec("delta", P, "delta", K.FLOAT01_OPEN, YES,
            "δ of every reported ε", unset="1/(2N), N the training records"),
    KeySpec("clipping-norm", P, "clipping_norm", K.FLOAT_POS, YES,
            "C: per-unit L2 bound of the private gradient (the sensitivity); with adaptive clipping, "
            "the first round's", applies=NOISY),
    KeySpec("clipping-quantile", P, "clipping_quantile", K.FLOAT01, YES,
            "γ: adaptive clipping tracks the γ-quantile of the private gradients' norms; 0: a fixed C",
            unset="the mode's recipe: in fdp, γ from the run's noise level (model ddpm: 0.9, below "
            "1 − 2σ_b/(qN)); in other modes, a fixed C",
            unset_word="auto", applies=NOISY),
    KeySpec("clipping-learning-rate", P, "clipping_learning_rate", K.FLOAT_POS, YES,
            "η of adaptive clipping's geometric update C ← C·exp(−η(b̃ − γ))", applies=NOISY),
    KeySpec("clipping-budget-share", P, "clipping_budget_share", K.FLOAT01_OPEN, YES,
            "share of each adaptive round's privacy spent on the noisy count of vectors within C",
            applies=NOISY),
    KeySpec("sampling-rate", P, "sampling_rate", K.PROB, YES,
            "q: Poisson inclusion probability of a record in the private batch", applies=WITH_PRIVATE_PART),
    KeySpec("public-batch-size", P, "public_batch_size", K.INT_POS, NO,
            "m': uniform public batch, drawn independently of the private one (Prop. 3); costs no ε"),
    KeySpec("public-loss", P, "public_loss", K.CHOICE, YES,
            "the public view of a table row: `auto` (the dataset's), `gaussian`, `zero`, `mean`, "
            "`label-free` (label-DP, Ψ(x, y) = x)", choice_type=PublicLoss),
    KeySpec("public-pretrain-rounds", P, "public_pretrain_rounds", K.INT0, YES,
            "free public-only rounds first (Remark 2); decides the private rounds; in `fdp-dpsgd`, "
            "unless given, min(50, max(1, num-rounds // 3))"),
    KeySpec("privacy-unit", P, "privacy_unit", K.CHOICE, YES,
            "what a neighbour differs by: one `record` (the paper's) or one `device`'s records",
            choice_type=PrivacyUnit),
    KeySpec("device-sampling-rate", P, "device_sampling_rate", K.PROB, YES,
            "p: each device takes part in a round with probability p (Poisson); needed by the device unit",
            unset="every device, or clients-per-round nodes, takes part"),
    KeySpec("num-rounds", P, "num_rounds", K.INT_POS, YES,
            "rounds, one step of Algorithm 1 each (public pre-training included)"),
    KeySpec("clients-per-round", P, "clients_per_round", K.INT0, YES,
            "k > 0: that many nodes per round, chosen from the public stream (accounted at rate q); "
            "0: every node"),
    KeySpec("reproducible-noise", P, "reproducible_noise", K.BOOL, YES,
            "true: the secret randomness derives from `seed` (tests, tables); the guarantee then holds "
            "only against parties who do not know it, and deployments refuse it"),
    KeySpec("sensitive-columns", P, "sensitive_columns", K.STRLIST, YES,
            "CorrDP: the sensitive features (empty: the dataset's private columns)", applies=CORRDP),
    KeySpec("insensitive-tv", P, "insensitive_tv", K.TVS, YES,
            "CorrDP: declared TV(j) in [0, 1] of insensitive features (`*`: every other one)",
            applies=CORRDP),
    KeySpec("tv-estimate", P, "tv_estimate", K.BOOL, YES,
            "CorrDP: estimate undeclared TVs in-sample with Gaussian noise charged to the ε "
            "(`estimation-epsilon`; validity spends `tv-delta`)",
            applies=CORRDP),
    KeySpec("tv-bins", P, "tv_bins", K.BINS, YES,
            "CorrDP: public cut points of every numeric input the TV estimate bins", applies=CORRDP),
    KeySpec("tv-min-prob", P, "tv_min_prob", K.PROB, YES,
            "CorrDP: π_min, declared lower bound on every bin's probability (needed by `tv-estimate`)",
            unset="none declared, and tv-estimate is refused", applies=CORRDP),
    KeySpec("tv-delta", P, "tv_delta", K.FLOAT01_OPEN, YES,
            "CorrDP: δ spent by the TV estimate (part of `delta`)", unset="half of delta", applies=CORRDP),
    KeySpec("estimated-tvs", P, "estimated_tvs", K.TVS, YES,
            "CorrDP: the noisy TVs `tv-estimate` released (written by the run; each feature charged once)",
            applies=CORRDP),
    KeySpec("corrdp-weight-bound", P, "corrdp_weight_bound", K.FLOAT_POS, YES,
            "CorrDP: D, every weight column is projected to norm ≤ D", applies=CORRDP),
    KeySpec("corrdp-feature-bound", P, "corrdp_feature_bound", K.FLOAT_POS, YES,
            "CorrDP: B, inputs are clamped to [−B, B]",
            unset="the dataset's declared bound, else 1 (declared ranges encode to [−1, 1])", applies=CORRDP),
    KeySpec("corrdp-tv-floor", P, "corrdp_tv_floor", K.FLOOR, YES,
            "CorrDP: floor of an insensitive block's noise factor (Eq. (3)); `paper`: (m_s/m)²",
            applies=CORRDP),
    KeySpec("corrdp-clip-shares", P, "corrdp_clip_shares", K.CHOICE, YES,
            "CorrDP: per-block clipping shares, `proportional` to each block's input bound, or `equal`",
            choice_type=ClipShares, applies=CORRDP),
    KeySpec("aggregation", P, "aggregation", K.CHOICE, YES,
            "`plain`: a trusted server adds the noise; `secagg`: secure aggregation, each SuperNode adds "
            "discrete Gaussian noise and the server sees only the noisy sum (docs/secagg_accounting.md)",
            choice_type=Aggregation),
    KeySpec("secagg-min-survivors", P, "secagg_min_survivors", K.INT_POS, YES,
            "`secagg`: n_min, a count of SuperNodes (>= 3); the noise is calibrated for n_min - colluders "
            "honest survivors and a round with fewer survivors aborts (no unmask, no step, no charge)",
            unset="needed by secagg (refused unset)", applies=SECAGG),
    KeySpec("secagg-colluders", P, "secagg_colluders", K.INT0, YES,
            "`secagg`: t_c, SuperNodes that may collude with the server; their noise is not counted",
            applies=SECAGG),
    KeySpec("secagg-neighbours", P, "secagg_neighbours", K.ODD_POS, YES,
            "`secagg`: k, each SuperNode's neighbourhood (odd, 3..n) in the SecAgg+ graph",
            unset="min(n, 2⌈log₂ n⌉ + 1), lowered to odd, n the round's SuperNodes", applies=SECAGG),
    KeySpec("secagg-threshold", P, "secagg_threshold", K.INT_POS, YES,
            "`secagg`: t, Shamir threshold in [⌊k/2⌋+1, k], at most secagg-min-survivors",
            unset="⌊k/2⌋ + 1", applies=SECAGG),
    KeySpec("secagg-scale", P, "secagg_scale", K.FLOAT_POS, YES,
            "`secagg`: s, integer units per clipping norm C of the fixed-point encoding",
            unset="the largest power of two <= 2^⌈log₂(1000·√d)⌉ that passes the mod 2³² headroom check",
            applies=SECAGG),
    KeySpec("alpha", T, "alpha", K.FLOAT_POS, NO,
            "α: g = g_pub + α·g̃_priv (post-processing of the noisy sum)"),
    KeySpec("learning-rate", T, "learning_rate", K.FLOAT_POS, NO, "the server optimiser's step size"),
    KeySpec("momentum", T, "momentum", K.FLOAT01, NO, "SGD momentum", applies=only(optimizer=("sgd",))),
    KeySpec("optimizer", T, "optimizer", K.CHOICE, NO, "the server's optimiser: `sgd` or `adam`",
            choice_type=Optimizer),
    KeySpec("model", T, "model", K.CHOICE_OR_PATH, YES,
            "`logistic`, `mlp`, `cnn` (images), `ddpm` (images: a diffusion model) or "
            "`package.module:build`; its parameter count decides the `fdp` recipe's γ", names=MODELS),
    KeySpec("hidden-size", T, "hidden_size", K.INT_POS, YES,
            "width of the MLP's two hidden layers (and the CNN's penultimate layer): the parameter count",
            applies=only(model=("mlp", "cnn"))),
    KeySpec("hidden-sizes", T, "hidden_sizes", K.INTLIST, YES,
            "widths of the MLP's hidden layers (empty: two of `hidden-size`): the parameter count",
            applies=only(model=("mlp",))),
    KeySpec("cnn-width", T, "cnn_width", K.INT_POS, YES,
            "`cnn`: channels of the first convolution: the parameter count", applies=only(model=("cnn",))),
    KeySpec("unet-width", T, "unet_width", K.INT_POS, YES,
            "`ddpm`: the U-Net's base width (channels of its first convolution): the parameter count",
            applies=only(model=("ddpm",))),
    KeySpec("diffusion-steps", T, "diffusion_steps", K.INT_POS, NO,
            "`ddpm`: T, the timesteps of the linear noise schedule (> 20); each record draws its t and "
            "noise from its own public stream", applies=only(model=("ddpm",))),
    KeySpec("dataset", D, "dataset", K.CHOICE_OR_PATH, YES,
            "the records, Ψ and the private columns (docs/datasets.md), or `package.module:load`",
            names=DATASETS),
    KeySpec("num-devices", D, "num_devices", K.INT0, YES,
            "devices (natural units grouped whole); 0: one per value of `device-column` (`csv`)"),
    KeySpec("records-per-device", D, "records_per_device", K.INT_POS, YES,
            "mean records per device of the synthetic generators: N"),
    KeySpec("test-fraction", D, "test_fraction", K.FLOAT01_OPEN, YES,
            "held-out share (server-side evaluation only): decides N"),
    KeySpec("data-seed", D, "data_seed", K.INT0, YES,
            "generation, splits, the held-out choice, Purchase100's public features: N and the devices"),
    KeySpec("data-path", D, "data_path", K.STR, YES,
            "the file of `purchase100`, `criteo`, `csv` or `images`"),
    KeySpec("public-columns", D, "public_columns", K.STRLIST, YES, "`csv`: Ψ's columns"),
    KeySpec("private-columns", D, "private_columns", K.STRLIST, YES, "`csv`: the protected columns"),
    KeySpec("label-column", D, "label_column", K.STR, YES, "`csv`: the label"),
    KeySpec("device-column", D, "device_column", K.STR, YES,
            "`csv`: the natural device of each row (public): the device sizes"),
    KeySpec("dirichlet-alpha", D, "dirichlet_alpha", K.FLOAT0, YES,
            "0: IID split; > 0: per-device label mix Dirichlet(α) (datasets without natural devices)"),
    KeySpec("blur-kernel", D, "blur_kernel", K.ODD_POS, YES, "images: Ψ's Gaussian blur, kernel width (odd)",
            applies=IMAGES),
    KeySpec("blur-sigma", D, "blur_sigma", K.FLOAT_POS, YES, "images: Ψ's Gaussian blur, its σ in pixels",
            applies=IMAGES),
    KeySpec("blur-levels", D, "blur_levels", K.LEVELS, YES,
            "images: Ψ quantised to this many grey levels (0: the exact, invertible blur)", applies=IMAGES),
    KeySpec("image-pool", D, "image_pool", K.INT_POS, YES,
            "images: average-pool every image by this factor first (2: MNIST at 14×14)", applies=IMAGES),
    KeySpec("private-ranges", D, "private_ranges", K.RANGES, YES,
            "`csv`: declared ranges of numeric private columns, scaled to [−1, 1]"),
    KeySpec("private-categories", D, "private_categories", K.CATEGORIES, YES,
            "`csv`: declared categories of text private columns"),
    KeySpec("public-ranges", D, "public_ranges", K.RANGES, YES,
            "`csv`: declared ranges of public columns (undeclared: standardised on the training split, "
            "except where the mode protects them — under `dp` every column — docs/datasets.md)"),
    KeySpec("public-categories", D, "public_categories", K.CATEGORIES, YES,
            "`csv`: declared categories of public columns"),
    KeySpec("label-classes", D, "label_classes", K.CLASSES, YES,
            "`csv`: the label values in class order (empty: the file's sorted distinct values, except "
            "where the mode protects the label — `dp`, label-DP — which declares or estimates them)"),
    KeySpec("private-statistics", D, "private_statistics", K.CHOICE, YES,
            "`csv`: an undeclared protected column (a private one; under `dp` any column and the label): "
            "`declared` refuses the run, `estimate` releases a noisy range or set of categories charged "
            "to the ε (docs/datasets.md)", choice_type=PrivateStatistics),
    KeySpec("estimation-epsilon", D, "estimation_epsilon", K.FLOAT_POS, YES,
            "ε at the run's δ of all the estimates together (`private-statistics = \"estimate\"`'s ranges "
            "and categories, CorrDP's `tv-estimate`); training is calibrated on the composition",
            unset="`estimate`: min(0.2, 0.1·√k) of the run's target ε (k estimated columns; "
                  "docs/datasets.md); CorrDP's `tv-estimate`: 0.5", unset_word="auto"),
    KeySpec("estimated-ranges", D, "estimated_ranges", K.RANGES, YES,
            "the noisy ranges `private-statistics = \"estimate\"` released (written by the run, charged "
            "once per column in the ledger)"),
    KeySpec("estimated-categories", D, "estimated_categories", K.CATEGORIES, YES,
            "the categories `private-statistics = \"estimate\"` released for text columns (a noisy "
            "thresholded histogram; written by the run, charged once per column in the ledger)"),
    KeySpec("data-location", D, "data_location", K.CHOICE, YES,
            "`central`, or `node`: each SuperNode reads its own file and is one device (docs/deploy.md)",
            choice_type=DataLocation),
    KeySpec("test-path", D, "test_path", K.STR, NO,
            "`data-location = \"node\"`: the server's held-out file, evaluation only"),
    KeySpec("window-size", D, "window_size", K.INT_POS, YES, "`watch`: samples per window (50 Hz): N",
            applies=only(dataset=("watch",))),
    KeySpec("max-records", D, "max_records", K.INT0, YES,
            "read at most this many rows of a file (0: all): N"),
    KeySpec("num-public-features", D, "num_public_features", K.INT_POS, YES,
            "`purchase100`: how many of the 600 features are public (Ψ)",
            applies=only(dataset=("purchase100",))),
    KeySpec("hash-buckets", D, "hash_buckets", K.INT_POS, YES,
            "`criteo`: width of the hashed one-hot encoding of the categories",
            applies=only(dataset=("criteo",))),
    KeySpec("num-sensitive", D, "num_sensitive", K.INT_POS, YES, "`correlated`: m_s sensitive columns",
            applies=only(dataset=("correlated",))),
    KeySpec("num-insensitive", D, "num_insensitive", K.INT_POS, YES, "`correlated`: m_u insensitive columns",
            applies=only(dataset=("correlated",))),
    KeySpec("correlation", D, "correlation", K.UNIT, YES,
            "`correlated`: ρ, the chance an insensitive column copies a sensitive sign (its TV)",
            applies=only(dataset=("correlated",))),
    KeySpec("label-signal", D, "label_signal", K.FLOAT_POS, YES,
            "`correlated`: how strongly the signs decide the label", applies=only(dataset=("correlated",))),
    KeySpec("seed", T, "seed", K.INT0, IF_REPRODUCIBLE,
            "the public randomness (initialisation, public batches, node choice); with "
            "`reproducible-noise`, the secret noise too"),
    KeySpec("eval-every", R, "eval_every", K.INT_POS, NO,
            "evaluate on the held-out split every this many rounds"),
    KeySpec("eval-samples", R, "eval_samples", K.INT_POS, NO,
            "`ddpm`: images generated at each evaluation for the Fréchet distance `fd` (a digit CNN's "
            "features, not Inception FID)", applies=only(model=("ddpm",))),
    KeySpec("sampler-steps", R, "sampler_steps", K.INT_POS, NO,
            "`ddpm`: denoising steps of the evaluation's sampler (the schedule respaced; at most "
            "`diffusion-steps`)", applies=only(model=("ddpm",))),
    KeySpec("out-dir", R, "out_dir", K.STR, NO, "output directory (empty: nothing written)"),
    KeySpec("checkpoint-every", R, "checkpoint_every", K.INT0, NO,
            "checkpoint every this many rounds (0: never)"),
    KeySpec("resume", R, "resume", K.BOOL, NO, "continue from the out-dir's checkpoint and ledger"),
    KeySpec("node-wait-timeout", R, "node_wait_timeout", K.FLOAT_POS, NO,
            "seconds to wait for the SuperNodes at start"),
    KeySpec("round-timeout", R, "round_timeout", K.FLOAT_POS, NO, "seconds to wait for a round's replies"),
    KeySpec("progress", R, "progress", K.BOOL, NO, "show a progress bar"),
    KeySpec("secagg-timeout", R, "secagg_timeout", K.FLOAT_POS, NO,
            "`secagg`: seconds to wait for each of a round's four stages (keep it generous: a dropout "
            "by timeout could depend on a secret batch size)", applies=SECAGG),
)

#: key -> its spec (read-only).
KEY_TABLE: Mapping[str, KeySpec] = MappingProxyType({s.key: s for s in KEYS})
#: (section, attribute) -> its spec.
SPEC_OF_FIELD: Mapping[tuple[str, str], KeySpec] = MappingProxyType(
    {(str(s.section), s.attr): s for s in KEYS}
)

#: The inputs of the resolved mechanism: every key that defines the guarantee
#: (``seed`` only matters with ``reproducible-noise``; :func:`guarantee_keys_of`).
GUARANTEE_KEYS: frozenset[str] = frozenset(s.key for s in KEYS if s.defines_guarantee)

#: Keys of the ``run`` section: they may differ on resume and are left out of
#: a sweep's configuration hash.
ORCHESTRATION_KEYS: frozenset[str] = frozenset(s.key for s in KEYS if s.section is Section.RUN)

#: Keys that are not run settings but may appear in shared TOML files
#: (Flower injects ``server-round`` into client configs).
IGNORED_KEYS = frozenset({"server-round"})


def guarantee_keys_of(reproducible_noise: bool) -> frozenset[str]:
    """The keys that define the guarantee of a run with or without ``reproducible-noise``.

    Examples
    --------
    >>> "seed" in guarantee_keys_of(False), "seed" in guarantee_keys_of(True)
    (False, True)
    """
    if reproducible_noise:
        return GUARANTEE_KEYS
    return frozenset(s.key for s in KEYS if s.guarantee is Guarantee.YES)
