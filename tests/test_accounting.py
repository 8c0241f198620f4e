"""Tests for fedfdp.accounting.

Expected values come from independent references, never from the code under test:

- ``q = 1``: the Gaussian mechanism in closed form, ``mu = sqrt(T)/sigma``,
  ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` solved with scipy.
  Tolerance: ``ref <= upper <= ref + 2e-9 (1 + ref)`` (closed form, padded by 1e-9).
- ``q < 1``: Google dp-accounting's PLD accountant (connect-the-dots, pessimistic,
  ``value_discretization_interval = 1e-4``; 1e-3 for <= 10 rounds),
  ``ADD_OR_REMOVE_ONE``.  Its value is an
  upper bound within ~1e-4 of the truth.  Tolerances: ``upper >= ref - 1e-3``,
  ``upper <= ref + eps_error + 5e-3`` (``eps_error = 0.05``), ``lower <= ref + 1e-3``,
  ``|estimate - ref| <= 5e-3``.  Per ordering, the same against dp-accounting's
  ``REMOVE``/``ADD`` PMFs and prv-accountant's ``PoissonSubsampledGaussianMechanism``.
- Replacement: Proposition 1's (eps, delta) conversion evaluated on the references
  by an independent grid search (tolerance 0.01 for ``q = 1``; for ``q < 1``, with
  dp-accounting at vdi 1e-3, the accountant may be 0.02 below and up to
  ``2 eps_error + 0.02`` above).
- Trade-off curve: ``G_mu`` in closed form for ``q = 1`` (1e-9); for ``q < 1``,
  ``max_eps [1 - delta_ref(eps) - e^eps alpha]`` from dp-accounting's hockey-stick
  curve (vdi 1e-3): the accountant's curve must lie below it (+2e-3) and within 0.06.
- Participation ``p < 1`` (Poisson device sampling, the device draw known to the
  adversary): with ``K ~ Binomial(T, p)`` touching rounds,
  ``delta(eps) = sum_k Binom(k; T, p) delta_k(eps)``, ``delta_k`` from dp-accounting's
  ``k``-fold PLD (both orderings, the larger kept), or the Gaussian closed form for
  ``q = 1`` (``tests/references.py``).  Tolerances: ``|estimate - ref| <= 0.02``,
  ``upper >= ref - 1e-6``, ``lower <= ref + 1e-3``.
- Bounded memory: the pathological inputs run in a subprocess whose address space is
  capped at 3 GiB and must return valid (checked against references through
  monotonicity) finite bounds, with a traced peak below the documented limit.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
import random
import subprocess
import sys
import warnings
from typing import TypedDict, Unpack

import numpy as np
import pytest
from scipy import special

from fedfdp.accounting import (
    EpsilonBound,
    FDPAccountant,
    PrivacyBudgetExhausted,
    Relation,
    Repeated,
    SubsampledGaussian,
    attribute_inference_bound,
    calibrate_noise_multiplier,
    composition,
    epsilon_for,
    epsilon_prv_accountant,
    plot_tradeoff,
    save_tradeoff_csv,
    tradeoff_curve,
)
from fedfdp.accounting.prv import RDP_ORDERS, log_moments
from fedfdp.accounting.prv_reference import prv_add_ordering
from tests.references import (
    VDI,
    dp_ref_eps,
    gaussian_eps_ref,
    participation_delta_ref,
    participation_eps_ref,
    participation_gaussian_eps_ref,
)

warnings.filterwarnings("ignore", category=DeprecationWarning)
dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import privacy_loss_distribution as dp_pld  # noqa: E402

EPS_ERROR = 0.05


class AccountantKnobs(TypedDict, total=False):
    """The keyword arguments of :class:`FDPAccountant`."""

    eps_error: float
    delta_error: float
    max_grid_points: int


class CalibrationKnobs(TypedDict, total=False):
    """The optional keyword arguments of :func:`calibrate_noise_multiplier`."""

    participation: float
    relation: Relation | str
    eps_error: float
    rtol: float
    max_noise_multiplier: float


def ev(sigma: float, q: float, count: int = 1, p: float = 1.0) -> Repeated:
    """``count`` rounds of the subsampled Gaussian ``(σ, q, p)``."""
    return Repeated(SubsampledGaussian(sigma, q, p), count)


def cal(target: float, q: float, rounds: int, delta: float, **kw: Unpack[CalibrationKnobs]) -> float:
    return calibrate_noise_multiplier(target_epsilon=target, sampling_rate=q, rounds=rounds, delta=delta,
                                      **kw)



# --------------------------------------------------------------------------- #
# independent references
# --------------------------------------------------------------------------- #


def composed(events: list[tuple[float, float, int]], **kw: Unpack[AccountantKnobs]) -> FDPAccountant:
    acc = FDPAccountant(**kw)
    for sigma, q, count in events:
        acc.compose(SubsampledGaussian(sigma, q), count)
    return acc


# --------------------------------------------------------------------------- #
# q = 1: closed form
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("sigma", "rounds", "delta"),
    [
        (1.0, 1, 1e-5),
        (0.5, 1, 1e-5),
        (2.0, 100, 1e-6),
        (10.0, 1000, 1e-5),
        (3.3, 6336, 1e-8),
        (50.0, 10, 1e-3),
        (100.0, 1, 0.5),  # delta above the total variation: epsilon = 0
    ],
)
def test_gaussian_closed_form(sigma: float, rounds: int, delta: float) -> None:
    ref = gaussian_eps_ref(math.sqrt(rounds) / sigma, delta)
    b = epsilon_for(sigma, 1.0, rounds, delta)
    assert ref <= b.upper <= ref + 2e-9 * (1 + ref)
    assert b.lower <= ref


def test_gaussian_heterogeneous_sigmas() -> None:
    acc = composed([(1.0, 1.0, 10), (2.0, 1.0, 40), (1.0, 1.0, 5)])
    mu = math.sqrt(15 / 1.0 + 40 / 4.0)
    ref = gaussian_eps_ref(mu, 1e-5)
    assert ref <= acc.epsilon(1e-5) <= ref + 2e-9 * (1 + ref)


# --------------------------------------------------------------------------- #
# q < 1: dp-accounting PLD
# --------------------------------------------------------------------------- #

GRID = [
    # (sigma, q, rounds, delta, dp-accounting discretisation)
    (0.8, 1 / 16, 10_000, 1e-5, VDI),  # the benchmark case, epsilon ~ 108
    (1.1, 0.02, 10_000, 1e-8, VDI),
    (1.0, 0.01, 1_000, 1e-5, VDI),
    (0.6, 0.001, 3_000, 1e-6, VDI),
    (2.0, 0.1, 100, 1e-5, VDI),
    (5.0, 0.5, 50, 1e-3, VDI),
    (0.5, 0.01, 10, 1e-5, 1e-3),  # few rounds: the coarser reference is as accurate
    (0.7, 0.2, 1, 1e-5, 1e-3),
    (4.0, 0.001, 500, 1e-5, VDI),  # tiny epsilon
]


@pytest.mark.parametrize(("sigma", "q", "rounds", "delta", "vdi"), GRID)
def test_against_dp_accounting(sigma: float, q: float, rounds: int, delta: float, vdi: float) -> None:
    ref = dp_ref_eps([(sigma, q, rounds)], delta, vdi)
    b = epsilon_for(sigma, q, rounds, delta)
    assert b.upper >= ref - 1e-3
    assert b.upper <= ref + EPS_ERROR + 5e-3
    assert b.lower <= ref + 1e-3
    assert abs(b.estimate - ref) <= 5e-3
    assert b.lower <= b.estimate <= b.upper
    assert b.relation == "add-remove" and b.delta == delta


def test_precision_knob_tightens() -> None:
    ref = dp_ref_eps([(1.0, 0.01, 1000)], 1e-5)
    b = epsilon_for(1.0, 0.01, 1000, 1e-5, eps_error=0.01)
    assert ref - 1e-3 <= b.upper <= ref + 0.01 + 2e-3


def test_small_delta_uses_extended_precision() -> None:
    """delta = 1e-11 needs the long-double spectrum; the interval must still hold."""
    ref = dp_ref_eps([(1.0, 0.01, 1000)], 1e-11)
    b = epsilon_for(1.0, 0.01, 1000, 1e-11)
    assert b.upper >= ref - 1e-3
    assert b.lower <= ref + 1e-3
    assert b.upper <= ref + 0.1


@pytest.mark.parametrize(("sigma", "q", "rounds"), [(0.8, 1 / 16, 100), (1.0, 0.05, 2000)])
def test_each_ordering(sigma: float, q: float, rounds: int) -> None:
    """remove = prv-accountant's PRV and dp-accounting's REMOVE; add = dp-accounting's ADD."""
    pld = dp_pld.from_gaussian_mechanism(
        sigma, sensitivity=1.0, sampling_prob=q, value_discretization_interval=VDI
    ).self_compose(rounds)
    ref_remove = pld._pmf_remove.get_epsilon_for_delta(1e-5)
    ref_add = pld._pmf_add.get_epsilon_for_delta(1e-5)
    assert ref_remove > ref_add  # remove dominates here
    prof = composition._profile(((sigma, q, rounds),), 0.045, 1e-8, 2**24)
    remove, add = prof.curves
    assert abs(float(remove.epsilon(np.array([1e-5]))[0]) - ref_remove) <= 5e-3
    assert abs(float(add.epsilon(np.array([1e-5]))[0]) - ref_add) <= 5e-3


def test_prv_accountant_covers_remove_ordering() -> None:
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv = PRVAccountant(
            prvs=[PoissonSubsampledGaussianMechanism(1 / 16, 0.8)],
            max_self_compositions=[100],
            eps_error=0.05,
            delta_error=1e-8,
        )
        lo, est, up = prv.compute_epsilon(1e-5, [100])
    prof = composition._profile(((0.8, 1 / 16, 100),), 0.045, 1e-8, 2**24)
    ours = float(prof.curves[0].epsilon(np.array([1e-5]))[0])
    assert abs(ours - est) <= 2e-3
    assert lo <= ours <= up


def test_add_ordering_through_prv_accountant() -> None:
    """The add-ordering PRV run through prv-accountant's own composer matches
    dp-accounting's ADD PMF; the full prv-accountant path matches the fast one."""
    from prv_accountant import PRVAccountant

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv = PRVAccountant(
            prvs=[prv_add_ordering(1 / 16, 0.8)],
            max_self_compositions=[100],
            eps_error=0.05,
            delta_error=1e-8,
        )
        lo, est, up = prv.compute_epsilon(1e-5, [100])
    pld = dp_pld.from_gaussian_mechanism(
        0.8, sensitivity=1.0, sampling_prob=1 / 16, value_discretization_interval=VDI
    ).self_compose(100)
    ref_add = pld._pmf_add.get_epsilon_for_delta(1e-5)
    assert abs(est - ref_add) <= 2e-3 and lo <= ref_add <= up
    events = [ev(1.0, 0.05, 60), ev(2.0, 1.0, 2)]
    slow = epsilon_prv_accountant(events, 1e-5, eps_error=0.1)
    fast = composed([(1.0, 0.05, 60), (2.0, 1.0, 2)]).epsilon_bound(1e-5)
    assert abs(slow.estimate - fast.estimate) <= 2e-3
    assert slow.lower <= fast.estimate <= slow.upper


def test_heterogeneous_ledger() -> None:
    events = [(1.0, 0.01, 500), (0.8, 0.02, 300), (1.5, 1.0, 3), (1.0, 0.01, 100)]
    ref = dp_ref_eps(events, 1e-5)
    b = composed(events).epsilon_bound(1e-5)
    assert ref - 1e-3 <= b.upper <= ref + EPS_ERROR + 5e-3
    assert b.lower <= ref + 1e-3
    assert abs(b.estimate - ref) <= 5e-3


def test_many_distinct_events_are_bucketed_conservatively(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond _MAX_GROUPS distinct (sigma, q) the ledger is rounded on a log grid
    (sigma down, q up for the upper bound; the reverse for the lower): still valid."""
    monkeypatch.setattr(composition, "_MAX_GROUPS", 4)
    events = [(1.0 + 2e-4 * k, 0.01 * (1.0 - 2e-4 * k), 50) for k in range(12)]
    ref = dp_ref_eps(events, 1e-5, vdi=1e-3)
    b = composed(events).epsilon_bound(1e-5)
    assert b.lower <= ref + 1e-3
    assert b.upper >= ref - 1e-3
    assert b.upper <= ref + EPS_ERROR + 0.02


# --------------------------------------------------------------------------- #
# properties
# --------------------------------------------------------------------------- #


def test_empty_ledger_is_zero() -> None:
    acc = FDPAccountant()
    assert acc.epsilon(1e-5) == 0.0
    assert acc.epsilon(1e-5, "replacement") == 0.0
    assert acc.epsilon_bound(1e-5) == EpsilonBound(0.0, 0.0, 0.0, 1e-5, Relation.ADD_REMOVE)
    _, b = tradeoff_curve(acc, np.array([0.0, 0.3, 1.0]))
    np.testing.assert_allclose(b, [1.0, 0.7, 0.0])
    assert attribute_inference_bound(acc, 0.2) == pytest.approx(0.2)


def test_monotone_in_sigma_q_rounds() -> None:
    eps_sigma = [epsilon_for(s, 0.01, 1000, 1e-5).upper for s in (0.7, 0.9, 1.2, 2.0)]
    assert all(a > b for a, b in itertools.pairwise(eps_sigma))
    eps_q = [epsilon_for(1.0, q, 1000, 1e-5).upper for q in (0.002, 0.01, 0.05, 0.3)]
    assert all(a < b for a, b in itertools.pairwise(eps_q))
    eps_t = [epsilon_for(1.0, 0.01, t, 1e-5).upper for t in (10, 100, 1000, 5000)]
    assert all(a < b for a, b in itertools.pairwise(eps_t))
    eps_d = [epsilon_for(1.0, 0.01, 1000, d).upper for d in (1e-8, 1e-6, 1e-4)]
    assert all(a > b for a, b in itertools.pairwise(eps_d))


def test_one_by_one_equals_count() -> None:
    a = FDPAccountant()
    for _ in range(7):
        a.compose(SubsampledGaussian(1.0, 0.05))
    b = FDPAccountant()
    b.compose(SubsampledGaussian(1.0, 0.05), 7)
    assert a.ledger == b.ledger == (ev(1.0, 0.05, 7),)
    assert a.epsilon(1e-5) == b.epsilon(1e-5)
    # order of distinct events does not matter either
    c = composed([(1.0, 0.05, 3), (2.0, 0.1, 2), (1.0, 0.05, 4)])
    d = composed([(2.0, 0.1, 2), (1.0, 0.05, 7)])
    assert len(c.ledger) == 3
    assert c.epsilon(1e-5) == pytest.approx(d.epsilon(1e-5), abs=1e-12)


def test_would_exceed_does_not_mutate() -> None:
    acc = composed([(1.0, 0.01, 500)])
    before = (acc.ledger, acc.state_dict(), acc.epsilon(1e-5))
    after_one = composed([(1.0, 0.01, 501)]).epsilon(1e-5)
    assert acc.would_exceed(SubsampledGaussian(1.0, 0.01), max_epsilon=before[2] + 1e-9, delta=1e-5) is True
    assert acc.would_exceed(SubsampledGaussian(1.0, 0.01), max_epsilon=after_one + 1e-9, delta=1e-5) is False
    assert acc.would_exceed(SubsampledGaussian(1.0, 0.01), max_epsilon=after_one - 1e-6, delta=1e-5) is True
    assert (acc.ledger, acc.state_dict(), acc.epsilon(1e-5)) == before


def test_spend_and_budget_exhausted() -> None:
    acc = composed([(1.0, 0.01, 500)])
    spent = acc.epsilon(1e-5)
    new = acc.spend(SubsampledGaussian(1.0, 0.01), max_epsilon=100.0, delta=1e-5)
    assert acc.rounds == 501 and new > spent
    ledger = acc.ledger
    with pytest.raises(PrivacyBudgetExhausted) as info:
        acc.spend(SubsampledGaussian(1.0, 0.01), 50, max_epsilon=new, delta=1e-5)
    err = info.value
    assert acc.ledger == ledger
    assert err.epsilon_spent == pytest.approx(new)
    assert err.max_epsilon == new and err.delta == 1e-5
    assert err.epsilon_requested is not None and err.epsilon_requested > new
    assert "epsilon_spent" in str(err) and "max_epsilon" in str(err) and "delta" in str(err)
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.epsilon_spent, clone.max_epsilon, clone.delta) == (
        err.epsilon_spent,
        err.max_epsilon,
        err.delta,
    )
    # the positional form used by callers
    e2 = PrivacyBudgetExhausted(1.5, 1.0, 1e-5)
    assert isinstance(e2, RuntimeError) and "1.5" in str(e2)


def test_state_dict_round_trip() -> None:
    acc = composed([(1.0, 0.01, 500), (0.8, 1.0, 2), (1.0, 0.01, 3)], eps_error=0.03)
    state = json.loads(json.dumps(acc.state_dict()))
    other = FDPAccountant(eps_error=0.03)
    other.load_state_dict(state)
    assert other.ledger == acc.ledger
    assert other.epsilon(1e-5) == acc.epsilon(1e-5)
    other.compose(SubsampledGaussian(1.0, 0.01))  # resuming continues the ledger
    assert other.rounds == acc.rounds + 1


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"ledger": []},
        {"version": 99, "ledger": []},
        {"version": 1, "ledger": {}},
        {"version": 1, "ledger": [{"noise_multiplier": -1.0, "sampling_rate": 0.1, "count": 1}]},
        {"version": 1, "ledger": [{"noise_multiplier": 1.0, "sampling_rate": 1.5, "count": 1}]},
        {"version": 1, "ledger": [{"noise_multiplier": 1.0, "sampling_rate": 0.1, "count": 0}]},
        {"version": 1, "ledger": [{"noise_multiplier": 1.0, "sampling_rate": 0.1}]},
        {"version": 1, "ledger": [[1.0, 0.1, 1]]},
        {"version": 1, "ledger": [], "extra": 1},
        {"version": 1, "ledger": [], "eps_error": "x"},
    ],
)
def test_load_state_dict_refuses_malformed(bad: object) -> None:
    acc = composed([(1.0, 0.01, 5)])
    ledger = acc.ledger
    with pytest.raises(ValueError, match=r"state"):
        acc.load_state_dict(bad)  # type: ignore[arg-type]
    assert acc.ledger == ledger


def test_replacement_gaussian_matches_prop1() -> None:
    """q = 1: the best (2 eps_i, delta_i (1 + e^eps_i)) pair, searched independently."""
    mu = math.sqrt(10) / 2.0
    delta_r = 1e-5
    best = math.inf
    for d in np.geomspace(delta_r * 1e-8, delta_r / 2, 3000):
        e = gaussian_eps_ref(mu, float(d))
        if d * (1 + math.exp(e)) <= delta_r:
            best = min(best, 2 * e)
    b = epsilon_for(2.0, 1.0, 10, delta_r, relation="replacement")
    assert b.relation == "replacement"
    assert best - 0.01 <= b.upper <= best + 0.01


@pytest.mark.parametrize(("sigma", "q", "rounds"), [(1.0, 0.01, 1000), (5.0, 0.1, 100)])
def test_replacement_against_reference(sigma: float, q: float, rounds: int) -> None:
    """Prop. 1 conversion on dp-accounting's curve (vdi 1e-3), searched independently."""
    delta_r = 1e-5
    pld = dp_pld.from_gaussian_mechanism(
        sigma, sensitivity=1.0, sampling_prob=q, value_discretization_interval=1e-3
    ).self_compose(rounds)
    best = math.inf
    for d in np.geomspace(delta_r * 1e-5, delta_r / 2, 60):
        e = pld.get_epsilon_for_delta(float(d))
        if d * (1 + math.exp(e)) <= delta_r:
            best = min(best, 2 * e)
    acc = composed([(sigma, q, rounds)])
    rep = acc.epsilon_bound(delta_r, "replacement")
    assert rep.upper >= best - 0.02
    assert rep.upper <= best + 2 * EPS_ERROR + 0.02
    assert rep.upper >= acc.epsilon(delta_r)
    assert rep.lower <= rep.estimate <= rep.upper


def test_replacement_at_least_add_remove_and_finite() -> None:
    for events in ([(0.6, 0.01, 3000)], [(1.0, 0.001, 100)], [(0.8, 1 / 16, 10_000)]):
        acc = composed(events)
        rep = acc.epsilon(1e-5, "replacement")
        assert math.isfinite(rep)
        assert rep >= acc.epsilon(1e-5)


def test_calibrate_never_overshoots() -> None:
    for target, q, rounds, delta in [
        (1.0, 0.01, 1000, 1e-5),
        (4.0, 0.05, 300, 1e-5),
        (8.0, 1 / 16, 2000, 1e-6),
        (2.0, 1.0, 50, 1e-5),
    ]:
        sigma = cal(target, q, rounds, delta)
        eps = epsilon_for(sigma, q, rounds, delta).upper
        assert target - 0.1 <= eps <= target
        # a clearly smaller sigma overshoots: the answer is (near) the smallest
        assert epsilon_for(sigma * 0.99, q, rounds, delta).upper > target


def test_calibrate_replacement_and_unreachable() -> None:
    sigma = cal(3.0, 0.02, 50, 1e-5, relation="replacement", rtol=0.1)
    assert epsilon_for(sigma, 0.02, 50, 1e-5, relation="replacement").upper <= 3.0
    with pytest.raises(ValueError, match="unreachable"):
        cal(0.5, 0.5, 1000, 1e-5, max_noise_multiplier=2.0)


def test_tradeoff_gaussian_exact() -> None:
    mu = math.sqrt(20) / 4.0
    alphas = np.linspace(0.0, 1.0, 51)
    _, b = tradeoff_curve(composed([(4.0, 1.0, 20)]), alphas)
    with np.errstate(divide="ignore"):
        ref = special.ndtr(special.ndtri(1 - alphas) - mu)
    np.testing.assert_allclose(b, ref, atol=1e-9)


def test_tradeoff_subsampled_against_reference() -> None:
    """Lines ``1 - delta_ref(eps) - e^eps alpha`` from dp-accounting (vdi 1e-3, both
    orderings) give a reference curve; ours must be below it and not far below."""
    pld = dp_pld.from_gaussian_mechanism(
        1.0, sensitivity=1.0, sampling_prob=0.05, value_discretization_interval=1e-3
    ).self_compose(100)
    eps_grid = np.linspace(-3.0, 10.0, 400)
    d_ref = np.asarray(pld.get_delta_for_epsilon(eps_grid))
    alphas = np.concatenate([np.geomspace(1e-5, 1e-2, 30), np.linspace(0.02, 1.0, 50)])
    lines = 1 - d_ref[None, :] - np.exp(eps_grid)[None, :] * alphas[:, None]
    f_ref = np.maximum(0.0, lines.max(axis=1))
    a, b = tradeoff_curve([ev(1.0, 0.05, 100)], alphas)
    np.testing.assert_array_equal(a, alphas)
    assert np.all(b <= f_ref + 2e-3)
    assert np.all(b >= f_ref - 0.06)
    assert np.all(b <= 1 - alphas + 1e-12) and np.all(b >= 0)
    assert np.all(np.diff(b) <= 1e-12)  # non-increasing


def test_attribute_inference_bound() -> None:
    balls = [0.0, 0.01, 0.1, 0.5, 1.0]
    weak = composed([(1.0, 0.05, 30)])
    strong = composed([(1.0, 0.05, 300)])
    for ball in balls:
        lo = attribute_inference_bound(weak, ball)
        hi = attribute_inference_bound(strong, ball)
        assert ball - 1e-12 <= lo <= 1.0 and ball - 1e-12 <= hi <= 1.0
        assert hi >= lo - 1e-12
    assert attribute_inference_bound(strong, 0.1) > attribute_inference_bound(weak, 0.1) + 0.01
    # q = 1: exactly 1 - G_mu(ball)
    mu = 1.0
    ref = 1 - special.ndtr(special.ndtri(1 - 0.2) - mu)
    assert attribute_inference_bound([ev(1.0, 1.0)], 0.2) == pytest.approx(ref, abs=1e-9)


def test_tradeoff_files(tmp_path) -> None:
    acc = composed([(1.0, 0.05, 50)])
    csv_path = tmp_path / "f.csv"
    save_tradeoff_csv(csv_path, acc, np.array([0.0, 0.5, 1.0]))
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "alpha,beta" and len(lines) == 4
    assert float(lines[3].split(",")[1]) == 0.0
    png = tmp_path / "f.png"
    plot_tradeoff(png, acc, title="test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_renyi_moments_match_prv_accountant() -> None:
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    for sigma, q in [(0.8, 1 / 16), (2.0, 0.01), (0.5, 0.5)]:
        ours = log_moments(sigma, q)
        prv = PoissonSubsampledGaussianMechanism(q, sigma)
        for i in range(0, len(RDP_ORDERS), 7):
            alpha = float(RDP_ORDERS[i])
            ref = prv.rdp(alpha) * (alpha - 1)
            if math.isfinite(ref) and ref < 1e4:
                assert ours[i] == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_add_ordering_renyi_is_dominated() -> None:
    """The assumption behind the shared tail bounds and the RDP cap (Mironov, Talwar &
    Zhang 2019): D_a(P || Q) <= D_a(Q || P) for P = N(0, s^2), Q = (1-q) P + q N(1, s^2).
    Checked here by independent quadrature."""
    for sigma, q in [(0.5, 0.01), (0.8, 1 / 16), (1.0, 0.5), (2.0, 0.9), (0.3, 0.2)]:
        w = np.arange(-20 * sigma - 2, 80 + 20 * sigma, sigma / 50)
        log_p = -0.5 * (w / sigma) ** 2
        log_q = np.logaddexp(np.log1p(-q) + log_p, np.log(q) - 0.5 * ((w - 1) / sigma) ** 2)
        for a in (1.5, 2.0, 5.0, 20.0):
            d_pq = special.logsumexp(a * log_p + (1 - a) * log_q)
            d_qp = special.logsumexp(a * log_q + (1 - a) * log_p)
            assert d_pq <= d_qp + 1e-9


def _global_mt19937_key() -> np.ndarray:
    """The key of numpy's global MT19937 generator (its legacy state's second item)."""
    state = np.random.get_state(legacy=True)
    assert isinstance(state, tuple), type(state)
    return state[1]


def test_no_global_rng_and_no_flwr() -> None:
    np_state = _global_mt19937_key().copy()
    py_state = random.getstate()
    epsilon_for(1.0, 0.01, 100, 1e-5)
    tradeoff_curve([ev(1.0, 0.01, 100)])
    assert np.array_equal(_global_mt19937_key(), np_state)
    assert random.getstate() == py_state
    code = "import sys, fedfdp.accounting; assert 'flwr' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- #
# validation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((-1.0, 0.1), "noise_multiplier=-1.0"),
        ((0.0, 0.1), "noise_multiplier=0.0"),
        ((float("inf"), 0.1), "noise_multiplier=inf"),
        ((float("nan"), 0.1), "noise_multiplier=nan"),
        (("1", 0.1), "noise_multiplier='1'"),
        ((1.0, 1.5), "sampling_rate=1.5"),
        ((1.0, 0.0), "sampling_rate=0.0"),
        ((1.0, -0.1), "sampling_rate=-0.1"),
        ((1.0, 0.1, 0), "count=0"),
        ((1.0, 0.1, 1.5), "count=1.5"),
        ((1.0, 0.1, True), "count=True"),
    ],
)
def test_event_validation(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        ev(*args)
    with pytest.raises(ValueError, match=needle):
        FDPAccountant().compose(SubsampledGaussian(*args[:2]), *args[2:])


def test_input_validation() -> None:
    acc = composed([(1.0, 0.01, 10)])
    for delta in (0.0, 1.0, -1e-5, float("nan"), 2.0):
        with pytest.raises(ValueError, match="delta="):
            acc.epsilon(delta)
    with pytest.raises(ValueError, match="relation='foo'"):
        acc.epsilon(1e-5, relation="foo")
    with pytest.raises(ValueError, match="relation='replace'"):
        acc.would_exceed(SubsampledGaussian(1.0, 0.1), max_epsilon=1.0, delta=1e-5, relation="replace")
    knobs: list[tuple[AccountantKnobs, str]] = [
        ({"eps_error": 0.0}, "eps_error=0.0"),
        ({"eps_error": 2.0}, "eps_error=2.0"),
        ({"delta_error": 0.5}, "delta_error=0.5"),
        ({"max_grid_points": 10}, "max_grid_points=10"),
    ]
    for kw, needle in knobs:
        with pytest.raises(ValueError, match=needle):
            FDPAccountant(**kw)
    with pytest.raises(ValueError, match="max_epsilon=-1.0"):
        acc.would_exceed(SubsampledGaussian(1.0, 0.1), max_epsilon=-1.0, delta=1e-5)
    with pytest.raises(ValueError, match="sampling_rate=1.5"):
        acc.would_exceed(SubsampledGaussian(1.0, 1.5), max_epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="rounds=0"):
        epsilon_for(1.0, 0.1, 0, 1e-5)
    with pytest.raises(ValueError, match="target_epsilon=-1.0"):
        cal(-1.0, 0.1, 10, 1e-5)
    with pytest.raises(ValueError, match="sampling_rate=1.5"):
        cal(1.0, 1.5, 10, 1e-5)
    with pytest.raises(ValueError, match="ball=1.5"):
        attribute_inference_bound(acc, 1.5)
    with pytest.raises(ValueError, match="alphas"):
        tradeoff_curve(acc, np.array([0.1, 1.2]))
    with pytest.raises(ValueError, match="ledger"):
        tradeoff_curve(["not an event"])
    assert len(acc.ledger) == 1



# --------------------------------------------------------------------------- #
# participation: Poisson device sampling, the device draw known to the adversary
# --------------------------------------------------------------------------- #

PARTICIPATION = [
    # (sigma, q, p, rounds, delta, dp-accounting discretisation of the reference)
    (1.34, 0.05, 0.2, 150, 1.5e-4, VDI),  # the default fleet's sigma with p = 0.2
    (0.8, 0.1, 0.5, 300, 1e-5, 1e-3),
    (2.0, 0.01, 0.05, 1000, 1e-6, VDI),
]


@pytest.mark.parametrize(("sigma", "q", "p", "rounds", "delta", "vdi"), PARTICIPATION)
def test_participation_against_binomial_reference(
    sigma: float, q: float, p: float, rounds: int, delta: float, vdi: float
) -> None:
    ref = participation_eps_ref(sigma, q, p, rounds, delta, vdi)
    b = epsilon_for(sigma, q, rounds, delta, participation=p)
    assert b.upper >= ref - 1e-6
    assert abs(b.estimate - ref) <= 0.02
    assert b.lower <= ref + 1e-3
    assert b.upper <= ref + EPS_ERROR + 5e-3
    # p q treats the device draw as secret: not valid, and strictly below the exact value
    assert epsilon_for(sigma, q * p, rounds, delta).upper < ref
    assert b.upper <= epsilon_for(sigma, q, rounds, delta).upper


@pytest.mark.parametrize(("sigma", "p", "rounds", "delta"), [(2.0, 0.3, 50, 1.5e-4), (5.0, 0.1, 400, 1e-6)])
def test_participation_gaussian_rounds(sigma: float, p: float, rounds: int, delta: float) -> None:
    """q = 1 with p < 1 is a mixture of Gaussian mechanisms, not one: no closed form in
    the accountant, the binomial mixture of closed forms as the reference."""
    ref = participation_gaussian_eps_ref(sigma, p, rounds, delta)
    b = epsilon_for(sigma, 1.0, rounds, delta, participation=p)
    assert ref - 1e-6 <= b.upper <= ref + EPS_ERROR + 5e-3
    assert abs(b.estimate - ref) <= 5e-3 and b.lower <= ref
    assert b.upper < epsilon_for(sigma, 1.0, rounds, delta).upper


def test_participation_properties() -> None:
    sigma, q, rounds, delta = 1.0, 0.05, 200, 1e-5
    eps_p = [epsilon_for(sigma, q, rounds, delta, participation=p).upper for p in (0.05, 0.2, 0.5, 1.0)]
    assert all(a < b for a, b in itertools.pairwise(eps_p))
    for p in (0.05, 0.2, 0.5):
        mixture = epsilon_for(sigma, q, rounds, delta, participation=p)
        secret_draw = epsilon_for(sigma, p * q, rounds, delta)  # the mixture without the label
        assert mixture.estimate >= secret_draw.estimate
        assert mixture.upper >= secret_draw.upper
    # participation 1 is the plain event, bit for bit
    a = FDPAccountant()
    a.compose(SubsampledGaussian(1.0, 0.05, 1.0), 10)
    assert a.ledger == (ev(1.0, 0.05, 10),)
    assert a.epsilon(1e-5) == epsilon_for(1.0, 0.05, 10, 1e-5).upper


def test_participation_ledger_and_state() -> None:
    acc = FDPAccountant()
    acc.compose(SubsampledGaussian(1.0, 0.05, 0.2), 3)
    acc.compose(SubsampledGaussian(1.0, 0.05, 0.2), 2)  # merges
    acc.compose(SubsampledGaussian(1.0, 0.05), 1)  # does not
    assert acc.ledger == (ev(1.0, 0.05, 5, 0.2), ev(1.0, 0.05, 1))
    state = json.loads(json.dumps(acc.state_dict()))
    assert state["version"] == 3
    assert state["ledger"][0] == {
        "event": {"kind": "subsampled-gaussian", "noise_multiplier": 1.0, "sampling_rate": 0.05,
                  "participation": 0.2},
        "count": 5,
    }
    other = FDPAccountant()
    other.load_state_dict(state)
    assert other.ledger == acc.ledger and other.epsilon(1e-5) == acc.epsilon(1e-5)
    # a version-1 state (no participation) loads with participation 1
    old = {"version": 1, "ledger": [{"noise_multiplier": 1.0, "sampling_rate": 0.05, "count": 4}]}
    other.load_state_dict(old)
    assert other.ledger == (ev(1.0, 0.05, 4, 1.0),)
    for bad in (
        {"version": 1, "ledger": [{"noise_multiplier": 1.0, "sampling_rate": 0.05, "count": 4,
                                   "participation": 0.5}]},
        {"version": 2, "ledger": [{"noise_multiplier": 1.0, "sampling_rate": 0.05, "count": 4}]},
        {"version": 2, "ledger": [{"noise_multiplier": 1.0, "sampling_rate": 0.05, "count": 4,
                                   "participation": 0.0}]},
        {"version": [2], "ledger": []},
    ):
        with pytest.raises(ValueError, match="state"):
            other.load_state_dict(bad)
    # budget checks carry the participation
    assert acc.would_exceed(SubsampledGaussian(1.0, 0.05, 0.2), max_epsilon=100.0, delta=1e-5) is False
    spent = acc.spend(SubsampledGaussian(1.0, 0.05, 0.2), max_epsilon=100.0, delta=1e-5)
    assert acc.ledger[-1] == ev(1.0, 0.05, 1, 0.2) and spent == acc.epsilon(1e-5)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), "0.5", True])
def test_participation_validation(bad: object) -> None:
    with pytest.raises(ValueError, match="participation="):
        ev(1.0, 0.1, 1, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="participation="):
        FDPAccountant().compose(SubsampledGaussian(1.0, 0.1, bad))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="participation="):
        cal(1.0, 0.1, 10, 1e-5, participation=bad)  # type: ignore[arg-type]


def test_participation_calibration() -> None:
    sigma = cal(2.0, 0.05, 150, 1.5e-4, participation=0.2)
    eps = epsilon_for(sigma, 0.05, 150, 1.5e-4, participation=0.2).upper
    assert 1.9 <= eps <= 2.0
    assert epsilon_for(sigma * 0.99, 0.05, 150, 1.5e-4, participation=0.2).upper > 2.0
    assert participation_eps_ref(sigma, 0.05, 0.2, 150, 1.5e-4) <= 2.0
    assert sigma < cal(2.0, 0.05, 150, 1.5e-4)  # p < 1 needs less noise


def test_participation_discrete_mean_is_exact() -> None:
    """The zero-loss atom sits on the grid and one shift serves the mixture: the
    discrete mean is p times the (independently integrated) mean of the loss, i.e.
    p KL(Q || P) for remove and p KL(P || Q) for add."""
    from scipy import integrate

    from fedfdp.accounting.prv import discretise

    sigma, q, p = 1.0, 0.1, 0.3

    def log_q_over_p(w: float) -> float:
        return math.log1p(-q + q * math.exp((2 * w - 1) / (2 * sigma**2)))

    def dens(w: float, m: float) -> float:
        return math.exp(-0.5 * ((w - m) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))

    kl_qp = integrate.quad(
        lambda w: ((1 - q) * dens(w, 0) + q * dens(w, 1)) * log_q_over_p(w), -30, 30, limit=200
    )[0]
    kl_pq = integrate.quad(lambda w: -dens(w, 0) * log_q_over_p(w), -30, 30, limit=200)[0]
    for direction, mean in (("remove", p * kl_qp), ("add", p * kl_pq)):
        k0, pmf, shift = discretise(sigma, q, direction, 1e-3, 1e-12, p)
        values = (k0 + np.arange(len(pmf))) * 1e-3 + shift
        assert abs(float(pmf.sum()) - 1.0) <= 1e-12
        assert abs(float(np.dot(pmf, values)) - mean) <= 1e-9
        assert abs(shift) < 0.5e-3
        assert pmf[-k0] >= 1 - p  # the atom, in the cell of k = 0


def test_participation_tradeoff_and_theorem4() -> None:
    """The trade-off curve of a mixture ledger lies below the curve built from the
    binomial reference's delta (both orderings), and not far below."""
    sigma, q, p, rounds = 1.0, 0.05, 0.3, 60
    dref = participation_delta_ref(sigma, q, p, rounds, vdi=1e-3)
    eps_grid = np.linspace(-3.0, 8.0, 221)
    d_ref = np.array([dref(float(e)) for e in eps_grid])
    alphas = np.concatenate([np.geomspace(1e-4, 1e-2, 10), np.linspace(0.02, 1.0, 30)])
    f_ref = np.maximum(0.0, (1 - d_ref[None, :] - np.exp(eps_grid)[None, :] * alphas[:, None]).max(axis=1))
    _, b = tradeoff_curve([ev(sigma, q, rounds, p)], alphas)
    assert np.all(b <= f_ref + 2e-3)
    assert np.all(b >= f_ref - 0.06)
    bound = attribute_inference_bound([ev(sigma, q, rounds, p)], 0.2)
    assert 0.2 <= bound < attribute_inference_bound([ev(sigma, q, rounds)], 0.2)


def test_participation_replacement_and_prv_accountant() -> None:
    entry = ev(1.34, 0.05, 150, 0.2)
    acc = FDPAccountant()
    acc.compose(SubsampledGaussian(1.34, 0.05, 0.2), 150)
    rep = acc.epsilon_bound(1.5e-4, "replacement")
    assert math.isfinite(rep.upper) and rep.upper >= acc.epsilon(1.5e-4)
    assert rep.upper < epsilon_for(1.34, 0.05, 150, 1.5e-4, "replacement").upper
    slow = epsilon_prv_accountant([entry], 1.5e-4)
    fast = acc.epsilon_bound(1.5e-4)
    assert slow.lower <= fast.estimate <= slow.upper
    assert abs(slow.estimate - fast.estimate) <= 5e-3


def test_participation_renyi_bounds_are_valid() -> None:
    """The RDP cap and Chernoff window use p A_a + 1 - p; the RDP epsilon must stay
    above the reference."""
    from fedfdp.accounting.prv import Group, rdp_epsilon

    ref = participation_eps_ref(1.34, 0.05, 0.2, 150, 1.5e-4)
    rdp = rdp_epsilon((Group(1.34, 0.05, 150, 0.2),), 1.5e-4)
    assert ref <= rdp <= rdp_epsilon((Group(1.34, 0.05, 150),), 1.5e-4)


def test_participation_bucketed_conservatively(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond _MAX_GROUPS distinct (sigma, q, p) the participation is rounded up for
    the upper bound and down for the lower bound."""
    monkeypatch.setattr(composition, "_MAX_GROUPS", 2)
    composition._profile.cache_clear()
    ps = [0.2 * (1.0 - 3e-4 * k) for k in range(6)]
    events = [ev(1.34, 0.05, 25, p) for p in ps]
    b = FDPAccountant()
    for e in events:
        b.compose(e.event, e.count)
    bound = b.epsilon_bound(1.5e-4)
    assert bound.upper >= participation_eps_ref(1.34, 0.05, max(ps), 150, 1.5e-4, 1e-3) - 1e-6
    assert bound.lower <= participation_eps_ref(1.34, 0.05, min(ps), 150, 1.5e-4, 1e-3) + 1e-3
    composition._profile.cache_clear()


# --------------------------------------------------------------------------- #
# bounded memory for every input
# --------------------------------------------------------------------------- #


def test_integer_moments_bound_the_quadrature() -> None:
    """The closed form used for small sigma: exact at integer orders, above the
    quadrature (convexity) in between."""
    from fedfdp.accounting.prv import log_moments_integer

    for sigma, q in [(0.5, 0.1), (0.3, 0.01), (1.0, 0.5)]:
        quad = log_moments(sigma, q)
        closed = log_moments_integer(sigma, q)
        integer = np.round(RDP_ORDERS) == RDP_ORDERS
        finite = np.isfinite(quad) & (quad < 1e4)
        np.testing.assert_allclose(closed[integer & finite], quad[integer & finite], rtol=1e-8, atol=1e-12)
        assert np.all(closed[finite] >= quad[finite] - 1e-9 * (1 + np.abs(quad[finite])))


def test_coarsened_mesh_stays_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger too large for the memory limit is composed on a coarser mesh: a wider
    interval that still contains the reference."""
    monkeypatch.setattr(composition, "_MAX_POINTS", 2**14)
    composition._profile.cache_clear()
    ref = dp_ref_eps([(0.8, 1 / 16, 1000)], 1e-5)
    b = epsilon_for(0.8, 1 / 16, 1000, 1e-5)
    composition._profile.cache_clear()
    assert b.upper - b.estimate > EPS_ERROR  # coarsened
    assert b.lower <= ref + 1e-3 <= b.upper + 1e-3 + (b.upper - ref)
    assert ref - 1e-3 <= b.upper <= ref + 1.0


_MEMORY_SCRIPT = r"""
import json, math, resource, sys, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
tracemalloc.start()
from fedfdp.accounting import (FDPAccountant, Repeated, SubsampledGaussian, attribute_inference_bound,
                               calibrate_noise_multiplier, epsilon_for, tradeoff_curve)
def ev(sigma, q, count=1, p=1.0):
    return Repeated(SubsampledGaussian(sigma, q, p), count)
def cal(target, q, rounds, delta, **kw):
    return calibrate_noise_multiplier(target_epsilon=target, sampling_rate=q, rounds=rounds, delta=delta,
                                      **kw)
from fedfdp.accounting.composition import MEMORY_LIMIT_BYTES
out = {}
def f(x):
    return x if math.isfinite(x) else None
out["tiny_sigma"] = f(epsilon_for(1e-3, 0.05, 150, 1e-5).upper)
out["tiny_sigma_replacement"] = f(epsilon_for(1e-3, 0.05, 150, 1e-5, "replacement").upper)
out["huge_target_sigma"] = cal(1e12, 0.05, 150, 1e-5)
out["huge_target_sigma_p"] = cal(1e12, 0.05, 150, 1e-5, participation=0.3)
out["tiny_delta"] = f(epsilon_for(0.8, 0.05, 150, 1e-300).upper)
out["tiny_delta_replacement"] = f(epsilon_for(0.8, 0.05, 150, 5e-324, "replacement").upper)
out["many_rounds"] = f(epsilon_for(1.0, 0.05, 10**15, 1e-5).upper)
out["tiny_rate"] = f(epsilon_for(1.0, 1e-300, 150, 1e-5).upper)
out["no_noise_gaussian"] = f(epsilon_for(1e-300, 1.0, 150, 1e-5).upper)
out["huge_noise"] = f(epsilon_for(1e300, 0.05, 150, 1e-5).upper)
out["tiny_sigma_ball"] = attribute_inference_bound([ev(1e-3, 0.05, 150)], 0.1)
out["fine_mesh"] = f(epsilon_for(1.0, 0.05, 150, 1e-5, eps_error=1e-3).upper)
out["fine_mesh_estimate"] = epsilon_for(1.0, 0.05, 150, 1e-5, eps_error=1e-3).estimate
big = epsilon_for(0.1, 1e-3, 1000, 1e-5, eps_error=0.004)  # full-length FFT at the limit
out["big_window"] = [big.lower, big.estimate, big.upper]
out["peak_bytes"] = tracemalloc.get_traced_memory()[1]
out["limit_bytes"] = MEMORY_LIMIT_BYTES
print(json.dumps(out))
"""


def test_pathological_inputs_bounded_memory() -> None:
    """Inputs that used to exhaust memory (tiny sigma: >4 GB; an enormous calibration
    target: ~23 GB) or raise (delta = 1e-300) now answer valid bounds inside a 3 GiB
    address space, with the traced peak below MEMORY_LIMIT_BYTES (their time:
    ``benchmarks/accounting.py``)."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert r["peak_bytes"] <= r["limit_bytes"]
    # valid: epsilon is monotone (decreasing in sigma and delta, increasing in rounds),
    # so each answer must be above an independent reference at a milder setting
    assert r["tiny_sigma"] >= dp_ref_eps([(0.3, 0.05, 150)], 1e-5)
    assert r["tiny_sigma_replacement"] >= r["tiny_sigma"]
    assert r["tiny_delta"] >= dp_ref_eps([(0.8, 0.05, 150)], 1e-12, vdi=1e-3)
    assert r["tiny_delta_replacement"] >= r["tiny_delta"]
    assert r["many_rounds"] >= dp_ref_eps([(1.0, 0.05, 10_000)], 1e-5, vdi=1e-3)
    assert r["tiny_rate"] == 0.0  # a record is touched with probability ~1e-298 < delta
    assert r["no_noise_gaussian"] is None  # sigma^2 underflows: epsilon beyond the float range
    assert 0.0 <= r["huge_noise"] <= EPS_ERROR
    assert 0.1 <= r["tiny_sigma_ball"] <= 1.0
    # the calibrated sigma for an enormous target is the search floor, and meets it
    assert r["huge_target_sigma"] == r["huge_target_sigma_p"] == 2.0**-10
    ref = dp_ref_eps([(1.0, 0.05, 150)], 1e-5)
    assert ref - 1e-6 <= r["fine_mesh"] <= ref + 2e-3
    assert abs(r["fine_mesh_estimate"] - ref) <= 1e-3
    lo, est, up = r["big_window"]
    ref = dp_ref_eps([(0.1, 1e-3, 1000)], 1e-5, vdi=1e-2)
    assert lo <= ref + 1e-3 and up >= ref - 0.02 and abs(est - ref) <= 0.05


def test_thresholded_histograms_compose_with_subsampled_rounds_at_delta_minus_their_delta() -> None:
    """Released categories (ThresholdedHistogram) composed with training rounds: the upper
    epsilon at delta is dp-accounting's PLD of the Gaussian parts at delta - sum -ln(1 - d_t),
    d_t from the normal tail at the event's own threshold (scipy), within the usual tolerances;
    and strictly more than the same ledger with the thresholds' delta ignored."""
    from fedfdp.accounting.events import ThresholdedHistogram

    delta = 1e-5
    histogram = ThresholdedHistogram(4.0, 1e-6)
    rounds = SubsampledGaussian(1.0, 0.05)
    acc, plain = FDPAccountant(eps_error=EPS_ERROR), FDPAccountant(eps_error=EPS_ERROR)
    acc.compose(histogram, 2)
    acc.compose(rounds, 100)
    plain.compose(histogram.gaussian(), 2)
    plain.compose(rounds, 100)
    d_t = float(special.ndtr(-(histogram.threshold() - 1.0) / histogram.noise_multiplier))
    assert d_t == pytest.approx(1e-6, rel=1e-6)
    ref = dp_ref_eps([(4.0, 1.0, 2), (1.0, 0.05, 100)], delta - 2 * -math.log1p(-d_t))
    b = acc.epsilon_bound(delta)
    assert ref - 1e-3 <= b.upper <= ref + EPS_ERROR + 5e-3
    assert b.upper > plain.epsilon(delta)
    assert b.lower <= dp_ref_eps([(4.0, 1.0, 2), (1.0, 0.05, 100)], delta) + 1e-3


@pytest.mark.parametrize("ball", [0.05, 0.3, 0.6])
def test_attack_bound_with_a_thresholded_histogram_moves_up_by_the_thresholds_delta(ball):
    """Theorem 4's bound for one thresholded histogram (sigma 2, delta_t 1e-3; q = 1) is
    1 - (G_mu(Ball) - (-ln(1 - delta_t))) with mu = 1/sigma, the Gaussian trade-off from
    scipy directly: the thresholds lower every hockey-stick line of f by their delta."""
    from scipy.stats import norm

    from fedfdp.accounting.events import ThresholdedHistogram
    from fedfdp.accounting.tradeoff import attribute_inference_bound

    acc = FDPAccountant()
    acc.compose(ThresholdedHistogram(2.0, 1e-3))
    reference = 1.0 - max(0.0, norm.cdf(norm.ppf(1.0 - ball) - 0.5) + np.log1p(-1e-3))
    assert attribute_inference_bound(acc, ball) == pytest.approx(min(1.0, reference), abs=1e-9)
    # with subsampled rounds too (numerical curve): exactly the thresholds' delta above the
    # same ledger with the histogram's Gaussian part alone, never below it
    with_t, plain = FDPAccountant(), FDPAccountant()
    with_t.compose(ThresholdedHistogram(2.0, 1e-3))
    plain.compose(SubsampledGaussian(2.0, 1.0))
    for a in (with_t, plain):
        a.compose(SubsampledGaussian(1.0, 0.1), 50)
    gap = attribute_inference_bound(with_t, ball) - attribute_inference_bound(plain, ball)
    assert gap == pytest.approx(-np.log1p(-1e-3), abs=1e-9)


# --------------------------------------------------------------------------- #
# the one family of number checks, the default δ, Relation, the one calibrator
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("check", "args", "message"),
    [
        ("real", ("x", True), "x=True: must be a real number"),
        ("real", ("x", "1"), "x='1': must be a real number"),
        ("real", ("x", float("nan")), "x=nan: must not be NaN"),
        ("finite", ("x", float("inf")), "x=inf: must be finite"),
        ("positive", ("noise_multiplier", 0.0), "noise_multiplier=0.0: must be > 0"),
        ("positive", ("noise_multiplier", -math.inf), "noise_multiplier=-inf: must be finite"),
        ("rate", ("sampling_rate", 1.5), "sampling_rate=1.5: must be in (0, 1]"),
        ("rate", ("sampling_rate", 0.0), "sampling_rate=0.0: must be in (0, 1]"),
        ("unit", ("ball", -0.1), "ball=-0.1: must be in [0, 1]"),
        ("open_unit", ("delta", 1.0), "delta=1.0: must be in (0, 1)"),
        ("at_least", ("max_epsilon", -1.0, 0.0), "max_epsilon=-1.0: must be >= 0"),
        ("count", ("rounds", 0), "rounds=0: must be an integer >= 1"),
        ("count", ("rounds", 2.0), "rounds=2.0: must be an integer >= 1"),
        ("count", ("rounds", True), "rounds=True: must be an integer >= 1"),
        ("count", ("size", -1, 0), "size=-1: must be an integer >= 0"),
    ],
)
def test_every_number_check_names_the_value_in_one_line(check, args, message) -> None:
    from fedfdp import validate

    with pytest.raises(ValueError) as err:
        getattr(validate, check)(*args)
    assert str(err.value) == message


def test_number_checks_accept_numpy_scalars_and_return_python_numbers() -> None:
    from fedfdp import validate

    assert validate.rate("q", np.float32(0.5)) == 0.5 and type(validate.rate("q", np.float32(0.5))) is float
    assert validate.count("n", np.int64(3)) == 3 and type(validate.count("n", np.int64(3))) is int
    assert validate.positive("s", math.inf, allow_inf=True) == math.inf
    with pytest.raises(ValueError, match=r"x=nan: must not be NaN"):
        validate.real("x", np.float64("nan"))
    with pytest.raises(ValueError, match="must be a real number"):
        validate.real("x", np.bool_(True))


def test_every_accounting_refusal_goes_through_the_one_family_of_checks() -> None:
    """The events, the accountants and secure aggregation's encoding word a bad number the
    same way (the messages of fedfdp.validate, naming their field)."""
    from fedfdp.accounting.distributed import DistributedAccountant, route_b_epsilon
    from fedfdp.accounting.events import DistributedDiscreteGaussian
    from fedfdp.secagg.encoding import decode, headroom

    with pytest.raises(ValueError, match=r"^noise_multiplier=True: must be a real number$"):
        SubsampledGaussian(True, 0.1)
    with pytest.raises(ValueError, match=r"^delta=1.5: must be in \(0, 1\)$"):
        FDPAccountant().epsilon(1.5)
    ddg = DistributedDiscreteGaussian(local_sigma=50.0, honest_parties=4, scale=64.0, dimension=10,
                                      sampling_rate=0.1)
    with pytest.raises(ValueError, match=r"^delta=0.0: must be in \(0, 1\)$"):
        route_b_epsilon([ddg], 0.0)
    with pytest.raises(ValueError, match=r"^count=0: must be an integer >= 1$"):
        DistributedAccountant().compose(ddg, 0)
    with pytest.raises(ValueError, match=r"^parties=0: must be an integer >= 1$"):
        headroom(1.0, max_records=1, parties=0)
    with pytest.raises(ValueError, match=r"^clip=-1.0: must be > 0$"):
        decode(np.zeros(2, dtype=np.uint32), clip=-1.0, scale=1.0)


def test_the_default_delta_is_one_over_twice_the_records() -> None:
    from fedfdp.accounting import default_delta
    from fedfdp.data.private_statistics import estimation_delta

    assert default_delta(3306) == 1 / 6612 == estimation_delta(3306)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match=f"num_records={bad!r}: must be an integer >= 1"):
            default_delta(bad)  # type: ignore[arg-type]


def test_relations_travel_as_the_enum_and_their_strings_are_converted() -> None:
    from fedfdp.accounting import RELATIONS
    from fedfdp.accounting.accountant import check_relation

    assert RELATIONS == (Relation.ADD_REMOVE, Relation.REPLACEMENT)
    assert check_relation("replacement") is Relation.REPLACEMENT
    acc = FDPAccountant()
    acc.compose(SubsampledGaussian(1.0, 0.05), 20)
    by_string = acc.epsilon_bound(1e-5, "replacement")
    assert by_string.relation is Relation.REPLACEMENT
    assert by_string == acc.epsilon_bound(1e-5, Relation.REPLACEMENT)
    assert acc.epsilon_bound(1e-5).relation is Relation.ADD_REMOVE
    assert EpsilonBound(0.0, 0.0, 0.0, 1e-5, "add-remove").relation is Relation.ADD_REMOVE  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="relation='corrdp': unknown"):
        acc.epsilon(1e-5, Relation.CORRDP)


def test_the_one_calibrator_evaluates_each_noise_multiplier_once() -> None:
    from fedfdp.accounting import calibrate

    seen: list[float] = []

    def family(sigma: float) -> SubsampledGaussian:
        seen.append(sigma)
        return SubsampledGaussian(sigma, 0.05)

    sigma = calibrate(FDPAccountant, family, target_epsilon=2.0, rounds=150, delta=1e-5)
    assert len(seen) == len(set(seen))
    assert sigma == cal(2.0, 0.05, 150, 1e-5)  # the public wrapper is the same search


def test_a_family_without_events_below_an_edge_is_calibrated_above_it() -> None:
    """σ ↦ SubsampledGaussian(σ, q) refusing σ < edge (NoEvent): an edge far below the answer
    changes nothing (the central answer, bit for bit); an edge above it is refused with the
    family's refusal at the smallest σ it refused."""
    from fedfdp.accounting import NoEvent, calibrate

    central = cal(2.0, 0.05, 150, 1e-5)

    def family(edge: float):
        def event_for(sigma: float) -> SubsampledGaussian:
            if sigma < edge:
                raise NoEvent(f"sigma={sigma!r}: below the edge {edge}")
            return SubsampledGaussian(sigma, 0.05)
        return event_for

    far = calibrate(FDPAccountant, family(central / 3), target_epsilon=2.0, rounds=150, delta=1e-5)
    assert far == central
    loose = cal(8.0, 0.05, 150, 1e-5)  # < 1: the search also tries 2^-10, below the edge here
    assert calibrate(FDPAccountant, family(0.01), target_epsilon=8.0, rounds=150, delta=1e-5) == loose
    with pytest.raises(NoEvent, match=r"^sigma=1.0: below the edge 3"):
        calibrate(FDPAccountant, family(3.0), target_epsilon=2.0, rounds=150, delta=1e-5)
    # no event up to the largest σ: its refusal
    with pytest.raises(NoEvent, match=r"^sigma=10000.0: below the edge 100000.0$"):
        calibrate(FDPAccountant, family(1e5), target_epsilon=2.0, rounds=150, delta=1e-5)
