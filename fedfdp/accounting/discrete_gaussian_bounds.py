"""The maths of a distributed discrete Gaussian round: sensitivity and the two lemmas.

Mechanism
---------
Each of ``n_h`` honest parties adds ``N_Z(0, σ_loc²)`` per coordinate to its clipped
private sum, scaled so that the clip norm ``C`` is ``s`` integer units and rounded
without bias (:mod:`fedfdp.accounting.distributed` has the whole round and its two
accounts; the event is :class:`fedfdp.accounting.events.DistributedDiscreteGaussian`).

Sensitivity (add/remove of one record, FDP paper Definition 6): coupling both worlds on
the same rounding draw, the honest sum moves by an integer vector of L2 norm at most
``Δ = s + √d`` (:func:`sensitivity`).

Lemma 1 (``docs/secagg_accounting.md``, by Poisson summation): the sum of ``n``
independent ``N_Z(0, σ²)`` is within ``D∞ <= τ_n(σ)`` of ``N_Z(0, nσ²)`` in both
directions (:func:`sum_divergence_bound`). Lemma 2: drawing ``G ~ N(0, V − t²)`` and
then ``N_Z(G, t²)`` is within ``D∞ <= ln((1+η(t²))/(1−η(t²)))`` of ``N_Z(0, V)``
(:func:`smoothing_divergence_bound`). Both use ``η`` (:func:`theta_excess`).
:func:`ddg_tau` is Kairouz, Liu & Steinke's ``τ`` (ICML 2021, Theorem 1), used by the
Rényi route.

Only numpy and :mod:`fedfdp.validate`: the event vocabulary imports this module.
"""

from __future__ import annotations

import math

import numpy as np

from fedfdp.validate import count, positive

__all__ = [
    "MAX_SLACK",
    "MIN_LOCAL_SIGMA",
    "SMOOTHING",
    "ddg_tau",
    "sensitivity",
    "smoothing_divergence_bound",
    "sum_divergence_bound",
    "theta_excess",
]

#: Smallest local noise std (integer units) accepted: see ``docs/secagg_accounting.md`` §5.
MIN_LOCAL_SIGMA = 4.0
#: Largest total slack ``Λ`` accepted (route A's ε moves by at most ``2Λ``).
MAX_SLACK = 1e-12
#: Default smoothing parameter ``t`` of Lemma 2 (integer units).
SMOOTHING = 2.0


def sensitivity(scale: float, dimension: int) -> float:
    """``Δ = s + √d``: the L2 sensitivity, in integer units, of the honest parties'
    rounded sum under add/remove of one record (clip ``C`` scaled to ``s``; unbiased
    rounding coupled on the same ``U`` adds at most 1 per coordinate).
    """
    return positive("scale", scale) + math.sqrt(count("dimension", dimension))


def theta_excess(variance: float) -> float:
    """``η(v) = 2 Σ_{m>=1} exp(-2π² v m²)``: by Poisson summation,
    ``Σ_{k∈Z} exp(-(k - c)²/(2v)) ∈ √(2πv) [1 - η(v), 1 + η(v)]`` for every real ``c``.
    """
    v = positive("variance", variance)
    m = np.arange(1, 2 + math.ceil(math.sqrt(40.0 / v)))
    return float(2.0 * np.exp(-2.0 * math.pi**2 * v * m * m).sum())


def _log_ratio_bound(eta: float) -> float:
    """``ln((1 + η) / (1 - η))``, accurate for tiny ``η``; ``inf`` when ``η >= 1``."""
    if eta >= 1.0:
        return math.inf
    return math.log1p(eta) - math.log1p(-eta)


def sum_divergence_bound(local_sigma: float, parties: int) -> float:
    """Lemma 1: ``D∞`` (both directions) between the sum of ``parties`` independent
    ``N_Z(0, σ²)`` and ``N_Z(0, parties·σ²)``, per coordinate:
    ``Σ_{k=1}^{n-1} ln((1 + η(σ²k/(k+1))) / (1 - η(σ²k/(k+1))))`` (``inf`` if some
    ``η >= 1``, i.e. ``σ`` below about 0.27). About ``4 Σ_k exp(-2π²σ²k/(k+1))``, less
    than the ``τ`` of Kairouz, Liu & Steinke (:func:`ddg_tau`).
    """
    sigma = positive("local_sigma", local_sigma)
    n = count("parties", parties)
    if n == 1:
        return 0.0
    k = np.arange(1, n, dtype=np.float64)
    v = sigma * sigma * k / (k + 1.0)
    m = np.arange(1, 2 + math.ceil(math.sqrt(40.0 / (sigma * sigma / 2.0))))
    eta = 2.0 * np.exp(-2.0 * math.pi**2 * v[:, None] * (m * m)[None, :]).sum(axis=1)
    if np.any(eta >= 1.0):
        return math.inf
    return float((np.log1p(eta) - np.log1p(-eta)).sum())


def smoothing_divergence_bound(smoothing: float) -> float:
    """Lemma 2: ``D∞`` (both directions) between ``N_Z(G, t²)`` with
    ``G ~ N(0, V - t²)`` and ``N_Z(0, V)``: ``ln((1 + η(t²)) / (1 - η(t²)))``, for every
    ``V > t²``. ``t = 2`` gives ``2.1e-34``.
    """
    t = positive("smoothing", smoothing)
    return _log_ratio_bound(theta_excess(t * t))


def ddg_tau(local_sigma: float, parties: int) -> float:
    """``τ = 10 Σ_{k=1}^{n-1} exp(-2π²σ²k/(k+1))``: the per-coordinate inflation of
    Kairouz, Liu & Steinke (ICML 2021, Theorem 1), used by route B.
    """
    sigma = positive("local_sigma", local_sigma)
    n = count("parties", parties)
    k = np.arange(1, n, dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * sigma * sigma * k / (k + 1.0)).sum())
