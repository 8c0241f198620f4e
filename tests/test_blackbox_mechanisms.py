"""Black-box tests of every mode's round mechanism (issue 22, item 6), and of one
round of secure aggregation (issue 30, point 6; the section at the end).

In the style of Google's dp_auditorium: two neighbouring inputs under the mode's
relation, ONE real round of the production code on each many times, the released
update projected on a fixed direction, and a lower confidence bound on the
privacy loss of the pair (a threshold test, Clopper–Pearson on its error rates:
:func:`fedfdp.audit.audit_trials`; the same verdict as a lower bound on the
hockey-stick divergence at ``e^ε`` exceeding ``δ``:
:func:`fedfdp.audit.hockey_stick_lower_bound`). The bound must not exceed the
claim: the accountant's ε of ONE round of the resolved mechanism's event at the
run's δ (``ResolvedMechanism.event`` composed once into the run's accountant,
:class:`~fedfdp.accounting.FDPAccountant` or, for ``corrdp``, the
:class:`~fedfdp.corrdp.accounting.CorrDPAccountant`'s class of the changed
features). A planted bug — the server's noise at ``σ/2`` through the
``ServerParts.mechanism`` seam, accounted as ``σ`` — must be rejected, which shows
the test has the power to fail.

The round
---------
Each trial runs the server half (:class:`fedfdp.round_engine.RoundEngine`: resolve, the
budget check and write-ahead charge of ``begin_round``, the sampling plan, the
noise, the normaliser, the optimizer step of ``finish_round``) around the node
half (:func:`fedfdp.contribution.node_contribution`, one node serving every
device), as :func:`fedfdp.algorithm.run_centralised` does, with secret
randomness from :class:`~fedfdp.entropy.SeededEntropy` (a fresh seed per round:
the test is deterministic). Nothing in production reads a flag: the bug enters
as a component, the neighbours as data.

Neighbours (per mode)
---------------------
``K`` canaries, each alone on its own device: public one-hot column ``j`` and a
private value ``A = 1000``; label 1. The model is crafted (the guarantee holds
for every ``w_t``): one hidden unit per canary, unit ``j`` reading public column
``j`` only, zero weight on the private column, so canary ``j``'s private
gradient lies (all but ``1e-5`` of it) on the weight ``W1[j, private]`` and is far
above ``C``: clipped, it is ``C`` times that unit vector ``u_j`` (checked below by
an independent per-record autograd computation). Canaries are orthogonal, the
noise is isotropic and the coins are per record, so the canaries of one round
are independent trials; each draws its world per round:

* world 1: the canary is a training record (its device does the private work
  the sampling plan asks of it);
* world 2, FDP add/remove (Def. 6): the simulator — the canary's private part
  absent (its device does no private work), its Ψ still in the public batch
  (its device keeps its public share); for ``dp`` (DP ⇒ FDP) this is the
  record removed. ``N`` (public) counts the canary in both worlds.
* ``corrdp``: the canary's sensitive feature replaced (``+1 → −1``) on a GLM,
  the CorrDP relation (Def. 2.1).

The statistic is ``⟨w_0 − w_1, u_j⟩`` (scale-free: the test's threshold is
chosen on the first third of each world's trials).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from fedfdp.accounting.distributed import DistributedAccountant
from fedfdp.audit import AuditResult, audit_trials, hockey_stick_lower_bound
from fedfdp.config import Config, load_config
from fedfdp.contribution import ClientParts, DeviceTask, RoundSettings, node_contribution, trainable
from fedfdp.data import DeviceData, FederatedData
from fedfdp.entropy import BitStream, SeededBits, SeededEntropy
from fedfdp.features import FeatureSpec
from fedfdp.losses import FeatureMap, private_cross_entropy
from fedfdp.mechanisms import GaussianSumMechanism
from fedfdp.models import build_model_for
from fedfdp.round_engine import RoundEngine
from fedfdp.run_plan import build_plan, client_parts_for, server_parts_for
from fedfdp.secagg.client_session import ClientSession
from fedfdp.secagg.encoding import from_ring, quantize, to_ring
from fedfdp.secagg.identity import NodeTrust, Roster, SigningKey
from fedfdp.secagg.party import noisy_contribution
from fedfdp.secagg.plan import SecAggPlan, secagg_event, secagg_plan
from fedfdp.secagg.server_session import ServerSession
from tests.model_helpers import linear_layer

#: Canaries per round; the private value of a canary in world 1.
K, A = 96, 1000.0
WORLD1, WORLD2 = 1, 2
#: δ of every claim and bound (the configuration's ``delta``).
DELTA = 1e-3


@pytest.fixture(autouse=True, scope="module")
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class HalfNoise(GaussianSumMechanism):
    """Planted bug: noise with ``σ/2`` while the accountant is charged ``σ``."""

    @property
    def std(self) -> float:
        return 0.5 * self.noise_multiplier * self.clipping_norm


# --------------------------------------------------------------------------------------
# the canaries
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One mode's round mechanism under test.

    ``config``: the keys besides the common ones; ``private_round``: the round run
    (``fdp-dpsgd``: the first after public pre-training); ``rounds``: rounds of the
    real code (``K`` trials each)."""

    name: str
    config: dict[str, Any]
    private_round: int = 1
    rounds: int = 60
    seed: int = 0


COMMON: dict[str, Any] = {
    "noise-multiplier": 2.0, "target-epsilon": "", "sampling-rate": 1.0, "clipping-norm": 1.0,
    "delta": DELTA, "learning-rate": 1.0, "momentum": 0.0, "optimizer": "sgd", "alpha": 1.0,
    "public-batch-size": 16, "clipping-quantile": 0.0, "progress": False, "model": "mlp",
}

CASES = {
    c.name: c
    for c in (
        Case("dp", {"mode": "dp"}, seed=0),
        Case("fdp", {"mode": "fdp"}, seed=1),
        Case("fdp-dpsgd", {"mode": "fdp-dpsgd", "num-rounds": 2, "public-pretrain-rounds": 1},
             private_round=2, seed=2),
        # adaptive clipping as the recipe runs it: the noisy count is released with the update
        Case("fdp-adaptive", {"mode": "fdp", "clipping-quantile": 0.5}, seed=3),
        Case("device-poisson", {"mode": "fdp", "privacy-unit": "device", "device-sampling-rate": 0.5},
             seed=4),
        # C = 0.5: the sensitive block's share of C is below the canary's gradient norm 0.71 (clipped)
        Case("corrdp", {"mode": "corrdp", "model": "logistic", "clipping-norm": 0.5,
                        "insensitive-tv": "*=0.5", "corrdp-weight-bound": 1.0, "corrdp-feature-bound": 1.0},
             seed=5),
    )
}
#: The planted bug's audit: the fdp round, more trials (power: 2 × 9,600 held out).
BUG_CASE = dataclasses.replace(CASES["fdp"], rounds=200, seed=100)


def config_of(case: Case) -> Config:
    return load_config({**COMMON, "num-rounds": case.private_round, **case.config})


@dataclass
class Canaries:
    """The data, model, feature map and parts of one case (module docstring)."""

    case: Case
    cfg: Config = field(init=False)
    spec: FeatureSpec = field(init=False)

    def __post_init__(self) -> None:
        self.cfg = config_of(self.case)
        if self.corrdp:
            names = (*(f"s{j:03d}" for j in range(K)), "u0")
            self.spec = FeatureSpec(names, ("u0",), names[:K])
        else:
            names = (*(f"p{j:03d}" for j in range(K)), "a")
            self.spec = FeatureSpec(names, names[:K], ("a",))

    @property
    def corrdp(self) -> bool:
        return self.case.config["mode"] == "corrdp"

    def data(self, worlds: np.ndarray) -> FederatedData:
        """Canary ``j`` alone on device ``j``. FDP/DP: the same records in both worlds
        (world 2 is the device's private work left out); CorrDP: ``s_j = ±1``."""
        x = np.zeros((K, K + 1), dtype=np.float32)
        if self.corrdp:
            x[np.arange(K), np.arange(K)] = np.where(worlds == WORLD1, 1.0, -1.0)
        else:
            x[np.arange(K), np.arange(K)] = 1.0
            x[:, K] = A
        devices = tuple(DeviceData(x[j : j + 1], np.ones(1, dtype=np.int64)) for j in range(K))
        return FederatedData("blackbox-canaries", self.spec, devices, x[:1].copy(),
                             np.ones(1, dtype=np.int64), ("other", "canary"),
                             input_bound=1.0 if self.corrdp else None)

    def model(self) -> nn.Module:
        """The crafted model at the audited round."""
        if self.corrdp:
            model = build_model_for(self.cfg.training, self.data(np.full(K, WORLD1)))
            with torch.no_grad():
                for p in model.parameters():
                    p.zero_()  # residual (½, −½) for label 1 in both worlds
            return model
        hidden, out = nn.Linear(K + 1, K, bias=False), nn.Linear(K, 2, bias=False)
        with torch.no_grad():
            hidden.weight.zero_()
            hidden.weight[:, :K] = torch.eye(K)
            out.weight.zero_()
            out.weight[0] = 1.0
        return nn.Sequential(hidden, nn.ReLU(), out)

    def feature_map(self) -> FeatureMap:
        return FeatureMap.columns(list(self.spec.columns), private=list(self.spec.private), view="zero")

    def directions(self, model: nn.Module) -> Callable[[nn.Module], np.ndarray]:
        """``w ↦ ⟨w_0 − w, u_j⟩`` for every canary ``j`` (``w_0``: ``model`` now).

        FDP/DP: ``u_j`` is the weight ``W1[j, private]``. CorrDP: ``u_j`` is column
        ``s_j`` of the GLM's weights along ``r̂ = (1, −1)/√2``, the direction of the
        residual of label 1 at ``W = 0``."""
        if self.corrdp:
            start = model.state_dict()["0.weight"].double().clone()
            r_hat = torch.tensor([1.0, -1.0], dtype=torch.float64) / math.sqrt(2.0)

            def glm_projection(after: nn.Module) -> np.ndarray:
                return (r_hat @ (start - after.state_dict()["0.weight"].double())[:, :K]).numpy()

            return glm_projection
        w0 = linear_layer(model).weight.detach().double()[:, K].clone()

        def projection(after: nn.Module) -> np.ndarray:
            return (w0 - linear_layer(after).weight.detach().double()[:, K]).numpy()

        return projection


def claimed_epsilon(canaries: Canaries, server: RoundEngine) -> float:
    """The accountant's ε of ONE round of the resolved mechanism's event at δ (for
    ``corrdp``: the ε of the changed features' class, ``sensitive``, weight 1)."""
    mechanism = server.mechanism
    assert mechanism.event is not None
    accountant = server.accounting.new()
    accountant.compose(mechanism.event)
    if canaries.corrdp:
        bound = accountant.epsilon_bound(mechanism.delta)
        (sensitive,) = [c for c in bound.classes if c.name == "sensitive"]
        return float(sensitive.epsilon)
    return float(accountant.epsilon(mechanism.delta))


# --------------------------------------------------------------------------------------
# one round of the real code per trial
# --------------------------------------------------------------------------------------


@dataclass
class Collected:
    world: np.ndarray
    stat: np.ndarray
    claim: float
    #: ``C`` after each round: it moves only when adaptive clipping released a noisy count.
    next_clipping_norm: list[float] = field(default_factory=list)


def one_round(canaries: Canaries, worlds: np.ndarray, secret_seed: int,
              mechanism: Callable[[float, float], Any] | None) -> tuple[np.ndarray, RoundEngine, float]:
    """One private round on ``worlds``; the canaries' statistics, the server, the next ``C``."""
    cfg = canaries.cfg
    data = canaries.data(worlds)
    secrets = SeededEntropy(secret_seed)
    parts = dataclasses.replace(server_parts_for(cfg, data), secrets=secrets)
    if mechanism is not None:
        parts = dataclasses.replace(parts, mechanism=mechanism)
    client: ClientParts = client_parts_for(cfg, data, secrets=secrets)
    model = canaries.model()
    project = canaries.directions(model)
    server = build_plan(cfg, data, model=model, server_parts=parts).engine(data.sizes.tolist())
    state = server.begin_round(canaries.case.private_round)
    assert state.phase.noise, f"round {state.round} of {canaries.case.name} is not a private round"
    sampling = server.mechanism.sampling
    settings = RoundSettings(round=state.round, attempt=state.attempt, phase=state.phase,
                             sampling_rate=sampling.sampling_rate, clipping_norm=state.clipping_norm,
                             unit=sampling.unit, public_seed=cfg.training.seed)
    plan = state.plan
    leave_out = np.zeros(K, dtype=bool) if canaries.corrdp else worlds == WORLD2  # the simulator
    tasks = [DeviceTask(int(d), data.devices[d].x, data.devices[d].y,
                        bool(plan.private[d]) and not leave_out[d], int(plan.public_counts[d]))
             for d in plan.asked()]
    contrib = node_contribution(server.model, canaries.feature_map(), settings, tasks, client)
    if not canaries.corrdp:  # every canary clipped (world 1) or absent (world 2): nothing counted
        assert contrib.unclipped_count == 0
    server.finish_round(
        [contrib.private_sum] if contrib.private_sum is not None else [],
        [contrib.public_sum] if contrib.public_sum is not None else [],
        contrib.public_count, contrib.public_loss_sum, unclipped=contrib.unclipped_count,
    )
    return project(server.model), server, server.clipping_norm


def collect(case: Case, mechanism: Callable[[float, float], Any] | None = None,
            rounds: int | None = None) -> Collected:
    canaries = Canaries(case)
    rounds = rounds if rounds is not None else case.rounds
    seq = np.random.SeedSequence([case.seed, 0xB1AC])
    rng = np.random.default_rng(seq)
    secret_seeds = seq.spawn(1)[0].generate_state(rounds, np.uint32)
    worlds = np.empty((rounds, K), dtype=np.int64)
    stats = np.empty((rounds, K))
    claim = math.nan
    next_c: list[float] = []
    for r in range(rounds):
        worlds[r] = rng.choice([WORLD1, WORLD2], size=K)
        stats[r], server, c = one_round(canaries, worlds[r], int(secret_seeds[r]), mechanism)
        next_c.append(c)
        if r == 0:
            claim = claimed_epsilon(canaries, server)
    return Collected(worlds.ravel(), stats.ravel(), claim, next_c)


def audit(collected: Collected, relation: str) -> AuditResult:
    w = collected.world
    return audit_trials({"projection": collected.stat[w == WORLD1]},
                        {"projection": collected.stat[w == WORLD2]},
                        claimed_epsilon=collected.claim, delta=DELTA, relation=relation)


def _describe(name: str, result: AuditResult) -> str:
    b = result.bound
    return (f"{name}: epsilon_lower={result.epsilon_lower:.3f} claimed={result.epsilon_claimed:.3f} "
            f"(delta={result.delta:g}, {b.positives}+{b.negatives} held-out trials, FPR={b.fpr:.4f}, "
            f"FNR={b.fnr:.4f}, hockey-stick lb at the claim="
            f"{hockey_stick_lower_bound(b, result.epsilon_claimed):.2e})")


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Independent reference: the exact ε(δ) of the Gaussian mechanism with shift ``μ``
    (Balle and Wang 2018: ``δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)``), by bisection."""
    def excess(eps: float) -> float:
        return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)) - delta

    lo, hi = 0.0, 50.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return hi


@pytest.mark.parametrize(("name", "sigma_eff"), [("dp", 2.0), ("fdp", 2.0), ("fdp-dpsgd", 2.0),
                                                  ("fdp-adaptive", None)])
def test_claims_of_full_batch_rounds_are_the_gaussian_closed_form(name: str, sigma_eff: float | None) -> None:
    """The claims the black-box bounds are held to are not inflated: with q = 1 one round
    is the Gaussian mechanism with shift ``1/σ_eff`` (adaptive clipping: ``σ√(1 − r)``,
    the count's share ``r`` on top), and the accountant's upper ε is within its
    error of the closed form."""
    canaries = Canaries(CASES[name])
    data = canaries.data(np.full(K, WORLD1))
    server = build_plan(canaries.cfg, data, model=canaries.model()).engine(data.sizes.tolist())
    if sigma_eff is None:
        sigma_eff = 2.0 * math.sqrt(1 - canaries.cfg.privacy.clipping_budget_share)
    exact = gaussian_epsilon(1.0 / sigma_eff, DELTA)
    claim = claimed_epsilon(canaries, server)
    assert exact - 1e-6 <= claim <= exact + 0.05


def test_canary_direction_is_its_clipped_private_gradient() -> None:
    """Independent reference: canary ``j``'s private gradient (per-record autograd
    on the crafted model, ℓ_priv and the full loss) points along ``u_j = W1[j, private]``
    and is far above ``C``; a canary without its private part has none."""
    canaries = Canaries(CASES["fdp"])
    model = canaries.model()
    fmap = canaries.feature_map()
    data = canaries.data(np.full(K, WORLD1))
    j = 5
    x = torch.as_tensor(data.devices[j].x)
    y = torch.as_tensor(data.devices[j].y)
    params = trainable(model)
    for loss in ("private", "full"):
        if loss == "private":
            value = private_cross_entropy([model(v) for v in fmap.private_inputs(x, None)], y).sum()
        else:
            value = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
        grads = torch.autograd.grad(value, params)
        flat = torch.cat([g.ravel() for g in grads]).double()
        on_u = float(grads[0][j, K])
        assert float(flat.norm()) > 100.0
        assert on_u / float(flat.norm()) > 1 - 1e-5
    masked = x.clone()
    masked[:, K] = 0.0  # the record's Ψ: no private part
    zero = private_cross_entropy([model(v) for v in fmap.private_inputs(masked, None)], y).sum()
    assert all(float(g.abs().max()) == 0.0 for g in torch.autograd.grad(zero, params))


@pytest.mark.parametrize("name", list(CASES))
def test_round_mechanism_stays_within_its_claim(name: str) -> None:
    case = CASES[name]
    collected = collect(case)
    relation = "corrdp" if name == "corrdp" else "add-remove"
    result = audit(collected, relation)
    print(_describe(name, result))
    assert math.isfinite(result.epsilon_claimed) and result.epsilon_claimed > 0
    assert not result.violated, _describe(name, result)
    assert hockey_stick_lower_bound(result.bound, result.epsilon_claimed) <= DELTA
    moved = [c != config_of(case).privacy.clipping_norm for c in collected.next_clipping_norm]
    if name == "fdp-adaptive":  # the noisy count was released each round: C moved, differently each time
        assert all(moved) and len(set(collected.next_clipping_norm)) == case.rounds
    else:
        assert not any(moved)


def test_half_noise_is_rejected() -> None:
    """The planted bug (noise σ/2, accounted as σ) in the fdp round: the lower bound
    exceeds the claim and the divergence bound exceeds δ."""
    collected = collect(BUG_CASE, mechanism=HalfNoise)
    result = audit(collected, "add-remove")
    print(_describe("fdp + half noise", result))
    assert result.violated, _describe("fdp + half noise", result)
    assert hockey_stick_lower_bound(result.bound, result.epsilon_claimed) > DELTA


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp", "fdp-dpsgd", "fdp-adaptive"])
def test_half_noise_is_rejected_in_other_modes(name: str) -> None:
    case = dataclasses.replace(CASES[name], seed=1)
    result = audit(collect(case, mechanism=HalfNoise, rounds=250), "add-remove")
    assert result.violated, _describe(name, result)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_round_mechanism_within_its_claim_with_more_trials(name: str) -> None:
    case = dataclasses.replace(CASES[name], seed=2)
    relation = "corrdp" if name == "corrdp" else "add-remove"
    result = audit(collect(case, rounds=4 * case.rounds), relation)
    assert not result.violated, _describe(name, result)


# --------------------------------------------------------------------------------------
# the distributed round: secure aggregation (aggregation = "secagg")
# --------------------------------------------------------------------------------------
#
# ONE round of the real protocol per trial batch: three parties' ClientSessions and the
# ServerSession (fedfdp.secagg: setup, share keys, collect, confirm, unmask), each party's
# collect value made by the real noisy encoding (fedfdp.secagg.party.noisy_contribution:
# randomized rounding and the exact discrete Gaussian of std σ_loc), σ_loc from the
# secure-aggregation plan of the run (fedfdp.secagg.plan.secagg_plan, t_c = 0 colluders so
# every party's noise is counted) and the claim from the distributed accountant the run
# uses (DistributedAccountant over secagg_event(plan, q = 1): one round, no subsampling).
# Party 0 holds the canaries: coordinate j carries one record whose clipped gradient is
# C·e_j in world 1 and is absent in world 2 (add/remove); the parties' noise and rounding
# are independent per coordinate, so the d coordinates of a round are d independent
# trials. The statistic is the unmasked aggregate on the coordinate. A planted
# under-noised party (no noise, or σ_loc/2) enters through the same seam as the honest
# one: the contribution function each party is given.

#: Party ids, the dimension (trials per round), s, σ (accounted noise multiplier), C.
SECAGG_IDS = (11, 12, 13)
SECAGG_DIM, SECAGG_SCALE, SECAGG_SIGMA, SECAGG_CLIP = 2**16, 2.0**14, 1.0, 1.0
SECAGG_DIGEST = bytes(32)  # the digest every party "received" with the round's model
_SECAGG_KEYS: dict[int, SigningKey] = {}


def secagg_plan_and_claim() -> tuple[SecAggPlan, float]:
    """The plan of the audited round and the distributed accountant's ε of it at ``DELTA``."""
    n = len(SECAGG_IDS)
    plan = secagg_plan(SECAGG_SIGMA, dimension=SECAGG_DIM, num_records=SECAGG_DIM, max_parties=n,
                       min_survivors=n, colluders=0, scale=SECAGG_SCALE)
    accountant = DistributedAccountant()
    accountant.compose(secagg_event(plan, 1.0))
    return plan, accountant.epsilon(DELTA)


def no_noise(
    x: np.ndarray, *, clip: float, scale: float, local_sigma: float, stream: BitStream
) -> np.ndarray:
    """Planted bug: a party that rounds its value but adds no noise (σ_loc accounted)."""
    return to_ring(quantize(np.asarray(x, dtype=np.float64), clip=clip, scale=scale, stream=stream))


def half_local_noise(
    x: np.ndarray, *, clip: float, scale: float, local_sigma: float, stream: BitStream
) -> np.ndarray:
    """Planted bug: a party adding ``σ_loc/2`` (``σ_loc`` accounted)."""
    return noisy_contribution(x, clip=clip, scale=scale, local_sigma=local_sigma / 2, stream=stream)


def secagg_round(
    plan: SecAggPlan, canaries: np.ndarray, contributions: Sequence[Callable[..., np.ndarray]],
    seq: np.random.SeedSequence, round_: int,
) -> np.ndarray:
    """One round of the real sessions; the unmasked aggregate in units of ``s`` (one
    canary's clipped gradient)."""
    ids = list(SECAGG_IDS)
    keys = {u: _SECAGG_KEYS.setdefault(u, SigningKey.generate()) for u in ids}
    roster = Roster({f"node-{u}": keys[u].public for u in ids})
    clients = {u: ClientSession(u, NodeTrust(keys[u], roster, len(ids)), run=1) for u in ids}
    server = ServerSession(round_, ids, SECAGG_DIM, min_survivors=len(ids))
    keys_asked = server.receive_setup([clients[u].setup(r) for u, r in server.setup_requests().items()])
    collect = server.receive_keys([clients[u].share_keys(r) for u, r in keys_asked.items()])
    inputs = [SECAGG_CLIP * canaries.astype(np.float64)] + [np.zeros(SECAGG_DIM)] * (len(ids) - 1)
    values = {u: make(x, clip=SECAGG_CLIP, scale=plan.scale, local_sigma=plan.local_sigma,
                      stream=SeededBits(s))
              for u, make, x, s in zip(ids, contributions, inputs, seq.spawn(len(ids)), strict=True)}
    replies = [clients[u].collect(r, values[u], SECAGG_DIGEST) for u, r in collect.items()]
    confirm = server.receive_collect(replies)
    unmask = server.receive_confirm([clients[u].confirm(r) for u, r in confirm.items()], SECAGG_DIGEST)
    result = server.receive_unmask([clients[u].unmask(r) for u, r in unmask.items()])
    assert result.u3 == frozenset(ids)  # every party's value is in the sum
    return from_ring(result.total).astype(np.float64) / plan.scale


def secagg_audit(bad: Callable[..., np.ndarray] | None, rounds: int, seed: int) -> AuditResult:
    """``rounds`` rounds × ``SECAGG_DIM`` trials; party 1 uses ``bad`` if given."""
    plan, claim = secagg_plan_and_claim()
    parties: list[Callable[..., np.ndarray]] = [noisy_contribution] * len(SECAGG_IDS)
    if bad is not None:
        parties[1] = bad
    seq = np.random.SeedSequence([seed, 0x5EC])
    rng = np.random.default_rng(seq.spawn(1)[0])
    pos, neg = [], []
    for r, s in enumerate(seq.spawn(rounds)):
        world1 = rng.random(SECAGG_DIM) < 0.5
        released = secagg_round(plan, world1, parties, s, round_=r + 1)
        pos.append(released[world1])
        neg.append(released[~world1])
    return audit_trials({"coordinate": np.concatenate(pos)}, {"coordinate": np.concatenate(neg)},
                        claimed_epsilon=claim, delta=DELTA, relation="add-remove")


def test_secagg_claim_is_the_gaussian_closed_form() -> None:
    """The claim the secagg round is held to is not inflated: with σ_eff = σ = 1 and
    sensitivity Δ = s + √d the round is within the accountant's error of the Gaussian
    mechanism with shift 1 (route A, no subsampling)."""
    _, claim = secagg_plan_and_claim()
    exact = gaussian_epsilon(1.0 / SECAGG_SIGMA, DELTA)
    assert exact - 1e-6 <= claim <= exact + 0.05


def test_secagg_round_stays_within_its_claim_and_an_under_noised_party_is_caught() -> None:
    """The honest round: the 95% lower bound stays below the claimed ε (per coordinate the
    shift is s/Δ = 0.985 of what the claim allows); one party without noise (the total
    variance 2/3 of the accounted one: true ε ≈ 3.95 against 3.14) is caught."""
    honest = secagg_audit(None, rounds=12, seed=1)
    print(_describe("secagg", honest))
    assert not honest.violated, _describe("secagg", honest)
    assert hockey_stick_lower_bound(honest.bound, honest.epsilon_claimed) <= DELTA
    broken = secagg_audit(no_noise, rounds=12, seed=2)
    print(_describe("secagg + a party without noise", broken))
    assert broken.violated, _describe("secagg + a party without noise", broken)
    assert hockey_stick_lower_bound(broken.bound, broken.epsilon_claimed) > DELTA


@pytest.mark.slow
def test_secagg_party_with_half_its_noise_is_caught() -> None:
    """A party adding σ_loc/2 (total variance 3/4 of the accounted one: true ε ≈ 3.7)."""
    broken = secagg_audit(half_local_noise, rounds=40, seed=3)
    assert broken.violated, _describe("secagg + a party with half its noise", broken)
