"""The one place fedfdp reaches into Flower's internals, behind a version check.

fedfdp uses Flower's public API directly (``flwr.app``, ``flwr.serverapp``,
``flwr.clientapp``, ``flwr.simulation``). A few things have no public entry
point; they live here and nowhere else, so a Flower upgrade has one file to
re-check:

- the SuperNode's Runtime API as ``flwr-clientapp`` and ``flower-superexec``
  use it (acquire a ClientApp task, pull its message, context and FAB, push
  the reply and the task's outcome, heartbeats), which :mod:`clients.worker`
  drives to run every task of a SuperNode in one long-lived process
  (:class:`RuntimePoller`, :class:`TaskConnection`, :func:`install_fab`,
  :func:`load_client_app`, :func:`error_reply`);
- telling the Simulation Runtime's grid from a deployment's
  (:func:`is_simulation_grid`, for :mod:`strategies.server_app`);
- the task identity Flower stamps on messages, for messages built in process
  (:func:`set_task_identity`);
- what-if patches of Flower's fixed waits, for measurements only
  (:func:`shorten_supernode_waits`, :func:`shorten_grid_object_pulls`).

Importing this module checks the installed Flower against
:data:`SUPPORTED_FLOWER` first and raises :class:`FlowerVersionError`, one
line naming both versions, on any other release: these internals change
without notice between minor releases, and a silent mismatch would fail in
the middle of a run (or, worse, not fail). Move the pin in ``pyproject.toml``
and :data:`SUPPORTED_RANGE` together, after re-running the deployment tests.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flwr

#: The Flower releases this module was written and tested against (pyproject.toml's pin).
SUPPORTED_FLOWER = ">=1.42,<1.43"
#: The same range as (major, minor) bounds: lowest supported, first unsupported.
SUPPORTED_RANGE = ((1, 42), (1, 43))


class FlowerVersionError(RuntimeError):
    """The installed Flower is not a release this module supports."""


def installed_flower_version() -> str:
    """The version string of the Flower package this process imported."""
    return str(flwr.__version__)


def check_flower_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed Flower's) if it lies in
    :data:`SUPPORTED_FLOWER`; raise :class:`FlowerVersionError` otherwise.

    Only the release's major and minor numbers count (``1.42.3``, ``1.42.0rc1``
    are 1.42); a version string that does not start with them is refused too.
    """
    found = installed_flower_version() if version is None else version
    match = re.match(r"\s*(\d+)\.(\d+)", found)
    low, high = SUPPORTED_RANGE
    if match is None or not low <= (int(match[1]), int(match[2])) < high:
        raise FlowerVersionError(
            f"flwr {found} is installed; fedfdp supports flwr{SUPPORTED_FLOWER} "
            f"(pip install 'flwr[simulation]{SUPPORTED_FLOWER}')"
        )
    return found


FLOWER_VERSION = check_flower_version()

# Flower internals: imported only once the version is known to be supported.
# ruff: noqa: E402
from flwr.app import Context, Message
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.config import get_project_dir
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
)
from flwr.serverapp import Grid
from flwr.supercore.constant import TaskType
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output


# --------------------------------------------------------------------- grids and identities
def is_simulation_grid(grid: Grid) -> bool:
    """Whether ``grid`` is the Simulation Runtime's in-memory grid (``flwr run``
    against a ``--simulation`` SuperLink), not a deployment's.
    """
    from flwr.superlink.grid import InMemoryGrid  # the SuperLink's state machinery: loaded when asked

    return isinstance(grid, InMemoryGrid)


def set_task_identity(*, run_id: int, node_id: int, task_id: int) -> None:
    """Stamp the identity Flower gives messages created in this process (a
    ClientApp task's run, node and task), for messages built outside a task.
    """
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = node_id
    TaskIdentity.task_id = task_id


# --------------------------------------------------------------------- the Runtime API
@dataclass(frozen=True)
class RuntimeEndpoint:
    """A SuperNode's Runtime API: its address and how to reach it.

    ``root_certificates`` is a PEM file (the CA of the SuperNode's
    ``--ssl-certfile``), required unless ``insecure``; it is read once here.
    """

    address: str
    insecure: bool = True
    root_certificates: str | None = None
    certificates: bytes | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if ":" not in self.address:
            raise ValueError(f"runtime API address={self.address!r}: expected HOST:PORT")
        pem = validate_and_resolve_root_certificates(self.root_certificates, self.insecure)
        object.__setattr__(self, "certificates", pem)

    def client(self, component: str, *, token: str | None = None) -> tuple[Any, Any]:
        """A Runtime API client speaking as ``component`` (with a task ``token``
        when it acts for one task) and its retry policy: ``(client, retry)``.
        """
        retry = make_simple_http_retry_invoker()
        interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name=component)]
        if token is not None:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        client = RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=self.insecure,
            root_certificates=self.certificates,
            interceptors=interceptors,
            retry_invoker=retry,
        )
        return client, retry


class RuntimePoller:
    """Asks a SuperNode for ClientApp tasks, as ``flower-superexec`` does."""

    def __init__(self, endpoint: RuntimeEndpoint) -> None:
        self.endpoint = endpoint
        self.client, _ = endpoint.client("SuperExec")

    def acquire(self) -> str | None:
        """A ClientApp task's token, or None when the SuperNode has none."""
        res = self.client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        if res.HasField("task") and res.token:
            return str(res.token)
        return None

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class TaskInput:
    """What a ClientApp task brings: the message and context (Flower's public
    types), the FAB's hash, and Flower's run and FAB records (pass them back to
    :func:`install_fab` and :func:`load_client_app`).
    """

    message: Message
    context: Context
    fab_hash: str
    run: Any
    fab: Any


class TaskConnection:
    """One ClientApp task on the Runtime API, as ``flwr-clientapp`` handles it:
    heartbeats while it runs, the input pulled, the reply and the outcome pushed.
    """

    def __init__(self, endpoint: RuntimeEndpoint, token: str) -> None:
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http

        self.client, self._retry = endpoint.client("flwr-clientapp", token=token)
        self._heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(self.client))

    def start_heartbeat(self) -> None:
        self._heartbeat.start()

    def pull_input(self, *, initial_backoff: float, backoff_cap: float) -> TaskInput:
        """The task's message, context, run and FAB (Flower's ``pull_task_input``),
        retrying objects the SuperNode has not downloaded yet after
        ``initial_backoff`` s, doubling up to ``backoff_cap`` s.
        """
        res = self.client.PullTaskInput(PullTaskInputRequest())
        set_task_identity(run_id=res.run.run_id, node_id=res.context.node_id, task_id=res.task_id)
        context = context_from_proto(res.context)
        run = run_from_proto(res.run)
        fab = fab_from_proto(res.fab)
        pulled = self.client.PullMessages(PullAppMessagesRequest())
        if not pulled.messages_list:
            raise RuntimeError("No messages received from Runtime API")
        node = Node(node_id=context.node_id)
        tree = pulled.message_object_trees[0]
        message = pull_and_inflate_object_from_tree(
            tree,
            make_pull_object_fn_protobuf(self.client.PullObject, node, context.run_id),
            make_confirm_message_received_fn_protobuf(self.client.ConfirmMessageReceived, node,
                                                      context.run_id),
            return_type=Message,
            initial_backoff=initial_backoff,
            backoff_cap=backoff_cap,
        )
        message.metadata.__dict__["_message_id"] = tree.object_id  # as pull_task_input sets it
        return TaskInput(message, context, str(fab.hash_str), run, fab)

    def push_reply(self, reply: Message, context: Context) -> None:
        push_message(self.client, reply, context)

    def finish(self, context: Context | None, *, completed: bool, details: str) -> None:
        """Push the task's outcome (one try), stop the heartbeats, close the connection."""
        try:
            self._retry.max_tries = 1
            status = SubStatus.COMPLETED if completed else SubStatus.FAILED
            push_task_output(client=self.client, context=context, sub_status=status, details=details)
        finally:
            if self._heartbeat.is_running:
                self._heartbeat.stop()
            self.client.close()


def error_reply(message: Message | None, exc: BaseException) -> tuple[Message | None, str]:
    """The error reply ``flwr-clientapp`` sends for a task that raised ``exc``
    (None without a message to reply to) and the task's failure details.
    """
    code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    reason = f"{type(exc)}:<'{exc}'>"
    if isinstance(exc, LoadClientAppError):
        code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
        reason = "An exception was raised when attempting to load `ClientApp`"
    reply = Message(Error(code=code, reason=reason), reply_to=message) if message is not None else None
    return reply, reason


def install_fab(task: TaskInput) -> Path:
    """Unpack the task's FAB (if not already) and return its folder."""
    install_from_fab(task.fab.content, skip_prompt=True)
    return Path(get_project_dir(task.run.fab_id, task.run.fab_version, task.fab_hash)).absolute()


def load_client_app(task: TaskInput) -> ClientApp:
    """Import the installed FAB's ClientApp (its folder goes on ``sys.path``)."""
    load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
    return load(task.run.fab_id, task.run.fab_version, task.fab_hash)


# --------------------------------------------------------------------- what-if patches
def shorten_supernode_waits(seconds: float, *, initial_backoff: float, backoff_cap: float) -> None:
    """Measurement only: make this process's SuperNode loop sleep ``seconds``
    where Flower sleeps its fixed 3 s (nothing pulled) and 0.5 s (reply check),
    and retry a message's objects from ``initial_backoff`` s. Call before
    :func:`run_flower_supernode`.
    """
    import functools
    import time
    import types

    import flwr.supernode.start_client_internal as loop

    clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    clock.sleep = lambda s, _sleep=time.sleep: _sleep(seconds if s in (3, 0.5) else s)
    pulls = functools.partial(loop.pull_objects, initial_backoff=initial_backoff, backoff_cap=backoff_cap)
    vars(loop).update(time=clock, pull_objects=pulls)


def shorten_grid_object_pulls(*, initial_backoff: float, backoff_cap: float) -> None:
    """Measurement only: a deployment ServerApp's Grid in this process retries a
    reply's not-yet-uploaded objects after ``initial_backoff`` s (Flower: 1 s, doubling).
    """
    import functools

    import flwr.superlink.grid.http_grid as http_grid

    pulls = functools.partial(http_grid.pull_objects, initial_backoff=initial_backoff,
                              backoff_cap=backoff_cap)
    vars(http_grid).update(pull_objects=pulls)


def run_flower_supernode() -> None:
    """``flower-supernode`` in this process, with ``sys.argv[1:]`` as its arguments."""
    import sys

    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv[0] = "flower-supernode"
    flower_supernode()


def wire_round_trip(content: Any) -> tuple[Any, int]:
    """``content`` (a ``RecordDict``) sent through Flower's protobuf form and back, as a
    SuperLink does to every message, and the serialised size in bytes. For benchmarks
    that count what travels.
    """
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict  # pylint: disable=E0611

    raw = recorddict_to_proto(content).SerializeToString()
    proto = ProtoRecordDict()
    proto.ParseFromString(raw)
    return recorddict_from_proto(proto), len(raw)


def legacy_secaggplus() -> types.SimpleNamespace:
    """Flower's own SecAgg+ (its legacy ``DefaultWorkflow`` with ``SecAggPlusWorkflow``,
    ``secaggplus_mod`` on ``NumPyClient`` s, ``FedAvg``), the reference that
    ``benchmarks/secagg.py`` compares fedfdp's secure aggregation with. fedfdp itself
    never runs it.
    """
    from flwr.client import ClientApp as LegacyClientApp
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import ndarrays_to_parameters
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.supercore.run import Run

    return types.SimpleNamespace(
        ClientApp=LegacyClientApp, NumPyClient=NumPyClient, secaggplus_mod=secaggplus_mod,
        ndarrays_to_parameters=ndarrays_to_parameters, LegacyContext=LegacyContext,
        ServerConfig=ServerConfig, FedAvg=FedAvg, DefaultWorkflow=DefaultWorkflow,
        SecAggPlusWorkflow=SecAggPlusWorkflow, Run=Run)
