"""Your own code by import path: ``"package.module:name"`` in a configuration.

``model = "mypkg.models:build"`` and ``dataset = "mypkg.data:load"`` name a
function of yours instead of a built-in model or dataset, so a configuration
file (and ``fedfdp run``, ``fedfdp compare``, ``flwr run``) can use your code
without touching fedfdp. The path is checked when the configuration is parsed
(syntax only: the package may be installed only where the code runs) and
imported when it is used; every failure is a one-line error naming the key
and the value.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fedfdp.config import ConfigError, is_import_path


def resolve(key: str, path: str) -> Callable[..., Any]:
    """The callable at ``path`` (``package.module:name``); refuse, naming the key
    and the value, a malformed path, a missing module or name, or a non-callable.
    """
    if not is_import_path(path):
        raise ConfigError(f"{key}={path!r}: not an import path 'package.module:name'")
    module_name, attr = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{key}={path!r}: cannot import {module_name!r} ({exc})") from exc
    obj = getattr(module, attr, None)
    if obj is None or not callable(obj):
        raise ConfigError(f"{key}={path!r}: {module_name!r} has no callable {attr!r}")
    return obj


def call(key: str, path: str, *args: Any) -> Any:
    """Call the function at ``path`` with ``args``; an exception it raises
    becomes a one-line :class:`ConfigError` naming the key and the value (the
    original is chained for debugging).
    """
    fn = resolve(key, path)
    try:
        return fn(*args)
    except ConfigError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(f"{key}={path!r}: raised {type(exc).__name__}: {first}") from exc
