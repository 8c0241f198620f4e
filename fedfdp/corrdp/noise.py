"""CorrDP-SGD's noise for generalized linear models (CorrDP paper, Algorithm 1, Eq. (3)).

Model and blocks
----------------
Softmax regression (and logistic regression as its two-class case): logits
``z = W x + b``, ``W ∈ R^{K×m}``, cross-entropy loss; parameter column ``W[:, i]``
belongs to input column ``i`` (Assumption 3.4). :func:`glm_shape` refuses any other
model. The parameters are cut into **blocks**: ``sensitive`` (the columns of
``W`` for the sensitive inputs ``S``), one block per insensitive feature ``j``
(``W[:, cols(j)]``) and ``bias`` (``b``). Each record's gradient is clipped **per
block** (:func:`clip_per_block`, :func:`glm_clipped_sum`) to norms ``C_B = C·s_B`` with
``Σ s_B² = 1``, so the clipped per-record gradient has norm ``≤ C`` as under the
project's joint clipping. Default shares ``s_B ∝ B_B``, the bound on ``‖x_B‖``
(1 for the bias): every block is clipped at the same fraction of its largest
possible norm ``√2·B_B``.

Noise (Eq. (3))
---------------
``N(0, σ_B² I)`` on block ``B`` with ``σ_B = σ·C·√f_B``: ``f_B = 1`` on the sensitive
block and on the bias (the DP-SGD variance ``σ²C²``) and
``f_j = max{TV(j), floor}`` on insensitive feature ``j``, ``floor = (m_s/m)²`` by
default (the paper's ``m_s²/m²``). The bias gets the DP level because its gradient,
the residual ``r = softmax(z) − onehot(y)``, moves with every feature, the sensitive
ones included; it is only ``K`` coordinates.

Sensitivity under the CorrDP relation (derivation; replaces c1, C1, C2)
-----------------------------------------------------------------------
Neighbours replace one record's sensitive inputs, or one insensitive feature's
inputs; the label is fixed (Def. 2.1, Assumption 3.1). Declared, public
assumptions: ``|x_k| ≤ B_k`` for every input column (Assumption 3.3; inputs are
clamped to it) and ``‖W[:, k]‖₂ ≤ D`` for every column of the model at which
gradients are taken (``Θ``'s projection in Algorithm 1: :func:`project_weights_`
after every step; :func:`glm_clipped_sum` refuses a model outside it).

For a change of the inputs in the columns ``J`` (``J = S``, or ``J = cols(j)``):

1. logits move by ``‖Δz‖ = ‖W[:, J] Δx_J‖ ≤ Σ_{k∈J} D·2B_k =: ζ_J`` (the bias
   cancels);
2. the residual moves by ``‖Δr‖ ≤ ρ_J := min(√2, ζ_J/2)``: the softmax Jacobian
   ``diag(p) − ppᵀ`` has ``vᵀJv = Var_p(v) ≤ ‖v‖²/2`` (Popoviciu), so softmax is
   ½-Lipschitz, and two probability vectors are ``≤ √2`` apart; the label is fixed;
3. block ``B``'s gradient is ``r x_Bᵀ`` (bias: ``r``), of norm ``≤ √2 B_B``, and
   clipping is the projection onto a ball, which is 1-Lipschitz. A block whose
   inputs change moves by ``≤ 2 C̄_B``, ``C̄_B = min(C_B, √2 B_B)``; a block whose
   inputs do not change (the bias: ``x ≡ 1``) moves by
   ``≤ min(2 C̄_B, ‖x_B‖ ‖Δr‖) ≤ min(2 C̄_B, B_B ρ_J)``.

This gives the sensitivity vector ``Δ_c = (Δ_{c,B})_B`` of every **class** ``c``
(``sensitive``, and ``feature:<name>`` per insensitive feature) explicitly
(:meth:`CorrDPDesign.sensitivity`). Both datasets' noisy sums are
``s + ḡ(e) + N(0, Σ)`` and ``s + ḡ(e') + N(0, Σ)``, ``Σ = diag(σ_B²)``: a Gaussian pair
with ``μ_c = ‖Σ^{-1/2}(ḡ(e) − ḡ(e'))‖ ≤ √(Σ_B Δ_{c,B}²/σ_B²)``
(:meth:`CorrDPDesign.class_mu`), i.e. a Gaussian mechanism with noise multiplier
``1/μ_c``. How rounds compose (Poisson sampling, the weight ``TV(j)`` of each class)
is :mod:`fedfdp.corrdp.accounting`.

In the paper's normalisation (``B_k = 1/√m``) the cross-block terms are
``≈ D·|J|/m`` per block: that is Assumption 3.4's ``C2·L/m`` with ``D = O(1)``,
and the floor ``(m_s/m)²`` keeps them from dominating ``μ_sensitive`` when TVs are
small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedfdp.accounting.events import CorrDPClass, CorrDPRound
from fedfdp.corrdp.roles import FeatureRoles
from fedfdp.entropy import BitStream
from fedfdp.mechanisms import standard_normals

#: Lipschitz constant of the softmax cross-entropy residual in the logits (ℓ2).
RESIDUAL_LIPSCHITZ = 0.5
#: Bound on ‖softmax(z) − onehot(y)‖₂ and on ‖softmax(z) − softmax(z')‖₂.
RESIDUAL_BOUND = math.sqrt(2.0)

SENSITIVE = "sensitive"
BIAS = "bias"
FEATURE_PREFIX = "feature:"


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class GLMShape:
    """A softmax-regression model: ``num_inputs`` → ``num_classes`` logits, with or without bias."""

    num_inputs: int
    num_classes: int
    bias: bool


def _linear(model: nn.Module) -> nn.Linear | None:
    if isinstance(model, nn.Linear):
        return model
    if isinstance(model, nn.Sequential) and len(model) == 1 and isinstance(model[0], nn.Linear):
        return model[0]
    return None


def _describe(model: nn.Module) -> str:
    children = [type(c).__name__ for c in model.children()]
    return f"{type(model).__name__}({', '.join(children)})" if children else type(model).__name__


def glm_shape(model: nn.Module, name: str | None = None) -> GLMShape:
    """The shape of a generalized linear model, or a one-line ValueError naming the model.

    Accepted: ``nn.Linear`` or ``nn.Sequential(nn.Linear)`` with trainable weight
    (softmax regression, the project's ``model = "logistic"``).

    Examples
    --------
    >>> from fedfdp.models import build_model
    >>> glm_shape(build_model("logistic", 4, 3))
    GLMShape(num_inputs=4, num_classes=3, bias=True)
    >>> glm_shape(build_model("mlp", 4, 3), "mlp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: corrdp: model='mlp' (Sequential(Linear, ReLU, Linear, ReLU, Linear)) is not a generalized ...
    """
    linear = _linear(model)
    if linear is None or not linear.weight.requires_grad:
        label = f"model={name!r} ({_describe(model)})" if name else f"model {_describe(model)}"
        raise ValueError(
            f"corrdp: {label} is not a generalized linear model (one nn.Linear from the inputs to the "
            "logits): CorrDP-SGD's per-coordinate noise needs parameter column i to belong to input "
            "feature i (Assumption 3.4)"
        )
    bias = linear.bias is not None and linear.bias.requires_grad
    return GLMShape(linear.in_features, linear.out_features, bias)


#: Projection aims this far inside the bound so that rounding to the model's dtype stays inside.
PROJECTION_MARGIN = 1e-5


def project_weights_(model: nn.Module, weight_bound: float) -> None:
    """Scale every column ``W[:, k]`` to norm ``≤ weight_bound`` in place (post-processing
    of a released model: no privacy cost). Keeps the model in the declared ``Θ``; columns
    above ``weight_bound·(1 − 1e-5)`` are scaled to that norm (float64), so the result
    stays ``≤ weight_bound`` after rounding to float32.

    Examples
    --------
    >>> from fedfdp.models import build_model
    >>> model = build_model("logistic", 4, 3)
    >>> with torch.no_grad():
    ...     _ = model[0].weight.mul_(10.0)
    >>> project_weights_(model, 0.5)
    >>> bool(model[0].weight.double().norm(dim=0).max() <= 0.5)
    True
    """
    linear = _linear(model)
    if linear is None:
        glm_shape(model)
        return
    _check_positive("weight_bound", weight_bound)
    with torch.no_grad():
        w = linear.weight.detach().double()
        target = weight_bound * (1.0 - PROJECTION_MARGIN)
        scale = torch.clamp(target / torch.clamp(w.norm(dim=0), min=1e-300), max=1.0)
        linear.weight.copy_((w * scale).to(linear.weight.dtype))


# ----------------------------------------------------------------------------- the design


@dataclass(frozen=True)
class Block:
    """A block of the parameters: its name, kind, input columns and its bound ``B_B``."""

    name: str
    kind: str  # "sensitive" | "feature" | "bias"
    columns: tuple[int, ...]
    bound: float
    tv: float


@dataclass(frozen=True)
class CorrDPDesign:
    """CorrDP-SGD's blocks, clipping shares, noise factors and sensitivities for a GLM.

    Parameters
    ----------
    roles : FeatureRoles
        Sensitive columns and insensitive features with their TVs (declared, or
        estimated and inflated: then set ``delta_estimation``).
    num_classes : int
        ``K`` (>= 2).
    feature_bounds : tuple of float
        ``B_k``: ``|x_k| ≤ B_k`` for every input column (inputs are clamped to it).
    weight_bound : float
        ``D``: ``‖W[:, k]‖ ≤ D`` for every column (:func:`project_weights_`).
    bias : bool
        Whether the model has a trainable bias (its own block, DP-level noise).
    clip_shares : tuple of float, optional
        ``s_B`` per block in :attr:`blocks` order, ``Σ s_B² = 1``; default ``∝ B_B``.
    tv_floor : float, optional
        Floor of the insensitive noise factor; default ``(m_s/m)²`` (Eq. (3)).
    delta_estimation : float
        δ spent by an in-sample TV estimate (Theorem 3.11; 0 for declared TVs).

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> feats = (InsensitiveFeature("speed", (1,), 0.3), InsensitiveFeature("hour", (2,), 0.05))
    >>> roles = FeatureRoles(3, (0,), feats)
    >>> design = CorrDPDesign(roles, num_classes=2, feature_bounds=(0.5, 0.5, 0.5), weight_bound=1.0)
    >>> [b.name for b in design.blocks]
    ['sensitive', 'feature:speed', 'feature:hour', 'bias']
    >>> design.variance_factors().round(3).tolist()  # Eq. (3): floor (m_s/m)² = 1/9
    [1.0, 0.3, 0.111, 1.0]
    >>> sorted(design.class_mu(2.0, 1.0))
    ['feature:hour', 'feature:speed', 'sensitive']
    """

    roles: FeatureRoles
    num_classes: int
    feature_bounds: tuple[float, ...]
    weight_bound: float
    bias: bool = True
    clip_shares: tuple[float, ...] | None = None
    tv_floor: float | None = None
    delta_estimation: float = 0.0
    blocks: tuple[Block, ...] = field(init=False)

    def __post_init__(self) -> None:
        r = self.roles
        if not isinstance(r, FeatureRoles):
            raise ValueError("roles: must be a FeatureRoles")
        if r.num_sensitive < 1:
            raise ValueError(
                "corrdp: no sensitive column declared (TV is measured against the sensitive features)"
            )
        if (
            isinstance(self.num_classes, bool)
            or not isinstance(self.num_classes, int)
            or self.num_classes < 2
        ):
            raise ValueError(f"num_classes={self.num_classes!r}: must be an integer >= 2")
        bounds = tuple(float(b) for b in self.feature_bounds)
        if len(bounds) != r.num_inputs:
            raise ValueError(f"feature_bounds: {len(bounds)} bounds for {r.num_inputs} input columns")
        for k, b in enumerate(bounds):
            if not (math.isfinite(b) and b > 0):
                raise ValueError(f"feature bound of column {k}: {b} must be finite and > 0")
        object.__setattr__(self, "feature_bounds", bounds)
        if not (math.isfinite(self.weight_bound) and self.weight_bound > 0):
            raise ValueError(f"weight_bound={self.weight_bound}: must be finite and > 0")
        if not (math.isfinite(self.delta_estimation) and 0.0 <= self.delta_estimation < 1.0):
            raise ValueError(f"delta_estimation={self.delta_estimation}: must be in [0, 1)")
        floor = (r.num_sensitive / r.num_inputs) ** 2 if self.tv_floor is None else float(self.tv_floor)
        if not (math.isfinite(floor) and 0.0 <= floor <= 1.0):
            raise ValueError(f"tv_floor={self.tv_floor}: must be in [0, 1]")
        object.__setattr__(self, "tv_floor", floor)

        def norm(cols: Sequence[int]) -> float:
            return math.sqrt(sum(bounds[c] ** 2 for c in cols))

        blocks = [Block(SENSITIVE, "sensitive", r.sensitive, norm(r.sensitive), 1.0)]
        blocks += [
            Block(FEATURE_PREFIX + f.name, "feature", f.columns, norm(f.columns), f.tv) for f in r.insensitive
        ]
        if self.bias:
            blocks.append(Block(BIAS, "bias", (), 1.0, 1.0))
        object.__setattr__(self, "blocks", tuple(blocks))
        for block in blocks:
            if block.kind == "feature" and max(block.tv, floor) <= 0.0:
                raise ValueError(
                    f"insensitive feature {block.name[len(FEATURE_PREFIX) :]!r}: tv=0 with tv_floor=0 "
                    "gives its block no noise; set tv_floor > 0"
                )
        if self.clip_shares is None:
            total = math.sqrt(sum(b.bound**2 for b in blocks))
            shares = tuple(b.bound / total for b in blocks)
        else:
            shares = tuple(float(s) for s in self.clip_shares)
            if len(shares) != len(blocks):
                raise ValueError(f"clip_shares: {len(shares)} shares for {len(blocks)} blocks")
            if any(not (math.isfinite(s) and s > 0) for s in shares):
                raise ValueError(f"clip_shares {shares}: must be finite and > 0")
            if not math.isclose(sum(s * s for s in shares), 1.0, rel_tol=1e-9):
                raise ValueError(f"clip_shares {shares}: squares must sum to 1")
        object.__setattr__(self, "clip_shares", shares)

    # ------------------------------------------------------------------ layout
    @property
    def shape(self) -> GLMShape:
        return GLMShape(self.roles.num_inputs, self.num_classes, self.bias)

    def check_model(self, model: nn.Module, name: str | None = None) -> None:
        """ValueError unless ``model`` is a GLM of this design's shape."""
        shape = glm_shape(model, name)
        if shape != self.shape:
            raise ValueError(f"corrdp: model shape {shape} does not match the design's {self.shape}")

    def column_block(self) -> np.ndarray:
        """Index into :attr:`blocks` of every input column."""
        out = np.empty(self.roles.num_inputs, dtype=np.int64)
        for i, b in enumerate(self.blocks):
            out[list(b.columns)] = i
        return out

    # ------------------------------------------------------------------ noise
    def variance_factors(self) -> np.ndarray:
        """``f_B`` per block (Eq. (3)): 1 (sensitive, bias), ``max{TV(j), floor}`` (feature ``j``)."""
        floor = float(self.tv_floor or 0.0)
        return np.array([max(b.tv, floor) if b.kind == "feature" else 1.0 for b in self.blocks])

    def block_clips(self, clipping_norm: float) -> np.ndarray:
        """``C_B = C·s_B``."""
        _check_positive("clipping-norm", clipping_norm)
        return clipping_norm * np.asarray(self.clip_shares)

    def block_stds(self, noise_multiplier: float, clipping_norm: float) -> np.ndarray:
        """``σ_B = σ·C·√f_B``: the noise std of every coordinate of block ``B``."""
        _check_positive("noise-multiplier", noise_multiplier)
        _check_positive("clipping-norm", clipping_norm)
        return noise_multiplier * clipping_norm * np.sqrt(self.variance_factors())

    # ------------------------------------------------------------------ sensitivity
    def _changed(self, columns: Sequence[int]) -> tuple[float, float]:
        zeta = 2.0 * self.weight_bound * sum(self.feature_bounds[c] for c in columns)
        return zeta, min(RESIDUAL_BOUND, RESIDUAL_LIPSCHITZ * zeta)

    def sensitivity(self, clipping_norm: float) -> dict[str, np.ndarray]:
        """``{class: Δ_{c,B} per block}`` (module docstring, steps 1-3)."""
        clips = np.minimum(self.block_clips(clipping_norm), [RESIDUAL_BOUND * b.bound for b in self.blocks])
        out = {}
        for c_name, cols in self._class_columns():
            _, rho = self._changed(cols)
            cset = set(cols)
            delta = np.empty(len(self.blocks))
            for i, b in enumerate(self.blocks):
                changed = b.kind != "bias" and set(b.columns) <= cset
                delta[i] = 2.0 * clips[i] if changed else min(2.0 * clips[i], b.bound * rho)
            out[c_name] = delta
        return out

    def _class_columns(self) -> list[tuple[str, tuple[int, ...]]]:
        classes = [(SENSITIVE, self.roles.sensitive)]
        classes += [(FEATURE_PREFIX + f.name, f.columns) for f in self.roles.insensitive]
        return classes

    def class_weights(self) -> dict[str, float]:
        """``d_c``: 1 for the sensitive class, ``TV(j)`` for feature ``j``."""
        return {SENSITIVE: 1.0, **{FEATURE_PREFIX + f.name: f.tv for f in self.roles.insensitive}}

    def class_mu(self, noise_multiplier: float, clipping_norm: float) -> dict[str, float]:
        """``μ_c = √(Σ_B Δ_{c,B}² / σ_B²)`` per class."""
        stds = self.block_stds(noise_multiplier, clipping_norm)
        return {
            c: float(np.sqrt(np.sum((d / stds) ** 2))) for c, d in self.sensitivity(clipping_norm).items()
        }

    def classes(self, noise_multiplier: float, clipping_norm: float) -> tuple[CorrDPClass, ...]:
        """Every class with its weight and per-round noise multiplier ``1/μ_c``.

        Examples
        --------
        >>> from fedfdp.corrdp.roles import InsensitiveFeature
        >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.3),))
        >>> design = CorrDPDesign(roles, 2, (0.5, 0.5), 1.0)
        >>> [(c.name, c.weight) for c in design.classes(2.0, 1.0)]
        [('sensitive', 1.0), ('feature:speed', 0.3)]
        """
        mus = self.class_mu(noise_multiplier, clipping_norm)
        weights = self.class_weights()
        return tuple(CorrDPClass(c, weights[c], 1.0 / mu if mu > 0 else math.inf) for c, mu in mus.items())

    def round_event(
        self,
        *,
        noise_multiplier: float,
        clipping_norm: float,
        sampling_rate: float,
        participation: float = 1.0,
    ) -> CorrDPRound:
        """The :class:`~fedfdp.accounting.events.CorrDPRound` of one round with base
        noise multiplier ``σ`` and clipping norm ``C`` at rate ``q``, participation ``p``:
        every class with its weight and ``1/μ_c``, and the whole record's ``1/M``.
        """
        return CorrDPRound(self.classes(noise_multiplier, clipping_norm),
                           1.0 / self.record_visibility(noise_multiplier, clipping_norm),
                           sampling_rate, participation)

    def record_visibility(self, noise_multiplier: float, clipping_norm: float) -> float:
        """``M = √(Σ_B C̄_B²/σ_B²)``: the largest whitened norm of one record's clipped
        gradient, the shift of adding or removing the record (bound (ii) of
        :mod:`fedfdp.corrdp.accounting`). Large ``M`` means a record's presence in a batch
        is visible through the weakly noised blocks.
        """
        clips = np.minimum(self.block_clips(clipping_norm), [RESIDUAL_BOUND * b.bound for b in self.blocks])
        return float(np.sqrt(np.sum((clips / self.block_stds(noise_multiplier, clipping_norm)) ** 2)))


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float | np.floating) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value}: must be finite and > 0")


# ----------------------------------------------------------------------------- per-coordinate stds


def coordinate_stds(
    design: CorrDPDesign, noise_multiplier: float, clipping_norm: float
) -> list[torch.Tensor]:
    """Per-coordinate noise std of the GLM's parameters, ``[weight (K, m), bias (K,)]``
    (bias only when the design has one), float64: column ``k`` of ``W`` gets its
    block's ``σ_B``, the bias ``σ_bias``.

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.25),))
    >>> design = CorrDPDesign(roles, 2, (0.5, 0.5), 1.0)
    >>> [s.tolist() for s in coordinate_stds(design, 2.0, 1.0)]  # σC on S and bias, σC√0.25 on speed
    [[[2.0, 1.0], [2.0, 1.0]], [2.0, 2.0]]
    """
    stds = design.block_stds(noise_multiplier, clipping_norm)
    col = torch.from_numpy(stds[design.column_block()])
    out = [col.expand(design.num_classes, -1).clone()]
    if design.bias:
        out.append(torch.full((design.num_classes,), float(stds[-1]), dtype=torch.float64))
    return out


@dataclass(frozen=True, eq=False)
class CorrDPGaussianMechanism:
    """Adds ``N(0, diag(σ_i²))`` once to a sum of per-block clipped gradients.

    The interface of :class:`fedfdp.mechanisms.GaussianSumMechanism`: ``privatize``
    takes the clipped sum (the GLM's ``[weight, bias]``) and a secret
    :class:`~fedfdp.entropy.BitStream`, draws every coordinate from the hardened
    sampler :func:`fedfdp.mechanisms.standard_normals` in one call, multiplies by the
    per-coordinate std, adds in float64 and rounds once to each tensor's dtype.

    Sensitivity and relation: per class ``c`` of CorrDP neighbours a Gaussian pair
    with ``μ_c`` (:meth:`CorrDPDesign.class_mu`); Eq. (3) of the CorrDP paper.

    Parameters
    ----------
    stds : tuple of Tensor
        Per-coordinate std, shaped like the parameters (:func:`coordinate_stds`).
    noise_multiplier, clipping_norm : float
        The base ``σ`` and ``C`` the stds were built from (for the ledger).

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> from fedfdp.entropy import SeededEntropy
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.25),))
    >>> mech = CorrDPGaussianMechanism.from_design(CorrDPDesign(roles, 2, (0.5, 0.5), 1.0), 2.0, 1.0)
    >>> out = mech.privatize([torch.zeros(2, 2), torch.zeros(2)], SeededEntropy(0).noise(1, 0))
    >>> [tuple(t.shape) for t in out], out[0].dtype
    ([(2, 2), (2,)], torch.float32)
    """

    stds: tuple[torch.Tensor, ...]
    noise_multiplier: float
    clipping_norm: float

    def __post_init__(self) -> None:
        stds = tuple(torch.as_tensor(s, dtype=torch.float64) for s in self.stds)
        for s in stds:
            if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
                raise ValueError("noise stds: must be finite and >= 0")
        object.__setattr__(self, "stds", stds)

    @classmethod
    def from_design(
        cls, design: CorrDPDesign, noise_multiplier: float, clipping_norm: float
    ) -> CorrDPGaussianMechanism:
        return cls(
            tuple(coordinate_stds(design, noise_multiplier, clipping_norm)), noise_multiplier, clipping_norm
        )

    def privatize(self, clipped_sum: Sequence[torch.Tensor], stream: BitStream) -> list[torch.Tensor]:
        """Return ``clipped_sum + N(0, diag(σ_i²))``, drawn once from ``stream``."""
        if len(clipped_sum) != len(self.stds) or any(
            tuple(t.shape) != tuple(s.shape) for t, s in zip(clipped_sum, self.stds, strict=False)
        ):
            raise ValueError(
                f"clipped sum shapes {[tuple(t.shape) for t in clipped_sum]} do not match the noise "
                f"shapes {[tuple(s.shape) for s in self.stds]}"
            )
        sizes = [s.numel() for s in self.stds]
        z = torch.from_numpy(standard_normals(stream, sum(sizes)))
        parts = torch.split(z, sizes)
        return [
            (t.double() + p.reshape(s.shape) * s).to(dtype=t.dtype)
            for t, p, s in zip(clipped_sum, parts, self.stds, strict=True)
        ]


def corrdp_mechanism_factory(design: CorrDPDesign) -> Callable[[float, float], CorrDPGaussianMechanism]:
    """``mechanism(σ, C)`` for :class:`fedfdp.round_engine.ServerParts`: the server calls it with
    the plan's noise multiplier and clipping norm; the design (blocks, TVs, shares) is
    closed over.

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.25),))
    >>> make = corrdp_mechanism_factory(CorrDPDesign(roles, 2, (0.5, 0.5), 1.0))
    >>> make(2.0, 1.0).stds[0].tolist()  # as ServerParts(mechanism=make) would call it
    [[2.0, 1.0], [2.0, 1.0]]
    """

    def mechanism(noise_multiplier: float, clipping_norm: float) -> CorrDPGaussianMechanism:
        return CorrDPGaussianMechanism.from_design(design, noise_multiplier, clipping_norm)

    return mechanism


# ----------------------------------------------------------------------------- per-block clipping


def _block_norms(
    weight_sq_cols: torch.Tensor, bias_sq: torch.Tensor | None, design: CorrDPDesign
) -> torch.Tensor:
    """Per-record block norms from per-record squared column norms ``(n, m)`` and bias ``(n,)``."""
    n = weight_sq_cols.shape[0]
    norms = torch.zeros(n, len(design.blocks), dtype=weight_sq_cols.dtype, device=weight_sq_cols.device)
    for i, b in enumerate(design.blocks):
        if b.kind == "bias":
            if bias_sq is not None:
                norms[:, i] = bias_sq
        else:
            norms[:, i] = weight_sq_cols[:, list(b.columns)].sum(dim=1)
    return norms.sqrt()


def _coefficients(norms: torch.Tensor, clips: np.ndarray) -> torch.Tensor:
    c = torch.as_tensor(clips, dtype=norms.dtype, device=norms.device)
    return torch.clamp(c / torch.clamp(norms, min=1e-300), max=1.0)


def clip_per_block(
    per_record: Sequence[torch.Tensor], design: CorrDPDesign, clipping_norm: float
) -> list[torch.Tensor]:
    """Σ over records of per-block clipped gradients, from per-record gradients.

    Parameters
    ----------
    per_record : [weight (n, K, m), bias (n, K)]
        Per-record gradients (bias only when the design has one).

    Returns
    -------
    [weight (K, m), bias (K,)]
        ``Σ_i ḡ_i`` with every block of ``ḡ_i`` clipped to ``C_B``.

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.25),))
    >>> design = CorrDPDesign(roles, 2, (1.0, 1.0), 1.0)
    >>> grads = [torch.ones(5, 2, 2), torch.ones(5, 2)]  # 5 records: weight (K=2, m=2), bias
    >>> [t.shape for t in clip_per_block(grads, design, clipping_norm=0.1)]
    [torch.Size([2, 2]), torch.Size([2])]
    """
    expected = 2 if design.bias else 1
    if len(per_record) != expected:
        raise ValueError(f"clip_per_block: {len(per_record)} gradient tensors, expected {expected}")
    w = per_record[0]
    b = per_record[1] if design.bias else None
    coef = _coefficients(
        _block_norms(w.square().sum(dim=1), None if b is None else b.square().sum(dim=1), design),
        design.block_clips(clipping_norm),
    )
    col = torch.as_tensor(design.column_block(), device=w.device)
    out = [torch.einsum("nkm,nm->km", w, coef[:, col])]
    if b is not None:
        out.append(torch.einsum("nk,n->k", b, coef[:, -1]))
    return out


def clamp_features(x: torch.Tensor, design: CorrDPDesign) -> torch.Tensor:
    """``x`` clamped to ``[−B_k, B_k]`` per column (a fixed per-record map)."""
    bound = torch.as_tensor(design.feature_bounds, dtype=x.dtype, device=x.device)
    return torch.maximum(torch.minimum(x, bound), -bound)


def glm_clipped_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, design: CorrDPDesign, clipping_norm: float
) -> list[torch.Tensor]:
    """Per-block clipped cross-entropy gradient sum of a GLM, in closed form.

    Per record: ``r = softmax(Wx + b) − onehot(y)``, ``∇W = r xᵀ``, ``∇b = r``; block
    ``B``'s norm is ``‖r‖·‖x_B‖``; the clipped sum is ``Rᵀ (X ⊙ coef)`` (one GEMM).
    Inputs are clamped to the declared bounds first; a model with a column of ``W``
    above ``D`` is refused (the sensitivity would not hold). Equal to
    :func:`clip_per_block` on per-record autograd gradients (tested).

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> from fedfdp.models import build_model
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("speed", (1,), 0.25),))
    >>> design = CorrDPDesign(roles, 2, (1.0, 1.0), 1.0)
    >>> model = build_model("logistic", 2, 2)
    >>> project_weights_(model, 1.0)
    >>> out = glm_clipped_sum(model, torch.ones(4, 2), torch.tensor([0, 1, 1, 0]), design, 0.5)
    >>> [tuple(t.shape) for t in out]
    [(2, 2), (2,)]
    """
    design.check_model(model)
    linear = _linear(model)
    if linear is None:  # check_model refuses these; kept for callers that skip it
        raise ValueError(
            f"corrdp clips a generalized linear model's single Linear layer; got {_describe(model)}"
        )
    col_norms = linear.weight.detach().double().norm(dim=0)
    worst = float(col_norms.max())
    if worst > design.weight_bound:
        k = int(col_norms.argmax())
        raise ValueError(
            f"corrdp: weight column {k} has norm {worst:.6g} > weight bound {design.weight_bound}; "
            "project the model (project_weights_) before computing gradients"
        )
    device = linear.weight.device  # the model's device; the sums come back to the CPU
    with torch.no_grad():
        xc = clamp_features(x.to(device=device, dtype=linear.weight.dtype), design)
        y = y.to(device)
        logits = model(xc)
        r = torch.softmax(logits, dim=1)
        r[torch.arange(len(y), device=device), y] -= 1.0
        rn2 = r.square().sum(dim=1)
        coef = _coefficients(
            _block_norms(rn2[:, None] * xc.square(), rn2 if design.bias else None, design),
            design.block_clips(clipping_norm),
        )
        col = torch.as_tensor(design.column_block(), device=device)
        out = [r.T @ (xc * coef[:, col])]
        if design.bias:
            out.append(r.T @ coef[:, -1])
    return [t.cpu() for t in out]
