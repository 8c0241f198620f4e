"""Flower ClientApp: one SuperNode serving one (or several) devices' records.

``@app.query`` answers the server's one-time question "which devices do you
hold and how many training records each" (dataset sizes are public in FDP).

``@app.train`` runs the device side of one round of Algorithm 1 for each of
its devices (:func:`fedfdp.contribution.device_contribution`): the clipped
private sum over a Poisson batch and the unclipped public sum over an
independently drawn uniform batch. It replies with both sums and the public
count and loss — never the realised private batch size or any statistic of
the private batch.

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
from fedfdp.algorithm import build_decomposition, build_model_for
from fedfdp.config import Config, load_config
from fedfdp.contribution import add_contributions, device_contribution
from fedfdp.data import DeviceData, FederatedData, load_dataset, load_site
from fedfdp.modes import PHASES
from fedfdp.sampling import DeviceStreams

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
    return fixed if fixed is not None else load_config(dict(context.run_config))


def _num(config: Mapping[str, Any], key: str) -> float:
    if key not in config:
        raise ValueError(f"train config misses '{key}'")
    return float(config[key])


def handle_query(records: NodeRecords) -> dict[str, list[int]]:
    """Devices this node serves and their (public) training-record counts."""
    ids = sorted(records.devices)
    return {P.DEVICE_IDS: ids, P.DEVICE_SIZES: [len(records.devices[d]) for d in ids]}


def handle_train(
    cfg: Config, records: NodeRecords, state: dict[str, torch.Tensor], config: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, float]]:
    """The device side of one round on ``records``; returns (private sums, public sums, metrics)."""
    torch.set_num_threads(1)
    data = records.data
    phase_name = str(config.get(P.PHASE, ""))
    if str(config.get(P.UNIT, "record")) not in ("record", "device"):
        raise ValueError(f"privacy-unit={config.get(P.UNIT)!r}: unknown")
    if phase_name not in PHASES:
        raise ValueError(f"phase={phase_name!r}: unknown")
    phase = PHASES[phase_name]
    q = _num(config, P.SAMPLING_RATE)
    clip = _num(config, P.CLIPPING_NORM)
    if not (0 < q <= 1) or not clip > 0:
        raise ValueError(f"sampling-rate={q}, clipping-norm={clip}: out of range")
    seed = int(_num(config, P.SEED))
    round_ = int(_num(config, P.ROUND))
    attempt = int(config.get(P.ATTEMPT, 0))
    unit = str(config.get(P.UNIT, "record"))
    mine = set(records.devices)
    device_ids = [int(d) for d in config.get(P.DEVICE_IDS, [])]
    counts = [int(c) for c in config.get(P.PUBLIC_COUNTS, [])]
    flags = [bool(int(f)) for f in config.get(P.PRIVATE_FLAGS, [1] * len(device_ids))]
    lengths_ok = len(device_ids) == len(counts) == len(flags) > 0
    if not lengths_ok or not set(device_ids) <= mine:
        raise ValueError(
            f"device-ids={device_ids}, public-counts={counts}: not this node's devices"
        )

    model = build_model_for(cfg, data)
    model.load_state_dict(state)
    decomposition = build_decomposition(cfg, data)
    parts = [
        device_contribution(
            model,
            decomposition,
            phase,
            records.devices[d].x,
            records.devices[d].y,
            sampling_rate=q,
            clipping_norm=clip,
            public_count=c,
            streams=DeviceStreams.for_round(seed, round_, d, attempt),
            private=f,
            unit=unit,
        )
        for d, c, f in zip(device_ids, counts, flags, strict=True)
    ]
    total = add_contributions(parts)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    private = dict(zip(names, total.private_sum, strict=True)) if total.private_sum else None
    public = dict(zip(names, total.public_sum, strict=True)) if total.public_sum else None
    metrics = {P.PUBLIC_COUNT: total.public_count, P.PUBLIC_LOSS_SUM: total.public_loss_sum}
    return private, public, metrics


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
        info = handle_query(node_records(_config(cfg, context), context))
        return Message(RecordDict({P.METRICS: MetricRecord(info)}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        c = _config(cfg, context)
        state = msg.content[P.ARRAYS].to_torch_state_dict()
        private, public, metrics = handle_train(c, node_records(c, context), state, msg.content[P.CONFIG])
        return reply_message(msg, private, public, metrics)

    return app


app = make_client_app()
