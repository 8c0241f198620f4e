"""Real Flower deployments on loopback for the integration tests (tests/test_deploy.py).

:class:`Deployment` starts a ``flower-superlink`` and ``flower-supernode``
processes on 127.0.0.1 with ports chosen at test time, runs the app with
``flwr run``, and always cleans up: every process starts in its own process
group (``start_new_session=True``), every wait is bounded, and
:meth:`Deployment.close` signals whole groups (TERM, then KILL) and checks that
no process of theirs is left.

Every process gets its own ``FLWR_HOME`` under the test's temporary folder, so
nothing is written to ``~/.flwr`` and parallel runs cannot share state.

:func:`stage_app` copies the Flower App (the repository root) into a temporary
folder before ``flwr run``: with flwr 1.41 and 1.42, ``flwr run APP`` rewrites
``APP/pyproject.toml`` when it holds a legacy ``[tool.flwr.federations]`` table
(it comments the table out and moves it to ``$FLWR_HOME/config.toml``), and a
test must never modify the checkout.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
APP_PACKAGES = ("fedfdp", "clients", "strategies")


def tool(name: str) -> str:
    """Path of a Flower CLI tool installed next to this Python."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name}: not found next to {sys.executable} nor on PATH")
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stage_app(dest: Path, *, clientapp: str | None = None, extra_files: Sequence[Path] = ()) -> Path:
    """Copy the Flower App into ``dest`` and return it.

    ``clientapp`` replaces the ClientApp component (``module:attr``);
    ``extra_files`` are copied to the app's root (e.g. a test-only ClientApp).
    """
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in APP_PACKAGES:
        shutil.copytree(REPO / pkg, dest / pkg, ignore=ignore)
    for name in ("README.md",):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)
    text = (REPO / "pyproject.toml").read_text()
    if clientapp is not None:
        text, n = re.subn(r'(?m)^clientapp\s*=\s*".*"$', f'clientapp = "{clientapp}"', text)
        if n != 1:
            raise RuntimeError("pyproject.toml: no single 'clientapp = ...' line to replace")
    (dest / "pyproject.toml").write_text(text)
    for f in extra_files:
        shutil.copy2(f, dest / Path(f).name)
    return dest


# ----------------------------------------------------------------- certificates
@dataclass(frozen=True)
class TLSFiles:
    """A self-signed CA and a server certificate for 127.0.0.1 / localhost (PEM)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_tls(folder: Path) -> TLSFiles:
    """Generate a CA and a server certificate signed by it, valid for 127.0.0.1 and localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedfdp test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = TLSFiles(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    files.ca_cert.write_bytes(ca.public_bytes(pem))
    files.server_cert.write_bytes(cert.public_bytes(pem))
    files.server_key.write_bytes(
        key.private_bytes(
            pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    return files


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """An EC (P-384) SuperNode key pair in OpenSSH format: ``(private, public)`` paths.

    This is the format flwr 1.42 reads: ``flower-supernode --auth-supernode-private-key``
    loads an OpenSSH private key, ``flwr supernode register`` an OpenSSH public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = folder / name
    public = folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return private, public


# -------------------------------------------------------------------- processes
@dataclass
class Proc:
    """One started process (the leader of its own process group) and its log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pgid(self) -> int:
        return self.popen.pid  # start_new_session: the leader's pid is the group id

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass(frozen=True)
class _PInfo:
    pid: int
    ppid: int
    pgid: int
    state: str
    start: int  # start time in clock ticks since boot: tells a reused pid apart
    cpu: int  # utime + stime + cutime + cstime, clock ticks


def _ps() -> dict[int, _PInfo]:
    """The process table from /proc (empty where there is none)."""
    table: dict[int, _PInfo] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the parenthesised command: state ppid pgrp session ... (man 5 proc)
        rest = stat[stat.rindex(")") + 2 :].split()
        try:
            pid = int(entry.name)
            cpu = sum(int(x) for x in rest[11:15])
            table[pid] = _PInfo(pid, int(rest[1]), int(rest[2]), rest[0], int(rest[19]), cpu)
        except (ValueError, IndexError):
            continue
    return table


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def wait_until(predicate, timeout: float, interval: float = 0.25, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; ``TimeoutError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f}s")
        time.sleep(interval)


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


@dataclass
class Deployment:
    """A SuperLink and SuperNodes on loopback, under ``root`` (a temporary folder).

    Use as a context manager (or call :meth:`close` in ``finally``).
    """

    root: Path
    tls: TLSFiles | None = None
    supernode_auth: bool = False
    procs: list[Proc] = field(default_factory=list)
    port: int = 0
    connection: str = "fedfdp-test"

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.cli_home = self.root / "flwr-cli"
        self._pgids: set[int] = set()
        # every process seen as ours: a leader we started or a descendant of one, with its
        # parent, group and start time. Flower starts some children in a session of their own
        # (the SuperLink's SuperExec, hence the ServerApp), so process groups alone miss them;
        # a background thread records descendants while their parents are alive.
        self._known: dict[int, _PInfo] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tracker = threading.Thread(target=self._track_loop, name="deploy-tracker", daemon=True)
        self._tracker.start()
        if self.supernode_auth and self.tls is None:
            raise ValueError("SuperNode authentication needs TLS (flwr refuses it with --insecure)")

    def _track_loop(self) -> None:
        while not self._stop.wait(0.5):
            self.track()

    def track(self) -> dict[int, _PInfo]:
        """Record the current descendants of our processes; return the live (non-zombie) ones."""
        with self._lock:
            table = _ps()
            alive = {
                pid: info
                for pid, info in table.items()
                if pid in self._known and self._known[pid].start == info.start
            }
            grew = True
            while grew:
                grew = False
                for pid, info in table.items():
                    if pid not in alive and (info.ppid in alive or info.pgid in self._pgids):
                        alive[pid] = info
                        self._known.setdefault(pid, info)
                        grew = True
            return {pid: info for pid, info in alive.items() if info.state != "Z"}

    # -- context manager
    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- processes
    def _env(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(home)
        env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"  # never `uv sync` an environment
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"  # no network lookup from the CLI
        env["PYTHONUNBUFFERED"] = "1"
        env["COLUMNS"] = "200"  # the CLI's tables and panels, unwrapped
        env.pop("FLWR_LOG_LEVEL", None)
        return env

    def spawn(
        self, name: str, cmd: Sequence[str], *, home: Path | None = None, cwd: Path | None = None
    ) -> Proc:
        """Start ``cmd`` in its own session/process group, output to ``root/NAME.log``;
        ``FLWR_HOME`` is ``home`` (default ``root/home-NAME``), the working directory ``cwd``
        (default: ``FLWR_HOME``)."""
        home = home or self.root / f"home-{name}"
        home.mkdir(parents=True, exist_ok=True)
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(cwd or home),
                env=self._env(home),
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        with self._lock:
            self._pgids.add(popen.pid)
        self.track()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_superlink(
        self, timeout: float = 60.0, *, database: Path | None = None, name: str = "superlink"
    ) -> Proc:
        """Start ``flower-superlink`` and wait until it accepts connections: on a free port the
        first time (another port if that one was taken meanwhile), on the same port again (a
        restart). ``database`` keeps the SuperLink's state (registered nodes, runs) in a file,
        so a restarted SuperLink knows its nodes."""
        if self.port:
            return self._start_superlink(timeout, database, name)
        for attempt in range(3):
            (self.port,) = free_ports(1)
            try:
                return self._start_superlink(timeout, database, name)
            except RuntimeError as exc:
                if "address already in use" not in str(exc).lower() or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start_superlink(self, timeout: float, database: Path | None, name: str) -> Proc:
        cmd = [tool("flower-superlink"), "--port", str(self.port)]
        cmd.append("--disable-runtime-dependency-installation")  # never `uv sync` the app's deps
        if database is not None:
            cmd += ["--database", str(database)]
        if self.tls is None:
            cmd.append("--insecure")
        else:
            cmd += [
                "--ssl-ca-certfile",
                str(self.tls.ca_cert),
                "--ssl-certfile",
                str(self.tls.server_cert),
                "--ssl-keyfile",
                str(self.tls.server_key),
            ]
        if self.supernode_auth:
            cmd.append("--enable-supernode-auth")
        link = self.spawn(name, cmd, home=self.root / "home-superlink")

        def ready() -> bool:
            if not link.alive():
                code = link.popen.returncode
                raise RuntimeError(f"flower-superlink exited ({code}):\n{link.text()[-3000:]}")
            return port_open(self.port)

        wait_until(ready, timeout, what="SuperLink listening")
        self.write_connection()
        return link

    def start_supernode(
        self,
        partition: int,
        num_partitions: int,
        *,
        name: str | None = None,
        private_key: Path | None = None,
        node_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        worker: bool = False,
        launcher: Sequence[str] | None = None,
    ) -> Proc:
        """Start ``flower-supernode`` serving partition ``partition`` of ``num_partitions``.

        ``worker``: the SuperNode runs with ``--isolation process`` and one long-lived
        ``python -m clients.worker`` (started here, logged to ``root/NAME-worker.log``)
        runs all its ClientApp tasks, instead of one ``flwr-clientapp`` process per message.
        ``launcher``: the command that stands for ``flower-supernode`` (benchmarks' what-ifs)."""
        (port,) = free_ports(1)
        config = {"partition-id": partition, "num-partitions": num_partitions, **(node_config or {})}
        cmd = [
            *(launcher or [tool("flower-supernode")]),
            "--superlink",
            f"{HOST}:{self.port}",
            "--port",
            str(port),
            "--node-config",
            " ".join(f"{k}={_toml_value(v)}" for k, v in config.items()),
            *extra_args,
        ]
        if self.tls is None:
            cmd.append("--insecure")
        else:
            cmd += ["--root-certificates", str(self.tls.ca_cert)]
        if private_key is not None:
            cmd += ["--auth-supernode-private-key", str(private_key)]
        if worker:
            cmd += ["--isolation", "process"]
        name = name or f"supernode-{partition}"
        node = self.spawn(name, cmd)
        if worker:
            self.spawn(f"{name}-worker", [sys.executable, "-m", "clients.worker", "--runtime-api-address",
                                          f"{HOST}:{port}"], home=self.root / f"home-{name}", cwd=REPO)
        return node

    # -- the Flower CLI
    def write_connection(self) -> Path:
        """``$FLWR_HOME/config.toml`` for the CLI, naming this SuperLink as ``self.connection``."""
        conn: dict[str, Any] = {"address": f"{HOST}:{self.port}"}
        if self.tls is None:
            conn["insecure"] = True
        else:
            conn["root-certificates"] = str(self.tls.ca_cert.resolve())
        doc = {"superlink": {"default": self.connection, self.connection: conn}}
        self.cli_home.mkdir(parents=True, exist_ok=True)
        path = self.cli_home / "config.toml"
        path.write_text(tomli_w.dumps(doc))
        return path

    def cli(self, args: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run ``flwr ARGS`` with this deployment's ``FLWR_HOME`` (bounded; own process group)."""
        env = self._env(self.cli_home)
        popen = subprocess.Popen(
            [tool("flwr"), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(self.root),
            text=True,
            start_new_session=True,
        )
        with self._lock:
            self._pgids.add(popen.pid)
        try:
            out, _ = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(popen.pid, signal.SIGKILL)
            out, _ = popen.communicate()
            what = f"flwr {' '.join(args)}: no exit within {timeout:.0f}s"
            raise TimeoutError(f"{what}\n{out[-3000:]}") from None
        return subprocess.CompletedProcess(popen.args, popen.returncode, out, "")

    def _run_args(self, app: Path, run_config: Mapping[str, Any], name: str) -> list[str]:
        overrides = self.root / f"{name}-config.toml"
        overrides.write_text(tomli_w.dumps(dict(run_config)))
        return ["run", str(app), self.connection, "--stream", "--run-config", str(overrides)]

    def run_app(
        self, app: Path, run_config: Mapping[str, Any], timeout: float = 180.0
    ) -> subprocess.CompletedProcess:
        """``flwr run APP CONNECTION --stream --run-config FILE`` (overrides written to a TOML
        file), waited for at most ``timeout`` s; stdout holds the streamed logs."""
        return self.cli(self._run_args(app, run_config, "run"), timeout=timeout)

    def start_run(self, app: Path, run_config: Mapping[str, Any], name: str = "flwr-run") -> Proc:
        """Like :meth:`run_app`, without waiting: the streamed logs go to ``root/NAME.log``."""
        cmd = [tool("flwr"), *self._run_args(app, run_config, name)]
        return self.spawn(name, cmd, home=self.cli_home, cwd=self.root)

    # -- faults and cleanup
    def _subtree(self, root: int) -> list[int]:
        """``root`` and every known process descended from it (recorded parent links)."""
        with self._lock:
            known = dict(self._known)
        tree, grew = {root}, True
        while grew:
            grew = False
            for pid, info in known.items():
                if pid not in tree and info.ppid in tree:
                    tree.add(pid)
                    grew = True
        return sorted(tree)

    def processes_of(self, proc: Proc) -> list[tuple[int, str]]:
        """Live processes of ``proc``'s subtree (as recorded): ``(pid, cmdline)``."""
        live = self.track()
        return [(pid, _cmdline(pid)) for pid in self._subtree(proc.popen.pid) if pid in live]

    def kill(self, proc: Proc, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send ``sig`` to ``proc``'s process group and to every process descended from it
        (also those in sessions of their own); reap the leader. Bounded."""
        live = self.track()
        targets = [pid for pid in self._subtree(proc.popen.pid) if pid in live]
        _kill_group(proc.pgid, sig)
        for pid in targets:
            _kill_group(live[pid].pgid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=timeout)

    def cpu_seconds(self) -> float:
        """CPU time (user + system, seconds) of this deployment's live processes, including
        the children they have reaped (e.g. every ClientApp process a SuperNode ran). Linux
        only (0.0 elsewhere); a measure of cost that does not depend on machine load."""
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        return sum(info.cpu for info in self.track().values()) / tick

    def leftover(self) -> list[tuple[int, int, str]]:
        """Live processes of this deployment: ``(pid, pgid, cmdline)``."""
        if not Path("/proc").is_dir():  # not Linux: signal 0 to the groups
            found = []
            for g in self._pgids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(g, 0)
                    found.append((g, g, "?"))
            return found
        return [(pid, info.pgid, _cmdline(pid)) for pid, info in sorted(self.track().items())]

    def _signal_all(self, sig: int) -> None:
        live = self.track()
        for pgid in set(self._pgids) | {info.pgid for info in live.values()}:
            _kill_group(pgid, sig)

    def close(self, grace: float = 5.0) -> None:
        """TERM every process of ours (their groups), wait up to ``grace`` s, KILL what is
        left, reap; raise ``RuntimeError`` if any process survives."""
        try:
            self._signal_all(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.leftover() and time.monotonic() < deadline:
                time.sleep(0.1)
            self._signal_all(signal.SIGKILL)
            for p in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(timeout=5)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: not self.leftover(), 10.0, what="processes gone")
        finally:
            self._stop.set()
            self._tracker.join(timeout=5)
        left = self.leftover()
        if left:
            raise RuntimeError(f"processes left after cleanup: {left}")

    def logs(self) -> str:
        """All process logs, for assertion messages."""
        return "\n".join(f"===== {p.name} =====\n{p.text()[-4000:]}" for p in self.procs)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies (Linux), so a test
    runner killed hard leaves no SuperLink/SuperNode behind. Their own children exit with them
    (Flower's SuperExec watches its parent's pid)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    return '"' + str(v).replace('"', '\\"') + '"'
