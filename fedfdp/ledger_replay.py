"""A ledger replayed: the accountant its mechanism names, with every charge composed.

The privacy ledger (:mod:`fedfdp.ledger`) stores events, not an accountant's state:
the ε of a run is always recomputed from it. :func:`replay_ledger` is the one place
that turns a verified :class:`~fedfdp.ledger.Ledger` into that accountant — the one
the run itself charged (``fedfdp run``, its resume, ``fedfdp account --run``):

====================================  ===============================================
the ledger's mechanism (entry 0)      accountant (:func:`accountant_for`)
====================================  ===============================================
relation ``add-remove``               :class:`~fedfdp.accounting.FDPAccountant`: every
                                      charge a Poisson-subsampled Gaussian round
                                      (FDP paper Theorem 5; with participation
                                      ``p < 1`` the exact mixture of Poisson device
                                      sampling) or a thresholded histogram, composed
                                      by Theorem 3
relation ``add-remove`` with a        :class:`~fedfdp.accounting.distributed.\
``secagg`` plan (:func:`is_secagg`)   DistributedAccountant`: every round a distributed
                                      discrete Gaussian (sensitivity ``Δ = s + √d`` in
                                      integer units, ``n_min − t_c`` honest parties),
                                      ε the smaller of routes A and B
                                      (``docs/secagg_accounting.md``)
a node's ledger (``"ledger":           :class:`~fedfdp.accounting.distributed.\
"node"``, :mod:`fedfdp.node_ledger`)  DistributedAccountant`: every charge a round
                                      the node charged itself
relation ``corrdp``                   :class:`~fedfdp.corrdp.accounting.\
                                      CorrDPAccountant` with the δ a run's in-sample
                                      TV estimate set aside (the CorrDP relation; its
                                      ε is not a DP or FDP ε)
====================================  ===============================================

A round charged twice (after a crash inside it) counts twice, and so do the charges a
resume added pessimistically: the replay composes every charge ever written, in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedfdp.accounting import FDPAccountant
from fedfdp.accounting.distributed import DistributedAccountant
from fedfdp.accounting.events import PrivacyEvent, Relation, ThresholdedHistogram
from fedfdp.accounting.protocol import Accountant, append_repeated
from fedfdp.corrdp.accounting import CorrDPAccountant
from fedfdp.ledger import EntryKind, Ledger, is_node_mechanism

__all__ = ["LedgerReplay", "accountant_for", "is_secagg", "replay", "replay_ledger", "why_infinite"]


def replay(events: Sequence[PrivacyEvent], new: Callable[[], Accountant[Any]]) -> Accountant[Any]:
    """A fresh accountant from ``new()`` with every event of ``events`` composed, in order."""
    acc = new()
    for ev in events:
        acc.compose(ev)
    return acc


def is_secagg(mechanism: Mapping[str, Any]) -> bool:
    """Whether a ledger's resolved mechanism (its first entry) is one of secure aggregation
    (``aggregation = "secagg"``: it holds the ``secagg`` plan, and its rounds are
    distributed discrete Gaussian events).
    """
    return isinstance(mechanism.get("secagg"), dict)


def accountant_for(
    mechanism: Mapping[str, Any], *, delta_estimation: float = 0.0, eps_error: float | None = None
) -> Callable[[], Accountant[Any]]:
    """``new()`` → a fresh accountant of the relation ``mechanism`` (a ledger's first
    entry, :meth:`fedfdp.mechanism.ResolvedMechanism.to_dict`) names (module docstring).

    Parameters
    ----------
    delta_estimation : float
        CorrDP only: the δ the run's in-sample TV estimate set aside.
    eps_error : float, optional
        The accountant's precision (default: its own, as the run used).

    Raises
    ------
    ValueError
        A relation no run is accounted under (``replacement`` is a statement about an
        add/remove ledger, not a run's relation), or none.
    """
    relation = mechanism.get("relation")
    settings: dict[str, Any] = {} if eps_error is None else {"eps_error": eps_error}
    if relation == Relation.ADD_REMOVE and (is_secagg(mechanism) or is_node_mechanism(mechanism)):
        return lambda: DistributedAccountant(**settings)
    if relation == Relation.ADD_REMOVE:
        return lambda: FDPAccountant(**settings)
    if relation == Relation.CORRDP:
        return lambda: CorrDPAccountant(delta_estimation, **settings)
    raise ValueError(f"relation={relation!r} in its mechanism: no accountant for it")


@dataclass(frozen=True)
class LedgerReplay:
    """A run's ledger replayed into the accountant of its relation.

    Attributes
    ----------
    accountant : Accountant
        Every charge of the ledger composed in order (:func:`accountant_for`).
    events : tuple of (PrivacyEvent, int)
        The charged events with their counts, consecutive equal ones merged
        (:func:`fedfdp.accounting.protocol.append_repeated`, the one merge).
    charges : int
        The number of round charges (recorded or pessimistic; the estimates charged
        before round 1 are not counted).
    charged_rounds : int
        The number of distinct rounds charged.
    mechanism : dict
        The resolved mechanism the ledger starts with (relation, δ, ...).
    """

    accountant: Accountant[Any]
    events: tuple[tuple[PrivacyEvent, int], ...]
    charges: int
    charged_rounds: int
    mechanism: dict[str, Any]


def replay_ledger(
    ledger: Ledger, *, delta_estimation: float = 0.0, eps_error: float | None = None
) -> LedgerReplay:
    """The accountant of ``ledger``'s relation with every charge composed
    (:func:`accountant_for`, :func:`replay`), and the merged events.

    Raises
    ------
    ValueError
        One line: a relation with no accountant, or events its accountant refuses
        (``its events do not replay (…)``).
    """
    mechanism = ledger.mechanism
    new = accountant_for(mechanism, delta_estimation=delta_estimation, eps_error=eps_error)
    events = ledger.events()
    try:
        acc = replay(events, new)
    except (TypeError, ValueError) as exc:
        text = str(exc).strip()
        raise ValueError(f"its events do not replay ({text.splitlines()[0] if text else type(exc).__name__})"
                         ) from None
    merged: list[tuple[PrivacyEvent, int]] = []
    for ev in events:
        merged = append_repeated(merged, ev, 1)
    rounds = [e for e in ledger.charges if e.kind is not EntryKind.ESTIMATE]  # estimates: before round 1
    charged = {e.round for e in ledger.charges if e.round is not None}
    return LedgerReplay(acc, tuple(merged), len(rounds), len(charged), mechanism)


def why_infinite(
    events: Sequence[tuple[PrivacyEvent, int]],
    delta: float,
    relation: Relation,
    *,
    mode: str | None = None,
    unbounded: bool = False,
    add_remove: float | None = None,
) -> str:
    """One line saying why a replayed ledger has no finite ε at ``delta`` under ``relation``
    (``fedfdp account`` prints it beside every ∞): which events have no bound, and why.

    Parameters
    ----------
    events : sequence of (event, count)
        The ledger's charges, merged.
    unbounded : bool
        The run trained on private data without noise (``mode = "nonprivate"``).
    add_remove : float, optional
        The finite add/remove ε of the same events, if any (a replacement ∞ then comes from
        Proposition 1's δ, which this line quantifies).
    """
    if unbounded:
        return (f"mode {mode or 'nonprivate'!r} trains on the private data without noise: no event bounds "
                "it, under any relation")
    thresholded = [(e, n) for e, n in events if isinstance(e, ThresholdedHistogram)]
    cost = float(sum(n * e.delta_cost for e, n in thresholded))
    k = sum(n for _, n in thresholded)
    if cost > 0.0 and cost >= delta:
        return (f"{relation}: the {k} thresholded histogram(s) of the released estimates take δ = {cost:.3g} "
                f"(a category held by one record is released with probability δ_t), at least the run's "
                f"δ = {delta:.3g}: nothing is left for the Gaussian parts; declare the encodings or raise δ")
    if cost > 0.0 and relation is Relation.REPLACEMENT:
        share, rest = "", f"what is left of the run's δ = {delta:.3g} is too small for their Gaussian parts"
        if add_remove is not None and math.isfinite(add_remove):
            taken = cost * (1.0 + math.exp(min(add_remove, 700.0)))
            share = f" (≥ {taken:.3g} at the add/remove ε {add_remove:.3g})"
            if taken >= delta:
                rest = f"more than the run's δ = {delta:.3g}, none is left for their Gaussian parts"
            else:
                rest = (f"the {delta - taken:.3g} left of the run's δ = {delta:.3g} is too small for their "
                        "Gaussian parts")
        return (f"replacement (Prop. 1 from add/remove): the {k} thresholded histogram(s) of the released "
                f"estimates take δ = {cost:.3g}, which Proposition 1 multiplies by 1 + e^ε{share}; {rest} "
                "at any such ε; declare the encodings (no estimate), or read the add/remove ε")
    charges = sum(n for _, n in events)
    return (f"{relation}: the accountant finds no finite ε at δ = {delta:.3g} for these {charges} charge(s) "
            "(the noise is too small for this δ: the numerical curves and the Rényi-DP bound both fail)")
