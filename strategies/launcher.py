"""A simulated run stops with the ``fedfdp run`` that launched it.

``fedfdp run`` (:class:`simulations.flower_processes.LocalSimulation`) starts a SuperLink of
its own, which starts the ServerApp's process; both sit in sessions of their
own. If the launcher is killed (SIGKILL leaves it no time to clean up), the
SuperLink gets SIGTERM from the kernel (``PR_SET_PDEATHSIG``), but the
ServerApp's process would go on training and writing the run's ledger,
checkpoint and metrics with nobody left to read them. The launcher names
itself in :data:`LAUNCHER_ENV` (``pid:start-time``, so a reused pid is not
mistaken for it) and the ServerApp watches it (:func:`watch_launcher`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

#: Environment variable naming the launcher process (``pid:start-time``).
LAUNCHER_ENV = "FEDFDP_LAUNCHER"

log = logging.getLogger("fedfdp.launcher")


def _start_time(pid: int) -> int | None:
    """The start time of ``pid`` from /proc (None if it is gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def launcher_token(pid: int | None = None) -> str:
    """``pid:start-time`` of ``pid`` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}"


def launcher_alive(token: str) -> bool:
    """Whether the process named by ``token`` still runs (True where /proc cannot tell)."""
    pid, _, start = token.partition(":")
    if not Path("/proc/self/stat").exists() or start in ("", "None"):
        return True
    return str(_start_time(int(pid))) == start


def watch_launcher(
    token: str | None, on_gone: Callable[[], None], period: float = 0.5
) -> threading.Thread | None:
    """A daemon thread that calls ``on_gone`` once the launcher named by ``token``
    has died (nothing if ``token`` is None: a run not launched by ``fedfdp run``).
    """
    if not token:
        return None

    def loop() -> None:
        while launcher_alive(token):
            threading.Event().wait(period)
        log.error("fedfdp run (%s) is gone: stopping the simulated run", token)
        on_gone()

    thread = threading.Thread(target=loop, name="fedfdp-launcher-watch", daemon=True)
    thread.start()
    return thread
