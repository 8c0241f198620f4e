"""The one door: a configuration, read once, becomes the plan of a run.

:func:`build_plan` reads a validated :class:`~fedfdp.config.Config` once and returns a
frozen :class:`RunPlan`; :func:`build_node_plan` does the same for a node (a Flower
SuperNode, or the centralised engine's node holding every device). Everything below
takes the plan or one of its pieces, never the configuration:

=====================  ===================================================================
piece                  decided here from the configuration (and the data's schema)
=====================  ===================================================================
the mechanism          :meth:`RunPlan.resolve` / :meth:`RunPlan.engine`: the sampling plan
                       over the public device sizes, then
                       :func:`fedfdp.mechanism.resolve_mechanism` — σ, q, p, C, γ, δ, the
                       event, the cap — with the accounting the mode needs (the only
                       privacy source of every engine)
the components         :class:`~fedfdp.round_engine.ServerParts` and
                       :class:`~fedfdp.contribution.ClientParts` per mode (CorrDP's
                       per-block aggregator, noise, projection and accounting; the
                       distributed accounting under secure aggregation), their secret
                       entropy: the OS CSPRNG, or the seed with ``reproducible-noise``
the model and Ψ        :func:`fedfdp.models.build_model_for`, :func:`feature_map_for`
training, settings     ``training`` (optimiser, ``α``, the public seed), ``settings``
                       (run directory, evaluation, checkpoints, progress, timeouts)
the record             the flat configuration written to ``config.toml`` and every
                       checkpoint, and the ``[resolved]`` table (:meth:`RunPlan.resolved_table`)
released values        :func:`resolve_released`: the device count of a ``device-column``,
                       and the statistics ``private-statistics = "estimate"`` and CorrDP's
                       ``tv-estimate`` release with charged noise, written into the
                       configuration once so every process and a resume use them
=====================  ===================================================================

Layering: this module is the composition root, above the engines
(:mod:`fedfdp.round_engine`, :mod:`fedfdp.run_loop`, :mod:`fedfdp.algorithm`); the
Flower strategy and ClientApp (``strategies/``, ``clients/``) call it and receive the
plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Any

import torch
from torch import nn

from fedfdp.config import Config, ConfigError, Mode, RunConfig, TrainingConfig
from fedfdp.contribution import ClientParts, trainable
from fedfdp.corrdp.noise import corrdp_mechanism_factory, project_weights_
from fedfdp.corrdp.run import BlockClippedSum, corrdp_accounting, corrdp_setup
from fedfdp.data import FederatedData, load_dataset
from fedfdp.data.private_statistics import estimated_columns
from fedfdp.data.split import refuse_label_split
from fedfdp.entropy import REPRODUCIBLE_WARNING, SecretSource, noise_source, secret_source
from fedfdp.evaluation import EvaluateFn, held_out_evaluation
from fedfdp.ledger_replay import replay
from fedfdp.losses import BlurSettings, FeatureMap, build_decomposition, image_view
from fedfdp.mechanism import (
    PublicFacts,
    ResolvedMechanism,
    resolve_mechanism,
    run_accounting,
    sampling_settings,
)
from fedfdp.models import build_model_for
from fedfdp.round_engine import RoundEngine, ServerParts, check_finite_model
from fedfdp.run_files import RunFiles
from fedfdp.sampling_plan import SamplingPlan

__all__ = [
    "NodePlan",
    "RunPlan",
    "build_node_plan",
    "build_plan",
    "client_parts_for",
    "evaluation_for",
    "feature_map_for",
    "mechanism_for",
    "node_mechanism",
    "public_facts",
    "require_config",
    "require_inputs",
    "resolve_released",
    "run_secrets",
    "server_parts_for",
]


# --------------------------------------------------------------------------------------
# the components of a run, per mode
# --------------------------------------------------------------------------------------


def run_secrets(cfg: Config) -> SecretSource:
    """The secret entropy ``cfg`` asks for: the OS CSPRNG, or the run seed when
    ``reproducible-noise = true``.
    """
    return secret_source(cfg.training.seed if cfg.privacy.reproducible_noise else None)


def _refuse_images(data: FederatedData) -> None:
    if data.is_image:
        raise ValueError(
            f"mode='corrdp': dataset {data.name!r} holds images; CorrDP-SGD is for logistic regression "
            "on tabular features"
        )


def client_parts_for(cfg: Config, data: FederatedData, secrets: SecretSource | None = None) -> ClientParts:
    """A node's components for ``cfg`` on ``data`` (the dataset's schema: columns and
    classes; a node never estimates TVs). ``secrets``: default as ``cfg`` asks.

    =========================  ===========================  ========================================
    mode                       node (``ClientParts``)        server (``ServerParts``)
    =========================  ===========================  ========================================
    ``dp``, ``fdp``, ...       joint clipping to ``C``       ``N(0, σ²C²I)``; add/remove accounting
    ``corrdp``                 per-block clipping            per-block noise (Eq. (3)), projection of
                               (:class:`~fedfdp.corrdp.run.  the weights to ``‖W[:, k]‖ ≤ D``, per-class
                               BlockClippedSum`)             CorrDP accounting (``epsilon_corrdp``)
    =========================  ===========================  ========================================

    Examples
    --------
    >>> from fedfdp import load_config
    >>> from fedfdp.data import load_dataset
    >>> cfg = load_config({"mode": "corrdp", "dataset": "correlated", "insensitive-tv": "*=0.5"})
    >>> type(client_parts_for(cfg, load_dataset(cfg.data)).aggregate).__name__
    'BlockClippedSum'
    """
    secrets = secrets if secrets is not None else run_secrets(cfg)
    if cfg.privacy.mode is not Mode.CORRDP:
        return ClientParts(secrets=secrets)
    _refuse_images(data)
    layout = corrdp_setup(cfg, data, estimate=False).design
    return ClientParts(secrets=secrets, aggregate=BlockClippedSum(layout))


def server_parts_for(cfg: Config, data: FederatedData | None) -> ServerParts:
    """The server's components for ``cfg`` on ``data`` (for ``corrdp``: its design,
    TVs estimated in-sample on ``data``'s training records if asked; ``data`` may be
    None for the other modes).

    Examples
    --------
    >>> from fedfdp import load_config
    >>> from fedfdp.data import load_dataset
    >>> cfg = load_config({"mode": "corrdp", "dataset": "correlated", "insensitive-tv": "*=0.5"})
    >>> parts = server_parts_for(cfg, load_dataset(cfg.data))
    >>> str(parts.accounting.relation), parts.accounting.column
    ('corrdp', 'epsilon_corrdp')
    """
    if cfg.privacy.mode is not Mode.CORRDP:
        # aggregation = "secagg": the distributed accounting (fedfdp.mechanism.run_accounting)
        return ServerParts(accounting=run_accounting(cfg))
    if data is None:
        raise ConfigError("mode='corrdp': the server's components are designed on the dataset's schema; "
                          "pass the data")
    _refuse_images(data)
    setup = corrdp_setup(cfg, data)
    return ServerParts(
        mechanism=corrdp_mechanism_factory(setup.design),
        accounting=corrdp_accounting(setup),
        project=partial(project_weights_, weight_bound=setup.design.weight_bound),
    )


def feature_map_for(cfg: Config, data: FederatedData) -> FeatureMap:
    """Ψ and the loss decomposition ``cfg`` selects for ``data``
    (:func:`fedfdp.losses.build_decomposition` of ``public-loss``, ``model`` and the
    ``blur-*`` keys; ``model = "ddpm"``: the diffusion split over the blur,
    :func:`fedfdp.images.diffusion.diffusion_feature_map` of ``diffusion-steps``).
    """
    d = cfg.data
    blur = BlurSettings(d.blur_kernel, d.blur_sigma, d.blur_levels)
    if cfg.training.model == "ddpm":
        if not data.is_image:
            raise ConfigError(f"model='ddpm': needs an image dataset; dataset {data.name!r} is a table")
        from fedfdp.images.diffusion import diffusion_feature_map

        psi = image_view(data, cfg.privacy.public_loss, blur)
        return diffusion_feature_map(psi, data.num_classes, cfg.training.diffusion_steps)
    return build_decomposition(data, cfg.privacy.public_loss, model=cfg.training.model, blur=blur)


def evaluation_for(cfg: Config, data: FederatedData) -> EvaluateFn:
    """The held-out evaluation of ``cfg`` on ``data``: accuracy, balanced accuracy, AUC
    and log loss of a classifier (:func:`fedfdp.evaluation.held_out_evaluation`); for
    ``model = "ddpm"`` the held-out diffusion loss and the Fréchet distance ``fd`` of
    ``eval-samples`` generated images (``sampler-steps``;
    :class:`fedfdp.images.fid.GenerationEvaluation`).
    """
    if cfg.training.model != "ddpm":
        return held_out_evaluation(data.test_x, data.test_y)
    from fedfdp.images.diffusion import DiffusionFeatureMap
    from fedfdp.images.fid import GenerationEvaluation

    fmap = feature_map_for(cfg, data)
    if not isinstance(fmap, DiffusionFeatureMap) or fmap.loss is None:  # model = "ddpm" builds one
        raise ConfigError("model='ddpm': the configured feature map is not the diffusion loss's")
    return GenerationEvaluation(fmap.loss, data.test_x, data.test_y, data.num_classes,
                                samples=cfg.run.eval_samples, steps=cfg.run.sampler_steps,
                                seed=cfg.training.seed)


def public_facts(cfg: Config, data: FederatedData) -> PublicFacts:
    """The public facts of ``cfg`` on ``data``: the device sizes and the trainable
    parameter count of the configured model (built on the ``meta`` device: no memory
    for its weights).
    """
    with torch.device("meta"):
        model = build_model_for(cfg.training, data)
    num_params = sum(int(t.numel()) for t in trainable(model))
    return PublicFacts(tuple(int(s) for s in data.sizes.tolist()), num_params)


def mechanism_for(cfg: Config, data: FederatedData) -> ResolvedMechanism:
    """The resolved mechanism of ``cfg`` on ``data`` with the accounting its mode needs
    (:func:`fedfdp.mechanism.resolve_mechanism`: what the server resolves over every
    device — the CLI's checks before a run, the σ ``fedfdp compare`` records, the attack).

    Examples
    --------
    >>> from fedfdp import load_config
    >>> from fedfdp.data import load_dataset
    >>> cfg = load_config({"mode": "dp", "num-rounds": 10})
    >>> str(mechanism_for(cfg, load_dataset(cfg.data)).relation)
    'add-remove'
    """
    return resolve_mechanism(cfg, public_facts(cfg, data), accounting=server_parts_for(cfg, data).accounting)


def node_mechanism(cfg: Config, data: FederatedData, *, honest: int, colluders: int) -> ResolvedMechanism:
    """The run as a node with its own honest-share floor resolves it (its policy,
    :mod:`fedfdp.node_policy`): :func:`mechanism_for` of ``cfg`` with
    ``secagg-min-survivors = honest + colluders`` and ``secagg-colluders = colluders`` under
    secure aggregation (plain aggregation: ``cfg`` as it is), over the public facts of
    ``data``.
    """
    p = cfg.privacy
    if p.secagg_min_survivors is not None:
        mine = replace(p, secagg_min_survivors=honest + colluders, secagg_colluders=colluders)
        cfg = replace(cfg, privacy=mine)
    return mechanism_for(cfg, data)


# --------------------------------------------------------------------------------------
# the inputs of a run
# --------------------------------------------------------------------------------------


def require_config(cfg: Any, name: str = "cfg") -> Config:
    """``cfg`` itself if it is a :class:`~fedfdp.config.Config`; anything else (a dict, a
    path) is refused in one line saying how to build one.

    Examples
    --------
    >>> require_config({"num-rounds": 3})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfdp.config.values.ConfigError: cfg={'num-rounds': 3}: a dict, not a fedfdp.Config; build one with ...
    """
    if isinstance(cfg, Config):
        return cfg
    text = repr(cfg)
    text = text if len(text) <= 80 else text[:77] + "..."
    raise ConfigError(f"{name}={text}: a {type(cfg).__name__}, not a fedfdp.Config; build one with "
                      "load_config({...}) (keys) or read_toml(path)")


def require_inputs(cfg: Any, data: Any = None, model: Any = None, feature_map: Any = None) -> Config:
    """:func:`require_config` of ``cfg``, and the optional inputs of a run of the right
    kind (a ``FederatedData``, an ``nn.Module``, a ``FeatureMap``): anything else is
    refused in one line naming the argument and what it got.
    """
    cfg = require_config(cfg)
    for name, value, kind in (("data", data, FederatedData), ("model", model, nn.Module),
                              ("feature_map", feature_map, FeatureMap)):
        if value is not None and not isinstance(value, kind):
            text = repr(value)
            text = text if len(text) <= 60 else text[:57] + "..."
            raise ConfigError(f"{name}={text}: expected a {kind.__name__} (got {type(value).__name__})")
    return cfg


def resolve_released(cfg: Config, data: FederatedData | None = None) -> Config:
    """``cfg`` with ``num-devices = 0`` (one device per value of ``device-column``)
    replaced by the number of devices of the table (``data``, or the table
    loaded now), with the ranges and categories ``private-statistics = "estimate"``
    released while loading it written into ``estimated-ranges`` and
    ``estimated-categories``, and with the noisy TVs a
    ``mode = "corrdp"`` run with ``tv-estimate`` releases now written into
    ``estimated-tvs`` (so every process and a resume use the same released values,
    and none estimates again);
    any other configuration unchanged. A split that read a private label is refused
    (:func:`fedfdp.data.split.refuse_label_split`). Every part of a run that needs the count
    before it sees the data (SuperNodes, the strategy's registrations,
    ``config.toml``) uses the resolved configuration.

    Examples
    --------
    >>> from fedfdp import load_config
    >>> resolve_released(load_config({"num-devices": 7})).data.num_devices
    7
    """
    refuse_label_split(cfg.privacy, cfg.data)
    needs_devices = not cfg.data.num_devices
    released = {n for n, _, _ in cfg.data.estimated_ranges} | {n for n, _ in cfg.data.estimated_categories}
    needs_ranges = bool(set(estimated_columns(cfg.data)) - released)
    p = cfg.privacy
    needs_tvs = p.mode is Mode.CORRDP and p.tv_estimate and not p.estimated_tvs
    if not (needs_devices or needs_ranges or needs_tvs):
        return cfg
    data = data if data is not None else load_dataset(cfg.data)
    changes: dict[str, Any] = {}
    if needs_devices:
        changes["num_devices"] = len(data.devices)
    if data.estimated_ranges != cfg.data.estimated_ranges:
        changes["estimated_ranges"] = data.estimated_ranges
    if data.estimated_categories != cfg.data.estimated_categories:
        changes["estimated_categories"] = data.estimated_categories
    if changes:
        cfg = replace(cfg, data=replace(cfg.data, **changes))
    if needs_tvs:
        tvs = corrdp_setup(cfg, data).estimates  # drawn once, here, from the OS CSPRNG
        if tvs:
            values = tuple((f, r.noisy) for f, r in tvs.items())
            cfg = replace(cfg, privacy=replace(p, estimated_tvs=values))
    return cfg


# --------------------------------------------------------------------------------------
# the plan of a run (the server's side, or the centralised engine's)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    """A run, decided once from its configuration (module docstring).

    Build one with :func:`build_plan`. The engines take its pieces: the round engine
    comes from :meth:`engine` (the only way to the resolved mechanism), the run loop
    reads :attr:`settings`, :attr:`files` and :attr:`evaluate`, the centralised engine
    :attr:`feature_map` and :attr:`client_parts` (built on first use), the Flower
    strategy :attr:`num_devices` and :attr:`settings`.

    Attributes
    ----------
    config : Config
        The validated configuration the plan was read from: its record, resolved only
        here and by :func:`fedfdp.mechanism.resolve_mechanism`.
    model : torch.nn.Module
        The global model.
    data : FederatedData or None
        The records the server holds: the held-out split and the schema (and, for the
        centralised engine, every device); None for a user's strategy with its own model
        and no dataset.
    server_parts : ServerParts
        The server's components, secret entropy and accounting included.
    evaluate : callable or None
        ``evaluate(round, model)`` on held-out data.
    files : RunFiles or None
        The run directory (``out-dir``), the journal of every charge.
    num_devices : int
        Devices, numbered ``0 .. num_devices − 1`` (a Flower strategy waits for all).

    Examples
    --------
    >>> from fedfdp import build_plan, load_config
    >>> plan = build_plan(load_config({"mode": "dp", "target-epsilon": 1.0, "num-rounds": 5,
    ...                                "progress": False}))
    >>> engine = plan.engine(plan.data.sizes)      # the mechanism, resolved over N
    >>> engine.mechanism.target_epsilon, plan.training.optimizer, plan.files is None
    (1.0, 'sgd', True)
    """

    config: Config
    model: nn.Module
    data: FederatedData | None
    server_parts: ServerParts
    evaluate: EvaluateFn | None
    files: RunFiles | None
    num_devices: int
    given_feature_map: FeatureMap | None = field(default=None, repr=False)
    given_client_parts: ClientParts | None = field(default=None, repr=False)

    # ---------------------------------------------------------------- pieces
    @property
    def training(self) -> TrainingConfig:
        """Optimisation (post-processing of the noisy sums) and the public seed."""
        return self.config.training

    @property
    def settings(self) -> RunConfig:
        """Orchestration only: outputs, evaluation, checkpoints, progress, timeouts."""
        return self.config.run

    @cached_property
    def record(self) -> dict[str, Any]:
        """The flat configuration (``config.toml``, every checkpoint)."""
        return self.config.to_flat()

    @property
    def num_rounds(self) -> int:
        """Rounds of the run (public pre-training included; the resolved mechanism's)."""
        return self.config.privacy.num_rounds

    @cached_property
    def feature_map(self) -> FeatureMap:
        """Ψ and the loss decomposition the centralised engine's node computes with (the
        given one, or the configured public view of the data).
        """
        if self.given_feature_map is not None:
            return self.given_feature_map
        if self.data is None:
            raise ConfigError("a run plan without data has no feature map: pass the data to build_plan")
        return feature_map_for(self.config, self.data)

    @cached_property
    def client_parts(self) -> ClientParts:
        """The components of the centralised engine's node (per mode; secret entropy as
        the configuration asks).
        """
        if self.given_client_parts is not None:
            return self.given_client_parts
        if self.data is None:
            raise ConfigError("a run plan without data has no node components: pass the data to build_plan")
        return client_parts_for(self.config, self.data)

    # ---------------------------------------------------------------- resolution
    def resolve(
        self, device_sizes: Iterable[Any], device_nodes: Iterable[Any] = ()
    ) -> tuple[ResolvedMechanism, SamplingPlan]:
        """The sampling plan over the public device sizes (and the node serving each
        device) and the mechanism resolved for the event it charges
        (:func:`fedfdp.mechanism.resolve_mechanism`: σ, q, p, C, γ, δ, the event).
        """
        sizes = tuple(int(s) for s in device_sizes)
        nodes = tuple(int(n) for n in device_nodes)
        sampling = self.server_parts.sampling_plan(sampling_settings(self.config), sizes, nodes)
        facts = PublicFacts(tuple(sampling.device_sizes), sum(int(t.numel()) for t in trainable(self.model)))
        mechanism = resolve_mechanism(self.config, facts, accounting=self.server_parts.accounting,
                                      subsampling=sampling.subsampling)
        return mechanism, sampling

    def engine(self, device_sizes: Iterable[Any], device_nodes: Iterable[Any] = ()) -> RoundEngine:
        """The round engine of this run over the public device sizes (:meth:`resolve`):
        its ledger starts with the mechanism; every charge is written through
        :attr:`files` before the round draws anything.
        """
        check_finite_model(self.model)  # before anything is resolved for it
        mechanism, sampling = self.resolve(device_sizes, device_nodes)
        return RoundEngine(mechanism, sampling, self.model, training=self.training, parts=self.server_parts,
                           journal=self.files)

    # ---------------------------------------------------------------- the record
    def resolved_table(self, engine: RoundEngine, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``[resolved]`` table of ``config.toml``: the engine's resolved mechanism
        (and, with released statistics, the budget split: :func:`budget_split`).
        """
        m, accounting, p = engine.mechanism, engine.accounting, self.config.privacy
        values: dict[str, Any] = {
            "noise-multiplier": m.noise_multiplier,
            "accounted-noise-multiplier": m.accounted_noise_multiplier,
            "delta": m.delta,
            "num-records": m.num_records,
            "private-rounds": m.private_rounds,
            "max-epsilon": m.max_epsilon,
            "relation": str(m.relation),
            **accounting.resolved,
            "accounted-rate": m.sampling_rate,
            "accounted-participation": m.participation,
            "event": m.event.to_dict() if m.event is not None else None,
            "mechanism-digest": m.digest(),
            "noise-source": noise_source(m.reproducible_noise),
        }
        if m.estimates:  # the budget split: what the released statistics cost, alone and with training
            values.update(budget_split(m, accounting.new))
        if m.secagg is not None:
            values.update({"secagg-local-sigma": m.secagg.local_sigma, "secagg-scale": m.secagg.scale,
                           "secagg-honest-parties": m.secagg.honest_parties})
        if m.clipping.count_noise is not None:
            values["clipping-count-std"] = m.clipping.count_noise
        if m.clipping.count_noise is not None or (m.private and p.clipping_quantile is None
                                                  and p.adaptive_clipping):
            values["clipping-quantile"] = m.clipping.quantile  # what "auto" chose (0: fixed C)
        if m.reproducible_noise:
            values["warning"] = REPRODUCIBLE_WARNING
        return {**{k: v for k, v in values.items() if v is not None}, **(extra or {})}


def budget_split(m: ResolvedMechanism, new: Any) -> dict[str, Any]:
    """The ε of the statistics released before training (``m.estimates``) composed
    alone, and with every planned private round: upper bounds at ``m.delta`` for
    ``m.relation`` from a fresh accountant ``new()`` of the run's accounting, so the
    split shown is the accountant's composition, not a sum of ε's.
    """
    estimates = replay([e.event for e in m.estimates], new)
    split: dict[str, Any] = {
        "estimates": [e.statistic for e in m.estimates],
        "estimates-epsilon": float(estimates.epsilon(m.delta)),
    }
    if m.event is not None and m.private_rounds:
        estimates.compose(m.event, m.private_rounds)
        split["planned-epsilon"] = float(estimates.epsilon(m.delta))
    return split


def build_plan(
    cfg: Config,
    data: FederatedData | None = None,
    *,
    model: nn.Module | None = None,
    feature_map: FeatureMap | None = None,
    evaluate: EvaluateFn | None = None,
    server_parts: ServerParts | None = None,
    client_parts: ClientParts | None = None,
    num_devices: int | None = None,
    files: RunFiles | None = None,
) -> RunPlan:
    """The plan of a run of ``cfg`` (module docstring): the one door of the configuration.

    Parameters
    ----------
    cfg : Config
    data : FederatedData, optional
        The records the server holds (the centralised engine: every device; a Flower
        server: the held-out split and the schema, :func:`fedfdp.data.load_server_data`).
        Without ``data`` and without ``model``, the configured dataset is loaded.
    model, feature_map, evaluate : optional
        Your own ``nn.Module``, Ψ and held-out evaluation (defaults: the configured
        model, the configured public view, accuracy and loss on ``data``'s held-out
        split).
    server_parts, client_parts : optional
        Injected components (the audit's seams); by default those the mode needs, with
        secret randomness as the configuration says (the OS CSPRNG, or the seed with
        ``reproducible-noise``).
    num_devices : int, optional
        Devices the nodes serve (default ``num-devices``).
    files : RunFiles, optional
        The run directory (default: ``out-dir``'s, or none without one); a test injects
        a journal here.

    Examples
    --------
    >>> from fedfdp import build_plan, load_config
    >>> plan = build_plan(load_config({"mode": "dp", "num-rounds": 3, "progress": False}))
    >>> mechanism, sampling = plan.resolve(plan.data.sizes)
    >>> str(mechanism.mode), mechanism.private_rounds, plan.num_devices
    ('dp', 3, 20)
    """
    cfg = require_inputs(cfg, data, model, feature_map)
    if data is None and model is None:
        data = load_dataset(cfg.data)
    if model is None:
        if data is None:  # pragma: no cover - loaded above
            raise ConfigError("build_plan: no data to build the configured model for")
        model = build_model_for(cfg.training, data)
    if evaluate is None and data is not None:
        evaluate = evaluation_for(cfg, data)
    parts = server_parts if server_parts is not None else server_parts_for(cfg, data)
    parts = dataclasses.replace(
        parts,
        accounting=run_accounting(cfg, parts.accounting),
        secrets=parts.secrets if parts.secrets is not None else run_secrets(cfg),
    )
    devices = cfg.data.num_devices if num_devices is None else int(num_devices)
    if devices < 1:
        raise ValueError(
            f"num_devices={devices}: must be >= 1 (num-devices = 0 means one device per "
            "value of device-column: pass cfg through fedfdp.run_plan.resolve_released first)"
        )
    if files is None and cfg.run.out_dir:
        files = RunFiles(cfg.run.out_dir, cfg.run, cfg.to_flat(), cfg.privacy.num_rounds)
    return RunPlan(cfg, model, data, parts, evaluate, files, devices, feature_map, client_parts)


# --------------------------------------------------------------------------------------
# the plan of a node
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePlan:
    """What a node computes with, decided once from the configuration: the model it
    loads the global weights into, Ψ and the loss decomposition, its components (secret
    entropy as the configuration asks) and the public seed of the public batches.

    Attributes
    ----------
    model : torch.nn.Module
    feature_map : FeatureMap
    parts : ClientParts
    public_seed : int
        The run's ``seed`` (public randomness: the public batches, their padding).
    """

    model: nn.Module
    feature_map: FeatureMap
    parts: ClientParts
    public_seed: int


def build_node_plan(cfg: Config, data: FederatedData, parts: ClientParts | None = None) -> NodePlan:
    """The plan of a node serving devices of ``data`` (the dataset's schema: columns,
    classes, image shape) under ``cfg``; ``parts`` default to the mode's, with secret
    entropy as ``cfg`` asks.
    """
    parts = parts if parts is not None else client_parts_for(cfg, data)
    return NodePlan(build_model_for(cfg.training, data), feature_map_for(cfg, data), parts, cfg.training.seed)
