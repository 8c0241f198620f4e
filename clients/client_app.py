"""Flower ClientApp: one SuperNode serving one (or several) devices' records.

``@app.query`` answers the server's one-time question "which devices do you
hold and how many training records each" (dataset sizes are public in FDP).

``@app.train`` runs the node side of one round of Algorithm 1 for the devices
the instruction names (:func:`fedfdp.contribution.node_contribution`): the
clipped private sum over each device's Poisson batch — coins and padding from
this node's own secret entropy, never from anything it was sent — and the
unclipped public sum over independently drawn uniform batches. It replies with
both sums and the public count and loss — never the realised private batch
size or any statistic of the private batch.

Which records a node serves (:func:`node_records`) depends on the run's
``data-location``:

``central``
    every node loads the dataset the run configuration names and serves the
    devices of its Flower partition (node config ``partition-id`` /
    ``num-partitions``): partition ``k`` serves devices ``d`` with ``d mod P = k``.
``node``
    the node reads its **own** file, ``data-path`` in its node config, and
    serves one device, number ``partition-id`` (``num-partitions`` must be
    ``num-devices``); the encoding is the one the run config declares, so
    every site maps a record to the same input vector.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfdp import protocol as P
from fedfdp.config import Config, ConfigError, load_config
from fedfdp.contribution import ClientParts, Contribution, client_update
from fedfdp.data import DeviceData, FederatedData, load_dataset, load_site
from fedfdp.entropy import run_secrets
from fedfdp.losses import FeatureMap, build_decomposition
from fedfdp.models import build_model_for

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


def node_records(cfg: Config, context: Context) -> NodeRecords:
    """The records this node serves (see the module docstring)."""
    pid, num = _partition(context)
    if cfg.data.data_location == "central":
        return NodeRecords.partition_of(load_dataset(cfg.data), pid, num)
    path = context.node_config.get("data-path")
    if not isinstance(path, str) or not path:
        raise ValueError(
            f"node config {dict(context.node_config)}: data-location='node' needs this SuperNode's "
            "own file as data-path (--node-config \"partition-id=K num-partitions=P data-path='/path'\")"
        )
    if num != cfg.data.num_devices or not 0 <= pid < num:
        raise ValueError(
            f"node config partition-id={pid} num-partitions={num}: with data-location='node' each "
            f"SuperNode is one device, so num-partitions must be num-devices={cfg.data.num_devices} "
            "and partition-id its device number"
        )
    site = load_site(cfg.data, path)
    return NodeRecords(site, {pid: site.devices[0]})


def _config(fixed: Config | None, context: Context) -> Config:
    if fixed is not None:
        return fixed
    cfg = load_config(dict(context.run_config))
    if cfg.privacy.reproducible_noise:
        raise ConfigError(
            "reproducible-noise=true: refused by a ClientApp reading Flower's run config (flwr run, a "
            "SuperNode): its Poisson coins would derive from a seed every party can read"
        )
    return cfg


def handle_query(records: NodeRecords) -> dict[str, list[int]]:
    """Devices this node serves and their (public) training-record counts."""
    return device_sizes(records.devices)


def device_sizes(devices: Mapping[int, DeviceData]) -> dict[str, list[int]]:
    """The query answer for ``devices``: their ids and (public) record counts."""
    ids = sorted(devices)
    return {P.DEVICE_IDS: ids, P.DEVICE_SIZES: [len(devices[d]) for d in ids]}


def contribution_arrays(
    model: torch.nn.Module, total: Contribution
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, float]]:
    """A contribution as named arrays and metrics: (private sums, public sums, metrics)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    private = dict(zip(names, total.private_sum, strict=True)) if total.private_sum else None
    public = dict(zip(names, total.public_sum, strict=True)) if total.public_sum else None
    metrics = {P.PUBLIC_COUNT: total.public_count, P.PUBLIC_LOSS_SUM: total.public_loss_sum}
    return private, public, metrics


def handle_train(
    cfg: Config,
    records: NodeRecords,
    state: dict[str, torch.Tensor],
    config: Mapping[str, Any],
    parts: ClientParts | None = None,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, float]]:
    """The node side of one round on ``records`` with the configured model and
    public view; returns (private sums, public sums, metrics). ``parts``
    defaults to the secret entropy ``cfg`` asks for
    (:func:`fedfdp.entropy.run_secrets`) and the honest components."""
    torch.set_num_threads(1)
    order = P.TrainInstruction.from_config(config)
    if not set(order.device_ids) <= set(records.devices):
        raise P.InvalidInstruction(f"{P.DEVICE_IDS}={list(order.device_ids)}: not this node's devices")
    parts = parts if parts is not None else ClientParts(secrets=run_secrets(cfg))
    model = build_model_for(cfg, records.data)
    model.load_state_dict(state)
    fmap = build_decomposition(cfg, records.data)
    total = client_update(model, fmap, records.devices, order, public_seed=cfg.training.seed, parts=parts)
    return contribution_arrays(model, total)


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
    """
    torch.set_num_threads(1)
    order = P.TrainInstruction.from_config(msg.content[P.CONFIG])
    model.load_state_dict(msg.content[P.ARRAYS].to_torch_state_dict())
    total = client_update(model, feature_map, devices, order, public_seed=public_seed, parts=parts)
    return reply_message(msg, *contribution_arrays(model, total))


def reply_message(
    msg: Message,
    private: dict[str, torch.Tensor] | None,
    public: dict[str, torch.Tensor] | None,
    metrics: dict[str, float],
) -> Message:
    """The reply to a train message, built from ``handle_train``'s three results."""
    content = RecordDict({P.METRICS: MetricRecord(metrics)})
    if private is not None:
        content[P.PRIVATE] = ArrayRecord(private)
    if public is not None:
        content[P.PUBLIC] = ArrayRecord(public)
    return Message(content, reply_to=msg)


def make_client_app(cfg: Config | None = None) -> ClientApp:
    """Build the ClientApp; ``cfg`` fixes the configuration (used by
    ``fedfdp run``), otherwise it is read from Flower's run config."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return fdp_query(msg, node_records(_config(cfg, context), context).devices)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        c = _config(cfg, context)
        state = msg.content[P.ARRAYS].to_torch_state_dict()
        private, public, metrics = handle_train(c, node_records(c, context), state, msg.content[P.CONFIG])
        return reply_message(msg, private, public, metrics)

    return app


app = make_client_app()
