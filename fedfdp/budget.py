"""The privacy budget of one run: the mechanism's cap and δ over the accountant that
composes every charge, answered in O(1) per round from a headroom (the rounds of the
per-round event left under the cap), found by the accountant's ``would_exceed``.
"""

from __future__ import annotations

from typing import Any

from fedfdp.accounting import PrivacyBudgetExhausted
from fedfdp.accounting.events import PrivacyEvent
from fedfdp.accounting.protocol import Accountant
from fedfdp.mechanism import ResolvedMechanism


class Budget:
    """Guards the privacy budget of one run: the mechanism's cap and δ over an
    :class:`~fedfdp.accounting.protocol.Accountant` that composes every charge.

    The check costs the same at every length of the run. With a cap, the budget keeps a
    **headroom** ``h``: the largest ``n`` such that ``n`` more rounds of the mechanism's
    per-round event stay within the cap (``not would_exceed(event, n)``) — or, while the
    cap is far, only a number of rounds known to stay within it (a lower bound; at most
    the look-ahead, which starts at :data:`HEADROOM_LOOKAHEAD` rounds and doubles each
    time it is used up). ``check(count)`` is then ``count > h``, an integer comparison;
    each composition of the event through :meth:`compose` lowers ``h``; anything else
    composed (an estimate, another event, a composition that bypassed :meth:`compose`,
    seen from the accountant's ``rounds``) forgets it, and the next check searches again
    (:meth:`_search`: one evaluation of the look-ahead, then, when the cap lies within
    it, a bisection: ``O(log n)`` evaluations of ε, once).

    The bisection keeps ``would_exceed(event, lo)`` false (or ``lo = 0``) and
    ``would_exceed(event, lo + 1)`` true, both evaluated (the certificate of the
    boundary). The rounds are refused at exactly the round a per-round check
    ``would_exceed(event, 1)`` refuses them: composing ``k`` rounds one at a time and
    asking about one more is the same merged ledger
    (:func:`~fedfdp.accounting.protocol.append_repeated`), hence the same evaluation, as
    asking about ``k + 1`` at once; and the search relies on the accountant's upper ε
    being non-decreasing in the number of rounds, as the ε it bounds is (composition
    never lowers it; ``tests/test_budget_headroom.py`` compares both round by round).

    Parameters
    ----------
    mechanism : ResolvedMechanism
    accountant : Accountant
        Fresh, or restored from the ledger (every charge ever written). Compose further
        charges through :meth:`compose` (or :meth:`spend`), not on it directly.
    """

    def __init__(self, mechanism: ResolvedMechanism, accountant: Accountant[Any]) -> None:
        self.mechanism = mechanism
        self._accountant = accountant
        if mechanism.estimates and _fresh(accountant):
            # a fresh run: the ledger starts with the estimates' charges (Ledger.start), so
            # does the accountant; a resumed one replays them from the ledger
            for estimate in mechanism.estimates:
                accountant.compose(estimate.event)
        #: Rounds of the event the check allows from here (None: not known, search).
        self._headroom: int | None = None
        #: Whether ``_headroom`` is the boundary (one more round is refused), not a lower bound.
        self._exact = False
        self._lookahead = HEADROOM_LOOKAHEAD
        #: The accountant's ``rounds`` when ``_headroom`` was last right (a composition
        #: that bypassed :meth:`compose` changes it).
        self._seen: int | None = None

    @property
    def accountant(self) -> Accountant[Any]:
        """The accountant (read it; compose through :meth:`compose`)."""
        return self._accountant

    def epsilon(self) -> float:
        """ε spent so far: the accountant's upper bound for the mechanism's relation at
        its δ (``inf`` for ``nonprivate``, 0 for public-only training).
        """
        m = self.mechanism
        if m.unbounded:
            return float("inf")
        if not m.private and not m.estimates:
            return 0.0
        return float(self._accountant.epsilon(m.delta))

    def check(self, count: int = 1) -> None:
        """Raise :class:`PrivacyBudgetExhausted` if ``count`` more private rounds would
        exceed the cap. Changes nothing the accountant holds.
        """
        m = self.mechanism
        if m.event is None or m.max_epsilon is None:
            return
        headroom = self._headroom
        if headroom is None or self._seen != _rounds(self._accountant):
            headroom = self._search(m.event, m.max_epsilon, count)
        if count > headroom and not self._exact:
            headroom = self._search(m.event, m.max_epsilon, count)
        if count > headroom:
            raise PrivacyBudgetExhausted(self.epsilon(), m.max_epsilon, m.delta)

    def _search(self, event: PrivacyEvent, max_epsilon: float, count: int) -> int:
        """Set and return the headroom from the accountant as it is (class docstring)."""
        delta = self.mechanism.delta

        def exceeds(n: int) -> bool:
            return bool(self._accountant.would_exceed(event, n, max_epsilon=max_epsilon, delta=delta))

        limit = max(self._lookahead, count)
        if not exceeds(limit):
            self._headroom, self._exact = limit, False
            self._lookahead = 2 * limit
        else:
            lo, hi = 0, limit  # would_exceed(lo) false (lo = 0: nothing more), would_exceed(hi) true
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if exceeds(mid):
                    hi = mid
                else:
                    lo = mid
            self._headroom, self._exact = lo, True
        self._seen = _rounds(self._accountant)
        return self._headroom

    def compose(self, event: PrivacyEvent, count: int = 1) -> None:
        """Compose ``count`` rounds of ``event``: the mechanism's event lowers the
        headroom, anything else forgets it (class docstring).
        """
        headroom = self._headroom if self._seen == _rounds(self._accountant) else None
        self._accountant.compose(event, count)
        if headroom is not None and event == self.mechanism.event:
            headroom -= count
            # past a lower bound: not known
            self._headroom = None if headroom < 0 and not self._exact else headroom
            self._seen = _rounds(self._accountant)
        else:
            self._headroom = None

    def spend(self, event: PrivacyEvent, count: int = 1) -> float:
        """Compose ``count`` rounds of ``event``; return the new ε."""
        self.compose(event, count)
        return self.epsilon()


#: The first look-ahead of :class:`Budget`'s headroom (rounds); it doubles each time
#: it is used up without reaching the cap.
HEADROOM_LOOKAHEAD = 64


def _rounds(accountant: Accountant[Any]) -> int | None:
    """The rounds ``accountant`` composed, when it counts them (None otherwise)."""
    rounds = getattr(accountant, "rounds", None)
    return rounds if isinstance(rounds, int) else None


def _fresh(accountant: Accountant[Any]) -> bool:
    """Whether ``accountant`` has composed nothing yet (a new run, not a resume)."""
    return getattr(accountant, "rounds", None) == 0 and not getattr(accountant, "estimates", ())
