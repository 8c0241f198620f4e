"""A node's own policy: the guarantee a SuperNode enforces on its records, whatever the server says.

The device's owner writes it (a TOML file named by the SuperNode's node configuration,
``node-policy``; ``fedfdp run --node-policy FILE`` gives every simulated node the same
one). The server never sends it and cannot change it. Flat kebab-case keys::

    max-epsilon = 8.0             # lifetime budget of this node's records, every run together
    delta = 1e-5                  # the δ that budget is stated at
    relation = "add-remove"       # the neighbouring relation (the only one a node accounts)
    min-honest-shares = 3         # the fewest honest noise shares this node assumes in a sum
    max-colluders = 1             # the most parties this node assumes collude with the server
    roster = "roster.toml"        # optional: the parties' public signing keys (relative to this file)
    trust-server = false          # optional: answer plain (server-noised) rounds too

What the node does with it (:mod:`fedfdp.node_ledger` keeps the budget):

* **secure aggregation** (``aggregation = "secagg"``): the node charges *itself*, before
  it releases its masked vector, the round's distributed discrete Gaussian event
  computed from its own assumptions: the local std ``σ_loc`` and scale ``s`` it is asked
  to use (what it actually adds), its own model's ``d``, its own Poisson rate ``q``, and
  ``n_h = min-honest-shares`` — never the server's ``n_min − t_c`` (:func:`node_event`,
  through :func:`fedfdp.secagg.plan.secagg_event`, the resolver the server uses). It
  refuses a ``σ_loc`` below the one that resolver gives for the run's ``σ`` at its own
  ``n_h`` (:func:`required_local_sigma`, :func:`fedfdp.secagg.plan.local_sigma_for`): a
  server claiming more honest parties than the node assumes (a larger ``n_min``) asks
  for less noise than the node needs and is refused. It refuses a Shamir threshold
  ``t ≤ max-colluders`` (that many colluders could unmask its vector alone).
* **plain aggregation**: the node cannot enforce noise it does not add, so it refuses,
  unless ``trust-server = true``: then it answers and charges its own ledger with the
  event the run's resolved mechanism names (trusting the server to add that noise).

Sensitivity and relation: a node's charge is the add/remove event of the FDP paper
(Definition 6); a distributed round has sensitivity ``Δ = s + √d`` in integer units
and is accounted by routes A and B (:class:`fedfdp.accounting.distributed.DistributedAccountant`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfdp import validate
from fedfdp.accounting.discrete_gaussian_bounds import MIN_LOCAL_SIGMA
from fedfdp.accounting.events import DistributedDiscreteGaussian, Relation
from fedfdp.config import ConfigError
from fedfdp.input_files import regular_file
from fedfdp.secagg.plan import SecAggPlan, local_sigma_for, secagg_event

__all__ = ["NodePolicy", "RoundRefused", "load_node_policy", "node_event", "required_local_sigma"]

#: The node-config keys a SuperNode reads its policy and its state directory from.
POLICY_KEY = "node-policy"
STATE_KEY = "node-state"

#: The policy file's keys (and whether each is required).
KEYS = {"max-epsilon": True, "delta": True, "relation": False, "min-honest-shares": True,
        "max-colluders": True, "roster": False, "trust-server": False}


class RoundRefused(ValueError):
    """A request this node refuses under its policy; the message is the reason the server sees."""


@dataclass(frozen=True)
class NodePolicy:
    """What a node's owner allows (module docstring).

    Attributes
    ----------
    max_epsilon : float
        The lifetime budget of this node's records (ε, every run together), ``> 0``.
    delta : float
        The δ of that budget, in ``(0, 1)``.
    relation : Relation
        The neighbouring relation of the budget (``add-remove``: the only one a node's
        accountant composes).
    min_honest_shares : int
        ``n_h``: the fewest honest noise shares the node assumes in any sum it joins, ``>= 1``.
    max_colluders : int
        The most parties the node assumes collude with the server, ``>= 0``.
    roster : Path or None
        The roster file of the parties' public signing keys (carried, not read here).
    trust_server : bool
        Answer plain rounds (the server adds the noise), charging the resolved event.
    """

    max_epsilon: float
    delta: float
    min_honest_shares: int
    max_colluders: int
    relation: Relation = Relation.ADD_REMOVE
    roster: Path | None = None
    trust_server: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_epsilon", validate.positive("max-epsilon", self.max_epsilon))
        object.__setattr__(self, "delta", validate.open_unit("delta", self.delta))
        honest = validate.count("min-honest-shares", self.min_honest_shares)
        object.__setattr__(self, "min_honest_shares", honest)
        object.__setattr__(self, "max_colluders", validate.count("max-colluders", self.max_colluders, 0))
        try:
            relation = Relation(self.relation)
        except ValueError:
            raise ValueError(f"relation={self.relation!r}: must be 'add-remove'") from None
        if relation is not Relation.ADD_REMOVE:
            raise ValueError(f"relation={str(relation)!r}: a node's ledger composes add/remove events only "
                             "(must be 'add-remove')")
        object.__setattr__(self, "relation", relation)
        if not isinstance(self.trust_server, bool):
            raise ValueError(f"trust-server={self.trust_server!r}: must be true or false")
        if self.roster is not None:
            object.__setattr__(self, "roster", Path(self.roster))
        elif honest > 1:
            # Without a roster the node cannot tell the server's sybils from parties: the
            # only honest share it can count on is its own.
            raise ValueError(f"min-honest-shares={honest} without a roster: a server could fill the floor "
                             "with sybil nodes; name the parties' roster (roster = \"FILE\") or set "
                             "min-honest-shares = 1")

    def to_dict(self) -> dict[str, Any]:
        return {"max-epsilon": self.max_epsilon, "delta": self.delta, "relation": str(self.relation),
                "min-honest-shares": self.min_honest_shares, "max-colluders": self.max_colluders,
                "roster": None if self.roster is None else str(self.roster),
                "trust-server": self.trust_server}


def load_node_policy(path: str | Path) -> NodePolicy:
    """The policy in the TOML file ``path`` (module docstring); ``roster`` relative to its folder.

    Raises
    ------
    ConfigError
        One line naming the file and the key: unreadable, not TOML, an unknown or missing
        key, a bad value.
    """
    path = Path(path)
    label = f"node-policy={str(path)!r}"
    regular_file(path, "node-policy")  # a FIFO or a device would never end
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label}: not valid TOML ({str(exc).splitlines()[0]})") from None
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise ConfigError(f"{label}: unknown key(s) {unknown} (known: {', '.join(KEYS)})")
    missing = [k for k, required in KEYS.items() if required and k not in doc]
    if missing:
        raise ConfigError(f"{label}: missing key(s) {missing}")
    roster = doc.get("roster")
    if roster is not None and (not isinstance(roster, str) or not roster):
        raise ConfigError(f"{label}: roster={roster!r}: must be a path")
    try:
        return NodePolicy(
            max_epsilon=doc["max-epsilon"], delta=doc["delta"], min_honest_shares=doc["min-honest-shares"],
            max_colluders=doc["max-colluders"], relation=doc.get("relation", Relation.ADD_REMOVE),
            roster=None if roster is None else path.parent / roster,
            trust_server=doc.get("trust-server", False),
        )
    except ValueError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def node_event(policy: NodePolicy, *, local_sigma: float, scale: float, dimension: int,
               sampling_rate: float) -> DistributedDiscreteGaussian:
    """The event a node charges itself for one secure-aggregation round: the plan as the
    node sees it (the ``σ_loc`` and ``s`` it adds and scales by, its own ``d`` and ``q``,
    and ``n_h = min-honest-shares``), through :func:`fedfdp.secagg.plan.secagg_event`.

    Raises
    ------
    RoundRefused
        ``σ_loc`` below ``MIN_LOCAL_SIGMA`` or an event the vocabulary refuses (the reason).
    """
    if not local_sigma >= MIN_LOCAL_SIGMA:
        raise RoundRefused(f"node policy: local-sigma={local_sigma!r} is below {MIN_LOCAL_SIGMA} "
                           "(not accounted)")
    colluders = policy.max_colluders
    plan = SecAggPlan(local_sigma=float(local_sigma), scale=float(scale), dimension=int(dimension),
                      min_survivors=policy.min_honest_shares + colluders, colluders=colluders,
                      neighbours=None, threshold=None, max_parties=policy.min_honest_shares + colluders)
    try:
        return secagg_event(plan, sampling_rate)
    except ValueError as exc:
        raise RoundRefused(f"node policy: no accountable event ({str(exc).splitlines()[0]})") from None


def required_local_sigma(policy: NodePolicy, noise_multiplier: float, *, scale: float,
                         dimension: int) -> float:
    """The least ``σ_loc`` this node accepts at scale ``s``: the one at which a sum of
    ``min-honest-shares`` honest shares has the run's noise multiplier ``σ``
    (:func:`fedfdp.secagg.plan.local_sigma_for`, as the server resolves it for ``n_min − t_c``).
    """
    return local_sigma_for(noise_multiplier, scale, dimension, policy.min_honest_shares)
