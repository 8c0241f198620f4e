"""The canary audit of the CorrDP relation: one round of the real ``corrdp`` client and
strategy per trial, canaries that differ in one insensitive feature.

Relation and claim
------------------
CorrDP neighbours replace one record's sensitive features, or one insensitive feature
``j`` (labels fixed, Def. 2.1). For the class ``feature:j`` the run's accountant
certifies ``ε_c`` (:class:`~fedfdp.corrdp.accounting.CorrDPAccountant`: per-class
Gaussian pair with ``μ_c``, min of the revealed-coin and whole-record bounds), and the
run's CorrDP ε is ``max_c d_c ε_c`` with ``d_c = TV(j)``: a change of feature ``j``
may be distinguished up to ``ε/TV(j) ≥ ε_c``. The audit's 95% lower bound on the
privacy loss of a feature-``j`` replacement must stay **≤ ε_c** (the stricter of the
two; both are reported).

The TV claimed for every canary feature is the inflated in-sample estimate ``TṼ`` of
Def. 3.10 on ``estimate_records`` records of :func:`fedfdp.corrdp.correlated_features`
with correlation ``ρ`` (TV = ρ in closed form); the raw estimate ``T̂V`` is what the
planted bug ``tv-no-inflation`` scales the noise by (:mod:`simulations.auditing.bugs`).

Canaries (white-box)
--------------------
Inputs: one sensitive column ``s0`` and one insensitive column ``u_k`` per canary,
``|x| ≤ B = 1``; canary ``k`` is the only record on device ``k``:
``x = (s0 = 0, u_k = ±1, 0 elsewhere)``, label 1. The audited model is ``W = 0, b = 0``
(``Θ`` holds every model, so the auditor may choose it), hence the residual is
``r = (½, −½)`` in both worlds and canary ``k``'s gradient moves only block ``u_k``:
``r·x_k``, norm ``0.71 ≫ C_k = C·s_k``, clipped to ``±C_k r̂`` (world 1: ``+1``;
world 2, the neighbour: ``−1``). Blocks are disjoint and the noise independent per
coordinate, so the canaries of a round are independent trials of the pair
``N(+C_k/σ_k, 1)`` vs ``N(−C_k/σ_k, 1)`` on the statistic ``T = S[:, u_k]·r̂/σ_k``
(``σ_k`` the claimed std), while the claimed ``μ_c`` adds only cross terms of order
``D`` (``corrdp-weight-bound`` is set small, so the claim is nearly tight). The
learning rate is small enough that the step stays inside ``Θ`` (no projection), and the
auditor recovers the noisy sum ``S = −ΔW·(qN)/η`` exactly (plain SGD, first step).

Test choice on the first third of the rounds, the bound on the rest
(:func:`fedfdp.audit.choose_test`, :func:`fedfdp.audit.evaluate_test`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clients.client_app import reply_message
from clients.node_runtime import NodeRecords
from fedfdp import protocol as P
from fedfdp.audit import ALPHA, choose_test, evaluate_test
from fedfdp.config import Config, ConfigError, load_config
from fedfdp.contribution import ClientParts
from fedfdp.corrdp.noise import CorrDPGaussianMechanism
from fedfdp.corrdp.synthetic import correlated_features
from fedfdp.corrdp.tv import TVEstimate, estimate_tvs
from fedfdp.data import DeviceData, FederatedData
from fedfdp.entropy import SeededEntropy
from fedfdp.features import FeatureSpec
from fedfdp.round_engine import ServerParts
from fedfdp.run_plan import build_plan, client_parts_for, server_parts_for
from simulations.auditing.bugs import corrdp_planted
from simulations.auditing.inprocess import node_train, set_identity, train_messages
from strategies.fdp_strategy import FDPStrategy

WORLD1, WORLD2 = 1, 2
LEARNING_RATE = 1e-4


@dataclass(frozen=True)
class CorrDPAuditSetup:
    """What one CorrDP canary audit runs.

    Attributes
    ----------
    noise_multiplier, clipping_norm, sampling_rate : float
        ``σ``, ``C``, ``q`` of the audited round (``q = 1``: every trial a Gaussian pair).
    delta : float
        δ of the claim and of the bound.
    rounds, canaries : int
        Rounds of the real code; canaries per round (one insensitive feature each).
    correlation, estimate_records, min_value_prob : float, int, float
        The in-sample estimate the claimed TV comes from (module docstring).
    weight_bound : float
        ``D``: small, so that the claimed ``μ_c`` is nearly the canary's own shift.
    calibration, alpha, seed, secret_seed
        As :class:`simulations.auditing.canaries.AuditSetup`.
    """

    noise_multiplier: float = 0.5
    clipping_norm: float = 1.0
    sampling_rate: float = 1.0
    delta: float = 0.01
    rounds: int = 300
    canaries: int = 48
    correlation: float = 0.1
    estimate_records: int = 20_000
    min_value_prob: float = 0.45
    weight_bound: float = 0.01
    calibration: float = 1.0 / 3.0
    alpha: float = ALPHA
    seed: int = 0
    secret_seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "clipping_norm", "weight_bound"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name.replace('_', '-')}={getattr(self, name)}: must be > 0")
        if not 0 < self.sampling_rate <= 1:
            raise ConfigError(f"sampling-rate={self.sampling_rate}: must be in (0, 1]")
        if not 0 < self.delta < 1:
            raise ConfigError(f"delta={self.delta}: must be in (0, 1)")
        if self.rounds < 3 or self.canaries < 1:
            raise ConfigError(
                f"rounds={self.rounds}, canaries={self.canaries}: need >= 3 rounds and >= 1 canary"
            )


def claimed_tv(setup: CorrDPAuditSetup) -> TVEstimate:
    """The in-sample estimate (Def. 3.10) whose inflated ``TṼ`` every canary feature
    is declared with: one sensitive and one insensitive column of
    :func:`~fedfdp.corrdp.correlated_features` at ``correlation``, binned at 0.
    """
    data = correlated_features(setup.estimate_records, 1, 1, setup.correlation, seed=setup.seed)
    (est,) = estimate_tvs(
        {"s0": data.x[:, 0]}, {"u0": data.x[:, 1]}, data.bins(), setup.min_value_prob, setup.delta / 2
    ).values()
    return est


@dataclass
class CorrDPCanaries:
    """The canaries' configuration, dataset, crafted model and claimed TV."""

    setup: CorrDPAuditSetup
    cfg: Config
    spec: FeatureSpec
    estimate: TVEstimate

    @property
    def columns(self) -> list[int]:
        """Input column of every canary's feature."""
        return list(range(1, self.setup.canaries + 1))

    def devices(self, worlds: np.ndarray) -> FederatedData:
        """Canary ``k`` alone on device ``k``, its feature ``+1`` (world 1) or ``−1``."""
        k = self.setup.canaries
        x = np.zeros((k, k + 1), dtype=np.float32)
        x[np.arange(k), self.columns] = np.where(worlds == WORLD1, 1.0, -1.0)
        devs = tuple(DeviceData(x[j : j + 1], np.ones(1, dtype=np.int64)) for j in range(k))
        return FederatedData("audit-corrdp-canaries", self.spec, devs, x[:1].copy(),
                             np.ones(1, dtype=np.int64), ("other", "canary"), input_bound=1.0)


def design(setup: CorrDPAuditSetup) -> CorrDPCanaries:
    """Build the canaries' configuration and schema (module docstring)."""
    k = setup.canaries
    names = ("s0", *(f"u{j:03d}" for j in range(k)))
    spec = FeatureSpec(columns=names, public=names[1:], private=("s0",))
    est = claimed_tv(setup)
    cfg = load_config({
        "mode": "corrdp", "model": "logistic", "noise-multiplier": setup.noise_multiplier,
        "sampling-rate": setup.sampling_rate, "clipping-norm": setup.clipping_norm,
        "delta": setup.delta, "num-rounds": 1, "num-devices": k, "learning-rate": LEARNING_RATE,
        "momentum": 0.0, "optimizer": "sgd", "insensitive-tv": f"*={est.tv_tilde!r}",
        "corrdp-weight-bound": setup.weight_bound, "corrdp-feature-bound": 1.0, "progress": False,
    })  # fmt: skip
    return CorrDPCanaries(setup, cfg, spec, est)


def one_round(
    can: CorrDPCanaries, seed: int, worlds: np.ndarray, parts: tuple[ServerParts, ClientParts], trial: int
) -> np.ndarray:
    """One round of the real strategy and client with the server and node ``parts``
    (built once per audit: they depend on the canaries' schema, not on their values);
    the statistic ``T`` of every canary.
    """
    setup = can.setup
    cfg = dataclasses.replace(can.cfg, training=dataclasses.replace(can.cfg.training, seed=seed))
    data = can.devices(worlds)
    server, client = parts
    if setup.secret_seed is not None:
        key = np.random.SeedSequence([setup.secret_seed, trial]).generate_state(1)[0]
        secrets = SeededEntropy(int(key))
        client = dataclasses.replace(client, secrets=secrets)
        server = dataclasses.replace(server, secrets=secrets)
    strat = FDPStrategy(build_plan(cfg, data, server_parts=server))
    with torch.no_grad():
        for p in strat.model.parameters():
            p.zero_()
    strat.registry = {0: (list(range(setup.canaries)), [1] * setup.canaries)}
    strat.resolve()
    (msg,) = train_messages(strat, 1)
    current = strat.engine.in_flight
    if current is None:
        raise RuntimeError("corrdp audit: no round in flight")
    normaliser = current.plan.normaliser
    state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
    records = NodeRecords.partition_of(data, 0, 1)
    priv, pub, metrics = node_train(cfg, records, state, msg.content.config_records[P.CONFIG], client)
    outcome = strat.collect(1, [reply_message(msg, priv, pub, metrics)])
    if outcome.stats.rejected:
        raise RuntimeError("corrdp audit: the server rejected the honest node's reply")
    weight = strat.model.state_dict()["0.weight"].double()
    released = -weight * normaliser / LEARNING_RATE
    direction = torch.tensor([1.0, -1.0], dtype=torch.float64) / math.sqrt(2.0)  # r̂ of label 1 at W = 0
    return (direction @ released[:, can.columns]).numpy() / claimed_std(can)


def claimed_std(can: CorrDPCanaries) -> float:
    """The noise std of a canary's block that the honest design (the claim) adds."""
    data = can.devices(np.full(can.setup.canaries, WORLD1))
    s = can.setup
    mechanism = server_parts_for(can.cfg, data).mechanism(s.noise_multiplier, s.clipping_norm)
    if not isinstance(mechanism, CorrDPGaussianMechanism):
        raise RuntimeError(f"corrdp audit: server mechanism is {type(mechanism).__name__}, not CorrDP's")
    return float(mechanism.stds[0][0, can.columns[0]])


@dataclass(frozen=True)
class CorrDPClaim:
    """What the accountant claims for one round: ``ε_c`` of the canaries' class, the
    run's CorrDP ε and ``ε/TV`` (the relation's allowance for a feature change).
    """

    class_epsilon: float
    corrdp_epsilon: float
    tv: float

    @property
    def allowance(self) -> float:
        return self.corrdp_epsilon / self.tv if self.tv > 0 else math.inf


def claim(can: CorrDPCanaries) -> CorrDPClaim:
    """The honest server's accounting of one round (its plan's σ, q) at δ."""
    s = can.setup
    data = can.devices(np.full(s.canaries, WORLD1))
    accounting = server_parts_for(can.cfg, data).accounting
    acc = accounting.new()
    acc.compose(accounting.family(s.noise_multiplier, s.sampling_rate, 1.0))
    bound = acc.epsilon_bound(s.delta)
    feature = [c.epsilon for c in bound.classes if c.name.startswith("feature:")]
    if not feature:
        raise RuntimeError("corrdp audit: the canaries' class is dominated; no claim to audit")
    return CorrDPClaim(max(feature), bound.epsilon, can.estimate.tv_tilde)


def collect(can: CorrDPCanaries, bug: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(world, round, statistic)`` of every canary-trial of ``setup.rounds`` rounds."""
    s = can.setup
    rng = np.random.default_rng(np.random.SeedSequence(s.seed, spawn_key=(0xC022D,)))
    world = np.empty((s.rounds, s.canaries), dtype=np.int64)
    stat = np.empty((s.rounds, s.canaries))
    schema = can.devices(np.full(s.canaries, WORLD1))
    parts = (corrdp_planted(bug).server(can.cfg, schema, can.estimate), client_parts_for(can.cfg, schema))
    set_identity()
    server_log = logging.getLogger("fedfdp.server")
    level = server_log.level
    server_log.setLevel(logging.ERROR)
    try:
        for r in range(s.rounds):
            world[r] = rng.choice([WORLD1, WORLD2], size=s.canaries)
            stat[r] = one_round(can, int(rng.integers(2**31 - 1)), world[r], parts, r)
    finally:
        server_log.setLevel(level)
    return world.ravel(), np.repeat(np.arange(s.rounds), s.canaries), stat.ravel()


def run_corrdp_audit(setup: CorrDPAuditSetup | None = None, bug: str | None = None) -> dict[str, Any]:
    """Run the CorrDP canary audit; the result record (lower bound vs ``ε_c``)."""
    setup = setup or CorrDPAuditSetup()
    corrdp_planted(bug)  # unknown names refused before any work
    start = time.perf_counter()
    can = design(setup)
    claimed = claim(can)
    world, rounds, stat = collect(can, bug)
    cal = rounds < max(1, round(setup.calibration * setup.rounds))
    held = ~cal
    sizes = (int(np.sum(world[held] == WORLD1)), int(np.sum(world[held] == WORLD2)))
    test, cal_eps = choose_test(
        {"projection": stat[cal & (world == WORLD1)]}, {"projection": stat[cal & (world == WORLD2)]},
        setup.delta, setup.alpha, sizes=sizes,
    )  # fmt: skip
    b = evaluate_test(test, stat[held & (world == WORLD1)], stat[held & (world == WORLD2)], setup.delta,
                      setup.alpha)
    violated = b.epsilon > claimed.class_epsilon
    return {
        "epsilon_lower": round(b.epsilon, 4),
        "epsilon_claimed": round(claimed.class_epsilon, 4),
        "epsilon_corrdp": round(claimed.corrdp_epsilon, 4),
        "allowance": round(claimed.allowance, 4),
        "relation": "corrdp",
        "neighbours": "one insensitive feature replaced (+1 -> -1), labels fixed",
        "tv_claimed": round(can.estimate.tv_tilde, 4),
        "tv_hat": round(can.estimate.tv_hat, 4),
        "tv_inflation": round(can.estimate.inflation, 4),
        "delta": setup.delta,
        "trials": b.positives + b.negatives,
        "bug": bug,
        "violated": violated,
        "verdict": "FAIL: lower bound above the claim" if violated else "pass",
        "positives": b.positives,
        "negatives": b.negatives,
        "false_positive_rate": b.fpr,
        "false_negative_rate": b.fnr,
        "alpha": b.alpha,
        "test": {"statistic": test.statistic, "sign": test.sign, "threshold": test.threshold},
        "calibration_epsilon": round(cal_eps, 4),
        "rounds": setup.rounds,
        "canaries": setup.canaries,
        "sampling_rate": setup.sampling_rate,
        "noise_multiplier": setup.noise_multiplier,
        "clipping_norm": setup.clipping_norm,
        "weight_bound": setup.weight_bound,
        "seed": setup.seed,
        "secrets": "os-csprng" if setup.secret_seed is None else f"seeded ({setup.secret_seed})",
        "seconds": round(time.perf_counter() - start, 1),
    }
