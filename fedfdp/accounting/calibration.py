"""Noise calibration: the smallest noise multiplier that meets a target epsilon.

Mechanism
---------
``rounds`` identical rounds of the Poisson-subsampled Gaussian mechanism (clip norm
``C`` = add/remove sensitivity, noise ``N(0, sigma^2 C^2 I)``, rate ``q``), each
dominated by Theorem 5's pair (or, with participation ``p < 1``, by the mixture of
:class:`~fedfdp.accounting.PrivacyEvent`) and composed by Theorem 3.

Neighbouring relation
---------------------
Either ``Relation.ADD_REMOVE`` (Definition 6) or ``Relation.REPLACEMENT``
(Definition 5, via Proposition 1), as accounted by
:func:`fedfdp.accounting.epsilon_for`.  The search is
over the certified **upper** epsilon, so the returned ``sigma`` never overshoots
the target.
"""

from __future__ import annotations

from fedfdp import validate
from fedfdp.accounting.accountant import FDPAccountant, check_relation
from fedfdp.accounting.events import Relation, SubsampledGaussian
from fedfdp.accounting.protocol import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER, calibrate

__all__ = ["MIN_NOISE_MULTIPLIER", "calibrate_noise_multiplier"]


class _RelationAccountant(FDPAccountant):
    """An FDP accountant whose ``epsilon(delta)`` reports ``relation`` (its
    :attr:`relation`, what :func:`~fedfdp.accounting.protocol.calibrate` compares).
    """

    def __init__(self, relation: Relation, eps_error: float) -> None:
        super().__init__(eps_error=eps_error)
        self.relation = relation

    def epsilon(self, delta: float, relation: Relation | str | None = None) -> float:
        return super().epsilon(delta, relation or self.relation)


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    sampling_rate: float,
    rounds: int,
    delta: float,
    participation: float = 1.0,
    relation: Relation | str = Relation.ADD_REMOVE,
    eps_error: float = 0.05,
    rtol: float = 1e-3,
    max_noise_multiplier: float = MAX_NOISE_MULTIPLIER,
) -> float:
    """Smallest noise multiplier (to ``rtol``) whose *upper* epsilon is ``<= target``
    over ``rounds`` :class:`~fedfdp.accounting.events.SubsampledGaussian` rounds.

    :func:`fedfdp.accounting.protocol.calibrate` (the one calibrator) with the FDP
    accountant: the returned ``sigma`` always satisfies
    ``epsilon_for(sigma, q, rounds, delta, relation, eps_error, participation=p).upper
    <= target_epsilon`` (it never overshoots), and ``sigma / (1 + rtol)`` does not (up
    to the bisection's bracketing). The search stays in
    ``[MIN_NOISE_MULTIPLIER, max_noise_multiplier]``.

    Raises
    ------
    ValueError
        On invalid input, or when no ``sigma <= max_noise_multiplier`` reaches the
        target (for ``q < 1`` the upper bound never drops below about
        ``0.9 eps_error``).

    Examples
    --------
    >>> from fedfdp import calibrate_noise_multiplier
    >>> round(calibrate_noise_multiplier(target_epsilon=2.0, sampling_rate=0.05, rounds=150, delta=1e-5), 3)
    1.54
    """
    q = validate.rate("sampling_rate", sampling_rate)
    p = validate.rate("participation", participation)
    delta = validate.open_unit("delta", delta)
    checked = check_relation(relation)
    eps_error = validate.rate("eps_error", eps_error)
    max_sigma = validate.positive("max_noise_multiplier", max_noise_multiplier)
    return calibrate(
        lambda: _RelationAccountant(checked, eps_error),
        lambda sigma: SubsampledGaussian(sigma, q, p),
        target_epsilon=target_epsilon, rounds=rounds, delta=delta, rtol=rtol, max_noise_multiplier=max_sigma,
    )
