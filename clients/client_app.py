"""Flower ClientApp: one SuperNode serving one (or several) devices' records.

``@app.query`` answers the server's one-time question "which devices do you
hold and how many training records each" (dataset sizes are public in FDP).

``@app.train`` runs the device side of one round of Algorithm 1 for each of
its devices (:func:`fedfdp.contribution.device_contribution`): the clipped
private sum over a Poisson batch and the unclipped public sum over an
independently drawn uniform batch. It replies with both sums and the public
count and loss — never the realised private batch size or any statistic of
the private batch.

The node's records are chosen by Flower's node config ``partition-id`` /
``num-partitions``: partition ``k`` serves devices ``d`` with ``d mod P = k``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfdp import protocol as P
from fedfdp.algorithm import build_decomposition, build_model_for
from fedfdp.config import Config, load_config
from fedfdp.contribution import add_contributions, device_contribution
from fedfdp.data import load_dataset
from fedfdp.modes import PHASES
from fedfdp.sampling import DeviceStreams

log = logging.getLogger("fedfdp.client")


def _node_devices(cfg: Config, context: Context) -> tuple[int, ...]:
    node = context.node_config
    try:
        pid = int(node["partition-id"])
        num = int(node["num-partitions"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"node config {dict(node)}: needs integer 'partition-id' and 'num-partitions'"
        ) from exc
    return load_dataset(cfg.data).partition(pid, num)


def _config(fixed: Config | None, context: Context) -> Config:
    return fixed if fixed is not None else load_config(dict(context.run_config))


def _num(config: Mapping[str, Any], key: str) -> float:
    if key not in config:
        raise ValueError(f"train config misses '{key}'")
    return float(config[key])


def handle_query(cfg: Config, context: Context) -> dict[str, list[int]]:
    """Devices this node serves and their (public) training-record counts."""
    data = load_dataset(cfg.data)
    ids = _node_devices(cfg, context)
    return {P.DEVICE_IDS: list(ids), P.DEVICE_SIZES: [len(data.devices[d]) for d in ids]}


def handle_train(
    cfg: Config, context: Context, state: dict[str, torch.Tensor], config: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None, dict[str, float]]:
    """The device side of one round; returns (private sums, public sums, metrics)."""
    torch.set_num_threads(1)
    data = load_dataset(cfg.data)
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
    mine = set(_node_devices(cfg, context))
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
            data.devices[d].x,
            data.devices[d].y,
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
        info = handle_query(_config(cfg, context), context)
        return Message(RecordDict({P.METRICS: MetricRecord(info)}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        c = _config(cfg, context)
        state = msg.content[P.ARRAYS].to_torch_state_dict()
        private, public, metrics = handle_train(c, context, state, msg.content[P.CONFIG])
        return reply_message(msg, private, public, metrics)

    return app


app = make_client_app()
