"""The one check of a file the user names before anything reads it: a regular file.

A FIFO, a character or block device (``/dev/zero``), a socket or a directory — or a
symbolic link to one — is refused in one line naming the file, before it is opened:
opening a FIFO waits for a writer that never comes, and ``/dev/zero`` never ends.
Every reader of a file a user names goes through :func:`regular_file`: the ledger,
``config.toml`` and any ``--config`` TOML file (``pyproject.toml`` too), the checkpoint,
``data-path``/``test-path`` tables, ``.npz`` archives and the PNG folder's files, the
node policy, the roster and the keys.

Examples
--------
>>> regular_file("/dev/zero", "data-path")
Traceback (most recent call last):
...
fedfdp.config.values.ConfigError: data-path='/dev/zero': is a character device, not a regular file
>>> optional_file("/nonexistent/ledger.jsonl") is None
True
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedfdp.config.values import ConfigError

__all__ = ["optional_file", "regular_file", "regular_folder"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _named(path: Path, name: str | None) -> str:
    return f"{name}={str(path)!r}" if name else str(path)


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def optional_file(path: str | os.PathLike[str], name: str | None = None, *,
                  error: type[ConfigError] = ConfigError) -> Path | None:
    """:func:`regular_file`, but ``None`` for a file that does not exist (a run
    directory's optional files; a dangling link is still refused).
    """
    return _check(Path(path), name, missing_ok=True, error=error)


def regular_file(path: str | os.PathLike[str], name: str | None = None, *,
                 error: type[ConfigError] = ConfigError) -> Path:
    """``path`` if it is a regular file (after following links), else a one-line
    :class:`~fedfdp.config.ConfigError` naming it (``name='path'`` when ``name`` — the key
    or option that gave it — is given, else the path).

    Parameters
    ----------
    path : path-like
    name : str, optional
        The key or command-line option that named the file (``data-path``, ``--run``).
    error : type
        The :class:`~fedfdp.config.ConfigError` subclass raised (a loader's own, such as
        :class:`fedfdp.data.DataError`).
    """
    found = _check(Path(path), name, missing_ok=False, error=error)
    if found is None:  # pragma: no cover - _check refuses a missing file unless missing_ok
        raise error(f"{_named(Path(path), name)}: no such file")
    return found


def _check(path: Path, name: str | None, *, missing_ok: bool, error: type[ConfigError]) -> Path | None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if missing_ok and not path.is_symlink():
            return None
        what = "a link to nothing" if path.is_symlink() else "no such file"
        raise error(f"{_named(path, name)}: {what}") from None
    except OSError as exc:
        raise error(f"{_named(path, name)}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        link = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise error(f"{_named(path, name)}: is {_kind(mode)}{link}, not a regular file")
    return path


def regular_folder(path: str | os.PathLike[str], name: str | None = None) -> Path:
    """``path`` if it is a directory (after following links), else a one-line
    :class:`~fedfdp.config.ConfigError` naming it.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{_named(path, name)}: no such directory") from None
    except OSError as exc:
        raise ConfigError(f"{_named(path, name)}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"{_named(path, name)}: is {_kind(mode) if not stat.S_ISREG(mode) else 'a file'}, "
                          "not a directory")
    return path
