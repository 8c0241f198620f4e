"""Classes of bad input beyond issue 23's 42 (``tests/test_bad_inputs.py``), one test per
class: each is refused in **one line naming the value** (status 2 on the command line; one
``ValueError``/``TypeError`` in Python) and **nothing is lost**.

The classes: a run stopped by a non-finite update (its charge kept, the way on said);
a user's model that is not finite (refused before the run directory exists); every count
bounded by what the machine can hold; secure aggregation's documented ranges, against the
derived neighbourhood too; a resume whose ``[resolved]`` table was edited or cut; every file
a user names that is not a regular file (FIFO, device, directory, a link to one); canaries
beyond the audited run; configuration sources that are not tables; the public constructors'
types and shapes; refusals that explain the key they name (not another); a crafted checkpoint
refused without torch's warnings; an empty held-out split named as such.

Most cases call the library or :func:`simulations.cli.main` in this process (cheap); three
make a tiny run (a few seconds each). Expected words are written here from the inputs,
never taken from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedfdp import Config, DeviceData, FeatureMap, FederatedData, PrivacyConfig, TrainInstruction, load_config
from fedfdp.checkpoint import CheckpointMismatch, load_checkpoint
from fedfdp.config import KEY_TABLE, ConfigError, Kind, Mode, PrivacyUnit, read_toml
from fedfdp.data.split import DataError, holdout_records
from fedfdp.data.tabular import read_table
from fedfdp.features import FeatureSpec
from fedfdp.input_files import optional_file, regular_file
from fedfdp.ledger import read_ledger
from simulations.cli import main, new_directories, remove_if_nothing_charged

TINY = {"num-devices": 3, "records-per-device": 40, "num-rounds": 2, "progress": "false"}
SPEC = FeatureSpec(("a", "b"), ("a",), ("b",))


def wrong(value: Any) -> Any:
    """``value`` as the type checker sees a caller's mistake: any type."""
    return value


def sets(mapping: dict[str, object]) -> list[str]:
    out: list[str] = []
    for key, value in mapping.items():
        out += ["--set", f"{key}={value}"]
    return out


def refused(capsys, argv: list[str], *needles: str) -> str:
    """``fedfdp ARGV`` exits 2 with one ``error:`` line holding every needle."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def charges(run: Path) -> int:
    return sum(1 for line in (run / "ledger.jsonl").read_text().splitlines()
               if json.loads(line).get("kind") == "charge")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny run (copied by each test that damages it)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(["run", "--centralised", "--out", str(run), *sets(TINY)]) == 0
    return run


def copy_of(run: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


# ------------------------------------------------ a run stopped in round 1: the charge stays, the way on said

def test_a_non_finite_update_keeps_its_charge_and_says_how_to_go_on(tmp_path, capsys):
    out = tmp_path / "out"
    line = refused(capsys, ["run", "--centralised", "--out", str(out),
                            *sets({**TINY, "noise-multiplier": 1e300})], "noise-multiplier", "round 1")
    assert charges(out) == 1  # the noise was drawn: the charge is never dropped
    assert "keeps the 1 charge" in line and f"--resume {out}" in line and "new --out" in line


# ------------------------------------------------ a model that is not finite: refused before --out exists

USER_MODELS = '''
import torch
from torch import nn


class Nan(nn.Module):
    def __init__(self, num_features, num_classes):
        super().__init__()
        self.lin = nn.Linear(num_features, num_classes)

    def forward(self, x):
        return self.lin(x) * float("nan")


def nan_outputs(num_features, num_classes):
    return Nan(num_features, num_classes)


def nan_weights(num_features, num_classes):
    lin = nn.Linear(num_features, num_classes)
    with torch.no_grad():
        lin.bias.fill_(float("inf"))
    return lin
'''


@pytest.mark.parametrize(("builder", "words"), [("nan_outputs", "non-finite outputs"),
                                                 ("nan_weights", "parameter 'bias' is not finite")])
def test_a_user_model_that_is_not_finite_is_refused_before_the_run_directory(tmp_path, capsys, monkeypatch,
                                                                             builder, words):
    (tmp_path / "sweep2_models.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "deep" / "out"
    refused(capsys, ["run", "--centralised", "--out", str(out),
                     *sets({**TINY, "model": f'"sweep2_models:{builder}"'})],
            f"model='sweep2_models:{builder}'", words)
    assert not (tmp_path / "deep").exists()
    sys.modules.pop("sweep2_models", None)


def test_a_refused_run_removes_only_the_folders_it_made_and_only_without_a_charge(tmp_path, finished_run):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "note.txt").write_text("the user's")
    made = new_directories(str(keep / "a" / "b"))
    assert made == [keep / "a" / "b", keep / "a"]
    (keep / "a" / "b").mkdir(parents=True)
    (keep / "a" / "b" / "config.toml").write_text("")
    remove_if_nothing_charged(made)
    assert not (keep / "a").exists() and (keep / "note.txt").read_text() == "the user's"
    charged = copy_of(finished_run, tmp_path / "c")
    remove_if_nothing_charged([charged])
    assert charges(charged) == 2  # a ledger with a charge stays
    assert new_directories(str(keep)) == []  # an existing folder is never the refusal's to remove
    nodes = tmp_path / "with-nodes"
    (nodes / "nodes" / "node-0").mkdir(parents=True)
    (nodes / "config.toml").write_text("")
    remove_if_nothing_charged([nodes])
    assert (nodes / "nodes" / "node-0").is_dir()  # the simulated nodes' own ledgers stay


# ------------------------------------------------ every count bounded by what the machine holds

INTEGER_KINDS = (Kind.INT_POS, Kind.INT0, Kind.ODD_POS, Kind.LEVELS)
INTEGER_KEYS = sorted(k for k, spec in KEY_TABLE.items() if spec.kind in INTEGER_KINDS)
NUMBER_KEYS = sorted(k for k, spec in KEY_TABLE.items() if spec.kind in (
    Kind.FLOAT_POS, Kind.FLOAT0, Kind.FLOAT01, Kind.FLOAT01_OPEN, Kind.UNIT, Kind.PROB))


def test_every_integer_and_number_key_is_bounded():
    assert len(INTEGER_KEYS) >= 15 and {"num-rounds", "num-devices", "public-batch-size",
                                        "hidden-size", "seed"} <= set(INTEGER_KEYS)
    for key in INTEGER_KEYS:
        with pytest.raises(ConfigError) as err:
            load_config({key: 10**30})
        assert str(err.value).startswith(f"{key}={10**30}: must be"), str(err.value)
        assert "\n" not in str(err.value)
    for key in NUMBER_KEYS:  # an integer beyond every float
        with pytest.raises(ConfigError) as err:
            load_config({key: 10**400})
        assert str(err.value).startswith(f"{key}=1000") and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="hidden-sizes="):
        load_config({"model": "mlp", "hidden-sizes": [2**40]})
    assert load_config({"num-rounds": 2**31 - 1}).privacy.num_rounds == 2**31 - 1
    assert load_config({"seed": 2**62}).training.seed == 2**62


def test_a_count_on_the_command_line_is_bounded_too(capsys):
    refused(capsys, ["run", "--centralised", "--out", "/nonexistent/never", *sets({"num-rounds": 10**30})],
            f"num-rounds={10**30}")
    refused(capsys, ["account", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--rounds", str(10**30),
                     "--delta", "1e-5"], f"--rounds={10**30}")


# ------------------------------------------------ secure aggregation's documented ranges

SECAGG = {"mode": "dp", "aggregation": "secagg", "secagg-min-survivors": 3, "clipping-quantile": 0,
          "num-devices": 3}


@pytest.mark.parametrize(("extra", "words"), [
    ({"secagg-neighbours": 5}, ("secagg-neighbours=5", "num-devices=3")),
    ({"secagg-threshold": 1}, ("secagg-threshold=1", "[2, 3]", "k=3")),
    ({"secagg-neighbours": 4}, ("secagg-neighbours=4", "odd", "SecAgg+ ring")),
])
def test_secagg_ranges_are_checked_always_and_against_the_derived_neighbourhood(extra, words):
    with pytest.raises(ConfigError) as err:
        load_config({**SECAGG, **extra})
    text = str(err.value)
    for word in words:
        assert word in text, (word, text)
    assert "kernel" not in text and "pixel" not in text  # each key's refusal explains that key
    assert load_config({**SECAGG, "secagg-threshold": 2}).privacy.secagg_threshold == 2


def test_the_blur_kernel_still_explains_the_kernel():
    with pytest.raises(ConfigError, match=r"blur-kernel=4: must be an odd integer >= 1 \(the kernel is cent"):
        load_config({"blur-kernel": 4})


# ------------------------------------------------ resume against the [resolved] table

@pytest.mark.parametrize("damage", ["edit", "cut"])
def test_a_resume_refuses_an_edited_or_missing_resolved_table(tmp_path, capsys, finished_run, damage):
    run = copy_of(finished_run, tmp_path)
    config = run / "config.toml"
    head, _, tail = config.read_text().partition("[resolved]")
    if damage == "edit":
        lines = ["noise-multiplier = 9.0" if ln.startswith("noise-multiplier =") else ln
                 for ln in tail.splitlines()]
        config.write_text(head + "[resolved]" + "\n".join(lines) + "\n")
    else:
        config.write_text(head)
    before = digest(run)
    line = refused(capsys, ["run", "--centralised", "--resume", str(run)], "config.toml")
    assert ("noise-multiplier=9.0" in line) if damage == "edit" else ("no [resolved] table" in line)
    assert digest(run) == before


def test_a_resume_that_changes_the_target_names_it(tmp_path, capsys, finished_run):
    run = copy_of(finished_run, tmp_path)
    before = digest(run)
    refused(capsys, ["run", "--centralised", "--resume", str(run), "--set", "target-epsilon=5"],
            "target-epsilon=5.0")
    assert digest(run) == before


# ------------------------------------------------ files that are not regular files

@pytest.fixture()
def specials(tmp_path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    return {"fifo": fifo, "zero": zero, "dir": tmp_path}


@pytest.mark.parametrize(("kind", "words"), [("fifo", "is a FIFO"), ("zero", "is a character device (a link "
                                                                            "to /dev/zero)"),
                                             ("dir", "is a directory")])
def test_every_reader_refuses_a_file_that_is_not_regular(specials, kind, words):
    path = specials[kind]
    with pytest.raises(ConfigError, match="data-path=") as err:
        regular_file(path, "data-path")
    assert words in str(err.value)
    with pytest.raises(DataError, match=f"data-path='{path}'"):
        read_table(path)
    if kind != "dir":
        with pytest.raises(ConfigError, match=f"config='{path}'"):
            read_toml(path)
        with pytest.raises(ConfigError, match=words.split(" (")[0]):
            optional_file(path)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_run_directory_with_a_special_ledger_or_checkpoint_is_refused(tmp_path, capsys, finished_run, kind):
    for name in ("ledger.jsonl", "checkpoint.pt"):
        run = copy_of(finished_run, tmp_path / name)
        (run / name).unlink()
        if kind == "fifo":
            os.mkfifo(run / name)
        else:
            (run / name).symlink_to("/dev/zero")
        with pytest.raises(ConfigError, match=name):
            (read_ledger if name == "ledger.jsonl" else load_checkpoint)(run)
        if name == "ledger.jsonl":
            refused(capsys, ["account", "--run", str(run)], name)


def test_a_node_policy_that_is_a_fifo_is_refused(specials, capsys, tmp_path):
    refused(capsys, ["run", "--centralised", "--out", str(tmp_path / "out"), "--node-policy",
                     str(specials["fifo"]), *sets(TINY)], str(specials["fifo"]))


# ------------------------------------------------ canaries beyond the audited run

@pytest.mark.parametrize("count", [1_000_000, 10**30])
def test_one_run_canaries_are_bounded_by_the_run(capsys, count):
    refused(capsys, ["audit", "--one-run", "--canaries", str(count)], f"--canaries={count}", "2000 records")


# ------------------------------------------------ configuration sources that are not tables

@pytest.mark.parametrize(("text", "words"), [
    ("[tool.flwr.app]\nconfig = []\n", "tool.flwr.app.config=[]"),
    ("tool = 1\n", "tool=1"),
    ('[tool.flwr]\napp = "x"\n', "tool.flwr.app='x'"),
])
def test_a_config_source_that_is_not_a_table_is_refused(tmp_path, capsys, text, words):
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="must be a table"):
        read_toml(path)
    refused(capsys, ["run", "--config", str(path), "--out", str(tmp_path / "out")], words)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("call", "words"), [
    (lambda: load_config(wrong("mode=dp")), "mapping='mode=dp'"),
    (lambda: load_config(wrong({1: 2})), "1=2: configuration keys are strings"),
    (lambda: Config(privacy=wrong({"mode": "dp"})), "privacy={'mode': 'dp'}: must be a PrivacyConfig"),
    (lambda: Config(wrong(1), wrong(2), wrong(3)), "privacy=1: must be a PrivacyConfig"),
    (lambda: Config(PrivacyConfig(), wrong({"alpha": 2})), "training={'alpha': 2}: must be a TrainingConfig"),
])
def test_the_configuration_entry_points_refuse_wrong_types(call, words):
    with pytest.raises(ConfigError) as err:
        call()
    assert words in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------ the public constructors

X = np.zeros((5, 2), np.float32)
Y = np.arange(5) % 2


@pytest.mark.parametrize(("call", "words"), [
    (lambda: FeatureMap.columns("abc", ["a"]), "columns='abc'"),
    (lambda: FeatureMap.columns(["a", "b"], "b"), "private='b'"),
    (lambda: FeatureMap.label_dp("ab"), "columns='ab'"),
    (lambda: FeatureSpec(wrong(("a", 1)), ("a",), wrong((1,))), "column names are strings"),
    (lambda: FederatedData("t", SPEC, (DeviceData(X, Y),), X, Y[:4], ("no", "yes")), "test_y shape (4,)"),
    (lambda: FederatedData("t", SPEC, (DeviceData(X, Y),), X, Y, wrong("yes")), "class_names='yes'"),
    (lambda: FederatedData("t", SPEC, (DeviceData(X, Y),), X, Y, ("yes",)), "at least two"),
    (lambda: FederatedData("t", SPEC, wrong([X]), X, Y, ("no", "yes")), "not a DeviceData"),
    (lambda: FederatedData("t", SPEC, (DeviceData(np.zeros((5, 3)), Y),), X, Y, ("no", "yes")),
     "device 0: records of shape (3,)"),
    (lambda: FederatedData("t", wrong("spec"), (DeviceData(X, Y),), X, Y, ("no", "yes")), "spec='spec'"),
    (lambda: TrainInstruction(wrong("a"), 0, Mode.DP, PrivacyUnit.RECORD, 0.1, 1.0, (0,), (1,), (True,)),
     "server-round='a': must be an integer"),
    (lambda: TrainInstruction(1, 0, Mode.DP, PrivacyUnit.RECORD, 0.1, 1.0, wrong("ab"), (1,), (True,)),
     "device-ids='ab': must be a list"),
])
def test_the_public_constructors_check_types_and_shapes(call, words):
    with pytest.raises((ValueError, TypeError)) as err:
        call()
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


# ------------------------------------------------ a crafted checkpoint, an empty held-out split

def test_a_crafted_checkpoint_is_refused_without_torchs_warnings(tmp_path, finished_run):
    run = copy_of(finished_run, tmp_path)
    (run / "checkpoint.pt").write_bytes(pickle.dumps({"meta": "{}", "model": {}, "optimizer": {}}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointMismatch, match="checkpoint.pt: not a checkpoint fedfdp wrote") as err:
            load_checkpoint(run)
    assert caught == [] and "weights_only" not in str(err.value)


def test_an_empty_held_out_split_is_named_not_blamed_on_the_learning_rate():
    with pytest.raises(DataError, match=r"^test-fraction=0.001: holds out none of the 40 records"):
        holdout_records(np.repeat(np.arange(4), 10), 0.001, np.random.default_rng(0))
    from fedfdp import run_centralised

    x, y = np.zeros((40, 2), np.float32), np.arange(40) % 2
    data = FederatedData("t", SPEC, (DeviceData(x, y),), x[:0], y[:0], ("no", "yes"))
    with pytest.raises(ConfigError, match="held-out split is empty") as err:
        run_centralised(load_config({"num-rounds": 2, "progress": False, "sampling-rate": 0.5}), data)
    assert "learning-rate" not in str(err.value)
