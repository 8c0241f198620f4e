"""CorrDP: correlation-aware differential privacy beside DP and FDP.

The CorrDP paper (Wang, Zhang, Cummings, AISTATS 2026, arXiv:2605.03945) protects every
feature, but a change of an *insensitive* feature ``j`` only to the degree ``TV(j)``
to which it reveals the *sensitive* features. Neighbours replace one record's
sensitive features, or one insensitive feature; labels are fixed (Def. 2.1,
Assumption 3.1); a sensitive change must be ``(ε, δ)``-indistinguishable, a change of
feature ``j`` ``(ε/TV(j), δ)`` (Def. 2.2). Every ε of this package is reported under
the relation name ``"corrdp"`` and must never be shown as a DP or FDP ε.

Modules
-------
:mod:`~fedfdp.corrdp.roles`
    :class:`FeatureRoles`, :class:`InsensitiveFeature`: sensitive columns, insensitive
    features and their TVs (validated).
:mod:`~fedfdp.corrdp.tv`
    ``TV(j)``: declared, or estimated in-sample (Def. 3.10, Theorem 3.11) with the
    constants ``c2``, ``γ``, ``c3`` derived in its docstring.
:mod:`~fedfdp.corrdp.laplace`
    The CorrDP and standard Laplace mechanisms (Def. 2.7-2.8, Theorem 2.9) with an
    exact discrete-Laplace sampler; per-group feature means.
:mod:`~fedfdp.corrdp.noise`
    CorrDP-SGD for GLMs (Algorithm 1, Eq. (3)): blocks, per-block clipping, explicit
    sensitivities, per-coordinate noise, the mechanism for ``ServerParts``.
:mod:`~fedfdp.corrdp.accounting`
    Per-class Gaussian pairs composed by fedfdp's PRV accountant; the CorrDP ε.
:mod:`~fedfdp.corrdp.synthetic`
    A dataset with controlled correlation and ``TV(j) = ρ_j`` in closed form.

See ``docs/corrdp.md``.
"""

from fedfdp.corrdp.accounting import (
    RELATION_TEXT,
    CorrDPAccountant,
    CorrDPEpsilon,
    calibrate_noise_multiplier,
    corrdp_epsilon,
    effective_noise_multiplier,
)
from fedfdp.corrdp.laplace import (
    LaplaceRelease,
    corrdp_laplace,
    correlated_sensitivity,
    discrete_laplace,
    group_feature_means,
    linf_bound,
    minimal_correlated_sensitivity,
    relation_sensitivity,
    standard_laplace,
    standard_sensitivity,
)
from fedfdp.corrdp.noise import (
    CorrDPDesign,
    CorrDPGaussianMechanism,
    clip_per_block,
    coordinate_stds,
    corrdp_mechanism_factory,
    glm_clipped_sum,
    glm_shape,
    project_weights_,
)
from fedfdp.corrdp.roles import RELATION, FeatureRoles, InsensitiveFeature, check_tv
from fedfdp.corrdp.synthetic import CorrelatedData, correlated_features
from fedfdp.corrdp.tv import Bins, TVEstimate, empirical_tv, estimate_tv, estimate_tvs, inflate, tv_of_joint

__all__ = [
    "RELATION",
    "RELATION_TEXT",
    "Bins",
    "CorrDPAccountant",
    "CorrDPDesign",
    "CorrDPEpsilon",
    "CorrDPGaussianMechanism",
    "CorrelatedData",
    "FeatureRoles",
    "InsensitiveFeature",
    "LaplaceRelease",

    "TVEstimate",
    "calibrate_noise_multiplier",
    "check_tv",
    "clip_per_block",
    "coordinate_stds",
    "corrdp_epsilon",
    "corrdp_laplace",
    "corrdp_mechanism_factory",
    "correlated_features",
    "correlated_sensitivity",
    "discrete_laplace",
    "effective_noise_multiplier",
    "empirical_tv",
    "estimate_tv",
    "estimate_tvs",
    "glm_clipped_sum",
    "glm_shape",
    "group_feature_means",
    "inflate",
    "linf_bound",
    "minimal_correlated_sensitivity",
    "project_weights_",
    "relation_sensitivity",
    "standard_laplace",
    "standard_sensitivity",
    "tv_of_joint",
]
