"""A long-lived ClientApp process for a SuperNode: every message of a run in one process.

Flower 1.41 runs a ClientApp in a new process per message: by default the
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
object store); what this relies on from Flower 1.41 are the Runtime API calls
``flwr-clientapp`` and ``flower-superexec`` make (``flwr.supernode.runtime.run_clientapp``,
``flwr.supercore.runtime``), so it is pinned to ``flwr==1.41.*`` like the rest
of fedfdp.
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

log = logging.getLogger("fedfdp.worker")

#: Seconds between AcquireTask polls right after a task; the pause grows by half
#: while idle, up to :data:`POLL_MAX_SECONDS`.
POLL_MIN_SECONDS = 0.005
POLL_MAX_SECONDS = 0.05


class Worker:
    """Runs the ClientApp tasks of one SuperNode in this process (module docstring)."""

    def __init__(self, runtime_api_address: str, *, insecure: bool = True,
                 root_certificates: str | None = None) -> None:
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supercore.tls import validate_and_resolve_root_certificates

        self.address = runtime_api_address
        self.insecure = insecure
        self.certificates = validate_and_resolve_root_certificates(root_certificates, insecure)
        self.client = RuntimeHttpClient.from_server_address(
            server_address=runtime_api_address,
            insecure=insecure,
            root_certificates=self.certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
            retry_invoker=make_simple_http_retry_invoker(),
        )
        self.stop = threading.Event()
        self.tasks = 0
        self._fab_hash: str | None = None
        self._app_dir: Path | None = None
        self._app: Any = None

    # ----------------------------------------------------------------- loop
    def acquire(self) -> str | None:
        """A ClientApp task's token, or None when the SuperNode has none."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
        from flwr.supercore.constant import TaskType

        res = self.client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        if res.HasField("task") and res.token:
            return str(res.token)
        return None

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
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.clientapp.client_app import LoadClientAppError
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

        self.tasks += 1
        retry = make_simple_http_retry_invoker()
        client = RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=self.insecure,
            root_certificates=self.certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                          RuntimeTokenHttpInterceptor(token)],
            retry_invoker=retry,
        )
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        message = reply = context = None
        status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        marks = [time.perf_counter()]
        try:
            heartbeat.start()
            message, context, run, fab = _pull_task_input(client)
            marks.append(time.perf_counter())
            app = self.client_app(run, fab)
            reply = app(message=message, context=context)
            marks.append(time.perf_counter())
            status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # answered with an error reply, as flwr-clientapp does
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = f"{type(ex)}:<'{ex}'>"
            if isinstance(ex, LoadClientAppError):
                code, reason = ErrorCode.LOAD_CLIENT_APP_EXCEPTION, "An exception was raised when " \
                    "attempting to load `ClientApp`"
            log.error("ClientApp raised an exception", exc_info=ex)
            details = reason
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
            except Exception as ex:
                log.error("Failed to push the reply message", exc_info=ex)
            retry.max_tries = 1
            push_task_output(client=client, context=context, sub_status=status, details=details)
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()
            marks.append(time.perf_counter())
            steps = ", ".join(f"{b - a:.3f}" for a, b in itertools.pairwise(marks))
            log.info("task %d (%s): %.3f s (pull, app, push: %s)", self.tasks, status, marks[-1] - marks[0],
                     steps)

    def client_app(self, run: Any, fab: Any) -> Any:
        """The ClientApp of ``fab``: installed and imported on first use, kept
        until a task brings another FAB."""
        if fab.hash_str == self._fab_hash and self._app is not None:
            return self._app
        from flwr.cli.install import install_from_fab
        from flwr.clientapp.utils import get_load_client_app_fn
        from flwr.common.config import get_project_dir

        install_from_fab(fab.content, skip_prompt=True)
        app_dir = Path(get_project_dir(run.fab_id, run.fab_version, fab.hash_str)).absolute()
        self._forget_app()
        _drop_modules(_top_level_names(app_dir))  # the app's packages come from its FAB
        app = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)(
            run.fab_id, run.fab_version, fab.hash_str)
        self._fab_hash, self._app_dir, self._app = fab.hash_str, app_dir, app
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
        self.client.close()


#: Backoff while the SuperNode still downloads a message's objects from the SuperLink.
#: The worker asks for a task as soon as the SuperNode created it, often before its
#: objects have arrived; Flower's default (1 s, doubling; ``flwr-clientapp`` starts
#: too late to meet it) would cost ~1 s a round.
PULL_INITIAL_BACKOFF = 0.005
PULL_BACKOFF_CAP = 0.25


def _pull_task_input(client: Any) -> tuple[Any, Any, Any, Any]:
    """``flwr.supernode.runtime.run_clientapp.pull_task_input`` with a short backoff
    for objects not yet available (:data:`PULL_INITIAL_BACKOFF`)."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest  # pylint: disable=E0611
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supercore.task_identity import TaskIdentity

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run = run_from_proto(res.run)
    fab = fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
        initial_backoff=PULL_INITIAL_BACKOFF,
        backoff_cap=PULL_BACKOFF_CAP,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as pull_task_input sets it
    return message, context, run, fab


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
