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
(:func:`fedfdp.mechanism.resolve_mechanism` calibrates ``σ_eff`` to the target), and
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
    share ``r`` (of ``1/σ_eff²``): ``σ = σ_eff/√(1 − r)``, ``σ_b = σ_eff/√r``.
    """
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
    return next_clipping_norm(clipping_norm, noisy, expected_batch, quantile, learning_rate)


def next_clipping_norm(
    clipping_norm: float, noisy_count: float, expected_batch: float, quantile: float, learning_rate: float
) -> float:
    """``C · exp(−η (b̃ − γ))`` with ``b̃ = noisy_count / E[batch]``: the geometric step
    of :func:`adapt_clipping_norm` from an already released noisy count (the server
    draws the count's noise through :attr:`fedfdp.round_engine.ServerParts.count_mechanism`).
    Post-processing of the noisy count: no privacy cost of its own.
    """
    share = noisy_count / expected_batch
    return float(clipping_norm * math.exp(-learning_rate * (share - quantile)))


def recipe_quantile(
    noise_multiplier: float, count_std: float, num_params: int, expected_batch: float
) -> float:
    """``γ`` of the ``fdp`` recipe (``clipping-quantile = "auto"``) from the run's
    noise level — public quantities only, fixed before training; 0 keeps the
    configured ``C`` fixed.

    The averaged private gradient of a round carries noise of norm about
    ``κ·C``, ``κ = σ·√d / E[batch]`` (``d`` trainable parameters), and a
    clipping bias of at most ``E[(‖g‖ − C)₊]``. For norms with an
    exponential tail of scale ``s`` the bias is ``s·e^{−C/s}``, and the sum of
    the squares is smallest at ``x = C/s`` solving ``e^{−2x} = κ²x``; that
    ``C`` is the ``1 − e^{−x}`` quantile of the norms. Low noise (large
    tables) gives a high quantile — little of the private part is clipped,
    so little bias toward the public model. Where the optimum lies below the
    median (noise-dominated runs), ``C`` stays fixed: clipping most records is
    what the configured ``C`` already does, and there letting ``C`` follow the
    norms feeds back (a larger ``C``, larger noisy steps, larger norms) —
    measured: purchase100's MLP diverged at ``γ = 0.5`` (docs/algorithm.md).
    ``γ`` is at most 0.99 and ``2σ_b/E[batch]`` below 1 (closer to 1 the noisy
    count cannot resolve it; if that leaves less than the median, ``C`` stays
    fixed too).

    Examples
    --------
    >>> round(recipe_quantile(1.48, 6.45, 26, 1126.0), 3)    # 22.5k records, ε = 2, q = 0.05
    0.986
    >>> round(recipe_quantile(3.94, 17.2, 295, 165.0), 3)    # 3.3k records, ε = 0.5
    0.605
    >>> recipe_quantile(1.0, 4.4, 210_400, 250.0)            # a 600-300-100 MLP on 4k records
    0.0
    """
    if not (noise_multiplier > 0 and num_params > 0 and expected_batch > 0 and count_std > 0):
        raise ValueError(
            f"recipe quantile: σ={noise_multiplier}, σ_b={count_std}, d={num_params}, "
            f"E[batch]={expected_batch}: all must be > 0"
        )
    kappa = noise_multiplier * math.sqrt(num_params) / expected_batch
    lo, hi = 0.0, 60.0  # e^{−2x} − κ²x is decreasing: bisection
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if math.exp(-2.0 * mid) > kappa * kappa * mid:
            lo = mid
        else:
            hi = mid
    gamma = 1.0 - math.exp(-0.5 * (lo + hi))
    ceiling = min(0.99, 1.0 - 2.0 * count_std / expected_batch)
    if gamma < 0.5 or ceiling < 0.5:
        return 0.0
    return float(min(gamma, ceiling))


#: ``γ`` of the diffusion models' recipe (``model = "ddpm"``, Algorithm 1 with α = 1).
#: Only the private part is clipped, so ``C`` sets how much the private correction
#: weighs against the unclipped public gradient; a DDPM's per-record private norms put
#: their mass in a heavy upper tail (measured at 14×14: median ≈ C at the project's
#: C = 0.1, the 90 % quantile 25–35 C), so a fixed small C or a median target shrinks the
#: correction ~20-fold and the model stays near the blurry public one. ``C`` follows the
#: 0.9-quantile instead, read off the norms at the public model, not chosen on the
#: evaluation metric (docs/images.md).
DIFFUSION_QUANTILE = 0.9


def capped_quantile(quantile: float, count_std: float, expected_batch: float) -> float:
    """``min(γ, 1 − 2σ_b/E[batch])``: closer to 1 than ``2σ_b/E[batch]`` the noisy count
    cannot resolve the quantile (the same cap as :func:`recipe_quantile`'s, without its 0.99).

    Examples
    --------
    >>> capped_quantile(0.9, 3.63, 256.0)
    0.9
    >>> round(capped_quantile(0.9, 13.95, 256.0), 4)
    0.891
    """
    if not (0 < quantile < 1 and count_std > 0 and expected_batch > 0):
        raise ValueError(f"capped quantile: γ={quantile}, σ_b={count_std}, E[batch]={expected_batch}: "
                         "need γ in (0, 1) and σ_b, E[batch] > 0")
    return float(min(quantile, 1.0 - 2.0 * count_std / expected_batch))


def diffusion_quantile(count_std: float, expected_batch: float) -> float:
    """``γ`` of the ``fdp`` recipe for a diffusion model: :data:`DIFFUSION_QUANTILE`
    capped by :func:`capped_quantile`; 0 (``C`` fixed) where the cap leaves less than
    the median, as in :func:`recipe_quantile`.
    """
    gamma = capped_quantile(DIFFUSION_QUANTILE, count_std, expected_batch)
    return gamma if gamma >= 0.5 else 0.0
