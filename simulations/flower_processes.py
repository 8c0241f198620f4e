"""Flower's processes for a simulated run: a SuperLink of our own, ``flwr run``, and their end.

``fedfdp run`` (:mod:`simulations.run`) and ``fedfdp compare --engine flower`` submit a
staged Flower App (:func:`stage_simulation_app`: the library, the ClientApp and the
ServerApp of the simulation, with the run's configuration) with ``flwr run`` to a
SuperLink in simulation mode that :class:`LocalSimulation` starts on free ports and
always stops, with every process it started (Flower's SuperLink, its SuperExec and
Ray's workers), also when the launcher is interrupted (:func:`die_with_parent`; the
ServerApp watches its launcher, :mod:`strategies.launcher`). :func:`supernodes_for`
decides how many virtual SuperNodes a run gets (:func:`default_supernodes`, raised to
``secagg-min-survivors`` under secure aggregation); :func:`run_simulation_for` runs a
configuration end to end. Nothing here decides anything about privacy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedfdp.config import Aggregation, Config, ConfigError


def quiet_flower(verbose: bool) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.getLogger("flwr").setLevel(level)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


#: Fleets up to this many devices keep one virtual SuperNode per device.
SMALL_FLEET = 8


def default_supernodes(num_devices: int) -> int:
    """Virtual SuperNodes of ``fedfdp run``: one per core (at most one per device).

    Flower's Ray backend runs one ClientApp per CPU at a time, so more
    SuperNodes than cores only add messages; each SuperNode computes its
    devices' contribution in one call per round. A small fleet (at most
    :data:`SMALL_FLEET` devices) keeps one SuperNode per device: a handful of
    messages cost nothing and ``metrics.csv`` then counts replies per device.
    """
    if num_devices <= SMALL_FLEET:
        return max(1, int(num_devices))
    return max(1, min(int(num_devices), os.cpu_count() or 1))


class SimulationError(RuntimeError):
    """The simulated run did not complete (the message holds the run's last output)."""


#: Seconds to wait for the local SuperLink to accept connections.
SUPERLINK_START_TIMEOUT = 60.0
#: The packages a simulation's Flower App ships (its FAB).
APP_PACKAGES = ("fedfdp", "clients", "strategies")
_CONNECTION = "fedfdp-local"
#: Lines of Flower's and Ray's output that say nothing to a fedfdp user, never repeated (even
#: with ``--verbose``): fedfdp always sets the count of simulated SuperNodes, and runs its
#: ClientApps without GPUs, so neither Flower's note on the changed default count nor Ray's
#: future-behaviour tip on accelerator variables applies.
_NEVER_SHOWN = re.compile(
    r"default simulated SuperNodes changed|FutureWarning: Tip: In future versions of Ray|^\s*warnings\.warn\("
)
#: Lines of Flower's own output that ``fedfdp run`` does not repeat (without ``--verbose``).
_FLOWER_NOISE = re.compile(
    r"^(\x1b\[[0-9;]*m)?(INFO|DEBUG|WARNING)\b|^Using SuperLink|^Successfully (started run|installed)"
    r"|^\(ClientAppActor pid=|^Starting local SuperLink"
)


#: The last line of a Python traceback (the exception the ServerApp raised).
_RAISED = re.compile(r"(?m)^(?:[\w.]+\.)?\w*(?:Error|Exception|Exhausted|Mismatch): .*$")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stage_simulation_app(dest: Path, cfg: Config, nodes: Mapping[str, str] | None = None) -> Path:
    """A Flower App for one simulated run of ``cfg``: this fedfdp's packages and a
    ``pyproject.toml`` whose ``[tool.flwr.app.config]`` is ``cfg`` itself (so the
    run needs no overrides) and whose components are the simulation apps
    (:data:`strategies.server_app.simulation_app`,
    :data:`clients.client_app.simulation_app`). ``nodes``: the simulated nodes' own
    ``node-policy`` and ``node-state`` (``fedfdp run --node-policy/--node-state``), staged
    beside the app as :data:`clients.client_app.SIMULATED_NODES_FILE` for the ClientApp
    alone (the server is never sent them).
    """
    import importlib

    import tomli_w

    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in APP_PACKAGES:
        source = Path(importlib.import_module(pkg).__file__ or "").parent
        shutil.copytree(source, dest / pkg, ignore=ignore)
    try:
        from importlib.metadata import version

        app_version = version("fedfdp")
    except Exception:  # not installed as a distribution: any valid version will do
        app_version = "0.1.0"
    pyproject = {
        "project": {"name": "fedfdp", "version": app_version, "license": "Apache-2.0", "dependencies": [],
                    "description": "fedfdp run: one simulated run (staged by simulations/run.py)"},
        "tool": {"flwr": {"app": {
            "publisher": "fedfdp",
            "components": {"serverapp": "strategies.server_app:simulation_app",
                           "clientapp": "clients.client_app:simulation_app"},
            "config": cfg.to_flat(),
        }}},
    }
    (dest / "pyproject.toml").write_text(tomli_w.dumps(pyproject))
    if nodes:
        from clients.client_app import SIMULATED_NODES_FILE

        (dest / SIMULATED_NODES_FILE).write_text(tomli_w.dumps(dict(nodes)))
    return dest


def die_with_parent() -> None:
    """Run in a child between fork and exec: ask the kernel for SIGTERM when the
    thread that started it dies (Linux ``PR_SET_PDEATHSIG``; a no-op elsewhere), so
    a ``fedfdp run`` killed with SIGKILL leaves no SuperLink or ``flwr`` behind
    (they run in sessions of their own, out of reach of a process-group kill).
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


class LocalSimulation:
    """A SuperLink of this process's own, in simulation mode, on a free loopback port.

    ``with LocalSimulation() as sim: sim.run(app, supernodes)``: the SuperLink
    starts with its own ``FLWR_HOME`` in a temporary folder and never syncs an
    environment (``--disable-runtime-dependency-installation`` and
    ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` for every Flower
    process); on exit it is stopped, and so is every process it started (the
    SuperExec, the ``flwr-simulation`` process, Ray), whatever happened.
    Flower's processes see this process's ``sys.path`` (``PYTHONPATH``), so a
    model or dataset given by import path imports there as it does here.
    """

    def __init__(self, root: Path | None = None, *, verbose: bool = False) -> None:
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="fedfdp-sim-")) if root is None else Path(root)
        self.home = self.root / "flwr-home"
        self.verbose = verbose
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "superlink.log"
        self._seen: dict[int, int] = {}  # pid -> start time, every process of ours seen
        self._stop = threading.Event()
        self._tracker: threading.Thread | None = None

    # ----------------------------------------------------------- processes
    def env(self) -> dict[str, str]:
        from strategies.launcher import LAUNCHER_ENV, launcher_token

        env = dict(os.environ)
        # Flower's processes start its other executables by name (flower-superexec...): find
        # them next to this interpreter even when its environment is not activated
        here = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([here, *env.get("PATH", "").split(os.pathsep)])
        env["FLWR_HOME"] = str(self.home)
        env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env[LAUNCHER_ENV] = launcher_token()  # the ServerApp stops if this process dies
        env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.05")  # default 1 s before a run starts
        env.setdefault("RAY_DEDUP_LOGS", "0")
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *extra]))
        return env

    def __enter__(self) -> LocalSimulation:
        self.home.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            self.port = _free_port()
            try:
                self._start()
                break
            except SimulationError as exc:
                self._terminate()
                if "address already in use" not in str(exc).lower() or attempt == 2:
                    raise
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{_CONNECTION}"\n\n[superlink.{_CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        cmd = [_tool("flower-superlink"), "--insecure", "--simulation", "--host", "127.0.0.1",
               "--port", str(self.port), "--disable-runtime-dependency-installation"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env(), cwd=os.getcwd(), start_new_session=True,
                                         preexec_fn=die_with_parent)
        self._seen[self.proc.pid] = _start_time(self.proc.pid)
        if self._tracker is None:
            self._tracker = threading.Thread(target=self._track_loop, name="fedfdp-sim-tracker", daemon=True)
            self._tracker.start()
        deadline = time.monotonic() + SUPERLINK_START_TIMEOUT
        while not _port_open(self.port):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise SimulationError(f"flower-superlink exited ({code}):\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise SimulationError(f"flower-superlink: no port open after {SUPERLINK_START_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _track_loop(self) -> None:
        while not self._stop.wait(0.5):
            self._track()

    def _track(self) -> None:
        """Remember every live descendant of the SuperLink (Flower starts some in
        sessions of their own; orphans lose their parent link, so record them early).
        """
        table = _process_table()
        known = {pid for pid, start in self._seen.items() if table.get(pid, (0, -1))[1] == start}
        grew = True
        while grew:
            grew = False
            for pid, (ppid, start) in table.items():
                if pid not in known and ppid in known:
                    known.add(pid)
                    self._seen.setdefault(pid, start)
                    grew = True

    def _alive(self) -> list[int]:
        table = _process_table()
        return [pid for pid, start in self._seen.items()
                if pid in table and table[pid][1] == start and _state(pid) not in ("Z", "X", "")]

    def _terminate(self, grace: float = 10.0) -> None:
        self._track()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
            while self._alive() and time.monotonic() < deadline:
                if self.proc is not None:
                    self.proc.poll()  # reap the SuperLink
                time.sleep(0.1)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    def close(self) -> None:
        """Stop the SuperLink and every process it started; remove the temporary folder."""
        try:
            self._terminate()
        finally:
            self._stop.set()
            if self._tracker is not None:
                self._tracker.join(timeout=5)
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    # ----------------------------------------------------------- the run
    def flwr(self, args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run([_tool("flwr"), *args], env=self.env(), cwd=str(self.root), text=True,
                              capture_output=True, check=False, **kwargs)

    def run(self, app: Path, supernodes: int) -> None:
        """``flwr run APP --stream`` on ``supernodes`` virtual SuperNodes (one CPU
        each); echo the ServerApp's output (its progress bar and warnings) and
        raise :class:`SimulationError` unless the run completed.
        """
        flag = "true" if self.verbose else "false"
        level = "INFO" if self.verbose else "ERROR"
        federation = (f"num-supernodes={int(supernodes)} client-resources-num-cpus=1 "
                      f'client-resources-num-gpus=0 init-args-logging-level="{level}" '
                      f"init-args-log-to-driver={flag} verbose={flag}")
        cmd = [_tool("flwr"), "run", str(app), _CONNECTION, "--stream", "--federation-config", federation]
        tail = _Tail()
        with subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=self.env(), cwd=str(self.root), start_new_session=True,
                              preexec_fn=die_with_parent) as proc:
            self._seen[proc.pid] = _start_time(proc.pid)
            if proc.stdout is None:  # stdout=PIPE: never, but say so rather than assert
                raise SimulationError("flwr run: no output stream")
            _echo(proc.stdout, tail, self.verbose)
            code = proc.wait()
        status = self.status()
        if code != 0 or status != "finished:completed":
            raised = _RAISED.findall(tail.text())
            cause = raised[-1] if raised else f"its last output:\n{tail.text()[-3000:]}"
            raise SimulationError(f"the simulated run did not complete (status {status!r}, flwr run exit "
                                  f"{code}): {cause}")

    def status(self) -> str:
        """Flower's status of the (single) run on this SuperLink, e.g. ``finished:completed``."""
        res = self.flwr(["ls", _CONNECTION, "--format", "json"], timeout=120)
        try:
            runs = json.loads(res.stdout[res.stdout.index("{"):])["runs"]
            return str(runs[-1]["status"]) if runs else "no run"
        except (ValueError, KeyError, IndexError, TypeError):
            return f"unknown ({res.stdout[-500:]!r})"


class _Tail:
    """The last lines of a stream (for error messages)."""

    def __init__(self, keep: int = 8000) -> None:
        self.keep = keep
        self.buf = ""

    def add(self, text: str) -> None:
        self.buf = (self.buf + text)[-self.keep:]

    def text(self) -> str:
        return self.buf.replace("\r", "\n")


#: Where Flower's report of a failed run begins: from there on nothing more is echoed
#: (without ``--verbose``); ``fedfdp run`` then says in one line what failed.
_FAILURE_STARTS = re.compile(r"^(\x1b\[[0-9;]*m)?ERROR\b|^Traceback \(most recent call last\)")


def _echo(stream: Any, tail: _Tail, verbose: bool) -> None:
    r"""Copy ``flwr run --stream`` output to stderr as it arrives, without Flower's
    own log lines unless ``verbose`` (and never the lines of :data:`_NEVER_SHOWN`); a
    progress bar (``\r`` updates) passes at once. From the first line of a failure report
    (an ``ERROR`` line, a traceback) nothing more is shown unless ``verbose``: the tail
    keeps it for the one-line error. When stderr is not a terminal the copy is plain text
    (:class:`simulations.plain_output.PlainText`: the bar's final line, no escape codes).
    """
    from simulations.plain_output import ANSI_ESCAPE, PlainText

    pending = ""
    failed = False
    fd = stream.fileno()
    sink: Any = sys.stderr if sys.stderr.isatty() else PlainText(sys.stderr)

    def shown(line: str) -> bool:
        nonlocal failed
        last = ANSI_ESCAPE.sub("", line.rsplit("\r", 1)[-1])
        failed = failed or bool(_FAILURE_STARTS.search(last))
        if _NEVER_SHOWN.search(last):
            return False
        return verbose or not (failed or _FLOWER_NOISE.search(last))

    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        text = chunk.decode(errors="replace")
        tail.add(text)
        pending += text
        *lines, pending = pending.split("\n")
        out = [ln + "\n" for ln in lines if shown(ln)]
        if "\r" in pending and not failed:  # a progress bar: show it now, keep only its last update
            cut = pending.rindex("\r")
            out.append(pending[:cut])
            pending = pending[cut:]
        if out:
            sink.write("".join(out))
            sink.flush()
    if pending and shown(pending):
        sink.write(pending + "\n")
    if isinstance(sink, PlainText):
        sink.finish()


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise SimulationError(f"{name}: not found next to {sys.executable} nor on PATH "
                              "(install fedfdp, which brings its flwr: pip install -e .)")
    return found


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stat_fields(pid: int) -> list[str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2:].split()


def _start_time(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else -1


def _state(pid: int) -> str:
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def _process_table() -> dict[int, tuple[int, int]]:
    """Map each pid to (parent pid, start time) from /proc (empty where there is none)."""
    table: dict[int, tuple[int, int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if len(fields) > 19:
                table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def supernodes_for(cfg: Config, requested: int | None = None) -> int:
    """The count of virtual SuperNodes of ``cfg``'s simulated run: ``requested``
    (``--supernodes``), or :func:`default_supernodes`; under ``aggregation = "secagg"``
    the default is raised to ``secagg-min-survivors`` (each SuperNode is one SecAgg+
    party, and a round with fewer than ``n_min`` parties cannot unmask).

    Raises
    ------
    ConfigError
        ``requested`` outside ``1..num-devices``, or fewer SuperNodes than
        ``secagg-min-survivors`` under secure aggregation (one line, naming the value).
    """
    devices = cfg.data.num_devices
    if requested is not None and not 1 <= requested <= devices:
        raise ConfigError(f"--supernodes={requested}: must be in 1..num-devices={devices}")
    count = default_supernodes(devices) if requested is None else int(requested)
    n_min = cfg.privacy.secagg_min_survivors
    if cfg.privacy.aggregation is not Aggregation.SECAGG or n_min is None:
        return count
    if requested is None:
        count = max(count, min(n_min, devices))
    if count < n_min:
        given = f"--supernodes={requested}" if requested is not None else f"num-devices={devices}"
        raise ConfigError(
            f"secagg-min-survivors={n_min}: only {count} SuperNodes ({given}), so no round could unmask; "
            f"aggregation='secagg' needs at least {n_min} SuperNodes (one per party, at most one per device)"
        )
    return count


def run_simulation_for(cfg: Config, *, verbose: bool = False, supernodes: int | None = None,
                       nodes: Mapping[str, str] | None = None) -> None:
    """Run ``cfg`` on Flower's Simulation Runtime (Ray backend) through Flower's
    supported path: ``flwr run`` against a SuperLink in simulation mode, started
    for this run and always stopped (:class:`LocalSimulation`). The run uses
    ``supernodes`` virtual SuperNodes (default and checks: :func:`supernodes_for`), each
    serving its partition of the devices; the sampling plan and the accounting
    are the same as with one SuperNode per device (tests/test_many_devices.py);
    ``nodes``: every simulated node's own policy and state (:func:`stage_simulation_app`).
    Raises :class:`SimulationError` if the run did not complete.
    """
    count = supernodes_for(cfg, supernodes)
    quiet_flower(verbose)
    with LocalSimulation(verbose=verbose) as sim:
        app = stage_simulation_app(sim.root / "app", cfg, nodes)
        sim.run(app, count)
