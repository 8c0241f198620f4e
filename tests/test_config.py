"""Configuration: defaults, validation messages naming key and value, TOML sources."""

import tomllib
from pathlib import Path

import pytest

from fedfdp.config import Config, ConfigError, config_keys, load_config, parse_override, read_toml

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_valid_and_frozen():
    cfg = load_config({})
    assert cfg == Config()
    with pytest.raises(AttributeError):
        cfg.privacy.mode = "dp"  # type: ignore[misc]


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


def test_sigma_or_target_exactly_one():
    with pytest.raises(ConfigError, match="give one of them"):
        load_config({"noise-multiplier": 1.0, "target-epsilon": 2.0})
    with pytest.raises(ConfigError, match="needs noise-multiplier or target-epsilon"):
        load_config({"mode": "dp", "target-epsilon": 0})
    # non-private modes need neither
    assert load_config({"mode": "public", "target-epsilon": 0}).privacy.mode == "public"


def test_combinations():
    with pytest.raises(ConfigError, match="max-epsilon=1.0: below target-epsilon=2.0"):
        load_config({"max-epsilon": 1.0})
    with pytest.raises(ConfigError, match="fdp-dpsgd"):
        load_config({"mode": "fdp-dpsgd"})
    with pytest.raises(ConfigError, match="public-pretrain-rounds=10"):
        load_config({"public-pretrain-rounds": 10, "num-rounds": 10})


def test_flat_roundtrip():
    cfg = load_config({"mode": "dp", "noise-multiplier": 1.3, "target-epsilon": 0, "delta": 1e-6})
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
    good.write_text('mode = "dp"\nnoise-multiplier = 1.0\ntarget-epsilon = 0\n')
    assert load_config(read_toml(good)).privacy.noise_multiplier == 1.0
