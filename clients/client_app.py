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
the run (:func:`clients.node_runtime.node_runtime`: the records it serves and the node's
plan — model, feature map, components and secret source — kept in the process's
cache, keyed by the run configuration and the node config; which records a node serves
depends on ``data-location``, :mod:`clients.node_runtime`).
"""

from __future__ import annotations

import threading
import tomllib
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from clients import secagg_handlers
from clients.node_runtime import (
    RUNTIME_CACHE_SIZE,
    MetricValues,
    NodeRecords,
    NodeRuntime,
    check_node_inputs,
    contribution_arrays,
    device_sizes,
    node_runtime,
)
from clients.records import get_record
from fedfdp import protocol as P
from fedfdp.contribution import ClientParts, client_update
from fedfdp.data import DeviceData
from fedfdp.losses import FeatureMap
from fedfdp.node_policy import POLICY_KEY, STATE_KEY, RoundRefused
from fedfdp.secagg import Stage

#: The file ``fedfdp run`` stages at the root of its simulation app when it was given
#: ``--node-policy``/``--node-state``: what the owner of every simulated node configured
#: (Flower's simulation engine gives virtual SuperNodes no node config of their own).
SIMULATED_NODES_FILE = "simulated_nodes.toml"


def simulated_node_config(node_config: Mapping[str, Any], nodes: Mapping[str, Any]) -> dict[str, Any]:
    """A simulated node's config: Flower's (``partition-id``, ``num-partitions``) with the
    staged ``node-policy`` and its own state folder, ``node-state/node-<partition-id>``
    (one folder per node, kept across runs).
    """
    out = dict(node_config)
    if nodes.get(POLICY_KEY):
        out[POLICY_KEY] = str(nodes[POLICY_KEY])
        out[STATE_KEY] = str(Path(str(nodes[STATE_KEY])) / f"node-{node_config.get('partition-id', 0)}")
    return out


def staged_nodes(root: Path | None = None) -> dict[str, Any]:
    """The simulated nodes' settings staged beside this app (:data:`SIMULATED_NODES_FILE`
    at ``root``, default the app's root); empty when there is none.
    """
    path = (root if root is not None else Path(__file__).resolve().parents[1]) / SIMULATED_NODES_FILE
    if not path.is_file():
        return {}
    return dict(tomllib.loads(path.read_text(encoding="utf-8")))


def _runtime(fixed: Mapping[str, Any] | None, context: Context, simulation: bool,
             nodes: Mapping[str, Any] | None = None) -> NodeRuntime:
    """The node's runtime for the fixed run config, or Flower's (which refuses the
    reproducible opt-in outside ``fedfdp run``'s simulation); ``nodes``: the simulated
    nodes' own settings (:func:`simulated_node_config`).
    """
    node_config = simulated_node_config(context.node_config, nodes) if nodes else context.node_config
    if fixed is not None:
        return node_runtime(fixed, node_config)
    return node_runtime(context.run_config, node_config, refuse_seeded=not simulation)


def refused(msg: Message, exc: RoundRefused) -> Message:
    """The error reply of a request the node's policy refuses: its reason, for the server."""
    return Message(error=Error(code=REFUSED_CODE, reason=str(exc)), reply_to=msg)


#: The error code of a reply refused by the node's own policy.
REFUSED_CODE = 403


def handle_query(records: NodeRecords) -> dict[str, MetricValues]:
    """Devices this node serves and their (public) training-record counts."""
    return device_sizes(records.devices)


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
        while len(_checked_inputs) > CHECKED_INPUTS:
            _checked_inputs.popitem(last=False)


#: Input checks a process has passed (:func:`fdp_train`) are kept for at most this many
#: model and record shapes.
CHECKED_INPUTS = RUNTIME_CACHE_SIZE


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
    order = P.TrainInstruction.from_config(get_record(msg.content, P.CONFIG, ConfigRecord))
    _check_once(model, devices)  # the model's input width against the records: first round only
    model.load_state_dict(get_record(msg.content, P.ARRAYS, ArrayRecord).to_torch_state_dict())
    total = client_update(model, feature_map, devices, order, public_seed=public_seed, parts=parts)
    return reply_message(msg, *contribution_arrays(model, total))


def reply_message(
    msg: Message,
    private: dict[str, torch.Tensor] | None,
    public: dict[str, torch.Tensor] | None,
    metrics: Mapping[str, MetricValues],
) -> Message:
    """The reply to a train message, built from :meth:`NodeRuntime.train`'s three results."""
    content = RecordDict({P.METRICS: MetricRecord(dict(metrics))})
    if private is not None:
        content[P.PRIVATE] = ArrayRecord(private)
    if public is not None:
        content[P.PUBLIC] = ArrayRecord(public)
    return Message(content, reply_to=msg)


def make_client_app(run_config: Mapping[str, Any] | None = None, *, simulation: bool = False,
                    nodes: Mapping[str, Any] | None = None) -> ClientApp:
    """Build the ClientApp; ``run_config`` (flat keys, as ``Config.to_flat()`` gives
    them) fixes the configuration, otherwise it is read from Flower's run config.
    ``simulation``: the ClientApp of ``fedfdp run`` (Flower's Simulation Runtime, whose
    ServerApp refuses every other grid), which accepts the reproducible opt-in from the
    run config. ``nodes``: every simulated node's ``node-policy`` and ``node-state``
    (:func:`simulated_node_config`; a SuperNode reads its own from its node config).

    A node whose config names a ``node-policy`` enforces it (:class:`clients.node_runtime.NodeGuard`):
    a request it refuses is answered with an error whose reason the server sees.
    """
    app = ClientApp()
    fixed = dict(run_config) if run_config is not None else None
    own = dict(nodes) if nodes else None

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return fdp_query(msg, _runtime(fixed, context, simulation, own).records.devices)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        runtime = _runtime(fixed, context, simulation, own)
        config = get_record(msg.content, P.CONFIG, ConfigRecord)
        if runtime.guard is not None:  # charged write-ahead, or refused
            try:
                runtime.guard.charge_plain(int(context.run_id), P.TrainInstruction.from_config(config))
            except RoundRefused as exc:
                return refused(msg, exc)
        state = get_record(msg.content, P.ARRAYS, ArrayRecord).to_torch_state_dict()
        private, public, metrics = runtime.train(state, config)
        return reply_message(msg, private, public, metrics)

    # secure aggregation (aggregation = "secagg"): one round in four stages (clients/secagg_handlers.py)
    @app.train(Stage.SETUP.action)
    def sa_setup(msg: Message, context: Context) -> Message:
        try:
            # setup needs only the node's policy: without one no runtime (records, model) is
            # built here; sa_collect builds it (the query at registration already checked it)
            node_config = simulated_node_config(context.node_config, own) if own else context.node_config
            guard = _runtime(fixed, context, simulation, own).guard if node_config.get(POLICY_KEY) else None
            return secagg_handlers.sa_setup(msg, context, guard)
        except RoundRefused as exc:
            return refused(msg, exc)

    @app.train(Stage.SHARE_KEYS.action)
    def sa_keys(msg: Message, context: Context) -> Message:
        return secagg_handlers.sa_keys(msg, context)

    @app.train(Stage.COLLECT.action)
    def sa_collect(msg: Message, context: Context) -> Message:
        runtime = _runtime(fixed, context, simulation, own)
        try:
            return secagg_handlers.sa_collect(msg, context, runtime)
        except RoundRefused as exc:
            return refused(msg, exc)

    @app.train(Stage.UNMASK.action)
    def sa_unmask(msg: Message, context: Context) -> Message:
        return secagg_handlers.sa_unmask(msg, context)

    return app


app = make_client_app()
#: The ClientApp of ``fedfdp run`` (see :func:`make_client_app`), with the simulated nodes'
#: own policy and state when ``fedfdp run`` staged them (:func:`staged_nodes`).
simulation_app = make_client_app(simulation=True, nodes=staged_nodes())
