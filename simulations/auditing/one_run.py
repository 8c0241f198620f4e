"""One-run auditing of a whole training run (``fedfdp audit --one-run``).

Steinke, Nasr and Jagielski, *Privacy Auditing with One (1) Training Run*
(NeurIPS 2023): insert ``m`` canaries, each in the training data or not by an
independent fair coin; train **once**; score every canary; guess "in" for the
top-scored and "out" for the bottom-scored; the number of correct guesses bounds
ε from below (:func:`fedfdp.audit.one_run_bound`). The same guesses are analysed
with the run's whole trade-off curve (Mahloujifar, Melis and Chaudhuri, *Auditing
f-Differential Privacy in One Run*, 2024; :mod:`fedfdp.one_run_fdp`): the claim's
curve, a lower bound on it from the accountant's certified ``ε(δ)``
(:func:`claim_curve`), is rejected when no mechanism with that curve could have as
many right guesses; each analysis at ``alpha/2``. Here the run is the production
centralised engine (:func:`fedfdp.algorithm.run_centralised`: the sampling plan,
the write-ahead ledger, the server's noise from the OS CSPRNG, adaptive clipping,
the optimizer) with its configuration's recipe; ``reproducible-noise`` is refused.

Canaries and the relation
-------------------------
Canary ``j`` is a record of its own added to the fleet: its public features
(``Ψ``) are all zero and fixed, its only non-zero feature is a private column of
its own, ``canary_j = a``, its label ``j mod classes``. ``a = 30`` (default) keeps
the canary's logits near zero through the run (the noise a canary column
accumulates moves them by about ``0.02·a``), so its gradient ``(p − e_y)·a`` is far
above ``C`` and clipped to norm ``C`` in every round it is sampled: a gradient
canary of fixed strength. (With ``a = 1000`` the accumulated noise made ``p`` nearly
one-hot, and a canary whose noise happened to favour its own label lost its
gradient for the rest of the run.) ``m = 5000`` (default): in a model of the
default run built from public quantities only (each canary sampled at ``q`` in each
of the ``T`` rounds, its release shifted by ``C`` and noised at ``σ/2``, the score
below), 5,000 canaries catch σ/2 in 0.92 of 300 simulated runs (docs/audit.md). FDP's add/remove relation
(Def. 6) compares a run with the canary (world "in") with the simulator of
Algorithm 2 given its ``Ψ`` (world "out"): the canary's record stays on its
device — its ``Ψ`` in the public population and in ``N``, both public — and only
its private contribution is absent. The auditor builds world "out" with a
component passed through :class:`fedfdp.contribution.ClientParts`
(:class:`WithoutAbsent`: the private batches without the absent canaries'
records), the seam a normal run uses; a planted bug's components are wrapped by
it, never replaced.

The model is ``logistic`` (softmax regression) with zero initial weights on the
canary columns (the auditor may choose the public initial model). With the
zero-masking public view, canary ``j``'s column is touched by nothing but canary
``j``'s private gradient ``(p − e_y)·a`` and the noise: the public gradient and
every other record are zero there. Each round the auditor, who sees every
round's model (what every client receives), recovers the released noisy private
sum on those columns from two consecutive models (SGD with momentum:
``v_t = (w_{t−1} − w_t)/η``, ``g_t = v_t − μ v_{t−1}``, ``S_t = g_t·normaliser/α``)
and computes, with the real per-record code at ``w_{t−1}`` and the round's ``C``
(public: ``metrics.csv``), the clipped gradient ``d_{jt}`` canary ``j`` would add
if sampled.

Scores
------
``rounds`` (default, white-box)
    ``Σ_t log((1 − q) + q·exp(s·Z − s²/2))`` with ``Z = ⟨S_t, d_jt⟩/(σC_t‖d_jt‖)``
    and ``s = ‖d_jt‖/(σC_t)``: the log-likelihood ratio of "in" vs "out" of the
    Poisson-subsampled Gaussian rounds, for the canary's gradient as the claim
    says it is released.
``final``
    ``⟨w_0 − w_T, d̄_j⟩/‖d̄_j‖`` on the canary's column, ``d̄_j = Σ_t d_jt``: the
    final model's change along the canary's gradient.

What is compared
----------------
The ε–δ bound is the theorem's for ``(ε, δ)``-DP with respect to each canary, at
the run's own ``δ`` and relation, against the run's printed ε (the last
``metrics.csv`` row: the accountant's upper bound). The f-DP analysis tests the
run's own curve and reports the largest μ of Gaussian DP its guesses reject, with
the ε of that Gaussian mechanism at the run's δ (valid as an ε bound only for a
Gaussian-shaped curve; the verdict never rests on it). A bound above the claim, or
the claim's curve rejected, refutes the claim with confidence ``1 − alpha``.
Before any score is seen, :func:`audit_power` says whether the run could refute the
claim at all: if not even every guess right could, the verdict is one line saying
so, not "pass".
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedfdp.accounting import FDPAccountant, SubsampledGaussian
from fedfdp.accounting.prv import gaussian_epsilon
from fedfdp.algorithm import run_centralised
from fedfdp.audit import ALPHA, GUESS_PATTERNS, one_run_bound, one_run_epsilon
from fedfdp.config import Config, ConfigError, Mode, Optimizer, PrivacyUnit, load_config
from fedfdp.contribution import (
    ClientParts,
    PrivateAggregator,
    PrivateBatch,
    PrivateSum,
    RoundSettings,
    private_clipped_sum,
)
from fedfdp.data import DeviceData, FederatedData, load_dataset
from fedfdp.entropy import OSBits, noise_source, uniforms
from fedfdp.evaluation import held_out_metrics
from fedfdp.features import FeatureSpec
from fedfdp.losses import FeatureMap
from fedfdp.mechanism import ResolvedMechanism
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.one_run_fdp import (
    InverseCurve,
    OneRunFDP,
    epsilon_delta_curve,
    guess_counts,
    needed_correct,
    one_run_fdp,
)
from fedfdp.run_plan import feature_map_for, mechanism_for, run_secrets
from simulations.auditing.bugs import planted

#: The one-run audit's fleet and run, over the configuration's defaults (the default
#: recipe: mode fdp, adaptive clipping "auto", σ calibrated to ε = 2, q = 0.05, SGD with
#: momentum): half the default fleet, 40 rounds, δ = 1e-5 (the theorem's δ term is
#: 2·m·δ, which at δ = 1/(2N) would be m/N), every round's model handed to the auditor
#: (eval-every = 1), no progress bar.
ONE_RUN_DEFAULTS: dict[str, Any] = {
    "num-devices": 10, "records-per-device": 200, "num-rounds": 40, "delta": 1e-5,
    "eval-every": 1, "progress": False,
}


class Score(enum.StrEnum):
    """How a canary is scored (module docstring)."""

    ROUNDS = "rounds"
    FINAL = "final"


@dataclass(frozen=True)
class OneRunSetup:
    """What one one-run audit runs.

    Attributes
    ----------
    canaries : int
        ``m``.
    amplitude : float
        ``a``, each canary's private value (its raw gradient is about ``a·‖p − e_y‖``).
    config : mapping
        Configuration keys over :data:`ONE_RUN_DEFAULTS` (kebab-case, as ``--set``).
    score : Score
    alpha : float
        1 − confidence of the bound.
    patterns : tuple of (float, float)
        Guess patterns of the ε–δ analysis, ``(in, out)`` as shares of ``m``
        (:func:`fedfdp.audit.one_run_bound`).
    fdp_patterns : tuple of (float, float)
        Guess patterns of the f-DP analysis (:func:`fedfdp.one_run_fdp.one_run_fdp`).
    coin_seed : int or None
        None (default): the coins come from the OS CSPRNG; an integer makes them
        repeatable (the run's own secret randomness is the OS CSPRNG either way).
    """

    canaries: int = 5000
    amplitude: float = 30.0
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    score: Score = Score.ROUNDS
    alpha: float = ALPHA
    patterns: tuple[tuple[float, float], ...] = GUESS_PATTERNS
    fdp_patterns: tuple[tuple[float, float], ...] = ((0.015, 0.0), (0.03, 0.0))
    coin_seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.canaries, bool) or not isinstance(self.canaries, int) or self.canaries < 2:
            raise ConfigError(f"canaries={self.canaries!r}: need an integer >= 2")
        if not (math.isfinite(self.amplitude) and self.amplitude > 0):
            raise ConfigError(f"amplitude={self.amplitude}: must be finite and > 0")
        object.__setattr__(self, "score", Score(self.score))
        object.__setattr__(self, "config", dict(self.config))
        if not 0 < self.alpha < 1:
            raise ConfigError(f"alpha={self.alpha}: must be in (0, 1)")

    def run_config(self) -> Config:
        """The audited run's configuration; refuses what the audit cannot read."""
        cfg = load_config({**ONE_RUN_DEFAULTS, **self.config})
        p, t = cfg.privacy, cfg.training
        problems = []
        if p.mode not in (Mode.FDP, Mode.DP):
            problems.append(f"mode={str(p.mode)!r}: the one-run audit runs fdp or dp (every round private)")
        if p.public_pretrain_rounds:
            problems.append(f"public-pretrain-rounds={p.public_pretrain_rounds}: every round must be private")
        if p.privacy_unit != PrivacyUnit.RECORD or p.device_sampling_rate is not None or p.clients_per_round:
            problems.append("the one-run audit needs the record unit over every device (q: a canary's rate)")
        if p.reproducible_noise:
            problems.append("reproducible-noise=true: the audited run draws its secrets from the OS CSPRNG")
        if t.model != "logistic":
            problems.append(f"model={t.model!r}: the canaries' columns are read off a logistic model")
        if t.optimizer != Optimizer.SGD:
            problems.append(f"optimizer={str(t.optimizer)!r}: each update is read through SGD's momentum")
        if cfg.run.eval_every != 1:
            problems.append(f"eval-every={cfg.run.eval_every}: the auditor reads every round's model (1)")
        if cfg.run.out_dir:
            problems.append("out-dir: the one-run audit writes no run directory")
        if problems:
            raise ConfigError("one-run audit: " + "; ".join(problems))
        return cfg


# --------------------------------------------------------------------------------------
# canaries, world "out" and the run
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryFleet:
    """The fleet with the canaries added (every canary present: world "out" is made by
    :class:`WithoutAbsent`, not by removing records).
    """

    data: FederatedData
    columns: np.ndarray  # the canaries' private columns (model input indices)
    x: np.ndarray  # the canaries' records
    y: np.ndarray


def with_canaries(data: FederatedData, canaries: int, amplitude: float) -> CanaryFleet:
    """``data`` plus ``canaries`` records (module docstring): canary ``j`` on device
    ``j mod devices``, after that device's own records.
    """
    if data.spec is None or data.is_image:
        raise ConfigError(f"dataset {data.name!r}: the one-run audit adds canary columns to a table")
    names = tuple(f"canary_{j:04d}" for j in range(canaries))
    clash = sorted(set(names) & set(data.spec.columns))
    if clash:
        raise ConfigError(f"dataset {data.name!r} already has columns {clash[:3]}")
    spec = FeatureSpec(columns=(*data.spec.columns, *names), public=data.spec.public,
                       private=(*data.spec.private, *names), label_public=data.spec.label_public)
    width = len(data.spec.columns)
    cols = np.arange(width, width + canaries)
    x = np.zeros((canaries, width + canaries), dtype=np.float32)
    x[np.arange(canaries), cols] = amplitude
    y = (np.arange(canaries) % data.num_classes).astype(np.int64)
    devices = []
    for d, dev in enumerate(data.devices):
        mine = np.arange(d, canaries, len(data.devices))
        own = np.concatenate([dev.x, np.zeros((len(dev.x), canaries), dtype=np.float32)], axis=1)
        devices.append(DeviceData(np.concatenate([own, x[mine]]), np.concatenate([dev.y, y[mine]])))
    test_x = np.concatenate([data.test_x, np.zeros((len(data.test_x), canaries), dtype=np.float32)], 1)
    fleet = dataclasses.replace(data, name=f"{data.name}+{canaries}-canaries", spec=spec,
                                devices=tuple(devices), test_x=test_x)
    return CanaryFleet(fleet, cols, x, y)


@dataclass(frozen=True)
class WithoutAbsent:
    """World "out" for the absent canaries: the simulator of Algorithm 2 (FDP paper,
    appendix) through the real aggregator.

    The private batches lose the records of the absent canaries (those with a non-zero
    value in one of ``columns``) before ``inner`` aggregates them; their Poisson coins
    are still drawn, their public features stay in the public batch and in ``N``. An
    aggregator component (:class:`fedfdp.contribution.ClientParts`), so a planted bug's
    aggregator runs inside it.
    """

    columns: tuple[int, ...]
    inner: PrivateAggregator

    def __call__(
        self, model: nn.Module, decomposition: FeatureMap, settings: RoundSettings,
        batches: Sequence[PrivateBatch],
    ) -> PrivateSum:
        if not self.columns or not batches:
            return self.inner(model, decomposition, settings, batches)
        marker = torch.zeros(batches[0].x.shape[1], dtype=batches[0].x.dtype)
        marker[torch.as_tensor(self.columns, dtype=torch.long)] = 1.0
        kept = []
        for b in batches:
            present = (b.x.abs() @ marker) == 0  # no absent canary's column is set
            kept.append(PrivateBatch(b.x[present], b.y[present], b.padding, b.device_size))
        return self.inner(model, decomposition, settings, kept)


def _coins(m: int, seed: int | None) -> np.ndarray:
    if seed is None:
        return uniforms(OSBits(), m) < 0.5
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x0E1,))).random(m) < 0.5


@dataclass
class Recorder:
    """The auditor's view of the run: every round's model (an ``evaluate_fn``, called
    after each round with the model every client receives next), and held-out metrics
    after the last round.
    """

    total: int
    test_x: np.ndarray
    test_y: np.ndarray
    states: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)

    def __call__(self, round_: int, model: nn.Module) -> dict[str, float]:
        self.states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return held_out_metrics(model, self.test_x, self.test_y) if round_ == self.total else {}


def _first_layer(state: Mapping[str, torch.Tensor]) -> str:
    names = [k for k in state if k.endswith("weight")]
    if len(names) != 1:
        raise ConfigError(f"model parameters {sorted(state)}: the one-run audit reads one Linear layer")
    return names[0]


def canary_scores(
    cfg: Config,
    fleet: CanaryFleet,
    states: Sequence[Mapping[str, torch.Tensor]],
    rows: Sequence[Mapping[str, Any]],
    score: Score,
) -> np.ndarray:
    """Each canary's score from the recorded models and rows (module docstring)."""
    t, p = cfg.training, cfg.privacy
    model = build_model_for(cfg.training, fleet.data)
    dec = feature_map_for(cfg, fleet.data)
    phase = PHASES[p.mode]
    weight = _first_layer(states[0])
    cols = torch.as_tensor(fleet.columns, dtype=torch.long)
    weight_factor = t.alpha if phase.public else 1.0
    q = p.sampling_rate
    batch_x, batch_y = torch.as_tensor(fleet.x), torch.as_tensor(fleet.y)
    rounds = len(rows)
    velocity = torch.zeros_like(states[0][weight][:, cols], dtype=torch.float64)
    total = np.zeros(len(fleet.columns))
    directions = torch.zeros_like(velocity)
    for r in range(rounds):
        before, after = states[r], states[r + 1]
        row = rows[r]
        sigma, c = float(row["noise_multiplier"]), float(row["clipping_norm"])
        w0 = before[weight][:, cols].double()
        step = (w0 - after[weight][:, cols].double()) / t.learning_rate
        grad = step - t.momentum * velocity if r else step
        velocity = step
        released = grad * float(row["normaliser"]) / weight_factor  # noisy private sum on the canary columns
        model.load_state_dict(before)
        gen = torch.Generator().manual_seed(0)
        contrib = private_clipped_sum(model, dec, phase, [PrivateBatch(batch_x, batch_y, gen, 1)], c)
        names = [n for n, prm in model.named_parameters() if prm.requires_grad]
        # every canary's clipped gradient, each alone on its own column
        d = dict(zip(names, contrib.grads, strict=True))[weight][:, cols].double()
        directions += d
        if score is Score.ROUNDS:
            norm = d.norm(dim=0)
            shift = (norm / (sigma * c)).numpy()
            z = ((released * d).sum(dim=0) / (sigma * c * torch.clamp(norm, min=1e-300))).numpy()
            x = shift * z - 0.5 * shift**2
            total += np.where(shift > 0, np.logaddexp(math.log1p(-q), math.log(q) + x), 0.0)
    if score is Score.FINAL:
        change = (states[0][weight][:, cols] - states[-1][weight][:, cols]).double()
        unit = directions / torch.clamp(directions.norm(dim=0), min=1e-300)
        total = (change * unit).sum(dim=0).numpy()
    return total


#: The δ grid of the claim's curve (:func:`claim_curve`): the accountant's certified
#: ``ε(δ)`` at each point gives one line of the curve.
CLAIM_DELTAS = np.geomspace(1e-12, 0.5, 60)


def claim_curve(mechanism: ResolvedMechanism, rounds: int) -> InverseCurve:
    """The claim the f-DP analysis tests: a lower bound on the run's trade-off curve
    from the run's own accountant — the mechanism's event charged ``rounds`` times,
    what every round of the audited run charges — through its certified ``ε(δ)`` on
    :data:`CLAIM_DELTAS` (:func:`fedfdp.one_run_fdp.epsilon_delta_curve`).
    """
    event = mechanism.event
    if not isinstance(event, SubsampledGaussian):
        raise ConfigError(f"the one-run audit's run charges {event!r}: need a subsampled Gaussian")
    accountant = FDPAccountant()
    accountant.compose(event, rounds)
    deltas = [float(d) for d in CLAIM_DELTAS]
    return epsilon_delta_curve([accountant.epsilon(d) for d in deltas], deltas)


def matching_mu(epsilon: float, delta: float) -> float:
    """The ``μ`` of the Gaussian mechanism whose ``ε`` at ``delta`` is ``epsilon`` (bisection
    on :func:`fedfdp.accounting.prv.gaussian_epsilon`, increasing in ``μ``).
    """
    lo, hi = 0.0, 1.0
    while gaussian_epsilon(hi, delta) < epsilon:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_epsilon(mid, delta) < epsilon else (lo, mid)
    return hi


@dataclass(frozen=True)
class Power:
    """What the audit could see before the run, from public quantities only.

    ``fdp_needed``: for each f-DP pattern, the right guesses (out of its ``k``) that
    reject the claim (None: not even all of them); ``steinke_ceiling``: the ε–δ bound
    with every guess of the best pattern right. ``any``: some analysis can refute the
    claim at all.
    """

    fdp_needed: tuple[int | None, ...]
    fdp_guesses: tuple[int, ...]
    steinke_ceiling: float
    claimed: float
    steinke_guesses: int = 0

    @property
    def any(self) -> bool:
        return any(n is not None for n in self.fdp_needed) or self.steinke_ceiling > self.claimed

    def line(self, canaries: int) -> str:
        """The one line printed instead of "pass" when the run has no power."""
        most = max(*self.fdp_guesses, self.steinke_guesses, 0)
        return (f"no power: with {canaries} canaries, even {most} of {most} guesses right could not "
                f"refute the claim {self.claimed:.3g} (ε–δ ceiling {self.steinke_ceiling:.3g}); "
                "more canaries")


def audit_power(setup: OneRunSetup, claim: InverseCurve, claimed: float, delta: float) -> Power:
    """:class:`Power` of ``setup`` against ``claim`` (the f-DP analysis at ``alpha/2``, the
    ε–δ one at ``alpha/2``, each Bonferroni over its patterns).
    """
    m, half = setup.canaries, setup.alpha / 2
    guesses = tuple(round(a * m) + round(b * m) for a, b in setup.fdp_patterns)
    beta = half / len(setup.fdp_patterns)
    needed = tuple(needed_correct(claim, m, k, beta) if k else None for k in guesses)
    ceiling, most = 0.0, 0
    for a, b in setup.patterns:
        k = round(a * m) + round(b * m)
        if 0 < k <= m:
            ceiling = max(ceiling, one_run_epsilon(m, k, k, delta, half / len(setup.patterns)))
            most = max(most, k)
    return Power(needed, guesses, ceiling, claimed, most)


#: Canary counts :func:`planned_canaries` tries, fewest first.
CANARY_GRID = (1000, 2000, 3000, 4000, 5000, 6000, 8000, 10000, 15000, 20000)


def planned_canaries(
    mechanism: ResolvedMechanism, rounds: int, setup: OneRunSetup, *, alternative: float = 0.5,
    power: float = 0.9, trials: int = 200, seed: int = 0,
) -> int | None:
    """The fewest canaries of :data:`CANARY_GRID` with which the f-DP analysis catches a
    run whose noise is ``alternative·σ`` in at least ``power`` of ``trials`` simulated runs
    of a model built from public quantities only (σ, q, the rounds, the claim): each
    canary in by a fair coin, sampled at ``q`` in each round, its release shifted by
    ``C`` when sampled and noised at ``alternative·σ·C``, scored as :func:`canary_scores`
    scores (the ``rounds`` score); None if no count of the grid does. Public randomness
    (``seed``): the model is the auditor's, not the run's.
    """
    sigma, q = mechanism.noise_multiplier, mechanism.sampling_rate
    if sigma is None or not 0 < q < 1:
        raise ConfigError("planned canaries: the run must add noise and subsample (0 < q < 1)")
    claim = claim_curve(mechanism, rounds)
    beta = setup.alpha / 2 / len(setup.fdp_patterns)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xCA7,)))
    shift = 1.0 / sigma
    for m in CANARY_GRID:
        needed = [needed_correct(claim, m, round(a * m) + round(b * m), beta) for a, b in setup.fdp_patterns]
        if all(n is None for n in needed):
            continue
        caught = 0
        for _ in range(trials):
            included = rng.random(m) < 0.5
            sampled = (rng.random((m, rounds)) < q) & included[:, None]
            z = (sampled + rng.normal(0.0, alternative * sigma, (m, rounds))) / sigma
            scores = np.logaddexp(math.log1p(-q), math.log(q) + shift * z - 0.5 * shift**2).sum(axis=1)
            caught += any(n is not None and guess_counts(scores, included, a, b)[2] >= n
                          for (a, b), n in zip(setup.fdp_patterns, needed, strict=True))
        if caught >= power * trials:
            return m
    return None


def run_one_run_audit(setup: OneRunSetup | None = None, bug: str | None = None) -> dict[str, Any]:
    """Train once with ``m`` canaries (module docstring) and analyse the guesses twice:
    the ε–δ bound of Steinke et al. and the f-DP test of Mahloujifar et al. against the
    run's own curve; the result record (:func:`one_run_result`).
    """
    setup = setup or OneRunSetup()
    component = planted(bug)
    start = time.perf_counter()
    cfg = setup.run_config()
    data = load_dataset(cfg.data)
    if cfg.privacy.public_loss not in ("auto", "zero") or (cfg.privacy.public_loss == "auto"
                                                         and data.public_loss != "zero"):
        raise ConfigError(f"public-loss={str(cfg.privacy.public_loss)!r} on dataset {data.name!r}: the "
                          "one-run audit needs the zero-masking public view (no public gradient on a canary "
                          "column)")
    fleet = with_canaries(data, setup.canaries, setup.amplitude)
    included = _coins(setup.canaries, setup.coin_seed)
    model = build_model_for(cfg.training, fleet.data)
    weight = _first_layer(model.state_dict())
    with torch.no_grad():
        dict(model.named_parameters())[weight][:, torch.as_tensor(fleet.columns)] = 0.0
    recorder = Recorder(cfg.privacy.num_rounds, fleet.data.test_x, fleet.data.test_y)
    recorder.states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    honest = component.client()
    absent = tuple(int(c) for c in fleet.columns[~included])
    client = ClientParts(secrets=run_secrets(cfg), batches=honest.batches,
                         aggregate=WithoutAbsent(absent, honest.aggregate))
    server = component.server(cfg.training.seed)
    _, rows = run_centralised(cfg, fleet.data, model=model, evaluate_fn=recorder, server_parts=server,
                              client_parts=client)
    if len(rows) != cfg.privacy.num_rounds:
        raise RuntimeError(f"the audited run stopped after {len(rows)} of {cfg.privacy.num_rounds} rounds")
    scores = canary_scores(cfg, fleet, recorder.states, rows, setup.score)
    last = rows[-1]
    delta = float(last["delta"])
    half = setup.alpha / 2
    bound = one_run_bound(scores, included, delta, half, setup.patterns)
    mechanism = mechanism_for(cfg, fleet.data)
    claim = claim_curve(mechanism, len(rows))
    fdp = one_run_fdp(scores, included, claim, delta, half, setup.fdp_patterns)
    power = audit_power(setup, claim, float(last["epsilon"]), delta)
    seconds = time.perf_counter() - start
    return one_run_result(setup, cfg, bug, bound, last, mechanism, seconds, scores, included, fdp, power)


def one_run_result(
    setup: OneRunSetup, cfg: Config, bug: str | None, bound: Any, last: Mapping[str, Any], mechanism: Any,
    seconds: float, scores: np.ndarray, included: np.ndarray, fdp: OneRunFDP, power: Power,
) -> dict[str, Any]:
    """The JSON record of a one-run audit. ``violated``: the ε–δ lower bound exceeds the
    run's printed ε, or the f-DP analysis rejects the run's curve (each at ``alpha/2``:
    together a ``1 − alpha`` statement). ``power``: whether the run could have refuted
    the claim at all (public quantities only); without it the verdict says so.
    """
    claimed = float(last["epsilon"])
    delta = float(last["delta"])
    violated = bound.epsilon > claimed or fdp.claim_rejected
    if fdp.claim_rejected:
        verdict = "FAIL: the f-DP analysis rejects the run's curve"
    elif violated:
        verdict = "FAIL: lower bound above the claim"
    elif not power.any:
        verdict = power.line(setup.canaries)
    else:
        verdict = "pass"
    clip = mechanism.clipping
    in_scores, out_scores = scores[included], scores[~included]
    return {
        "audit": "one-run",
        "bug": bug,
        "epsilon_lower": round(bound.epsilon, 4),
        "epsilon_claimed": round(claimed, 4),
        "relation": str(last["relation"]),
        "delta": delta,
        "violated": violated,
        "verdict": verdict,
        "confidence": 1.0 - setup.alpha,
        "bound": ("Steinke, Nasr, Jagielski 2023: P[W >= v] <= P[Bin(r, e^eps/(1+e^eps)) >= v] "
                  "+ 2 m delta max_i P[v-i <= Bin < v]/i; the largest eps rejected at level "
                  "alpha/2/patterns, the best over the guess patterns (Bonferroni)"),
        "fdp": {
            "analysis": ("Mahloujifar, Melis, Chaudhuri 2024: the least mass an f-DP mechanism needs for "
                         "P[C >= c] >= beta, by their recursion; each pattern at alpha/2/patterns"),
            "claim_rejected": fdp.claim_rejected,
            "mu_lower": fdp.mu_lower,
            "epsilon_of_mu_lower": round(fdp.epsilon_of_mu, 4),
            "mu_of_claimed_epsilon": round(matching_mu(claimed, delta), 4),
            "guesses_in": fdp.guesses_in,
            "guesses_out": fdp.guesses_out,
            "correct": fdp.correct,
            "needed": fdp.needed,
            "patterns": [list(p) for p in setup.fdp_patterns],
            "needed_per_pattern": list(power.fdp_needed),
        },
        "power": power.any,
        "steinke_ceiling": round(power.steinke_ceiling, 4),
        "canaries": bound.canaries,
        "included": bound.included,
        "guesses": bound.guesses,
        "guesses_in": bound.guesses_in,
        "guesses_out": bound.guesses_out,
        "correct": bound.correct,
        "patterns": [list(p) for p in setup.patterns],
        "score": str(setup.score),
        "mean_score_in": float(np.mean(in_scores)) if len(in_scores) else None,
        "mean_score_out": float(np.mean(out_scores)) if len(out_scores) else None,
        "amplitude": setup.amplitude,
        "rounds": cfg.privacy.num_rounds,
        "num_records": mechanism.num_records,
        "sampling_rate": mechanism.sampling_rate,
        "noise_multiplier": mechanism.noise_multiplier,
        "accounted_noise_multiplier": mechanism.accounted_noise_multiplier,
        "clipping": {"quantile": clip.quantile, "count_noise": clip.count_noise, "first_norm": clip.norm,
                     "last_norm": float(last["clipping_norm"])},
        "accuracy": float(last.get("accuracy", math.nan)),
        "config": dict(setup.config),
        "secrets": noise_source(cfg.privacy.reproducible_noise),
        "coins": "os-csprng" if setup.coin_seed is None else f"seeded ({setup.coin_seed})",
        "seconds": round(seconds, 1),
    }


__all__ = [
    "CANARY_GRID", "CLAIM_DELTAS", "ONE_RUN_DEFAULTS", "CanaryFleet", "OneRunSetup", "Power", "Recorder",
    "Score",
    "WithoutAbsent", "audit_power", "canary_scores", "claim_curve", "matching_mu", "one_run_result",
    "planned_canaries", "run_one_run_audit", "with_canaries",
]
