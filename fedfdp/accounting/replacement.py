"""Replacement epsilon from the add/remove accountant (Proposition 1).

Mechanism
---------
A ledger of Poisson-subsampled Gaussian rounds (clip norm ``C`` = add/remove
sensitivity, noise ``N(0, sigma^2 C^2 I)``), accounted for add/remove by Theorem 5
and Theorem 3 (:mod:`fedfdp.accounting.composition`).

Neighbouring relation
---------------------
``"replacement"`` (Definition 5): one record replaced by another with the same
``Psi``.  It follows from add/remove by **Proposition 1**
(``f-DP_i => (f o f)-DP_r``), used in its (eps, delta) form:
``(eps, delta)-DP_i => (2 eps, delta (1 + e^eps))-DP_r`` (the paper's proof chains the
two simulator inequalities through ``sim``).  For a target ``delta_r`` we search
``delta_i`` and keep the best *certified* pair: ``eps_i`` is the **upper** end of the
add/remove interval at ``delta_i``, the pair is kept only if
``delta_i (1 + e^{eps_i}) <= delta_r``, and ``2 eps_i`` is reported.  Each kept pair is
a true ``(eps_i, delta_i)``-DP_i statement, so its image under Proposition 1 is a true
replacement guarantee at ``delta_i (1 + e^{eps_i}) <= delta_r``, hence at ``delta_r``;
the best of several true upper bounds is a true upper bound.  The search runs over
log grids of ``delta_i`` from the fixed point of the Renyi-DP bound (feasible by
construction, since the upper end is capped by Renyi DP) up to ``delta_r / 2``.  When
that fixed point needs ``delta_i < 1e-300`` (``eps_i`` near 700, or a tiny ``delta_r``),
where the numerical curves cannot help (their delta slack is at least 1e-13), the
fixed point is found in log space on the Renyi-DP bound alone; only if even that
fails is the answer ``inf`` (vacuous, never wrong).  A tighter numerical ``f o f`` is
not attempted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fedfdp.accounting.composition import Bounds, bucket_groups, group_precision, ledger_groups
from fedfdp.accounting.protocol import Repeated
from fedfdp.accounting.prv import Group, gaussian_epsilon, rdp_epsilon, rdp_epsilon_log, tv_bound

#: ``profile_for(events, delta_abs_error)``: the accountant's add/remove bounds.
ProfileFor = Callable[[Sequence[Repeated], float], Bounds]


def replacement_epsilon(
    events: Sequence[Repeated],
    delta_r: float,
    profile_for: ProfileFor,
    relative_delta_error: float,
) -> tuple[float, float, float]:
    """Proposition 1 in (eps, delta) form, optimised over the add/remove delta.

    ``upper = 2 eps_up(d)`` for the largest ``d`` found (log grids) with
    ``d (1 + exp(eps_up(d))) <= delta_r``, ``eps_up`` being the certified
    add/remove upper bound (capped by Renyi DP).  The search starts at the fixed
    point of the Renyi-DP bound, which is feasible by construction, so the result
    is always finite.  ``estimate`` does the same with the estimate curve;
    ``lower = 2 lower_ar(delta_r / 2)`` (feasible ``d`` are below ``delta_r / 2``
    and epsilon decreases in delta).

    Parameters
    ----------
    events : sequence of Repeated
        The ledger (non-empty).
    delta_r : float
        Target replacement delta, in ``(0, 1)``.
    profile_for : callable
        ``profile_for(events, delta_abs_error)``: the accountant's add/remove bounds.
    relative_delta_error : float
        The accountant's relative delta slack.

    Returns
    -------
    (lower, estimate, upper) : tuple of float
        The replacement epsilon interval at ``delta_r``.
    """
    rel = relative_delta_error
    half = delta_r / 2.0
    groups = bucket_groups(ledger_groups(events), True)
    if 2.0 * tv_bound(groups) <= delta_r:  # (0, tv) add/remove => (0, 2 tv) replacement
        return 0.0, 0.0, 0.0
    if half < _TINY:
        return _rdp_replacement(groups, delta_r)
    lower = 2.0 * float(profile_for(events, rel * half).epsilon_bounds(half)[0][0])
    gaussian = all(g.q == 1.0 and g.p == 1.0 for g in groups)
    # Renyi-DP fixed point d = delta_r / (1 + e^{eps_rdp(d)}): a feasible start
    d_lo = half
    for _ in range(200):
        e = rdp_epsilon(groups, d_lo) if not gaussian else None
        if e is None:  # Gaussian: the closed form is exact and cheap
            e = gaussian_epsilon(math.sqrt(sum(group_precision(g) for g in groups)), d_lo)
        if not e < 700.0:  # the pair lies below 1e-300: only Renyi DP in log space helps
            return _rdp_replacement(groups, delta_r, lower)
        d_new = delta_r / (1.0 + math.exp(min(e, 700.0)))
        if d_new >= d_lo * (1.0 - 1e-12):
            break
        d_lo = d_new
    d_lo = max(min(d_lo, half), 1e-300)
    prof = profile_for(events, rel * d_lo)
    for _ in range(5000):  # make sure the start is feasible (upper <= Renyi DP)
        e_lo = float(prof.epsilon_bounds(d_lo)[2][0])
        if d_lo * (1.0 + math.exp(min(e_lo, 700.0))) <= delta_r:
            break
        d_lo *= 0.99
        if d_lo <= 1e-300:
            return _rdp_replacement(groups, delta_r, lower)
    else:
        return _rdp_replacement(groups, delta_r, lower)

    def best_pair(which: int) -> float:
        grid = np.geomspace(d_lo, half, 96)
        best = math.inf
        for _ in range(2):  # coarse grid, then a fine grid in the last feasible cell
            e = prof.epsilon_bounds(grid)[which]
            ok = grid * (1.0 + np.exp(np.minimum(e, 700.0))) <= delta_r
            if not ok.any():
                return best
            i = int(np.nonzero(ok)[0][-1])
            best = min(best, float(np.min(e[ok])))
            if i + 1 == len(grid):
                return best
            grid = np.geomspace(grid[i], grid[i + 1], 32)
        return best

    est_r, up_r = 2.0 * best_pair(1), 2.0 * best_pair(2)
    est_r = min(est_r, up_r)
    return min(lower, est_r), est_r, up_r


# Below this the numerical curves cannot resolve delta (their slack is >= 1e-13).
_TINY = 1e-250


def _rdp_replacement(
    groups: Sequence[Group], delta_r: float, lower: float = 0.0
) -> tuple[float, float, float]:
    """Proposition 1 on the Renyi-DP bound alone, in log space (any ``delta_r > 0``).

    Finds ``l = log delta_i`` with ``l + log(1 + e^{eps(l)}) <= log delta_r``,
    ``eps(l)`` the Renyi-DP epsilon at ``delta_i = e^l`` (valid for both orderings and
    for the Gaussian closed form's ledgers too), by the fixed-point iteration
    ``l <- log delta_r - log(1 + e^{eps(l)})`` followed by a check that steps ``l``
    down until the pair is feasible; returns ``(lower, 2 eps, 2 eps)``, or ``inf``
    when no feasible pair is found (or every moment overflows).
    """
    log_r = math.log(delta_r)
    ell = log_r - math.log(2.0)
    for _ in range(500):
        e = rdp_epsilon_log(groups, ell)
        if not math.isfinite(e):
            return lower, math.inf, math.inf
        new = log_r - float(np.logaddexp(0.0, e))
        if new >= ell - 1e-12 * abs(ell):
            break
        ell = new
    step = 1e-9 * max(1.0, abs(ell))
    for _ in range(200):
        e = rdp_epsilon_log(groups, ell)
        if math.isfinite(e) and ell + float(np.logaddexp(0.0, e)) <= log_r:
            return min(lower, 2.0 * e), 2.0 * e, 2.0 * e
        ell -= step
        step *= 2.0
    return lower, math.inf, math.inf
