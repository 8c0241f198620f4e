"""The budget's headroom refuses at exactly the round a per-round check refuses.

:class:`fedfdp.budget.Budget` answers ``check()`` from a headroom (the rounds left
below the cap, searched once and lowered by each composition) instead of evaluating ε
of the ledger plus one round every round. The reference here is the old behaviour,
computed independently: a fresh accountant asked ``would_exceed(event, 1)`` round by
round and composing the event while it answers no.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from fedfdp import build_plan, load_config
from fedfdp.accounting import FDPAccountant, PrivacyBudgetExhausted
from fedfdp.accounting.distributed import DistributedAccountant
from fedfdp.accounting.events import (
    CorrDPClass,
    CorrDPRound,
    DistributedDiscreteGaussian,
    PrivacyEvent,
    Relation,
    SubsampledGaussian,
    ThresholdedHistogram,
)
from fedfdp.budget import Budget
from fedfdp.corrdp.accounting import CorrDPAccountant
from fedfdp.mechanism import ResolvedMechanism

DELTA = 1e-5
#: (round number, event composed before that round's check): other events mid-run
Extra = Sequence[tuple[int, PrivacyEvent]]


class ReplacementAccountant(FDPAccountant):
    """An FDP accountant stated under the replacement relation (Definition 5)."""

    relation = Relation.REPLACEMENT

    def epsilon(self, delta: float, relation: Relation | str | None = None) -> float:
        return super().epsilon(delta, relation or Relation.REPLACEMENT)

    def would_exceed(self, event: Any, count: int = 1, *, max_epsilon: float, delta: float,
                     relation: Relation | str | None = None) -> bool:
        return super().would_exceed(event, count, max_epsilon=max_epsilon, delta=delta,
                                    relation=relation or Relation.REPLACEMENT)


class CountingAccountant(FDPAccountant):
    """An FDP accountant that counts the evaluations ``would_exceed`` asks for."""

    asked = 0

    def would_exceed(self, event: Any, count: int = 1, *, max_epsilon: float, delta: float,
                     relation: Relation | str = Relation.ADD_REMOVE) -> bool:
        self.asked += 1
        return super().would_exceed(event, count, max_epsilon=max_epsilon, delta=delta, relation=relation)


@pytest.fixture(scope="module")
def base() -> ResolvedMechanism:
    plan = build_plan(load_config({"noise-multiplier": 1.0, "sampling-rate": 0.2, "num-rounds": 500,
                                   "progress": False, "seed": 0}), model=torch.nn.Linear(4, 2), num_devices=3)
    return plan.engine([100, 80, 120]).mechanism


def reference_refusal(new: Callable[[], Any], event: PrivacyEvent, cap: float, *,
                      relation: Relation | None = None, before: Sequence[PrivacyEvent] = (),
                      extra: Extra = (), limit: int = 400) -> int | None:
    """The round a per-round check refuses: ``would_exceed(event, 1)`` asked of a fresh
    accountant every round (None: not within ``limit`` rounds).
    """
    acc = new()
    for ev in before:
        acc.compose(ev)
    mid = dict(extra)
    kw = {} if relation is None else {"relation": relation}
    for r in range(1, limit + 1):
        if r in mid:
            acc.compose(mid[r])
        if acc.would_exceed(event, 1, max_epsilon=cap, delta=DELTA, **kw):
            return r
        acc.compose(event)
    return None


def budget_refusal(budget: Budget, extra: Extra = (), limit: int = 400) -> int | None:
    """The round the budget refuses, charging as the round engine does."""
    event = budget.mechanism.event
    assert event is not None
    mid = dict(extra)
    for r in range(1, limit + 1):
        if r in mid:
            budget.compose(mid[r])
        try:
            budget.check()
        except PrivacyBudgetExhausted:
            return r
        budget.compose(event)
    return None


def capped(base: ResolvedMechanism, event: PrivacyEvent, cap: float) -> ResolvedMechanism:
    return dataclasses.replace(base, event=event, max_epsilon=cap, delta=DELTA, estimates=())


@pytest.mark.parametrize(("sigma", "q", "cap"), [
    (1.0, 0.1, 4.0),    # refused within the first look-ahead (round 26)
    (0.8, 0.05, 3.0),
    (5.0, 0.5, 2.0),
    (3.0, 0.1, 1.2),    # beyond it (round 71): the look-ahead doubles first
    (1.5, 0.1, 0.05),   # the first round is already refused
])
def test_add_remove_refuses_at_the_same_round(base, sigma, q, cap):
    event = SubsampledGaussian(sigma, q)
    want = reference_refusal(FDPAccountant, event, cap)
    assert want is not None
    assert budget_refusal(Budget(capped(base, event, cap), FDPAccountant())) == want


def test_replacement_refuses_at_the_same_round(base):
    event = SubsampledGaussian(2.0, 0.2)
    want = reference_refusal(FDPAccountant, event, 3.0, relation=Relation.REPLACEMENT)
    assert want is not None and want > 1
    assert budget_refusal(Budget(capped(base, event, 3.0), ReplacementAccountant())) == want


def test_distributed_accountant_refuses_at_the_same_round(base):
    event = DistributedDiscreteGaussian(local_sigma=2.0e5, honest_parties=10, scale=2**19, dimension=10**4,
                                        sampling_rate=0.5)
    want = reference_refusal(DistributedAccountant, event, 10.0, limit=40)
    assert want is not None and want > 1
    assert budget_refusal(Budget(capped(base, event, 10.0), DistributedAccountant()), limit=40) == want


def test_corrdp_accountant_refuses_at_the_same_round(base):
    event = CorrDPRound((CorrDPClass("s", 1.0, 2.0),), 2.0, 0.2)
    want = reference_refusal(CorrDPAccountant, event, 4.0, limit=60)
    assert want is not None and want > 1
    assert budget_refusal(Budget(capped(base, event, 4.0), CorrDPAccountant()), limit=60) == want


def test_other_events_forget_the_headroom(base):
    """An estimate before the rounds, another round event and an estimate mid-run
    (through ``compose``), and a composition that bypassed the budget: each moves the
    refusal as the per-round check moves it.
    """
    event = SubsampledGaussian(1.0, 0.1)
    estimate = ThresholdedHistogram(20.0, 1e-9)
    extra: Extra = [(3, SubsampledGaussian(2.0, 0.5)), (10, estimate)]
    want = reference_refusal(FDPAccountant, event, 4.0, before=[estimate], extra=extra)
    assert want is not None and want > 10
    acc = FDPAccountant()
    acc.compose(estimate)
    assert budget_refusal(Budget(capped(base, event, 4.0), acc), extra) == want

    other = SubsampledGaussian(3.0, 0.5)
    budget = Budget(capped(base, event, 4.0), FDPAccountant())
    budget.check()  # the headroom is known
    budget.accountant.compose(other, 2)  # bypassing the budget
    want = reference_refusal(FDPAccountant, event, 4.0, before=[other, other])
    assert want is not None and want > 1
    assert budget_refusal(budget) == want


def test_a_far_cap_costs_a_few_evaluations(base):
    """With a cap never reached, 300 checks evaluate ε a logarithmic number of times
    (the look-ahead doubles), not once a round.
    """
    event = SubsampledGaussian(1.0, 0.01)
    acc = CountingAccountant()
    budget = Budget(capped(base, event, 1e6), acc)
    assert budget_refusal(budget, limit=300) is None
    assert acc.asked <= 4  # look-aheads of 64, 128 and 256 rounds
