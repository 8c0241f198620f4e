"""A synthetic dataset with controlled correlation and TV known in closed form.

Generative model (``m = m_s + m_u`` columns, every ``|x_k| ≤ B = 1/√m`` so ``‖x‖ ≤ 1``,
Assumption 3.3)::

    sensitive k:     s_k ~ uniform{−1, +1},                 x_k = B (¾ s_k + ¼ U_k)
    insensitive j:   linked to sensitive ℓ(j) = j mod m_s;
                     c_j ~ Bernoulli(ρ_j);  t_j = s_ℓ(j) if c_j else uniform{−1, +1}
                                                            x_j = B (¾ t_j + ¼ U_j)
    label:           y ~ softmax(a · W* t / √m),  t = (s, t_U),  W* ~ N(0, 1)^{K×m}

with every ``U ~ Uniform(−1, 1)`` and all draws independent. The sign of ``x_k`` is
``s_k`` (resp. ``t_j``) because ``¾ > ¼``.

**Closed form: TV(j) = ρ_j.** ``X^S = (s, U_S)``; given ``x_j`` only ``s_ℓ(j)``'s law
changes, through ``t_j = sign(x_j)``: ``P(s_ℓ = +1 | t_j = +1) = (1 + ρ_j)/2``,
``P(s_ℓ = +1 | t_j = −1) = (1 − ρ_j)/2``. The other coordinates of ``X^S`` are
independent of ``x_j`` and identical in both conditionals, so (TV of product laws
with a common factor) ``TV(P_{X^S|x_j=a}, P_{X^S|x_j=a'}) = ρ_j`` when ``a`` and ``a'``
have opposite signs and 0 otherwise: ``TV(j) = ρ_j``. The same value holds for the
discretisation at 0 of every column (:meth:`CorrelatedData.bins`; Assumption D of
:mod:`fedfdp.corrdp.tv` holds exactly), so the in-sample estimator targets ``ρ_j``.
``ρ_j = 0``: independent; ``ρ_j = 1``: ``x_j`` reveals ``s_ℓ(j)``.

Randomness: a :func:`numpy.random.default_rng` from ``seed`` (synthetic data are
public randomness: docs/threat_model.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedfdp.corrdp.roles import FeatureRoles, InsensitiveFeature
from fedfdp.corrdp.tv import Bins


@dataclass(frozen=True, eq=False)
class CorrelatedData:
    """Records of :func:`correlated_features` and what is known about them in closed form.

    Attributes
    ----------
    x : float array (n, m)
    y : int array (n,)
    names : tuple of str
        ``s0, s1, ...`` then ``u0, u1, ...``.
    sensitive : tuple of int
        Columns ``0 .. m_s − 1``.
    insensitive : tuple of int
        Columns ``m_s .. m − 1``.
    linked : tuple of int
        The sensitive column each insensitive column copies with probability ``ρ_j``.
    tv : tuple of float
        ``TV(j) = ρ_j`` per insensitive column (closed form).
    bound : float
        ``B = 1/√m``: ``|x_k| ≤ B``.
    num_classes : int

    Examples
    --------
    >>> data = correlated_features(100, 2, 2, 0.5, seed=0)
    >>> data.roles().tv, data.bound == 0.5
    ({'u0': 0.5, 'u1': 0.5}, True)
    """

    x: np.ndarray
    y: np.ndarray
    names: tuple[str, ...]
    sensitive: tuple[int, ...]
    insensitive: tuple[int, ...]
    linked: tuple[int, ...]
    tv: tuple[float, ...]
    bound: float
    num_classes: int

    def roles(self) -> FeatureRoles:
        """The roles with the closed-form TVs."""
        feats = tuple(
            InsensitiveFeature(self.names[c], (c,), tv)
            for c, tv in zip(self.insensitive, self.tv, strict=True)
        )
        return FeatureRoles(len(self.names), self.sensitive, feats, self.names)

    def bins(self) -> dict[str, Bins]:
        """The discretisation at 0 of every column (sufficient for TV, see the module docstring)."""
        return {name: Bins(edges=(0.0,)) for name in self.names}

    def feature_bounds(self) -> tuple[float, ...]:
        return (self.bound,) * len(self.names)


def correlated_features(
    n: int,
    num_sensitive: int,
    num_insensitive: int,
    rho: float | Sequence[float],
    seed: int = 0,
    num_classes: int = 2,
    signal: float = 4.0,
) -> CorrelatedData:
    """Draw ``n`` records of the module's generative model.

    Parameters
    ----------
    n : int
    num_sensitive, num_insensitive : int
        ``m_s ≥ 1`` and ``m_u ≥ 1``.
    rho : float or sequence of float
        ``ρ_j ∈ [0, 1]`` per insensitive column (one value for all): the correlation
        strength, equal to ``TV(j)``.
    seed : int
        Public seed of the draw (and of the label weights ``W*``).
    num_classes : int
        ``K ≥ 2``.
    signal : float
        ``a``: how strongly the signs determine the label.

    Examples
    --------
    >>> data = correlated_features(1000, 2, 3, [0.0, 0.5, 1.0], seed=1)
    >>> data.x.shape, data.tv
    ((1000, 5), (0.0, 0.5, 1.0))
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: must be an integer >= 1")
    if num_sensitive < 1 or num_insensitive < 1:
        raise ValueError(f"num_sensitive={num_sensitive}, num_insensitive={num_insensitive}: need >= 1 each")
    rhos = [float(rho)] * num_insensitive if isinstance(rho, int | float) else [float(r) for r in rho]
    if len(rhos) != num_insensitive:
        raise ValueError(f"rho: {len(rhos)} values for {num_insensitive} insensitive columns")
    for j, r in enumerate(rhos):
        if not (math.isfinite(r) and 0.0 <= r <= 1.0):
            raise ValueError(f"rho of insensitive column u{j}: {r} must be in [0, 1]")
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes}: must be >= 2")
    m = num_sensitive + num_insensitive
    bound = 1.0 / math.sqrt(m)
    rng = np.random.default_rng(seed)
    signs = np.empty((n, m))
    signs[:, :num_sensitive] = rng.choice([-1.0, 1.0], size=(n, num_sensitive))
    linked = tuple(j % num_sensitive for j in range(num_insensitive))
    copy = rng.random((n, num_insensitive)) < np.asarray(rhos)
    fresh = rng.choice([-1.0, 1.0], size=(n, num_insensitive))
    signs[:, num_sensitive:] = np.where(copy, signs[:, list(linked)], fresh)
    x = bound * (0.75 * signs + 0.25 * rng.uniform(-1.0, 1.0, size=(n, m)))
    weights = rng.standard_normal((num_classes, m))
    logits = signal * signs @ weights.T / math.sqrt(m)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = (rng.random((n, 1)) > np.cumsum(p, axis=1)).sum(axis=1).astype(np.int64)
    y = np.minimum(y, num_classes - 1)
    names = tuple(f"s{k}" for k in range(num_sensitive)) + tuple(f"u{j}" for j in range(num_insensitive))
    return CorrelatedData(
        x, y, names, tuple(range(num_sensitive)), tuple(range(num_sensitive, m)), linked, tuple(rhos),
        bound, num_classes,
    )  # fmt: skip
