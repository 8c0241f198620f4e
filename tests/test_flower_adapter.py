"""clients/flower_adapter.py: the only module that imports Flower internals, and it
refuses any Flower outside the pinned release range, loudly, before using them."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import flwr
import pytest

REPO = Path(__file__).resolve().parents[1]

#: Flower's public API: everything else under ``flwr.`` is an internal.
PUBLIC = ("flwr.app", "flwr.serverapp", "flwr.clientapp", "flwr.simulation")
#: Files that still import Flower internals directly, waiting for their owners to
#: switch to the adapter (its set_task_identity; shorten_supernode_waits,
#: shorten_grid_object_pulls, run_flower_supernode). Remove an entry once switched:
#: the test fails on a stale entry as on a new offender.
PENDING: set[str] = set()


@pytest.fixture(scope="module")
def adapter():
    """The adapter, imported by the tests (an unsupported Flower fails each test, loudly,
    rather than the collection of the whole suite)."""
    from clients import flower_adapter

    return flower_adapter


def _pinned_range() -> str:
    """The flwr requirement in pyproject.toml's dependencies, read as text."""
    text = (REPO / "pyproject.toml").read_text()
    match = re.search(r'"flwr\[simulation\]([^"]+)"', text)
    assert match, "pyproject.toml: no flwr[simulation] dependency"
    return match[1]


def test_adapter_supports_exactly_the_pinned_range(adapter):
    assert _pinned_range() == adapter.SUPPORTED_FLOWER
    (lo_major, lo_minor), (hi_major, hi_minor) = adapter.SUPPORTED_RANGE
    assert _pinned_range() == f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"


@pytest.mark.parametrize("version", ["1.41.0", "1.41.9", "1.43.0", "1.43.0rc1", "2.0.0", "0.42.0", "dev", ""])
def test_check_refuses_an_unsupported_flower_in_one_line(adapter, monkeypatch, version):
    monkeypatch.setattr(flwr, "__version__", version)
    with pytest.raises(adapter.FlowerVersionError) as info:
        adapter.check_flower_version()
    message = str(info.value)
    assert "\n" not in message
    assert f"flwr {version} is installed" in message
    assert ">=1.42,<1.43" in message


@pytest.mark.parametrize("version", ["1.42.0", "1.42.1", "1.42.17", "1.42.0rc2"])
def test_check_accepts_the_supported_releases(adapter, monkeypatch, version):
    monkeypatch.setattr(flwr, "__version__", version)
    assert adapter.check_flower_version() == version


def test_the_installed_flower_is_supported(adapter):
    from importlib.metadata import version

    assert adapter.check_flower_version() == version("flwr") == adapter.FLOWER_VERSION


def _import_with_flower(version: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter whose imported Flower claims ``version``."""
    prelude = f"import flwr; flwr.__version__ = {version!r}; "
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("code", [
    "import runpy; runpy.run_module('clients.worker', run_name='__main__')",  # python -m clients.worker
    "import strategies.server_app",  # the ServerApp a SuperLink loads
])
def test_worker_and_server_app_refuse_an_unsupported_flower_at_import(code):
    res = _import_with_flower("1.41.0", code)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("clients.flower_adapter.FlowerVersionError: flwr 1.41.0 is installed; "
                           "fedfdp supports flwr>=1.42,<1.43"), res.stderr[-2000:]


def _flower_imports(path: Path) -> set[str]:
    """Modules under ``flwr`` that ``path`` imports: import statements, and import
    lines inside string constants (code handed to ``python -c``)."""
    text = path.read_text()
    found = set(re.findall(r"(?:^|[;\s\"'])(?:from|import)\s+(flwr(?:\.\w+)*)", text, flags=re.M))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "flwr" or m.startswith("flwr.")}


def test_no_module_but_the_adapter_imports_flower_internals():
    offenders = {}
    for folder in ("fedfdp", "clients", "strategies", "simulations", "benchmarks", "tests", "examples",
                   "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            # the adapter, and this file (which names internals on purpose, to test the adapter)
            if rel in ("clients/flower_adapter.py", "tests/test_flower_adapter.py") or "__pycache__" in rel:
                continue
            internal = sorted(m for m in _flower_imports(path)
                              if m not in ("flwr", "flwr.common") and not m.startswith(PUBLIC))
            if internal:
                offenders[rel] = internal
    assert set(offenders) - PENDING == set(), {k: v for k, v in offenders.items() if k not in PENDING}
    assert PENDING - set(offenders) == set(), "switched to the adapter: remove from PENDING"


def test_the_scan_sees_internal_imports_where_they_are():
    """The scan is not vacuous: it finds the adapter's own internal imports, in code and in strings."""
    found = _flower_imports(REPO / "clients" / "flower_adapter.py")
    assert {"flwr.supercore.runtime", "flwr.superlink.grid", "flwr.supernode.runtime.run_clientapp"} <= found
    assert "flwr.supernode.start_client_internal" in found  # imported as ``import ... as loop``


def test_error_reply_carries_the_exception_as_flwr_clientapp_does(adapter):
    from flwr.app import Message, RecordDict

    from tests.flower_helpers import set_identity

    set_identity()
    message = Message(RecordDict(), dst_node_id=3, message_type="train")
    message.metadata.__dict__["_message_id"] = "m1"  # as a pulled message carries its id
    reply, details = adapter.error_reply(message, ZeroDivisionError("division by zero"))
    assert reply is not None and reply.has_error()
    assert reply.error.reason == details == "<class 'ZeroDivisionError'>:<'division by zero'>"
    assert reply.metadata.reply_to_message_id == "m1"
    assert adapter.error_reply(None, ValueError("x")) == (None, "<class 'ValueError'>:<'x'>")


def test_runtime_endpoint_refuses_an_address_without_a_port(adapter):
    with pytest.raises(ValueError, match=r"address='localhost': expected HOST:PORT"):
        adapter.RuntimeEndpoint("localhost")


def test_what_if_patches_replace_the_waits_they_name():
    """The benchmark's what-ifs patch what they say (in a fresh process: they rebind
    module attributes of Flower's SuperNode loop and Grid)."""
    code = (
        "import functools, time\n"
        "from clients.flower_adapter import shorten_grid_object_pulls, shorten_supernode_waits\n"
        "import flwr.supernode.start_client_internal as loop\n"
        "import flwr.superlink.grid.http_grid as grid\n"
        "slept = []\n"
        "time.sleep = slept.append\n"  # the patched loop sleeps through time.sleep
        "shorten_supernode_waits(0.02, initial_backoff=0.01, backoff_cap=0.2)\n"
        "shorten_grid_object_pulls(initial_backoff=0.03, backoff_cap=0.3)\n"
        "loop.time.sleep(3); loop.time.sleep(0.5); loop.time.sleep(7)\n"
        "assert loop.time.monotonic is time.monotonic\n"
        "print(slept, loop.pull_objects.keywords, grid.pull_objects.keywords)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == ("[0.02, 0.02, 7] {'initial_backoff': 0.01, 'backoff_cap': 0.2} "
                                  "{'initial_backoff': 0.03, 'backoff_cap': 0.3}")
