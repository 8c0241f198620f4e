"""The CorrDP Laplace mechanism (Def. 2.7-2.8, Theorem 2.9) next to the standard one,
for releasing per-feature statistics such as per-device or per-class feature means.

Statistics and their sensitivities
----------------------------------
A statistic is an array ``f`` of shape ``(G, m)``: row ``g`` a group (a device, a
class), column ``k`` the model input column ``k``; coordinate ``(g, k)`` depends only
on column ``k`` of the records of group ``g`` (Def. 2.8's "the i-th dimension of f only
applies to the i-th feature"). The grouping key (device, label) is public and the
same in neighbouring datasets, as the label is in Assumption 3.1. ``Δf_{g,k}`` is the
largest change of coordinate ``(g, k)`` when one record changes.
:func:`group_feature_means` computes means of features clamped to declared bounds
``[lo_k, hi_k]`` and their ``Δf_{g,k} = (hi_k − lo_k) / n_g`` (``n_g`` public).

With ``disjoint_groups`` (each record is in one group: means per device or class)
one record moves one row; otherwise any row may move and the rows are summed.

* **Correlated sensitivity** (Def. 2.7), :func:`correlated_sensitivity`:
  ``Δ_C f = min{ Σ_{k∈S} Δf_k + Σ_{j∈U} TV(j) Σ_{k∈cols(j)} Δf_k , Δf }`` with
  ``Δf`` the ℓ1 sensitivity under the CorrDP relation,
  ``max(Σ_{k∈S} Δf_k, max_j Σ_{k∈cols(j)} Δf_k)`` (Def. 2.7 takes the max over
  CorrDP neighbours, Def. 2.1).
* **Standard sensitivity**, :func:`standard_sensitivity`: ``Σ_k Δf_k`` (one record's
  features may all change: plain DP with the group fixed).
* :func:`minimal_correlated_sensitivity`: ``max(Σ_{k∈S} Δf_k, max_j TV(j)
  Σ_{k∈cols(j)} Δf_k) ≤ Δ_C f``, the smallest scale the proof below needs.

Guarantee (Theorem 2.9)
-----------------------
``M(D) = f(D) + (Y_1, ..., Y_K)``, ``Y_i`` i.i.d. ``Lap(Δ_C f / ε)``, is
``(ε, 0)``-CorrDP: a change of the sensitive features moves ``f`` by at most
``Σ_S Δf_k ≤ Δ_C f`` in ℓ1, privacy loss ``≤ ε``; a change of insensitive feature ``j``
moves it by ``Σ_{cols(j)} Δf_k`` with loss ``≤ ε Σ_{cols(j)} Δf_k / Δ_C f ≤ ε / TV(j)``
since ``Δ_C f ≥ TV(j) Σ_{cols(j)} Δf_k`` (and ``≤ ε`` when ``Δ_C f = Δf``), which is
Def. 2.2 with ``d = TV(j)``. Accuracy: ``P(‖Y‖_∞ ≤ b ln(K/β)) = (1 − β/K)^K ≥ 1 − β``
for ``b = Δ_C f / ε`` (:func:`linf_bound`). The same holds for
:func:`minimal_correlated_sensitivity`; the standard mechanism is ``ε``-DP for any
change of one record's features.

The sampler (Mironov 2012)
--------------------------
The textbook Laplace sampler ``f + b·ln(U)`` in floating point leaves input-dependent
holes in the set of outputs; Mironov (2012) recovers ``f`` from them. fedfdp samples a
**discrete Laplace on a fine grid, exactly from uniform bits** (Canonne, Kamath &
Steinke 2020, Algorithms 1-2: integer arithmetic only, Bernoulli(exp(−x)) for
rational ``x``): the grid is ``γ = 2^-k`` with ``γ ≤ b·2^-30``; the statistic is
rounded to the grid, ``n_f = rint(f/γ)`` (exact: scaling by a power of two), an
integer ``Z`` with ``P(Z = z) ∝ exp(−|z|/t)``, ``t = ⌈b/γ⌉``, is added, and
``(n_f + Z)·γ`` is returned (a function of the integer ``n_f + Z``: post-processing).
Every output is a grid point whatever the input, and the privacy loss is exact:
rounding moves a changed coordinate by at most ``Δf_k + γ`` grid-wise, so the
sensitivity is computed with ``Δf_k + γ`` for every coordinate that can change, and
the scale actually used is ``tγ ≥ Δ(Δf + γ)/ε`` — an exact ``(ε, 0)`` guarantee, not an
approximation. The snapping mechanism (Mironov's fix) was not chosen: it clamps the
output and pays a multiplicative ε overhead that depends on the clamp and the
floating-point precision; the discrete sampler has neither. Noise comes from a
:class:`~fedfdp.entropy.BitStream` (by default the OS CSPRNG), never a global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedfdp.corrdp.roles import RELATION, FeatureRoles
from fedfdp.entropy import BitStream

#: The grid is at least this many powers of two finer than the Laplace scale.
GRID_BITS = 30
#: Relation key of the standard Laplace mechanism (plain DP, one record's features
#: replaced, group key fixed).
RELATION_DP = "dp"

# ----------------------------------------------------------------------------- exact sampling


def _uniform_below(stream: BitStream, m: np.ndarray) -> np.ndarray:
    """Exactly uniform integers in ``[0, m_i)`` (rejection from 64-bit words)."""
    m = np.asarray(m, dtype=np.int64)
    if m.size and (m.min() < 1 or m.max() > 2**53):
        raise ValueError("uniform range must be in [1, 2^53]")
    bits = np.frexp(m.astype(np.float64))[1].astype(np.uint64)  # bit length of m
    shift = np.uint64(64) - bits
    out = np.empty(m.shape, dtype=np.int64)
    todo = np.arange(m.size)
    while todo.size:
        w = (stream.words(todo.size) >> shift[todo]).astype(np.int64)
        ok = w < m[todo]
        out[todo[ok]] = w[ok]
        todo = todo[~ok]
    return out


def _bernoulli_exp_neg(stream: BitStream, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Exact Bernoulli(exp(−num/den)) for ``0 ≤ num ≤ den`` (CKS 2020, Algorithm 1:
    ``K = 1``; while Bernoulli(γ/K): ``K += 1``; return ``K`` odd).
    """
    num = np.asarray(num, dtype=np.int64)
    den = np.asarray(den, dtype=np.int64)
    k = np.ones(num.shape, dtype=np.int64)
    active = np.arange(num.size)
    while active.size:
        hit = _uniform_below(stream, den[active] * k[active]) < num[active]
        k[active[hit]] += 1
        active = active[hit]
    return (k % 2) == 1


def discrete_laplace(stream: BitStream, t: int, n: int) -> np.ndarray:
    """``n`` independent integers with ``P(Z = z) ∝ exp(−|z|/t)``, exactly, from ``stream``
    (CKS 2020, Algorithm 2 with ``s = 1``).

    Parameters
    ----------
    t : int
        Scale in grid units, ``1 ≤ t ≤ 2^40``.

    Examples
    --------
    >>> from fedfdp.entropy import SeededEntropy
    >>> z = discrete_laplace(SeededEntropy(0).noise(0, 0), 3, 5)
    >>> z.dtype, z.shape
    (dtype('int64'), (5,))
    """
    if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 1 <= t <= 2**40:
        raise ValueError(f"discrete Laplace scale t={t!r}: must be an integer in [1, 2^40]")
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    t = int(t)
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        size = todo.size
        u = _uniform_below(stream, np.full(size, t))
        keep = _bernoulli_exp_neg(stream, u, np.full(size, t))
        u, idx = u[keep], todo[keep]
        v = np.zeros(idx.size, dtype=np.int64)
        going = np.arange(idx.size)
        while going.size:  # V ~ Geometric: count Bernoulli(exp(-1)) successes
            more = _bernoulli_exp_neg(stream, np.ones(going.size), np.ones(going.size))
            v[going[more]] += 1
            going = going[more]
        y = u + t * v
        sign = (stream.words(idx.size) >> np.uint64(63)).astype(np.int64)
        good = ~((sign == 1) & (y == 0))
        out[idx[good]] = ((1 - 2 * sign) * y)[good]
        done = np.zeros(size, dtype=bool)
        done[np.flatnonzero(keep)[good]] = True
        todo = todo[~done]
    return out


# ----------------------------------------------------------------------------- sensitivities


def _as_table(coordinate_sensitivity: np.ndarray, roles: FeatureRoles | None = None) -> np.ndarray:
    d = np.asarray(coordinate_sensitivity, dtype=np.float64)
    if d.ndim == 1:
        d = d[None, :]
    if d.ndim != 2 or not np.isfinite(d).all() or (d < 0).any():
        raise ValueError("coordinate sensitivities: need a finite, non-negative (G, m) or (m,) array")
    if roles is not None and d.shape[1] != roles.num_inputs:
        raise ValueError(f"coordinate sensitivities have {d.shape[1]} columns, roles {roles.num_inputs}")
    return d


def _combine(rows: np.ndarray, disjoint_groups: bool) -> float:
    return float(rows.max() if disjoint_groups else rows.sum())


def _class_sums(d: np.ndarray, roles: FeatureRoles) -> tuple[np.ndarray, list[np.ndarray]]:
    sens = d[:, list(roles.sensitive)].sum(axis=1)
    feats = [d[:, list(f.columns)].sum(axis=1) for f in roles.insensitive]
    return sens, feats


def standard_sensitivity(coordinate_sensitivity: np.ndarray, disjoint_groups: bool = True) -> float:
    """``Δf`` when any of one record's features may change (plain DP, group fixed).

    Examples
    --------
    >>> standard_sensitivity(np.array([[1.0, 2.0], [0.5, 0.5]]))  # one record moves one row
    3.0
    """
    return _combine(_as_table(coordinate_sensitivity).sum(axis=1), disjoint_groups)


def relation_sensitivity(
    coordinate_sensitivity: np.ndarray, roles: FeatureRoles, disjoint_groups: bool = True
) -> float:
    """``Δf`` of Def. 2.7 under the CorrDP relation:
    ``max(Σ_{k∈S} Δf_k, max_j Σ_{k∈cols(j)} Δf_k)``.

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> feats = (InsensitiveFeature("a", (1,), 0.5), InsensitiveFeature("b", (2,), 0.1))
    >>> roles = FeatureRoles(3, (0,), feats)
    >>> relation_sensitivity(np.array([1.0, 5.0, 5.0]), roles)
    5.0
    """
    d = _as_table(coordinate_sensitivity, roles)
    sens, feats = _class_sums(d, roles)
    if disjoint_groups:
        return float(np.max([sens.max(), *[f.max() for f in feats]]))
    return float(max([sens.sum(), *[f.sum() for f in feats]]))


def correlated_sensitivity(
    coordinate_sensitivity: np.ndarray, roles: FeatureRoles, disjoint_groups: bool = True
) -> float:
    """``Δ_C f = min{Σ_{k∈S} Δf_k + Σ_{j∈U} TV(j) Σ_{k∈cols(j)} Δf_k, Δf}`` (Def. 2.7),
    ``Δf`` from :func:`relation_sensitivity`; rows combined by max (disjoint groups)
    or sum.

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> feats = (InsensitiveFeature("a", (1,), 0.5), InsensitiveFeature("b", (2,), 0.1))
    >>> roles = FeatureRoles(3, (0,), feats)
    >>> correlated_sensitivity(np.array([1.0, 5.0, 5.0]), roles)  # min(1 + 2.5 + 0.5, 5)
    4.0
    """
    d = _as_table(coordinate_sensitivity, roles)
    sens, feats = _class_sums(d, roles)
    weighted = sens + sum(
        (f.tv * s for f, s in zip(roles.insensitive, feats, strict=True)), np.zeros_like(sens)
    )
    return min(_combine(weighted, disjoint_groups), relation_sensitivity(d, roles, disjoint_groups))


def minimal_correlated_sensitivity(
    coordinate_sensitivity: np.ndarray, roles: FeatureRoles, disjoint_groups: bool = True
) -> float:
    """``max(Σ_{k∈S} Δf_k, max_j TV(j) Σ_{k∈cols(j)} Δf_k)``: the smallest Laplace scale
    (× ε) for which the proof of Theorem 2.9 goes through; ``≤`` :func:`correlated_sensitivity`.

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> feats = (InsensitiveFeature("a", (1,), 0.5), InsensitiveFeature("b", (2,), 0.1))
    >>> roles = FeatureRoles(3, (0,), feats)
    >>> minimal_correlated_sensitivity(np.array([1.0, 5.0, 5.0]), roles)  # max(1, 2.5, 0.5)
    2.5
    """
    d = _as_table(coordinate_sensitivity, roles)
    sens, feats = _class_sums(d, roles)
    parts = [_combine(sens, disjoint_groups)]
    parts += [f.tv * _combine(s, disjoint_groups) for f, s in zip(roles.insensitive, feats, strict=True)]
    return float(max(parts))


def group_feature_means(
    x: np.ndarray, groups: np.ndarray, num_groups: int, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group means of features clamped to declared bounds, and their sensitivities.

    Parameters
    ----------
    x : array (n, m)
    groups : int array (n,)
        Public group of every record (device, class) in ``[0, num_groups)``.
    low, high : arrays (m,)
        Declared bounds per column (public, never from the data).

    Returns
    -------
    means : array (num_groups, m)
        Mean of ``clip(x, low, high)`` per group; the midpoint for an empty group.
    coordinate_sensitivity : array (num_groups, m)
        ``(high_k − low_k) / n_g`` (0 for an empty group: no record can move it).

    Examples
    --------
    >>> means, sens = group_feature_means(np.array([[0.5], [1.5], [-1.0]]), np.array([0, 0, 1]), 2,
    ...                                   low=np.array([-1.0]), high=np.array([1.0]))
    >>> means.ravel().tolist(), sens.ravel().tolist()
    ([0.75, -1.0], [1.0, 2.0])
    """
    x = np.asarray(x, dtype=np.float64)
    g = np.asarray(groups, dtype=np.int64)
    lo = np.asarray(low, dtype=np.float64)
    hi = np.asarray(high, dtype=np.float64)
    if x.ndim != 2 or g.shape != (x.shape[0],) or lo.shape != (x.shape[1],) or hi.shape != lo.shape:
        raise ValueError("group_feature_means: x (n, m), groups (n,), low and high (m,)")
    if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (hi > lo).all()):
        raise ValueError("group_feature_means: bounds must be finite with high > low")
    if g.size and (g.min() < 0 or g.max() >= num_groups):
        raise ValueError(f"group_feature_means: groups outside [0, {num_groups})")
    xc = np.clip(x, lo, hi)
    counts = np.bincount(g, minlength=num_groups).astype(np.float64)
    sums = np.zeros((num_groups, x.shape[1]))
    np.add.at(sums, g, xc)
    safe = np.maximum(counts, 1.0)[:, None]
    means = np.where(counts[:, None] > 0, sums / safe, (lo + hi) / 2.0)
    sens = np.where(counts[:, None] > 0, (hi - lo) / safe, 0.0)
    return means, sens


# ----------------------------------------------------------------------------- mechanisms


@dataclass(frozen=True)
class LaplaceRelease:
    """A released statistic.

    Attributes
    ----------
    values : array
        ``f(D)`` on the grid plus discrete Laplace noise, shaped like the input.
    scale : float
        ``b = tγ``, the Laplace scale actually used.
    grid : float
        ``γ``.
    sensitivity : float
        The sensitivity the scale was calibrated to (rounding slack included).
    epsilon : float
    relation : str
        ``"corrdp"`` (``ε`` for sensitive changes, ``ε/TV(j)`` for feature ``j``) or
        ``"dp"``.

    Examples
    --------
    >>> from fedfdp.entropy import SeededEntropy
    >>> rel = standard_laplace(np.zeros(3), np.ones(3), 1.0, SeededEntropy(0).noise(0, 0))
    >>> steps = rel.values / rel.grid  # every output is a grid point
    >>> rel.relation, round(rel.scale, 6), bool(np.all(steps == np.round(steps)))
    ('dp', 3.0, True)
    """

    values: np.ndarray
    scale: float
    grid: float
    sensitivity: float
    epsilon: float
    relation: str

    def linf_bound(self, beta: float) -> float:
        """Theorem 2.9: ``‖noise‖_∞ ≤`` this with probability ``≥ 1 − beta``."""
        return linf_bound(self.scale, self.values.size, beta)


def linf_bound(scale: float, size: int, beta: float) -> float:
    """``b · ln(K/β)`` (Theorem 2.9): the noise's ℓ∞ norm exceeds it with probability
    ``1 − (1 − β/K)^K ≤ β``.

    Examples
    --------
    >>> round(linf_bound(scale=1.0, size=10, beta=0.1), 4)  # ln(100)
    4.6052
    """
    if not 0.0 < beta <= 1.0 or size < 1:
        raise ValueError(f"beta={beta}, size={size}: need beta in (0, 1] and size >= 1")
    return scale * math.log(size / beta)


def _release(
    values: np.ndarray,
    coordinate_sensitivity: np.ndarray,
    sensitivity: Callable[[np.ndarray], float],
    epsilon: float,
    stream: BitStream,
    relation: str,
) -> LaplaceRelease:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon={epsilon}: must be finite and > 0")
    f = np.asarray(values, dtype=np.float64)
    d = np.asarray(coordinate_sensitivity, dtype=np.float64)
    if d.shape != f.shape:
        raise ValueError(f"values {f.shape} and coordinate sensitivities {d.shape} differ in shape")
    if not np.isfinite(f).all():
        raise ValueError("values: must be finite")
    base = sensitivity(d)
    if base == 0.0:
        return LaplaceRelease(f.copy(), 0.0, 0.0, 0.0, epsilon, relation)
    k = math.ceil(GRID_BITS - math.log2(base / epsilon))
    grid = 2.0**-k
    sens = sensitivity(d + grid * (d > 0))
    t = math.ceil(sens / epsilon / grid)
    if t > 2**40:
        raise ValueError(f"Laplace scale {t} grid steps exceeds the sampler's range")
    steps = np.rint(f * 2.0**k)
    if np.abs(steps).max(initial=0.0) >= 2.0**52:
        raise ValueError(f"values up to {np.abs(f).max():.3g}: too large for a grid of {grid:.3g}")
    noisy = steps.astype(np.int64) + discrete_laplace(stream, t, f.size).reshape(f.shape)
    return LaplaceRelease(noisy.astype(np.float64) * grid, t * grid, grid, sens, epsilon, relation)


def corrdp_laplace(
    values: np.ndarray,
    coordinate_sensitivity: np.ndarray,
    roles: FeatureRoles,
    epsilon: float,
    stream: BitStream,
    disjoint_groups: bool = True,
    minimal: bool = False,
) -> LaplaceRelease:
    """The CorrDP Laplace mechanism (Def. 2.8): ``f(D) + Lap(Δ_C f / ε)`` per coordinate.

    Relation: CorrDP (Def. 2.1/2.2 with ``d = TV(j)``): ``(ε, 0)`` for a change of the
    sensitive features, ``(ε/TV(j), 0)`` for a change of insensitive feature ``j``
    (Theorem 2.9). Sensitivity: :func:`correlated_sensitivity` (``minimal=True``:
    :func:`minimal_correlated_sensitivity`), rounding slack included.

    Parameters
    ----------
    values, coordinate_sensitivity : arrays (G, m) or (m,)
        The statistic and its ``Δf_{g,k}`` (:func:`group_feature_means`).
    roles : FeatureRoles
        Which columns are sensitive; the TVs.
    stream : BitStream
        Secret bits (``OSBits()``; ``SeededEntropy(seed).noise(...)`` only for tests).

    Examples
    --------
    >>> from fedfdp.corrdp.roles import InsensitiveFeature
    >>> from fedfdp.entropy import SeededEntropy
    >>> roles = FeatureRoles(2, (0,), (InsensitiveFeature("u", (1,), 0.5),))
    >>> rel = corrdp_laplace(np.zeros(2), np.array([1.0, 1.0]), roles, 1.0, SeededEntropy(0).noise(0, 0))
    >>> str(rel.relation), round(rel.scale, 6)  # Δ_C f = min(1 + 0.5·1, max(1, 1)) = 1
    ('corrdp', 1.0)
    """
    _as_table(coordinate_sensitivity, roles)
    fn = minimal_correlated_sensitivity if minimal else correlated_sensitivity

    def sensitivity(d: np.ndarray) -> float:
        return fn(d, roles, disjoint_groups)

    return _release(values, coordinate_sensitivity, sensitivity, epsilon, stream, RELATION)


def standard_laplace(
    values: np.ndarray,
    coordinate_sensitivity: np.ndarray,
    epsilon: float,
    stream: BitStream,
    disjoint_groups: bool = True,
) -> LaplaceRelease:
    """The standard Laplace mechanism: ``f(D) + Lap(Δf / ε)``, ``Δf`` from
    :func:`standard_sensitivity` (rounding slack included).

    Relation: DP for a change of any of one record's features (group key and label
    fixed): ``(ε, 0)``.

    Examples
    --------
    >>> from fedfdp.entropy import SeededEntropy
    >>> rel = standard_laplace(np.zeros(2), np.array([1.0, 1.0]), 0.5, SeededEntropy(0).noise(0, 0))
    >>> rel.relation, round(rel.scale, 6)
    ('dp', 4.0)
    """

    def sensitivity(d: np.ndarray) -> float:
        return standard_sensitivity(d, disjoint_groups)

    return _release(values, coordinate_sensitivity, sensitivity, epsilon, stream, RELATION_DP)
