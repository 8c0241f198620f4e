"""Checks of settings that only make sense together (run after every key is parsed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedfdp.config.choices import (
    DATASETS,
    IMAGE_DATASETS,
    SECAGG_MODES,
    Aggregation,
    DataLocation,
    Mode,
    PrivacyUnit,
    PrivateStatistics,
    PublicLoss,
)
from fedfdp.config.protection import undeclared_columns
from fedfdp.config.values import ConfigError

if TYPE_CHECKING:
    from fedfdp.config.schema import Config, DataConfig, PrivacyConfig


def check_privacy(p: PrivacyConfig) -> None:
    """Privacy settings that only make sense together.

    σ and a target ε are alternatives: both set is refused (in every mode, so
    that a configuration never carries a value that is silently ignored by a
    private mode); neither set calibrates a private mode to the default target.
    """
    if p.noise_multiplier is not None and p.target_epsilon is not None:
        raise ConfigError(
            f"noise-multiplier={p.noise_multiplier} and target-epsilon={p.target_epsilon}: "
            'give one of them (leave the other unset: "")'
        )
    target = p.calibration_target
    if p.max_epsilon is not None and target is not None and p.max_epsilon < target:
        which = "target-epsilon" if p.target_epsilon is not None else "the default calibration target"
        raise ConfigError(f"max-epsilon={p.max_epsilon}: below {which} {target}")
    if p.mode is Mode.FDP_DPSGD and p.public_pretrain_rounds == 0:
        raise ConfigError("public-pretrain-rounds=0: mode 'fdp-dpsgd' needs public pre-training")
    if p.public_pretrain_rounds >= p.num_rounds and p.is_private:
        raise ConfigError(
            f"public-pretrain-rounds={p.public_pretrain_rounds}: must be below "
            f"num-rounds={p.num_rounds} so that private rounds remain"
        )
    if p.privacy_unit is PrivacyUnit.DEVICE and p.device_sampling_rate is None:
        raise ConfigError(
            "privacy-unit='device': needs device-sampling-rate in (0, 1] (devices are Poisson-sampled)"
        )
    if p.device_sampling_rate is not None and p.clients_per_round:
        raise ConfigError(
            f"clients-per-round={p.clients_per_round}: give it or device-sampling-rate, not both"
        )
    _check_corrdp(p)
    _check_secagg(p)


def _check_secagg(p: PrivacyConfig) -> None:
    """Secure aggregation (``docs/secagg_accounting.md``): what the protocol and its
    accounting need; each refusal in one line naming the value.
    """
    if p.aggregation is not Aggregation.SECAGG:
        return  # a secagg-* key set here has no effect: check_applicability refuses it (KeySpec.applies)
    if p.mode not in SECAGG_MODES:
        raise ConfigError(
            f"mode={p.mode!r} with aggregation='secagg': secure aggregation serves the modes with one "
            f"noisy private sum ({', '.join(repr(m) for m in SECAGG_MODES)})"
        )
    if p.secagg_min_survivors is None:
        raise ConfigError(
            "secagg-min-survivors is unset: aggregation='secagg' needs n_min, the count of SuperNodes "
            "the noise is calibrated for (at least 3)"
        )
    n_min = p.secagg_min_survivors
    if n_min < 3:
        raise ConfigError(f"secagg-min-survivors={n_min}: secure aggregation needs at least 3 parties")
    if p.secagg_colluders >= n_min:
        raise ConfigError(
            f"secagg-colluders={p.secagg_colluders}: must be below secagg-min-survivors={n_min} "
            "(no honest noise would remain)"
        )
    k, t = p.secagg_neighbours, p.secagg_threshold
    if k is not None and k < 3:
        raise ConfigError(f"secagg-neighbours={k}: must be an odd integer >= 3")
    if t is not None and t > n_min:
        raise ConfigError(
            f"secagg-threshold={t}: above secagg-min-survivors={n_min}, so the minimum survivors "
            "could not meet it"
        )
    if k is not None and t is not None and not k // 2 + 1 <= t <= k:
        raise ConfigError(f"secagg-threshold={t}: must be in [⌊k/2⌋+1, k] = [{k // 2 + 1}, {k}] for "
                          f"secagg-neighbours={k}")
    if k is not None and t is None and k // 2 + 1 > n_min:
        raise ConfigError(
            f"secagg-neighbours={k}: its default threshold {k // 2 + 1} is above "
            f"secagg-min-survivors={n_min}, so the minimum survivors could not meet it"
        )
    if k is None and t is not None:  # the documented range, against the k a round of n_min derives
        _check_threshold_of_derived(t, n_min)
    # t_c colluders at or above a neighbourhood's Shamir threshold hand the server both of a
    # node's secrets (its self-mask seed and its pairwise key): its vector is unmasked alone
    # and only its own σ_loc protects it, not the n_min − t_c parties the accounting counts.
    # The smallest threshold any round can use is the one of n_min parties.
    from fedfdp.secagg.session import default_neighbours, default_threshold

    t_min = t if t is not None else default_threshold(k if k is not None else default_neighbours(n_min))
    if p.secagg_colluders >= t_min:
        raise ConfigError(
            f"secagg-colluders={p.secagg_colluders}: must be below the Shamir threshold t={t_min} "
            f"(of n_min={n_min} parties); t colluding neighbours hand the server a node's unmasked vector"
        )
    if p.device_sampling_rate is not None and p.device_sampling_rate < 1:
        raise ConfigError(
            f"device-sampling-rate={p.device_sampling_rate}: with aggregation='secagg' the server draws "
            "the devices, so it gives no amplification against the server; leave it unset (or 1)"
        )
    if p.clients_per_round:
        raise ConfigError(
            f"clients-per-round={p.clients_per_round}: aggregation='secagg' asks every SuperNode each "
            "round (set it to 0)"
        )
    if p.clipping_quantile is not None and p.clipping_quantile > 0:
        raise ConfigError(
            f"clipping-quantile={p.clipping_quantile}: aggregation='secagg' keeps C fixed (the count of "
            "vectors within C is not aggregated securely); set it to 0 or 'auto'"
        )
    if p.reproducible_noise:
        raise ConfigError(
            "reproducible-noise=true with aggregation='secagg': each party's noise, rounding and keys come "
            "only from its own OS CSPRNG"
        )


def _check_threshold_of_derived(t: int, parties: int) -> None:
    """``secagg-threshold`` in ``[⌊k/2⌋+1, k]`` for the neighbourhood ``k`` a round of
    ``parties`` SuperNodes derives when ``secagg-neighbours`` is unset.
    """
    from fedfdp.secagg.session import default_neighbours

    k = default_neighbours(parties)
    if not k // 2 + 1 <= t <= k:
        raise ConfigError(
            f"secagg-threshold={t}: must be in [⌊k/2⌋+1, k] = [{k // 2 + 1}, {k}] for the neighbourhood "
            f"k={k} a round of {parties} SuperNodes derives (secagg-neighbours unset: min(n, 2⌈log₂ n⌉ + 1), "
            "odd)"
        )


def _check_secagg_parties(cfg: Config) -> None:
    """Secure aggregation's documented range against the run's parties: at most
    ``num-devices`` SuperNodes, so ``secagg-neighbours <= num-devices``
    (the threshold of the derived neighbours is checked at ``n_min``, :func:`_check_secagg`).
    """
    p, parties = cfg.privacy, cfg.data.num_devices
    if p.aggregation is not Aggregation.SECAGG or parties <= 0:  # 0: one device per unit, resolved later
        return
    k = p.secagg_neighbours
    if k is not None and k > parties:
        raise ConfigError(
            f"secagg-neighbours={k}: above num-devices={parties}, the most SuperNodes a round can have; "
            f"a neighbourhood is odd, 3..n (n the round's SuperNodes)"
        )


def _check_corrdp(p: PrivacyConfig) -> None:
    """CorrDP keys (``docs/corrdp.md``): what the relation and the design need."""
    both = sorted(set(p.sensitive_columns) & {n for n, _ in p.insensitive_tv})
    if both:
        raise ConfigError(
            f"sensitive-columns={list(p.sensitive_columns)}, insensitive-tv: column {both[0]!r} is "
            "declared both sensitive and insensitive"
        )
    if p.tv_estimate and p.tv_min_prob is None:
        raise ConfigError(
            "tv-estimate=true: needs tv-min-prob in (0, 1], a declared lower bound on every bin's "
            "probability (the estimator's constants depend on it)"
        )
    if p.estimated_tvs and not p.tv_estimate:
        raise ConfigError(
            f"estimated-tvs names {[n for n, _ in p.estimated_tvs]}: TVs released by tv-estimate=true; "
            "declare them in insensitive-tv instead"
        )
    if p.tv_delta is not None and p.delta is not None and p.tv_delta >= p.delta:
        raise ConfigError(f"tv-delta={p.tv_delta}: must be below delta={p.delta} (it is part of it)")
    if p.mode is not Mode.CORRDP:
        return
    if p.adaptive_clipping:
        raise ConfigError(
            f"clipping-quantile={p.clipping_quantile}: mode 'corrdp' clips per block at a fixed C "
            "(its per-class accounting is for a fixed clipping norm); set clipping-quantile = 0"
        )
    if p.privacy_unit is not PrivacyUnit.RECORD:
        raise ConfigError(
            f"privacy-unit={p.privacy_unit!r}: mode 'corrdp' protects one record's features (Def. 2.1); "
            "use privacy-unit = 'record'"
        )
    if p.public_pretrain_rounds:
        raise ConfigError(
            f"public-pretrain-rounds={p.public_pretrain_rounds}: mode 'corrdp' has no public part "
            "(every feature is protected, the insensitive ones too); set it to 0"
        )


def check_applicability(cfg: Config) -> None:
    """Refuse a key set (to a value other than its default) where it has no effect.

    Where each key acts is data in the key table (:attr:`KeySpec.applies`), so
    ``fedfdp keys`` and ``docs/configuration.md`` show it too; a deciding value
    that is an import path (a user's model or dataset) admits every key. E.g.
    ``mode = "nonprivate"`` with ``noise-multiplier = 1``:
    ``noise-multiplier=1.0: has no effect with mode='nonprivate' (it applies with mode in dp, ...)``.
    """
    from dataclasses import fields

    from fedfdp.config.keys import KEYS
    from fedfdp.config.values import IMPORT_PATH, flat_value

    flat = cfg.to_flat()
    for spec in KEYS:
        if spec.applies is None:
            continue
        section = getattr(cfg, spec.section)
        field = next(f for f in fields(section) if f.name == spec.attr)
        if flat[spec.key] == flat_value(spec, field.default):
            continue
        for decider, accepted in spec.applies.when:
            actual = str(flat.get(decider, ""))
            if actual not in accepted and not IMPORT_PATH.match(actual):
                raise ConfigError(
                    f"{spec.key}={flat[spec.key]!r}: has no effect with {decider}={actual!r} (it applies "
                    f"with {spec.applies.text()}); remove it"
                )


def check_config(cfg: Config) -> None:
    """Settings of different sections that only make sense together; last, a key set
    where it has no effect (:func:`check_applicability`).
    """
    p, t = cfg.privacy, cfg.training
    if p.reproducible_noise and cfg.data.data_location is DataLocation.NODE:
        raise ConfigError(
            "reproducible-noise=true: refused with data-location='node' (a deployment); secret "
            "randomness there comes only from each party's own entropy"
        )
    if cfg.data.num_devices > 100_000:
        raise ConfigError(f"num-devices={cfg.data.num_devices}: at most 100000")
    if p.mode is Mode.CORRDP and t.model != "logistic":
        raise ConfigError(
            f"mode='corrdp': needs model='logistic' (got model={t.model!r}); CorrDP-SGD's per-coordinate "
            "noise is for generalized linear models, where weight column i belongs to input i"
        )
    if p.mode is Mode.CORRDP and p.tv_estimate and cfg.data.data_location is not DataLocation.CENTRAL:
        raise ConfigError(
            "tv-estimate=true: needs data-location='central' (the in-sample estimate counts every "
            "training record); declare the TVs (insensitive-tv) for a deployment"
        )
    _check_images(cfg)
    d = cfg.data
    if p.public_loss is PublicLoss.LABEL_FREE and d.dataset == "csv" and not d.label_classes:
        raise ConfigError(
            "label-classes='': under public-loss='label-free' the label is private, and its classes "
            "taken from the data would disclose them; declare label-classes"
        )
    if p.mode is Mode.CORRDP and d.private_statistics is PrivateStatistics.ESTIMATE:
        raise ConfigError(
            "private-statistics='estimate' with mode='corrdp': the CorrDP accountant does not compose "
            "the estimates' Gaussian histograms; declare private-ranges and private-categories"
        )
    if p.privacy_unit is PrivacyUnit.DEVICE and d.private_statistics is PrivateStatistics.ESTIMATE:
        raise ConfigError(
            "private-statistics='estimate' with privacy-unit='device': an estimate is charged as a histogram "
            "in which one record moves one count by 1, but one device moves its counts by its number of "
            "records; declare the encodings (private-ranges, private-categories; under mode='dp' also "
            "public-ranges, public-categories, label-classes)"
        )
    if p.public_loss is PublicLoss.LABEL_FREE and t.model != "logistic":
        raise ConfigError(
            f"public-loss='label-free': needs model='logistic' (got model={t.model!r}); the "
            "label-free public loss logsumexp(wᵀx) is the paper's softmax-regression construction"
        )
    _check_secagg_parties(cfg)
    check_applicability(cfg)


def _check_images(cfg: Config) -> None:
    """Image datasets: Ψ is the blur, models read ``(C, H, W)``; tables have no ``cnn``."""
    p, t, d = cfg.privacy, cfg.training, cfg.data
    image = d.dataset in IMAGE_DATASETS
    if t.model == "cnn" and d.dataset in DATASETS and not image:
        raise ConfigError(
            f"model='cnn': needs an image dataset ({', '.join(IMAGE_DATASETS)}); dataset={d.dataset!r} "
            "is a table (use logistic or mlp)"
        )
    if t.model == "ddpm" and d.dataset in DATASETS and not image:
        raise ConfigError(
            f"model='ddpm': needs an image dataset ({', '.join(IMAGE_DATASETS)}); dataset={d.dataset!r} "
            "is a table"
        )
    if t.model == "ddpm":
        if t.diffusion_steps <= 20:
            raise ConfigError(f"diffusion-steps={t.diffusion_steps}: must be > 20 (the linear schedule's "
                              "last β, 0.02·1000/T, must be below 1)")
        if cfg.run.sampler_steps > t.diffusion_steps:
            raise ConfigError(f"sampler-steps={cfg.run.sampler_steps}: must be at most "
                              f"diffusion-steps={t.diffusion_steps}")
    if not image:
        return
    if p.public_loss is not PublicLoss.AUTO:
        raise ConfigError(
            f"public-loss={p.public_loss!r}: on dataset={d.dataset!r} the public view is the blurred "
            "image (blur-kernel, blur-sigma, blur-levels); leave public-loss = 'auto'"
        )
    if p.mode is Mode.CORRDP:
        raise ConfigError(
            f"mode='corrdp': dataset={d.dataset!r} is an image dataset; CorrDP-SGD is for logistic "
            "regression on declared tabular features"
        )


def check_data(d: DataConfig) -> None:
    """Data keys that only make sense together (the loaders check the file itself)."""
    overlap = sorted(set(d.public_columns) & set(d.private_columns))
    if overlap:
        raise ConfigError(
            f"public-columns={list(d.public_columns)}, private-columns={list(d.private_columns)}: "
            f"overlap in {overlap}; a column is public or private, not both"
        )
    csv_only = {
        "public-columns": d.public_columns,
        "private-columns": d.private_columns,
        "label-column": d.label_column,
        "device-column": d.device_column,
        "private-ranges": d.private_ranges,
        "private-categories": d.private_categories,
        "public-ranges": d.public_ranges,
        "public-categories": d.public_categories,
        "label-classes": d.label_classes,
        "estimated-ranges": d.estimated_ranges,
        "estimated-categories": d.estimated_categories,
    }
    _check_location(d)
    if d.num_devices == 0 and not (
        d.dataset == "csv" and d.device_column and d.data_location is DataLocation.CENTRAL
    ):
        raise ConfigError(
            f"num-devices=0 (one device per value of device-column): needs dataset='csv' with a "
            f"device-column (dataset={d.dataset!r}, device-column={d.device_column!r}, "
            f"data-location={d.data_location!r}); set num-devices >= 1"
        )
    if d.data_path and d.dataset not in ("purchase100", "criteo", "csv", "images"):
        raise ConfigError(
            f"data-path={d.data_path!r}: dataset={d.dataset!r} reads no file "
            "(data-path is for purchase100, criteo, csv and images)"
        )
    if d.dataset == "images" and not d.data_path:
        raise ConfigError(
            "data-path='': dataset='images' needs an .npz file (arrays x, y) or a folder of PNGs "
            "with labels.csv"
        )
    if d.dataset != "csv":
        given = [k for k, v in csv_only.items() if v]
        if given:
            raise ConfigError(f"{given[0]}={csv_only[given[0]]!r}: only used by dataset='csv' "
                              f"(dataset={d.dataset!r})")
    else:
        if not d.data_path and d.data_location is DataLocation.CENTRAL:
            raise ConfigError("data-path='': dataset='csv' needs the path of a .csv or .parquet file")
        if not d.label_column:
            raise ConfigError("label-column='': dataset='csv' needs the label column")
        if not d.public_columns:
            raise ConfigError("public-columns=[]: dataset='csv' needs at least one public column")
        if not d.private_columns:
            raise ConfigError("private-columns=[]: dataset='csv' needs at least one private column")
        for key, cols in (("public-columns", d.public_columns), ("private-columns", d.private_columns)):
            if d.label_column in cols:
                raise ConfigError(f"{key}={list(cols)}: contains the label-column {d.label_column!r}")
        if d.device_column and d.device_column in d.private_columns:
            raise ConfigError(
                f"private-columns={list(d.private_columns)}: contains the device-column "
                f"{d.device_column!r}; which device holds a record is disclosed (device sizes and the "
                "assignment of records to devices are public), so it cannot be private — list it in "
                "public-columns to use it as a feature"
            )
        for side in ("public", "private"):
            ranges = {n for n, _, _ in getattr(d, f"{side}_ranges")}
            cats = {n for n, _ in getattr(d, f"{side}_categories")}
            columns = getattr(d, f"{side}_columns")
            stray = sorted((ranges | cats) - set(columns))
            if stray:
                raise ConfigError(
                    f"{side}-ranges/{side}-categories name {stray}: not in {side}-columns={list(columns)}"
                )
            if ranges & cats:
                raise ConfigError(
                    f"{side}-ranges and {side}-categories both declare {sorted(ranges & cats)}: pick one"
                )
        _check_estimates(d)
    if d.dataset in ("watch", "storms", "csv") and d.dirichlet_alpha and (
        d.dataset != "csv" or d.device_column
    ):
        raise ConfigError(
            f"dirichlet-alpha={d.dirichlet_alpha}: dataset={d.dataset!r} has natural devices; "
            "the Dirichlet split applies to datasets without them"
        )


def _check_estimates(d: DataConfig) -> None:
    """``estimated-ranges`` and ``estimated-categories``: what ``private-statistics =
    "estimate"`` released, for undeclared protected columns only
    (:func:`fedfdp.config.protection.undeclared_columns`: the private columns, and under
    ``dp`` every column and the label), each column once, and only through the central table.
    """
    estimable = set(undeclared_columns(d))
    both = {n for n, _, _ in d.estimated_ranges} & {n for n, _ in d.estimated_categories}
    if both:
        raise ConfigError(
            f"estimated-ranges and estimated-categories both name {sorted(both)}: one release per column"
        )
    for key, estimated, what in (
        ("estimated-ranges", [n for n, _, _ in d.estimated_ranges], "ranges"),
        ("estimated-categories", [n for n, _ in d.estimated_categories], "categories"),
    ):
        if estimated and d.private_statistics is not PrivateStatistics.ESTIMATE:
            raise ConfigError(
                f"{key} names {estimated}: {what} released by private-statistics='estimate' "
                f"(got {str(d.private_statistics)!r}); declare them in private-{what} instead"
            )
        wrong = sorted(set(estimated) - estimable)
        if wrong:
            raise ConfigError(
                f"{key} names {wrong}: only private columns without a declared encoding are "
                f"estimated (every column and the label under mode='dp'; here {sorted(estimable)})"
            )
    if d.private_statistics is PrivateStatistics.ESTIMATE and d.data_location is not DataLocation.CENTRAL:
        raise ConfigError(
            "private-statistics='estimate': needs data-location='central' (one estimate over the "
            "table, released to every site); declare private-ranges and private-categories for a deployment"
        )


def _check_location(d: DataConfig) -> None:
    """``data-location = "node"``: each SuperNode's own file, everything declared."""
    if d.data_location is DataLocation.CENTRAL:
        if d.test_path:
            raise ConfigError(
                f"test-path={d.test_path!r}: only used with data-location='node' (with 'central' "
                "the held-out split is test-fraction of every device)"
            )
        return
    if d.dataset != "csv":
        raise ConfigError(
            f"data-location='node': needs dataset='csv' (got dataset={d.dataset!r}); each SuperNode "
            "reads its own CSV/Parquet file"
        )
    if d.data_path:
        raise ConfigError(
            f"data-path={d.data_path!r}: with data-location='node' each SuperNode names its own file "
            "in its node config (--node-config \"... data-path='/path/records.csv'\"); the run "
            "config names only the server's held-out file, test-path"
        )
    if not d.test_path:
        raise ConfigError("test-path='': data-location='node' needs the server's held-out file")
    for key, value in (("device-column", d.device_column), ("dirichlet-alpha", d.dirichlet_alpha)):
        if value:
            raise ConfigError(
                f"{key}={value!r}: with data-location='node' each SuperNode's file is one device"
            )
    if not d.label_classes:
        raise ConfigError(
            "label-classes='': data-location='node' needs the declared label values (every site "
            "must number the classes alike)"
        )
    for side in ("public", "private"):
        declared = {n for n, _, _ in getattr(d, f"{side}_ranges")} | {
            n for n, _ in getattr(d, f"{side}_categories")
        }
        cols = [c for c in getattr(d, f"{side}_columns") if c not in declared]
        if cols:
            raise ConfigError(
                f"{side}-columns {cols}: data-location='node' needs every column's encoding declared "
                f"({side}-ranges 'col=low:high' or {side}-categories 'col=a|b'), so that every site "
                "encodes its records identically without sharing statistics of its data"
            )
