"""Adaptive clipping: ``C`` follows a quantile of the private gradients' norms.

Andrew, Thakkar, McMahan and Ramaswamy, *Differentially Private Learning with
Adaptive Clipping* (NeurIPS 2021), Algorithm 1, applied to the private part of
FDP. Each private round the nodes also report how many of the vectors they
clipped (per-record private gradients; per-device mean gradients for the
device unit) already had norm ``≤ C``. The server releases that count with
Gaussian noise ``N(0, σ_b²)`` drawn from its secret noise stream, right after
the gradient noise, and moves ``C`` geometrically toward the ``γ``-quantile::

    b̃ = (count + N(0, σ_b²)) / E[batch]
    C ← C · exp(−η (b̃ − γ))

Privacy: under add/remove of one private unit the count moves by at most 1 and
the clipped sum by at most ``C`` in L2. Released together, with noise ``σ_b``
on the count and ``σC`` on the sum, they form one Gaussian mechanism of
multiplier ``σ_eff`` with ``σ_eff⁻² = σ⁻² + σ_b⁻²`` (Andrew et al., Thm. 1;
the mechanism is the sum with its count appended as one more coordinate,
scaled by ``C·σ/σ_b``). The accountant is charged ``σ_eff``
(:func:`fedfdp.budget.plan_privacy` calibrates ``σ_eff`` to the target), and
the count takes a fixed share ``r`` of each round's ``1/σ_eff²``
(``clipping-budget-share``; :func:`split_noise`). Andrew et al. instead fix
``σ_b`` at a fraction of the expected batch; a share keeps the cost explicit
and valid at any ε and batch size (at a small ε a fixed ``σ_b`` can fall
below ``σ_eff`` and take the whole budget). The printed ε covers the adaptation; under replacement
the pair's sensitivity is ``(2C, 1)``, still within twice the add/remove
sensitivity the accountant assumes. ``C`` itself is post-processing of
released values and may be published (``metrics.csv``'s ``clipping_norm``).
"""

from __future__ import annotations

import math

from fedfdp.entropy import BitStream
from fedfdp.mechanisms import standard_normals


def split_noise(accounted: float, budget_share: float) -> tuple[float, float]:
    """``(σ, σ_b)`` for an accounted ``σ_eff`` of which the count takes the
    share ``r`` (of ``1/σ_eff²``): ``σ = σ_eff/√(1 − r)``, ``σ_b = σ_eff/√r``."""
    if not (accounted > 0 and 0 < budget_share < 1):
        raise ValueError(f"σ_eff={accounted}, share={budget_share}: need σ_eff > 0 and share in (0, 1)")
    return accounted / math.sqrt(1 - budget_share), accounted / math.sqrt(budget_share)


def adapt_clipping_norm(
    clipping_norm: float,
    unclipped: int,
    count_std: float,
    expected_batch: float,
    quantile: float,
    learning_rate: float,
    stream: BitStream,
) -> float:
    """One geometric step of ``C`` toward the ``quantile`` of the norms.

    Parameters
    ----------
    clipping_norm : float
        ``C`` of the round just run.
    unclipped : int
        The nodes' total count of vectors with norm ``≤ C`` (sensitivity 1).
    count_std : float
        ``σ_b``; the noise is one standard normal from ``stream`` (the round's
        secret noise stream, after the gradient noise).
    expected_batch : float
        The round's data-independent normaliser ``E[batch]``.
    quantile, learning_rate : float
        ``γ`` and ``η``.

    Returns
    -------
    float
        ``C · exp(−η (b̃ − γ))`` with ``b̃ = (count + noise) / E[batch]``.
    """
    noisy = unclipped + count_std * float(standard_normals(stream, 1)[0])
    share = noisy / expected_batch
    return float(clipping_norm * math.exp(-learning_rate * (share - quantile)))
