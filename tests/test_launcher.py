"""A simulated run stops with its launcher (strategies/launcher.py)."""

import subprocess
import sys
import threading

from strategies.launcher import launcher_alive, launcher_token, watch_launcher


def test_a_live_launcher_is_alive_a_dead_or_reused_pid_is_not():
    assert launcher_alive(launcher_token())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    token = launcher_token(child.pid)
    child.wait()
    assert not launcher_alive(token)
    pid, _, start = launcher_token().partition(":")
    assert not launcher_alive(f"{pid}:{int(start) + 1}")  # same pid, another start time


def test_the_watch_fires_once_the_launcher_dies():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    gone = threading.Event()
    thread = watch_launcher(launcher_token(child.pid), gone.set, period=0.05)
    assert thread is not None and not gone.is_set()
    child.wait()
    assert gone.wait(5)
    assert watch_launcher(None, gone.set) is None  # not launched by fedfdp run: no watch
