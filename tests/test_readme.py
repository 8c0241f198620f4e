"""The README: CI's test command, the ε wording, its length, and every snippet runs.

Each fenced ``python`` block runs as a script in a fresh process (cwd: a
temporary directory, the repository on ``PYTHONPATH``); a block that defines a
``ServerApp`` and a ``ClientApp`` is also run end to end on Flower's
simulation engine. Each ``fedfdp ...`` command of a ``bash`` block is parsed by
the real command-line parser, and its configuration (files and ``--set``
overrides) is validated as the command itself would; ``fedfdp account`` is
cheap and runs for real.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fedfdp.config import ConfigError, load_config, load_toml_file, parse_override
from simulations.cli import main as cli_main
from simulations.cli import make_parser
from simulations.compare_plan import parse_sweep, plan_runs
from simulations.run import build_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
#: README's limit (issue 24)
MAX_LINES = 300


def blocks(language: str) -> list[str]:
    """The bodies of the README's fenced blocks in ``language``."""
    return [body for lang, body in FENCE.findall(README) if lang == language]


def fedfdp_commands() -> list[list[str]]:
    """Every ``fedfdp ...`` command of the bash blocks, as argv (without ``fedfdp``)."""
    commands = []
    for body in blocks("bash"):
        text = body.replace("\\\n", " ")
        for line in text.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "fedfdp":
                    commands.append(words[1:])
    return commands


PYTHON_BLOCKS = blocks("python")
COMMANDS = fedfdp_commands()


def test_ci_runs_the_readme_test_commands():
    """CI runs the README's test command (the fast tier, with ruff and mypy over every tree)
    and the README's end-to-end tier, each as the README writes it."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    tests = [line for line in lines if "pytest" in line and not line.startswith("#")]
    assert len(tests) == 2
    assert tests[0].startswith("python3 -m venv") and tests[0].endswith('-m "not slow"')
    assert "mypy fedfdp clients strategies simulations tests benchmarks" in tests[0]
    assert tests[1].endswith("-m slow")
    assert all(line in README for line in tests)


def test_readme_names_relation_and_delta_for_every_epsilon_table():
    assert "add/remove" in README and "δ" in README and "upper" in README


def test_readme_is_short():
    assert len(README.splitlines()) <= MAX_LINES


def test_readme_has_snippets_to_check():
    # the Flower app, the run without Flower; the four quickstart commands and the default run
    assert len(PYTHON_BLOCKS) >= 2
    assert {argv[0] for argv in COMMANDS} >= {"run", "compare", "account", "audit"}


def run_snippet(code: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = cwd / "snippet.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_block_runs(index, tmp_path):
    code = PYTHON_BLOCKS[index]
    flower = "ServerApp()" in code and "ClientApp()" in code
    if flower:  # the apps are only defined by the snippet: run them on the simulation engine
        code += (
            "\nfrom flwr.simulation import run_simulation\n"
            "run_simulation(server_app=server_app, client_app=client_app, num_supernodes=3)\n"
        )
    done = run_snippet(code, tmp_path)
    assert done.returncode == 0, f"README python block {index} failed:\n{done.stderr[-3000:]}"
    if flower:
        # the strategy ran its three rounds and printed ε, calibrated never above its target
        found = re.findall(r"^epsilon: (\S+)", done.stdout, re.M)
        assert len(found) == 1, done.stdout[-2000:]
        assert 0 < float(found[0]) <= 2.0


def sets_of(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--set"]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:2]) for a in COMMANDS])
def test_fedfdp_command_is_valid(argv, tmp_path, capsys, monkeypatch):
    args = make_parser().parse_args(argv)  # exits (status 2) on an unknown subcommand or flag
    keys = {}  # every overridden key exists and its value is accepted, together with the others
    for item in sets_of(argv):
        key, value = parse_override(item)
        if not (args.command == "compare" and key in ("modes", "target-epsilons", "seeds")):
            keys[key] = value
    load_config(keys)
    monkeypatch.chdir(ROOT)
    if args.command == "run":
        assert args.resume is None
        build_config(args.config, args.set or [], str(tmp_path / "out"))
    elif args.command == "compare":
        sweep = parse_sweep(load_toml_file(args.config) if args.config else {}, args.set or [])
        assert plan_runs(sweep, tmp_path)
    elif args.command == "account":
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        # the calibrated σ ends at, never above, the target; both relations are named
        target = float(args.target_epsilon)
        add_remove = re.search(r"^ε add/remove\s+(\S+)\s+\(upper bound, add/remove, δ = ", out, re.M)
        assert add_remove is not None, out
        assert target - 0.05 <= float(add_remove.group(1)) <= target
        assert re.search(r"^ε replacement\s+\S+\s+\(upper bound, replacement", out, re.M), out


def test_a_bad_set_key_is_caught():
    # the check above can fail: an unknown key is refused with its name
    with pytest.raises(ConfigError, match="num-round"):
        load_config(dict([parse_override("num-round=1")]))
