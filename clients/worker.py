"""A long-lived ClientApp process for a SuperNode: every message of a run in one process.

Flower 1.42 runs a ClientApp in a new process per message: by default the
SuperNode (``--isolation subprocess``) starts a SuperExec that starts one
``flwr-clientapp`` process for each message it receives, which imports torch,
Flower and the app, and loads the data and builds the model again, every round
(~6 s per round on a loaded 2-core machine). With ``flower-supernode
--isolation process`` the SuperNode leaves the ClientApps to a process of the
operator's choice; this module is one that stays up:

    flower-supernode --isolation process --port 9094 ... &
    python -m clients.worker --runtime-api-address 127.0.0.1:9094 --insecure

It asks the SuperNode's Runtime API for work (``AcquireTask``, what
``flower-superexec`` asks) every few milliseconds and runs each ClientApp task
as ``flwr-clientapp`` would — pull the message, context and app (FAB), call the
ClientApp, push the reply and the task's outcome, heartbeats meanwhile — but in
this process, one task at a time. The FAB is installed and its ClientApp
imported once per FAB; fedfdp's ClientApp then keeps its node's records, model
and feature map for the whole run (:func:`clients.client_app.node_runtime`).
A task that raises is answered with an error reply, as Flower does, and the
worker goes on.

The app's code is the FAB's (its packages are imported from the FAB's folder,
as ``flwr-clientapp`` does): a run with another FAB drops the modules of the
previous one and imports the new ones. The worker never installs dependencies
(no ``uv sync``): the machine must have the app's dependencies installed.

Flower's own parts stay as they are (wire protocol, tokens, heartbeats,
object store). What this relies on are the Runtime API calls ``flwr-clientapp``
and ``flower-superexec`` make, which Flower does not publish: they come from
:mod:`clients.flower_adapter`, the one module that imports Flower internals,
which refuses (one line naming both versions) any Flower but the release range
fedfdp pins (``flwr>=1.42,<1.43``).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from clients.flower_adapter import (
    RuntimeEndpoint,
    RuntimePoller,
    TaskConnection,
    TaskInput,
    error_reply,
    install_fab,
    load_client_app,
)

log = logging.getLogger("fedfdp.worker")

#: Seconds between AcquireTask polls right after a task; the pause grows by half
#: while idle, up to :data:`POLL_MAX_SECONDS`.
POLL_MIN_SECONDS = 0.005
POLL_MAX_SECONDS = 0.05


class Worker:
    """Runs the ClientApp tasks of one SuperNode in this process (module docstring)."""

    def __init__(self, runtime_api_address: str, *, insecure: bool = True,
                 root_certificates: str | None = None) -> None:
        self.endpoint = RuntimeEndpoint(runtime_api_address, insecure, root_certificates)
        self.poller = RuntimePoller(self.endpoint)
        self.stop = threading.Event()
        self.tasks = 0
        self._fab_hash: str | None = None
        self._app_dir: Path | None = None
        self._app: Any = None

    # ----------------------------------------------------------------- loop
    def acquire(self) -> str | None:
        """A ClientApp task's token, or None when the SuperNode has none."""
        return self.poller.acquire()

    def serve(self, max_tasks: int | None = None) -> None:
        """Run tasks until :attr:`stop` is set (or ``max_tasks`` ran)."""
        pause = POLL_MIN_SECONDS
        while not self.stop.is_set():
            try:
                token = self.acquire()
            except Exception as exc:  # the SuperNode restarting, a network hiccup: retry
                log.warning("AcquireTask failed (%s); retrying", exc)
                self.stop.wait(1.0)
                continue
            if token is None:
                self.stop.wait(pause)
                pause = min(pause * 1.5, POLL_MAX_SECONDS)
                continue
            self.run_task(token)
            pause = POLL_MIN_SECONDS
            if max_tasks is not None and self.tasks >= max_tasks:
                return

    # ----------------------------------------------------------------- one task
    def run_task(self, token: str) -> None:
        """One ClientApp task, as ``flwr-clientapp`` runs it, in this process."""
        self.tasks += 1
        conn = TaskConnection(self.endpoint, token)
        message = reply = context = None
        completed, details = False, "ClientApp task failed due to unknown reason"
        marks = [time.perf_counter()]
        try:
            conn.start_heartbeat()
            task = conn.pull_input(initial_backoff=PULL_INITIAL_BACKOFF, backoff_cap=PULL_BACKOFF_CAP)
            message, context = task.message, task.context
            marks.append(time.perf_counter())
            app = self.client_app(task)
            reply = app(message=message, context=context)
            marks.append(time.perf_counter())
            completed, details = True, ""
        except Exception as ex:  # answered with an error reply, as flwr-clientapp does
            log.error("ClientApp raised an exception", exc_info=ex)
            reply, details = error_reply(message, ex)
        finally:
            try:
                if reply is not None and context is not None:
                    conn.push_reply(reply, context)
            except Exception as ex:
                log.error("Failed to push the reply message", exc_info=ex)
            conn.finish(context, completed=completed, details=details)
            marks.append(time.perf_counter())
            steps = ", ".join(f"{b - a:.3f}" for a, b in itertools.pairwise(marks))
            status = "completed" if completed else "failed"
            log.info("task %d (%s): %.3f s (pull, app, push: %s)", self.tasks, status, marks[-1] - marks[0],
                     steps)

    def client_app(self, task: TaskInput) -> Any:
        """The ClientApp of the task's FAB: installed and imported on first use,
        kept until a task brings another FAB.
        """
        if task.fab_hash == self._fab_hash and self._app is not None:
            return self._app
        app_dir = install_fab(task)
        self._forget_app()
        _drop_modules(_top_level_names(app_dir))  # the app's packages come from its FAB
        app = load_client_app(task)
        self._fab_hash, self._app_dir, self._app = task.fab_hash, app_dir, app
        return app

    def _forget_app(self) -> None:
        if self._app_dir is None:
            return
        _drop_modules(_top_level_names(self._app_dir))
        while str(self._app_dir) in sys.path:
            sys.path.remove(str(self._app_dir))
        self._fab_hash = self._app_dir = self._app = None

    def close(self) -> None:
        self.stop.set()
        self.poller.close()


#: Backoff while the SuperNode still downloads a message's objects from the SuperLink.
#: The worker asks for a task as soon as the SuperNode created it, often before its
#: objects have arrived; Flower's default (1 s, doubling; ``flwr-clientapp`` starts
#: too late to meet it) would cost ~1 s a round.
PULL_INITIAL_BACKOFF = 0.005
PULL_BACKOFF_CAP = 0.25


def _top_level_names(app_dir: Path) -> set[str]:
    """Modules and packages a FAB's folder provides."""
    names = set()
    for entry in app_dir.iterdir():
        if entry.is_dir() and any(entry.glob("*.py")):
            names.add(entry.name)
        elif entry.suffix == ".py":
            names.add(entry.stem)
    return names


def _drop_modules(names: set[str]) -> None:
    for key in [k for k in sys.modules if k.split(".", 1)[0] in names]:
        del sys.modules[key]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.worker",
        description="Run a SuperNode's ClientApp tasks in one long-lived process "
                    "(flower-supernode --isolation process).",
    )
    parser.add_argument("--runtime-api-address", default="127.0.0.1:9094",
                        help="the SuperNode's Runtime API (its --host:--port; default 127.0.0.1:9094)")
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true", default=True,
                     help="plain HTTP to the SuperNode's Runtime API (default)")
    tls.add_argument("--root-certificates", metavar="PEM",
                     help="CA certificate of the Runtime API's TLS certificate (SuperNode --ssl-certfile)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Runtime API request otherwise
    worker = Worker(args.runtime_api_address, insecure=args.root_certificates is None,
                    root_certificates=args.root_certificates)

    def _stop(signum: int, frame: Any) -> None:
        worker.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("serving the ClientApp tasks of the SuperNode at %s", args.runtime_api_address)
    try:
        worker.serve()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
