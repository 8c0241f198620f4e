"""Noise calibration: the smallest noise multiplier that meets a target epsilon.

Mechanism
---------
``rounds`` identical rounds of the Poisson-subsampled Gaussian mechanism (clip norm
``C`` = add/remove sensitivity, noise ``N(0, sigma^2 C^2 I)``, rate ``q``), each
dominated by Theorem 5's pair (or, with participation ``p < 1``, by the mixture of
:class:`~fedfdp.accounting.PrivacyEvent`) and composed by Theorem 3.

Neighbouring relation
---------------------
Either ``"add-remove"`` (Definition 6) or ``"replacement"`` (Definition 5, via
Proposition 1), as accounted by :func:`fedfdp.accounting.epsilon_for`.  The search is
over the certified **upper** epsilon, so the returned ``sigma`` never overshoots
the target.
"""

from __future__ import annotations

import math

from fedfdp.accounting.accountant import (
    check_count,
    check_delta,
    check_eps_error,
    check_rate,
    check_real,
    check_relation,
    check_sigma,
    epsilon_for,
)

__all__ = ["MIN_NOISE_MULTIPLIER", "calibrate_noise_multiplier"]

#: The search never goes below this noise multiplier: a target that even this sigma
#: meets returns it (epsilon <= target still holds; smaller sigma is not explored).
MIN_NOISE_MULTIPLIER = 2.0**-10


def calibrate_noise_multiplier(
    target_epsilon: float,
    sampling_rate: float,
    rounds: int,
    delta: float,
    relation: str = "add-remove",
    eps_error: float = 0.05,
    rtol: float = 1e-3,
    max_noise_multiplier: float = 1e4,
    *,
    participation: float = 1.0,
) -> float:
    """Smallest noise multiplier (to ``rtol``) whose *upper* epsilon is ``<= target``.

    Bisection on ``log sigma`` over the certified upper bound of
    :func:`epsilon_for` (with ``participation``): the returned ``sigma`` always satisfies
    ``epsilon_for(sigma, q, rounds, delta, relation, eps_error, participation=p).upper
    <= target_epsilon`` (it never overshoots), and ``sigma / (1 + rtol)`` does not (up
    to the bisection's bracketing).  With the default ``rtol = 1e-3`` the epsilon
    reached is typically within 0.1% of the target.  The search stays in
    ``[MIN_NOISE_MULTIPLIER, max_noise_multiplier]``: an enormous target that
    ``MIN_NOISE_MULTIPLIER`` already meets returns it after one evaluation.  Each
    evaluation has bounded memory and time (:class:`FDPAccountant`), and there are at
    most about 40 of them.

    Raises
    ------
    ValueError
        On invalid input, or when no ``sigma <= max_noise_multiplier`` reaches the
        target (for ``q < 1`` the upper bound never drops below about
        ``0.9 eps_error``).

    Examples
    --------
    >>> from fedfdp import calibrate_noise_multiplier
    >>> round(calibrate_noise_multiplier(2.0, 0.05, 150, 1e-5), 3)   # target ε, q, rounds, δ
    1.54
    """
    target = check_real("target_epsilon", target_epsilon)
    if not (target > 0 and math.isfinite(target)):
        raise ValueError(f"target_epsilon={target_epsilon!r}: must be finite and > 0")
    q = check_rate(sampling_rate)
    n = check_count(rounds, "rounds")
    delta = check_delta(delta)
    relation = check_relation(relation)
    eps_error = check_eps_error(eps_error)
    rtol = check_real("rtol", rtol)
    if not 0.0 < rtol < 1.0:
        raise ValueError(f"rtol={rtol!r}: must be in (0, 1)")
    max_sigma = check_sigma(max_noise_multiplier, "max_noise_multiplier")
    p = check_rate(participation, "participation")

    def eps(sigma: float) -> float:
        return epsilon_for(sigma, q, n, delta, relation, eps_error, participation=p).upper

    hi = 1.0
    while eps(hi) > target:
        hi *= 2.0
        if hi > max_sigma:
            raise ValueError(
                f"target_epsilon={target!r}: unreachable with noise_multiplier <= "
                f"{max_sigma:g} (sampling_rate={q}, participation={p}, rounds={n}, "
                f"delta={delta}, eps_error={eps_error})"
            )
    if hi == 1.0 and eps(MIN_NOISE_MULTIPLIER) <= target:
        return MIN_NOISE_MULTIPLIER
    lo = hi / 2.0
    while lo > 1e-3 and eps(lo) <= target:
        hi, lo = lo, lo / 2.0
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
