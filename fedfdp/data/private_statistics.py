"""Statistics of private columns: declared by the user, or released with accounted noise.

The encoding of a private column is part of what a run releases (the model's
input layout and scale). Scaling a column by its own min/max discloses its
extreme values; nothing of that kind may leave a run outside the ledger
(docs/threat_model.md). So a private column's encoding is

* **declared** (``private-ranges``, ``private-categories``; a private label's
  ``label-classes``): a public fact about the schema, no ε; or
* **estimated** (``private-statistics = "estimate"``): a numeric column's range
  or a text column's categories released by the mechanisms below and charged to
  the run's ledger before training, one event per column (:func:`estimation_events`);
* otherwise the run is **refused** (:func:`refuse_undeclared`), naming the columns
  and both ways out.

The range estimate (one numeric column)
---------------------------------------
1. A histogram of the column's training values over a fixed, public grid of
   :data:`NUM_BUCKETS` buckets whose edges are signed powers of two
   (:func:`range_grid`: ``±2^k`` for ``k`` in ``[GRID_MIN_EXPONENT,
   GRID_MAX_EXPONENT + 1]``, one bucket ``[−2^kmin, 2^kmin)`` around zero; values
   beyond the outer edges are counted in the outer buckets; a missing value in
   none).
2. Gaussian noise ``N(0, σ_e²)`` on every bucket, drawn from the OS CSPRNG
   (:class:`fedfdp.entropy.OSBits`), never from the configuration's seed.
3. The released range: from the lower edge of the lowest bucket to the upper edge
   of the highest bucket whose **noisy** count exceeds ``τ = σ_e Φ⁻¹(1 − β/B)``
   (:func:`range_from_histogram`; ``β =`` :data:`FALSE_BUCKET_PROBABILITY`). It is
   a function of the noisy histogram only (post-processing: no further cost).

Sensitivity and relation. One record is in at most one bucket. Under the FDP
paper's add/remove relation (Definition 6: one record added, only its Ψ known)
the histogram changes by 1 in one bucket: L2 sensitivity 1, so step 2 is the
Gaussian mechanism of noise multiplier ``σ_e`` (its dominating pair ``N(0, σ_e²)``
vs ``N(1, σ_e²)``; Theorem 5 with ``q = 1``), charged as the Gaussian part of the
one estimate event (below; its ``δ_t`` is then slack). Under replacement (Definition 5:
one record's private value replaced) two buckets change by 1: sensitivity √2,
covered by Proposition 1 from the add/remove statement, as for every other
event. Several columns are several events; the accountant composes them with
the training rounds (Theorem 3), so the printed ε includes them.

What the threshold buys (not privacy, which step 2 already gives): with
probability at least ``1 − β`` no empty bucket clears ``τ`` (the range stays
inside the buckets that hold data), and a bucket holding at least
``τ + σ_e Φ⁻¹(1 − β)`` records clears it with probability at least ``1 − β``.
Values outside the released range are clipped to its ends, as with a declared
range.

The budget. ``σ_e`` is the smallest noise multiplier whose estimates alone (one
``ThresholdedHistogram(σ_e, δ_t)`` per estimated column, numeric or text: the
charges depend on the configuration and ``N`` only, not on the columns' types)
have ε at most :func:`estimation_budget` at the run's δ ``δ_e`` (``delta``, or
``1/(2N)``; :func:`estimation_noise_multiplier`, the accountant's own calibrator; ``N``
the training records, public). A run's ``target-epsilon`` is then met by calibrating
training on the accountant's composition of the estimates and the rounds
(:func:`fedfdp.mechanism.resolve_mechanism`), not by subtracting ε's.

The default budget (``estimation-epsilon`` unset, ``"auto"``) is
``min(MAX_ESTIMATION_SHARE, ESTIMATION_SHARE_PER_COLUMN · √k) · ε_ref`` for ``k``
estimated columns and the run's reference ε (its target,
:func:`fedfdp.config.estimation.estimation_reference`). Why that shape: ``k`` Gaussian
histograms of noise ``σ_e`` compose to one Gaussian of ``σ_e/√k`` (exactly: one joint
histogram of L2 sensitivity ``√k`` is the same mechanism, so a shared pass would save
nothing), so a budget growing like ``√k`` gives every column the noise a lone column
gets, and the cap bounds what the estimates take from training: at a share ``s`` of
the target, training keeps about ``√(1 − s²)`` of its Gaussian budget (μ-GDP
composition), i.e. a training σ about ``1/√(1 − s²)`` times the all-declared one
(≤ 1.021 at ``s = 0.2``; with the accountant's PRV composition and the default 150
rounds at ``q = 0.05``: +3.3 % at target 1 on 12,422 records, at most +5 % over targets
0.5–8, 1–16 columns and 2,000–30,000 records, ``tests/test_estimates_budget.py``).
The price is noisier estimates than a fixed 0.5 gave at small targets: at ε_ref = 1
and 4 columns ``σ_e ≈ 29`` counts (0.5 gave 13), so a bucket or category needs about
``τ + 2.33 σ_e ≈ 180–210`` records to be released reliably; ``estimation-epsilon`` buys
cleaner estimates with training σ.

The categories estimate (one text column)
-----------------------------------------
:func:`released_categories`: the count of every value the column's training rows
hold, plus ``N(0, σ_e²)`` each (OS CSPRNG), and the values whose noisy count
exceeds ``τ = 1 + σ_e Φ⁻¹(1 − δ_t)`` are released (sorted). A value held by one
record only is released with probability exactly ``δ_t`` (:func:`category_threshold_delta`:
``δ_e / (10 k)`` for ``k`` text columns, so all of them take a tenth of ``δ_e``).
Sensitivity: add/remove changes one count by 1 (L2 1), replacement two (L2 √2).
Except with probability ``δ_t`` this is the Gaussian mechanism on the counts; the
event is :class:`~fedfdp.accounting.events.ThresholdedHistogram` (its docstring has
the dominating pair and the δ argument): the accountant composes its Gaussian part
and reports ε at ``δ − Σ −ln(1 − δ_t)``, so ``estimation-epsilon`` holds at
``δ_e`` with the thresholds' δ included (:func:`estimation_noise_multiplier`).

The released categories travel as ``estimated-categories`` (the ranges as
``estimated-ranges``), written into the run's configuration once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np
import pandas as pd

from fedfdp.accounting import FDPAccountant
from fedfdp.accounting.events import SubsampledGaussian, ThresholdedHistogram
from fedfdp.accounting.protocol import calibrate, default_delta
from fedfdp.config import DataConfig, PrivateStatistics
from fedfdp.config.protection import undeclared_columns
from fedfdp.data.encoding import check_numeric_cells, is_numeric, label_text, refuse_undeclared
from fedfdp.data.split import DataError
from fedfdp.entropy import OSBits
from fedfdp.mechanisms import standard_normals

__all__ = [
    "ESTIMATION_SHARE_PER_COLUMN",
    "FALSE_BUCKET_PROBABILITY",
    "GRID_MAX_EXPONENT",
    "GRID_MIN_EXPONENT",
    "MAX_ESTIMATION_SHARE",
    "NUM_BUCKETS",
    "UNSCALED_ESTIMATION_EPSILON",
    "Estimate",
    "category_counts",
    "category_threshold_delta",
    "estimate_private_ranges",
    "estimated_columns",
    "estimation_budget",
    "estimation_delta",
    "estimation_events",
    "estimation_noise_multiplier",
    "histogram",
    "noisy_histogram",
    "range_from_histogram",
    "range_grid",
    "refuse_undeclared",
    "released_categories",
    "released_range",
    "secret_normals",
    "threshold",
]

#: The grid's smallest magnitude is ``2**GRID_MIN_EXPONENT`` (the zero bucket's half-width).
GRID_MIN_EXPONENT = -20
#: Its largest finite inner edge is ``2**GRID_MAX_EXPONENT``; the outer edges are ``±2**(max + 1)``.
GRID_MAX_EXPONENT = 40
#: ``normals(n)`` → ``n`` independent standard normal draws: the noise source of an estimate.
Normals = Callable[[int], np.ndarray]


def secret_normals(n: int) -> np.ndarray:
    """``n`` standard normals from the OS CSPRNG (the project's hardened sampler,
    :func:`fedfdp.mechanisms.standard_normals`): the default, and only production, source.
    """
    return standard_normals(OSBits(), n)


#: β: the chance that some empty bucket clears the threshold (and that a well-filled one does not).
FALSE_BUCKET_PROBABILITY = 0.01


def range_grid() -> np.ndarray:
    """The public bucket edges, increasing: ``−2^(max+1), …, −2^min, 2^min, …, 2^(max+1)``.

    Examples
    --------
    >>> edges = range_grid()
    >>> len(edges) - 1 == NUM_BUCKETS, bool(edges[0] == -edges[-1]), float(edges[-1]) == 2.0 ** 41
    (True, True, True)
    """
    powers = 2.0 ** np.arange(GRID_MIN_EXPONENT, GRID_MAX_EXPONENT + 2, dtype=np.float64)
    return np.concatenate([-powers[::-1], powers])


#: Buckets of the grid (``2 (max − min + 2) − 1``).
NUM_BUCKETS = 2 * (GRID_MAX_EXPONENT - GRID_MIN_EXPONENT + 2) - 1


def histogram(values: np.ndarray) -> np.ndarray:
    """Counts of ``values`` (NaN: missing, in no bucket) per bucket of :func:`range_grid`;
    values beyond the outer edges count in the outer buckets.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    edges = range_grid()
    index = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, NUM_BUCKETS - 1)
    return np.bincount(index, minlength=NUM_BUCKETS).astype(np.float64)


def threshold(noise_multiplier: float) -> float:
    """``τ = σ_e Φ⁻¹(1 − β/B)``: an empty bucket's noisy count exceeds it with probability
    ``β/B``, so some empty bucket does with probability at most ``β`` (union bound).
    """
    return float(noise_multiplier) * NormalDist().inv_cdf(1.0 - FALSE_BUCKET_PROBABILITY / NUM_BUCKETS)


def range_from_histogram(noisy: np.ndarray, noise_multiplier: float) -> tuple[float, float] | None:
    """The released range of a noisy histogram (module docstring, step 3); ``None``
    when no bucket clears the threshold. Post-processing of ``noisy`` only.
    """
    noisy = np.asarray(noisy, dtype=np.float64)
    if noisy.shape != (NUM_BUCKETS,):
        raise ValueError(f"noisy histogram of shape {noisy.shape}: expected ({NUM_BUCKETS},)")
    above = np.flatnonzero(noisy > threshold(noise_multiplier))
    if len(above) == 0:
        return None
    edges = range_grid()
    return float(edges[above[0]]), float(edges[above[-1] + 1])


def noisy_histogram(
    values: np.ndarray, noise_multiplier: float, normals: Normals | None = None
) -> np.ndarray:
    """Steps 1–2 of the module docstring: the histogram plus ``σ_e`` times
    ``normals(NUM_BUCKETS)`` (default :func:`secret_normals`; a test may inject its own).
    """
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"noise_multiplier={noise_multiplier!r}: must be finite and > 0")
    draws = np.asarray((normals or secret_normals)(NUM_BUCKETS), dtype=np.float64)
    if draws.shape != (NUM_BUCKETS,):
        raise ValueError(f"noise source gave shape {draws.shape}, expected ({NUM_BUCKETS},)")
    return histogram(values) + sigma * draws


def released_range(
    values: np.ndarray, noise_multiplier: float, normals: Normals | None = None
) -> tuple[float, float] | None:
    """Steps 1–3 of the module docstring for one column: the released range is
    :func:`range_from_histogram` of :func:`noisy_histogram`, nothing else.
    """
    return range_from_histogram(noisy_histogram(values, noise_multiplier, normals), noise_multiplier)


def category_counts(values: Sequence[object] | np.ndarray | pd.Series) -> dict[str, int]:
    """The number of records of every value ``values`` hold, as text (a missing value
    counts nowhere): the histogram a categories estimate adds noise to.
    """
    counts: dict[str, int] = {}
    for v in values:
        if v is None or (not isinstance(v, str) and pd.isna(v)):
            continue
        key = str(v)
        counts[key] = counts.get(key, 0) + 1
    return counts


def released_categories(
    values: Sequence[object] | np.ndarray | pd.Series,
    event: ThresholdedHistogram,
    normals: Normals | None = None,
) -> tuple[str, ...]:
    """The categories estimate of one text column (module docstring): every value whose
    count plus ``σ_e`` times a standard normal (``normals``, default
    :func:`secret_normals`, the OS CSPRNG) exceeds ``event.threshold()``, sorted.

    Only values present in the data get a noisy count (a value absent from the data is
    never released); a value held by one record is released with probability
    ``event.threshold_delta``, which the accountant charges (:class:`ThresholdedHistogram`).
    """
    if not isinstance(event, ThresholdedHistogram):
        raise ValueError(f"event={event!r}: expected a ThresholdedHistogram")
    counts = category_counts(values)
    keys = sorted(counts)
    if not keys:
        return ()
    draws = np.asarray((normals or secret_normals)(len(keys)), dtype=np.float64)
    if draws.shape != (len(keys),):
        raise ValueError(f"noise source gave shape {draws.shape}, expected ({len(keys)},)")
    noisy = np.array([counts[k] for k in keys], dtype=np.float64) + event.noise_multiplier * draws
    tau = event.threshold()
    return tuple(k for k, c in zip(keys, noisy, strict=True) if c > tau)


def estimated_columns(cfg: DataConfig) -> tuple[str, ...]:
    """The columns charged an estimate: under ``private-statistics = "estimate"``, every
    protected column without a declared encoding
    (:func:`fedfdp.config.protection.undeclared_columns`: the private columns; under ``dp``
    the public columns and the label too, under ``corrdp`` the public ones), estimated now
    or read back from ``estimated-ranges`` / ``estimated-categories``; none otherwise.
    """
    if cfg.private_statistics is not PrivateStatistics.ESTIMATE:
        return ()
    return undeclared_columns(cfg)


def estimation_delta(num_records: int, delta: float | None = None) -> float:
    """``δ_e``: the run's δ, at which ``estimation-epsilon`` is stated and the thresholds'
    δ is taken from: ``delta`` when the run sets one, else ``1/(2N)`` (the run's default δ,
    :func:`fedfdp.accounting.protocol.default_delta`).
    """
    return default_delta(num_records) if delta is None else float(delta)


#: The share of ``δ_e`` that all the thresholds of released categories take together.
CATEGORY_DELTA_SHARE = 0.1
#: The default budget: this share of the run's reference ε per √(estimated column) ...
ESTIMATION_SHARE_PER_COLUMN = 0.1
#: ... up to this share (module docstring: what the estimates may take from training).
MAX_ESTIMATION_SHARE = 0.2
#: The budget of a release that has no run reference to scale with when
#: ``estimation-epsilon`` is unset: CorrDP's ``tv-estimate`` (:mod:`fedfdp.corrdp.run`).
UNSCALED_ESTIMATION_EPSILON = 0.5


def estimation_budget(cfg: DataConfig) -> float:
    """ε (at the run's δ) of all the estimates of ``cfg`` together: ``estimation-epsilon``
    when set, else ``min(MAX_ESTIMATION_SHARE, ESTIMATION_SHARE_PER_COLUMN · √k) · ε_ref``
    for the ``k`` :func:`estimated_columns` and the run's reference ε
    (:attr:`DataConfig.estimation_reference <fedfdp.config.DataConfig>`; module docstring).

    Raises
    ------
    DataError
        An automatic budget without a reference (a data section built outside a
        configuration): the noise and the charge must come from the same numbers.

    Examples
    --------
    >>> from fedfdp.config import load_config
    >>> keys = {"dataset": "csv", "data-path": "t.csv", "public-columns": "x", "label-column": "y",
    ...         "private-columns": "a,b,c,d", "private-statistics": "estimate", "target-epsilon": 1.0}
    >>> round(estimation_budget(load_config(keys).data), 6), estimation_budget(
    ...     load_config({**keys, "private-columns": "a"}).data)
    (0.2, 0.1)
    """
    if cfg.estimation_epsilon is not None:
        return float(cfg.estimation_epsilon)
    reference = cfg.estimation_reference
    if reference is None:
        raise DataError("estimation-epsilon='auto': no run budget to take a share of (a data section "
                        "built outside a configuration); build it with load_config, or set "
                        "estimation-epsilon")
    k = max(1, len(estimated_columns(cfg)))
    return min(MAX_ESTIMATION_SHARE, ESTIMATION_SHARE_PER_COLUMN * math.sqrt(k)) * reference.epsilon


def category_threshold_delta(num_records: int, text_columns: int, delta: float | None = None) -> float:
    """``δ_t = δ_e · CATEGORY_DELTA_SHARE / k`` for ``k = text_columns`` estimated text
    columns (``δ_e``: :func:`estimation_delta` of the run's ``delta``): the probability
    that a category held by one record only is released.
    """
    if isinstance(text_columns, bool) or not isinstance(text_columns, int) or text_columns < 1:
        raise ValueError(f"text_columns={text_columns!r}: must be an integer >= 1")
    return estimation_delta(num_records, delta) * CATEGORY_DELTA_SHARE / text_columns


def estimation_noise_multiplier(epsilon: float | None, count: int, num_records: int, text_columns: int = 0,
                                *, delta: float | None = None) -> float:
    """``σ_e``: the smallest noise multiplier whose ``count`` histograms (sensitivity 1
    each; ``text_columns`` of them thresholded, :class:`ThresholdedHistogram` with
    :func:`category_threshold_delta`) have upper ε at most ``epsilon`` (``None``:
    :data:`UNSCALED_ESTIMATION_EPSILON`) at ``δ_e`` (:func:`estimation_delta` of the run's
    ``delta``). The accountant's calibrator (:func:`fedfdp.accounting.protocol.calibrate`)
    on the Gaussian parts at ``δ_e − k·(−ln(1 − δ_t))``: exactly the δ at which the FDP
    accountant reports the ε of those events at ``δ_e``.
    """
    if isinstance(text_columns, bool) or not isinstance(text_columns, int) or not 0 <= text_columns <= count:
        raise ValueError(f"text_columns={text_columns!r}: must be an integer in [0, {count}]")
    epsilon = UNSCALED_ESTIMATION_EPSILON if epsilon is None else epsilon
    delta_e = estimation_delta(num_records, delta)
    if text_columns:
        delta_t = category_threshold_delta(num_records, text_columns, delta)
        delta_e -= text_columns * ThresholdedHistogram(1.0, delta_t).delta_cost
    try:
        return calibrate(FDPAccountant, lambda s: SubsampledGaussian(s, 1.0), target_epsilon=epsilon,
                         rounds=count, delta=delta_e)
    except ValueError as exc:
        raise DataError(f"estimation-epsilon={epsilon:.6g}: {exc}") from None


@dataclass(frozen=True)
class Estimate:
    """One charged estimate: what it released and its event (a Gaussian histogram, or
    a thresholded one for a text column's categories).
    """

    statistic: str
    event: SubsampledGaussian | ThresholdedHistogram


def estimation_events(cfg: DataConfig, num_records: int) -> tuple[Estimate, ...]:
    """The charges of the estimates of ``cfg`` over ``N = num_records`` training records:
    one ``ThresholdedHistogram(σ_e, δ_t)`` per :func:`estimated_columns`, ``δ_t =``
    :func:`category_threshold_delta` over all of them. A text column's categories are
    that mechanism; a numeric column's range is its Gaussian part alone (the charge is
    then an upper bound by ``δ_t``). One event for both kinds keeps the charges a
    function of the configuration and ``N`` only, whatever the columns' types: every
    engine derives the same before or after the data is read.
    """
    columns = estimated_columns(cfg)
    if not columns:
        return ()
    k = len(columns)
    delta = cfg.estimation_reference.delta if cfg.estimation_reference is not None else None
    sigma = estimation_noise_multiplier(estimation_budget(cfg), k, num_records, k, delta=delta)
    event = ThresholdedHistogram(sigma, category_threshold_delta(num_records, k, delta))
    return tuple(Estimate(f"encoding of {c!r}", event) for c in columns)


def estimate_private_ranges(
    cfg: DataConfig,
    frame: pd.DataFrame,
    train: np.ndarray,
    normals: Normals | None = None,
) -> DataConfig:
    """``cfg`` with every protected column (:func:`estimated_columns`) it neither declares
    nor has an estimate of released now: a numeric column's range (``estimated-ranges``,
    :func:`released_range`), a text column's or a protected label's categories
    (``estimated-categories``, :func:`released_categories`; a label's values as text,
    :func:`fedfdp.data.encoding.label_text`); refused (:func:`refuse_undeclared`) under
    ``private-statistics = "declared"``.

    Parameters
    ----------
    frame : DataFrame
        The table; the estimate reads the private columns of its ``train`` rows.
    train : np.ndarray of bool
        The training rows (``N`` is their number).
    normals : callable, optional
        The noise's source, ``normals(n)`` standard normals (default:
        :func:`secret_normals`, the OS CSPRNG).
    """
    done = {n for n, _, _ in cfg.estimated_ranges} | {n for n, _ in cfg.estimated_categories}
    todo = [c for c in undeclared_columns(cfg) if c not in done]
    if not todo:
        return cfg
    if cfg.private_statistics is not PrivateStatistics.ESTIMATE:
        raise refuse_undeclared(todo, cfg)
    for col in todo:
        if col != cfg.label_column:
            check_numeric_cells(frame[col], col, protected=True)
    num_records = int(np.count_nonzero(train))
    event = estimation_events(cfg, num_records)[0].event
    if not isinstance(event, ThresholdedHistogram):  # every estimate is charged one (estimation_events)
        raise TypeError(f"estimation event {event!r}: expected a ThresholdedHistogram")
    sigma = event.noise_multiplier
    ranges, categories = list(cfg.estimated_ranges), list(cfg.estimated_categories)
    for col in todo:
        label = col == cfg.label_column
        if label or not is_numeric(frame[col]):
            cells = frame[col][train]
            found_categories = released_categories([label_text(v) for v in cells] if label else cells,
                                                   event, normals)
            if not found_categories:
                where = "label-classes" if label else "private-categories"
                raise DataError(
                    f"private-statistics='estimate': column {col!r}: no category's noisy count clears the "
                    f"threshold {event.threshold():.3g} (noise multiplier {sigma:.3g}: too few records for "
                    f"estimation-epsilon={estimation_budget(cfg):.3g}); declare them in {where}"
                )
            categories.append((col, found_categories))
            continue
        values = pd.to_numeric(frame[col], errors="coerce").astype("float64").to_numpy()[train]
        found = released_range(values, sigma, normals)
        if found is None:
            raise DataError(
                f"private-statistics='estimate': column {col!r}: no bucket of its noisy histogram clears "
                f"the threshold {threshold(sigma):.3g} (noise multiplier {sigma:.3g}: too few records for "
                f"estimation-epsilon={estimation_budget(cfg):.3g}); declare its range in "
                f"{'public' if col in cfg.public_columns else 'private'}-ranges"
            )
        ranges.append((col, *found))
    return replace(cfg, estimated_ranges=tuple(ranges), estimated_categories=tuple(categories))
