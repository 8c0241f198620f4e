"""The whole record under DP: nothing a relation protects is read off the data (issue 30, point 1).

Property: two tables that are **neighbours under a mode's relation** (one record changed in
what the relation protects) give the same encodings (input columns, their scale, the label
classes), the same model shapes and the same run files, apart from what the noise and the
changed record's own contribution decide. The relation decides which changes are
neighbours (``fedfdp.config.protection``):

* ``dp`` (and its device unit): any column or the label of one record;
* ``fdp``, ``fdp-dpsgd``: the private columns of one record (Ψ: the public columns and the
  label, is known to the simulator of Definition 6);
* ``corrdp``: any input column of one record (labels fixed).

The control: under ``fdp`` a rare label value is *not* a neighbour, and there the table's
own classes are used, so the shapes differ (3 classes against 2); the same check under
``dp`` is what failed before this issue (issue 30: ``0.weight`` 3×2 against 2×2).
"""

from __future__ import annotations

import csv
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fedfdp.config import ConfigError, Protected, load_config
from fedfdp.config.protection import protected_columns
from fedfdp.data import FederatedData, load_dataset
from fedfdp.data.encoding import UNRELEASED_LABEL, table_encoding
from fedfdp.data.private_statistics import estimate_private_ranges
from fedfdp.models import build_model_for

N = 400

#: Everything declared, for every mode (a record outside a declared domain is refused).
DECLARED: dict[str, Any] = {
    "public-ranges": "speed=-4:4", "public-categories": "colour=red|blue",
    "private-ranges": "age=18:66", "private-categories": "job=a|b", "label-classes": "0|1|2",
}


def _base(n: int = N) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "speed": rng.normal(size=n).round(6),
        "colour": rng.choice(["red", "blue"], n),
        "age": rng.integers(18, 66, n),
        "job": rng.choice(["a", "b"], n),
        "label": rng.integers(0, 2, n),
    })


def _changed(column: str, value: object) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        out = frame.copy()
        out[column] = out[column].astype(object)
        out.loc[7, column] = value
        return out

    return change


#: One record changed, in a way no other record shares.
CHANGES: dict[str, tuple[str, Callable[[pd.DataFrame], pd.DataFrame]]] = {
    "rare label": ("label", _changed("label", 2)),  # declared, held by one record
    "extreme public value": ("speed", _changed("speed", 1e6)),
    "rare public category": ("colour", _changed("colour", "mauve")),
    "extreme private value": ("age", _changed("age", 1000)),
    "rare private category": ("job", _changed("job", "astronaut")),
}

#: mode -> the keys of the mode, and the changes its relation makes neighbours.
MODES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "dp": ({"mode": "dp"}, tuple(CHANGES)),
    "dp-device": ({"mode": "dp", "privacy-unit": "device", "device-sampling-rate": 0.8}, tuple(CHANGES)),
    "fdp": ({"mode": "fdp"}, ("extreme private value", "rare private category")),
    "fdp-dpsgd": ({"mode": "fdp-dpsgd"}, ("extreme private value", "rare private category")),
    "corrdp": ({"mode": "corrdp", "model": "logistic", "insensitive-tv": "*=0.5"},
               ("extreme public value", "rare public category", "extreme private value",
                "rare private category")),
}


def _keys(path: Path, **extra: Any) -> dict[str, Any]:
    return {"dataset": "csv", "data-path": str(path), "public-columns": "speed,colour",
            "private-columns": "age,job", "label-column": "label", "num-devices": 4, "model": "logistic",
            "num-rounds": 3, "progress": False, **extra}


def _pair(tmp_path: Path, change: str, frame: pd.DataFrame | None = None) -> tuple[Path, Path]:
    base = _base() if frame is None else frame
    a, b = tmp_path / "a.csv", tmp_path / f"b-{change.replace(' ', '-')}.csv"
    base.to_csv(a, index=False)
    CHANGES[change][1](base).to_csv(b, index=False)
    return a, b


def _records(data: FederatedData) -> np.ndarray:
    return np.concatenate([d.x for d in data.devices] + [data.test_x])


def _same_encoding(a: FederatedData, b: FederatedData) -> None:
    """The same schema and classes, and every record but the changed one encoded alike
    (an encoding that read a statistic of the changed record would move the others)."""
    assert a.spec == b.spec
    assert a.class_names == b.class_names
    assert list(a.sizes) == list(b.sizes)
    xa, xb = _records(a), _records(b)
    assert xa.shape == xb.shape
    assert int(np.any(xa != xb, axis=1).sum()) <= 1


def _shapes(cfg: Any, data: FederatedData) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in build_model_for(cfg.training, data).state_dict().items()}


@pytest.mark.parametrize("mode", list(MODES))
def test_neighbours_under_the_relation_give_the_same_encoding_and_model_shapes(tmp_path, mode):
    keys, changes = MODES[mode]
    for change in changes:
        a, b = _pair(tmp_path, change)
        cfg_a, cfg_b = (load_config(_keys(p, **keys, **DECLARED)) for p in (a, b))
        data_a, data_b = load_dataset(cfg_a.data), load_dataset(cfg_b.data)
        _same_encoding(data_a, data_b)
        assert _shapes(cfg_a, data_a) == _shapes(cfg_b, data_b), (mode, change)


def test_the_relation_decides_what_is_protected():
    scope = {m: load_config(_keys(Path("t.csv"), **k, **DECLARED)).data.protected
             for m, (k, _) in MODES.items()}
    assert scope == {"dp": Protected.WHOLE_RECORD, "dp-device": Protected.WHOLE_RECORD,
                     "fdp": Protected.PRIVATE_COLUMNS, "fdp-dpsgd": Protected.PRIVATE_COLUMNS,
                     "corrdp": Protected.INPUTS}
    dp = load_config(_keys(Path("t.csv"), mode="dp")).data
    assert protected_columns(dp) == ("age", "job", "speed", "colour", "label")
    label_dp = load_config(_keys(Path("t.csv"), **{"public-loss": "label-free", "label-classes": "0|1"})).data
    assert protected_columns(label_dp) == ("age", "job", "label")


def test_control_under_fdp_a_rare_label_is_read_off_the_data(tmp_path):
    """Ψ (with the label) is disclosed under FDP, so a rare label is not a neighbour there and
    the table's own classes are used: the check above can see a difference."""
    a, b = _pair(tmp_path, "rare label")
    undeclared = {k: v for k, v in DECLARED.items() if k != "label-classes"}
    cfg_a, cfg_b = (load_config(_keys(p, mode="fdp", **undeclared)) for p in (a, b))
    data_a, data_b = load_dataset(cfg_a.data), load_dataset(cfg_b.data)
    assert (data_a.class_names, data_b.class_names) == (("0", "1"), ("0", "1", "2"))
    assert _shapes(cfg_a, data_a) != _shapes(cfg_b, data_b)


@pytest.mark.parametrize("mode", ["dp", "corrdp"])
def test_undeclared_protected_columns_are_refused_in_one_line_naming_them(tmp_path, mode):
    a, _ = _pair(tmp_path, "rare label")
    keys = dict(MODES[mode][0])
    declared = {k: DECLARED[k] for k in ("private-ranges", "private-categories")}
    with pytest.raises(ConfigError) as err:
        load_dataset(load_config(_keys(a, **keys, **declared)).data)
    line = str(err.value)
    assert "\n" not in line
    named = ["speed", "colour", "label"] if mode == "dp" else ["speed", "colour"]
    assert f"{named} have no declared encoding" in line
    assert "public-ranges" in line and "public-categories" in line
    assert ("label-classes" in line) == (mode == "dp")
    # corrdp's accountant composes no estimate: only the declaration is offered there
    assert ('private-statistics = "estimate"' in line) == (mode == "dp")


# ------------------------------------------------------------------- estimates


def _estimated(path: Path, mode_keys: dict[str, Any], normals: Callable[[int], np.ndarray]) -> Any:
    """The table's encoding under private-statistics = "estimate", with the estimate's noise
    drawn from ``normals`` (the estimator's seam): the configuration with the releases, and
    the encoding built from them."""
    cfg = load_config(_keys(path, **mode_keys, **{"private-statistics": "estimate"}))
    frame = pd.read_csv(path)
    train = np.ones(len(frame), dtype=bool)
    released = estimate_private_ranges(cfg.data, frame, train, normals)
    return released, table_encoding(released, frame, train)


def test_estimates_are_refused_with_the_device_unit(tmp_path):
    """A device moves each count of an estimate's histogram by its number of records, not by
    the 1 the estimate is charged for: declared encodings only."""
    with pytest.raises(ConfigError, match=r"private-statistics='estimate' with privacy-unit='device'"):
        load_config(_keys(tmp_path / "t.csv", **MODES["dp-device"][0], **{"private-statistics": "estimate"}))


@pytest.mark.parametrize("mode", ["dp"])
@pytest.mark.parametrize("change", ["rare label", "extreme public value", "rare public category",
                                    "extreme private value", "rare private category"])
def test_estimates_depend_on_a_record_only_through_their_noise(tmp_path, mode, change):
    """With the same noise draws the two neighbours release the same ranges, categories and
    classes (every count of the changed record is 1, far below the threshold): the data
    enters only through the noised, charged histograms."""
    frame = _base()
    frame["label"] = frame["label"].astype(str)
    a, b = _pair(tmp_path, change, frame)
    if change == "rare label":  # an undeclared value: rare under the estimate
        _changed("label", "9")(frame).to_csv(b, index=False)
    draws = np.random.default_rng(5).standard_normal(10_000)

    def normals(n: int) -> np.ndarray:
        return draws[:n].copy()

    (ra, ea), (rb, eb) = (_estimated(p, MODES[mode][0], normals) for p in (a, b))
    assert ra.estimated_ranges == rb.estimated_ranges
    assert ra.estimated_categories == rb.estimated_categories
    assert ea.spec == eb.spec and ea.classes == eb.classes
    assert ea.classes[-1] == UNRELEASED_LABEL and set(ea.classes[:-1]) == {"0", "1"}
    labels = eb.labels(pd.read_csv(b, dtype={"label": str}), "b")
    assert labels.max() == len(eb.classes) - 1 if change == "rare label" else labels.max() == 1


def test_a_dp_run_charges_every_estimate_and_writes_the_same_files_for_neighbours(tmp_path):
    """Two whole dp runs (centralised, reproducible noise) over neighbouring tables: the same
    configuration, ledger, public columns of metrics.csv and model shapes."""
    from fedfdp import run_centralised
    from fedfdp.run_plan import resolve_released

    a, b = _pair(tmp_path, "extreme public value")
    written = {}
    for name, path in (("a", a), ("b", b)):
        out = tmp_path / f"run-{name}"
        cfg = resolve_released(load_config(_keys(path, mode="dp", **DECLARED, **{
            "noise-multiplier": 1.0, "reproducible-noise": True, "seed": 3, "out-dir": str(out)})))
        run_centralised(cfg)
        toml = tomllib.loads((out / "config.toml").read_text())
        ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
        with (out / "metrics.csv").open() as fh:
            rows = [{k: r[k] for k in ("round", "epsilon", "delta", "noise_multiplier", "normaliser",
                                       "clipping_norm", "replies")} for r in csv.DictReader(fh)]
        import torch

        model = torch.load(out / "model.pt", weights_only=True)
        state = model.get("state_dict", model) if isinstance(model, dict) else model
        written[name] = (_strip_paths(toml), ledger, rows,
                         {k: tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")})
    assert written["a"][1] == written["b"][1]  # the ledger, hash chain included
    assert written["a"][2] == written["b"][2]
    assert written["a"][3] == written["b"][3] and written["a"][3]
    assert written["a"][0] == written["b"][0]


def _strip_paths(value: Any) -> Any:
    """A config.toml without the two things that name the run's files (data-path, out-dir)."""
    if isinstance(value, dict):
        return {k: _strip_paths(v) for k, v in value.items() if k not in ("data-path", "out-dir")}
    return value


def test_a_split_that_reads_the_labels_is_refused_where_the_label_is_protected():
    """Device sizes and N are public: under dp (the label protected) the Dirichlet split, which
    draws each class's share per device, would publish a function of the labels."""
    from fedfdp.data.split import refuse_label_split

    dp = load_config(_keys(Path("t.csv"), mode="dp", **{"dirichlet-alpha": 0.5}, **DECLARED))
    refused = r"dirichlet-alpha=0.5: .*mode='dp' makes private.*dirichlet-alpha = 0"
    with pytest.raises(ConfigError, match=refused):
        refuse_label_split(dp.privacy, dp.data)
    fdp = load_config(_keys(Path("t.csv"), mode="fdp", **{"dirichlet-alpha": 0.5}, **DECLARED))
    refuse_label_split(fdp.privacy, fdp.data)  # the label is in Ψ: the split may read it


def test_the_unreleased_class_is_the_last_class_once():
    from fedfdp.data.encoding import label_classes

    released = {"private-statistics": "estimate", "estimated-categories": f"label=0|1|{UNRELEASED_LABEL}"}
    cfg = load_config(_keys(Path("t.csv"), mode="dp", **released))
    assert label_classes(cfg.data, None) == ("0", "1", UNRELEASED_LABEL)
