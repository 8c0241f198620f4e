"""Accounting of secure aggregation with distributed discrete Gaussian noise.

Mechanism (one round)
---------------------
Each of the parties that answer a round releases, under SecAgg, only its share
of the modular sum ``Σ_i (z_i + e_i) mod 2³²`` where

* ``x_i`` is the party's sum of per-record private gradients, each clipped to L2
  norm ``C``, over a secret Poisson sample of rate ``q``;
* ``z_i = R(s/C · x_i)`` is ``x_i`` scaled by ``s/C`` and rounded without bias,
  ``R(y) = ⌊y + U⌋`` with ``U ~ Unif[0, 1)^d`` (a party-secret draw);
* ``e_i ~ N_Z(0, σ_loc²)^d`` is exact discrete Gaussian noise
  (:mod:`fedfdp.secagg.noise`), ``σ_loc`` in integer units.

The server sees the sum over ``U3`` (the parties whose masked vectors were
summed); up to ``t_c`` of them may collude with it and subtract their own noise,
so only ``n_h = |U3| - t_c`` honest noises count.

Neighbouring relation and sensitivity
-------------------------------------
Add/remove of one record (FDP paper, Definition 6; replacement follows by
Proposition 1 in route A). Coupling both worlds on the same ``U``, every
coordinate of ``R(y + v) - R(y)`` is within 1 of ``v``, so the record moves the
honest sum by an integer vector of L2 norm at most ``Δ = s + √d`` (L1 norm at most
``Δ·min(√d, Δ)``), with probability ``q``, in both directions.

Two accounts (proof in ``docs/secagg_accounting.md``)
-----------------------------------------------------
**Route A** (the printed ε). Lemma 1 (proved in the note, by Poisson summation):
the sum of ``n`` independent ``N_Z(0, σ²)`` is within ``D∞ <= τ_n(σ)`` of
``N_Z(0, nσ²)`` in both directions, with
``τ_n(σ) = Σ_{k=1}^{n-1} ln((1 + η(σ²k/(k+1))) / (1 - η(σ²k/(k+1))))`` and
``η(v) = 2 Σ_{m>=1} exp(-2π² v m²)`` (:func:`sum_divergence_bound`). Lemma 2: drawing
``G ~ N(0, V - t²)`` and then ``N_Z(G, t²)`` is within ``D∞ <= ln((1+η(t²))/(1-η(t²)))``
of ``N_Z(0, V)`` (:func:`smoothing_divergence_bound`). The smoothed round is a
post-processing of the Gaussian mechanism of noise multiplier
``σ_eff = √(n_h σ_loc² - t²) / Δ``, dominated by Theorem 5's subsampled-Gaussian
pair; the real round is within density ratio ``e^{±Λ_r}``,
``Λ_r = d (τ_{n_h}(σ_loc) + ln((1+η(t²))/(1-η(t²))))``. Over a run,
``ε(δ) <= ε_PRV(σ_eff, q; δ e^{-Λ}) + 2Λ`` with ``Λ = Σ_r Λ_r``
(:func:`route_a_epsilon`).

**Route B** (the papers' route, a cross-check). The Rényi-DP bound of the
distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021, Prop. 14 /
Eq. 17, with their ``τ = 10 Σ_{k=1}^{n-1} exp(-2π²σ²k/(k+1))``), amplified by
Poisson subsampling with the *general* upper bound of Zhu & Wang (ICML 2019) —
the exact subsampled-Gaussian formula is not valid here, the round is not a
Gaussian mechanism — composed additively and converted to ``(ε, δ)`` with
Canonne, Kamath & Steinke (2020), Prop. 12 (:func:`route_b_epsilon`).

Statistics released before training
-----------------------------------
A run may release statistics of the data once, before round 1, with central noise
(``private-statistics = "estimate"``: each estimated column's range or categories,
:class:`~fedfdp.accounting.events.ThresholdedHistogram`; a Gaussian-noised statistic,
:class:`~fedfdp.accounting.events.SubsampledGaussian`). Under secure aggregation the
party that holds the data (the central table's owner, ``data-location = "central"``)
releases them, and no node estimates anything alone; they are charged as their own
events and composed with the rounds by both routes:

* route A composes them as they are with the smoothed rounds
  (:class:`~fedfdp.accounting.FDPAccountant`: PRV composition of the Gaussian parts; a
  thresholded histogram's ``−ln(1 − δ_t)`` taken off the ``δ e^{−Λ}`` it reports at).
  The density-ratio transfer is unchanged: the estimates are the same in the real and
  the smoothed run, so the run stays within ``e^{±Λ}`` of the smoothed one;
* route B adds their Rényi DP ``α/(2σ²)`` (the Gaussian parts, rate 1) to the rounds'
  and converts at ``δ − Σ −ln(1 − δ_t)``: the thresholds add at most that to the
  hockey-stick divergence of the composition of everything else (the event's
  docstring), of which the CKS conversion is an upper bound.

Refusals
--------
``σ_loc < MIN_LOCAL_SIGMA`` (4), ``n_h < 1``, ``Λ > MAX_SLACK`` (1e-12) and
``n_h σ_loc² <= t²`` raise ``ValueError`` naming the value.

Device sampling by the server gives no amplification against this server (it
knows, and could choose, which devices take part), so rounds carry no
participation below 1. Nothing here draws random numbers.

Where things live: the event, :class:`~fedfdp.accounting.events.DistributedDiscreteGaussian`,
is part of the event vocabulary (:mod:`fedfdp.accounting.events`); its sensitivity, ``η``,
the two lemmas and ``τ`` are :mod:`fedfdp.accounting.discrete_gaussian_bounds`. This
module has the two accounts and :class:`DistributedAccountant`, and re-exports those
names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from fedfdp.accounting.accountant import EpsilonBound, FDPAccountant
from fedfdp.accounting.discrete_gaussian_bounds import (
    MAX_SLACK,
    MIN_LOCAL_SIGMA,
    SMOOTHING,
    ddg_tau,
    sensitivity,
    smoothing_divergence_bound,
    sum_divergence_bound,
    theta_excess,
)
from fedfdp.accounting.events import (
    DistributedDiscreteGaussian,
    Relation,
    SubsampledGaussian,
    ThresholdedHistogram,
    event_from_dict,
)
from fedfdp.accounting.protocol import append_repeated
from fedfdp.validate import count, open_unit, positive, rate

__all__ = [
    "MAX_SLACK",
    "MIN_LOCAL_SIGMA",
    "ROUTE_B_ORDERS",
    "SMOOTHING",
    "DistributedAccountant",
    "DistributedDiscreteGaussian",
    "DistributedEpsilon",
    "ddg_rdp",
    "ddg_tau",
    "distributed_epsilon",
    "honest_parties",
    "local_noise_sigma",
    "poisson_subsampled_rdp",
    "rdp_to_epsilon",
    "route_a_epsilon",
    "route_b_epsilon",
    "sensitivity",
    "smoothing_divergence_bound",
    "sum_divergence_bound",
    "theta_excess",
]

#: Integer Rényi orders of route B (Zhu & Wang's bound holds at integer orders).
ROUTE_B_ORDERS: tuple[int, ...] = (
    *range(2, 129),
    *range(144, 257, 16),
    320,
    384,
    512,
    768,
    1024,
)


# --------------------------------------------------------------------------------------
# scale, sensitivity, calibration, parties
# --------------------------------------------------------------------------------------


def local_noise_sigma(
    noise_multiplier: float, scale: float, dimension: int, min_survivors: int, colluders: int = 0
) -> float:
    """``σ_loc = σ (s + √d) / √(n_min - t_c)``: each party's noise std in integer units,
    so that the honest noise of ``n_min - t_c`` parties has std ``σ Δ`` (``σ_eff ≈ σ``).

    Raises
    ------
    ValueError
        On a non-positive ``σ`` or scale, or when ``n_min - t_c < 1``.
    """
    sigma = positive("noise_multiplier", noise_multiplier)
    n_h = honest_parties(min_survivors, colluders)
    return sigma * sensitivity(scale, dimension) / math.sqrt(n_h)


def honest_parties(survivors: int, colluders: int) -> int:
    """``n_h = survivors - colluders``: the noises the server cannot subtract
    (pessimistically, every declared colluder is among the survivors).

    Raises
    ------
    ValueError
        If ``n_h < 1`` (no honest noise: nothing to account).
    """
    n = count("survivors", survivors, 0)
    c = count("colluders", colluders, 0)
    if n - c < 1:
        raise ValueError(f"honest parties n_h={n - c} (survivors={n}, colluders={c}): must be >= 1")
    return n - c


#: An event these accounts compose: a distributed round, or an event released centrally
#: in the same run before the rounds (a Gaussian-noised statistic, a
#: :class:`~fedfdp.accounting.events.ThresholdedHistogram` of ``private-statistics =
#: "estimate"``: the ranges and categories released once, before training, by the party
#: that holds the data, and charged as their own events).
Charged = DistributedDiscreteGaussian | SubsampledGaussian | ThresholdedHistogram
Rounds = Iterable[Charged | tuple[Charged, int]]
_CHARGED = (DistributedDiscreteGaussian, SubsampledGaussian, ThresholdedHistogram)


def _as_counted(rounds: Rounds | Charged) -> list[tuple[Charged, int]]:
    if isinstance(rounds, _CHARGED):
        rounds = [rounds]
    out: list[tuple[Charged, int]] = []
    for item in rounds:
        if isinstance(item, _CHARGED):
            out.append((item, 1))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], _CHARGED):
            out.append((item[0], count("count", item[1])))
        else:
            raise ValueError(
                f"round {item!r}: expected a DistributedDiscreteGaussian, SubsampledGaussian or "
                "ThresholdedHistogram, or (event, count)"
            )
    if not out:
        raise ValueError("rounds: empty (nothing to account)")
    return out


def _threshold_cost(counted: Sequence[tuple[Charged, int]]) -> float:
    """``Σ count · (−ln(1 − δ_t))`` over the thresholded histograms: the δ their thresholds
    add to the composition of everything else (:class:`ThresholdedHistogram`'s docstring;
    0 without any).
    """
    return math.fsum(ev.delta_cost * n for ev, n in counted if isinstance(ev, ThresholdedHistogram))


def _total_slack(counted: Sequence[tuple[Charged, int]]) -> float:
    """``Λ``: the distributed rounds' slack (a central Gaussian event has none)."""
    slack = math.fsum(ev.slack * n for ev, n in counted if isinstance(ev, DistributedDiscreteGaussian))
    if not slack <= MAX_SLACK:
        raise ValueError(f"total slack Λ={slack!r}: must be <= {MAX_SLACK} (raise local_sigma)")
    return slack


# --------------------------------------------------------------------------------------
# route A
# --------------------------------------------------------------------------------------


def route_a_epsilon(
    rounds: Rounds, delta: float, relation: Relation | str = Relation.ADD_REMOVE, eps_error: float = 0.05
) -> EpsilonBound:
    """Route A: ``ε(δ) <= ε_PRV(σ_eff, q; δ e^{-Λ}) + 2Λ`` (``docs/secagg_accounting.md``).

    The smoothed rounds are composed by :class:`~fedfdp.accounting.FDPAccountant`
    (Theorem 5's pair with noise multiplier ``σ_eff`` and rate ``q``, certified upper
    end) at ``δ e^{-Λ}``; every field of the returned bound is shifted by ``2Λ``
    (``lower`` by ``-2Λ``).

    Parameters
    ----------
    rounds : iterable of DistributedDiscreteGaussian or (event, count)
        The rounds charged.
    delta : float
        In ``(0, 1)``.
    relation : Relation or str
        Passed to the accountant (the density-ratio transfer holds for any relation).
    eps_error : float
        The accountant's discretisation target.

    Raises
    ------
    ValueError
        If the total slack exceeds ``MAX_SLACK`` or the input is malformed.
    """
    counted = _as_counted(rounds)
    delta = open_unit("delta", delta)
    slack = _total_slack(counted)
    acc = FDPAccountant(eps_error=eps_error)
    for ev, n in counted:  # a central event is composed as it is (Λ is the distributed rounds'); the
        # FDP accountant takes a thresholded histogram's δ off the δ it reports at
        acc.compose(ev.gaussian_event() if isinstance(ev, DistributedDiscreteGaussian) else ev, n)
    b = acc.epsilon_bound(delta * math.exp(-slack), relation)
    return EpsilonBound(
        max(0.0, b.lower - 2.0 * slack), b.estimate + 2.0 * slack, b.upper + 2.0 * slack, delta, b.relation
    )


# --------------------------------------------------------------------------------------
# route B
# --------------------------------------------------------------------------------------


def ddg_rdp(
    orders: Sequence[int] | np.ndarray,
    local_sigma: float,
    parties: int,
    l2_sensitivity: float,
    dimension: int,
    l1_sensitivity: float | None = None,
) -> np.ndarray:
    """Rényi DP of one round of the distributed discrete Gaussian, no subsampling
    (Kairouz, Liu & Steinke, ICML 2021, Prop. 14 / Eq. 17, as their code
    ``compute_rdp_dgaussian`` states it).

    ``ε(α) = min{ α Δ₂²/(2nσ²) + τd,  α/2 (Δ₂²/(nσ²) + 2Δ₁τ/(√n σ) + τ²d),
    α/2 (Δ₂/(√n σ) + τ√d)² }``

    with ``τ`` = :func:`ddg_tau`, ``σ = σ_loc`` (>= 1/2, the proposition's hypothesis),
    ``n`` the honest parties and ``Δ₁ = Δ₂ min(√d, Δ₂)`` by default (integer vectors:
    ``‖v‖₁ <= min(√d ‖v‖₂, ‖v‖₂²)``).
    """
    a = np.asarray(orders, dtype=np.float64)
    sigma = positive("local_sigma", local_sigma)
    if sigma < 0.5:
        raise ValueError(f"local_sigma={local_sigma!r}: Prop. 14 needs >= 0.5")
    n = count("parties", parties)
    d = count("dimension", dimension)
    l2 = positive("l2_sensitivity", l2_sensitivity)
    l1 = l2 * min(math.sqrt(d), l2) if l1_sensitivity is None else positive("l1_sensitivity", l1_sensitivity)
    tau = ddg_tau(sigma, n)
    sd = math.sqrt(n) * sigma
    term1 = a * l2**2 / (2.0 * sd**2) + tau * d
    term2 = a / 2.0 * (l2**2 / sd**2 + 2.0 * l1 * tau / sd + tau**2 * d)
    term3 = a / 2.0 * (l2 / sd + tau * math.sqrt(d)) ** 2
    return np.minimum(np.minimum(term1, term2), term3)


def poisson_subsampled_rdp(base_rdp: np.ndarray, sampling_rate: float, orders: Sequence[int]) -> np.ndarray:
    """Zhu & Wang (ICML 2019), general upper bound for Poisson subsampling at integer
    ``α >= 2``, for any mechanism with Rényi DP ``ε(l)`` at every integer ``l <= α``.

    ``(α-1) ε'(α) <= log{ (1-q)^{α-1}(αq - q + 1) + C(α,2) q² (1-q)^{α-2} e^{ε(2)}
    + 3 Σ_{l=3}^{α} C(α,l) (1-q)^{α-l} q^l e^{(l-1)ε(l)} }``,

    also capped by ``ε(α)`` (joint convexity of ``e^{(α-1)D_α}``).

    Parameters
    ----------
    base_rdp : ndarray
        ``ε(l)`` for ``l = 0, 1, 2, ..., max(orders)`` (entries 0 and 1 unused).
    sampling_rate : float
        ``q`` in ``(0, 1]``.
    orders : sequence of int
        Integer orders ``>= 2``.
    """
    q = rate("sampling_rate", sampling_rate)
    orders_i = [count("order", o, 2) for o in orders]
    eps = np.asarray(base_rdp, dtype=np.float64)
    if eps.shape[0] <= max(orders_i):
        raise ValueError(f"base_rdp: needs entries up to order {max(orders_i)}, has {eps.shape[0] - 1}")
    if q == 1.0:
        return eps[orders_i].copy()
    lq, l1q = math.log(q), math.log1p(-q)
    out = np.empty(len(orders_i))
    for j, a in enumerate(orders_i):
        terms = [(a - 1) * l1q + math.log(a * q - q + 1.0)]
        terms.append(math.log(a * (a - 1) / 2.0) + 2 * lq + (a - 2) * l1q + eps[2])
        if a >= 3:
            ls = np.arange(3, a + 1, dtype=np.float64)
            log_binom = special.gammaln(a + 1.0) - special.gammaln(ls + 1.0) - special.gammaln(a - ls + 1.0)
            tail = math.log(3.0) + log_binom + (a - ls) * l1q + ls * lq + (ls - 1.0) * eps[3 : a + 1]
            terms.extend(tail.tolist())
        sub = float(special.logsumexp(terms)) / (a - 1)
        out[j] = min(sub, float(eps[a]))
    return out


def rdp_to_epsilon(orders: Sequence[float], rdp: np.ndarray, delta: float) -> float:
    """``min_α ε_α + log((α-1)/α) - (log δ + log α)/(α-1)``, at least 0
    (Canonne, Kamath & Steinke 2020, Prop. 12; the conversion dp-accounting uses).
    """
    delta = open_unit("delta", delta)
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    eps = r + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    return max(0.0, float(np.min(eps)))


def route_b_epsilon(rounds: Rounds, delta: float, orders: Sequence[int] = ROUTE_B_ORDERS) -> float:
    """Route B: add/remove ε from Rényi DP (DDG Prop. 14 per round with ``n = n_h``,
    ``σ = σ_loc``, ``Δ₂ = s + √d``; Zhu & Wang's general Poisson-subsampling bound;
    additive composition; the CKS conversion). A valid upper bound, looser than
    route A (``docs/secagg_accounting.md`` §6).
    """
    counted = _as_counted(rounds)
    delta = open_unit("delta", delta)
    orders_i = sorted({count("order", o, 2) for o in orders})
    top = max(orders_i)
    ls = np.arange(top + 1)
    total = np.zeros(len(orders_i))
    for ev, n in counted:
        if isinstance(ev, DistributedDiscreteGaussian):
            base = ddg_rdp(ls, ev.local_sigma, ev.honest_parties, ev.sensitivity, ev.dimension)
        else:  # the Gaussian mechanism (a thresholded histogram's Gaussian part at rate 1), α/(2σ²);
            # a participation p ≤ 1 is not credited (an upper bound)
            base = ls.astype(np.float64) / (2.0 * ev.noise_multiplier**2)
        total += n * poisson_subsampled_rdp(base, ev.sampling_rate, orders_i)
    cost = _threshold_cost(counted)  # the thresholds' δ, added to the rest's δ(ε) (as in route A)
    if not delta - cost > 0.0:
        return math.inf
    return rdp_to_epsilon(orders_i, total, delta - cost)


# --------------------------------------------------------------------------------------
# both
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistributedEpsilon:
    """Both accounts of a run of distributed-discrete-Gaussian rounds.

    Attributes
    ----------
    route_a : EpsilonBound
        PRV of the smoothed Gaussian rounds plus the slack (proved; ``upper`` is the
        number to print).
    route_b : float
        Rényi-DP route of the papers (valid, looser; ``inf`` when not computed).
    slack : float
        ``Λ``, the total log-density-ratio distance to the smoothed rounds.
    delta : float
    """

    route_a: EpsilonBound
    route_b: float
    slack: float
    delta: float

    @property
    def epsilon(self) -> float:
        """The printed ε: route A's certified upper bound (never above route B's)."""
        return min(self.route_a.upper, self.route_b)


def distributed_epsilon(
    rounds: Rounds, delta: float, eps_error: float = 0.05, *, route_b: bool = True
) -> DistributedEpsilon:
    """Route A and route B side by side (add/remove); route A alone (route B ``inf``)
    with ``route_b=False``.
    """
    counted = _as_counted(rounds)
    slack = _total_slack(counted)
    return DistributedEpsilon(
        route_a_epsilon(counted, delta, eps_error=eps_error),
        route_b_epsilon(counted, delta) if route_b else math.inf,
        slack,
        open_unit("delta", delta),
    )


_STATE_VERSION = 1


class DistributedAccountant:
    """The :class:`~fedfdp.accounting.protocol.Accountant` of
    :class:`DistributedDiscreteGaussian` rounds (add/remove, FDP paper Definition 6),
    and of central :class:`~fedfdp.accounting.SubsampledGaussian` and
    :class:`~fedfdp.accounting.events.ThresholdedHistogram` events charged in the same run
    (the estimates of ``private-statistics = "estimate"``; module docstring: route A
    composes them as they are, outside ``Λ``, with the thresholds' δ set aside; route B
    takes their RDP ``α/(2σ²)`` through the same Poisson-subsampling bound at rate ``q``,
    not crediting a participation ``p < 1``, which only lowers the true ε, and converts at
    ``δ`` minus the thresholds' δ).

    ``epsilon(δ)`` is the smaller of route A's certified upper bound (proved in
    ``docs/secagg_accounting.md``) and route B's; both are upper bounds, so is their
    minimum. :meth:`epsilon_bound` returns both (:class:`DistributedEpsilon`).

    Parameters
    ----------
    eps_error : float
        Route A's discretisation target (:class:`~fedfdp.accounting.FDPAccountant`).
    route_b : bool
        False: ``epsilon(δ)`` is route A's alone, an upper bound of the printed ε (the
        accountant a target ε is calibrated over, :func:`fedfdp.secagg.plan.secagg_plan`'s
        family: σ never overshoots the target, whatever route B says, and a round costs
        route A's composition only).

    Examples
    --------
    >>> ev = DistributedDiscreteGaussian(local_sigma=3.3e5, honest_parties=10, scale=2**19,
    ...                                  dimension=10**5, sampling_rate=0.05)
    >>> acc = DistributedAccountant()
    >>> acc.compose(ev, 150)
    >>> b = acc.epsilon_bound(1 / 6400)
    >>> b.route_a.upper <= b.route_b and acc.epsilon(1 / 6400) == b.epsilon
    True
    """

    relation = Relation.ADD_REMOVE

    def __init__(self, eps_error: float = 0.05, *, route_b: bool = True) -> None:
        self.eps_error = float(eps_error)
        self.route_b = bool(route_b)
        self._rounds: list[tuple[Charged, int]] = []
        self._memo: dict[tuple[Any, ...], DistributedEpsilon] = {}

    @property
    def rounds(self) -> int:
        return sum(n for _, n in self._rounds)

    @staticmethod
    def _appended(
        rounds: Sequence[tuple[Charged, int]],
        event: Charged,
        count: int,
    ) -> list[tuple[Charged, int]]:
        if not isinstance(event, _CHARGED):
            raise ValueError(f"event={event!r}: this accountant composes DistributedDiscreteGaussian (and "
                             "SubsampledGaussian or ThresholdedHistogram) events")
        return append_repeated(rounds, event, count)

    def compose(self, event: Charged, count: int = 1) -> None:
        """Record ``count`` rounds of ``event``."""
        self._rounds = self._appended(self._rounds, event, count)

    def _bound(
        self, rounds: Sequence[tuple[Charged, int]], delta: float
    ) -> DistributedEpsilon:
        key = (tuple(rounds), float(delta))
        if key not in self._memo:
            if len(self._memo) >= 8:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = distributed_epsilon(list(rounds), delta, self.eps_error, route_b=self.route_b)
        return self._memo[key]

    def epsilon_bound(self, delta: float) -> DistributedEpsilon:
        """Routes A and B of everything composed (zero rounds: ε = 0; route B ``inf`` when
        the accountant computes route A only).
        """
        if not self._rounds:
            zero = EpsilonBound(0.0, 0.0, 0.0, open_unit("delta", delta), Relation.ADD_REMOVE)
            return DistributedEpsilon(zero, 0.0, 0.0, zero.delta)
        return self._bound(self._rounds, delta)

    def epsilon(self, delta: float) -> float:
        return self.epsilon_bound(delta).epsilon

    def would_exceed(
        self, event: Charged, count: int = 1, *, max_epsilon: float, delta: float
    ) -> bool:
        """Whether ``count`` more rounds of ``event`` would take ε above ``max_epsilon``
        (no mutation).
        """
        return self._bound(self._appended(self._rounds, event, count), delta).epsilon > max_epsilon

    def state_dict(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, "eps_error": self.eps_error,
                "ledger": [{"event": ev.to_dict(), "count": n} for ev, n in self._rounds]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the rounds by those in ``state``; nothing changes on error."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"state {state!r}: not a distributed accountant's state")
        rounds: list[tuple[Charged, int]] = []
        for i, item in enumerate(state.get("ledger", [])):
            if not isinstance(item, dict) or set(item) != {"event", "count"}:
                raise ValueError(f"state ledger[{i}]={item!r}: expected event and count")
            event = event_from_dict(item["event"])
            if not isinstance(event, _CHARGED):
                raise ValueError(f"state ledger[{i}]: not a distributed-discrete-gaussian, "
                                 "subsampled-gaussian or thresholded-histogram event")
            rounds = self._appended(rounds, event, item["count"])
        self._rounds = rounds
