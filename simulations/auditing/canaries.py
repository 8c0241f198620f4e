"""The canary audit's harness: one round of the real client and strategy per trial.

Used by ``fedfdp audit`` (:mod:`simulations.audit`); the statistics live in
:mod:`fedfdp.audit`, the planted bugs in :mod:`simulations.auditing.bugs`.

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
(:class:`~strategies.fdp_strategy.FDPStrategy`) configures the round (its
sampling plan, its write-ahead charge), the client
(:func:`simulations.auditing.inprocess.node_train`) computes its reply, the strategy
aggregates (noise once from its secret source, divides by the plan's
normaliser, steps the model). Broken variants enter only as components
(:class:`~simulations.auditing.bugs.PlantedBug`). The auditor sees what the
server releases: the model update and the public sums and counts of the
replies (disclosed by design), and — as the threat model allows — everything a
client receives, including the run configuration and its seed. From them it
recovers the noisy private sum ``S = (Δw/η − Σ S_pub/Σ n_pub)·normaliser/α``
(exact for plain SGD's first step) and tests.

White-box canaries
------------------
The model at the audited round is crafted (the guarantee holds for every
``w_t``): one hidden layer of ``2K`` units for ``K`` canaries, unit ``j``
active only for canary ``j`` (public column ``j`` = 1), unit ``K + j`` only for
canary ``j``'s device-mates (public column ``K + j``), with zero weights on the
private column. With the zero-masking public loss canary ``j``'s private
gradient is exactly ``δ_j · a`` on the single weight ``W1[j, private]``; with
``|a| = 1000`` it is far above ``C``, so clipped it is ``+C`` on that coordinate
(checked through the real per-record code when the design is built). Canaries
are orthogonal; with independent per-record Poisson coins and isotropic noise
the per-canary observations of one round are independent trials. Each canary
lives on its own device. Groups (what else is on the canary's device):

``alone``
    nothing. Statistics: the projection ``T = S·u/(σC)`` on the canary's
    coordinate; ``T`` when the canary's public gradient shows up in the public
    sum (``−inf`` otherwise); and ``T`` minus the noise an adversary would
    predict from the run seed (catches noise derived from the configuration).
``twins``
    ``twin-count`` records of the same Ψ with private value ``−a`` (clipped
    gradients ``−C u``): a normalisation by the realised device batch shows up
    as a scale on a large, known sum.
``crowd``
    ``crowd-size`` fillers (all-zero records: no private gradient, no marker),
    the canary first: the device's share of the public batch is about one
    record, so the canary's presence in it says whether the public batch was
    drawn from the private coins (Prop. 3).
``mates``
    with Poisson device sampling (``device-sampling-rate = p``): ``mates``
    records on the mates' own unit, private value ``+a``. Their summed clipped
    gradients on ``W1[K+j, private]`` (``≈ q·mates·C``) tell the auditor
    whether the device was drawn; ``T`` if drawn (``−inf`` otherwise) then
    faces the claim for a round that touches the canary with probability
    ``p``.
``counted``
    adaptive clipping (the default recipe): one canary whose private value is
    set so that its gradient has norm ``ρC`` (``ρ = 0.99``): it is *not* clipped
    and is counted among the vectors within ``C``, so when sampled it adds
    ``ρC`` to its coordinate of the sum **and** 1 to the count the server
    releases with noise ``σ_b``. Every other record of the design is clipped
    (its count is known: 0), so the auditor reads the noisy count off what the
    round releases — the next round's ``C`` (``C' = C·exp(−η(b̃ − γ))``, the
    ``C`` the next instruction carries and ``metrics.csv`` publishes):
    ``count = E[batch]·(γ − ln(C'/C)/η)``. Statistics: ``T``; the count in
    units of ``σ_b``; both combined as the Neyman–Pearson direction of the
    pair (shift ``1/σ_eff``, what the accountant charges); and the count minus
    the draw of the round's *public* stream (catches a count noised from it).
    The count is one number per round, so one counted canary per round keeps
    the trials independent.

``fillers`` (not canaries) are records on a device of their own whose
gradient is ``+C`` on a unit of their own (never within ``C``): they raise
``N`` and the expected batch, so that the recipe's ``clipping-quantile =
"auto"`` picks a ``γ > 0`` on the crafted model as it does on a real table.

Every canary draws its world independently per round. The statistic, its
direction, its threshold and the group are chosen on the first third of the
rounds, the bound on the others (:mod:`simulations.auditing.analysis`). A
reply the server rejects is a protocol violation an honest node never commits:
the audit reports it and fails.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord

from clients.client_app import reply_message
from clients.node_runtime import MetricValues, NodeRecords
from fedfdp import protocol as P
from fedfdp.audit import ALPHA
from fedfdp.config import Config, ConfigError, Mode, load_config
from fedfdp.contribution import PrivateBatch, private_clipped_sum, private_gradient_sum, public_gradient_sum
from fedfdp.data import DeviceData, FederatedData
from fedfdp.entropy import SeededEntropy
from fedfdp.features import FeatureSpec
from fedfdp.mechanism import ResolvedMechanism
from fedfdp.mechanisms import gaussian_noise
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.run_plan import build_plan, feature_map_for
from fedfdp.sampling import server_public_rng
from simulations.auditing.bugs import PlantedBug, planted
from simulations.auditing.inprocess import node_train, set_identity, train_messages
from strategies.fdp_strategy import FDPStrategy

#: A canary's world in one trial.
WORLD1, ADD_REMOVE, REPLACEMENT = 1, 2, 3
RELATION_WORLDS = {"add-remove": ADD_REMOVE, "replacement": REPLACEMENT}
#: Canary groups.
ALONE, TWINS, CROWD, MATES, COUNTED = 0, 1, 2, 3, 4
GROUP_NAMES = {ALONE: "alone", TWINS: "twins", CROWD: "crowd", MATES: "mates", COUNTED: "counted"}


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
    alone, twins, crowd, mates, counted : int
        Canaries of each group (one device each). ``mates`` needs
        ``device_sampling_rate``; ``counted`` (0 or 1) needs adaptive clipping
        and no ``crowd`` (whose all-zero fillers are counted too).
    twin_count, crowd_size, mate_count : int
        Records beside each canary of those groups.
    fillers : int
        Records on a device of their own, each ``+C`` on a unit of their own.
    clipping_quantile : float or None
        ``clipping-quantile`` of the audited run: 0 a fixed ``C``, ``γ`` in
        (0, 1) adaptive clipping, ``None`` the recipe's ``"auto"``.
    counted_norm : float
        ``ρ``: the counted canary's gradient norm in units of ``C``.
    amplitude : float
        ``|a|``, the canary's private value (its raw gradient is ≫ ``C``).
    public_batch_size : int
        ``m'`` of the round.
    device_sampling_rate : float or None
        ``p``: Poisson device sampling (record unit).
    calibration : float
        Share of the rounds used to choose the test.
    alpha : float
        1 − confidence of the bound.
    seed : int
        Seed of the trials (world assignment and every round's public run seed).
    secret_seed : int or None
        None (default, a real audit): the client and server draw their secret
        randomness from the OS CSPRNG, so every audit is a fresh experiment.
        An integer makes the audit repeatable (tests): secret streams derive
        from ``(secret_seed, trial)``, a seed the auditor never uses for its
        predictions. A planted bug that replaces a secret source keeps its own.
    """

    sampling_rate: float = 0.07
    noise_multiplier: float = 0.5
    clipping_norm: float = 1.0
    delta: float = 0.01
    rounds: int = 400
    alone: int = 48
    twins: int = 24
    crowd: int = 0
    mates: int = 0
    counted: int = 0
    twin_count: int = 100
    crowd_size: int = 19
    mate_count: int = 100
    fillers: int = 0
    clipping_quantile: float | None = 0.0
    counted_norm: float = 0.99
    amplitude: float = 1000.0
    public_batch_size: int = 1
    device_sampling_rate: float | None = None
    calibration: float = 1.0 / 3.0
    alpha: float = ALPHA
    seed: int = 0
    secret_seed: int | None = None

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
        counts = (self.alone, self.twins, self.crowd, self.mates, self.counted)
        if min(counts) < 0 or sum(counts) < 1:
            raise ConfigError(f"alone, twins, crowd, mates, counted={counts}: need at least one canary")
        if self.counted > 1:
            raise ConfigError(f"counted={self.counted}: at most 1 (the count is one number per round)")
        if self.counted and self.crowd:
            raise ConfigError(f"counted={self.counted} with crowd={self.crowd}: the crowd's zero fillers are "
                              "counted too, so the count of the other records would not be known")
        if self.fillers < 0:
            raise ConfigError(f"fillers={self.fillers}: must be >= 0")
        g = self.clipping_quantile
        if g is not None and not 0 <= g < 1:
            raise ConfigError(f"clipping-quantile={g}: must be in [0, 1) or auto")
        if not 0 < self.counted_norm < 1:
            raise ConfigError(f"counted-norm={self.counted_norm}: must be in (0, 1)")
        if self.mates and self.device_sampling_rate is None:
            raise ConfigError("mates canaries need device-sampling-rate (Poisson device sampling)")
        p = self.device_sampling_rate
        if p is not None and not 0 < p <= 1:
            raise ConfigError(f"device-sampling-rate={p}: must be in (0, 1]")
        if not 0 < self.calibration < 1:
            raise ConfigError(f"calibration={self.calibration}: must be in (0, 1)")


#: The default recipe's adaptive clipping (``clipping-quantile = "auto"``): one counted
#: canary beside alone ones, fillers so that the recipe picks ``γ > 0`` (about 0.7
#: here), ``σ = 2`` so that the claim is small (0.52 at ``q = 0.5``, δ = 0.01) while a
#: count known to the auditor gives the canary away whenever it is sampled.
ADAPTIVE: dict[str, Any] = {"alone": 8, "twins": 0, "counted": 1, "fillers": 300, "clipping_quantile": None,
                            "noise_multiplier": 2.0, "sampling_rate": 0.5, "rounds": 600}

#: Canary groups each planted bug is audited with (``fedfdp audit --all-bugs``).
RECOMMENDED: dict[str | None, dict[str, Any]] = {
    None: {},
    "no-clip": {},
    "low-noise": {},
    "predictable-noise": {},
    "shared-batch": {"alone": 0, "twins": 0, "crowd": 48, "crowd_size": 99, "public_batch_size": 144},
    "realized-normalization": {"alone": 0, "twins": 48},
    "pq-accounting": {"alone": 0, "twins": 0, "mates": 48, "mate_count": 30, "device_sampling_rate": 0.1,
                      "sampling_rate": 0.5, "rounds": 1000},
    "count-public-stream": ADAPTIVE,
    "count-low-noise": ADAPTIVE,
}


def recommended_setup(bug: str | None, **overrides: Any) -> AuditSetup:
    """The audit configuration for ``bug`` (:data:`RECOMMENDED`) with ``overrides``; the
    correct mechanism under adaptive clipping (``clipping_quantile`` auto or ``γ > 0``)
    runs on the :data:`ADAPTIVE` canaries.
    """
    if bug not in RECOMMENDED:
        planted(bug)  # raises naming the known bugs
    base = RECOMMENDED[bug]
    if bug is None and overrides.get("clipping_quantile", 0) != 0:
        base = ADAPTIVE
    return AuditSetup(**{**base, **overrides})


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
    mate_x: np.ndarray
    state: dict[str, torch.Tensor]
    private_weight: str = "0.weight"
    public_marker: str = "0.bias"
    private_column: int = 0
    marker: np.ndarray = field(default_factory=lambda: np.ones(1))
    filler_x: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.float32))

    @property
    def num_canaries(self) -> int:
        return len(self.groups)

    @property
    def num_devices(self) -> int:
        """One device per canary, and one for the fillers if any."""
        return self.num_canaries + (1 if self.setup.fillers else 0)

    def devices(self, worlds: np.ndarray, view: str) -> FederatedData:
        """The devices of one trial. ``view="private"``: an add/remove world-2
        canary is absent, a replacement world-2 canary has private value ``−a``.
        ``view="public"``: every canary as in world 1 (the public part only
        reads Ψ). Crowd canaries come first on their device, the others last.
        """
        s = self.setup
        d = self.canary_x.shape[1]
        filler = np.zeros(d, dtype=np.float32)
        devs = []
        for j in range(self.num_canaries):
            g = self.groups[j]
            mates = {TWINS: [self.twin_x[j]] * s.twin_count, CROWD: [filler] * s.crowd_size,
                     MATES: [self.mate_x[j]] * s.mate_count}.get(g, [])
            w = WORLD1 if view == "public" else worlds[j]
            canary = {WORLD1: [self.canary_x[j]], REPLACEMENT: [self.twin_x[j]]}.get(w, [])
            rows = canary + mates if g == CROWD else mates + canary
            x = np.array(rows, dtype=np.float32).reshape(len(rows), d)
            devs.append(DeviceData(x, np.full(len(rows), self.canary_y[j], dtype=np.int64)))
        if s.fillers:
            devs.append(DeviceData(np.repeat(self.filler_x, s.fillers, axis=0),
                                   np.ones(s.fillers, dtype=np.int64)))
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

    Checks, through the real per-record code
    (:func:`fedfdp.contribution.private_gradient_sum` and
    :func:`~fedfdp.contribution.public_gradient_sum`), that canary ``j``'s
    clipped private gradient is ``+C`` on ``W1[j, private]`` and zero elsewhere,
    and reads off its public-gradient marker on ``b1[j]``.
    """
    counts = {ALONE: setup.alone, TWINS: setup.twins, CROWD: setup.crowd, MATES: setup.mates,
              COUNTED: setup.counted}
    groups = np.concatenate([np.full(n, g) for g, n in counts.items()]).astype(np.int64)
    k = len(groups)
    units = 2 * k + (1 if setup.fillers else 0)  # unit 2k: the fillers'
    pub = tuple(f"unit_{j:03d}" for j in range(units))
    spec = FeatureSpec(columns=(*pub, "secret"), public=pub, private=("secret",))
    canary_x = np.zeros((k, units + 1), dtype=np.float32)
    canary_x[np.arange(k), np.arange(k)] = 1.0
    canary_x[:, units] = setup.amplitude
    mate_x = np.zeros_like(canary_x)
    mate_x[np.arange(k), k + np.arange(k)] = 1.0
    mate_x[:, units] = setup.amplitude
    filler_x = np.zeros((1, units + 1), dtype=np.float32)
    if setup.fillers:
        filler_x[0, 2 * k] = 1.0
        filler_x[0, units] = setup.amplitude
    canary_y = np.ones(k, dtype=np.int64)
    cfg = load_config(
        {
            "mode": "fdp",
            "model": "mlp",
            "hidden-sizes": [units],
            "public-loss": "zero",
            "noise-multiplier": setup.noise_multiplier,
            "sampling-rate": setup.sampling_rate,
            "clipping-norm": setup.clipping_norm,
            # 0: a fixed C; γ or "auto" (None): adaptive clipping, its count released too
            "clipping-quantile": setup.clipping_quantile,
            "public-batch-size": setup.public_batch_size,
            "device-sampling-rate": setup.device_sampling_rate,
            "delta": setup.delta,
            "num-rounds": 1,
            "num-devices": k + (1 if setup.fillers else 0),
            "alpha": 1.0,
            "learning-rate": 1.0,
            "momentum": 0.0,
            "optimizer": "sgd",
            "progress": False,
        }
    )
    w1 = torch.zeros(units, units + 1)
    w1[:, :units] = torch.eye(units)
    state = {
        "0.weight": w1,
        "0.bias": torch.full((units,), -0.5),
        "2.weight": torch.stack([torch.ones(units), torch.zeros(units)]),
        "2.bias": torch.zeros(2),
    }
    des = CanaryDesign(setup, cfg, spec, groups, canary_x, canary_y, canary_x.copy(), mate_x, state,
                       private_column=units, filler_x=filler_x)
    if setup.counted:
        # the counted canary's gradient is linear in its private value (W1[:, private] = 0):
        # scale it to norm ρC, read off the real per-record code at value 1
        j = int(np.flatnonzero(groups == COUNTED)[0])
        des.canary_x[j, units] = 1.0
        des.canary_x[j, units] = setup.counted_norm * setup.clipping_norm / _raw_gradient(des, j)
    des.twin_x[:, units] = -des.canary_x[:, units]
    des.marker = _check_design(des)
    return des


def _raw_gradient(des: CanaryDesign, j: int) -> float:
    """Canary ``j``'s unclipped private gradient on its coordinate (real per-record code)."""
    data = des.devices(np.full(des.num_canaries, WORLD1), "public")
    model = build_model_for(des.cfg.training, data)
    model.load_state_dict(des.state)
    dec = feature_map_for(des.cfg, data)
    batch = PrivateBatch(torch.as_tensor(des.canary_x[j : j + 1]), torch.as_tensor(des.canary_y[j : j + 1]),
                         torch.Generator().manual_seed(0), 1)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    grads = dict(zip(names, private_gradient_sum(model, dec, PHASES[Mode.FDP], [batch], None), strict=True))
    return abs(float(grads[des.private_weight][j, des.private_column]))


def _check_design(des: CanaryDesign) -> np.ndarray:
    """White-box check of the canaries' gradients; returns each canary's
    public-gradient marker (its public gradient on ``b1[j]``).

    Through the real per-record code (:func:`fedfdp.contribution.private_clipped_sum`):
    canary ``j``'s clipped private gradient is ``+C`` on ``W1[j, private]`` (``+ρC``
    for the counted canary) and zero elsewhere; only the counted canary is within
    ``C`` (adaptive clipping's count); a filler is ``+C`` on its own unit, never within ``C``.
    """
    data = des.devices(np.full(des.num_canaries, WORLD1), "public")
    model = build_model_for(des.cfg.training, data)
    model.load_state_dict(des.state)
    dec = feature_map_for(des.cfg, data)
    gen = torch.Generator().manual_seed(0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    markers = np.zeros(des.num_canaries)
    c = des.setup.clipping_norm

    def clipped(x: np.ndarray, y: np.ndarray) -> tuple[dict[str, torch.Tensor], int]:
        batch = PrivateBatch(torch.as_tensor(x), torch.as_tensor(y), gen, 1)
        out = private_clipped_sum(model, dec, PHASES[Mode.FDP], [batch], c)
        return dict(zip(names, out.grads, strict=True)), out.unclipped

    for j in range(des.num_canaries):
        counted = des.groups[j] == COUNTED
        grads, within = clipped(des.canary_x[j : j + 1], des.canary_y[j : j + 1])
        expect = {n: torch.zeros_like(g) for n, g in grads.items()}
        expect[des.private_weight][j, des.private_column] = des.setup.counted_norm * c if counted else c
        if not all(torch.allclose(grads[n], expect[n], atol=1e-5 * c) for n in names):
            raise RuntimeError(f"canary {j}: clipped private gradient is not +C on its coordinate")
        if within != int(counted):
            raise RuntimeError(f"canary {j}: counted {within} times within C, expected {int(counted)}")
        x = torch.as_tensor(des.canary_x[j : j + 1])
        pub, _, _ = public_gradient_sum(model, dec, [(x, torch.as_tensor(des.canary_y[j : j + 1]), gen)])
        markers[j] = float(dict(zip(names, pub, strict=True))[des.public_marker][j])
    if des.setup.fillers:
        k = des.num_canaries
        grads, within = clipped(des.filler_x, np.ones(1, dtype=np.int64))
        if within or not math.isclose(float(grads[des.private_weight][2 * k, des.private_column]), c,
                                      rel_tol=1e-5):
            raise RuntimeError("a filler's clipped private gradient is not +C on its own unit")
    if not np.all(markers > 0):
        raise RuntimeError("a canary's public gradient has no marker")
    return markers


# --------------------------------------------------------------------------------------
# trials through the real client and strategy
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """Per-canary observations of one round (projections in units of ``σC``)."""

    projection: np.ndarray  # released private sum on the canary's coordinate
    public: np.ndarray  # records with the canary's Ψ in the public batch
    predicted: np.ndarray  # the noise an adversary predicts from the run seed
    mates: np.ndarray  # released private sum on the mates' coordinate
    rejected: int  # replies the server rejected
    count: float = math.nan  # adaptive clipping: the released noisy count, in units of σ_b
    count_predicted: float = math.nan  # the draw of the round's public stream (units of σ_b)


def _sum_arrays(
    a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor] | None:
    if a is None or b is None:
        return a if b is None else b
    return {k: a[k] + b[k] for k in a}


def _number(metrics: Mapping[str, MetricValues], key: str) -> int | float:
    """The scalar metric ``key`` of a node's reply (every train metric is one number)."""
    value = metrics[key]
    if not isinstance(value, int | float):
        raise RuntimeError(f"canary audit: metric {key}={value!r} is not a number")
    return value


def one_round(
    des: CanaryDesign, seed: int, worlds: np.ndarray, bug: PlantedBug | None = None, trial: int = 0
) -> Trial:
    """One round of the real strategy and client with the canaries in ``worlds``
    and the components of ``bug`` (None: the honest ones); ``seed`` is the
    round's public run seed, ``trial`` names the round for ``secret_seed``.
    """
    bug = bug if bug is not None else planted(None)
    cfg = dataclasses.replace(des.cfg, training=dataclasses.replace(des.cfg.training, seed=seed))
    public_view = des.devices(worlds, "public")
    private_view = des.devices(worlds, "private")
    server_parts, client = bug.server(seed), bug.client()
    if des.setup.secret_seed is not None:
        key = np.random.SeedSequence([des.setup.secret_seed, trial]).generate_state(1)[0]
        secrets = SeededEntropy(int(key))
        client = dataclasses.replace(client, secrets=secrets)
        if server_parts.secrets is None:
            server_parts = dataclasses.replace(server_parts, secrets=secrets)
    strat = FDPStrategy(build_plan(cfg, public_view, server_parts=server_parts))
    strat.model.load_state_dict(des.state)
    strat.registry = {0: (list(range(des.num_devices)), [len(d) for d in public_view.devices])}
    mechanism = strat.resolve()
    before = strat.model.state_dict()[des.private_weight].clone()
    (msg,) = train_messages(strat, 1)
    round_state = strat.engine.in_flight
    if round_state is None:
        raise RuntimeError("canary audit: no round in flight")
    normaliser, attempt = round_state.plan.normaliser, round_state.attempt
    clipping_norm = round_state.clipping_norm
    state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
    private_records = NodeRecords.partition_of(private_view, 0, 1)
    conf = msg.content.config_records[P.CONFIG]
    absent = set(np.flatnonzero(worlds == ADD_REMOVE).tolist())
    order = P.TrainInstruction.from_config(conf)
    pos = [i for i, d in enumerate(order.device_ids) if d in absent]
    if not pos:
        priv, pub, metrics = node_train(cfg, private_records, state, conf, client)
    else:
        # Algorithm 2: the private part without the absent canaries; the public
        # part of their devices over all their records (their Ψ included).
        first = ConfigRecord(dict(conf))
        first[P.PUBLIC_COUNTS] = [0 if i in pos else c for i, c in enumerate(order.public_counts)]
        second = ConfigRecord(dict(conf))
        second[P.DEVICE_IDS] = [order.device_ids[i] for i in pos]
        second[P.PUBLIC_COUNTS] = [order.public_counts[i] for i in pos]
        second[P.PRIVATE_FLAGS] = [0 for _ in pos]
        priv, pub, metrics = node_train(cfg, private_records, state, first, client)
        public_records = NodeRecords.partition_of(public_view, 0, 1)
        _, pub2, metrics2 = node_train(cfg, public_records, state, second, client)
        pub = _sum_arrays(pub, pub2)
        metrics = {key: _number(metrics, key) + _number(metrics2, key) for key in metrics}
    outcome = strat.collect(1, [reply_message(msg, priv, pub, metrics)])
    after = strat.model.state_dict()[des.private_weight]
    t = cfg.training
    grad = (before - after).double() / t.learning_rate
    count = _number(metrics, P.PUBLIC_COUNT)
    rejected = outcome.stats.rejected
    pub_w = pub[des.private_weight].double() if pub is not None and not rejected else torch.zeros_like(grad)
    g_pub = pub_w / count if count and not rejected else torch.zeros_like(grad)
    released = (grad - g_pub) * normaliser / t.alpha
    if mechanism.noise_multiplier is None:
        raise RuntimeError("canary audit: the resolved mechanism adds no noise")
    scale = mechanism.noise_multiplier * clipping_norm
    column = released[:, des.private_column].numpy() / scale
    k = des.num_canaries
    # what an adversary holding the run configuration predicts if the noise derived from its seed
    shapes = strat.engine.shapes
    guess = gaussian_noise([torch.Size(s) for s in shapes.values()], scale,
                           SeededEntropy(seed).noise(1, attempt))
    guessed = dict(zip(shapes, guess, strict=True))[des.private_weight][:, des.private_column]
    marks = pub[des.public_marker].double().numpy() if pub is not None else np.zeros(2 * k)
    count = count_predicted = math.nan
    clip = mechanism.clipping
    if clip.adaptive and clip.count_noise is not None:
        # what the round releases besides the model: the next round's C, a function of the
        # noisy count alone; every record but the counted canary is clipped (known count 0)
        noisy = normaliser * (clip.quantile - math.log(strat.engine.clipping_norm / clipping_norm)
                              / clip.learning_rate)
        count = noisy / clip.count_noise
        count_predicted = float(server_public_rng(seed, 1).standard_normal())
    return Trial(
        projection=column[:k],
        public=np.rint(marks[:k] / des.marker),
        predicted=guessed.numpy()[:k] / scale,
        mates=column[k : 2 * k],
        rejected=rejected,
        count=count,
        count_predicted=count_predicted,
    )


@dataclass
class Observations:
    """Per-canary trials: ``world``, ``group``, ``round`` index and the
    :class:`Trial` fields, flattened; ``rejected`` counts rejected replies.
    """

    world: np.ndarray
    group: np.ndarray
    round: np.ndarray
    projection: np.ndarray
    public: np.ndarray
    predicted: np.ndarray
    mates: np.ndarray
    count: np.ndarray
    count_predicted: np.ndarray
    rejected: int = 0


def collect(des: CanaryDesign, relations: Sequence[str], bug: str | None = None) -> Observations:
    """Run ``setup.rounds`` rounds; each canary draws its world uniformly from
    world 1 and the world 2 of each relation, independently per round.
    """
    setup = des.setup
    component = planted(bug)
    rng = np.random.default_rng(np.random.SeedSequence(setup.seed, spawn_key=(0xA0D17,)))
    choices = np.array([WORLD1, *(RELATION_WORLDS[r] for r in relations)])
    k = des.num_canaries
    world = np.empty((setup.rounds, k), dtype=np.int64)
    fields = {name: np.empty((setup.rounds, k))
              for name in ("projection", "public", "predicted", "mates", "count", "count_predicted")}
    rejected = 0
    set_identity()
    server_log = logging.getLogger("fedfdp.server")
    level = server_log.level
    server_log.setLevel(logging.ERROR)  # rejected replies are counted, not logged per trial
    try:
        for r in range(setup.rounds):
            world[r] = rng.choice(choices, size=k)
            trial = one_round(des, int(rng.integers(2**31 - 1)), world[r], component, r)
            for name, arr in fields.items():
                arr[r] = getattr(trial, name)
            rejected += trial.rejected
    finally:
        server_log.setLevel(level)
    return Observations(
        world=world.ravel(),
        group=np.tile(des.groups, setup.rounds),
        round=np.repeat(np.arange(setup.rounds), k),
        rejected=rejected,
        **{name: arr.ravel() for name, arr in fields.items()},
    )


def audited_plan(des: CanaryDesign, bug: str | None) -> ResolvedMechanism:
    """The privacy plan the (possibly broken) server resolves for the canaries:
    its event is what the run claims.
    """
    data = des.devices(np.full(des.num_canaries, WORLD1), "public")
    strat = FDPStrategy(build_plan(des.cfg, data, server_parts=planted(bug).server(des.setup.seed)))
    strat.registry = {0: (list(range(des.num_devices)), [len(d) for d in data.devices])}
    return strat.resolve()
