"""fedfdp: federated learning with feature differential privacy (FDP).

FDP protects the part of each record that a public feature map Ψ does not
disclose (Mahloujifar, Guo, Suh and Chaudhuri, "Machine Learning with Privacy for
Protected Attributes": the FDP paper). A round of Algorithm 1 clips each record's
private-loss gradient to ``C``
(sensitivity ``C`` under add/remove, Def. 6), adds ``N(0, σ²C²I)`` once to the
sum, and adds the unclipped public-loss gradient of an independently drawn
public batch; rounds compose (Theorem 5, Theorem 3).

The public API (each name has a numpy docstring with a runnable example):

==========================  ============================================================
name                        what it is
==========================  ============================================================
:class:`FeatureMap`         Ψ: which columns or tensor parts are public and how the public
                            view is built (a column split, or any callable, e.g. a blur)
:class:`PrivacyConfig`      every privacy-defining setting, validated on construction
:class:`TrainingConfig`     optimiser, model choice and the public seed
:class:`RunConfig`          orchestration only (outputs, checkpoints, timeouts)
:class:`Config`             the three together with the data section; :func:`load_config`
                            parses the flat ``kebab-case`` keys of TOML files and the CLI
:class:`ConfigError`        a bad setting; the one-line message names the key and value
:class:`DeviceData`         the data protocol: one device's records as arrays
:class:`FederatedData`      devices, a held-out split and the column split
:class:`TrainInstruction`   what the server asks of a node in one round
:func:`client_update`       a node's reply for your ``nn.Module`` and data
:func:`build_plan`          the one door: a ``Config`` read once into the plan of a run
                            (model, data, components, run directory); its ``engine``
                            resolves the mechanism over the public device sizes and is
                            the server half of every round for your ``nn.Module``
:func:`run_centralised`     a whole run on one machine (no Flower)
:class:`FDPAccountant`      PRV accounting of the rounds; :func:`calibrate_noise_multiplier`;
                            :class:`PrivacyBudgetExhausted`
==========================  ============================================================

Flower adapters live beside the library (``fedfdp`` itself never imports
Flower): :class:`strategies.FDPStrategy` (your model in a ServerApp, Flower's
``Strategy.start`` contract) and :func:`clients.fdp_train` /
:func:`clients.fdp_query` (two handlers of your ClientApp); a complete app is
in ``examples/fdp-app/``.

Names are imported on first use, so ``import fedfdp`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "FeatureMap": "fedfdp.losses",
    "PrivacyConfig": "fedfdp.config",
    "TrainingConfig": "fedfdp.config",
    "RunConfig": "fedfdp.config",
    "Config": "fedfdp.config",
    "ConfigError": "fedfdp.config",
    "load_config": "fedfdp.config",
    "DeviceData": "fedfdp.data",
    "FederatedData": "fedfdp.data",
    "TrainInstruction": "fedfdp.protocol",
    "client_update": "fedfdp.contribution",
    "build_plan": "fedfdp.run_plan",
    "run_centralised": "fedfdp.algorithm",
    "FDPAccountant": "fedfdp.accounting",
    "PrivacyBudgetExhausted": "fedfdp.accounting",
    "calibrate_noise_multiplier": "fedfdp.accounting",
    "SubsampledGaussian": "fedfdp.accounting",
    "resolve_mechanism": "fedfdp.mechanism",
}

__all__ = [
    "Config",
    "ConfigError",
    "DeviceData",
    "FDPAccountant",
    "FeatureMap",
    "FederatedData",
    "PrivacyBudgetExhausted",
    "PrivacyConfig",
    "RunConfig",
    "SubsampledGaussian",
    "TrainInstruction",
    "TrainingConfig",
    "build_plan",
    "calibrate_noise_multiplier",
    "client_update",
    "load_config",
    "resolve_mechanism",
    "run_centralised",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fedfdp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from fedfdp.accounting import (
        FDPAccountant,
        PrivacyBudgetExhausted,
        SubsampledGaussian,
        calibrate_noise_multiplier,
    )
    from fedfdp.algorithm import run_centralised
    from fedfdp.config import Config, ConfigError, PrivacyConfig, RunConfig, TrainingConfig, load_config
    from fedfdp.contribution import client_update
    from fedfdp.data import DeviceData, FederatedData
    from fedfdp.losses import FeatureMap
    from fedfdp.mechanism import resolve_mechanism
    from fedfdp.protocol import TrainInstruction
    from fedfdp.run_plan import build_plan
