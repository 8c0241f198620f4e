"""Flower ServerApp: builds the run's strategy and drives it.

``app`` (the component ``pyproject.toml`` names) is the deployment's ServerApp:
``flwr run .`` reads the configuration from ``[tool.flwr.app.config]`` (plus
``--run-config`` overrides) and refuses the reproducible opt-in. On Flower's simulation
runtime it first refuses, in one line, a Python whose fedfdp is not the app's own (a
local SuperLink another environment started: :mod:`strategies.app_environment`).

``simulation_app`` is the ServerApp of ``fedfdp run`` (:mod:`simulations.run`),
which submits the run with ``flwr run`` to a SuperLink of its own in simulation
mode: it runs only on Flower's Simulation Runtime (an in-memory grid, every
party one process tree on one machine), accepts ``reproducible-noise = true``
(research runs that every output flags), and lets ``clients-per-round`` choose
devices, since its virtual SuperNodes (as many as the machine has cores) are
only transport.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from clients.flower_adapter import is_simulation_grid
from fedfdp.config import ConfigError, load_config
from fedfdp.data import load_server_data
from fedfdp.run_plan import RunPlan, build_plan
from strategies.app_environment import environment_mismatch, installed_fedfdp
from strategies.fdp_strategy import FDPStrategy, NodeChoice
from strategies.launcher import LAUNCHER_ENV, watch_launcher


def run_server(grid: Grid, plan: RunPlan, *, node_choice: NodeChoice = NodeChoice.SUPERNODES) -> FDPStrategy:
    """Run all rounds of ``plan`` on ``grid`` through the public API
    (:class:`FDPStrategy`, Flower's ``start`` contract, server-side evaluation on the
    held-out split); return the finished strategy. ``node_choice``: see
    :class:`~strategies.fdp_strategy.NodeChoice`.
    """
    strategy = FDPStrategy(plan, node_choice=node_choice)
    strategy.start(grid, ArrayRecord(plan.model.state_dict()), num_rounds=plan.num_rounds)
    return strategy


def make_server_app(
    run_config: Mapping[str, Any] | None = None, *, node_choice: NodeChoice = NodeChoice.SUPERNODES,
    simulation: bool = False,
) -> ServerApp:
    """Build the ServerApp; ``run_config`` (flat keys, as ``Config.to_flat()`` gives them)
    fixes the configuration, otherwise it is read from Flower's run config.
    ``node_choice=NodeChoice.DEVICES``: the SuperNodes are a simulation's transport.
    ``simulation``: the ServerApp of ``fedfdp run`` (module docstring): it refuses any
    grid but the Simulation Runtime's and accepts the reproducible opt-in.
    """
    app = ServerApp()
    if simulation:
        node_choice = NodeChoice.DEVICES

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if simulation and not is_simulation_grid(grid):
            raise ConfigError(
                "strategies.server_app:simulation_app runs only on Flower's Simulation Runtime "
                "(fedfdp run); a deployment uses strategies.server_app:app"
            )
        if not simulation and run_config is None and is_simulation_grid(grid):
            installed = installed_fedfdp()
            wrong = environment_mismatch(Path(__file__).resolve().parents[1], installed)
            if wrong is not None or installed is None:  # flwr run . on another environment's SuperLink
                print(f"error: {wrong}", file=sys.stderr, flush=True)
                raise ConfigError(str(wrong))
            print(f"fedfdp {installed.version} ({installed.source}) runs in {sys.executable}",
                  file=sys.stderr, flush=True)
        run_cfg = load_config(dict(run_config if run_config is not None else context.run_config))
        if run_config is None and not simulation and run_cfg.privacy.reproducible_noise:
            raise ConfigError(
                "reproducible-noise=true: refused under flwr run (a SuperLink): the noise would derive "
                "from a seed every party can read; use fedfdp run for reproducible research runs"
            )
        out = run_cfg.run.out_dir
        if out and not os.path.isabs(out):
            raise ConfigError(
                f"out-dir={out!r}: must be an absolute path under flwr run (the ServerApp "
                "runs in the SuperLink's working directory, not yours)"
            )
        if simulation:  # stop with the fedfdp run that launched us (strategies/launcher.py)
            watch_launcher(os.environ.get(LAUNCHER_ENV), lambda: os._exit(1))
        run_server(grid, build_plan(run_cfg, load_server_data(run_cfg.data)), node_choice=node_choice)

    return app


app = make_server_app()
simulation_app = make_server_app(simulation=True)
