"""The ``fedfdp`` command line.

Each subcommand lives in its own module of this package and registers itself
with a ``register(subparsers)`` function: ``run`` (one training run),
``compare`` (sweeps and reports), ``account`` (privacy accounting), ``audit``
(empirical privacy audits and attacks), ``sites`` (per-site files for
node-local data), ``keys`` (the configuration keys).

Only the module of the subcommand that runs is imported (some pull in torch,
pandas or Flower, seconds of start-up). ``fedfdp --help`` reads each
subcommand's one-line help from its ``add_parser(NAME, help="...")`` call in
the module's source, without importing it.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from fedfdp.config import ConfigError

#: Subcommand modules, in help order; a module not yet present is skipped.
SUBCOMMANDS = ("run", "compare", "account", "audit", "sites", "keys")


def _declared_help(name: str, origin: str | None) -> str | None:
    """The literal ``help=`` of ``add_parser(name, ...)`` in the module source, if any."""
    if origin is None:
        return None
    try:
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_parser"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == name
        ):
            for kw in node.keywords:
                value = kw.value
                if kw.arg == "help" and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
    return None


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``error: fedfdp run: ...``,
    status 2), like every other refusal of the command; ``--help`` shows the usage.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def make_parser(only: str | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The argument parser of ``fedfdp``.

    By default every subcommand module is imported and registered. With ``lazy``
    only ``only`` (if given) is; the others get an empty placeholder subparser with
    their declared help (enough for ``fedfdp --help`` and for choosing the
    subcommand), or are imported after all when their help is not a literal.
    """
    parser = OneLineParser(prog="fedfdp", description="Federated learning with feature-DP.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module_name = f"simulations.{name}"
        spec = importlib.util.find_spec(module_name)
        if spec is None:
            continue
        if lazy and name != only:
            help_text = _declared_help(name, spec.origin)
            if help_text is not None:
                sub.add_parser(name, help=help_text)
                continue
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedfdp`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = make_parser(chosen, lazy=True).parse_args(argv)
    if getattr(args, "func", None) is None:  # a placeholder was chosen (e.g. after "--")
        args = make_parser(args.command, lazy=True).parse_args(argv)
    created = new_directories(getattr(args, "out", None) if args.command == "run" else None)
    code = _dispatch(args)
    if code == 2 and created:
        remove_if_nothing_charged(created)
    return code


def new_directories(out: str | None) -> list[Path]:
    """The folders ``--out`` would create (it and its missing parents, deepest first)."""
    if not out:
        return []
    path, made = Path(out).absolute(), []
    try:
        while not path.exists() and not path.is_symlink() and path != path.parent:
            made.append(path)
            path = path.parent
    except OSError:  # a name the system refuses (too long): the run refuses it, nothing is made
        return []
    return made


def remove_if_nothing_charged(created: list[Path]) -> None:
    """After a refused ``fedfdp run``: remove the folders it created when they hold only the
    run's own files and no charge (no ledger, or one without a charge): the refusal leaves
    nothing behind. A ledger with a charge stays (its noise was drawn; the refusal said how to
    go on), and so does a folder holding anything else (the simulated nodes' own ledgers) or a
    ledger that cannot be read.
    """
    import shutil

    out = created[0]
    if out.is_dir():  # the run got as far as making it (its modules are loaded by then)
        from fedfdp.ledger import read_ledger
        from fedfdp.run_files import RUN_FILES

        if any(entry.is_dir() or entry.name not in RUN_FILES for entry in out.iterdir()):
            return  # anything but the run's own files (the nodes' ledgers under OUT/nodes) stays
        try:
            ledger = read_ledger(out)
        except ConfigError:
            return
        if ledger is not None and ledger.charges:
            return
        shutil.rmtree(out, ignore_errors=True)
    for folder in created[1:]:  # the parents it made, if now empty
        try:
            folder.rmdir()
        except OSError:
            return


def _dispatch(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; every refusal one line (status 2), an internal error one line
    and a traceback file (status 1).
    """
    try:
        return int(args.func(args))
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user gave that the system refuses: name it, no traceback
        where = f"{exc.filename!r}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        if not names_a_key(exc):
            return _internal_error(exc)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc) and "out of memory" not in str(exc).lower():
            return _internal_error(exc)
        print(f"error: out of memory running 'fedfdp {args.command}' ({_one_line(exc)[:200]}): reduce the "
              "model (hidden-sizes), the data (records-per-device, max-records) or the rounds; the ledger "
              "of a run is intact", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"error: out of memory running 'fedfdp {args.command}': reduce the model (hidden-sizes), the "
              "data (records-per-device, max-records) or the rounds; the ledger of a run is intact",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: 'fedfdp {args.command}' stopped; a run's ledger and last checkpoint are intact "
              "(resume with fedfdp run --resume DIR)", file=sys.stderr)
        return 130
    except Exception as exc:  # an internal error: one line here, the traceback in a file
        return _internal_error(exc)


def _internal_error(exc: BaseException) -> int:
    """One line naming the exception and the file holding its traceback; status 1."""
    path = _write_traceback()
    print(f"internal error: {type(exc).__name__}: {_one_line(exc)} (traceback in {path})", file=sys.stderr)
    return 1


#: ``key=value: ...`` at the start of a message: the form of every refusal of a setting.
_NAMED_SETTING = re.compile(r"^\s*(--)?([a-z][a-z0-9-]*)=")


def names_a_key(exc: BaseException) -> bool:
    """Whether ``exc`` refuses a user's setting: its message starts ``key=value`` with a
    configuration key (``records-per-device=1: must be >= 4``, raised by a data
    loader as a plain ``ValueError``) or a command-line option (``--threads=0``).
    Such an error is the user's (status 2); any other ``ValueError`` is internal.
    """
    from fedfdp.config import KEY_TABLE

    match = _NAMED_SETTING.match(str(exc))
    return match is not None and (match.group(1) is not None or match.group(2) in KEY_TABLE)


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def _write_traceback() -> str:
    """Write the current exception's traceback to a temporary file; its path."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="fedfdp-traceback-", suffix=".txt")
    with open(fd, "w", encoding="utf-8") as fh:
        traceback.print_exc(file=fh)
    return path


if __name__ == "__main__":
    sys.exit(main())
