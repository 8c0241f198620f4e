"""Each site's own data (``data-location = "node"``): declared encodings, site and
held-out loaders, the ClientApp's node config, a whole in-process run, bad site
files, and ``fedfdp sites``.

References are independent of the code under test: the encodings are checked
against their closed forms written out here, and against the central ``csv``
loader on the same rows (one table in one process vs. the same rows spread
over site files)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from flwr.app import Error, Message

from clients import client_app
from clients.node_runtime import node_records
from fedfdp import protocol as P
from fedfdp.config import ConfigError, load_config
from fedfdp.data import DataError, load_dataset, load_server_data
from fedfdp.data.tabular import load_site
from fedfdp.run_plan import build_plan
from simulations.cli import main
from strategies.fdp_strategy import FDPStrategy
from tests.flower_helpers import InProcessGrid, node_context
from tests.site_tables import CLASSES, DECLARED, PHONES, trips


def node_cfg(sites_dir, **extra):
    return load_config(
        {
            **DECLARED,
            "data-location": "node",
            "num-devices": len(PHONES),
            "test-path": str(sites_dir / "heldout.csv"),
            "public-batch-size": 32,
            "sampling-rate": 0.2,
            "noise-multiplier": 1.0,
            "num-rounds": 3,
            "progress": False,
            **extra,
        }
    )


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"test-path": ""}, "test-path='': data-location='node' needs"),
        ({"data-path": "/x.csv"}, "each SuperNode names its own file"),
        ({"label-classes": ""}, "label-classes='': data-location='node' needs"),
        ({"public-ranges": "speed=0:10"}, "public-columns ['heading']: data-location='node' needs"),
        ({"private-categories": ""}, "private-columns ['city']: data-location='node' needs"),
        ({"device-column": "phone"}, "device-column='phone': with data-location='node'"),
        ({"label-classes": "walk"}, "at least two classes"),
        ({"label-classes": "a|a"}, "distinct"),
        ({"public-ranges": "speed=0:10,heading=0:360,lat=0:1"}, "not in public-columns"),
        ({"data-location": "cloud"}, "must be one of central, node"),
    ],
)
def test_node_location_needs_every_declaration(tmp_path, change, fragment):
    mapping = {**DECLARED, "data-location": "node", "test-path": str(tmp_path / "h.csv"), **change}
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        load_config(mapping)


def test_node_location_needs_csv_and_test_path_needs_node():
    with pytest.raises(ConfigError, match="needs dataset='csv'"):
        load_config({"data-location": "node", "test-path": "/h.csv"})
    with pytest.raises(ConfigError, match="only used with data-location='node'"):
        load_config({"test-path": "/h.csv"})


# ------------------------------------------------------------------ encodings
def test_site_file_encodes_to_the_declared_closed_forms(sites):
    folder, _ = sites
    cfg = node_cfg(folder)
    raw = pd.read_csv(folder / "site-1.csv")
    site = load_site(cfg.data, str(folder / "site-1.csv"))
    (dev,) = site.devices
    assert len(dev) == len(raw) and site.class_names == CLASSES
    x = dev.x.astype(np.float64)
    assert site.spec is not None
    cols = list(site.spec.columns)
    assert cols == ["speed", "heading", "weather=sun", "weather=rain", "weather=fog",
                    "heart_rate", "lat", "lon", "city=A", "city=B", "city=C"]
    assert site.spec.private == ("heart_rate", "lat", "lon", "city=A", "city=B", "city=C")
    # public ranges: linear, not clipped
    assert x[:, 0] == pytest.approx(2 * raw["speed"] / 10 - 1, abs=1e-6)
    assert x[:, 1] == pytest.approx(2 * raw["heading"] / 360 - 1, abs=1e-6)
    # private ranges: linear, clipped to [-1, 1]
    assert x[:, 5] == pytest.approx(np.clip(2 * (raw["heart_rate"] - 40) / 160 - 1, -1, 1), abs=1e-6)
    assert x[:, 6] == pytest.approx(np.clip(raw["lat"], -1, 1), abs=1e-6)
    for j, w in enumerate(["sun", "rain", "fog"]):
        assert np.array_equal(x[:, 2 + j], (raw["weather"] == w).to_numpy(float))
    for j, c in enumerate("ABC"):
        assert np.array_equal(x[:, 8 + j], (raw["city"] == c).to_numpy(float))
    assert np.array_equal(dev.y, raw["activity"].map({c: i for i, c in enumerate(CLASSES)}).to_numpy())
    # the public-mean constants: range centres and 1/K per declared category
    assert site.public_statistics is not None


def test_sites_and_one_central_table_encode_the_same_rows(sites, tmp_path):
    """The same declared encoding, two ways of reading the rows: every encoded row of
    the site files plus the held-out file equals a row of the central loader."""
    folder, table = sites
    cfg = node_cfg(folder)
    node_rows = [load_site(cfg.data, str(folder / f"site-{k}.csv")).devices[0] for k in range(3)]
    heldout = load_server_data(cfg.data)
    assert heldout.devices == () and len(heldout.test_y) == 60
    spread = np.concatenate([d.x for d in node_rows] + [heldout.test_x])
    spread_y = np.concatenate([d.y for d in node_rows] + [heldout.test_y])

    table.to_csv(tmp_path / "all.csv", index=False)
    central = load_dataset(load_config({**DECLARED, "data-path": str(tmp_path / "all.csv"),
                                        "device-column": "phone", "num-devices": 3}).data)
    whole = np.concatenate([d.x for d in central.devices] + [central.test_x])
    whole_y = np.concatenate([d.y for d in central.devices] + [central.test_y])

    def canon(x, y):
        rows = np.concatenate([x, y[:, None].astype(np.float32)], axis=1)
        return rows[np.lexsort(rows.T[::-1])]

    assert spread.shape == whole.shape == (len(table), 11)
    assert np.array_equal(canon(spread, spread_y), canon(whole, whole_y))
    assert central.class_names == heldout.class_names == CLASSES


def test_declared_public_encoding_and_classes_in_central_mode(tmp_path):
    """Central tables may declare public encodings and classes too; a label outside
    the declared classes is refused with its value."""
    table = trips(60)
    table.loc[4, "activity"] = "swim"
    table.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=r"label value\(s\) \['swim'\] that are not declared"):
        load_dataset(load_config({**DECLARED, "data-path": str(tmp_path / "t.csv"), "num-devices": 2}).data)


# ------------------------------------------------------------------ the ClientApp's node config
def test_client_reads_its_own_file_from_the_node_config(sites):
    folder, _ = sites
    cfg = node_cfg(folder)
    ctx = node_context(cfg, 2, node_config={"data-path": str(folder / "site-2.csv")})
    records = node_records(cfg.data, ctx.node_config)
    assert list(records.devices) == [2]
    info = client_app.handle_query(records)
    assert info[P.DEVICE_IDS] == [2]
    assert info[P.DEVICE_SIZES] == [len(pd.read_csv(folder / "site-2.csv"))]

    with pytest.raises(ValueError, match="needs this SuperNode's own file as data-path"):
        node_records(cfg.data, node_context(cfg, 0).node_config)
    with pytest.raises(ValueError, match="num-partitions must be num-devices=3"):
        node_records(cfg.data, node_context(cfg, 0, 2, {"data-path": str(folder / "site-0.csv")}).node_config)
    with pytest.raises(DataError, match="data-location='node': the training records are on the SuperNodes"):
        load_dataset(cfg.data)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda f: f.assign(activity="swim"), r"data-path='.*bad.csv' has label value\(s\) \['swim'\]"),
        (lambda f: f.drop(columns=["lat"]), r"private-columns=\['heart_rate', 'lat', 'lon', 'city'\]: "
                                            r"column\(s\) \['lat'\] not in data-path="),
        (lambda f: f.assign(speed=["fast"] * len(f)),
         r"column 'speed': value\(s\) \['fast'\] are not numbers"),
        (lambda f: f.assign(speed=np.inf), "non-finite input values"),
        (lambda f: f.iloc[:0], "no rows"),
    ],
)
def test_bad_site_file_is_refused_naming_file_and_value(sites, edit, fragment):
    folder, _ = sites
    cfg = node_cfg(folder)
    edit(pd.read_csv(folder / "site-0.csv")).to_csv(folder / "bad.csv", index=False)
    with pytest.raises(DataError, match=fragment):
        load_site(cfg.data, str(folder / "bad.csv"))


# ------------------------------------------------------------------ a whole run
def test_run_on_site_files_in_process(sites):
    """The real ClientApp handlers, each node reading its own file from its node config,
    and the real strategy evaluating on test-path: N is the sites' row count."""
    folder, _ = sites
    cfg = node_cfg(folder)
    data = load_server_data(cfg.data)
    strat = FDPStrategy(build_plan(cfg, data))  # evaluates on the held-out file (test-path)
    files = {k: {"data-path": str(folder / f"site-{k}.csv")} for k in range(3)}
    grid = InProcessGrid(cfg, node_configs=files)
    strat.start(grid)
    rows = strat.rows
    index = pd.read_csv(folder / "sites.csv")
    assert strat.num_records == int(index["train_rows"].sum()) == 180
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["replies"] == 3 and r["rejected"] == 0 for r in rows)
    eps = [r["epsilon"] for r in rows]
    assert eps[0] < eps[1] < eps[2]
    assert all(0 <= r["accuracy"] <= 1 and np.isfinite(r["loss"]) for r in rows)


# ------------------------------------------------------------------ fedfdp sites
def test_sites_command_writes_one_file_per_site(tmp_path, capsys):
    table = trips(90)
    table.to_csv(tmp_path / "t.csv", index=False)
    assert main(["sites", str(tmp_path / "t.csv"), "--by", "phone", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    index = pd.read_csv(tmp_path / "s" / "sites.csv")
    assert list(index["value"]) == sorted(PHONES)
    counts = table["phone"].value_counts()
    for _, row in index.iterrows():
        site = pd.read_csv(tmp_path / "s" / f"site-{row['site']}.csv")
        assert "phone" not in site.columns and len(site) == row["train_rows"]
        assert row["train_rows"] + row["heldout_rows"] == counts[row["value"]]
        assert f"partition-id={row['site']} num-partitions=3 data-path=" in out
    held = pd.read_csv(tmp_path / "s" / "heldout.csv")
    assert len(held) == index["heldout_rows"].sum()
    assert 'data-location = "node"' in out
    # nothing is overwritten; bad arguments name the value
    assert main(["sites", str(tmp_path / "t.csv"), "--by", "phone", "--out", str(tmp_path / "s")]) == 2
    assert "already holds" in capsys.readouterr().err
    assert main(["sites", str(tmp_path / "t.csv"), "--by", "imei", "--out", str(tmp_path / "u")]) == 2
    assert "--by='imei': no such column" in capsys.readouterr().err


class _ErrorRepliesGrid(InProcessGrid):
    """Like a SuperLink: a ClientApp that raises becomes an error reply, not an exception."""

    def answer(self, msg):
        try:
            return super().answer(msg)
        except Exception as exc:  # what Flower turns into an error reply
            return Message(error=Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)


def test_a_site_with_a_bad_file_never_joins_and_the_run_does_not_start(sites, caplog):
    """A SuperNode whose file is refused answers the server's query with an error; the
    server logs it and, after node-wait-timeout, refuses to start on partial data."""
    folder, _ = sites
    cfg = node_cfg(folder, **{"node-wait-timeout": 1.0})
    bad = pd.read_csv(folder / "site-1.csv").assign(activity="swim")
    bad.to_csv(folder / "bad.csv", index=False)
    files = {0: folder / "site-0.csv", 1: folder / "bad.csv", 2: folder / "site-2.csv"}
    grid = _ErrorRepliesGrid(cfg, node_configs={k: {"data-path": str(p)} for k, p in files.items()})
    strat = FDPStrategy(build_plan(cfg, load_server_data(cfg.data)))
    with caplog.at_level("WARNING"), pytest.raises(RuntimeError, match="only 2 of 3 devices registered"):
        strat.start(grid)
    assert "swim" in caplog.text and "bad.csv" in caplog.text
    assert not (folder / "metrics.csv").exists()
