"""What a run prints: plain text when stderr is not a terminal, the auc line only where AUC
is expected, and the environment check of the ``flwr run .`` ServerApp.

Fast (a 3-round centralised run and string work); no Flower process starts here.
"""

from __future__ import annotations

import io
import sys
import tomllib
from pathlib import Path

import pandas as pd

from simulations.cli import main
from simulations.plain_output import PlainText
from simulations.run import empty_auc_line
from strategies.app_environment import InstalledFedfdp, environment_mismatch, installed_fedfdp

ROOT = Path(__file__).resolve().parents[1]
BAR = "\x1b[32mbar\x1b[0m"


# ----------------------------------------------------------------------- plain text

def test_plain_text_keeps_each_lines_last_state_without_escape_codes():
    out = io.StringIO()
    plain = PlainText(out)
    plain.write("\r 10%|#  | 1/10")
    plain.write("\r 50%|##  | 5/10\r100%|###| 10/10")
    assert out.getvalue() == ""  # nothing until the line ends
    plain.write("\n\x1b[92mINFO \x1b[0m: done\nhalf")
    plain.finish()
    assert out.getvalue() == "100%|###| 10/10\nINFO : done\nhalf\n"
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    plain.write(BAR + "\n")
    assert out.getvalue().endswith("bar\n")


def test_a_redirected_run_prints_the_bar_once_the_result_and_the_files(tmp_path, capsys):
    out = tmp_path / "run"
    keys = {"num-devices": 3, "records-per-device": 40, "num-rounds": 3}
    assert main(["run", "--centralised", "--out", str(out),
                 *[a for k, v in keys.items() for a in ("--set", f"{k}={v}")]]) == 0
    std = capsys.readouterr()  # neither stream is a terminal here
    assert "\r" not in std.err and "\x1b" not in std.err
    bars = [line for line in std.err.splitlines() if "round/s" in line or "it/s" in line]
    assert len(bars) == 1 and "3/3" in bars[0], std.err
    lines = std.out.splitlines()
    assert lines[0].startswith("rounds=3 accuracy=") and "upper bound" in lines[0]
    assert lines[-1].startswith("wrote config.toml, metrics.csv")
    assert not any(line.startswith("auc") for line in lines)  # the fleet has 4 classes: no AUC expected


# ------------------------------------------------------------------------ the auc line

def test_the_auc_line_only_for_a_binary_task_whose_column_is_empty():
    empty = pd.DataFrame({"round": [1, 2], "auc": [float("nan")] * 2})
    filled = pd.DataFrame({"round": [1, 2], "auc": [0.7, 0.8]})
    assert empty_auc_line(empty, 4) == ""  # AUC is not defined for 4 classes: nothing to explain
    assert empty_auc_line(filled, 2) == ""
    assert empty_auc_line(pd.DataFrame({"round": [1]}), 2) == ""
    line = empty_auc_line(empty, 2)
    assert line.startswith("auc: empty in metrics.csv") and "\n" not in line


# ------------------------------------------------------------- the app's environment

def _app(root: Path, version: str, code: str) -> Path:
    (root / "fedfdp").mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "fedfdp"\nversion = "{version}"\n')
    (root / "fedfdp" / "core.py").write_text(code)
    return root


def test_this_repository_is_its_own_environments_app():
    installed = installed_fedfdp()
    assert installed is not None and installed.prefix == sys.prefix
    with (ROOT / "pyproject.toml").open("rb") as fh:
        assert installed.version == tomllib.load(fh)["project"]["version"]
    assert environment_mismatch(ROOT, installed) is None


def test_another_environments_fedfdp_is_refused_in_one_line(tmp_path):
    app = _app(tmp_path / "app", "0.2.0", "x = 1\n")
    same = _app(tmp_path / "same", "0.2.0", "x = 1\n")
    other = _app(tmp_path / "other", "0.2.0", "x = 2\n")
    env = "/other/venv"
    assert environment_mismatch(app, InstalledFedfdp("0.2.0", same, env), executable="/x/python") is None
    cases = {
        "code": (InstalledFedfdp("0.2.0", other, env), ["fedfdp/core.py differs", str(other)]),
        "version": (InstalledFedfdp("0.1.0", same, env), ["0.1.0", "0.2.0"]),
        "missing file": (InstalledFedfdp("0.2.0", tmp_path / "empty", env), ["fedfdp/core.py"]),
        "none": (None, ["no fedfdp installed"]),
    }
    for name, (installed, needles) in cases.items():
        line = environment_mismatch(app, installed, executable="/other/venv/bin/python")
        assert line is not None and "\n" not in line, name
        assert "/other/venv/bin/python" in line and "SuperLink" in line, name
        assert all(n in line for n in needles), (name, line)


def test_the_progress_bar_shows_what_the_round_evaluated():
    """A classifier's accuracy, a generative model's fd, nothing for a round without
    evaluation (never ``acc=nan``)."""
    import io

    from fedfdp.run_files import Progress

    def postfix(row):
        bar = Progress(total=2, initial=0, desc="run", enabled=True)
        bar.bar.fp = io.StringIO()
        bar.update(1.5, row)
        return bar.bar.postfix

    assert postfix({"accuracy": 0.91, "fd": None}) == "acc=0.910, eps=1.5"
    assert postfix({"accuracy": float("nan"), "fd": 10.2}) == "eps=1.5, fd=10.200"
    assert postfix({"accuracy": None}) == "eps=1.5"


def test_a_redirected_compare_prints_its_bar_once_without_cr(tmp_path, capsys):
    """``fedfdp compare`` with its progress bar on and stderr not a terminal: the bar's
    final line only (before: one CR-separated update per run, in the same line)."""
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('modes = ["nonprivate", "dp"]\ntarget-epsilons = [4.0]\nseeds = [0]\n'
                     "num-devices = 3\nrecords-per-device = 30\nnum-rounds = 2\n")
    assert main(["compare", "--config", str(sweep), "--out", str(tmp_path / "o")]) == 0
    std = capsys.readouterr()
    assert "\r" not in std.err and "\x1b" not in std.err
    bars = [line for line in std.err.splitlines() if line.startswith("compare")]
    assert len(bars) == 1 and "2/2" in bars[0], std.err
