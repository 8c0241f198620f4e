"""``fedfdp run``: one federated training run.

``fedfdp run --config FILE.toml --out DIR [--set key=value ...] [--supernodes N]``
    One federated run on Flower's Simulation Runtime, submitted with ``flwr
    run`` to a SuperLink in simulation mode that this command starts and
    stops (Flower's supported path; ``flwr.simulation.run_simulation`` is
    deprecated). ``N`` virtual SuperNodes (default: one per core; one per
    device up to 8 devices) each serve their share of the devices in one call
    per round.
    Writes ``DIR/metrics.csv``, ``DIR/config.toml``, ``DIR/ledger.jsonl``,
    ``DIR/checkpoint.pt`` and ``DIR/model.pt``.
``fedfdp run --centralised ...``
    The same configuration through the single-machine reference
    (:mod:`fedfdp.algorithm`), without Flower.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfdp.config import Aggregation, Config, ConfigError, load_config, parse_override, read_toml
from fedfdp.entropy import REPRODUCIBLE_WARNING

if TYPE_CHECKING:
    from fedfdp.checkpoint import Resume
    from fedfdp.data import FederatedData
    from fedfdp.mechanism import ResolvedMechanism


def build_config(config_path: str | None, overrides: Sequence[str], out: str | None) -> Config:
    """Defaults ← TOML file ← ``--set`` overrides ← ``--out``; validated once."""
    mapping: dict[str, Any] = dict(read_toml(config_path)) if config_path else {}
    for item in overrides:
        key, value = parse_override(item)
        mapping[key] = value
    if out is not None:
        mapping["out-dir"] = str(Path(out).resolve())
    return load_config(mapping)


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
#: Lines of Flower's own output that ``fedfdp run`` does not repeat (without ``--verbose``).
_FLOWER_NOISE = re.compile(
    r"^(\x1b\[[0-9;]*m)?(INFO|DEBUG|WARNING)\b|^Using SuperLink|^Successfully (started run|installed)"
    r"|^\(ClientAppActor pid=|^\s*warnings\.warn\(|FutureWarning: Tip: In future versions of Ray"
    r"|^Starting local SuperLink"
)


#: The last line of a Python traceback (the exception the ServerApp raised).
_RAISED = re.compile(r"(?m)^(?:[\w.]+\.)?\w*(?:Error|Exception|Exhausted|Mismatch): .*$")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stage_simulation_app(dest: Path, cfg: Config) -> Path:
    """A Flower App for one simulated run of ``cfg``: this fedfdp's packages and a
    ``pyproject.toml`` whose ``[tool.flwr.app.config]`` is ``cfg`` itself (so the
    run needs no overrides) and whose components are the simulation apps
    (:data:`strategies.server_app.simulation_app`,
    :data:`clients.client_app.simulation_app`).
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
    own log lines unless ``verbose``; a progress bar (``\r`` updates) passes at once.
    From the first line of a failure report (an ``ERROR`` line, a traceback) nothing
    more is shown unless ``verbose``: the tail keeps it for the one-line error.
    """
    pending = ""
    failed = False
    fd = stream.fileno()

    def shown(line: str) -> bool:
        nonlocal failed
        last = line.rsplit("\r", 1)[-1]
        failed = failed or bool(_FAILURE_STARTS.search(last))
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
            sys.stderr.write("".join(out))
            sys.stderr.flush()
    if pending and shown(pending):
        sys.stderr.write(pending + "\n")


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


def run_simulation_for(cfg: Config, *, verbose: bool = False, supernodes: int | None = None) -> None:
    """Run ``cfg`` on Flower's Simulation Runtime (Ray backend) through Flower's
    supported path: ``flwr run`` against a SuperLink in simulation mode, started
    for this run and always stopped (:class:`LocalSimulation`). The run uses
    ``supernodes`` virtual SuperNodes (default and checks: :func:`supernodes_for`), each
    serving its partition of the devices; the sampling plan and the accounting
    are the same as with one SuperNode per device (tests/test_many_devices.py).
    Raises :class:`SimulationError` if the run did not complete.
    """
    count = supernodes_for(cfg, supernodes)
    quiet_flower(verbose)
    with LocalSimulation(verbose=verbose) as sim:
        app = stage_simulation_app(sim.root / "app", cfg)
        sim.run(app, count)


#: The refusals a ServerApp may raise for a user's setting (status 2, like the centralised engine).
_USER_ERROR = re.compile(r"(?:^|\.)(?:RunDiverged|ConfigError|LedgerError|CheckpointMismatch|"
                         r"PrivacyBudgetExhausted): (.*)$")


def _simulation_failed(exc: SimulationError) -> int:
    """One line for a simulated run that did not complete: the error the ServerApp raised
    for a user's setting (status 2), or the cause with Flower's output written to a file
    (status 1).
    """
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [m.group(1) for line in lines if (m := _USER_ERROR.search(line))]
    if raised:
        print(f"error: {raised[-1]}", file=sys.stderr)
        return 2
    fd, path = tempfile.mkstemp(prefix="fedfdp-flower-", suffix=".txt")
    with open(fd, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    first = lines[0] if lines else "no output"
    cause = next((line for line in reversed(lines) if re.match(r"^[\w.]+(Error|Exception): ", line)), "")
    print(f"error: {first.rstrip(':')}{(' ' + cause) if cause else ''} (Flower's output in {path})",
          file=sys.stderr)
    return 1


def _epsilon_text(last: Any) -> str:
    """The final ε of a ``metrics.csv`` row in the column its accounting wrote (``epsilon``,
    or ``epsilon_corrdp`` with the relation spelled out in ``relation_text``).
    """
    delta = f"delta={last['delta']:.3g}, upper bound"
    corrdp = last.get("epsilon_corrdp", float("nan"))
    if isinstance(corrdp, float | int) and not math.isnan(corrdp):
        text = last.get("relation_text", "")
        relation = text if isinstance(text, str) and text else str(last["relation"])
        return f"epsilon_corrdp={corrdp:.4g} ({relation}; {delta})"
    return f"epsilon={last['epsilon']:.4g} ({last['relation']}, {delta})"


def _budget_split_line(out: Path) -> str:
    """What the statistics released before training cost, from ``config.toml``'s
    ``[resolved]`` (``estimates-epsilon`` alone, ``planned-epsilon`` with every planned
    round); empty when the run released none.
    """
    from fedfdp.config import load_toml_file
    from fedfdp.outputs import CONFIG_FILE

    try:
        resolved = load_toml_file(out / CONFIG_FILE).get("resolved", {})
    except ConfigError:
        return ""
    alone = resolved.get("estimates-epsilon")
    if alone is None:
        return ""
    planned = resolved.get("planned-epsilon")
    total = f" (planned total {float(planned):.4g})" if planned is not None else ""
    return f"of which released statistics: epsilon={float(alone):.4g} alone{total}"


def _summarise(out: Path, cfg: Config) -> int:
    import pandas as pd

    path = out / "metrics.csv"
    if not path.is_file():
        print(f"error: the run wrote no {path}", file=sys.stderr)
        return 1
    frame = pd.read_csv(path)
    last = frame.iloc[-1]
    done = frame["accuracy"].dropna()
    acc = done.iloc[-1] if len(done) else float("nan")
    print(f"rounds={int(last['round'])} accuracy={acc:.4f} {_epsilon_text(last)}")
    split = _budget_split_line(out)
    if split:
        print(split)
    if cfg.privacy.reproducible_noise:  # every output says so (stderr said it at the start)
        print(f"warning: {REPRODUCIBLE_WARNING}")
    if "auc" in frame and frame["auc"].isna().all():
        print("auc: empty in metrics.csv (reported for binary tasks with both classes in the held-out "
              "split; this task is not one)")
    from fedfdp.run_files import RUN_FILES

    written = [name for name in RUN_FILES if (out / name).exists()]
    print(f"wrote {', '.join(written)} in {out}")
    return 0


def _check_run_dir(cfg: Config, data: FederatedData) -> Resume | None:
    """Refuse an occupied output directory, or a resume whose checkpoint or
    ledger does not match, before any work starts (errors inside Flower's
    ServerApp thread are only logged).
    """
    from fedfdp.ledger import LedgerError
    from fedfdp.parts import mechanism_for, public_facts
    from fedfdp.run_files import RunFiles
    from simulations.resources import check_model_memory

    # the mechanism the run's server will resolve (its mode's accounting: corrdp too)
    check_model_memory(cfg, public_facts(cfg, data).num_params)
    mechanism = mechanism_for(cfg, data)
    try:
        found = RunFiles(cfg.run.out_dir, cfg).verify(mechanism)
    except LedgerError as exc:
        changed = _changed_guarantee_keys(cfg) if cfg.run.resume else ""
        raise ConfigError(f"{changed}{exc}") from exc
    if not cfg.run.resume:
        _check_first_round_fits(cfg, data, mechanism)
        return None
    return found


def _changed_guarantee_keys(cfg: Config) -> str:
    """``key=new (the run has old); ...: `` for every key that defines the guarantee and
    differs from the run directory's config.toml (empty when none or unreadable).
    """
    from fedfdp.config import GUARANTEE_KEYS

    try:
        saved = load_config(read_toml(Path(cfg.run.out_dir) / "config.toml")).to_flat()
    except (ConfigError, OSError):
        return ""
    now = cfg.to_flat()
    diffs = [f"{k}={now[k]!r} (the run has {saved[k]!r})" for k in now
             if k in GUARANTEE_KEYS and k in saved and now[k] != saved[k]]
    if not diffs:
        return ""
    return "; ".join(diffs) + ": a resume keeps every setting that defines the guarantee; "


def _resuming_line(out: str, found: Resume, every: int) -> str:
    """What a resume continues from (the Flower path: the ServerApp's own log is not shown)."""
    charges = len(found.ledger.charges) if found.ledger is not None else 0
    spent = f"the ledger's {charges} charges stay counted" + (
        f" (and {found.unrecorded} unrecorded ones, pessimistically)" if found.unrecorded else "")
    if found.checkpoint is None or found.checkpoint.round == 0:
        return (f"resuming {out}: no checkpoint after a round (checkpoint-every={every}, or stopped before "
                f"the first): the training restarts at round 1; {spent}")
    return f"resuming {out} after round {found.checkpoint.round} (its checkpoint); {spent}"


def _check_data_path(cfg: Config) -> None:
    """``data-path``: a file for the tables (a folder only for ``images``), named as given."""
    for key, value in (("data-path", cfg.data.data_path), ("test-path", cfg.data.test_path)):
        if not value:
            continue
        path = Path(value)
        if path.is_dir() and not (key == "data-path" and cfg.data.dataset == "images"):
            raise ConfigError(f"{key}={value!r}: is a directory; dataset={cfg.data.dataset!r} reads a file")
        if not path.exists():
            raise ConfigError(f"{key}={value!r}: no such file")


def _check_model_and_data(cfg: Config, data: FederatedData) -> None:
    """The model the run builds, the data and Ψ fit together (:func:`fedfdp.evaluation.check_run_inputs`),
    checked here, before the Flower processes start.
    """
    from fedfdp.evaluation import check_run_inputs
    from fedfdp.losses import build_decomposition
    from fedfdp.models import build_model_for

    try:
        check_run_inputs(build_model_for(cfg, data), data, build_decomposition(cfg, data))
    except ConfigError as exc:
        text = str(exc)
        if text.startswith("model:"):  # name the configured model
            raise ConfigError(f"model={cfg.training.model!r}:{text[len('model:'):]}") from exc
        raise


def _check_first_round_fits(cfg: Config, data: FederatedData, mechanism: ResolvedMechanism) -> None:
    """Refuse a cap (``max-epsilon``) below the ε of the first private round: the run
    would stop before it, with nothing trained.
    """
    from fedfdp.parts import server_parts_for

    if mechanism.event is None or mechanism.max_epsilon is None:
        return
    accountant = server_parts_for(cfg, data).accounting.new()
    if not accountant.would_exceed(mechanism.event, 1, max_epsilon=mechanism.max_epsilon,
                                   delta=mechanism.delta):
        return
    accountant.compose(mechanism.event)
    one = float(accountant.epsilon(mechanism.delta))
    raise ConfigError(
        f"max-epsilon={mechanism.max_epsilon:g}: below the ε of one private round ({one:.4g} at "
        f"delta={mechanism.delta:.3g}, noise-multiplier={mechanism.noise_multiplier}); the run would stop "
        "before it: raise max-epsilon or the noise"
    )


class _StderrLines(logging.Handler):
    """``warning: message`` on the current ``sys.stderr`` (looked up at each record)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"{record.levelname.lower()}: {record.getMessage()}\n")
        except Exception:  # a closed stream: never fail a run for a warning
            self.handleError(record)


def _library_warnings_one_line() -> None:
    """Show the library's warnings (``fedfdp.*`` loggers) once each, as ``warning: message``
    on stderr (without a handler Python's last-resort one would print them bare).
    """
    logger = logging.getLogger("fedfdp")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        handler = _StderrLines(logging.WARNING)
        logger.addHandler(handler)


def cmd_run(args: argparse.Namespace) -> int:
    """``fedfdp run``."""
    from fedfdp.data import load_dataset, resolve_devices
    from fedfdp.outputs import CONFIG_FILE, prepare_output_dir
    from simulations.resources import check_data_memory

    if args.resume:
        if args.out or args.config:
            raise ConfigError("--resume DIR: reads DIR/config.toml; drop --out/--config")
        cfg = build_config(str(Path(args.resume) / CONFIG_FILE), [*(args.set or []), "resume=true"],
                           args.resume)
    else:
        if not args.out:
            raise ConfigError("--out DIR is required (or --resume DIR)")
        cfg = build_config(args.config, args.set or [], args.out)
    prepare_output_dir(cfg.run.out_dir, "--out", create=False)  # a file, too long, read-only: refused
    _check_data_path(cfg)
    check_data_memory(cfg)  # a generated dataset that cannot fit: refused before it is made
    data = load_dataset(cfg.data)  # fail on bad data before any work
    cfg = resolve_devices(cfg, data)  # num-devices = 0: one device per unit of device-column
    if args.centralised:  # --supernodes is only range-checked (no SuperNodes here)
        if args.supernodes is not None and not 1 <= args.supernodes <= cfg.data.num_devices:
            raise ConfigError(f"--supernodes={args.supernodes}: must be in "
                              f"1..num-devices={cfg.data.num_devices}")
        supernodes = args.supernodes
    else:  # secagg: the default raised to n_min, fewer refused before the run directory exists
        supernodes = supernodes_for(cfg, args.supernodes)
    found = _check_run_dir(cfg, data)  # and on an unreachable target ε, an occupied or mismatched out-dir
    _check_model_and_data(cfg, data)  # a user's model or data that cannot train, on either path
    out = prepare_output_dir(cfg.run.out_dir, "--out")
    if args.centralised:
        from fedfdp.algorithm import run_centralised

        _library_warnings_one_line()  # the engine's own warnings (reproducible-noise: once)
        run_centralised(cfg, data)
    else:
        if cfg.privacy.reproducible_noise:  # the ServerApp's log is not shown: say it here, once
            print(f"warning: {REPRODUCIBLE_WARNING}", file=sys.stderr)
        if found is not None:
            print(_resuming_line(cfg.run.out_dir, found, cfg.run.checkpoint_every), file=sys.stderr)
        try:
            run_simulation_for(cfg, verbose=args.verbose, supernodes=supernodes)
        except SimulationError as exc:
            return _simulation_failed(exc)
    return _summarise(out, cfg)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` to the ``fedfdp`` parser."""
    run = sub.add_parser(
        "run", help="one federated training run",
        epilog="Configuration keys (--set KEY=VALUE, or an experiment TOML): `fedfdp keys` lists every key "
        "with its type, default, whether it defines the privacy guarantee and its meaning "
        "(docs/configuration.md).",
    )
    run.add_argument("--config", help="experiment TOML (flat kebab-case keys)")
    run.add_argument("--out", help="output directory")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a key (fedfdp keys lists them)")
    run.add_argument(
        "--centralised", action="store_true", help="run the single-machine reference instead of Flower"
    )
    run.add_argument("--verbose", action="store_true", help="show Flower and Ray logs")
    run.add_argument(
        "--supernodes", type=int, metavar="N",
        help="virtual SuperNodes of the simulation (default: one per core; one per device up to 8 devices)",
    )
    run.set_defaults(func=cmd_run)
