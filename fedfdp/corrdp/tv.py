"""TV(j): how much an insensitive feature reveals about the sensitive ones.

``TV(j) = max_{a, a'} TV(P_{X^S | x_j = a}, P_{X^S | x_j = a'})`` (Def. 2.7 of the CorrDP
paper), the largest total-variation distance between the conditional laws of the
sensitive features given two values of feature ``j``. Two sources:

* **declared** — domain knowledge (the paper's preferred case), validated in
  ``[0, 1]`` by :func:`fedfdp.corrdp.roles.check_tv`;
* **estimated in-sample** — :func:`estimate_tv` (one column) and
  :func:`estimate_tvs` (all insensitive columns) with the inflation of Def. 3.10.

Discretisation (:class:`Bins`)
------------------------------
Numeric columns are cut at declared edges (public knowledge, **never** computed from
the data); categorical columns use their declared categories. The sensitive columns
are discretised likewise and combined into one joint categorical (:func:`joint_codes`).
What is estimated is then the TV of the *discretised* sensitive variable given the
*binned* feature. By the data-processing inequality both discretisations can only
lower TV, so the estimate targets Def. 2.7's TV(j) only under

**Assumption D** (declared with the bins): the protected quantity is the discretised
sensitive variable ``φ(X^S)``, and ``P(φ(X^S) | X_j)`` depends on ``X_j`` only through
its bin.

The estimator
-------------
Let ``N_a`` be the number of records with ``x_j`` in value (bin) ``a`` and ``N_{a,s}``
those of them in sensitive cell ``s``; ``n`` records, ``v`` values, ``s_cells`` cells.
With a declared lower bound ``π_min`` on every value's probability
(``P(X_j = a) ≥ π_min``; bins too rare must be merged) and ``ν = π_min / 2``::

    f_a(s) = N_{a,s} / max(N_a, ν n)                (a sub-probability vector)
    T̂V(j) = max_{a < a'} ½ ‖f_a − f_a'‖₁

When every ``N_a ≥ ν n`` (with high probability, below) ``f_a`` is the plain
conditional frequency.

**Sensitivity (Assumption 3.9), c3 = 2/ν = 4/π_min.** Replacing one record (``n``
fixed; this covers every CorrDP neighbour) changes every ``T̂V(j)`` by at most
``c3 / n``. *Proof.* Write ``τ = ν n`` and ``h(c) = c / max(‖c‖₁, τ)`` for a count
vector ``c``. Removing one record from cell ``t`` (``c' = c − e_t``, ``W = ‖c‖₁``):
(i) if ``W − 1 ≥ τ``, ``‖c/W − c'/(W−1)‖₁ = 2(W − c_t)/(W(W−1)) ≤ 2/W ≤ 2/τ`` (as
``c_t ≥ 1``); (ii) if ``W ≤ τ``, the change is ``‖e_t‖₁/τ = 1/τ``; (iii) if
``W − 1 < τ < W``, ``‖c/W − (c − e_t)/τ‖₁ ≤ W(1/τ − 1/W) + 1/τ = (W − τ + 1)/τ ≤
2/τ``. Adding a record is the reverse move. A replacement removes a record from one
value and adds one to a value: if the values differ, two vectors ``f_a``, ``f_a'``
move by ``≤ 2/τ`` each and the others not at all; if the value is the same, ``f_a``
moves by ``2/max(W, τ) ≤ 2/τ``. Each pairwise ``½‖f_b − f_b'‖₁`` therefore moves by
at most ``½(2/τ + 2/τ) = 2/τ``, and so does their maximum. ∎ (Changes of another
column leave column ``j``'s table unchanged.) Checked exhaustively on small tables in
``tests/test_corrdp.py``.

**Estimation error (Assumption 3.8), γ = 1/2,
c2 = √(2 (s_cells ln 2 + ln(2v) + 1) / ν).** Assume the records are i.i.d. from
``P*`` and ``P(X_j = a) ≥ π_min = 2ν`` for every declared value. (1) Hoeffding:
``P(N_a < ν n) ≤ exp(−2 n ν²)``; over ``v`` values ``≤ v exp(−2nν²) ≤ β/2`` once
``n ≥ ln(2v/β) / (2ν²)``. (2) Given the column-``j`` values, the sensitive cells of
the ``N_a`` records with value ``a`` are i.i.d. ``p_a = P(φ(X^S) | X_j = a)``; by the
L1 deviation inequality of Weissman et al. (2003),
``P(‖p̂_a − p_a‖₁ ≥ t) ≤ (2^{s_cells} − 2) exp(−N_a t² / 2)``, so with
``N_a ≥ νn`` and ``t = e(β) = √(2 (s_cells ln 2 + ln(2v/β)) / (ν n))`` each value fails
with probability ``≤ β / (2v)``. (3) ``|T̂V − TV| ≤ max_{a,a'} ½(‖p̂_a − p_a‖₁ +
‖p̂_a' − p_a'‖₁) ≤ max_a ‖p̂_a − p_a‖₁`` (a max of 1-Lipschitz functions). Hence with
probability ``≥ 1 − β``, ``|T̂V(j) − TV(j)| ≤ e(β)`` (:func:`estimation_error_bound`).
For ``β ≤ 1/e`` (``ln(1/β) ≥ 1``), ``s ln 2 + ln(2v) + ln(1/β) ≤ (s ln 2 + ln(2v) +
1) ln(1/β)``, which is Assumption 3.8's form ``c2 √(ln(1/β)) / n^γ``.

**Inflation (Def. 3.10).** ``TṼ(j) = min(1, T̂V(j) + 2 c2 √(ln(m_u/δ)) / √n)``: with
``β = δ/m_u`` per column all ``m_u`` bounds hold together with probability ``≥ 1 − δ``.
The factor 2 lets the estimate of every neighbour ``D'`` cover the true TV too:
``TṼ_{D'} ≥ TV + c2√(ln(m_u/δ)/n) − c3/n ≥ TV`` when ``c3/n ≤ c2 √(ln(m_u/δ)/n)``.
The conditions (``δ/m_u ≤ 1/e``, the Hoeffding condition above at ``β = δ/m_u``, and
``c3/n ≤ c2 √(ln(m_u/δ)/n)``) are checked; when one fails, ``TṼ(j) = 1`` (the
DP noise level for that column) and :attr:`TVEstimate.note` says why. Theorem 3.11
then claims ``(ε, 2δ)``-CorrDP. Caveat (``docs/corrdp.md`` §3): the noise level
depends on the data through ``TṼ``; the paper's theorem covers this variance
difference under Assumption 3.9, fedfdp's explicit accounting
(:mod:`fedfdp.corrdp.accounting`) treats the noise design as fixed. Declared TVs, or
TVs estimated on a separate public sample, avoid the issue.

How large is the inflation? ``c2 ≥ √(2/ν)``, so it exceeds 1 unless ``n`` is large:
with 4 sensitive cells, 5 values, ``π_min = 0.1``, ``m_u = 10``, ``δ = 10⁻⁵``
(``c2 = 15.6``) it is ``≈ 116/√n`` (1.0 at ``n ≈ 13,400``; 0.25 at ``n ≈ 215,000``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# ----------------------------------------------------------------------------- bins


@dataclass(frozen=True)
class Bins:
    """A public discretisation of one column.

    Parameters
    ----------
    edges : tuple of float, optional
        Numeric column: strictly increasing interior cut points; value ``x`` falls in
        bin ``searchsorted(edges, x, side="right")`` (``len(edges) + 1`` bins).
    categories : tuple, optional
        Categorical column: the declared categories (bin = position). Exactly one of
        ``edges`` and ``categories`` is given.

    Examples
    --------
    >>> Bins(edges=(0.0, 10.0)).codes([-1.0, 5.0, 12.0]).tolist()
    [0, 1, 2]
    >>> Bins(categories=("walk", "run")).codes(["run"]).tolist()
    [1]
    """

    edges: tuple[float, ...] | None = None
    categories: tuple[object, ...] | None = None

    def __post_init__(self) -> None:
        if (self.edges is None) == (self.categories is None):
            raise ValueError("Bins: give exactly one of edges and categories")
        if self.edges is not None:
            edges = tuple(float(e) for e in self.edges)
            if not all(math.isfinite(e) for e in edges) or any(b <= a for a, b in itertools.pairwise(edges)):
                raise ValueError(f"bin edges {edges}: must be finite and strictly increasing")
            object.__setattr__(self, "edges", edges)
        else:
            cats = tuple(self.categories or ())
            if len(cats) < 1 or len(set(cats)) != len(cats):
                raise ValueError(f"categories {cats}: need at least one, without repeats")
            object.__setattr__(self, "categories", cats)

    @property
    def size(self) -> int:
        """Number of values (bins or categories)."""
        return len(self.edges) + 1 if self.edges is not None else len(self.categories or ())

    def codes(self, values: Sequence[object] | np.ndarray, name: str = "column") -> np.ndarray:
        """The bin of every value (``int64``). Unknown categories and NaN are refused."""
        if self.edges is not None:
            x = np.asarray(values, dtype=np.float64)
            if np.isnan(x).any():
                raise ValueError(f"{name}: NaN values cannot be binned")
            return np.searchsorted(np.asarray(self.edges), x, side="right").astype(np.int64)
        lookup = {c: i for i, c in enumerate(self.categories or ())}
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            key = v.item() if isinstance(v, np.generic) else v
            if key not in lookup:
                raise ValueError(f"{name}: value {v!r} is not a declared category")
            out[i] = lookup[key]
        return out


def joint_codes(codes: Sequence[np.ndarray], sizes: Sequence[int]) -> tuple[np.ndarray, int]:
    """Mixed-radix joint code of several categorical columns.

    Returns ``(joint, cells)`` with ``joint[i] = Σ_k codes[k][i] · Π_{l>k} sizes[l]`` in
    ``[0, cells)``, ``cells = Π sizes``.
    """
    if len(codes) != len(sizes) or not codes:
        raise ValueError("joint_codes: need one size per code column, at least one column")
    joint = np.zeros(len(codes[0]), dtype=np.int64)
    cells = 1
    for c, size in zip(codes, sizes, strict=True):
        c = np.asarray(c, dtype=np.int64)
        if c.shape != joint.shape or (c.size and (c.min() < 0 or c.max() >= size)):
            raise ValueError(f"joint_codes: codes outside [0, {size}) or of another length")
        joint = joint * size + c
        cells *= int(size)
    return joint, cells


# ----------------------------------------------------------------------------- population TV


def tv_of_joint(joint: np.ndarray) -> float:
    """``TV(j)`` of a discrete joint law ``joint[a, s] = P(X_j = a, φ(X^S) = s)``:
    the largest TV between the conditional rows of values with positive probability.

    Examples
    --------
    Example 2.5 of the paper (``X1 | X2 = k ~ Bernoulli(k/3)``, ``k ∈ {1, 2}``):

    >>> round(tv_of_joint(np.array([[2, 1], [1, 2]]) / 6), 6)
    0.333333
    """
    p = np.asarray(joint, dtype=np.float64)
    if p.ndim != 2 or (p < 0).any() or not math.isclose(float(p.sum()), 1.0, rel_tol=1e-9):
        raise ValueError("tv_of_joint: need a 2-d array of probabilities summing to 1")
    rows = p[p.sum(axis=1) > 0]
    cond = rows / rows.sum(axis=1, keepdims=True)
    return _max_pairwise_tv(cond)


def _max_pairwise_tv(rows: np.ndarray) -> float:
    best = 0.0
    for a in range(len(rows) - 1):
        d = 0.5 * np.abs(rows[a + 1 :] - rows[a]).sum(axis=1)
        best = max(best, float(d.max()))
    return best


# ----------------------------------------------------------------------------- the estimator


def _check_table(num_values: int, num_cells: int, min_value_prob: float) -> float:
    if num_values < 2:
        raise ValueError(f"num_values={num_values}: a column needs at least 2 values")
    if num_cells < 1:
        raise ValueError(f"num_cells={num_cells}: must be >= 1")
    if not (math.isfinite(min_value_prob) and 0.0 < min_value_prob <= 1.0 / num_values):
        raise ValueError(
            f"min_value_prob={min_value_prob}: must be in (0, 1/{num_values}] "
            "(a lower bound on every value's probability)"
        )
    return min_value_prob / 2.0


def empirical_tv(
    column: np.ndarray, sensitive: np.ndarray, num_values: int, num_cells: int, min_value_prob: float
) -> float:
    """``T̂V(j)`` of the module docstring: ``max_{a<a'} ½‖f_a − f_a'‖₁`` with
    ``f_a = N_{a,·} / max(N_a, ν n)``, ``ν = min_value_prob / 2``.

    Parameters
    ----------
    column : int array (n,)
        Codes of feature ``j`` in ``[0, num_values)``.
    sensitive : int array (n,)
        Joint sensitive cell codes in ``[0, num_cells)``.

    Examples
    --------
    >>> empirical_tv(np.array([0, 0, 1, 1]), np.array([0, 0, 1, 1]), 2, 2, min_value_prob=0.5)
    1.0
    """
    nu = _check_table(num_values, num_cells, min_value_prob)
    col = np.asarray(column, dtype=np.int64)
    sens = np.asarray(sensitive, dtype=np.int64)
    n = col.size
    if sens.shape != col.shape or n == 0:
        raise ValueError("empirical_tv: column and sensitive codes must be non-empty and of equal length")
    if col.min() < 0 or col.max() >= num_values or sens.min() < 0 or sens.max() >= num_cells:
        raise ValueError("empirical_tv: codes outside their declared range")
    counts = np.bincount(col * num_cells + sens, minlength=num_values * num_cells).reshape(
        num_values, num_cells
    )
    denom = np.maximum(counts.sum(axis=1), nu * n).astype(np.float64)
    return _max_pairwise_tv(counts / denom[:, None])


@dataclass(frozen=True)
class TVConstants:
    """The constants of one column's estimator (module docstring).

    Attributes
    ----------
    c2 : float
        ``√(2 (s_cells ln 2 + ln(2v) + 1) / ν)`` (Assumption 3.8, ``β ≤ 1/e``).
    gamma : float
        ``1/2``.
    c3 : float
        ``2/ν = 4/π_min`` (Assumption 3.9).
    nu : float
        ``π_min / 2``.

    Examples
    --------
    >>> k = TVConstants.of(num_values=2, num_cells=4, min_value_prob=0.4)
    >>> round(k.c2, 3), k.gamma, k.c3
    (7.183, 0.5, 10.0)
    """

    c2: float
    gamma: float
    c3: float
    nu: float

    @classmethod
    def of(cls, num_values: int, num_cells: int, min_value_prob: float) -> TVConstants:
        nu = _check_table(num_values, num_cells, min_value_prob)
        c2 = math.sqrt(2.0 * (num_cells * math.log(2.0) + math.log(2.0 * num_values) + 1.0) / nu)
        return cls(c2=c2, gamma=0.5, c3=2.0 / nu, nu=nu)


def estimation_error_bound(
    n: int, num_values: int, num_cells: int, min_value_prob: float, beta: float
) -> float:
    """``e(β) = √(2 (s_cells ln 2 + ln(2v/β)) / (ν n))``: with probability ``≥ 1 − β``,
    ``|T̂V(j) − TV(j)| ≤ e(β)`` (module docstring), provided
    ``n ≥ ln(2v/β) / (2ν²)`` (:func:`min_records`); ``inf`` otherwise.
    """
    nu = _check_table(num_values, num_cells, min_value_prob)
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta={beta}: must be in (0, 1)")
    if n < min_records(num_values, min_value_prob, beta):
        return math.inf
    return math.sqrt(2.0 * (num_cells * math.log(2.0) + math.log(2.0 * num_values / beta)) / (nu * n))


def min_records(num_values: int, min_value_prob: float, beta: float) -> int:
    """Smallest ``n`` with ``v·exp(−2nν²) ≤ β/2`` (every value seen ``≥ νn`` times
    except with probability ``β/2``).
    """
    nu = min_value_prob / 2.0
    return math.ceil(math.log(2.0 * num_values / beta) / (2.0 * nu * nu))


@dataclass(frozen=True)
class TVEstimate:
    """An in-sample estimate of one column's TV and its inflation (Def. 3.10).

    Attributes
    ----------
    name : str
    tv_hat : float
        ``T̂V(j)``.
    tv_tilde : float
        ``TṼ(j) = min(1, T̂V(j) + inflation)``; 1 when a condition fails.
    inflation : float
        ``2 c2 √(ln(m_u/δ)) / n^γ``.
    constants : TVConstants
    n, num_values, num_cells, num_estimated : int
        ``num_estimated`` is ``m_u``, the number of columns estimated together.
    min_value_prob, delta : float
        ``δ`` is the failure probability of the inflation (Theorem 3.11: δ → 2δ).
    bound_valid : bool
        Whether the conditions of the inflation hold.
    note : str
        Why not, when they do not.

    Examples
    --------
    >>> est = inflate("speed", 0.2, 100_000, 2, 4, 0.4, delta=1e-5, num_estimated=3)
    >>> est.bound_valid, round(est.inflation, 4), round(est.tv_tilde, 4)
    (True, 0.1613, 0.3613)
    """

    name: str
    tv_hat: float
    tv_tilde: float
    inflation: float
    constants: TVConstants
    n: int
    num_values: int
    num_cells: int
    num_estimated: int
    min_value_prob: float
    delta: float
    bound_valid: bool
    note: str = ""


def inflate(
    name: str,
    tv_hat: float,
    n: int,
    num_values: int,
    num_cells: int,
    min_value_prob: float,
    delta: float,
    num_estimated: int,
) -> TVEstimate:
    """Def. 3.10's ``TṼ(j) = min(1, T̂V(j) + 2 c2 √(ln(m_u/δ)) / n^γ)`` with this
    estimator's constants, after checking the conditions of the module docstring.

    Examples
    --------
    >>> inflate("speed", 0.2, 100_000, 2, 4, 0.4, 1e-5, 3).tv_tilde > 0.2
    True
    >>> small = inflate("speed", 0.2, 50, 2, 4, 0.4, 1e-5, 3)
    >>> small.tv_tilde, small.note
    (1.0, 'n=50 < 175 records: some value may be seen fewer than nu*n times')
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta={delta}: must be in (0, 1)")
    if num_estimated < 1:
        raise ValueError(f"num_estimated={num_estimated}: must be >= 1")
    k = TVConstants.of(num_values, num_cells, min_value_prob)
    log_term = math.log(num_estimated / delta)
    inflation = 2.0 * k.c2 * math.sqrt(log_term) / n**k.gamma
    need = min_records(num_values, min_value_prob, delta / num_estimated)
    note = ""
    if log_term < 1.0:
        note = f"delta/m_u={delta / num_estimated:.3g} > 1/e: Assumption 3.8's form does not apply"
    elif n < need:
        note = f"n={n} < {need} records: some value may be seen fewer than nu*n times"
    elif k.c3 / n > k.c2 * math.sqrt(log_term / n):
        note = f"n={n}: c3/n exceeds half the inflation"
    tv_tilde = 1.0 if note else min(1.0, tv_hat + inflation)
    return TVEstimate(
        name, tv_hat, tv_tilde, inflation, k, n, num_values, num_cells, num_estimated,
        min_value_prob, delta, not note, note,
    )  # fmt: skip


def estimate_tv(
    name: str,
    column: np.ndarray,
    sensitive: np.ndarray,
    num_values: int,
    num_cells: int,
    min_value_prob: float,
    delta: float,
    num_estimated: int = 1,
) -> TVEstimate:
    """Estimate one column's TV from codes (:func:`empirical_tv`) and inflate it (:func:`inflate`).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> s = rng.integers(0, 2, 20_000)
    >>> x = np.where(rng.random(20_000) < 0.5, s, rng.integers(0, 2, 20_000))  # TV = 0.5
    >>> est = estimate_tv("x", x, s, 2, 2, min_value_prob=0.45, delta=1e-5)
    >>> abs(est.tv_hat - 0.5) < 0.03, est.tv_tilde >= 0.5
    (True, True)
    """
    tv_hat = empirical_tv(column, sensitive, num_values, num_cells, min_value_prob)
    return inflate(name, tv_hat, len(column), num_values, num_cells, min_value_prob, delta, num_estimated)


def estimate_tvs(
    sensitive: Mapping[str, np.ndarray],
    insensitive: Mapping[str, np.ndarray],
    bins: Mapping[str, Bins],
    min_value_prob: float | Mapping[str, float],
    delta: float,
) -> dict[str, TVEstimate]:
    """Estimate ``TṼ(j)`` for every insensitive column from raw columns.

    Parameters
    ----------
    sensitive, insensitive : mapping of name to array (n,)
        Raw values of the sensitive columns and of the insensitive columns to estimate.
    bins : mapping of name to Bins
        A declared discretisation for every column above (public knowledge).
    min_value_prob : float or mapping
        ``π_min`` per insensitive column (a declared lower bound on each bin's
        probability), or one value for all.
    delta : float
        Failure probability of all the inflations together (``m_u`` = number of
        insensitive columns given).

    Returns
    -------
    dict of name to TVEstimate

    Examples
    --------
    >>> from fedfdp.corrdp.synthetic import correlated_features
    >>> data = correlated_features(20_000, 1, 2, [0.0, 0.6], seed=0)
    >>> columns = {"u0": data.x[:, 1], "u1": data.x[:, 2]}
    >>> est = estimate_tvs({"s0": data.x[:, 0]}, columns, data.bins(), 0.45, 1e-5)
    >>> [round(e.tv_hat, 1) for e in est.values()]
    [0.0, 0.6]
    """
    if not sensitive or not insensitive:
        raise ValueError("estimate_tvs: need at least one sensitive and one insensitive column")
    missing = sorted((set(sensitive) | set(insensitive)) - set(bins))
    if missing:
        raise ValueError(f"estimate_tvs: no declared bins for columns {missing}")
    both = sorted(set(sensitive) & set(insensitive))
    if both:
        raise ValueError(f"column {both[0]!r} is declared both sensitive and insensitive")
    codes = [bins[c].codes(v, c) for c, v in sensitive.items()]
    joint, cells = joint_codes(codes, [bins[c].size for c in sensitive])
    out = {}
    for name, values in insensitive.items():
        pi = min_value_prob[name] if isinstance(min_value_prob, Mapping) else min_value_prob
        col = bins[name].codes(values, name)
        if col.shape != joint.shape:
            raise ValueError(f"column {name!r}: {col.size} values, sensitive columns have {joint.size}")
        out[name] = estimate_tv(name, col, joint, bins[name].size, cells, pi, delta, len(insensitive))
    return out
