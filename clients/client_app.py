"""Flower ClientApp: one SuperNode serving one (or several) devices' records.

``@app.query`` answers the server's one-time question "which devices do you
hold and how many training records each" (dataset sizes are public in FDP).

``@app.train("sa_setup" | "sa_keys" | "sa_collect" | "sa_unmask")`` are the four
stages of a secure-aggregation round (``aggregation = "secagg"``,
:mod:`clients.secagg_handlers`).

``@app.train`` runs the node side of one round of Algorithm 1 for the devices
the instruction names (:func:`fedfdp.contribution.node_contribution`): the
clipped private sum over each device's Poisson batch — coins and padding from
this node's own secret entropy, never from anything it was sent — and the
unclipped public sum over independently drawn uniform batches. It replies with
both sums and the public count and loss — never the realised private batch
size or any statistic of the private batch.

A node process builds what it serves once and reuses it for every message of
the run (:func:`node_runtime`: the records, the model, the feature map and the
secret source, kept in the process's :class:`NodeCache` and keyed by the
configuration and the node config): on Flower's simulation engine a Ray actor
serves many messages, and a long-lived ClientApp process (docs/deploy.md) serves
a whole run.

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

import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, MetricRecordValues, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from clients import secagg_handlers
from fedfdp import protocol as P
from fedfdp.config import Config, ConfigError, DataLocation, load_config
from fedfdp.contribution import ClientParts, Contribution, client_update
from fedfdp.data import DeviceData, FederatedData, load_dataset, load_site
from fedfdp.losses import FeatureMap, build_decomposition
from fedfdp.models import build_model_for
from fedfdp.parts import client_parts_for

log = logging.getLogger("fedfdp.client")


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


def _partition(context: Context) -> tuple[int, int]:
    node = context.node_config
    try:
        return int(node["partition-id"]), int(node["num-partitions"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"node config {dict(node)}: needs integer 'partition-id' and 'num-partitions'"
        ) from exc


def _site_devices(cfg: Config, context: Context) -> list[tuple[int, str]]:
    """``(global device id, file)`` for each device of a node with its own files."""
    node = context.node_config
    raw_path = node.get("data-path")
    if not isinstance(raw_path, str) or not raw_path:
        raise ValueError(
            f"node config {dict(node)}: data-location='node' needs this SuperNode's own file as "
            "data-path (--node-config \"partition-id=K num-partitions=P data-path='/path'\"; a site "
            "with several devices: device-ids='3,4' data-path='/a.csv,/b.csv')"
        )
    num_devices = cfg.data.num_devices
    if "device-ids" not in node:
        pid, num = _partition(context)
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


def node_records(cfg: Config, context: Context) -> NodeRecords:
    """The records this node serves (see the module docstring)."""
    if cfg.data.data_location is DataLocation.CENTRAL:
        pid, num = _partition(context)
        return NodeRecords.partition_of(load_dataset(cfg.data), pid, num)
    devices = _site_devices(cfg, context)
    sites = [(d, load_site(cfg.data, path)) for d, path in devices]
    return NodeRecords(sites[0][1], {d: site.devices[0] for d, site in sites})


def _config(fixed: Config | None, context: Context, simulation: bool = False) -> Config:
    if fixed is not None:
        return fixed
    cfg = _process_cache.config(context.run_config)
    if cfg.privacy.reproducible_noise and not simulation:
        raise ConfigError(
            "reproducible-noise=true: refused by a ClientApp reading Flower's run config (flwr run, a "
            "SuperNode): its Poisson coins would derive from a seed every party can read"
        )
    return cfg


def handle_query(records: NodeRecords) -> dict[str, MetricRecordValues]:
    """Devices this node serves and their (public) training-record counts."""
    return device_sizes(records.devices)


def device_sizes(devices: Mapping[int, DeviceData]) -> dict[str, MetricRecordValues]:
    """The query answer for ``devices``: their ids and (public) record counts."""
    ids = sorted(devices)
    return {P.DEVICE_IDS: ids, P.DEVICE_SIZES: [len(devices[d]) for d in ids]}


def contribution_arrays(
    model: torch.nn.Module, total: Contribution
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, MetricRecordValues]]:
    """A contribution as named arrays and metrics: (private sums, public sums, metrics)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    private = dict(zip(names, total.private_sum, strict=True)) if total.private_sum else None
    public = dict(zip(names, total.public_sum, strict=True)) if total.public_sum else None
    metrics: dict[str, MetricRecordValues] = {
        P.PUBLIC_COUNT: total.public_count,
        P.PUBLIC_LOSS_SUM: total.public_loss_sum,
        P.UNCLIPPED_COUNT: total.unclipped_count,
    }
    return private, public, metrics


@dataclass(frozen=True)
class NodeRuntime:
    """What a node builds once per run and reuses every round.

    Attributes
    ----------
    cfg : Config
    records : NodeRecords
        The devices this node serves.
    model : torch.nn.Module
        The configured model; each round loads the global weights into it.
    feature_map : FeatureMap
        Ψ and the loss decomposition.
    parts : ClientParts
        The node's components (secret entropy as ``cfg`` asks for it).
    """

    cfg: Config
    records: NodeRecords
    model: nn.Module
    feature_map: FeatureMap
    parts: ClientParts

    @classmethod
    def build(cls, cfg: Config, records: NodeRecords, parts: ClientParts | None = None) -> NodeRuntime:
        """Build the model, the feature map and the parts for ``records``."""
        parts = parts if parts is not None else client_parts_for(cfg, records.data)
        model = build_model_for(cfg, records.data)
        check_node_inputs(model, records.devices, records.data.num_classes)  # once per runtime
        return cls(cfg, records, model, build_decomposition(cfg, records.data), parts)

    def train(
        self, state: Mapping[str, torch.Tensor], config: Mapping[str, Any]
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, MetricRecordValues]]:
        """The node side of one round: (private sums, public sums, metrics)."""
        torch.set_num_threads(1)
        order = P.TrainInstruction.from_config(config)
        if not set(order.device_ids) <= self.records.devices.keys():
            raise P.InvalidInstruction(f"{P.DEVICE_IDS}={list(order.device_ids)}: not this node's devices")
        self.model.load_state_dict(state)
        total = client_update(self.model, self.feature_map, self.records.devices, order,
                              public_seed=self.cfg.training.seed, parts=self.parts)
        return contribution_arrays(self.model, total)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


@torch.no_grad()
def check_node_inputs(
    model: nn.Module, devices: Mapping[int, DeviceData], num_classes: int | None = None
) -> None:
    """Refuse a model that does not accept this node's records: the node-side part of
    :func:`fedfdp.evaluation.check_run_inputs` (a node holds only its own devices).

    The model is run once, in ``eval`` mode without gradients (its state unchanged), on
    two records of the first non-empty device; it must accept them and, when
    ``num_classes`` is given, return one output per class.

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


def _input_key(model: nn.Module, devices: Mapping[int, DeviceData]) -> Hashable:
    """What :func:`check_node_inputs` depends on: the model's class and parameter shapes,
    and the shape and dtype of the node's records.
    """
    sample = next((dev.x[:1] for dev in devices.values() if len(dev.y)), None)
    shapes = tuple((name, tuple(t.shape)) for name, t in model.state_dict().items())
    records = (tuple(sample.shape[1:]), str(sample.dtype)) if sample is not None else None
    return type(model).__module__, type(model).__qualname__, shapes, records


#: Input checks a process has passed (:func:`fdp_train`): a ClientApp that builds its
#: model afresh each round checks it in its first round only.
_checked_inputs: OrderedDict[Hashable, None] = OrderedDict()
_checked_lock = threading.Lock()


def _check_once(model: nn.Module, devices: Mapping[int, DeviceData]) -> None:
    key = _input_key(model, devices)
    with _checked_lock:
        if key in _checked_inputs:
            _checked_inputs.move_to_end(key)
            return
    check_node_inputs(model, devices)
    with _checked_lock:
        _checked_inputs[key] = None
        while len(_checked_inputs) > RUNTIME_CACHE_SIZE:
            _checked_inputs.popitem(last=False)


#: Node runtimes (and parsed run configurations) a process keeps: a Ray actor may
#: serve several virtual SuperNodes, each with its own runtime.
RUNTIME_CACHE_SIZE = 8


class NodeCache:
    """What a node process keeps between messages, least recently used dropped
    beyond ``size`` entries each; safe to share between threads. The ClientApp
    uses one per process (:func:`node_runtime`).

    ``config(run_config)``: Flower's run config parsed once
    (:func:`fedfdp.config.load_config`). ``runtime(cfg, context)``: the node's
    :class:`NodeRuntime`, built on first use, keyed by the configuration and the
    node config (a changed site file or partition builds a new one).
    """

    def __init__(self, size: int = RUNTIME_CACHE_SIZE) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r}: must be an integer >= 1")
        self.size = size
        self._lock = threading.Lock()
        self._configs: OrderedDict[Hashable, Config] = OrderedDict()
        self._runtimes: OrderedDict[Hashable, NodeRuntime] = OrderedDict()

    def _get(self, table: OrderedDict[Hashable, Any], key: Hashable) -> Any:
        with self._lock:
            value = table.get(key)
            if value is not None:
                table.move_to_end(key)
            return value

    def _put(self, table: OrderedDict[Hashable, Any], key: Hashable, value: Any) -> None:
        with self._lock:
            table[key] = value
            while len(table) > self.size:
                table.popitem(last=False)

    def config(self, run_config: Mapping[str, Any]) -> Config:
        """The configuration of Flower's ``run_config``, parsed on first use."""
        key = tuple(sorted(
            (str(k), v if isinstance(v, Hashable) else repr(v)) for k, v in run_config.items()
        ))
        cfg: Config | None = self._get(self._configs, key)
        if cfg is None:
            cfg = load_config(dict(run_config))
            self._put(self._configs, key, cfg)
        return cfg

    def runtime(self, cfg: Config, context: Context) -> NodeRuntime:
        """The node's :class:`NodeRuntime` for ``cfg``, built on first use."""
        key = cfg, tuple(sorted((str(k), v) for k, v in context.node_config.items()))
        runtime: NodeRuntime | None = self._get(self._runtimes, key)
        if runtime is None:
            runtime = NodeRuntime.build(cfg, node_records(cfg, context))
            self._put(self._runtimes, key, runtime)
        return runtime


#: The process's cache. The ClientApp's handlers reach it through module-level
#: functions: Ray pickles the ClientApp object with every message it sends to an
#: actor, so a cache held by the app itself would arrive empty each time.
_process_cache = NodeCache()


def node_runtime(cfg: Config, context: Context) -> NodeRuntime:
    """The node's :class:`NodeRuntime`, built on first use and kept in the
    process (:class:`NodeCache`, at most :data:`RUNTIME_CACHE_SIZE`).
    """
    return _process_cache.runtime(cfg, context)


def handle_train(
    cfg: Config,
    records: NodeRecords,
    state: dict[str, torch.Tensor],
    config: Mapping[str, Any],
    parts: ClientParts | None = None,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, MetricRecordValues]]:
    """The node side of one round on ``records`` with the configured model and
    public view, built afresh; returns (private sums, public sums, metrics).
    ``parts`` defaults to the secret entropy ``cfg`` asks for
    (:func:`fedfdp.entropy.run_secrets`) and the honest components. The
    ClientApp itself reuses one :class:`NodeRuntime` per run (:func:`node_runtime`).
    """
    return NodeRuntime.build(cfg, records, parts).train(state, config)


# --------------------------------------------------------------------------------------
# your own ClientApp: two handlers
# --------------------------------------------------------------------------------------


def fdp_query(msg: Message, devices: Mapping[int, DeviceData]) -> Message:
    """Answer the strategy's registration query: this node's device ids and
    record counts (public in FDP). Call it from your ``@app.query()``.

    ``devices`` maps each device's global id (``0 .. num_devices − 1`` over the
    whole federation) to its records (:class:`fedfdp.DeviceData`).
    """
    return Message(RecordDict({P.METRICS: MetricRecord(device_sizes(devices))}), reply_to=msg)


def fdp_train(
    msg: Message,
    model: torch.nn.Module,
    feature_map: FeatureMap,
    devices: Mapping[int, DeviceData],
    *,
    public_seed: int = 0,
    parts: ClientParts | None = None,
) -> Message:
    """Answer one train instruction of :class:`strategies.FDPStrategy` with
    your own model and data. Call it from your ``@app.train()``.

    Loads the message's global weights into ``model``, computes the clipped
    private sum over each asked device's Poisson batch (coins and padding from
    this process's OS CSPRNG) and the unclipped public sum over its public batch
    (:func:`fedfdp.client_update`), and replies with both sums and the public
    count — never the private batch size. ``public_seed`` must be the seed the
    server uses for public randomness (the run config's ``seed``).

    The first call of a process (per model architecture and record shape) checks that
    ``model`` accepts the records (:func:`check_node_inputs`): a model of the wrong input
    width is refused in one line naming the width (:class:`fedfdp.ConfigError`).
    """
    torch.set_num_threads(1)
    order = P.TrainInstruction.from_config(msg.content.config_records[P.CONFIG])
    _check_once(model, devices)  # the model's input width against the records: first round only
    model.load_state_dict(msg.content.array_records[P.ARRAYS].to_torch_state_dict())
    total = client_update(model, feature_map, devices, order, public_seed=public_seed, parts=parts)
    return reply_message(msg, *contribution_arrays(model, total))


def reply_message(
    msg: Message,
    private: dict[str, torch.Tensor] | None,
    public: dict[str, torch.Tensor] | None,
    metrics: Mapping[str, MetricRecordValues],
) -> Message:
    """The reply to a train message, built from ``handle_train``'s three results."""
    content = RecordDict({P.METRICS: MetricRecord(dict(metrics))})
    if private is not None:
        content[P.PRIVATE] = ArrayRecord(private)
    if public is not None:
        content[P.PUBLIC] = ArrayRecord(public)
    return Message(content, reply_to=msg)


def make_client_app(cfg: Config | None = None, *, simulation: bool = False) -> ClientApp:
    """Build the ClientApp; ``cfg`` fixes the configuration, otherwise it is
    read from Flower's run config. ``simulation``: the ClientApp of ``fedfdp
    run`` (Flower's Simulation Runtime, whose ServerApp refuses every other
    grid), which accepts the reproducible opt-in from the run config.
    """
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return fdp_query(msg, node_runtime(_config(cfg, context, simulation), context).records.devices)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        runtime = node_runtime(_config(cfg, context, simulation), context)
        state = msg.content.array_records[P.ARRAYS].to_torch_state_dict()
        private, public, metrics = runtime.train(state, msg.content.config_records[P.CONFIG])
        return reply_message(msg, private, public, metrics)

    # secure aggregation (aggregation = "secagg"): one round in four stages (clients/secagg_handlers.py)
    @app.train("sa_setup")
    def sa_setup(msg: Message, context: Context) -> Message:
        return secagg_handlers.sa_setup(msg, context)

    @app.train("sa_keys")
    def sa_keys(msg: Message, context: Context) -> Message:
        return secagg_handlers.sa_keys(msg, context)

    @app.train("sa_collect")
    def sa_collect(msg: Message, context: Context) -> Message:
        runtime = node_runtime(_config(cfg, context, simulation), context)
        return secagg_handlers.sa_collect(msg, context, runtime)

    @app.train("sa_unmask")
    def sa_unmask(msg: Message, context: Context) -> Message:
        return secagg_handlers.sa_unmask(msg, context)

    return app


app = make_client_app()
#: The ClientApp of ``fedfdp run`` (see :func:`make_client_app`).
simulation_app = make_client_app(simulation=True)
