"""Configuration: defaults, validation messages naming key and value, TOML sources."""

import tomllib
from pathlib import Path

import pytest

from fedfdp.config import Config, ConfigError, Mode, config_keys, load_config, parse_override, read_toml

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_valid_and_frozen():
    cfg = load_config({})
    assert cfg == Config()
    with pytest.raises(AttributeError):
        cfg.privacy.mode = Mode.DP  # type: ignore[misc]


def test_pyproject_app_config_is_the_default_config():
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert set(app) == set(config_keys())
    assert load_config(app) == Config()


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("noise-multiplier", -1.0, "noise-multiplier=-1.0: must be > 0"),
        ("sampling-rate", 1.5, "sampling-rate=1.5: must be in (0, 1]"),
        ("sampling-rate", 0, "sampling-rate=0"),
        ("clipping-norm", 0.0, "clipping-norm=0.0"),
        ("num-rounds", 2.5, "num-rounds=2.5: must be an integer"),
        ("num-rounds", True, "num-rounds=True"),
        ("mode", "dpsgd", "mode='dpsgd': must be one of"),
        ("delta", 1.0, "delta=1.0"),
        ("momentum", 1.0, "momentum=1.0"),
        ("learning-rate", float("nan"), "learning-rate=nan: must be finite"),
        ("public-loss", 3, "public-loss=3"),
    ],
)
def test_bad_values_name_key_and_value(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        load_config({key: value})
    assert fragment in str(err.value)


def test_unknown_key_suggests():
    with pytest.raises(
        ConfigError, match=r"noise-multiplyer=1: unknown configuration key.*noise-multiplier"
    ):
        load_config({"noise-multiplyer": 1})


def test_sigma_or_target_at_most_one():
    with pytest.raises(ConfigError, match="give one of them"):
        load_config({"noise-multiplier": 1.0, "target-epsilon": 2.0})
    # σ alone, a target alone, or neither (the default target 2.0)
    assert load_config({"mode": "dp", "noise-multiplier": 1.3}).privacy.noise_multiplier == 1.3
    assert load_config({"mode": "dp", "target-epsilon": 1.0}).privacy.calibration_target == 1.0
    assert load_config({"mode": "dp"}).privacy.calibration_target == 2.0
    # 0 is not "not set"
    with pytest.raises(ConfigError, match='target-epsilon=0: must be > 0, or "" to leave it unset'):
        load_config({"mode": "dp", "target-epsilon": 0})
    assert load_config({"mode": "public"}).privacy.mode is Mode.PUBLIC


def test_combinations():
    with pytest.raises(ConfigError, match="max-epsilon=1.0: below the default calibration target 2.0"):
        load_config({"max-epsilon": 1.0})
    with pytest.raises(ConfigError, match="max-epsilon=1.0: below target-epsilon 1.5"):
        load_config({"max-epsilon": 1.0, "target-epsilon": 1.5})
    assert load_config({"max-epsilon": 1.0, "noise-multiplier": 2.0}).privacy.epsilon_cap == 1.0
    with pytest.raises(ConfigError, match="fdp-dpsgd"):
        load_config({"mode": "fdp-dpsgd", "public-pretrain-rounds": 0})
    # fdp-dpsgd pre-trains publicly by default: 50 of the default 150 rounds, a third of fewer
    assert load_config({"mode": "fdp-dpsgd"}).privacy.public_pretrain_rounds == 50
    assert load_config({"mode": "fdp-dpsgd", "num-rounds": 30}).privacy.public_pretrain_rounds == 10
    assert load_config({"mode": "fdp-dpsgd", "public-pretrain-rounds": 3}).privacy.public_pretrain_rounds == 3
    assert load_config({"mode": "fdp"}).privacy.public_pretrain_rounds == 0
    with pytest.raises(ConfigError, match="public-pretrain-rounds=10"):
        load_config({"public-pretrain-rounds": 10, "num-rounds": 10})


def test_flat_roundtrip():
    cfg = load_config({"mode": "dp", "noise-multiplier": 1.3, "delta": 1e-6})
    assert load_config(cfg.to_flat()) == cfg


def test_parse_override():
    assert parse_override("delta=1e-5") == ("delta", 1e-5)
    assert parse_override("mode=dp") == ("mode", "dp")
    assert parse_override('mode="dp"') == ("mode", "dp")
    assert parse_override("progress=false") == ("progress", False)
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("delta")


def test_read_toml_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        read_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("mode = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_toml(bad)
    good = tmp_path / "good.toml"
    good.write_text('mode = "dp"\nnoise-multiplier = 1.0\ntarget-epsilon = ""\n')
    assert load_config(read_toml(good)).privacy.noise_multiplier == 1.0


# ----------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("section", "kwargs", "message"),
    [
        ("privacy", {"noise_multiplier": -1.0}, "noise-multiplier=-1.0: must be > 0"),
        ("privacy", {"noise_multiplier": 0.0}, 'noise-multiplier=0.0: must be > 0, or "" to leave it unset'),
        ("privacy", {"sampling_rate": 7.0}, "sampling-rate=7.0: must be in (0, 1]"),
        ("privacy", {"num_rounds": 0}, "num-rounds=0: must be >= 1"),
        ("privacy", {"noise_multiplier": 1.0, "target_epsilon": 2.0}, "give one of them"),
        ("privacy", {"mode": "dpsgd"}, "mode='dpsgd': must be one of"),
        ("privacy", {"privacy_unit": "device"}, "needs device-sampling-rate"),
        ("training", {"learning_rate": float("nan")}, "learning-rate=nan: must be finite"),
        ("data", {"test_fraction": 1.0}, "test-fraction=1.0: must be in (0, 1)"),
        ("run", {"eval_every": 0}, "eval-every=0: must be >= 1"),
    ],
)
def test_direct_construction_is_validated_like_the_toml_path(section, kwargs, message):
    """Each section validates on construction with the parser of the field's key:
    the same one-line message as the TOML path."""
    from fedfdp.config import DataConfig, PrivacyConfig, RunConfig, TrainingConfig

    classes = {"privacy": PrivacyConfig, "training": TrainingConfig, "data": DataConfig, "run": RunConfig}
    cls = classes[section]
    with pytest.raises(ConfigError) as direct:
        cls(**kwargs)
    assert message in str(direct.value)
    key = message.split("=")[0]
    if key in config_keys() and len(kwargs) == 1:
        (value,) = kwargs.values()
        with pytest.raises(ConfigError) as via_toml:
            load_config({key: value})
        assert str(via_toml.value) == str(direct.value)


def test_cross_section_checks_run_on_construction():
    from fedfdp.config import Config, PrivacyConfig, PublicLoss, TrainingConfig

    with pytest.raises(ConfigError, match="public-loss='label-free': needs model='logistic'"):
        Config(privacy=PrivacyConfig(public_loss=PublicLoss.LABEL_FREE), training=TrainingConfig(model="mlp"))


def test_the_orchestration_section_is_what_may_change_on_resume_and_is_not_hashed():
    from fedfdp.checkpoint import RESUMABLE_KEYS
    from fedfdp.config import ORCHESTRATION_KEYS, PrivacyConfig, RunConfig
    from simulations.compare_plan import NOT_HASHED

    def keys_of(cls):
        return {k for k in config_keys() if k.replace("-", "_") in cls.__dataclass_fields__}

    assert ORCHESTRATION_KEYS == keys_of(RunConfig) == RESUMABLE_KEYS == set(NOT_HASHED)
    assert "seed" not in ORCHESTRATION_KEYS and "num-rounds" not in ORCHESTRATION_KEYS
    assert {"num-rounds", "clients-per-round", "reproducible-noise"} <= keys_of(PrivacyConfig)


# ----------------------------------------------------------------- the CLI edge


def _one_line(capsys):
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_cli_refuses_bad_paths_in_one_line(tmp_path, capsys):
    from simulations.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"mode = \xff\xfe")
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not UTF-8 text" in _one_line(capsys)
    assert main(["run", "--config", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "is a directory, not a TOML file" in _one_line(capsys)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    small = ["--set", "num-rounds=1", "--set", "num-devices=2", "--set", "records-per-device=20",
             "--set", "progress=false"]
    assert main(["run", "--centralised", "--out", str(a_file), *small]) == 2
    assert "is a file, not a directory" in _one_line(capsys)
    assert main(["run", "--centralised", "--out", str(tmp_path / ("x" * 300)), *small]) == 2
    assert "cannot write there" in _one_line(capsys)
    assert main(["compare", "--out", str(a_file)]) == 2
    assert "is a file, not a directory" in _one_line(capsys)
    assert main(["audit", "--rounds", "3", "--out", str(tmp_path)]) == 2
    assert "is a directory, not a file" in _one_line(capsys)


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="root writes to read-only directories")
def test_cli_refuses_a_read_only_output_directory(tmp_path, capsys):
    from simulations.cli import main

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    assert main(["run", "--centralised", "--out", str(ro / "run"), "--set", "num-rounds=1"]) == 2
    assert "cannot write there" in _one_line(capsys)


def test_sites_refuses_a_non_empty_directory(tmp_path, capsys):
    from simulations.cli import main

    table = tmp_path / "t.csv"
    table.write_text("site,a,b,y\n" + "\n".join(f"{i % 2},{i},{i * 2},{i % 3}" for i in range(20)))
    out = tmp_path / "finished-run"
    out.mkdir()
    (out / "metrics.csv").write_text("round\n1\n")
    assert main(["sites", str(table), "--by", "site", "--out", str(out)]) == 2
    assert "not empty" in _one_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv"]  # nothing written
