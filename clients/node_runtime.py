"""What a node serves and computes with, built once per run and kept by its process.

:func:`node_records` reads the records one node serves (its Flower partition of the
configured dataset, or its own files: ``data-location``); the run plan's
:func:`~fedfdp.run_plan.build_node_plan` decides the model, Ψ, the node's components
and the public seed; :class:`NodeRuntime` holds both and answers a train instruction
(:meth:`NodeRuntime.train`: one :func:`~fedfdp.contribution.client_update` over the
devices the instruction names). A node process keeps its runtimes in a
:class:`NodeCache` keyed by the run configuration and the node config: on Flower's
simulation engine a Ray actor serves many messages, and a long-lived ClientApp process
(``docs/deploy.md``) serves a whole run.

Which records a node serves (:func:`node_records`) depends on the run's
``data-location``:

``central``
    every node loads the dataset the run configuration names and serves the
    devices of its Flower partition (node config ``partition-id`` /
    ``num-partitions``): partition ``k`` serves devices ``d`` with ``d mod P = k``.
``node``
    the node reads its **own** file, ``data-path`` in its node config, and
    serves one device, number ``partition-id`` (``num-partitions`` must be
    ``num-devices``); a site with several devices names their global numbers
    and files instead (``device-ids='3,4' data-path='/a.csv,/b.csv'``, or one
    path with ``{device}`` in it). The encoding is the one the run config
    declares, so every site maps a record to the same input vector.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedfdp import protocol as P
from fedfdp.accounting.events import PrivacyEvent, SubsampledGaussian
from fedfdp.config import (
    Aggregation,
    ConfigError,
    DataConfig,
    DataLocation,
    PrivacyConfig,
    PrivacyUnit,
    load_config,
)
from fedfdp.contribution import BatchShape, Contribution, client_update
from fedfdp.data import DeviceData, FederatedData, load_dataset, load_site
from fedfdp.evaluation import probe_terms
from fedfdp.losses import FeatureMap
from fedfdp.mechanism import ResolvedMechanism
from fedfdp.modes import PHASES
from fedfdp.node_ledger import NodeLedger
from fedfdp.node_policy import (
    POLICY_KEY,
    STATE_KEY,
    NodePolicy,
    RoundRefused,
    load_node_policy,
    node_event,
    required_local_sigma,
)
from fedfdp.run_plan import NodePlan, build_node_plan, node_mechanism

#: The values of a metric record (what Flower's MetricRecord holds).
MetricValues = int | float | list[int] | list[float]


@dataclass(frozen=True)
class NodeRecords:
    """The records one node serves.

    Attributes
    ----------
    data : FederatedData
        The dataset's schema (Ψ split, classes, public statistics) the model
        and the public view are built from.
    devices : Mapping[int, DeviceData]
        This node's devices, by their global device id.
    """

    data: FederatedData
    devices: Mapping[int, DeviceData]

    @classmethod
    def partition_of(cls, data: FederatedData, partition_id: int, num_partitions: int) -> NodeRecords:
        """Partition ``partition_id`` of ``num_partitions`` of a whole dataset."""
        ids = data.partition(partition_id, num_partitions)
        return cls(data, {d: data.devices[d] for d in ids})


def _partition(node: Mapping[str, Any]) -> tuple[int, int]:
    try:
        return int(node["partition-id"]), int(node["num-partitions"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"node config {dict(node)}: needs integer 'partition-id' and 'num-partitions'"
        ) from exc


def _site_devices(cfg: DataConfig, node: Mapping[str, Any]) -> list[tuple[int, str]]:
    """``(global device id, file)`` for each device of a node with its own files."""
    raw_path = node.get("data-path")
    if not isinstance(raw_path, str) or not raw_path:
        raise ValueError(
            f"node config {dict(node)}: data-location='node' needs this SuperNode's own file as "
            "data-path (--node-config \"partition-id=K num-partitions=P data-path='/path'\"; a site "
            "with several devices: device-ids='3,4' data-path='/a.csv,/b.csv')"
        )
    num_devices = cfg.num_devices
    if "device-ids" not in node:
        pid, num = _partition(node)
        if num != num_devices or not 0 <= pid < num:
            raise ValueError(
                f"node config partition-id={pid} num-partitions={num}: with data-location='node' and "
                f"one file, the SuperNode is one device, so num-partitions must be "
                f"num-devices={num_devices} and partition-id its device number (several devices: "
                "device-ids='3,4' data-path='/a.csv,/b.csv')"
            )
        return [(pid, raw_path)]
    raw_ids = node["device-ids"]
    try:
        ids = [int(v) for v in str(raw_ids).split(",")]
    except ValueError as exc:
        raise ValueError(f"node config device-ids={raw_ids!r}: must be comma-separated integers") from exc
    if len(set(ids)) != len(ids) or not all(0 <= d < num_devices for d in ids):
        raise ValueError(
            f"node config device-ids={raw_ids!r}: need distinct device numbers in 0..{num_devices - 1} "
            f"(num-devices={num_devices})"
        )
    if "{device}" in raw_path:
        paths = [raw_path.replace("{device}", str(d)) for d in ids]
    else:
        paths = [p.strip() for p in raw_path.split(",")]
    if len(paths) != len(ids) or not all(paths):
        raise ValueError(
            f"node config device-ids={raw_ids!r} data-path={raw_path!r}: need one file per device "
            "(comma-separated, in the order of device-ids) or one path with '{device}' in it"
        )
    return list(zip(ids, paths, strict=True))


def node_records(cfg: DataConfig, node_config: Mapping[str, Any]) -> NodeRecords:
    """The records a node with ``node_config`` serves (see the module docstring)."""
    if cfg.data_location is DataLocation.CENTRAL:
        pid, num = _partition(node_config)
        return NodeRecords.partition_of(load_dataset(cfg), pid, num)
    devices = _site_devices(cfg, node_config)
    sites = [(d, load_site(cfg, path)) for d, path in devices]
    return NodeRecords(sites[0][1], {d: site.devices[0] for d, site in sites})


def device_sizes(devices: Mapping[int, DeviceData]) -> dict[str, MetricValues]:
    """The query answer for ``devices``: their ids and (public) record counts."""
    ids = sorted(devices)
    return {P.DEVICE_IDS: ids, P.DEVICE_SIZES: [len(devices[d]) for d in ids]}


def contribution_arrays(
    model: torch.nn.Module, total: Contribution
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, MetricValues]]:
    """A contribution as named arrays and metrics: (private sums, public sums, metrics)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    private = dict(zip(names, total.private_sum, strict=True)) if total.private_sum else None
    public = dict(zip(names, total.public_sum, strict=True)) if total.public_sum else None
    metrics: dict[str, MetricValues] = {
        P.PUBLIC_COUNT: total.public_count,
        P.PUBLIC_LOSS_SUM: total.public_loss_sum,
        P.UNCLIPPED_COUNT: total.unclipped_count,
    }
    return private, public, metrics


@dataclass(frozen=True)
class NodeGuard:
    """A node's own policy and ledger, enforced before it answers a round
    (:mod:`fedfdp.node_policy`, :mod:`fedfdp.node_ledger`).

    Attributes
    ----------
    policy : NodePolicy
        What the node's owner allows (the node config's ``node-policy`` file).
    ledger : NodeLedger
        Its ledger in the node config's ``node-state`` directory.
    noise_multiplier : float or None
        Secure aggregation: the run's ``σ`` as this node resolves it with its own
        ``n_h = min-honest-shares`` (:func:`fedfdp.run_plan.mechanism_for`, the server's
        resolver); None when it cannot (``unresolved`` says why).
    plain_event : PrivacyEvent or None
        Plain aggregation with ``trust-server``: the resolved event the node charges.
    unresolved : str
        Why the node cannot resolve the run (then it refuses every round).
    """

    policy: NodePolicy
    ledger: NodeLedger
    noise_multiplier: float | None
    plain_event: PrivacyEvent | None
    unresolved: str = ""

    def check_setup(self, threshold: int) -> None:
        """Refuse a Shamir threshold that ``max-colluders`` parties could meet alone."""
        if threshold <= self.policy.max_colluders:
            raise RoundRefused(f"node policy: threshold={threshold} <= max-colluders="
                               f"{self.policy.max_colluders} (that many colluders could unmask this node's "
                               "vector); refusing")

    def charge_secagg(self, run: int, order: P.TrainInstruction, *, local_sigma: float, scale: float,
                      dimension: int) -> float:
        """Check a collect request against the policy and charge the node's own event
        write-ahead (:func:`fedfdp.node_policy.node_event`); return the node's ε after it.

        Raises
        ------
        RoundRefused
            The reason the server sees: an unresolvable run, ``σ_loc`` below what the node
            computes, or a budget the round would exceed.
        """
        if self.noise_multiplier is None:
            raise RoundRefused(f"node policy: {self.unresolved}")
        need = required_local_sigma(self.policy, self.noise_multiplier, scale=scale, dimension=dimension)
        if not local_sigma >= need * (1 - 1e-12):
            raise RoundRefused(f"node policy: local-sigma={local_sigma:.6g} is below the {need:.6g} this "
                               f"node needs (σ={self.noise_multiplier:.6g} over min-honest-shares="
                               f"{self.policy.min_honest_shares} at scale {scale:g}); refusing")
        rate = order.sampling_rate if order.unit is PrivacyUnit.RECORD else 1.0  # the node's own Poisson rate
        event = node_event(self.policy, local_sigma=local_sigma, scale=scale, dimension=dimension,
                           sampling_rate=rate)
        return self.ledger.charge(run, order.round, event)

    def charge_plain(self, run: int, order: P.TrainInstruction) -> float | None:
        """A plain round (the server adds the noise): refused unless ``trust-server``; then
        the resolved event is charged write-ahead (refused if the node is asked to sample
        at a higher rate than that event states). A round that asks none of this node's
        devices for private work (a public phase, or devices not drawn) releases nothing
        private: answered, not charged (None).
        """
        if not PHASES[order.phase].has_private or not any(order.private_flags):
            return None
        if not self.policy.trust_server:
            raise RoundRefused("node policy: a plain round (the server adds the noise, which this node "
                               "cannot enforce) and trust-server=false; refusing")
        event = self.plain_event
        if event is None:
            raise RoundRefused(f"node policy: {self.unresolved}")
        if isinstance(event, SubsampledGaussian) and order.sampling_rate > event.sampling_rate:
            raise RoundRefused(f"node policy: sampling-rate={order.sampling_rate:g} above the "
                               f"{event.sampling_rate:g} the run's event states; refusing")
        return self.ledger.charge(run, order.round, event)


#: ``resolve(honest, colluders)``: the run's resolved mechanism as a node with that floor
#: resolves it over the public facts it knows (:func:`fedfdp.run_plan.node_mechanism`).
NodeResolve = Callable[[int, int], ResolvedMechanism]


def node_guard(privacy: PrivacyConfig, location: DataLocation, node_config: Mapping[str, Any],
               resolve: NodeResolve) -> NodeGuard | None:
    """The node's :class:`NodeGuard` when its node config names a ``node-policy`` (and a
    ``node-state`` directory); None without one (the node enforces nothing of its own).

    The run is resolved by the server's resolver (``resolve``) over what this node knows:
    the whole dataset's public device sizes (``data-location = "central"``) and the
    configuration with ``secagg-min-survivors``/``secagg-colluders`` replaced by the
    policy's own ``min-honest-shares + max-colluders``/``max-colluders``. A node holding
    only its own records (``data-location = "node"``) does not know ``N``: it takes the
    configured ``noise-multiplier`` (a target ε cannot be resolved there, and the node
    refuses).

    Raises
    ------
    ConfigError
        One line: a policy file that does not load, or no ``node-state``.
    """
    path = node_config.get(POLICY_KEY)
    if path is None or path == "":
        return None
    policy = load_node_policy(str(path))
    state = node_config.get(STATE_KEY)
    if not isinstance(state, str) or not state:
        raise ConfigError(f"node config {POLICY_KEY}={path!r} without {STATE_KEY}: the node's ledger needs "
                          "a directory of its own (--node-config \"node-policy='...' "
                          "node-state='/var/lib/...'\")")
    ledger = NodeLedger(Path(state), policy)
    p = privacy
    central = location is DataLocation.CENTRAL
    sigma: float | None = None
    plain: PrivacyEvent | None = None
    why = ""
    try:
        if p.aggregation is Aggregation.SECAGG:
            if central:
                sigma = resolve(policy.min_honest_shares, policy.max_colluders).noise_multiplier
            elif p.noise_multiplier is not None:
                sigma = float(p.noise_multiplier)
            else:
                why = ("data-location='node' with a target ε: this node does not know the run's public facts "
                       "to resolve σ (configure noise-multiplier)")
        elif central:
            plain = resolve(policy.min_honest_shares, policy.max_colluders).event
        elif p.noise_multiplier is not None and not p.adaptive_clipping:
            plain = SubsampledGaussian(float(p.noise_multiplier), p.sampling_rate)
        else:
            why = ("data-location='node': this node cannot resolve the run's event (configure "
                   "noise-multiplier)")
    except ConfigError as exc:
        why = f"the run does not resolve under this node's policy ({str(exc).splitlines()[0]})"
    if sigma is None and plain is None and not why:
        why = "the run has no private event this node can charge"
    return NodeGuard(policy, ledger, sigma, plain, why)


@dataclass(frozen=True)
class NodeRuntime:
    """What a node builds once per run and reuses every round.

    Attributes
    ----------
    records : NodeRecords
        The devices this node serves.
    plan : NodePlan
        The model (each round loads the global weights into it), Ψ and the loss
        decomposition, the node's components (secret entropy as the configuration asks)
        and the public seed.
    guard : NodeGuard or None
        The node's own policy and ledger (node config ``node-policy``), if it has one.
    """

    @property
    def dimension(self) -> int:
        """``d``: the trainable parameters of the node's model (what it aggregates)."""
        return sum(int(p.numel()) for p in self.plan.model.parameters() if p.requires_grad)

    records: NodeRecords
    plan: NodePlan
    guard: NodeGuard | None = None

    def __post_init__(self) -> None:
        fmap = self.plan.feature_map  # once
        classes = self.records.data.num_classes if fmap.classifier else None
        check_node_inputs(self.plan.model, self.records.devices, classes, feature_map=fmap)

    @property
    def model(self) -> nn.Module:
        """The node's copy of the model."""
        return self.plan.model

    def train(
        self, state: Mapping[str, torch.Tensor], config: Mapping[str, Any]
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, MetricValues]]:
        """The node side of one round: (private sums, public sums, metrics)."""
        torch.set_num_threads(1)
        order = P.TrainInstruction.from_config(config)
        if not set(order.device_ids) <= self.records.devices.keys():
            raise P.InvalidInstruction(f"{P.DEVICE_IDS}={list(order.device_ids)}: not this node's devices")
        plan = self.plan
        plan.model.load_state_dict(state)
        total = client_update(plan.model, plan.feature_map, self.records.devices, order,
                              public_seed=plan.public_seed, parts=plan.parts)
        return contribution_arrays(plan.model, total)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


@torch.no_grad()
def check_node_inputs(
    model: nn.Module, devices: Mapping[int, DeviceData], num_classes: int | None = None,
    *, feature_map: FeatureMap | None = None,
) -> None:
    """Refuse a model that does not accept this node's records: the node-side part of
    :func:`fedfdp.evaluation.check_run_inputs` (a node holds only its own devices).

    The model is run once, in ``eval`` mode without gradients (its state unchanged), on
    two records of the first non-empty device; it must accept them and, when
    ``num_classes`` is given, return one output per class. A ``feature_map`` whose model
    is not a classifier of the records (a diffusion model) feeds the model the inputs of
    its loss instead (:func:`fedfdp.evaluation.probe_terms`).

    Raises
    ------
    ConfigError
        One line naming the records' input width (and the model's first layer's width
        when it is a ``Linear``).
    """
    sample = next((dev.x[:2] for dev in devices.values() if len(dev.y)), None)
    if sample is None:
        return
    x = torch.as_tensor(sample)
    shape = tuple(x.shape[1:])
    width = f"{shape[0]} input features each" if len(shape) == 1 else f"records of shape {shape}"
    first = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    expects = (f"; its first Linear layer takes in_features={first.in_features}"
               if first is not None and not isinstance(first, nn.LazyLinear) else "")
    was_training = model.training
    model.eval()
    try:
        if feature_map is not None and not feature_map.classifier:
            ys = next(dev.y[:2] for dev in devices.values() if len(dev.y))
            x = probe_terms(feature_map, x, torch.as_tensor(ys, dtype=torch.long)).inputs[0]
        out = model(x)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise ConfigError(f"model {type(model).__name__}: does not accept this node's records "
                          f"({width}{expects}): {type(exc).__name__}: {_first_line(exc)}") from exc
    finally:
        model.train(was_training)
    if num_classes is not None and (not isinstance(out, torch.Tensor) or out.ndim != 2
                                    or out.shape[1] != num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model {type(model).__name__}: returns {got} for {len(x)} records ({width}), but "
                          f"the data has {num_classes} classes")


#: Node runtimes (and parsed run configurations) a process keeps at least: a Ray actor
#: may serve several virtual SuperNodes, each with its own runtime.
RUNTIME_CACHE_SIZE = 8

#: The most runtimes a process keeps, whatever the node count: a process that serves
#: the ``num-partitions`` virtual nodes of a run keeps one runtime per node (rebuilding
#: one per message would reload the configuration and the model every time), up to
#: this many.
RUNTIME_CACHE_MAX = 1024


class NodeCache:
    """What a node process keeps between messages: its :class:`NodeRuntime` per run
    configuration and node config, least recently used dropped beyond its capacity:
    ``size``, or the ``num-partitions`` of a cached node config where that is larger (a
    process serving every virtual node of a run keeps each one's runtime), at most
    ``limit``; safe to share between threads. The ClientApp uses one per process
    (:func:`node_runtime`).
    """

    def __init__(self, size: int = RUNTIME_CACHE_SIZE, limit: int = RUNTIME_CACHE_MAX) -> None:
        for name, value in (("size", size), ("limit", limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if limit < size:
            raise ValueError(f"limit={limit}: must be at least size={size}")
        self.size = size
        self.limit = limit
        self._lock = threading.Lock()
        self._runtimes: OrderedDict[Hashable, NodeRuntime] = OrderedDict()
        self._nodes: dict[Hashable, int] = {}  # each cached key's num-partitions

    def capacity(self) -> int:
        """How many runtimes the cache keeps now: ``size``, or the largest
        ``num-partitions`` of a cached node config, at most ``limit``.
        """
        return min(self.limit, max(self.size, *self._nodes.values(), 0))

    def runtime(
        self, run_config: Mapping[str, Any], node_config: Mapping[str, Any], *, refuse_seeded: bool = False
    ) -> NodeRuntime:
        """The node's :class:`NodeRuntime` for Flower's ``run_config`` (flat keys, parsed
        by :func:`fedfdp.config.load_config`) and ``node_config``, built on first use (a
        changed site file or partition builds a new one). ``refuse_seeded``: a node
        reading Flower's run config refuses ``reproducible-noise`` (its Poisson coins
        would derive from a seed every party can read).
        """
        key = _frozen(run_config), _frozen(node_config), refuse_seeded
        with self._lock:
            runtime = self._runtimes.get(key)
            if runtime is not None:
                self._runtimes.move_to_end(key)
                return runtime
        cfg = load_config(dict(run_config))
        if refuse_seeded and cfg.privacy.reproducible_noise:
            raise ConfigError(
                "reproducible-noise=true: refused by a ClientApp reading Flower's run config (flwr run, a "
                "SuperNode): its Poisson coins would derive from a seed every party can read"
            )
        records = node_records(cfg.data, node_config)
        data = records.data
        guard = node_guard(cfg.privacy, cfg.data.data_location, node_config,
                           lambda h, c: node_mechanism(cfg, data, honest=h, colluders=c))
        plan = build_node_plan(cfg, records.data)
        if cfg.privacy.aggregation is Aggregation.SECAGG:  # the server times the replies: a public shape
            plan = replace(plan, parts=replace(plan.parts, shape=BatchShape.PUBLIC))
        runtime = NodeRuntime(records, plan, guard)
        with self._lock:
            self._runtimes[key] = runtime
            self._nodes[key] = _node_count(node_config)
            while len(self._runtimes) > self.capacity():
                dropped, _ = self._runtimes.popitem(last=False)
                del self._nodes[dropped]
        return runtime


def _node_count(node_config: Mapping[str, Any]) -> int:
    """The node config's ``num-partitions`` (how many nodes the run has), 1 if absent."""
    try:
        return max(1, int(node_config.get("num-partitions", 1)))
    except (TypeError, ValueError):
        return 1


def _frozen(mapping: Mapping[str, Any]) -> Hashable:
    return tuple(sorted((str(k), v if isinstance(v, Hashable) else repr(v)) for k, v in mapping.items()))


#: The process's cache. The ClientApp's handlers reach it through module-level
#: functions: Ray pickles the ClientApp object with every message it sends to an
#: actor, so a cache held by the app itself would arrive empty each time.
_process_cache = NodeCache()


def node_runtime(
    run_config: Mapping[str, Any], node_config: Mapping[str, Any], *, refuse_seeded: bool = False
) -> NodeRuntime:
    """The node's :class:`NodeRuntime`, built on first use and kept in the
    process (:class:`NodeCache`: one per node of the run, at most :data:`RUNTIME_CACHE_MAX`).
    """
    return _process_cache.runtime(run_config, node_config, refuse_seeded=refuse_seeded)
