"""CorrDP-SGD as a run of fedfdp: the design of a configuration and a dataset, the
node's aggregator and the server's accounting.

``mode = "corrdp"`` runs on the client, strategy, sampling plan and server of every
other mode; what differs are three components, built here and chosen in one place
(:mod:`fedfdp.run_plan`):

* the node's **aggregator** (:class:`BlockClippedSum`, a
  :class:`~fedfdp.contribution.PrivateAggregator`): the full cross-entropy gradient of
  every record in the Poisson batches, clipped **per block** to ``C_B = C·s_B``
  (:func:`~fedfdp.corrdp.noise.glm_clipped_sum`; inputs clamped to ``[−B, B]``; a model
  with a weight column above ``D`` is refused);
* the server's **mechanism**: ``N(0, σ_B² I)`` per block, ``σ_B = σ·C·√f_B``, Eq. (3)
  (:func:`~fedfdp.corrdp.noise.corrdp_mechanism_factory`), and the **projection** of
  every weight column to norm ``≤ D`` after every step and before the first;
* the server's **accounting** (:func:`corrdp_accounting`): the per-class CorrDP
  accountant (:class:`~fedfdp.corrdp.accounting.CorrDPAccountant`, relation
  ``"corrdp"``), σ calibrated by it, the ε written to the column ``epsilon_corrdp``.

Sensitivity, relation, result
-----------------------------
One record's sensitive features, or one insensitive feature, replaced; labels fixed
(Def. 2.1, Assumption 3.1). Per class ``c`` of neighbour the noisy sum is a Gaussian
pair with ``μ_c`` (:meth:`CorrDPDesign.class_mu`, explicit per-block sensitivities);
the run is ``(ε, δ)``-CorrDP with ``ε = max_c d_c ε_c`` (Def. 2.2 read as ``ε/d``;
CorrDP paper Algorithm 1, Eq. (3), Theorem 3.5 with explicit constants,
``docs/corrdp.md`` §4-5). With in-sample TVs, Theorem 3.11: the estimate spends
``tv-delta`` (default ``δ/2``) of the reported δ.

Features and roles
------------------
A *feature* is a model input column, or the one-hot inputs ``name=value`` of a table
column ``name`` (they change together). ``sensitive-columns`` (default: the dataset's
private columns) name the sensitive features; every other feature is insensitive,
with a TV declared in ``insensitive-tv`` (``*`` for the rest) or, with
``tv-estimate``, estimated in-sample on the training records and **released with
Gaussian noise** (:func:`release_feature_tvs`): one-hot features are binned by their
categories, numeric inputs by the cut points of ``tv-bins`` (in the model-input
scale: declared ranges encode to ``[−1, 1]``), ``tv-min-prob`` the declared ``π_min``.

The released TVs (issue 22: nothing data-dependent leaves a run outside the ledger)
----------------------------------------------------------------------------------
For each estimated feature ``j`` the in-sample ``T̂V(j)`` of :func:`~fedfdp.corrdp.tv.empirical_tv`
changes by at most ``c3/n = 4/(π_min n)`` when one record is replaced
(:mod:`fedfdp.corrdp.tv`, Assumption 3.9, proved there; ``n`` the training records,
public). The run releases ``T̂V(j) + N(0, (σ_tv c3/n)²)`` clipped to ``[0, 1]`` (noise
from the OS CSPRNG, :func:`fedfdp.data.private_statistics.secret_normals`): a Gaussian
mechanism of noise multiplier ``σ_tv`` under record replacement, which covers every
CorrDP neighbour; ``σ_tv`` is calibrated so that the ``m_u`` releases together cost
``estimation-epsilon`` at ``δ = 1/(2N)``
(:func:`fedfdp.data.private_statistics.estimation_noise_multiplier`). Each is charged
as ``SubsampledGaussian(σ_tv, 1.0)`` (a ledger ``estimate`` entry before round 1) and
the CorrDP accountant adds its ε to every class (:mod:`fedfdp.corrdp.accounting`).
The TV the design uses is ``min(1, released + e(β) + σ_tv (c3/n) Φ⁻¹(1 − β))`` with
``β = tv-delta / (2 m_u)``: an upper bound on ``TV(j)`` with probability ``≥ 1 − tv-delta``
over all features (sampling error :func:`~fedfdp.corrdp.tv.estimation_error_bound`,
one-sided noise), so Theorem 3.11's ``δ_est = tv-delta`` is unchanged; the margins
are public. Only the released values and the public margins appear in
``config.toml`` (``estimated-tvs``, ``[resolved] corrdp-tv-estimated``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from fedfdp.accounting.events import PrivacyEvent, SubsampledGaussian
from fedfdp.config import ClipShares, Config, ConfigError, TvFloor
from fedfdp.contribution import PrivateBatch, PrivateSum, RoundSettings
from fedfdp.corrdp.accounting import RELATION_TEXT, CorrDPAccountant
from fedfdp.corrdp.noise import CorrDPDesign, glm_clipped_sum
from fedfdp.corrdp.roles import RELATION, FeatureRoles, InsensitiveFeature
from fedfdp.corrdp.tv import Bins, empirical_tv, estimation_error_bound, joint_codes
from fedfdp.data.private_statistics import Estimate, Normals, estimation_noise_multiplier, secret_normals
from fedfdp.features import FeatureSpec
from fedfdp.losses import FeatureMap
from fedfdp.mechanism import Accounting, tv_estimation_delta

if TYPE_CHECKING:
    from fedfdp.data import FederatedData

#: The output column of a CorrDP ε (never ``epsilon``).
EPSILON_COLUMN = "epsilon_corrdp"
#: ``insensitive-tv`` / ``tv-bins`` entry for every other feature.
WILDCARD = "*"


def feature_groups(columns: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``{feature: its input columns}``, in input order: an input ``name=value`` (one-hot
    encoding) belongs to feature ``name``, any other input is its own feature.

    Examples
    --------
    >>> feature_groups(["age", "region=north", "region=south", "hr"])
    {'age': (0,), 'region': (1, 2), 'hr': (3,)}
    """
    out: dict[str, list[int]] = {}
    for i, name in enumerate(columns):
        out.setdefault(name.split("=", 1)[0], []).append(i)
    return {k: tuple(v) for k, v in out.items()}


def _spec(data: FederatedData) -> FeatureSpec:
    """The column spec of a table (CorrDP's features); images have none."""
    if data.spec is None:
        raise ConfigError(f"mode='corrdp': dataset {data.name!r} has no columns (CorrDP-SGD is for tables)")
    return data.spec


def _feature_of(name: str, groups: Mapping[str, tuple[int, ...]], columns: Sequence[str], key: str) -> str:
    if name in groups:
        return name
    if name in columns:
        return name.split("=", 1)[0]
    shown = ", ".join(list(groups)[:8]) + (" ..." if len(groups) > 8 else "")
    raise ConfigError(f"{key}: {name!r} is not a column of the dataset (features: {shown})")


@dataclass(frozen=True)
class CorrDPSetup:
    """The CorrDP design of a run and where its TVs come from.

    Attributes
    ----------
    design : CorrDPDesign
    clipping_norm : float
        ``C`` (fixed: adaptive clipping is refused for ``corrdp``).
    declared : dict
        ``{feature: TV}`` declared in ``insensitive-tv``.
    estimates : dict
        ``{feature: ReleasedTV}`` released with noise (empty without ``tv-estimate``).
    charges : tuple of Estimate
        One ``SubsampledGaussian(σ_tv, 1.0)`` per released TV (the ledger's ``estimate``
        entries, :attr:`fedfdp.mechanism.Accounting.estimates`).
    layout_only : bool
        True for a node's design: the TVs still to be estimated are placeholders (1);
        blocks and clip shares, which are all a node uses, do not depend on them.
    """

    design: CorrDPDesign
    clipping_norm: float
    declared: dict[str, float] = field(default_factory=dict)
    estimates: dict[str, ReleasedTV] = field(default_factory=dict)
    layout_only: bool = False
    charges: tuple[Estimate, ...] = ()

    def resolved(self) -> dict[str, Any]:
        """What ``config.toml``'s ``[resolved]`` table records of the design."""
        d = self.design
        tv = ",".join(f"{f.name}={f.tv:.4g}" for f in d.roles.insensitive)
        out: dict[str, Any] = {
            "relation-text": RELATION_TEXT,
            "corrdp-sensitive": ",".join(d.roles.names[c] for c in d.roles.sensitive),
            "corrdp-tv": tv,
            "corrdp-tv-floor": float(d.tv_floor or 0.0),
            "corrdp-feature-bound": float(d.feature_bounds[0]) if d.feature_bounds else 0.0,
            "corrdp-weight-bound": d.weight_bound,
        }
        if self.estimates:
            out["corrdp-tv-estimated"] = ",".join(
                f"{e.name}: released {e.noisy:.4g} + margin {e.margin:.4g}"
                + (f" -> 1 ({e.note})" if e.note else "")
                for e in self.estimates.values()
            )
            out["corrdp-tv-estimated-note"] = (
                "in-sample TVs released with Gaussian noise (std sigma_tv*c3/n), charged in the ledger and "
                "included in epsilon_corrdp; the margins are public (docs/corrdp.md section 3)"
            )
            sigma_tv = self.charges[0].event.noise_multiplier if self.charges else 0.0
            out["corrdp-tv-noise-multiplier"] = sigma_tv
            out["corrdp-delta-estimation"] = d.delta_estimation
        return out


def _bins(
    cfg: Config,
    data: FederatedData,
    features: Sequence[str],
    groups: Mapping[str, tuple[int, ...]],
    x: np.ndarray,
) -> tuple[dict[str, np.ndarray], dict[str, Bins]]:
    """Codes and bins of ``features``: one-hot features by category, numeric ones by ``tv-bins``."""
    spec = _spec(data)
    cuts = dict(cfg.privacy.tv_bins)
    default = cuts.get(WILDCARD)
    values: dict[str, np.ndarray] = {}
    bins: dict[str, Bins] = {}
    for f in features:
        cols = groups[f]
        if len(cols) > 1 or spec.columns[cols[0]] != f:  # one-hot inputs f=value
            block = x[:, list(cols)]
            if not np.all((block == 0) | (block == 1)) or not np.all(block.sum(axis=1) == 1):
                raise ConfigError(
                    f"tv-estimate: feature {f!r} has rows without exactly one category (a missing value?); "
                    "its TV cannot be estimated"
                )
            values[f] = block.argmax(axis=1)
            bins[f] = Bins(categories=tuple(range(len(cols))))
            if f in cuts:
                raise ConfigError(f"tv-bins: {f!r} is one-hot encoded; its bins are its categories")
            continue
        edges = cuts.get(f, default)
        if edges is None:
            raise ConfigError(
                f"tv-bins: no cut points for the numeric input {f!r}; estimating TVs needs a public "
                f"discretisation of every sensitive and estimated feature ('{f}=a:b', or '*=a:b')"
            )
        values[f] = x[:, cols[0]].astype(np.float64)
        bins[f] = Bins(edges=edges)
    return values, bins


@dataclass(frozen=True)
class ReleasedTV:
    """One insensitive feature's TV as released (module docstring).

    Attributes
    ----------
    name : str
    noisy : float
        ``clip(T̂V(j) + N(0, noise_std²), 0, 1)``: the released value.
    noise_std : float
        ``σ_tv · c3/n`` (public).
    margin : float
        ``e(β) + noise_std · Φ⁻¹(1 − β)`` (public; ``inf`` when the sampling bound does
        not apply, and then the TV used is 1).
    note : str
        Why the margin is infinite, when it is.
    """

    name: str
    noisy: float
    noise_std: float
    margin: float
    note: str = ""

    @property
    def tv(self) -> float:
        """The TV the design uses: ``min(1, noisy + margin)``."""
        return 1.0 if not math.isfinite(self.margin) else min(1.0, self.noisy + self.margin)


def _codes(
    cfg: Config, data: FederatedData, sensitive: Sequence[str], estimated: Sequence[str]
) -> tuple[np.ndarray, int, dict[str, np.ndarray], dict[str, int]]:
    """The joint sensitive cell of every training record and its number of cells; each
    estimated feature's bin codes and number of bins (public: the declared bins).
    """
    groups = feature_groups(_spec(data).columns)
    x = np.concatenate([d.x for d in data.devices]).astype(np.float64)
    values, bins = _bins(cfg, data, [*sensitive, *estimated], groups, x)
    joint, cells = joint_codes([bins[f].codes(values[f], f) for f in sensitive],
                               [bins[f].size for f in sensitive])
    codes = {f: bins[f].codes(values[f], f) for f in estimated}
    return joint, cells, codes, {f: bins[f].size for f in estimated}


def tv_noise_multiplier(cfg: Config, count: int, num_records: int) -> float:
    """``σ_tv``: ``count`` Gaussian releases cost ``estimation-epsilon`` at ``δ = 1/(2N)``."""
    return estimation_noise_multiplier(cfg.data.estimation_epsilon, count, num_records)


def tv_margin(n: int, num_values: int, num_cells: int, min_prob: float, noise_std: float,
              beta: float) -> tuple[float, str]:
    """``e(β) + noise_std · Φ⁻¹(1 − β)`` (module docstring), or ``inf`` with the reason."""
    error = estimation_error_bound(n, num_values, num_cells, min_prob, beta)
    if not math.isfinite(error):
        return math.inf, f"n={n}: too few records for the sampling bound at beta={beta:.3g}"
    return error + noise_std * NormalDist().inv_cdf(1.0 - beta), ""


def release_feature_tvs(
    cfg: Config,
    data: FederatedData,
    sensitive: Sequence[str],
    estimated: Sequence[str],
    delta: float,
    *,
    released: Mapping[str, float] | None = None,
    normals: Normals | None = None,
) -> dict[str, ReleasedTV]:
    """The TVs of the ``estimated`` features against the joint ``sensitive`` features,
    released with Gaussian noise (module docstring); ``delta`` is the probability that
    some TV used is below the true one.

    Parameters
    ----------
    released : mapping, optional
        Values already released (``estimated-tvs``): used as they are, nothing drawn.
    normals : callable, optional
        The noise's source (default: the OS CSPRNG; tests inject their own).
    """
    min_prob = cfg.privacy.tv_min_prob
    if not min_prob:
        raise ConfigError("tv-estimate: needs tv-min-prob (the declared lower bound of every bin's "
                          "probability)")
    n = data.num_records
    count = len(estimated)
    sigma = tv_noise_multiplier(cfg, count, n)
    beta = delta / (2 * count)
    joint, cells, codes, sizes = _codes(cfg, data, sensitive, estimated)
    before = dict(released or {})
    todo = [f for f in estimated if f not in before]
    draws = dict(zip(todo, np.asarray((normals or secret_normals)(len(todo)), dtype=np.float64)
                     if todo else [], strict=True))
    noise_std = sigma * (4.0 / min_prob) / n  # sigma_tv * c3 / n
    out: dict[str, ReleasedTV] = {}
    try:
        for f in estimated:
            margin, note = tv_margin(n, sizes[f], cells, min_prob, noise_std, beta)
            if f in before:
                noisy = float(before[f])
            else:
                tv_hat = empirical_tv(codes[f], joint, sizes[f], cells, min_prob)
                noisy = float(np.clip(tv_hat + noise_std * draws[f], 0.0, 1.0))
            out[f] = ReleasedTV(f, noisy, noise_std, margin, note)
    except ValueError as exc:
        raise ConfigError(f"tv-estimate (tv-min-prob={cfg.privacy.tv_min_prob}): {exc}") from exc
    return out


def corrdp_setup(
    cfg: Config, data: FederatedData, *, estimate: bool = True, normals: Normals | None = None
) -> CorrDPSetup:
    """The CorrDP design of ``cfg`` on ``data`` (module docstring).

    Parameters
    ----------
    estimate : bool
        Release the TVs ``tv-estimate`` asks for (the server; the centralised engine),
        or read them from ``estimated-tvs`` when the run already released them.
        False: a node's design, whose blocks and clip shares do not depend on TVs.
    normals : callable, optional
        The noise source of a release (default: the OS CSPRNG).

    Raises
    ------
    ConfigError
        A column unknown, declared both sensitive and insensitive, or neither (without
        ``tv-estimate``); no sensitive column; bins missing for an estimate.

    Examples
    --------
    >>> from fedfdp.config import load_config
    >>> from fedfdp.data import load_dataset
    >>> cfg = load_config({"mode": "corrdp", "dataset": "correlated", "num-sensitive": 1,
    ...                    "num-insensitive": 2, "insensitive-tv": "u0=0.1,*=0.5"})
    >>> setup = corrdp_setup(cfg, load_dataset(cfg.data))
    >>> setup.design.roles.sensitive, setup.design.roles.tv
    ((0,), {'u0': 0.1, 'u1': 0.5})
    """
    p = cfg.privacy
    spec = _spec(data)
    columns = spec.columns
    groups = feature_groups(columns)
    key = "sensitive-columns" if p.sensitive_columns else "private columns of the dataset"
    named = p.sensitive_columns or spec.private
    sensitive = list(dict.fromkeys(_feature_of(n, groups, columns, key) for n in named))
    if not sensitive:
        raise ConfigError(
            f"sensitive-columns: empty and dataset {data.name!r} declares no private column; name the "
            "sensitive features"
        )
    insensitive = [f for f in groups if f not in sensitive]
    declared = dict(p.insensitive_tv)
    default = declared.pop(WILDCARD, None)
    for name in declared:
        f = _feature_of(name, groups, columns, "insensitive-tv")
        if f in sensitive:
            raise ConfigError(f"insensitive-tv: column {name!r} is declared both sensitive and insensitive")
    tv: dict[str, float | None] = {f: declared.get(f, default) for f in insensitive}
    missing = [f for f, v in tv.items() if v is None]
    if missing and not p.tv_estimate:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ConfigError(
            f"insensitive-tv: features {shown} are neither sensitive nor given a TV (declare them in "
            "insensitive-tv, '*=TV' for the rest, or set tv-estimate = true)"
        )
    estimates: dict[str, ReleasedTV] = {}
    charges: tuple[Estimate, ...] = ()
    delta_est = 0.0
    if missing and estimate:
        delta_est = tv_estimation_delta(cfg, data.num_records)
        estimates = release_feature_tvs(cfg, data, sensitive, missing, delta_est,
                                        released=dict(p.estimated_tvs), normals=normals)
        tv.update({f: e.tv for f, e in estimates.items()})
        sigma_tv = tv_noise_multiplier(cfg, len(missing), data.num_records)
        charges = tuple(Estimate(f"TV of {f!r}", SubsampledGaussian(sigma_tv, 1.0)) for f in missing)
    elif missing:
        tv.update(dict.fromkeys(missing, 1.0))  # placeholders: a node's layout does not use TVs
    resolved_tv = {f: v for f, v in tv.items() if v is not None}
    if len(resolved_tv) != len(tv):  # pragma: no cover - every missing TV was estimated or set above
        raise ConfigError(f"insensitive-tv: no TV for {sorted(set(tv) - set(resolved_tv))}")
    roles = FeatureRoles(
        len(columns),
        tuple(c for f in sensitive for c in groups[f]),
        tuple(InsensitiveFeature(f, groups[f], float(resolved_tv[f])) for f in insensitive),
        columns,
    )
    bound = p.corrdp_feature_bound or data.input_bound or 1.0
    floor = None if p.corrdp_tv_floor is TvFloor.PAPER else float(p.corrdp_tv_floor)
    blocks = 1 + len(insensitive) + 1  # sensitive, each insensitive feature, bias
    shares = None if p.corrdp_clip_shares is ClipShares.PROPORTIONAL else (1.0 / math.sqrt(blocks),) * blocks
    try:
        design = CorrDPDesign(
            roles, data.num_classes, (bound,) * len(columns), p.corrdp_weight_bound, bias=True,
            clip_shares=shares, tv_floor=floor, delta_estimation=delta_est,
        )  # fmt: skip
    except ValueError as exc:
        raise ConfigError(f"mode='corrdp': {exc}") from exc
    return CorrDPSetup(design, p.clipping_norm, {f: v for f, v in declared.items() if f in tv},
                       estimates, layout_only=bool(missing) and not estimate, charges=charges)


def corrdp_accounting(setup: CorrDPSetup, eps_error: float = 0.05) -> Accounting:
    """The server's :class:`~fedfdp.mechanism.Accounting` of a CorrDP run: the event
    family ``σ ↦`` :meth:`CorrDPDesign.round_event` at the run's ``C``, the per-class
    :class:`~fedfdp.corrdp.accounting.CorrDPAccountant` (relation ``"corrdp"``, δ
    of the TV estimate set aside), the ε in ``epsilon_corrdp`` with the relation named
    (:data:`RELATION_TEXT`).
    """
    if setup.layout_only:
        raise ValueError("corrdp_accounting: a node's layout-only design has placeholder TVs")
    design, clip = setup.design, setup.clipping_norm

    def family(sigma: float, rate: float, participation: float) -> PrivacyEvent:
        return design.round_event(noise_multiplier=sigma, clipping_norm=clip, sampling_rate=rate,
                                  participation=participation)

    return Accounting(
        relation=RELATION,
        column=EPSILON_COLUMN,
        family=family,
        new=lambda: CorrDPAccountant(design.delta_estimation, eps_error),
        resolved=setup.resolved(),
        text=RELATION_TEXT,
        estimates=setup.charges,
    )


@dataclass(frozen=True)
class BlockClippedSum:
    """The node's :class:`~fedfdp.contribution.PrivateAggregator` for ``corrdp``: the full
    cross-entropy gradient of every record in the union of the Poisson batches,
    clipped per block (:func:`~fedfdp.corrdp.noise.glm_clipped_sum`: ``‖ḡ_B‖ ≤ C_B``,
    ``Σ C_B² = C²``, so each record's clipped gradient also has norm ``≤ C``), summed.
    The per-block sensitivities under the CorrDP relation are
    :meth:`CorrDPDesign.sensitivity` (Algorithm 1 of the CorrDP paper). Only the sum
    leaves the node. Other phases are refused.

    Examples
    --------
    >>> from fedfdp.corrdp import FeatureRoles, InsensitiveFeature
    >>> from fedfdp.contribution import RoundSettings
    >>> from fedfdp.models import build_model
    >>> from fedfdp.modes import PHASES
    >>> design = CorrDPDesign(FeatureRoles(2, (0,), (InsensitiveFeature("u", (1,), 0.3),)), 2, (1, 1), 1.0)
    >>> batch = PrivateBatch(torch.ones(3, 2), torch.tensor([0, 1, 1]), torch.Generator(), 3)
    >>> settings = RoundSettings(1, 0, PHASES["corrdp"], 1.0, 0.5)
    >>> out = BlockClippedSum(design)(build_model("logistic", 2, 2), None, settings, [batch])
    >>> [tuple(g.shape) for g in out.grads]
    [(2, 2), (2,)]
    """

    design: CorrDPDesign

    def __call__(
        self,
        model: nn.Module,
        decomposition: FeatureMap | None,
        settings: RoundSettings,
        batches: Sequence[PrivateBatch],
    ) -> PrivateSum:
        if not settings.phase.per_block:
            raise ValueError(
                f"phase {settings.phase.name!r}: the CorrDP aggregator computes phase 'corrdp' only"
            )
        if batches:
            x = torch.cat([b.x for b in batches])
            y = torch.cat([b.y for b in batches])
        else:
            x = torch.zeros(0, self.design.roles.num_inputs)
            y = torch.zeros(0, dtype=torch.long)
        try:
            grads = glm_clipped_sum(model, x, y, self.design, settings.clipping_norm)
        except ValueError as exc:  # a model outside Θ or of another shape: refused, named
            raise ValueError(f"corrdp: {exc}") from exc
        return PrivateSum(grads, 0)
