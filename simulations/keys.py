"""``fedfdp keys``: every configuration key, its type, default, whether it defines the
privacy guarantee, and what it means — printed from the configuration's own key table
(:func:`fedfdp.config.key_reference`, the source of ``docs/configuration.md``).
"""

from __future__ import annotations

import argparse
import json
import sys


def cmd_keys(args: argparse.Namespace) -> int:
    """Print the key reference (all keys, or those matching ``args.match``)."""
    from fedfdp.config import key_reference

    rows = [r for r in key_reference() if not args.match or args.match in r.key]
    if args.guarantee:
        rows = [r for r in rows if r.guarantee != "no"]
    if args.json:
        json.dump([{"key": r.key, "section": str(r.section), "type": r.type, "default": r.default,
                    "guarantee": str(r.guarantee), "applies": r.applies,
                    "meaning": r.meaning} for r in rows], sys.stdout, indent=1)
        print()
        return 0
    width = max((len(r.key) for r in rows), default=3)
    for r in rows:
        where = "" if r.applies == "always" else f"; applies with {r.applies}"
        print(f"{r.key:<{width}}  {r.type}; default {r.default}; guarantee: {r.guarantee}{where}")
        print(f"{'':<{width}}  {r.meaning}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``keys`` to the ``fedfdp`` parser."""
    p = sub.add_parser("keys", help="every configuration key: type, default, whether it defines the "
                       "guarantee")
    p.add_argument("match", nargs="?", default="", help="only keys containing this text")
    p.add_argument("--guarantee", action="store_true", help="only the keys that define the privacy guarantee")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_keys)
