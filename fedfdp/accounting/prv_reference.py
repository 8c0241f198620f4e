"""Cross-check: the add/remove epsilon computed by prv-accountant 0.2.0 itself.

Mechanism
---------
The same ledger of Poisson-subsampled Gaussian rounds (Theorem 5's pair per round,
composed by Theorem 3) as :class:`fedfdp.accounting.FDPAccountant`.

Neighbouring relation
---------------------
Add/remove (Definition 6), both orderings: remove is prv-accountant's
``PoissonSubsampledGaussianMechanism``; add (``log(P/Q)`` under ``P``), which
prv-accountant lacks, is a ``PrivacyRandomVariable`` defined here.  This is the slow
reference path (seconds where the fast accountant takes milliseconds).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

from fedfdp import validate
from fedfdp.accounting.accountant import EpsilonBound, as_events
from fedfdp.accounting.composition import ledger_groups
from fedfdp.accounting.events import Relation
from fedfdp.accounting.prv import loss_inv

__all__ = ["epsilon_prv_accountant"]


def prv_add_ordering(q: float, sigma: float) -> Any:
    """prv-accountant ``PrivacyRandomVariable`` of the add ordering, ``log(P/Q)`` under ``P``.

    ``CDF(t) = Pr_P[-log(Q/P)(w) <= t] = Phi(-w(-t) / sigma)`` with ``w`` the inverse of
    the loss (``-inf`` beyond the support end ``-log(1-q)``).
    """
    from prv_accountant.privacy_random_variables import (
        PoissonSubsampledGaussianMechanism,
        PrivacyRandomVariable,
    )

    q = validate.rate("sampling_rate", q)
    sigma = validate.positive("noise_multiplier", sigma)

    class _AddOrdering(PrivacyRandomVariable):
        def __init__(self) -> None:
            self._remove = PoissonSubsampledGaussianMechanism(q, sigma)

        def cdf(self, t: Any) -> Any:
            w = loss_inv(-np.asarray(t, dtype=float), sigma, q)
            return special.ndtr(-w / sigma)

        def rdp(self, alpha: float) -> float:  # an upper bound (Mironov et al.)
            return float(self._remove.rdp(alpha))

    return _AddOrdering()


def _prv_participation(prv: Any, p: float) -> Any:
    """prv-accountant ``PrivacyRandomVariable`` of a round that touches the record with
    probability ``p``: the loss of ``prv`` with probability ``p``, exactly 0 otherwise.

    ``CDF(t) = p CDF_prv(t) + (1 - p) 1{t >= 0}``; its Renyi divergence of order ``a``
    is ``log(p e^{(a-1) D_a} + 1 - p) / (a - 1)`` (the mixture's moment generating
    function), from ``prv``'s own ``rdp``.
    """
    from prv_accountant.privacy_random_variables import PrivacyRandomVariable

    p = validate.rate("participation", p)

    class _Participation(PrivacyRandomVariable):
        def cdf(self, t: Any) -> Any:
            t = np.asarray(t, dtype=float)
            return p * prv.cdf(t) + (1.0 - p) * (t >= 0.0)

        def rdp(self, alpha: float) -> float:
            d = float(prv.rdp(alpha))
            return float(np.logaddexp(np.log(p) + (alpha - 1.0) * d, np.log1p(-p)) / (alpha - 1.0))

    return _Participation()


def epsilon_prv_accountant(
    ledger_or_accountant: Any, delta: float, eps_error: float = 0.1
) -> EpsilonBound:
    """Add/remove epsilon computed by prv-accountant 0.2.0 itself (slow reference path).

    The remove ordering is prv-accountant's ``PoissonSubsampledGaussianMechanism``
    (``GaussianMechanism`` for ``q = 1``); the add ordering is a
    ``PrivacyRandomVariable`` defined here (CDF of ``log(P/Q)`` under ``P``; its Renyi
    moments, used only to size the domain, are the remove ones, an upper bound by
    Mironov et al.).  Events with participation ``p < 1`` wrap either in the mixture
    with an atom at 0 (:func:`_prv_participation`).  Each ordering is composed by ``PRVAccountant`` with
    ``delta_error = delta / 1000`` and the larger ``(lower, estimate, upper)`` is
    returned.  Inputs are validated here (prv-accountant accepts ``q = 1.5`` or
    ``sigma = -1`` silently).  Meant for cross-checks: it takes seconds where
    :meth:`FDPAccountant.epsilon_bound` takes milliseconds.
    """
    import warnings

    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import (
        GaussianMechanism,
        PoissonSubsampledGaussianMechanism,
    )

    delta = validate.open_unit("delta", delta)
    eps_error = validate.rate("eps_error", eps_error)
    groups = ledger_groups(as_events(ledger_or_accountant))
    if not groups:
        return EpsilonBound(0.0, 0.0, 0.0, delta, Relation.ADD_REMOVE)
    counts = [g.rounds for g in groups]
    out = np.zeros(3)
    for ordering in ("remove", "add"):
        prvs = []
        for g in groups:
            s, q = g.sigma, g.q
            if q == 1.0:
                prv = GaussianMechanism(s)
            elif ordering == "remove":
                prv = PoissonSubsampledGaussianMechanism(q, s)
            else:
                prv = prv_add_ordering(q, s)
            if g.p < 1.0:
                prv = _prv_participation(prv, g.p)
            prvs.append(prv)
        if len(prvs) != len(counts):  # prv-accountant raises an empty ValueError
            raise ValueError("internal error: one PRV per ledger group expected")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            acc = PRVAccountant(
                prvs=prvs,
                max_self_compositions=counts,
                eps_error=eps_error,
                delta_error=delta / 1000.0,
            )
            res = acc.compute_epsilon(delta, counts)
        out = np.maximum(out, np.asarray(res, dtype=float))
    lo, est, up = (max(0.0, float(x)) for x in out)
    return EpsilonBound(lo, est, up, delta, Relation.ADD_REMOVE)
