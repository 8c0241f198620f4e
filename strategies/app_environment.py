"""Which Python runs this Flower App, and whether its fedfdp is the app's own.

``flwr run .`` submits the app to whatever SuperLink answers on Flower's fixed local port
(``127.0.0.1:39091``, or ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``), whichever environment
started it; the ServerApp then runs in *that* environment's Python, with the app's code
first on its path and that environment's packages behind it. The ServerApp of ``flwr run
.`` (:data:`strategies.server_app.app`, on Flower's simulation runtime) checks at start
that the Python running it has fedfdp installed, at the app's version, from the same code
as the app (:func:`environment_mismatch`), and refuses in one line otherwise, naming
that Python. Nothing here decides anything about privacy.
"""

from __future__ import annotations

import json
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["APP_PACKAGES", "InstalledFedfdp", "environment_mismatch", "installed_fedfdp"]

#: The packages of the app whose code must be the installed fedfdp's.
APP_PACKAGES = ("fedfdp", "clients", "strategies")


@dataclass(frozen=True)
class InstalledFedfdp:
    """The fedfdp distribution of a Python environment.

    Parameters
    ----------
    version : str
        Its version.
    source : Path
        Where its packages live: the project folder of an editable install
        (``pip install -e .``), else the ``site-packages`` folder.
    prefix : str
        The environment (``sys.prefix``).
    """

    version: str
    source: Path
    prefix: str


def installed_fedfdp() -> InstalledFedfdp | None:
    """The fedfdp installed in this Python (None when there is none)."""
    try:
        dist = metadata.distribution("fedfdp")
    except metadata.PackageNotFoundError:
        return None
    source = Path(str(dist.locate_file("")))
    text = dist.read_text("direct_url.json")
    if text:
        try:
            direct = json.loads(text)
        except ValueError:
            direct = {}
        url = str(direct.get("url", ""))
        if direct.get("dir_info", {}).get("editable") and url.startswith("file:"):
            source = Path(unquote(urlparse(url).path))
    return InstalledFedfdp(str(dist.version), source, sys.prefix)


def _app_version(app_root: Path) -> str | None:
    try:
        with (app_root / "pyproject.toml").open("rb") as fh:
            project = tomllib.load(fh).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != "fedfdp":
        return None
    version = project.get("version")
    return str(version) if version is not None else None


def _differing_file(app_root: Path, source: Path) -> str | None:
    """The first ``.py`` file of the app's packages whose bytes differ from (or are
    missing in) ``source``; None when every one is the same.
    """
    for pkg in APP_PACKAGES:
        for path in sorted((app_root / pkg).rglob("*.py")):
            rel = path.relative_to(app_root)
            other = source / rel
            try:
                if other.read_bytes() != path.read_bytes():
                    return rel.as_posix()
            except OSError:
                return rel.as_posix()
    return None


def environment_mismatch(app_root: Path, installed: InstalledFedfdp | None, *,
                         executable: str = sys.executable) -> str | None:
    """One line refusing to run the app at ``app_root`` (the folder holding its
    ``pyproject.toml`` and packages) in the Python ``executable`` whose fedfdp is
    ``installed``: none installed, another version, or other code; None when the
    installed fedfdp is the app's own (its version and every ``.py`` file of
    :data:`APP_PACKAGES` the same).
    """
    where = f"this app runs in {executable}"
    if installed is not None:
        where += f" (sys.prefix {installed.prefix})"
    advice = ("flwr run sent it to a SuperLink that another environment started on Flower's local "
              "port; stop that flower-superlink process (or set FLWR_LOCAL_SUPERLINK_HTTP_API_PORT to "
              "a free port for this environment) and run again")
    if installed is None:
        return f"{where}, which has no fedfdp installed: {advice}"
    wanted = _app_version(app_root)
    if wanted is not None and wanted != installed.version:
        return f"{where}, whose fedfdp is {installed.version}, not the app's {wanted}: {advice}"
    differs = _differing_file(app_root, installed.source)
    if differs is not None:
        return (f"{where}, whose fedfdp ({installed.source}) is not the app's code ({differs} differs): "
                f"{advice}")
    return None
