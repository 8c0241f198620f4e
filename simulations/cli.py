"""The ``fedfdp`` command line.

Each subcommand lives in its own module of this package and registers itself
with a ``register(subparsers)`` function: ``run`` (one training run),
``compare`` (sweeps and reports), ``account`` (privacy accounting), ``audit``
(empirical privacy audits and attacks).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from fedfdp.config import ConfigError

#: Subcommand modules, in help order; a module not yet present is skipped.
SUBCOMMANDS = ("run", "compare", "account", "audit", "sites")


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fedfdp``."""
    parser = argparse.ArgumentParser(prog="fedfdp", description="Federated learning with feature-DP.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module_name = f"simulations.{name}"
        if importlib.util.find_spec(module_name) is None:
            continue
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedfdp`` console script."""
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
