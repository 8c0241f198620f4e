"""The canary audit's harness: one round of the real client and strategy per trial.

Used by ``fedfdp audit`` (:mod:`simulations.audit`); the statistics live in
:mod:`fedfdp.audit`.

Neighbouring worlds, per canary record ``x``:

* *world 1*: ``x`` is a training record (its private features ``a``);
* *replacement* (Def. 5 of the FDP paper): ``x`` replaced by ``x'`` with the
  same ``Ψ`` and private features ``−a``;
* *add/remove* (Def. 6): the simulator of Algorithm 2 (appendix) — ``x``'s
  private contribution absent (the private part is computed without it), its
  public features still in the public batch (the public part is computed over
  all records, ``x``'s ``Ψ`` included). The server's ``N`` counts ``x`` in both
  worlds (``N`` is public).

One *trial* is one round of the real code (:func:`one_round`): the strategy
(:class:`~strategies.fdp_strategy.FDPStrategy`) configures the round, the
client (:func:`clients.client_app.handle_train`) computes its reply, the
strategy aggregates (noise once, divides by ``q·N``, steps the model). The
auditor sees what the server releases: the model update ``w_t − w_{t+1}`` and
the public sums and counts of the replies (disclosed by design). From them it
recovers the noisy private sum ``S = (Δw/η − Σ S_pub/Σ n_pub)·q·N/α`` (exact
for plain SGD's first step) and tests.

White-box canaries
------------------
The model at the audited round is crafted (the guarantee holds for every
``w_t``): one hidden layer whose unit ``j`` is active only for canary ``j``
(public column ``j`` set to 1), with zero weights on the private column. With
zero-masking public loss (``ℓ_pub`` = loss on the record with its private
column zeroed) canary ``j``'s private gradient is exactly ``δ_j · a`` on the
single weight ``W1[j, private]`` and zero elsewhere; with ``|a| = 1000`` it is
far above ``C``, so clipped it is ``+C`` on that coordinate (checked through
the real per-record code when the design is built). Canaries are orthogonal;
with independent per-record Poisson coins and isotropic noise, the per-canary
observations of one round are independent trials, so each round yields one
trial per canary. Each canary lives on its own device so that per-device
steps (the normalisation bug) cannot couple canaries.

Two canary groups:

``alone``
    the canary is its device's only record. Statistics: the projection
    ``T = S·u/(σC)`` (``u``: the canary's coordinate), and ``T`` when the
    canary's public gradient shows up in the public sum (``−inf`` otherwise):
    the white-box view of a public batch that reveals the Poisson coins.
``twins``
    the canary shares its device with ``twin-count`` records of the same Ψ
    whose private value is ``−a`` (private gradients ``−C u``): a
    normalisation by the realised device batch shows up as a scale on a large,
    known sum.

Every canary draws its world independently per round. The statistic, its
direction, its threshold and the group are chosen on the first third of the
rounds (:func:`fedfdp.audit.choose_test`); the bound is computed on the other
rounds (:func:`fedfdp.audit.evaluate_test`: Clopper–Pearson, ``α/2`` per error
rate).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord

import clients.client_app as client_app
from clients.client_app import NodeRecords, reply_message
from fedfdp import faults
from fedfdp import protocol as P
from fedfdp.accounting import FDPAccountant
from fedfdp.algorithm import build_decomposition
from fedfdp.audit import ALPHA, AuditResult, choose_test, evaluate_test
from fedfdp.budget import Budget
from fedfdp.config import Config, ConfigError, load_config
from fedfdp.contribution import private_batch_sum, public_batch_sum
from fedfdp.data import DeviceData, FederatedData
from fedfdp.features import FeatureSpec
from fedfdp.modes import PHASES
from strategies.fdp_strategy import FDPStrategy
from strategies.inprocess import set_identity, train_messages

#: A canary's world in one trial.
WORLD1, ADD_REMOVE, REPLACEMENT = 1, 2, 3
RELATION_WORLDS = {"add-remove": ADD_REMOVE, "replacement": REPLACEMENT}
#: Canary groups.
ALONE, TWINS = 0, 1
GROUP_NAMES = {ALONE: "alone", TWINS: "twins"}


@dataclass(frozen=True)
class AuditSetup:
    """What one canary audit runs.

    Attributes
    ----------
    sampling_rate, noise_multiplier, clipping_norm : float
        ``q``, ``σ``, ``C`` of the audited round (one round: one privacy event).
    delta : float
        δ of the claimed and of the measured ε.
    rounds : int
        Rounds of the real code; each yields one trial per canary.
    alone, twins : int
        Canaries of each group (one device each).
    twin_count : int
        Records beside each ``twins`` canary on its device.
    amplitude : float
        ``|a|``, the canary's private value (its raw gradient is ≫ ``C``).
    public_batch_size : int
        ``m'`` of the round.
    calibration : float
        Share of the rounds used to choose the test.
    alpha : float
        1 − confidence of the bound.
    seed : int
        Seed of the trials (world assignment and every round's run seed).
    """

    sampling_rate: float = 0.07
    noise_multiplier: float = 0.5
    clipping_norm: float = 1.0
    delta: float = 0.01
    rounds: int = 400
    alone: int = 48
    twins: int = 24
    twin_count: int = 100
    amplitude: float = 1000.0
    public_batch_size: int = 1
    calibration: float = 1.0 / 3.0
    alpha: float = ALPHA
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.sampling_rate < 1:
            raise ConfigError(f"sampling-rate={self.sampling_rate}: the audit needs q in (0, 1)")
        for name in ("noise_multiplier", "clipping_norm", "amplitude"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name.replace('_', '-')}={getattr(self, name)}: must be > 0")
        if not 0 < self.delta < 1:
            raise ConfigError(f"delta={self.delta}: must be in (0, 1)")
        if self.rounds < 3:
            raise ConfigError(f"rounds={self.rounds}: need at least 3 (calibration and test)")
        if self.alone < 0 or self.twins < 0 or self.alone + self.twins < 1:
            raise ConfigError(f"alone={self.alone}, twins={self.twins}: need at least one canary")
        if not 0 < self.calibration < 1:
            raise ConfigError(f"calibration={self.calibration}: must be in (0, 1)")


def claimed_epsilon(setup: AuditSetup, relation: str) -> float:
    """ε the project's accountant claims for one round of ``(q, σ)`` at ``δ``
    (add/remove: Theorem 5; replacement: the accountant's Prop. 1 bound)."""
    acc = FDPAccountant()
    acc.compose(setup.noise_multiplier, setup.sampling_rate)
    return acc.epsilon(setup.delta, relation)


class _CachedAccountant(FDPAccountant):
    """The strategy's running ε is not part of what the server releases; every
    trial builds a fresh one-round strategy, so the ε of that one ledger is
    computed once per process."""

    _cache: dict[Any, Any] = {}  # noqa: RUF012 (shared on purpose)

    def epsilon_bound(self, delta: float, relation: str = "add-remove"):  # type: ignore[override]
        key = (self.ledger, float(delta), relation, self.eps_error, self.delta_error)
        if key not in self._cache:
            self._cache[key] = super().epsilon_bound(delta, relation)
        return self._cache[key]


# --------------------------------------------------------------------------------------
# canaries and the crafted model
# --------------------------------------------------------------------------------------


@dataclass
class CanaryDesign:
    """Canary records, the crafted model and what the auditor knows about them."""

    setup: AuditSetup
    cfg: Config
    spec: FeatureSpec
    groups: np.ndarray
    canary_x: np.ndarray
    canary_y: np.ndarray
    twin_x: np.ndarray
    state: dict[str, torch.Tensor]
    private_weight: str = "0.weight"
    public_marker: str = "0.bias"
    private_column: int = 0
    marker: np.ndarray = field(default_factory=lambda: np.ones(1))

    @property
    def num_canaries(self) -> int:
        return len(self.groups)

    def devices(self, worlds: np.ndarray, view: str) -> FederatedData:
        """The devices of one trial. Device ``j`` holds canary ``j`` (last) after
        its twins. ``view="private"``: an add/remove world-2 canary is absent, a
        replacement world-2 canary has private value ``−a``. ``view="public"``:
        every canary as in world 1 (the public part only reads Ψ)."""
        d = self.canary_x.shape[1]
        devs = []
        for j in range(self.num_canaries):
            rows = [self.twin_x[j]] * (self.setup.twin_count if self.groups[j] == TWINS else 0)
            w = WORLD1 if view == "public" else worlds[j]
            if w == WORLD1:
                rows.append(self.canary_x[j])
            elif w == REPLACEMENT:
                rows.append(self.twin_x[j])
            x = np.array(rows, dtype=np.float32).reshape(len(rows), d)
            devs.append(DeviceData(x, np.full(len(rows), self.canary_y[j], dtype=np.int64)))
        return FederatedData(
            name="audit-canaries",
            spec=self.spec,
            devices=tuple(devs),
            test_x=self.canary_x[:1].copy(),
            test_y=self.canary_y[:1].copy(),
            class_names=("other", "canary"),
            public_loss="zero",
        )


def design(setup: AuditSetup) -> CanaryDesign:
    """Build canaries, devices' records and the crafted model (module docstring).

    Checks, through the real per-record code (:func:`fedfdp.contribution.private_batch_sum`
    and :func:`~fedfdp.contribution.public_batch_sum`), that canary ``j``'s
    clipped private gradient is ``+C`` on ``W1[j, private]`` and zero elsewhere,
    and reads off its public-gradient marker on ``b1[j]``.
    """
    k = setup.alone + setup.twins
    pub = tuple(f"unit_{j:03d}" for j in range(k))
    spec = FeatureSpec(columns=(*pub, "secret"), public=pub, private=("secret",))
    groups = np.array([ALONE] * setup.alone + [TWINS] * setup.twins)
    canary_x = np.zeros((k, k + 1), dtype=np.float32)
    canary_x[np.arange(k), np.arange(k)] = 1.0
    canary_x[:, k] = setup.amplitude
    twin_x = canary_x.copy()
    twin_x[:, k] = -setup.amplitude
    canary_y = np.ones(k, dtype=np.int64)
    cfg = load_config(
        {
            "mode": "fdp",
            "model": "mlp",
            "hidden-sizes": [k],
            "public-loss": "zero",
            "noise-multiplier": setup.noise_multiplier,
            "target-epsilon": 0,
            "sampling-rate": setup.sampling_rate,
            "clipping-norm": setup.clipping_norm,
            "public-batch-size": setup.public_batch_size,
            "delta": setup.delta,
            "num-rounds": 1,
            "num-devices": k,
            "alpha": 1.0,
            "learning-rate": 1.0,
            "momentum": 0.0,
            "optimizer": "sgd",
            "progress": False,
        }
    )
    w1 = torch.zeros(k, k + 1)
    w1[:, :k] = torch.eye(k)
    state = {
        "0.weight": w1,
        "0.bias": torch.full((k,), -0.5),
        "2.weight": torch.stack([torch.ones(k), torch.zeros(k)]),
        "2.bias": torch.zeros(2),
    }
    des = CanaryDesign(setup, cfg, spec, groups, canary_x, canary_y, twin_x, state, private_column=k)
    des.marker = _check_design(des)
    return des


def _check_design(des: CanaryDesign) -> np.ndarray:
    """White-box check of the canaries' gradients; returns each canary's
    public-gradient marker (its public gradient on ``b1[j]``)."""
    from fedfdp.algorithm import build_model_for

    data = des.devices(np.full(des.num_canaries, WORLD1), "public")
    model = build_model_for(des.cfg, data)
    model.load_state_dict(des.state)
    dec = build_decomposition(des.cfg, data)
    gen = torch.Generator().manual_seed(0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    markers = np.zeros(des.num_canaries)
    c = des.setup.clipping_norm
    for j in range(des.num_canaries):
        x = torch.as_tensor(des.canary_x[j : j + 1])
        y = torch.as_tensor(des.canary_y[j : j + 1])
        grads = dict(
            zip(names, private_batch_sum(model, dec, PHASES["fdp"], x, y, clipping_norm=c, padding=gen),
                strict=True)
        )
        expect = {n: torch.zeros_like(g) for n, g in grads.items()}
        expect[des.private_weight][j, des.private_column] = c
        if not all(torch.allclose(grads[n], expect[n], atol=1e-5 * c) for n in names):
            raise RuntimeError(f"canary {j}: clipped private gradient is not +C on its coordinate")
        pub, _ = public_batch_sum(model, dec, x, y, padding=gen)
        markers[j] = float(dict(zip(names, pub, strict=True))[des.public_marker][j])
    if not np.all(markers > 0):
        raise RuntimeError("a canary's public gradient has no marker")
    return markers


# --------------------------------------------------------------------------------------
# trials through the real client and strategy
# --------------------------------------------------------------------------------------


def _sum_arrays(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None):
    if a is None or b is None:
        return a if b is None else b
    return {k: a[k] + b[k] for k in a}


def one_round(des: CanaryDesign, seed: int, worlds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One round of the real strategy and client with the canaries in ``worlds``.

    Returns per-canary projections of the released private sum on the canary's
    coordinate (units of ``σC``) and the number of records with the canary's Ψ
    in the public batch (read from the public sum).
    """
    cfg = dataclasses.replace(des.cfg, run=dataclasses.replace(des.cfg.run, seed=seed))
    public_view = des.devices(worlds, "public")
    private_view = des.devices(worlds, "private")
    strat = FDPStrategy(cfg, public_view)
    strat.model.load_state_dict(des.state)
    strat.registry = {0: (list(range(des.num_canaries)), [len(d) for d in public_view.devices])}
    strat.resolve()
    if strat.plan is None:
        raise RuntimeError("canary audit: the strategy resolved no privacy plan")
    strat.budget = Budget(strat.plan, _CachedAccountant())
    before = strat.model.state_dict()[des.private_weight].clone()
    (msg,) = train_messages(strat, 1)
    state = msg.content[P.ARRAYS].to_torch_state_dict()
    private_records = NodeRecords.partition_of(private_view, 0, 1)
    conf = msg.content[P.CONFIG]
    absent = np.flatnonzero(worlds == ADD_REMOVE)
    if len(absent) == 0:
        priv, pub, metrics = client_app.handle_train(cfg, private_records, state, conf)
    else:
        # Algorithm 2: the private part without the absent canaries; the public
        # part of their devices over all their records (their Ψ included).
        ids = [int(d) for d in conf[P.DEVICE_IDS]]  # device j holds canary j
        counts = list(conf[P.PUBLIC_COUNTS])
        pos = [i for i, d in enumerate(ids) if d in set(absent.tolist())]
        first = ConfigRecord(dict(conf))
        first[P.PUBLIC_COUNTS] = [0 if i in pos else c for i, c in enumerate(counts)]
        second = ConfigRecord(dict(conf))
        second[P.DEVICE_IDS] = [ids[i] for i in pos]
        second[P.PUBLIC_COUNTS] = [counts[i] for i in pos]
        if P.PRIVATE_FLAGS in conf:
            flags = list(conf[P.PRIVATE_FLAGS])
            second[P.PRIVATE_FLAGS] = [flags[i] for i in pos]
        priv, pub, metrics = client_app.handle_train(cfg, private_records, state, first)
        public_records = NodeRecords.partition_of(public_view, 0, 1)
        _, pub2, metrics2 = client_app.handle_train(cfg, public_records, state, second)
        pub = _sum_arrays(pub, pub2)
        metrics = {key: metrics[key] + metrics2[key] for key in metrics}
    strat.aggregate_train(1, [reply_message(msg, priv, pub, metrics)])
    after = strat.model.state_dict()[des.private_weight]
    t = cfg.training
    grad = (before - after).double() / t.learning_rate
    count = metrics[P.PUBLIC_COUNT]
    pub_w = pub[des.private_weight].double() if pub is not None else torch.zeros_like(grad)
    g_pub = pub_w / count if count else torch.zeros_like(grad)
    released = (grad - g_pub) * cfg.privacy.sampling_rate * strat.num_records / t.alpha
    scale = cfg.privacy.noise_multiplier * cfg.privacy.clipping_norm
    proj = released[:, des.private_column].numpy() / scale
    marks = pub[des.public_marker].double().numpy() if pub is not None else np.zeros(des.num_canaries)
    return proj, np.rint(marks / des.marker)


@dataclass
class Observations:
    """Per-canary trials: ``world``, ``group``, ``round`` index, ``projection``
    (``T``) and ``public`` (records with the canary's Ψ in the public batch)."""

    world: np.ndarray
    group: np.ndarray
    round: np.ndarray
    projection: np.ndarray
    public: np.ndarray


def collect(des: CanaryDesign, relations: Sequence[str], bug: str | None = None) -> Observations:
    """Run ``setup.rounds`` rounds; each canary draws its world uniformly from
    world 1 and the world 2 of each relation, independently per round."""
    setup = des.setup
    rng = np.random.default_rng(np.random.SeedSequence(setup.seed, spawn_key=(0xA0D17,)))
    choices = np.array([WORLD1, *(RELATION_WORLDS[r] for r in relations)])
    k = des.num_canaries
    world = np.empty((setup.rounds, k), dtype=np.int64)
    proj = np.empty((setup.rounds, k))
    pub = np.empty((setup.rounds, k))
    set_identity()
    with faults.planted_bug(bug):
        for r in range(setup.rounds):
            world[r] = rng.choice(choices, size=k)
            proj[r], pub[r] = one_round(des, int(rng.integers(2**31 - 1)), world[r])
    return Observations(
        world=world.ravel(),
        group=np.tile(des.groups, setup.rounds),
        round=np.repeat(np.arange(setup.rounds), k),
        projection=proj.ravel(),
        public=pub.ravel(),
    )


def _statistics(obs: Observations, mask: np.ndarray, group: int) -> dict[str, np.ndarray]:
    m = mask & (obs.group == group)
    t = obs.projection[m]
    out = {"projection": t}
    if group == ALONE:
        out["projection-if-public"] = np.where(obs.public[m] >= 1, t, -np.inf)
    return out


def analyse(obs: Observations, setup: AuditSetup, relation: str, rounds_run: int) -> AuditResult:
    """Choose the test on the calibration rounds, bound ε on the others."""
    w2 = RELATION_WORLDS[relation]
    cal = obs.round < max(1, round(setup.calibration * rounds_run))
    best = None
    for group in (ALONE, TWINS):
        if not np.any(obs.group == group):
            continue
        stats_ = _statistics(obs, cal, group)
        w = obs.world[cal & (obs.group == group)]
        if not np.any(w == WORLD1) or not np.any(w == w2):
            continue
        w_held = obs.world[~cal & (obs.group == group)]
        sizes = (int(np.sum(w_held == WORLD1)), int(np.sum(w_held == w2)))
        if min(sizes) == 0:
            continue
        test, e = choose_test(
            {s: v[w == WORLD1] for s, v in stats_.items()},
            {s: v[w == w2] for s, v in stats_.items()},
            setup.delta,
            setup.alpha,
            sizes=sizes,
        )
        if best is None or e > best[2]:
            best = (group, test, e)
    if best is None:
        raise RuntimeError("no calibration trials in both worlds: increase rounds")
    group, test, cal_eps = best
    held = ~cal
    stats_ = _statistics(obs, held, group)
    w = obs.world[held & (obs.group == group)]
    bound = evaluate_test(
        test, stats_[test.statistic][w == WORLD1], stats_[test.statistic][w == w2], setup.delta,
        setup.alpha,
    )
    test = dataclasses.replace(test, statistic=f"{GROUP_NAMES[group]}/{test.statistic}")
    return AuditResult(
        epsilon_lower=bound.epsilon,
        epsilon_claimed=claimed_epsilon(setup, relation),
        relation=relation,
        delta=setup.delta,
        trials=bound.positives + bound.negatives,
        test=test,
        bound=bound,
        calibration_epsilon=cal_eps,
    )


def run_audit(
    setup: AuditSetup | None = None,
    relations: Sequence[str] = ("add-remove",),
    bug: str | None = None,
) -> list[dict[str, Any]]:
    """Run the canary audit; one result dictionary per relation (see :func:`result_dict`)."""
    setup = setup or AuditSetup()
    for r in relations:
        if r not in RELATION_WORLDS:
            raise ValueError(f"relation={r!r}: must be add-remove or replacement")
    if bug is not None and bug not in faults.BUGS:
        raise ValueError(f"--break {bug!r}: unknown (known: {', '.join(faults.BUGS)})")
    start = time.perf_counter()
    des = design(setup)
    obs = collect(des, relations, bug)
    seconds = time.perf_counter() - start
    return [result_dict(analyse(obs, setup, r, setup.rounds), setup, bug, seconds) for r in relations]


def result_dict(res: AuditResult, setup: AuditSetup, bug: str | None, seconds: float) -> dict[str, Any]:
    """The JSON record of one audit."""
    b = res.bound
    return {
        "epsilon_lower": round(res.epsilon_lower, 4),
        "epsilon_claimed": round(res.epsilon_claimed, 4),
        "relation": res.relation,
        "delta": res.delta,
        "trials": res.trials,
        "bug": bug,
        "violated": res.violated,
        "verdict": "FAIL: lower bound above the claim" if res.violated else "pass",
        "positives": b.positives,
        "negatives": b.negatives,
        "false_positive_rate": b.fpr,
        "false_negative_rate": b.fnr,
        "fpr_upper": b.fpr_upper,
        "fnr_upper": b.fnr_upper,
        "alpha": b.alpha,
        "confidence": "Clopper-Pearson, alpha/2 on each error rate",
        "test": {"statistic": res.test.statistic, "sign": res.test.sign, "threshold": res.test.threshold},
        "calibration_epsilon": round(res.calibration_epsilon, 4),
        "rounds": setup.rounds,
        "canaries": {"alone": setup.alone, "twins": setup.twins, "twin_count": setup.twin_count},
        "sampling_rate": setup.sampling_rate,
        "noise_multiplier": setup.noise_multiplier,
        "clipping_norm": setup.clipping_norm,
        "seed": setup.seed,
        "seconds": round(seconds, 1),
    }
