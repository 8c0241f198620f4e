"""The composed trade-off function and attribute inference (Theorem 4).

Mechanism
---------
A ledger of Poisson-subsampled Gaussian rounds (clip norm ``C`` = add/remove
sensitivity, noise ``N(0, sigma^2 C^2 I)``, rate ``q``), each dominated by
**Theorem 5**'s pair ``T(P, Q)``, composed by Theorem 3.

Neighbouring relation
---------------------
Add/remove (Definition 6): the curve is a certified convex lower bound on the
largest convex function below both ``T(P^T, Q^T)`` and its inverse.

Result
------
**Theorem 4**: an attribute-inference attack on the private features of a record
succeeds with probability at most ``1 - f(Ball)``, ``Ball`` being the success of the
best guess that does not see the model (Definition 8).
"""

from __future__ import annotations

import csv
import os
from typing import Any

import numpy as np
from scipy import special

from fedfdp import validate
from fedfdp.accounting.accountant import (
    FDPAccountant,
    as_events,
    threshold_delta_cost,
)
from fedfdp.accounting.composition import DELTA_ERROR_FLOOR, DISC_SHARE, compose_bounds

__all__ = ["attribute_inference_bound", "plot_tradeoff", "save_tradeoff_csv", "tradeoff_curve"]


def _default_alphas() -> np.ndarray:
    return np.unique(
        np.concatenate([[0.0], np.geomspace(1e-6, 1e-2, 200), np.linspace(0.01, 1.0, 400)])
    )


def _check_alphas(alphas: Any) -> np.ndarray:
    try:
        a = np.asarray(alphas, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"alphas={alphas!r}: must be an array of numbers in [0, 1]") from None
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"alphas with shape {a.shape}: must be a non-empty 1-D array")
    if not np.all(np.isfinite(a)) or a.min() < 0.0 or a.max() > 1.0:
        bad = a[~(np.isfinite(a) & (a >= 0.0) & (a <= 1.0))][0]
        raise ValueError(f"alphas: value {bad!r} is not in [0, 1]")
    return a


def tradeoff_curve(
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    *,
    eps_error: float | None = None,
    delta_error: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """Composed add/remove trade-off function, as a certified lower bound.

    Returns ``(alphas, betas)`` with ``betas[i] <= f(alphas[i])`` (type I error
    ``alpha``, type II error ``beta``), where ``f`` is the largest convex function
    below both ``T(P^T, Q^T)`` (Theorem 5) and its inverse ``T(Q^T, P^T)``, the two
    orderings Definition 6 requires.  Computed as
    ``max(0, max_eps [1 - delta_up(eps) - e^eps alpha])`` over a grid of ``eps``
    (Dong, Roth & Su 2022, Prop. 2.12), ``delta_up`` being the certified upper bound
    on the larger of the two hockey-stick curves: every term is a line below ``f``,
    so the result is a convex lower bound on ``f`` and ``1 - beta`` is an upper bound
    on attack success (Theorem 4).  For a ledger of ``q = 1`` rounds (all with
    participation 1) the exact ``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)`` is
    returned.  With participation ``p < 1`` the pair of each round is the mixture of
    :class:`~fedfdp.accounting.Repeated` and the same construction applies to its
    certified delta curve.  When the ledger is too lossy (or too large) for the
    numerical curves, ``delta_up`` is the Renyi-DP bound (and the total-variation
    bound), still a valid, if looser, curve.  Memory and time are bounded like the
    accountant's (:data:`fedfdp.accounting.composition.MEMORY_LIMIT_BYTES`).

    Parameters
    ----------
    ledger_or_accountant : FDPAccountant or sequence of Repeated
    alphas : array, optional
        Type I errors in ``[0, 1]``; default: 600 points, log-spaced below 0.01.
    eps_error : float, optional
        Discretisation target (the accountant's when one is given, else 0.05).
    delta_error : float
        Absolute delta slack of the curve: adds about this much to ``1 - beta``.
    """
    events = as_events(ledger_or_accountant)
    if eps_error is None:
        acc = ledger_or_accountant
        eps_error = acc.eps_error if isinstance(acc, FDPAccountant) else 0.05
    eps_error = validate.rate("eps_error", eps_error)
    delta_error = validate.real("delta_error", delta_error)
    if not DELTA_ERROR_FLOOR <= delta_error <= 1e-3:
        raise ValueError(f"delta_error={delta_error!r}: must be in [{DELTA_ERROR_FLOOR}, 1e-3]")
    a = _default_alphas() if alphas is None else _check_alphas(alphas)
    if not events:
        return a, 1.0 - a
    prof = compose_bounds(events, DISC_SHARE * eps_error, delta_error, 2**24).upper
    # Thresholded histograms: their Gaussian parts are in ``prof``; the thresholds add at
    # most ``cost`` to the hockey-stick curve at every eps (accountant module docstring),
    # so every line 1 - delta(eps) - e^eps alpha, and with them f, moves down by ``cost``.
    cost = threshold_delta_cost(events)
    if prof.gaussian_mu is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            beta = special.ndtr(special.ndtri(1.0 - a) - prof.gaussian_mu)
        beta = np.nan_to_num(beta, nan=0.0) - cost
        return a, np.clip(beta, 0.0, 1.0 - a)
    if prof.curves:
        t_lo = min(c.t_first for c in prof.curves) + prof.eps_disc
        t_hi = max(c.t_last for c in prof.curves) + prof.eps_disc
        eps = np.linspace(max(t_lo, -30.0), t_hi, 6000)
    else:  # Renyi-DP (and total-variation) delta curve: lines for eps in [0, 700]
        eps = np.concatenate([np.linspace(0.0, 30.0, 3000), np.geomspace(30.0, 700.0, 3001)[1:]])
    dup = prof.delta_upper(eps)
    use = dup < 1.0
    eps, dup = eps[use], dup[use]
    beta = np.zeros(len(a))
    for s in range(0, len(a), 256):
        lines = 1.0 - dup[None, :] - np.exp(eps)[None, :] * a[s : s + 256, None]
        beta[s : s + 256] = np.max(lines, axis=1, initial=0.0)
    return a, np.clip(beta - cost, 0.0, 1.0 - a)


def attribute_inference_bound(ledger_or_accountant: Any, ball: float, **kwargs: Any) -> float:
    """Upper bound on attribute-inference success, ``1 - f(Ball)`` (Theorem 4).

    ``ball`` is ``Ball(X, u, d, rho)`` of Definition 8: the best success rate of a
    guess that does not see the model, in ``[0, 1]``.  ``f`` is the certified lower
    bound of :func:`tradeoff_curve` (convex, as Theorem 4 requires), so the result is
    an upper bound, in ``[ball, 1]``.  ``kwargs`` go to :func:`tradeoff_curve`.
    """
    b = validate.unit("ball", ball)
    _, beta = tradeoff_curve(ledger_or_accountant, np.array([b]), **kwargs)
    return float(min(1.0, max(b, 1.0 - beta[0])))


def save_tradeoff_csv(
    path: str | os.PathLike[str],
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    **kwargs: Any,
) -> None:
    """Write :func:`tradeoff_curve` to ``path`` as CSV with columns ``alpha,beta``."""
    a, b = tradeoff_curve(ledger_or_accountant, alphas, **kwargs)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["alpha", "beta"])
        for x, y in zip(a, b, strict=True):
            writer.writerow([repr(float(x)), repr(float(y))])


def plot_tradeoff(
    path: str | os.PathLike[str],
    ledger_or_accountant: Any,
    alphas: np.ndarray | None = None,
    *,
    title: str | None = None,
    **kwargs: Any,
) -> None:
    """Plot :func:`tradeoff_curve` (and the ``beta = 1 - alpha`` line) to a PNG file.

    Uses matplotlib's object API with the Agg canvas: no pyplot, no global backend
    change.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    a, b = tradeoff_curve(ledger_or_accountant, alphas, **kwargs)
    fig = Figure(figsize=(4.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(a, b, label="f (certified lower bound)")
    ax.plot([0, 1], [1, 0], ls="--", c="grey", lw=0.8, label="perfect privacy")
    ax.set_xlabel("type I error alpha")
    ax.set_ylabel("type II error beta")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.legend(loc="upper right")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
