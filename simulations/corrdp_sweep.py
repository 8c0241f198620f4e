"""CorrDP beside DP, FDP and public training on the synthetic ``correlated`` data,
swept over ``m_s/m`` and the correlation ``ρ`` (= TV, in closed form).

``python -m simulations.corrdp_sweep --config simulations/experiments/corrdp_synthetic.toml --out DIR``

The TOML file is a ``fedfdp compare`` sweep (modes, target-epsilons, seeds, base keys,
``[mode.NAME]`` tables) plus a ``[grid]`` table::

    [grid]
    columns = 20                       # m; num-insensitive = m − num-sensitive
    num-sensitive = [2, 5, 10]
    correlation = [0.0, 0.25, 0.5, 1.0]
    all-sensitive = true               # also corrdp with every column sensitive

Every grid point is one ``fedfdp compare`` sweep in ``DIR/ms<m_s>_rho<ρ>/`` (restartable,
its own ``results.csv`` and ``summary.md``); ``corrdp`` declares the true TV,
``insensitive-tv = "*=ρ"``. With ``all-sensitive = true`` in ``[grid]`` every point also
runs ``corrdp`` with **every column sensitive** (``DIR/ms<m_s>_rho<ρ>_all-sensitive/``,
mode ``corrdp-all-sensitive`` in the tables): the same code, relation and accounting
with no insensitive feature, i.e. DP for a replacement of the features (labels fixed) —
the DP-ERM baseline that Theorem 3.6 improves on, whereas ``dp``'s add/remove ε is a
different relation. Then ``DIR/corrdp_sweep.csv`` gathers every run with its
**excess empirical risk**: the training cross-entropy of the final model
(``runs/<tag>/model.pt`` on the training records: synthetic data, a measurement, not
a release) minus that of ``nonprivate`` at the same seed; ``DIR/corrdp_sweep.md``
the table (mean over seeds) with the ratios of ``corrdp-all-sensitive``'s and ``dp``'s
excess risk to ``corrdp``'s beside Theorem 3.6's rate ratio
``√m / √(m_s + min(Σ_U TV, m_s/4))``; and
``DIR/corrdp_sweep.png`` the plot.

ε: ``dp`` and ``fdp`` add/remove (upper bound); ``corrdp`` a CorrDP ε
(``epsilon_corrdp``, relation ``corrdp``), calibrated to the same number.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedfdp.config import ConfigError, Mode, load_toml_file
from simulations.compare import run_sweep
from simulations.compare_plan import parse_sweep

SWEEP_CSV = "corrdp_sweep.csv"
SWEEP_MD = "corrdp_sweep.md"
SWEEP_PNG = "corrdp_sweep.png"
#: The pseudo-mode of ``corrdp`` runs with every column sensitive.
ALL_SENSITIVE = "corrdp-all-sensitive"


def grid_points(grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The grid's points as run keys (``num-sensitive``, ``num-insensitive``, ``correlation``)."""
    try:
        m = int(grid["columns"])
        sens = [int(v) for v in grid["num-sensitive"]]
        rhos = [float(v) for v in grid["correlation"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"[grid]={grid!r}: needs columns, num-sensitive = [...], correlation = [...]"
        ) from exc
    bad = [s for s in sens if not 1 <= s < m]
    if bad:
        raise ConfigError(f"[grid] num-sensitive={sens}: each must be in [1, columns={m})")
    return [
        {"num-sensitive": s, "num-insensitive": m - s, "correlation": r}
        for s, r in itertools.product(sens, rhos)
    ]


def point_tag(point: dict[str, Any]) -> str:
    return f"ms{point['num-sensitive']}_rho{point['correlation']:g}"


def column_names(point: dict[str, Any]) -> list[str]:
    """The ``correlated`` data's columns at a point: ``s0, s1, ...`` then ``u0, u1, ...``."""
    return [f"s{k}" for k in range(point["num-sensitive"])] + [
        f"u{j}" for j in range(point["num-insensitive"])
    ]


def point_docs(doc: dict[str, Any], point: dict[str, Any], all_sensitive: bool) -> dict[str, dict[str, Any]]:
    """``{directory name: compare document}`` of a point: the modes of ``doc`` with
    ``corrdp`` declaring TV = ρ, and (``all_sensitive``) ``corrdp`` alone with every
    column sensitive.
    """
    base = {**doc, **point}
    per_mode = dict(base.pop("mode", {}))
    corr = dict(per_mode.get(Mode.CORRDP, {}))
    tv = f"*={point['correlation']!r}"
    main_doc = {**base, "mode": {**per_mode, "corrdp": {**corr, "insensitive-tv": tv}}}
    out = {point_tag(point): main_doc}
    if all_sensitive:
        every = {**corr, "sensitive-columns": ",".join(column_names(point)), "insensitive-tv": ""}
        out[f"{point_tag(point)}_all-sensitive"] = {**base, "modes": ["corrdp"], "mode": {"corrdp": every}}
    return out


def theory_ratio(m: int, m_s: int, tv_sum: float) -> float:
    """Theorem 3.6's rate over DP-ERM's: ``√m / √(m_s + min(Σ_U TV, m_s/4))``."""
    return math.sqrt(m) / math.sqrt(m_s + min(tv_sum, m_s / 4))


def training_loss(run_dir: Path) -> float:
    """Cross-entropy of ``run_dir/model.pt`` on the training records of its configuration."""
    import torch
    import torch.nn.functional as F

    from fedfdp.config import load_config, read_toml
    from fedfdp.data import load_dataset
    from fedfdp.models import build_model_for

    cfg = load_config(read_toml(run_dir / "config.toml"))
    data = load_dataset(cfg.data)
    model = build_model_for(cfg.training, data)
    model.load_state_dict(torch.load(run_dir / "model.pt", map_location="cpu"))
    x = torch.as_tensor(np.concatenate([d.x for d in data.devices]))
    y = torch.as_tensor(np.concatenate([d.y for d in data.devices]))
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def insensitive_std_factor(run_dir: Path, rho: float) -> float:
    """``√max(ρ, floor)``: Eq. (3)'s noise std on an insensitive block over the sensitive
    block's, for a ``corrdp`` run declaring TV = ρ (floor: ``[resolved]`` of its ``config.toml``).
    """
    import tomllib

    resolved = tomllib.loads((run_dir / "config.toml").read_text()).get("resolved", {})
    return math.sqrt(max(rho, float(resolved.get("corrdp-tv-floor", 0.0))))


def gather(out: Path, points: Sequence[dict[str, Any]], columns: int,
           all_sensitive: bool = False):  # -> pd.DataFrame
    """Every run of every point with its training loss and excess empirical risk."""
    import pandas as pd

    frames = []
    for point in points:
        parts = []
        for name in point_docs({}, point, all_sensitive):
            d = out / name
            frame = pd.read_csv(d / "results.csv")
            eps = frame["target_epsilon"].map(lambda t: "ref" if pd.isna(t) else f"eps{t:g}")
            tags = frame["mode"] + "_" + eps + "_seed" + frame["seed"].astype(str)
            frame["train_loss"] = [training_loss(d / "runs" / t) for t in tags]
            frame["insensitive_noise_multiplier"] = frame["noise_multiplier"]
            if name.endswith("_all-sensitive"):
                frame["mode"] = ALL_SENSITIVE
            else:
                corr = frame["mode"] == Mode.CORRDP
                factors = [insensitive_std_factor(d / "runs" / t, point["correlation"]) for t in tags[corr]]
                scaled = frame.loc[corr, "noise_multiplier"] * factors
                frame.loc[corr, "insensitive_noise_multiplier"] = scaled
            parts.append(frame)
        frame = pd.concat(parts, ignore_index=True)
        frame["num_sensitive"] = point["num-sensitive"]
        frame["columns"] = columns
        frame["correlation"] = point["correlation"]
        base = frame[frame["mode"] == Mode.NONPRIVATE].set_index("seed")["train_loss"]
        frame["excess_risk"] = frame["train_loss"] - frame["seed"].map(base)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _cell(frame) -> tuple[float, float, float] | None:
    """Mean excess risk, its sd over seeds, mean held-out accuracy (%) of some runs."""
    if not len(frame):
        return None
    return frame["excess_risk"].mean(), frame["excess_risk"].std(), 100 * frame["accuracy"].mean()


def write_tables(frame, out: Path) -> None:  # frame: pd.DataFrame
    """``corrdp_sweep.csv``, ``corrdp_sweep.md`` and ``corrdp_sweep.png``."""
    from fedfdp.outputs import atomic_write

    atomic_write(out / SWEEP_CSV, frame.to_csv(index=False).encode())
    private = frame[frame["target_epsilon"].notna()]
    has_all = bool((private["mode"] == ALL_SENSITIVE).any())
    seeds = [int(v) for v in sorted(frame["seed"].unique())]
    head = "| m_s/m | ρ = TV | ε | `dp` | `fdp` | `corrdp` |"
    rule = "|---|---|---|---|---|---|"
    if has_all:
        head += " `corrdp`, all sensitive |"
        rule += "---|"
    head += " `public` |"
    rule += "---|"
    if has_all:
        head += " all-sensitive / `corrdp` |"
        rule += "---|"
    head += " `dp` / `corrdp` | theory |"
    rule += "---|---|"
    lines = [
        f"Excess empirical risk: training cross-entropy minus `nonprivate`'s (same seed), mean "
        f"± sd over seeds {seeds}; in brackets the held-out accuracy (%). `dp`, `fdp`: add/remove "
        "ε; `corrdp`: CorrDP ε (`epsilon_corrdp`) calibrated to the same number, declaring TV = ρ"
        + ("; `corrdp`, all sensitive: the same code with every column sensitive (DP for a "
           "replacement of the features, labels fixed)" if has_all else "")
        + ". Ratios: excess risk over `corrdp`'s; theory: Theorem 3.6's rate ratio "
        "√m / √(m_s + min(Σ TV, m_s/4)) (DP-ERM over CorrDP-SGD).",
        "",
        head,
        rule,
    ]
    public = frame[frame["mode"] == Mode.PUBLIC]

    def fmt(v: tuple[float, float, float] | None) -> str:
        return "—" if v is None else f"{v[0]:.3f} ± {v[1]:.3f} ({v[2]:.1f})"

    def ratio(num, den) -> str:
        return f"{num[0] / den[0]:.2f}" if num and den and den[0] > 0 else "—"

    for (ms, rho, eps), part in private.groupby(["num_sensitive", "correlation", "target_epsilon"]):
        m = int(part["columns"].iloc[0])
        modes = (Mode.DP, Mode.FDP, Mode.CORRDP, ALL_SENSITIVE)
        cells = {mode: _cell(part[part["mode"] == mode]) for mode in modes}
        pub = _cell(public[(public["num_sensitive"] == ms) & (public["correlation"] == rho)])
        row = f"| {int(ms)}/{m} | {rho:g} | {eps:g} | {fmt(cells['dp'])} | {fmt(cells['fdp'])} | "
        row += f"{fmt(cells['corrdp'])} |"
        if has_all:
            row += f" {fmt(cells[ALL_SENSITIVE])} |"
        row += f" {fmt(pub)} |"
        if has_all:
            row += f" {ratio(cells[ALL_SENSITIVE], cells['corrdp'])} |"
        theory = theory_ratio(m, int(ms), (m - int(ms)) * float(rho))
        row += f" {ratio(cells['dp'], cells['corrdp'])} | {theory:.2f} |"
        lines.append(row)
    lines += [
        "",
        "Noise multipliers σ (noise std over C on a coordinate of the clipped sum), mean over seeds: "
        "`corrdp` has σ on the sensitive block and the bias, σ·√max(TV, floor) on every insensitive "
        "block (Eq. (3)).",
        "",
        "| m_s/m | ρ = TV | ε | `dp` | `corrdp`, all sensitive | `corrdp` sensitive | `corrdp` insensitive |",
        "|---|---|---|---|---|---|---|",
    ]
    for (ms, rho, eps), part in private.groupby(["num_sensitive", "correlation", "target_epsilon"]):
        m = int(part["columns"].iloc[0])

        def sigma(mode: str, column: str = "noise_multiplier", part=part) -> str:
            sub = part[part["mode"] == mode][column]
            return f"{sub.mean():.1f}" if len(sub) else "—"

        lines.append(
            f"| {int(ms)}/{m} | {rho:g} | {eps:g} | {sigma('dp')} | {sigma(ALL_SENSITIVE)} | "
            f"{sigma('corrdp')} | {sigma('corrdp', 'insensitive_noise_multiplier')} |"
        )
    atomic_write(out / SWEEP_MD, ("\n".join(lines) + "\n").encode())
    plot(private, out / SWEEP_PNG)


def plot(private, path: Path) -> None:
    """Excess empirical risk against ρ, one panel per m_s/m, one line per mode."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedfdp.outputs import atomic_write

    sens = sorted(private["num_sensitive"].unique())
    fig, axes = plt.subplots(1, len(sens), figsize=(4.2 * len(sens), 3.6), squeeze=False, sharey=True)
    style = {"dp": ("tab:red", "s", "-", "dp (add/remove ε)"),
             "fdp": ("tab:blue", "o", "-", "fdp (add/remove ε)"),
             ALL_SENSITIVE: ("tab:gray", "v", "--", "corrdp, all columns sensitive (CorrDP ε)"),
             "corrdp": ("tab:purple", "D", ":", "corrdp, TV = ρ (CorrDP ε)")}
    for ax, ms in zip(axes[0], sens, strict=True):
        part = private[private["num_sensitive"] == ms]
        for mode, (color, marker, line, label) in style.items():
            sub = part[part["mode"] == mode].groupby("correlation")["excess_risk"].agg(["mean", "std"])
            if len(sub):
                ax.errorbar(sub.index, sub["mean"], yerr=sub["std"].fillna(0), color=color, marker=marker,
                            capsize=3, label=label, linestyle=line)
        m = int(part["columns"].iloc[0])
        ax.set_title(f"m_s/m = {int(ms)}/{m}, ε = {part['target_epsilon'].iloc[0]:g}", fontsize=10)
        ax.set_xlabel("correlation ρ = TV(j) of every insensitive column")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("excess empirical risk (train CE − nonprivate)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulations.corrdp_sweep",
                                description="CorrDP beside dp, fdp and public over m_s/m and correlation")
    p.add_argument("--config", required=True, help="compare sweep TOML with a [grid] table")
    p.add_argument("--out", required=True, help="output directory (restartable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a base key")
    p.add_argument("--report-only", action="store_true", help="rewrite the tables from the runs already done")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        doc = load_toml_file(args.config)
        grid = doc.pop("grid", None)
        if not isinstance(grid, dict):
            raise ConfigError(f"config={args.config!r}: needs a [grid] table")
        points = grid_points(grid)
        all_sensitive = bool(grid.get("all-sensitive", False))
        out = Path(args.out)
        if not args.report_only:
            command = f"python -m simulations.corrdp_sweep --config {args.config} --out {args.out}"
            for point in points:
                for name, sweep_doc in point_docs(doc, point, all_sensitive).items():
                    run_sweep(parse_sweep(sweep_doc, args.set), out / name, progress=True, command=command)
        frame = gather(out, points, int(grid["columns"]), all_sensitive)
        write_tables(frame, out)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out / SWEEP_CSV}, {out / SWEEP_MD}, {out / SWEEP_PNG}")
    print((out / SWEEP_MD).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
