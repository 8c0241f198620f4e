"""Every process a ``fedfdp`` command starts is gone when it returns (issue 24).

``fedfdp run`` on Flower's simulation engine starts a SuperLink, a SuperExec,
the simulation runtime and Ray (its GCS server, raylet and ``ray::`` workers).
After the command returns, none of them may remain: the test lists, from
``/proc``, every process started after the command whose session is the
command's own (descendants keep it unless they call ``setsid``) or whose
command line names Flower's or Ray's processes, and waits a few seconds for them
to go.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "simulations.cli"]
#: Command lines of the processes Flower's simulation and Ray start.
SPAWNED = re.compile(
    r"ray::|raylet|gcs_server|dashboard|flower-superlink|flower-superexec|flwr-simulation|flwr run"
)


def _stat(pid: int) -> tuple[int, int] | None:
    """(session id, start time in clock ticks) of ``pid``, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[3]), int(fields[19])  # session (field 6), starttime (field 22)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _left_behind(session: int, started: int) -> list[tuple[int, str]]:
    """Processes started at or after ``started`` in ``session``, or naming Flower/Ray."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        st = _stat(pid)
        if st is None or st[1] < started:
            continue
        cmd = _cmdline(pid)
        if st[0] == session or SPAWNED.search(cmd):
            out.append((pid, cmd[:160]))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_fedfdp_run_on_flower_leaves_no_process_behind(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*CLI, "run", "--out", str(tmp_path / "run"), "--set", "num-rounds=2",
                             "--set", "num-devices=6", "--set", "records-per-device=40"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    stat = _stat(proc.pid)
    assert stat is not None
    session, started = proc.pid, stat[1]
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert (tmp_path / "run" / "model.pt").is_file()
    deadline = time.monotonic() + 20
    left = _left_behind(session, started)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _left_behind(session, started)
    assert not left, f"processes left behind by fedfdp run: {left}"


def test_the_check_sees_a_process_left_in_the_commands_session():
    """The detector itself: a command that returns while its child sleeps on is caught."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc (Linux)")
    proc = subprocess.Popen(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    stat = _stat(proc.pid)
    assert stat is not None
    out, _ = proc.communicate(timeout=10)
    child = int(out.split()[0])
    try:
        assert any(pid == child for pid, _ in _left_behind(proc.pid, stat[1]))
    finally:
        os.kill(child, 9)
    deadline = time.monotonic() + 5
    while any(pid == child for pid, _ in _left_behind(proc.pid, stat[1])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid == child for pid, _ in _left_behind(proc.pid, stat[1]))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_ctrl_c_in_a_flower_run_exits_130_and_leaves_no_process_behind(tmp_path):
    """Ctrl-C (SIGINT) once rounds run: one line, status 130, and no SuperLink, SuperExec
    or Ray process (GCS, raylet, ``ray::`` agents and actors) left behind."""
    import signal

    out = tmp_path / "run"
    proc = subprocess.Popen([*CLI, "run", "--out", str(out), "--set", "num-rounds=5000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    stat = _stat(proc.pid)
    assert stat is not None
    deadline = time.monotonic() + 300
    while not (out / "metrics.csv").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=300)  # stopping Flower's and Ray's processes: slow on a busy machine
    assert proc.returncode == 130, text[-2000:]
    assert "interrupted:" in text.splitlines()[-1]
    left = _left_behind(proc.pid, stat[1])
    end = time.monotonic() + 60
    while left and time.monotonic() < end:
        time.sleep(0.5)
        left = _left_behind(proc.pid, stat[1])
    assert not left, f"processes left behind after Ctrl-C: {left}"
