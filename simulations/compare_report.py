"""The report of ``fedfdp compare``: ``summary.md`` and ``privacy_utility.png``.

Both are written from ``results.csv`` alone (so ``--report-only`` can redraw them):
accuracy on the held-out split, mean ± sd over seeds, per mode and target ε; the
realised ε (add/remove, upper bound of the accountant's interval) and the
calibrated σ of every private mode; ``nonprivate`` (ε = ∞) and ``public`` (ε = 0)
as reference lines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedfdp.config import MODES, PRIVATE_MODES
from fedfdp.entropy import NOISE_SOURCE_SECRET, REPRODUCIBLE_WARNING
from simulations.compare_results import read_results

PLOT_FILE = "privacy_utility.png"
SUMMARY_FILE = "summary.md"


def _fmt_eps(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3g}"


def summarise(frame):  # -> pd.DataFrame
    """Mean and sd over seeds per (dataset, mode, target ε)."""
    frame = frame.copy()
    frame["target_key"] = frame["target_epsilon"].fillna(-1.0)
    grouped = frame.groupby(["dataset", "mode", "target_key"], sort=False)
    table = grouped.agg(
        accuracy_mean=("accuracy", "mean"),
        accuracy_sd=("accuracy", "std"),
        epsilon_mean=("epsilon", "mean"),
        epsilon_max=("epsilon", "max"),
        noise_multiplier=("noise_multiplier", "mean"),
        seeds=("seed", "nunique"),
    ).reset_index()
    table["target_epsilon"] = table["target_key"].where(table["target_key"] >= 0)
    table["accuracy_sd"] = table["accuracy_sd"].fillna(0.0)
    return table.drop(columns="target_key")


def _ordered_modes(modes: Sequence[str]) -> list[str]:
    return [m for m in MODES if m in set(modes)] + sorted(set(modes) - set(MODES))


def _title(dataset: str, rows, titles: Mapping[str, str] | None) -> str:
    if titles and dataset in titles:
        return titles[dataset]
    if "num_records" in rows.columns and rows["num_records"].notna().any():
        return f"{dataset} (N = {int(rows['num_records'].dropna().iloc[0]):,} training records)"
    return dataset


def write_summary(
    frame, path: Path, *, command: str = "", titles: Mapping[str, str] | None = None
) -> None:
    """``summary.md``: accuracy (mean ± sd over seeds) per mode and target ε."""
    from fedfdp.outputs import atomic_write

    table = summarise(frame)
    lines: list[str] = []
    for dataset in table["dataset"].unique():
        part = table[table["dataset"] == dataset]
        rows = frame[frame["dataset"] == dataset]
        targets = sorted(part["target_epsilon"].dropna().unique())
        delta = rows["delta"].dropna()
        lines.append(f"## {_title(dataset, rows, titles)}")
        lines.append("")
        lines.append(
            "Accuracy on the held-out split, % (mean ± sd over seeds). Each private mode "
            "is calibrated to end at the target ε (add/remove, upper bound"
            + (f", δ = {delta.iloc[0]:.3g}" if len(delta) else "")
            + "); `nonprivate` (ε = ∞) and `public` (ε = 0) do not depend on ε. "
            f"Engine: {', '.join(sorted(rows['engine'].astype(str).unique()))}; "
            f"seeds: {sorted(rows['seed'].astype(int).unique().tolist())}."
        )
        if "noise_source" in rows and (rows["noise_source"].astype(str) != NOISE_SOURCE_SECRET).any():
            lines.append("")
            lines.append(f"**Warning:** {REPRODUCIBLE_WARNING}.")
        lines.append("")
        lines.append("| mode | " + " | ".join(f"ε = {t:g}" for t in targets) + " |")
        lines.append("|---|" + "---|" * len(targets))
        means: dict[str, dict[float, float]] = {}
        for mode in _ordered_modes(part["mode"].unique()):
            sub = part[part["mode"] == mode]
            cells = []
            means[mode] = {}
            for t in targets:
                hit = sub[sub["target_epsilon"] == t] if mode in PRIVATE_MODES else sub
                if hit.empty:
                    cells.append("—")
                    continue
                r = hit.iloc[0]
                means[mode][t] = r["accuracy_mean"]
                cells.append(f"{100 * r['accuracy_mean']:.1f} ± {100 * r['accuracy_sd']:.1f}")
            lines.append(f"| `{mode}` | " + " | ".join(cells) + " |")
        for a, b in (("fdp", "dp"), ("fdp", "public"), ("fdp", "fdp-dpsgd")):
            if a in means and b in means and means[a] and means[b]:
                cells = [
                    f"{100 * (means[a][t] - means[b][t]):+.1f}" if t in means[a] and t in means[b] else "—"
                    for t in targets
                ]
                lines.append(f"| `{a}` − `{b}` (points) | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Realised ε (max over seeds) and calibrated σ per private mode:")
        lines.append("")
        lines.append("| mode | " + " | ".join(f"ε = {t:g}" for t in targets) + " |")
        lines.append("|---|" + "---|" * len(targets))
        for mode in _ordered_modes(part["mode"].unique()):
            if mode not in PRIVATE_MODES:
                continue
            sub = part[part["mode"] == mode]
            cells = []
            for t in targets:
                hit = sub[sub["target_epsilon"] == t]
                if hit.empty:
                    cells.append("—")
                else:
                    r = hit.iloc[0]
                    cells.append(f"ε {_fmt_eps(r['epsilon_max'])}, σ {r['noise_multiplier']:.3g}")
            lines.append(f"| `{mode}` | " + " | ".join(cells) + " |")
        pre = rows[rows["pretrain_rounds"].fillna(0) > 0]
        if len(pre):
            lines.append("")
            lines.append(
                "Public pre-training rounds (ε = 0, Remark 2) before the private rounds: "
                + ", ".join(
                    f"`{m}` {int(g['pretrain_rounds'].iloc[0])} of {int(g['rounds'].iloc[0])}"
                    for m, g in pre.groupby("mode")
                )
                + "."
            )
        lines.append("")
    if command:
        lines += ["Produced by:", "", "```bash", command, "```", ""]
    atomic_write(path, ("# Comparison at equal ε\n\n" + "\n".join(lines)).encode())


_STYLE = {
    "dp": ("tab:red", "s"),
    "fdp-dpsgd": ("tab:orange", "^"),
    "fdp": ("tab:blue", "o"),
    "nonprivate": ("black", None),
    "public": ("tab:green", None),
}


def plot_privacy_utility(frame, path: Path, *, titles: Mapping[str, str] | None = None) -> None:
    """``privacy_utility.png``: accuracy vs ε per mode (mean ± sd over seeds);
    ``nonprivate`` and ``public`` as horizontal reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    from fedfdp.outputs import atomic_write

    table = summarise(frame)
    datasets = list(table["dataset"].unique())
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 3.8), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        part = table[table["dataset"] == dataset]
        private = part[part["mode"].isin(PRIVATE_MODES)]
        xs = sorted(private["target_epsilon"].dropna().unique())
        for mode in _ordered_modes(part["mode"].unique()):
            sub = part[part["mode"] == mode]
            color, marker = _STYLE.get(mode, ("tab:gray", "d"))
            if mode in PRIVATE_MODES:
                sub = sub.sort_values("target_epsilon")
                ax.errorbar(
                    sub["epsilon_mean"], 100 * sub["accuracy_mean"], yerr=100 * sub["accuracy_sd"],
                    color=color, marker=marker, capsize=3, label=mode,
                )
            else:
                m, s = 100 * sub["accuracy_mean"].iloc[0], 100 * sub["accuracy_sd"].iloc[0]
                eps = "ε = ∞" if mode == "nonprivate" else "ε = 0"
                ax.axhline(m, color=color, linestyle="--", linewidth=1.2, label=f"{mode} ({eps})")
                if s > 0:
                    ax.axhspan(m - s, m + s, color=color, alpha=0.08)
        if xs:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.set_xlabel("ε (add/remove, upper bound)")
        ax.set_ylabel("held-out accuracy (%)")
        ax.set_title(_title(dataset, frame[frame["dataset"] == dataset], titles), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def write_report(out: Path, *, command: str = "", title: str = "") -> None:
    """Write ``summary.md`` and ``privacy_utility.png`` from ``results.csv``
    (``title`` replaces the dataset heading when the results hold one dataset)."""
    frame = read_results(out)
    if frame.empty:
        return
    datasets = frame["dataset"].unique()
    titles = {datasets[0]: title} if title and len(datasets) == 1 else None
    write_summary(frame, out / SUMMARY_FILE, command=command, titles=titles)
    plot_privacy_utility(frame, out / PLOT_FILE, titles=titles)
