"""Each SuperNode enforces its own guarantee: a node policy only its owner sets, and a
ledger and budget of its own (issue "A cheating server is caught by the devices", points 1-2).

The rounds run the real strategy and the real ClientApp on an in-process grid (every
reply is the real ClientApp's, one persistent ``Context`` per node, as a SuperNode keeps
it); the malicious server is the honest one with its requests rewritten on the way to
a node. Each attack is first shown to work against a node without a policy (the
control), then caught by a node with one. References are independent of the code under
test: the analytic Gaussian mechanism's δ(ε) (Balle & Wang 2018, Thm 8) for one
unsubsampled round, prv-accountant for the subsampled ones, and ``σ_eff`` recomputed
from the charged ``σ_loc`` by its formula.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Error, Message
from scipy.stats import norm

import clients.secagg_handlers as handlers
from clients.client_app import make_client_app, simulated_node_config
from fedfdp.accounting.events import DistributedDiscreteGaussian
from fedfdp.config import Config, ConfigError, load_config
from fedfdp.data import load_dataset
from fedfdp.ledger import Ledger, read_ledger, write_ledger
from fedfdp.node_ledger import NodeLedger
from fedfdp.node_policy import NodePolicy, RoundRefused, load_node_policy, node_event
from fedfdp.run_plan import build_plan
from fedfdp.secagg.identity import SIGNING_KEY_FILE, Roster, SigningKey
from fedfdp.secagg.plan import local_sigma_for
from fedfdp.secagg.wire import MASKED, SECAGG
from simulations.cli import main as fedfdp_main
from simulations.identities import write_identities
from strategies.fdp_strategy import FDPStrategy
from tests.flower_helpers import InProcessGrid, node_context

#: ``rewrite(node, message)``: the malicious server's change to a request on its way to ``node``.
Rewrite = Callable[[int, Message], None]

POLICY = """max-epsilon = {eps}
delta = 1e-5
relation = "add-remove"
min-honest-shares = {honest}
max-colluders = 0
"""


def write_policy(tmp: Path, eps: float = 50.0, honest: int = 3, extra: str = "") -> Path:
    """A policy file in ``tmp``; it names the roster ``roster.toml`` beside it unless
    ``extra`` says otherwise (a floor above 1 needs one: :func:`with_identities`)."""
    path = tmp / "policy.toml"
    if "roster" not in extra:
        extra += 'roster = "roster.toml"\n'
    path.write_text(POLICY.format(eps=eps, honest=honest) + extra)
    return path


def with_identities(nodes: Mapping[str, Any] | None, parties: int) -> None:
    """What the deployment authority does before a run: the signing key of every node
    ``node-0 .. node-<parties-1>`` in its state folder and the roster the policy names."""
    if not nodes:
        return
    policy = load_node_policy(str(nodes["node-policy"]))
    if policy.roster is not None:
        state = Path(str(nodes["node-state"]))
        write_identities({f"node-{p}": state / f"node-{p}" for p in range(parties)}, policy.roster)


def plain_config(**extra: Any) -> Config:
    base = {"dataset": "fleet", "num-devices": 4, "records-per-device": 60, "num-rounds": 1,
            "progress": False, "round-timeout": 30.0, "node-wait-timeout": 10.0, "noise-multiplier": 1.0}
    return load_config({**base, **extra})


def secagg_config(**extra: Any) -> Config:
    base = {
        "dataset": "fleet", "num-devices": 4, "records-per-device": 60, "num-rounds": 2,
        "aggregation": "secagg", "secagg-min-survivors": 3, "progress": False, "round-timeout": 30.0,
        "secagg-timeout": 30.0, "node-wait-timeout": 10.0, "noise-multiplier": 1.0,
    }
    return load_config({**base, **extra})


class NodeGrid(InProcessGrid):
    """The real ClientApp on every node, each with its own policy and state folder
    (``nodes``: what ``fedfdp run --node-policy/--node-state`` stages), and a malicious
    server's ``rewrite`` of requests."""

    def __init__(self, cfg: Config, nodes: Mapping[str, Any] | None, rewrite: Rewrite | None = None) -> None:
        super().__init__(cfg)
        self.app = make_client_app(cfg.to_flat(), nodes=nodes)
        self.rewrite = rewrite
        self.contexts: dict[int, Context] = {}
        self.seen: list[tuple[str, int, Message]] = []

    def answer(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        context = self.contexts.setdefault(node, node_context(self.cfg, node))
        if self.rewrite is not None:
            self.rewrite(node, msg)
        try:
            reply = self.app(msg, context)
        except Exception as exc:
            reply = Message(error=Error(code=0, reason=str(exc)), reply_to=msg)
        self.seen.append((msg.metadata.message_type, node, reply))
        return reply

    def refusals(self) -> list[str]:
        return [str(r.error.reason) for _, _, r in self.seen if r.has_error()]


def run(cfg: Config, nodes: Mapping[str, Any] | None, rewrite: Rewrite | None = None
        ) -> tuple[FDPStrategy, NodeGrid]:
    data = load_dataset(cfg.data)
    plan = build_plan(cfg, data, num_devices=len(data.devices), evaluate=lambda r, m: {})
    strat = FDPStrategy(plan)
    with_identities(nodes, cfg.data.num_devices)
    grid = NodeGrid(cfg, nodes, rewrite)
    strat.start(grid, ArrayRecord(copy.deepcopy(plan.model.state_dict())))
    return strat, grid


def node_dirs(state: Path) -> list[Path]:
    """The node folders holding a ledger (a folder may hold only its signing key so far)."""
    return sorted(f for f in state.glob("node-*") if read_ledger(f) is not None)


def node_events(folder: Path) -> list[DistributedDiscreteGaussian]:
    ledger = read_ledger(folder)
    assert ledger is not None, folder
    events = ledger.events()
    assert all(isinstance(e, DistributedDiscreteGaussian) for e in events)
    return [e for e in events if isinstance(e, DistributedDiscreteGaussian)]


def account(folder: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    assert fedfdp_main(["account", "--run", str(folder), "--json", *extra]) == 0
    return dict(json.loads(capsys.readouterr().out))


def collect_sigma(msg: Message) -> float | None:
    if msg.metadata.message_type != "train.sa_collect":
        return None
    return float(str(msg.content.config_records[SECAGG]["local-sigma"]))


def scale_sigma(msg: Message, factor: float) -> None:
    sigma = collect_sigma(msg)
    if sigma is not None:
        msg.content.config_records[SECAGG]["local-sigma"] = sigma * factor


# ----------------------------------------------------------------- the policy file


def test_a_floor_above_one_needs_a_roster(tmp_path: Path) -> None:
    """Without a roster sybils could fill the floor: only the node's own share counts."""
    path = tmp_path / "policy.toml"
    path.write_text(POLICY.format(eps=5.0, honest=2))
    with pytest.raises(ConfigError, match=r"min-honest-shares=2 without a roster"):
        load_node_policy(path)
    path.write_text(POLICY.format(eps=5.0, honest=1))
    assert load_node_policy(path).roster is None


def test_a_policy_file_loads_with_its_roster_beside_it(tmp_path: Path) -> None:
    path = write_policy(tmp_path, extra='roster = "roster.toml"\ntrust-server = true\n')
    policy = load_node_policy(path)
    assert policy == NodePolicy(max_epsilon=50.0, delta=1e-5, min_honest_shares=3, max_colluders=0,
                                roster=tmp_path / "roster.toml", trust_server=True)


@pytest.mark.parametrize(("text", "named"), [
    ("max-epsilon = 1\ndelta = 1e-5\nmin-honest-shares = 2\nmax-colluders = 0\nmax-epsillon = 2\n",
     "unknown key(s) ['max-epsillon']"),
    ("max-epsilon = 1\ndelta = 1e-5\nmax-colluders = 0\n", "missing key(s) ['min-honest-shares']"),
    ("max-epsilon = -1\ndelta = 1e-5\nmin-honest-shares = 2\nmax-colluders = 0\n", "max-epsilon=-1"),
    ("max-epsilon = 1\ndelta = 1.5\nmin-honest-shares = 2\nmax-colluders = 0\n", "delta=1.5"),
    ("max-epsilon = 1\ndelta = 1e-5\nmin-honest-shares = 0\nmax-colluders = 0\n", "min-honest-shares=0"),
    ("max-epsilon = 1\ndelta = 1e-5\nmin-honest-shares = 2\nmax-colluders = 0\nrelation = 'corrdp'\n",
     "relation='corrdp'"),
    ("max-epsilon = 1\ndelta = 1e-5\nmin-honest-shares = 2\nmax-colluders = 0\ntrust-server = 1\n",
     "trust-server=1"),
    ("max-epsilon = [1\n", "not valid TOML"),
])
def test_a_bad_policy_is_refused_in_one_line_naming_the_file_and_key(tmp_path: Path, text: str,
                                                                      named: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_node_policy(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"node-policy={str(path)!r}: ") and named in message


def test_a_missing_policy_file_is_refused_by_the_cli_with_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = fedfdp_main(["run", "--out", str(tmp_path / "out"), "--node-policy", str(tmp_path / "nope.toml"),
                        "--set", "aggregation=secagg", "--set", "secagg-min-survivors=3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "nope.toml" in err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- the node's own charge


def gaussian_delta(mu: float, eps: float) -> float:
    """δ(ε) of the Gaussian mechanism of sensitivity/σ = μ (Balle & Wang 2018, Thm 8)."""
    return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))


def gaussian_epsilon(mu: float, delta: float) -> float:
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gaussian_delta(mu, mid) > delta else (lo, mid)
    return hi


def sigma_eff(event: DistributedDiscreteGaussian) -> float:
    """``√(n_h σ_loc² − t²)/(s + √d)``, by its formula (t = 2)."""
    delta = event.scale + math.sqrt(event.dimension)
    return math.sqrt(event.honest_parties * event.local_sigma**2 - 4.0) / delta


def test_one_charge_accounts_as_the_analytic_gaussian(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    policy = load_node_policy(write_policy(tmp_path, honest=3))
    event = node_event(policy, local_sigma=local_sigma_for(1.5, 2.0**10, 100, 3), scale=2.0**10,
                       dimension=100, sampling_rate=1.0)
    assert event.honest_parties == 3 and sigma_eff(event) == pytest.approx(1.5, rel=1e-9)
    NodeLedger(tmp_path / "node", policy).charge(7, 1, event)
    report = account(tmp_path / "node", capsys)
    want = gaussian_epsilon(1 / sigma_eff(event), 1e-5)  # Λ < 1e-25: route A is the Gaussian's PRV bound
    assert report["runs"] == [7] and report["charges"] == 1 and report["delta"] == 1e-5
    assert want - 1e-6 <= report["epsilon"] <= want + 0.1, (report["epsilon"], want)


def test_the_budget_refuses_the_round_that_would_exceed_it_and_writes_nothing(tmp_path: Path) -> None:
    policy = load_node_policy(write_policy(tmp_path, eps=2.0))
    event = node_event(policy, local_sigma=local_sigma_for(2.0, 2.0**10, 100, 3), scale=2.0**10,
                       dimension=100, sampling_rate=1.0)
    ledger = NodeLedger(tmp_path / "node", policy)
    first = ledger.charge(1, 1, event)
    assert 0 < first < 2.0
    before = (tmp_path / "node" / "ledger.jsonl").read_bytes()
    with pytest.raises(RoundRefused, match=r"^node budget: this round would take ε above max-epsilon=2"):
        ledger.charge(1, 2, event)
    assert (tmp_path / "node" / "ledger.jsonl").read_bytes() == before


def test_a_node_ledger_stated_at_another_delta_is_refused(tmp_path: Path) -> None:
    policy = load_node_policy(write_policy(tmp_path))
    event = node_event(policy, local_sigma=100.0, scale=2.0**6, dimension=10, sampling_rate=0.1)
    NodeLedger(tmp_path / "node", policy).charge(1, 1, event)
    other = NodePolicy(max_epsilon=50.0, delta=1e-3, min_honest_shares=3, max_colluders=0,
                       roster=policy.roster)
    with pytest.raises(RoundRefused, match="stated at"):
        NodeLedger(tmp_path / "node", other).charge(1, 2, event)


# ----------------------------------------------------------------- an honest run


def test_honest_run_each_node_charges_itself_the_servers_event(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = secagg_config()
    nodes = {"node-policy": str(write_policy(tmp_path, honest=3)), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes)
    assert strat.stop_reason is None and grid.refusals() == []
    assert strat.ledger is not None and strat.mechanism is not None
    server = strat.ledger.events()
    folders = node_dirs(tmp_path / "nodes")
    assert [f.name for f in folders] == ["node-0", "node-1", "node-2", "node-3"]
    for folder in folders:
        events = node_events(folder)
        assert events == server  # the node's own floor equals the server's n_min − t_c here
        report = account(folder, capsys)
        # prv-accountant, independently: the smoothed rounds' σ_eff at rate q (route A, Λ < 1e-25)
        from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

        prv = PRVAccountant(prvs=[PoissonSubsampledGaussianMechanism(
            noise_multiplier=sigma_eff(events[0]), sampling_probability=events[0].sampling_rate)],
            max_self_compositions=[len(events)], eps_error=0.01, delta_error=1e-9)
        lower, _, upper = prv.compute_epsilon(delta=1e-5, num_self_compositions=[len(events)])
        assert lower - 0.06 <= report["epsilon"] <= upper + 0.06, (report["epsilon"], lower, upper)


def test_the_charge_is_on_disk_before_the_masked_vector_and_a_crash_never_uncharges(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = secagg_config(**{"num-rounds": 1})
    nodes = {"node-policy": str(write_policy(tmp_path)), "node-state": str(tmp_path / "nodes")}
    seen: list[int] = []
    real = handlers.noisy_contribution

    def crash_on_node_1(x: np.ndarray, **kw: Any) -> np.ndarray:
        ledgers = {f.name: len(node_events(f)) for f in node_dirs(tmp_path / "nodes")}
        seen.append(sum(ledgers.values()))
        if len(seen) == 2:  # the second node to encode crashes after its charge
            raise RuntimeError("crash after the charge")
        return real(x, **kw)

    monkeypatch.setattr(handlers, "noisy_contribution", crash_on_node_1)
    strat, _ = run(cfg, nodes)
    # when each node encodes, its own charge (and every earlier node's) is already on disk
    assert seen == [1, 2, 3, 4]
    assert strat.stop_reason is None  # three survivors: the round unmasks
    counts = [len(node_events(f)) for f in node_dirs(tmp_path / "nodes")]
    assert counts == [1, 1, 1, 1]  # the crashed node stays charged


# ----------------------------------------------------------------- a malicious server


def test_attack_a_smaller_local_sigma_to_one_node(tmp_path: Path) -> None:
    cfg = secagg_config(**{"num-rounds": 1})

    def halve_node_2(node: int, msg: Message) -> None:
        if node == 2:
            scale_sigma(msg, 0.5)

    # today: the node without a policy adds half the noise it was planned to
    strat, grid = run(cfg, None, halve_node_2)
    assert strat.stop_reason is None and grid.refusals() == []
    collected = [n for kind, n, r in grid.seen
                 if kind == "train.sa_collect" and MASKED in r.content.array_records]
    assert 2 in collected
    # now: it refuses, the reason reaches the server, and it is not charged
    nodes = {"node-policy": str(write_policy(tmp_path)), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes, halve_node_2)
    reasons = grid.refusals()
    assert len(reasons) == 1 and reasons[0].startswith("node policy: local-sigma=") and "below" in reasons[0]
    assert not (tmp_path / "nodes" / "node-2" / "ledger.jsonl").exists()
    assert [len(node_events(tmp_path / "nodes" / f"node-{k}")) for k in (0, 1, 3)] == [1, 1, 1]


def test_attack_a_claimed_n_min_of_100(tmp_path: Path) -> None:
    """The server asks every node for the σ_loc of ``n_min = 100`` honest parties while 4 take part."""
    cfg = secagg_config(**{"num-rounds": 1})
    claimed = math.sqrt(3 / 100)  # σ_loc ∝ 1/√n_h: the honest plan has n_h = 3

    def claim(node: int, msg: Message) -> None:
        scale_sigma(msg, claimed)

    strat, grid = run(cfg, None, claim)  # today: every node adds a tenth-ish of the noise
    assert strat.stop_reason is None and grid.refusals() == [] and len(strat.rows) == 1
    nodes = {"node-policy": str(write_policy(tmp_path)), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes, claim)
    assert strat.stop_reason is not None and "aborted" in strat.stop_reason  # nothing unmasked
    assert strat.ledger is not None and strat.ledger.charges == []
    assert len(grid.refusals()) == 3 * 4 and all("below" in r for r in grid.refusals())
    assert node_dirs(tmp_path / "nodes") == [] or all(
        not (f / "ledger.jsonl").exists() for f in node_dirs(tmp_path / "nodes"))


def test_a_node_assuming_fewer_honest_shares_than_the_server_refuses(tmp_path: Path) -> None:
    cfg = secagg_config(**{"num-rounds": 1, "secagg-min-survivors": 4})  # the server: n_h = 4
    nodes = {"node-policy": str(write_policy(tmp_path, honest=3)), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes)
    assert strat.stop_reason is not None and grid.refusals() and all("below" in r for r in grid.refusals())


def test_attack_a_forged_server_ledger_leaves_the_nodes_ledgers_true(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    cfg = secagg_config(**{"out-dir": str(out)})
    nodes = {"node-policy": str(write_policy(tmp_path)), "node-state": str(tmp_path / "nodes")}
    strat, _ = run(cfg, nodes)
    assert strat.stop_reason is None
    truth = account(out, capsys)
    node_before = [account(f, capsys)["epsilon"] for f in node_dirs(tmp_path / "nodes")]
    # the operator rewrites the server's ledger whole (a consistent chain of one charge) and its files
    ledger = read_ledger(out)
    assert ledger is not None and len(ledger.charges) == 2
    forged = Ledger.start(ledger.mechanism, ledger.mechanism_digest)
    first = ledger.charges[0]
    assert first.event is not None
    forged.append_charge(1, 0, first.event)
    (out / "ledger.jsonl").unlink()
    write_ledger(out, forged)
    for name in ("checkpoint.pt", "metrics.csv"):
        (out / name).unlink()
    lied = account(out, capsys)["epsilon"]
    assert lied < truth["epsilon"]  # today: the server's word is all there is
    node_after = [account(f, capsys)["epsilon"] for f in node_dirs(tmp_path / "nodes")]
    assert node_after == node_before  # the nodes' ledgers are untouched and tell the truth:
    for folder in node_dirs(tmp_path / "nodes"):  # at the server's δ, the unforged ε
        report = account(folder, capsys, "--delta", str(truth["delta"]))
        assert report["charges"] == 2 and report["epsilon"] == pytest.approx(truth["epsilon"], rel=1e-9)


def test_attack_a_second_run_spends_the_nodes_budget_again(tmp_path: Path) -> None:
    cfg = secagg_config()
    # a budget that one run of two rounds fits in, and a second does not
    policy = load_node_policy(write_policy(tmp_path))
    data = load_dataset(cfg.data)
    plan = build_plan(cfg, data, num_devices=len(data.devices)).engine(
        [len(d) for d in data.devices], list(range(len(data.devices))))
    event = plan.mechanism.event
    assert isinstance(event, DistributedDiscreteGaussian)
    probe = NodeLedger(tmp_path / "probe", policy)
    probe.charge(1, 1, event)
    two = probe.charge(1, 2, event)
    write_policy(tmp_path, eps=two * 1.01)
    nodes = {"node-policy": str(tmp_path / "policy.toml"), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes)
    assert strat.stop_reason is None and len(strat.rows) == 2
    # today: without node ledgers a second run spends the same records again
    again, _ = run(cfg, None)
    assert again.stop_reason is None and len(again.rows) == 2
    # now: the second run on the same node state is refused by every node, nothing more charged
    strat, grid = run(cfg, nodes)
    assert strat.stop_reason is not None and "aborted" in strat.stop_reason
    assert grid.refusals() and all(r.startswith("node budget:") for r in grid.refusals())
    assert [len(node_events(f)) for f in node_dirs(tmp_path / "nodes")] == [2, 2, 2, 2]


def test_attack_a_plain_round_sent_in_a_secagg_run(tmp_path: Path) -> None:
    """A server that downgrades to plain aggregation asks for the clipped private sum in the clear."""
    cfg = plain_config()
    strat, grid = run(cfg, None)  # today: the node answers with its private sum
    assert strat.stop_reason is None
    assert any("private" in r.content.array_records
               for k, _, r in grid.seen if k == "train" and not r.has_error())
    nodes = {"node-policy": str(write_policy(tmp_path)), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes)
    refusals = [str(r.error.reason) for k, _, r in grid.seen if k == "train" and r.has_error()]
    assert len(refusals) == 4 and all("trust-server=false" in r for r in refusals)


def test_a_trusting_node_answers_plain_rounds_and_charges_the_resolved_event(tmp_path: Path) -> None:
    cfg = plain_config()
    nodes = {"node-policy": str(write_policy(tmp_path, extra="trust-server = true\n")),
             "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes)
    assert strat.stop_reason is None and grid.refusals() == []
    assert strat.ledger is not None
    for folder in node_dirs(tmp_path / "nodes"):
        ledger = read_ledger(folder)
        assert ledger is not None and ledger.events() == strat.ledger.events()


def test_a_public_round_is_answered_and_not_charged(tmp_path: Path) -> None:
    cfg = load_config({**plain_config().to_flat(), "mode": "public", "noise-multiplier": ""})
    nodes = {"node-policy": str(write_policy(tmp_path)), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes)
    assert strat.stop_reason is None and grid.refusals() == [] and len(strat.rows) == 1
    assert node_dirs(tmp_path / "nodes") == []


def test_a_calibrated_run_resolves_to_the_same_sigma_on_the_node(tmp_path: Path) -> None:
    """``target-epsilon``: the node calibrates σ itself (the server's resolver at its own floor)."""
    cfg = load_config({**secagg_config(**{"num-rounds": 1}).to_flat(), "noise-multiplier": "",
                       "target-epsilon": 3.0})
    nodes = {"node-policy": str(write_policy(tmp_path)), "node-state": str(tmp_path / "nodes")}
    strat, grid = run(cfg, nodes)
    assert strat.stop_reason is None and grid.refusals() == []
    assert strat.ledger is not None
    assert all(node_events(f) == strat.ledger.events() for f in node_dirs(tmp_path / "nodes"))


def test_simulated_nodes_get_one_state_folder_each() -> None:
    got = simulated_node_config({"partition-id": 3, "num-partitions": 4},
                                {"node-policy": "/p.toml", "node-state": "/s"})
    assert got == {"partition-id": 3, "num-partitions": 4, "node-policy": "/p.toml",
                   "node-state": "/s/node-3"}


# ----------------------------------------------------------------- the server's own ledger


def test_attack_the_checkpoint_every_edit_is_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A session with ``checkpoint-every = 10`` crashes after round 13 (checkpoint after round
    10); the operator rolls the ledger back to the checkpoint's head and edits the
    checkpoint's ``checkpoint-every`` to 1, so a resume would charge 1 round pessimistically
    instead of the 10 the session may have charged."""
    from fedfdp.algorithm import run_centralised
    from fedfdp.checkpoint import CHECKPOINT_FILE, CheckpointMismatch, load_checkpoint

    run_dir = tmp_path / "run"
    keys = {"num-devices": 3, "records-per-device": 50, "sampling-rate": 0.2, "public-batch-size": 20,
            "noise-multiplier": 1.0, "clipping-quantile": 0, "num-rounds": 14, "progress": False,
            "checkpoint-every": 10, "out-dir": str(run_dir)}

    def crash_after_13(r: int, model: Any) -> dict[str, float]:
        if r == 13:
            raise RuntimeError("crash after round 13")
        return {}

    with pytest.raises(RuntimeError, match="crash after round 13"):
        run_centralised(load_config(keys), evaluate_fn=crash_after_13)
    ckpt = load_checkpoint(run_dir)
    ledger = read_ledger(run_dir)
    assert ckpt is not None and ledger is not None and ckpt.round == 10 and len(ledger.charges) == 13
    assert ledger.checkpoint_every() == 10  # the session's value, in the chain
    # the rollback: the ledger cut back to the head the checkpoint recorded
    rolled = Ledger(ledger.entries[: ckpt.head.entries])
    (run_dir / "ledger.jsonl").unlink()
    write_ledger(run_dir, rolled)
    # the edit: checkpoint-every 10 -> 1 inside checkpoint.pt (its JSON metadata)
    import torch

    doc = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
    meta = json.loads(doc["meta"])
    meta["checkpoint-every"] = 1
    doc["meta"] = json.dumps(meta)
    torch.save(doc, run_dir / CHECKPOINT_FILE)
    resumed = load_config({**keys, "resume": True, "checkpoint-every": 1})

    def pessimistic() -> int:  # the resume checks, as the run loop calls them
        data = load_dataset(resumed.data)
        plan = build_plan(resumed, data)
        mechanism, _ = plan.resolve([len(d) for d in data.devices])
        assert plan.files is not None
        return plan.files.verify(mechanism).unrecorded

    # today's arithmetic: the edited checkpoint would have the resume charge 1 round, not 10
    assert pessimistic() == 1
    # now: resume and fedfdp account both refuse the edited checkpoint, naming it
    with pytest.raises(CheckpointMismatch, match="checkpoint-every=1, but the ledger's chain records 10"):
        run_centralised(resumed)
    capsys.readouterr()
    assert fedfdp_main(["account", "--run", str(run_dir), "--json"]) == 2
    assert "the checkpoint was edited" in capsys.readouterr().err


# ----------------------------------------------------------------- end to end


@pytest.mark.slow
def test_fedfdp_run_with_a_node_policy_on_flowers_simulation_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fedfdp run --node-policy`` on Flower's simulation engine, twice on the same node
    state: every simulated node charges itself each round, the second run continues its
    ledger, and each node's ε at the server's δ is the server's printed ε (same events)."""
    import subprocess
    import sys

    policy = write_policy(tmp_path, eps=10.0)
    base = ["--set", "dataset=fleet", "--set", "num-devices=6", "--set", "records-per-device=60",
            "--set", "num-rounds=2", "--set", "aggregation=secagg", "--set", "secagg-min-survivors=3",
            "--set", "noise-multiplier=1.0", "--supernodes", "3", "--node-policy", str(policy)]
    state = tmp_path / "a" / "nodes"
    # The second run's policy names a roster: fedfdp run stands in for the deployment
    # authority (each node's signing key in its own folder, the roster of their public keys).
    (tmp_path / "b-policy").mkdir()
    rostered = write_policy(tmp_path / "b-policy", eps=10.0, extra='roster = "roster.toml"\n')
    for out, extra in ((tmp_path / "a", []),
                       (tmp_path / "b", ["--node-state", str(state), "--node-policy", str(rostered)])):
        argv = [sys.executable, "-m", "simulations.cli", "run", "--out", str(out), *base, *extra]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
    roster = Roster.from_file(tmp_path / "b-policy" / "roster.toml")
    assert len(roster) == 3
    for p in range(3):
        assert SigningKey.load_or_create(state / f"node-{p}" / SIGNING_KEY_FILE).public in roster
    server = account(tmp_path / "a", capsys)
    folders = node_dirs(state)
    assert [f.name for f in folders] == ["node-0", "node-1", "node-2"]
    for folder in folders:
        report = account(folder, capsys, "--delta", repr(server["delta"]))
        assert report["charges"] == 4 and len(report["runs"]) == 2 and report["honest_parties"] == 3
        assert node_events(folder)[:2] == written_events(tmp_path / "a")
    assert not (tmp_path / "b" / "nodes").exists()


def written_events(run_dir: Path) -> list[Any]:
    ledger = read_ledger(run_dir)
    assert ledger is not None
    return ledger.events()
