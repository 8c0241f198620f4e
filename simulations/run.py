"""``fedfdp run``: one federated training run.

``fedfdp run --config FILE.toml --out DIR [--set key=value ...]``
    One federated run on Flower's simulation engine (one virtual SuperNode per
    device). Writes ``DIR/metrics.csv`` and ``DIR/config.toml``.
``fedfdp run --centralised ...``
    The same configuration through the single-machine reference
    (:mod:`fedfdp.algorithm`), without Flower.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfdp.config import Config, ConfigError, load_config, parse_override, read_toml
from fedfdp.entropy import REPRODUCIBLE_WARNING

if TYPE_CHECKING:
    from fedfdp.data import FederatedData


def build_config(config_path: str | None, overrides: Sequence[str], out: str | None) -> Config:
    """Defaults ← TOML file ← ``--set`` overrides ← ``--out``; validated once."""
    mapping: dict[str, Any] = dict(read_toml(config_path)) if config_path else {}
    for item in overrides:
        key, value = parse_override(item)
        mapping[key] = value
    if out is not None:
        mapping["out-dir"] = str(Path(out).resolve())
    return load_config(mapping)


def _quiet_flower(verbose: bool) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.getLogger("flwr").setLevel(level)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def run_simulation_for(cfg: Config, *, verbose: bool = False) -> None:
    """Run ``cfg`` on Flower's simulation engine (Ray backend), one virtual
    SuperNode per device."""
    from flwr.simulation import run_simulation

    from clients.client_app import make_client_app
    from strategies.server_app import make_server_app

    _quiet_flower(verbose)
    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"logging_level": "ERROR" if not verbose else "INFO", "log_to_driver": verbose},
    }
    run_simulation(
        server_app=make_server_app(cfg),
        client_app=make_client_app(cfg),
        num_supernodes=cfg.data.num_devices,
        backend_config=backend,
        verbose_logging=verbose,
    )


def _summarise(out: Path, cfg: Config) -> int:
    import pandas as pd

    path = out / "metrics.csv"
    if not path.is_file():
        print(f"error: the run wrote no {path}", file=sys.stderr)
        return 1
    frame = pd.read_csv(path)
    last = frame.iloc[-1]
    done = frame["accuracy"].dropna()
    acc = done.iloc[-1] if len(done) else float("nan")
    print(
        f"rounds={int(last['round'])} accuracy={acc:.4f} "
        f"epsilon={last['epsilon']:.4g} ({last['relation']}, delta={last['delta']:.3g}, upper bound)"
    )
    if cfg.privacy.reproducible_noise:
        print(f"warning: {REPRODUCIBLE_WARNING}")
    print(f"wrote {path} and {out / 'config.toml'}")
    return 0


def _check_run_dir(cfg: Config, data: FederatedData) -> None:
    """Refuse an occupied output directory, or a resume whose checkpoint or
    ledger does not match, before any work starts (errors inside Flower's
    ServerApp thread are only logged)."""
    from fedfdp.checkpoint import CheckpointMismatch
    from fedfdp.models import build_model_for
    from fedfdp.server import FDPServer, verify_resume

    server = FDPServer(cfg, build_model_for(cfg, data))
    server.resolve(data.sizes.tolist())
    try:
        verify_resume(cfg.run.out_dir, cfg, server)
    except CheckpointMismatch as exc:
        raise ConfigError(str(exc)) from exc


def cmd_run(args: argparse.Namespace) -> int:
    """``fedfdp run``."""
    from fedfdp.data import load_dataset
    from fedfdp.outputs import CONFIG_FILE, prepare_output_dir

    if args.resume:
        if args.out or args.config:
            raise ConfigError("--resume DIR: reads DIR/config.toml; drop --out/--config")
        cfg = build_config(str(Path(args.resume) / CONFIG_FILE), [*(args.set or []), "resume=true"],
                           args.resume)
    else:
        if not args.out:
            raise ConfigError("--out DIR is required (or --resume DIR)")
        cfg = build_config(args.config, args.set or [], args.out)
    prepare_output_dir(cfg.run.out_dir, "--out", create=False)  # a file, too long, read-only: refused
    data = load_dataset(cfg.data)  # fail on bad data before any work
    _check_run_dir(cfg, data)  # and on an unreachable target ε, an occupied or mismatched out-dir
    out = prepare_output_dir(cfg.run.out_dir, "--out")
    if cfg.privacy.reproducible_noise:
        print(f"warning: {REPRODUCIBLE_WARNING}", file=sys.stderr)
    if args.centralised:
        from fedfdp.algorithm import run_centralised

        run_centralised(cfg, data)
    else:
        run_simulation_for(cfg, verbose=args.verbose)
    return _summarise(out, cfg)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` to the ``fedfdp`` parser."""
    run = sub.add_parser("run", help="one federated training run")
    run.add_argument("--config", help="experiment TOML (flat kebab-case keys)")
    run.add_argument("--out", help="output directory")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key")
    run.add_argument(
        "--centralised", action="store_true", help="run the single-machine reference instead of Flower"
    )
    run.add_argument("--verbose", action="store_true", help="show Flower and Ray logs")
    run.set_defaults(func=cmd_run)
