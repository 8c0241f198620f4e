"""The key table: enums for closed choices, None for "not set", σ alone, exhaustive kinds,
and which keys define the guarantee.

The expected sets below are written out by hand from the design (DESIGN.md §2-3, the
key reference), not read from the table under test.
"""

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from fedfdp.config import (
    DEFAULT_TARGET_EPSILON,
    GUARANTEE_KEYS,
    KEY_TABLE,
    KEYS,
    ORCHESTRATION_KEYS,
    Aggregation,
    ClipShares,
    Config,
    ConfigError,
    DataConfig,
    DataLocation,
    Kind,
    Mode,
    Optimizer,
    PrivacyConfig,
    PrivacyUnit,
    PublicLoss,
    TrainingConfig,
    TvFloor,
    UnknownKindError,
    config_keys,
    guarantee_keys_of,
    load_config,
    parse_value,
    read_toml,
)

ROOT = Path(__file__).resolve().parents[1]

#: Every key that may be left unset, and how it is written then.
OPTIONAL = {
    "noise-multiplier": "",
    "target-epsilon": "",
    "max-epsilon": "",
    "delta": "",
    "clipping-quantile": "auto",
    "device-sampling-rate": "",
    "tv-min-prob": "",
    "tv-delta": "",
    "corrdp-feature-bound": "",
    "secagg-min-survivors": "",
    "secagg-neighbours": "",
    "secagg-threshold": "",
    "secagg-scale": "",
    "estimation-epsilon": "auto",
}

#: A valid set value of each optional key (alone, on the defaults).
SET_VALUE = {
    "noise-multiplier": 1.1,
    "target-epsilon": 1.5,
    "max-epsilon": 3.0,
    "delta": 1e-6,
    "clipping-quantile": 0.5,
    "device-sampling-rate": 0.5,
    "tv-min-prob": 0.2,
    "tv-delta": 1e-7,
    "corrdp-feature-bound": 2.0,
    "secagg-min-survivors": 5,
    "secagg-neighbours": 5,
    "secagg-threshold": 4,
    "secagg-scale": 1024.0,
    "estimation-epsilon": 0.3,
}

#: What a set optional key needs beside it (a secagg-* key has no effect, and is
#: refused, with plain aggregation; so is a key outside its scope, KeySpec.applies).
SET_WITH = {k: {"aggregation": "secagg", "secagg-min-survivors": 5}
            for k in ("secagg-min-survivors", "secagg-neighbours", "secagg-threshold", "secagg-scale")}
# ... and a CorrDP key, or σ and the cap, outside the modes where they act
SET_WITH |= {k: {"mode": "corrdp"} for k in ("tv-min-prob", "tv-delta", "corrdp-feature-bound")}


# ----------------------------------------------------------------- "not set" is None, never 0


@pytest.mark.parametrize("key", sorted(OPTIONAL))
def test_unset_is_none_and_round_trips_through_the_flat_form(key):
    for spelling in (None, "", OPTIONAL[key]):
        cfg = load_config({key: spelling})
        spec = KEY_TABLE[key]
        assert getattr(getattr(cfg, spec.section), spec.attr) is None
        assert cfg.to_flat()[key] == OPTIONAL[key]
        assert load_config(cfg.to_flat()) == cfg
    cfg = load_config({**SET_WITH.get(key, {}), key: SET_VALUE[key]})
    assert cfg.to_flat()[key] == SET_VALUE[key]
    assert load_config(cfg.to_flat()) == cfg


@pytest.mark.parametrize("key", sorted(set(OPTIONAL) - {"clipping-quantile"}))
def test_zero_is_refused_in_one_line_saying_how_to_leave_the_key_unset(key):
    with pytest.raises(ConfigError) as err:
        load_config({key: 0})
    text = str(err.value)
    unset = f'"{OPTIONAL[key]}" to leave it unset'  # "" (or the key's word for it, e.g. "auto")
    assert text.startswith(f"{key}=0: must be ") and unset in text and "\n" not in text
    # the same message when the dataclass is built directly with 0.0
    spec = KEY_TABLE[key]
    cls = {"privacy": PrivacyConfig, "data": DataConfig, "training": TrainingConfig}[spec.section]
    with pytest.raises(ConfigError, match=f"^{key}=0.0: must be "):
        cls(**{spec.attr: 0.0})


def test_clipping_quantile_zero_is_a_fixed_c_not_unset():
    p = load_config({"clipping-quantile": 0}).privacy
    assert p.clipping_quantile == 0.0 and not p.adaptive_clipping
    assert load_config({"clipping-quantile": "auto"}).privacy.adaptive_clipping  # fdp's recipe


def test_the_optional_keys_are_exactly_those_listed():
    assert {s.key for s in KEYS if s.optional} == set(OPTIONAL)


def test_toml_sources_use_the_unset_spelling(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('mode = "dp"\nnoise-multiplier = 1.2\ntarget-epsilon = ""\ndelta = ""\n')
    p = load_config(read_toml(path)).privacy
    assert (p.noise_multiplier, p.target_epsilon, p.delta) == (1.2, None, None)
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    for key, spelling in OPTIONAL.items():
        assert app[key] == spelling, key


# ----------------------------------------------------------------- σ alone, the default target


@pytest.mark.parametrize("mode", ["dp", "fdp", "fdp-dpsgd", "corrdp"])
def test_sigma_alone_works_in_every_private_mode(mode):
    extra = {"public-pretrain-rounds": 2} if mode == "fdp-dpsgd" else {}
    extra |= {"clipping-quantile": 0} if mode == "corrdp" else {}
    p = load_config({"mode": mode, "noise-multiplier": 0.9, **extra}).privacy
    assert p.noise_multiplier == 0.9 and p.target_epsilon is None
    assert p.calibration_target is None and p.epsilon_cap is None  # σ given: no cap unless max-epsilon
    capped = load_config({"mode": mode, "noise-multiplier": 0.9, "max-epsilon": 5.0, **extra}).privacy
    assert capped.epsilon_cap == 5.0


def test_the_default_target_is_two_and_caps_the_run():
    assert DEFAULT_TARGET_EPSILON == 2.0
    p = PrivacyConfig(mode=Mode.DP)
    assert p.noise_multiplier is None and p.target_epsilon is None
    assert p.calibration_target == 2.0 and p.epsilon_cap == 2.0
    p = PrivacyConfig(mode=Mode.DP, target_epsilon=0.5, max_epsilon=0.75)
    assert p.calibration_target == 0.5 and p.epsilon_cap == 0.75
    for mode in (Mode.PUBLIC, Mode.NONPRIVATE):
        q = PrivacyConfig(mode=mode)
        assert q.calibration_target is None and q.epsilon_cap is None


def test_both_sigma_and_target_are_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        PrivacyConfig(noise_multiplier=1.0, target_epsilon=2.0)
    assert str(err.value) == (
        'noise-multiplier=1.0 and target-epsilon=2.0: give one of them (leave the other unset: "")'
    )
    with pytest.raises(ConfigError, match="give one of them"):
        load_config({"noise-multiplier": 1.0}, base=load_config({"target-epsilon": 2.0}))
    # replacing σ by a target is a two-key change
    p = PrivacyConfig(noise_multiplier=1.0)
    assert replace(p, noise_multiplier=None, target_epsilon=3.0).calibration_target == 3.0


# ----------------------------------------------------------------- enums for closed choices


@pytest.mark.parametrize(
    ("key", "section", "attr", "enum", "word"),
    [
        ("mode", "privacy", "mode", Mode, "fdp-dpsgd"),
        ("privacy-unit", "privacy", "privacy_unit", PrivacyUnit, "device"),
        ("public-loss", "privacy", "public_loss", PublicLoss, "label-free"),
        ("corrdp-clip-shares", "privacy", "corrdp_clip_shares", ClipShares, "equal"),
        ("optimizer", "training", "optimizer", Optimizer, "adam"),
        ("data-location", "data", "data_location", DataLocation, "node"),
    ],
)
def test_choices_are_enum_members_that_equal_their_strings(key, section, attr, enum, word):
    member = enum(word)
    assert member == word and hash(member) == hash(word)
    assert f"{member}" == word and repr(member) == repr(word)
    cls = {"privacy": PrivacyConfig, "training": TrainingConfig, "data": DataConfig}[section]
    default = getattr(cls(), attr)
    assert type(default) is enum
    assert Config().to_flat()[key] == default.value and type(Config().to_flat()[key]) is str
    parsed = parse_value(key, KEY_TABLE[key].kind, word)
    assert parsed is member
    with pytest.raises(ConfigError, match=f"^{key}='{word}x': must be one of "):
        parse_value(key, KEY_TABLE[key].kind, word + "x")


def test_parsed_and_constructed_configurations_hold_members():
    cfg = load_config(
        {"mode": "dp", "privacy-unit": "device", "device-sampling-rate": 0.5, "optimizer": "adam"}
    )
    assert cfg.privacy.mode is Mode.DP and cfg.privacy.privacy_unit is PrivacyUnit.DEVICE
    assert cfg.training.optimizer is Optimizer.ADAM
    # the constructor takes the strings as written and holds members (hence the ignores)
    assert PrivacyConfig(mode="corrdp", clipping_quantile=0.0).mode is Mode.CORRDP  # type: ignore[arg-type]
    assert PrivacyConfig(corrdp_tv_floor="paper").corrdp_tv_floor is TvFloor.PAPER  # type: ignore[arg-type]
    assert PrivacyConfig(corrdp_tv_floor=0.25).corrdp_tv_floor == 0.25
    # an error message shows the value as written, not the enum's name
    with pytest.raises(ConfigError, match=r"^privacy-unit='device': mode 'corrdp'"):
        load_config({"mode": "corrdp", "privacy-unit": "device", "device-sampling-rate": 0.5,
                     "clipping-quantile": 0})
    # every flat value is a plain TOML scalar (Flower's run config takes no enum)
    for key, value in cfg.to_flat().items():
        assert type(value) in (str, int, float, bool), (key, type(value))


def test_private_modes():
    assert {m for m in Mode if m.is_private} == {"dp", "fdp", "fdp-dpsgd", "corrdp"}


# ----------------------------------------------------------------- every kind handled


def test_a_misspelt_kind_is_an_internal_error_not_a_float():
    with pytest.raises(UnknownKindError, match=r"unknown value kind 'float\+\+'"):
        parse_value("noise-multiplier", "float++", 1.0)
    with pytest.raises(UnknownKindError, match="'probability'"):
        parse_value("sampling-rate", "probability", 0.5)
    assert not issubclass(UnknownKindError, ConfigError)  # a bug of the table, not the user's input


def test_every_key_has_a_known_kind_and_every_kind_is_used_and_parsed():
    from fedfdp.config.values import KIND_TEXT, PARSERS, WRITERS

    assert all(isinstance(s.kind, Kind) for s in KEYS)
    assert set(PARSERS) == set(WRITERS) == set(KIND_TEXT) == set(Kind)
    assert {s.kind for s in KEYS} == set(Kind)
    for s in KEYS:
        if s.kind in (Kind.CHOICE, Kind.CHOICE_OR_PATH):
            assert s.choices, s.key


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("sampling-rate", 0.0, "must be in (0, 1]"),
        ("sampling-rate", "0.5", "must be a number"),
        ("delta", 1.0, "must be in (0, 1)"),
        ("momentum", 1.0, "must be in [0, 1)"),
        ("correlation", 1.5, "must be in [0, 1]"),
        ("dirichlet-alpha", -0.1, "must be >= 0"),
        ("num-devices", -1, "must be >= 0"),
        ("num-rounds", 0, "must be >= 1"),
        ("blur-kernel", 4, "must be an odd integer"),
        ("blur-levels", 1, "must be an integer >= 2"),
        ("progress", "yes", "must be true or false"),
        ("data-path", 3, "must be a string"),
        ("hidden-sizes", "8,x", "positive integers"),
        ("corrdp-tv-floor", "median", "must be 'paper'"),
        ("model", "resnet", "or an import path"),
    ],
)
def test_each_kind_refuses_what_it_should(key, value, message):
    with pytest.raises(ConfigError) as err:
        load_config({key: value})
    assert str(err.value).startswith(f"{key}={value!r}: ") and message in str(err.value)


# ----------------------------------------------------------------- what defines the guarantee


def test_guarantee_keys_hold_every_input_of_the_mechanism():
    must = {
        # the mechanism: mode, σ or target, δ, the cap, clipping, sampling, rounds, unit, view
        "mode", "noise-multiplier", "target-epsilon", "max-epsilon", "delta", "clipping-norm",
        "clipping-quantile", "clipping-learning-rate", "clipping-budget-share", "sampling-rate",
        "device-sampling-rate", "clients-per-round", "num-rounds", "public-pretrain-rounds",
        "privacy-unit", "public-loss", "reproducible-noise",
        # Ψ's columns and what decides N and the device sizes
        "dataset", "data-path", "public-columns", "private-columns", "label-column", "device-column",
        "num-devices", "records-per-device", "test-fraction", "data-seed", "max-records",
        "dirichlet-alpha", "data-location", "blur-kernel", "blur-sigma", "blur-levels",
        # the parameter count (the fdp recipe's γ, so σ)
        "model", "hidden-size", "hidden-sizes", "cnn-width", "unet-width",
        # CorrDP
        "sensitive-columns", "insensitive-tv", "tv-estimate", "tv-bins", "tv-min-prob", "tv-delta",
        "corrdp-weight-bound", "corrdp-feature-bound", "corrdp-tv-floor", "corrdp-clip-shares",
        # secure aggregation: who sees the sum, n_min, t_c (the charged event), s, k, t
        "aggregation", "secagg-min-survivors", "secagg-colluders", "secagg-scale", "secagg-neighbours",
        "secagg-threshold",
        # the secret seed when reproducible
        "seed",
    }  # fmt: skip
    never = {"alpha", "learning-rate", "momentum", "optimizer", "public-batch-size", "test-path",
             "diffusion-steps"}
    assert must <= GUARANTEE_KEYS
    assert not never & GUARANTEE_KEYS
    assert not ORCHESTRATION_KEYS & GUARANTEE_KEYS
    orchestration = {"eval-every", "out-dir", "checkpoint-every", "resume", "node-wait-timeout",
                     "round-timeout", "progress", "secagg-timeout", "eval-samples", "sampler-steps"}
    assert orchestration == ORCHESTRATION_KEYS
    assert GUARANTEE_KEYS | ORCHESTRATION_KEYS | never == set(config_keys())
    assert "seed" not in guarantee_keys_of(False) and "seed" in guarantee_keys_of(True)


def _other_value(key, value):
    """A different valid value of ``key`` on the default configuration, or None."""
    special = {
        "mode": "dp", "noise-multiplier": 1.0, "target-epsilon": 1.0, "max-epsilon": 4.0, "delta": 1e-6,
        "clipping-quantile": 0.5, "public-loss": "zero", "privacy-unit": None, "device-sampling-rate": 0.5,
        "reproducible-noise": True, "tv-min-prob": 0.3, "tv-delta": 1e-7, "corrdp-feature-bound": 3.0,
        "corrdp-tv-floor": 0.5, "corrdp-clip-shares": "equal", "optimizer": "adam", "model": "mlp",
        "dataset": "watch", "data-location": None, "out-dir": "/tmp/x", "sensitive-columns": "a",
        "insensitive-tv": "*=0.5", "tv-bins": "a=0", "hidden-sizes": "8", "data-path": None,
        "public-columns": None, "private-columns": None, "label-column": None, "device-column": None,
        "private-ranges": None, "private-categories": None, "public-ranges": None,
        "public-categories": None, "label-classes": None, "test-path": None, "num-devices": 5,
        "public-pretrain-rounds": 3, "blur-levels": 0, "blur-kernel": 5, "dirichlet-alpha": 0.5,
        "tv-estimate": None, "aggregation": None, "secagg-min-survivors": 6, "secagg-neighbours": 5,
        "secagg-threshold": 3, "secagg-scale": 512.0,
    }  # fmt: skip
    if key in special:
        return special[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value < 1 else value + 1
    return None


def test_only_guarantee_keys_change_the_guarantee_inputs():
    """Property: changing a key changes ``guarantee_inputs`` iff the key defines the guarantee."""
    plain = Config(privacy=PrivacyConfig(reproducible_noise=False))
    # a secagg-* key has an effect (and may be set) only with secure aggregation
    secagg = Config(privacy=PrivacyConfig(aggregation=Aggregation.SECAGG, secagg_min_survivors=5))
    tried = 0
    for key in config_keys():
        base = secagg if key.startswith("secagg-") else plain
        applies = KEY_TABLE[key].applies
        if applies is not None:  # a configuration in which the key acts (the first value of its scope)
            where = {decider: accepted[0] for decider, accepted in applies.when}
            if where.get("model") in ("cnn", "ddpm"):
                where["dataset"] = "mnist5k"
            base = load_config(where, base=base)
        other = _other_value(key, base.to_flat()[key])
        if other is None:
            continue
        cfg = load_config({key: other}, base=base)
        changed = cfg.guarantee_inputs() != base.guarantee_inputs()
        expected = key in guarantee_keys_of(cfg.privacy.reproducible_noise)
        assert changed == expected, key
        tried += 1
    assert tried >= 50
    repro = load_config({"reproducible-noise": True}, base=plain)
    assert load_config({"seed": 9}, base=repro).guarantee_inputs() != repro.guarantee_inputs()
    assert load_config({"seed": 9}, base=plain).guarantee_inputs() == plain.guarantee_inputs()


def test_every_key_has_a_one_line_meaning():
    for s in KEYS:
        assert s.meaning and "\n" not in s.meaning, s.key
        assert s.key == s.attr.replace("_", "-"), s.key
