"""The report of ``fedfdp compare``: ``summary.md`` and ``privacy_utility.png``.

Both are written from ``results.csv`` (and ``interrupted.csv``) alone (so ``--report-only`` can redraw them):
held-out accuracy, balanced accuracy, AUC (binary tasks) and log loss (for a diffusion
model, ``model = "ddpm"``: its held-out loss and the Fréchet distance ``fd``), mean ± sd
over seeds, per mode and target ε, the best private mode of each ε in bold; the
realised ε (add/remove, upper bound of the accountant's interval) and the
calibrated σ of every private mode; ``nonprivate`` (ε = ∞) and ``public`` (ε = 0)
as reference lines. The plot shows one metric (``--metric``).

``corrdp`` is calibrated to the same number as a **CorrDP ε** (``epsilon_corrdp``,
relation ``corrdp``): a different guarantee, so its row is labelled, its ε is never
shown as an add/remove ε, and it is not a candidate for the bold "best private
mode" (which compares DP and FDP ε only); its differences to ``dp`` and ``fdp``
are listed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedfdp.config import MODES, PRIVATE_MODES, Mode
from fedfdp.entropy import NOISE_SOURCE_SECRET, REPRODUCIBLE_WARNING
from simulations.compare_results import read_interrupted, read_results

PLOT_FILE = "privacy_utility.png"
SUMMARY_FILE = "summary.md"
#: The sweep as run (written by ``fedfdp compare``); its ``[mode.NAME]`` tables are named in the summary.
SWEEP_FILE = "sweep.toml"
SELECTION_NOTE = (
    "Settings chosen by comparing held-out results on this data are hyper-parameter selection "
    "outside the privacy guarantee (no private selection is accounted): report such rows as tuned."
)
#: Modes whose ε is not an add/remove (DP or FDP) ε, with the column holding it.
OTHER_RELATION = {"corrdp": "epsilon_corrdp"}
CORRDP_NOTE = (
    "`corrdp`'s ε is a **CorrDP ε** (`epsilon_corrdp`; relation: one record's sensitive features "
    "replaced → ε, one insensitive feature j replaced → ε/TV(j), labels fixed, membership not "
    "protected), calibrated to the same number as the target: not the same guarantee as the "
    "add/remove ε of `dp` and `fdp`, so it is not bolded against them."
)


def _fmt_eps(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3g}"


#: metric -> (title, unit scale, "higher is better")
METRIC_TITLES = {
    "accuracy": ("Accuracy, %", 100.0, True),
    "balanced_accuracy": ("Balanced accuracy (mean per-class recall), %", 100.0, True),
    "auc": ("ROC AUC of the positive class (binary task), %", 100.0, True),
    "loss": ("Log loss (mean cross-entropy), lower is better", 1.0, False),
    "fd": ("Fréchet distance of generated images (a digit CNN's features, not Inception FID), "
           "lower is better", 1.0, False),
}


def summarise(frame):  # -> pd.DataFrame
    """Mean and sd over seeds of every metric per (dataset, mode, target ε)."""
    frame = frame.copy()
    for metric in METRIC_TITLES:
        if metric not in frame:
            frame[metric] = float("nan")
    if "epsilon_corrdp" not in frame:
        frame["epsilon_corrdp"] = float("nan")
    frame["target_key"] = frame["target_epsilon"].fillna(-1.0)
    grouped = frame.groupby(["dataset", "mode", "target_key"], sort=False)
    aggs = {f"{m}_{stat}": (m, stat) for m in METRIC_TITLES for stat in ("mean", "std")}
    table = grouped.agg(
        **aggs,
        epsilon_mean=("epsilon", "mean"),
        epsilon_max=("epsilon", "max"),
        epsilon_corrdp_mean=("epsilon_corrdp", "mean"),
        epsilon_corrdp_max=("epsilon_corrdp", "max"),
        noise_multiplier=("noise_multiplier", "mean"),
        seeds=("seed", "nunique"),
    ).reset_index()
    table = table.rename(columns={f"{m}_std": f"{m}_sd" for m in METRIC_TITLES})
    table["target_epsilon"] = table["target_key"].where(table["target_key"] >= 0)
    for m in METRIC_TITLES:
        table[f"{m}_sd"] = table[f"{m}_sd"].fillna(0.0)
    return table.drop(columns="target_key")


def best_private(part, metric: str, target: float) -> str | None:
    """The private mode with the best mean ``metric`` at ``target`` ε (None if none),
    among the modes whose ε is an add/remove ε (not ``corrdp``'s).
    """
    modes = [m for m in PRIVATE_MODES if m not in OTHER_RELATION]
    rows = part[part["mode"].isin(modes) & (part["target_epsilon"] == target)]
    rows = rows[rows[f"{metric}_mean"].notna()]
    if rows.empty:
        return None
    higher = METRIC_TITLES[metric][2]
    pick = rows[f"{metric}_mean"].idxmax() if higher else rows[f"{metric}_mean"].idxmin()
    return str(rows.loc[pick, "mode"])


#: The title of the ``loss`` table of a diffusion model (its loss is not a log loss).
DIFFUSION_LOSS = "Held-out diffusion loss (mean squared error of the predicted noise), lower is better"


def _metric_table(part, targets: Sequence[float], metric: str, title: str | None = None) -> list[str]:
    """One metric's table: mean ± sd per mode and ε, the best private mode in bold,
    and fdp's differences to the baselines (``title``: instead of the metric's own).
    """
    own, scale, _ = METRIC_TITLES[metric]
    title = title or own
    digits = 1 if scale == 100.0 else 3
    lines = [f"**{title}** (best private mode per ε in bold)", ""]
    lines.append("| mode | " + " | ".join(f"ε = {t:g}" for t in targets) + " |")
    lines.append("|---|" + "---|" * len(targets))
    best = {t: best_private(part, metric, t) for t in targets}
    means: dict[str, dict[float, float]] = {}
    for mode in _ordered_modes(part["mode"].unique()):
        sub = part[part["mode"] == mode]
        cells = []
        means[mode] = {}
        for t in targets:
            hit = sub[sub["target_epsilon"] == t] if mode in PRIVATE_MODES else sub
            if hit.empty or hit.iloc[0][f"{metric}_mean"] != hit.iloc[0][f"{metric}_mean"]:
                cells.append("—")
                continue
            r = hit.iloc[0]
            means[mode][t] = r[f"{metric}_mean"]
            cell = f"{scale * r[f'{metric}_mean']:.{digits}f}"
            if r["seeds"] > 1:  # one seed has no spread: none is shown
                cell += f" ± {scale * r[f'{metric}_sd']:.{digits}f}"
            cells.append(f"**{cell}**" if best[t] == mode else cell)
        name = f"`{mode}` (CorrDP ε)" if mode in OTHER_RELATION else f"`{mode}`"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    unit = "points" if scale == 100.0 else "log loss" if title == METRIC_TITLES["loss"][0] else metric
    pairs = (("fdp", "dp"), ("fdp", "public"), ("fdp", "fdp-dpsgd"), ("corrdp", "dp"), ("corrdp", "fdp"))
    for a, b in pairs:
        if a in means and b in means and means[a] and means[b]:
            cells = [
                f"{scale * (means[a][t] - means[b][t]):+.{digits}f}"
                if t in means[a] and t in means[b] else "—"
                for t in targets
            ]
            lines.append(f"| `{a}` − `{b}` ({unit}) | " + " | ".join(cells) + " |")
    baselines = [m for m in BASELINES if means.get(m)]
    if "fdp" in means and baselines:
        pick = max if METRIC_TITLES[metric][2] else min
        cells = []
        for t in targets:
            ref = [means[m][t] for m in baselines if t in means[m]]
            cells.append(f"{scale * (means['fdp'][t] - pick(ref)):+.{digits}f}"
                         if t in means["fdp"] and ref else "—")
        names = ", ".join(f"`{m}`" for m in baselines)
        lines.append(f"| `fdp` − best of {names} ({unit}) | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


#: The baselines the default ``fdp`` must match (``fdp`` − the best of them per ε).
BASELINES = ("dp", "fdp-dpsgd", "public")
#: Issue 13's criterion: ``fdp`` at least the best baseline's accuracy minus this many points…
TARGET_POINTS = 0.3


def _target_table(part, targets: Sequence[float]) -> list[str]:
    """"Default fdp vs the best baseline": per ε, fdp's accuracy and log loss beside
    the best of :data:`BASELINES` in each (named), the differences, and whether fdp
    is within :data:`TARGET_POINTS` points in accuracy and no worse in log loss.
    """
    modes = set(part["mode"])
    baselines = [m for m in BASELINES if m in modes]
    if "fdp" not in modes or not baselines or part["loss_mean"].isna().all():
        return []
    if part["accuracy_mean"].isna().all():  # a diffusion model: its loss and fd tables score it
        return []

    def mean(mode: str, target: float, metric: str) -> float | None:
        sub = part[part["mode"] == mode]
        hit = sub[sub["target_epsilon"] == target] if mode in PRIVATE_MODES else sub
        value = hit.iloc[0][f"{metric}_mean"] if len(hit) else float("nan")
        return None if value != value else float(value)

    lines = [
        f"**Default `fdp` vs the best of {', '.join(f'`{m}`' for m in baselines)}** "
        f"(met: accuracy ≥ best − {TARGET_POINTS:g} points and log loss ≤ best)",
        "",
        "| ε | `fdp` acc. % | best baseline acc. % | Δ points | `fdp` log loss | best baseline log loss "
        "| Δ log loss | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in targets:
        fdp_acc, fdp_loss = mean("fdp", t, "accuracy"), mean("fdp", t, "loss")
        accs = {m: v for m in baselines if (v := mean(m, t, "accuracy")) is not None}
        losses = {m: v for m in baselines if (v := mean(m, t, "loss")) is not None}
        if fdp_acc is None or fdp_loss is None or not accs or not losses:
            continue
        best_a, best_l = max(accs, key=accs.__getitem__), min(losses, key=losses.__getitem__)
        d_acc, d_loss = 100 * (fdp_acc - accs[best_a]), fdp_loss - losses[best_l]
        met = "yes" if d_acc >= -TARGET_POINTS - 1e-9 and d_loss <= 1e-12 else "**no**"
        lines.append(
            f"| {t:g} | {100 * fdp_acc:.1f} | {100 * accs[best_a]:.1f} (`{best_a}`) | {d_acc:+.2f} | "
            f"{fdp_loss:.4f} | {losses[best_l]:.4f} (`{best_l}`) | {d_loss:+.4f} | {met} |"
        )
    return [*lines, ""]


def _ordered_modes(modes: Sequence[str]) -> list[str]:
    return [m for m in MODES if m in set(modes)] + sorted(set(modes) - set(MODES))


def _title(dataset: str, rows, titles: Mapping[str, str] | None) -> str:
    if titles and dataset in titles:
        return titles[dataset]
    if "num_records" in rows.columns and rows["num_records"].notna().any():
        return f"{dataset} (N = {int(rows['num_records'].dropna().iloc[0]):,} training records)"
    return dataset


def spent_text(row: Mapping[str, Any]) -> str:
    """The budget an ``interrupted.csv`` row records, in words: ``≤ ε (upper bound,
    relation, δ; charges)``, or why it is unknown.
    """
    eps = float(row.get("epsilon", math.nan))
    if math.isnan(eps):
        return f"unknown ({row.get('note') or 'not accounted'})"
    if row.get("charges") == 0:
        return "0 (no privacy ledger: nothing was charged)"
    delta = float(row.get("delta", math.nan))
    charges = row.get("charges")
    return (f"≤ {_fmt_eps(eps)} (upper bound, {row.get('relation')}, δ = {delta:.3g}; "
            f"{charges} charge{'' if charges == 1 else 's'})")


def _interrupted_lines(frame, interrupted: Sequence[Mapping[str, Any]]) -> list[str]:
    """The section on interrupted runs: those resumed (results' ``resumed_after_round``)
    and those kept aside with the budget their ledgers record.
    """
    resumed = (frame[frame["resumed_after_round"].notna()] if "resumed_after_round" in frame
               else frame.iloc[0:0])
    if resumed.empty and not interrupted:
        return []
    lines = ["## Interrupted runs", "",
             "A ledger is never deleted: an interrupted run is resumed from its checkpoint (its ledger "
             "keeps every charge; a round charged but not checkpointed is charged again, within the "
             "run's ε above), or, when it cannot be, its directory is kept aside and the run starts "
             "afresh.", ""]
    for _, r in resumed.iterrows():
        lines.append(f"- `{r['mode']}` target ε {r['target_epsilon']:g}, seed {int(r['seed'])}: resumed "
                     f"after round {int(r['resumed_after_round'])}; its ε above is the whole ledger's."
                     if r["target_epsilon"] == r["target_epsilon"] else
                     f"- `{r['mode']}` seed {int(r['seed'])}: resumed after round "
                     f"{int(r['resumed_after_round'])}.")
    if interrupted:
        if not resumed.empty:
            lines.append("")
        lines += [
            "Kept aside (each spent its ε **in addition** to the rerun's, on the same records):", "",
            "| run | kept at | why not resumed | spent ε |",
            "|---|---|---|---|",
        ]
        for row in interrupted:
            why = str(row.get("reason", "")).replace("|", "\\|")
            lines.append(f"| `{row['run']}` | `{row['kept_at']}` | {why} | {spent_text(row)} |")
    return [*lines, ""]


def write_summary(
    frame, path: Path, *, command: str = "", titles: Mapping[str, str] | None = None,
    per_mode: Mapping[str, Mapping[str, object]] | None = None,
    interrupted: Sequence[Mapping[str, Any]] = (),
) -> None:
    """``summary.md``: every metric (mean ± sd over seeds) per mode and target ε,
    the best private mode per ε in bold; ``per_mode`` (the sweep's ``[mode.NAME]``
    tables) is listed with :data:`SELECTION_NOTE`; resumed runs and the
    ``interrupted`` runs kept aside (``interrupted.csv`` rows) with the budget their
    ledgers record.
    """
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
            "Metrics on the held-out split (mean ± sd over seeds). Each private mode "
            "is calibrated to end at the target ε (add/remove, upper bound"
            + (f", δ = {delta.iloc[0]:.3g}" if len(delta) else "")
            + "); `nonprivate` (ε = ∞) and `public` (ε = 0) do not depend on ε. "
            f"Engine: {', '.join(sorted(rows['engine'].astype(str).unique()))}; "
            f"seeds: {sorted(rows['seed'].astype(int).unique().tolist())}."
        )
        if part["mode"].isin(list(OTHER_RELATION)).any():
            lines += ["", CORRDP_NOTE]
        mine = {m: keys for m, keys in (per_mode or {}).items() if keys and m in set(part["mode"])}
        if mine:
            listed = "; ".join(
                f"`{m}`: " + ", ".join(f"{k} = {v!r}" for k, v in keys.items()) for m, keys in mine.items()
            )
            lines += ["", f"Per-mode settings (every other key as the sweep's): {listed}. {SELECTION_NOTE}"]
        if "noise_source" in rows and (rows["noise_source"].astype(str) != NOISE_SOURCE_SECRET).any():
            lines.append("")
            lines.append(f"**Warning:** {REPRODUCIBLE_WARNING}.")
        lines.append("")
        lines += _target_table(part, targets)
        if (part["seeds"] < 2).any():
            lines += ["", "One seed: a cell shows its value alone (no spread over seeds)."]
        for metric in METRIC_TITLES:
            if part[f"{metric}_mean"].notna().any():
                diffusion = metric == "loss" and part["fd_mean"].notna().any()
                lines += _metric_table(part, targets, metric, DIFFUSION_LOSS if diffusion else None)
            elif metric == "auc" and part["fd_mean"].isna().all():  # (a diffusion model has no AUC)
                lines += ["", "No AUC: it is reported for binary tasks only (both classes in the "
                          "held-out split), and this task is not one.", ""]
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
                    eps = (f"ε_corrdp {_fmt_eps(r['epsilon_corrdp_max'])}" if mode in OTHER_RELATION
                           else f"ε {_fmt_eps(r['epsilon_max'])}")
                    cells.append(f"{eps}, σ {r['noise_multiplier']:.3g}")
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
    lines += _interrupted_lines(frame, interrupted)
    if command:
        lines += ["Produced by:", "", "```bash", command, "```", ""]
    atomic_write(path, ("# Comparison at equal ε\n\n" + "\n".join(lines)).encode())


_STYLE = {
    "dp": ("tab:red", "s"),
    "fdp-dpsgd": ("tab:orange", "^"),
    "fdp": ("tab:blue", "o"),
    "nonprivate": ("black", None),
    "public": ("tab:green", None),
    "corrdp": ("tab:purple", "D"),
}


def plot_privacy_utility(
    frame, path: Path, *, titles: Mapping[str, str] | None = None, metric: str = "accuracy"
) -> None:
    """``privacy_utility.png``: ``metric`` vs ε per mode (mean ± sd over seeds);
    ``nonprivate`` and ``public`` as horizontal reference lines.
    """
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    from fedfdp.outputs import atomic_write

    if metric not in METRIC_TITLES:
        raise ValueError(f"--metric={metric!r}: must be one of {', '.join(METRIC_TITLES)}")
    title, scale, _ = METRIC_TITLES[metric]
    label = title.split(",")[0].lower() + (" (%)" if scale == 100.0 else "")
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
                other = mode in OTHER_RELATION
                xcol = f"{OTHER_RELATION[mode]}_mean" if other else "epsilon_mean"
                ax.errorbar(
                    sub[xcol], scale * sub[f"{metric}_mean"],
                    yerr=scale * sub[f"{metric}_sd"], color=color, marker=marker, capsize=3,
                    linestyle=":" if other else "-", label=f"{mode} (CorrDP ε)" if other else mode,
                )
            else:
                m, s = scale * sub[f"{metric}_mean"].iloc[0], scale * sub[f"{metric}_sd"].iloc[0]
                eps = "ε = ∞" if mode == Mode.NONPRIVATE else "ε = 0"
                ax.axhline(m, color=color, linestyle="--", linewidth=1.2, label=f"{mode} ({eps})")
                if s > 0:
                    ax.axhspan(m - s, m + s, color=color, alpha=0.08)
        if xs:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs])
        corr = part["mode"].isin(list(OTHER_RELATION)).any()
        ax.set_xlabel("ε (add/remove, upper bound" + ("; corrdp: CorrDP ε" if corr else "") + ")")
        ax.set_ylabel(f"held-out {label}")
        ax.set_title(_title(dataset, frame[frame["dataset"] == dataset], titles), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def default_metric(frame: Any) -> str:
    """The plot's metric when none is asked for: ``fd`` when every run is a generative
    model's (no accuracy, a Fréchet distance), else ``accuracy``.
    """
    if "fd" in frame and frame["fd"].notna().all() and frame["accuracy"].isna().all():
        return "fd"
    return "accuracy"


def write_report(out: Path, *, command: str = "", title: str = "", metric: str | None = None) -> None:
    """Write ``summary.md`` and ``privacy_utility.png`` (of ``metric``; by default
    :func:`default_metric`) from ``results.csv`` (``title`` replaces the dataset heading
    when the results hold one dataset).
    """
    frame = read_results(out)
    if frame.empty:
        return
    metric = metric or default_metric(frame)
    datasets = frame["dataset"].unique()
    titles = {datasets[0]: title} if title and len(datasets) == 1 else None
    per_mode = {}
    if (out / SWEEP_FILE).is_file():
        import tomllib

        per_mode = tomllib.loads((out / SWEEP_FILE).read_text()).get("mode", {})
    write_summary(frame, out / SUMMARY_FILE, command=command, titles=titles, per_mode=per_mode,
                  interrupted=read_interrupted(out))
    plot_privacy_utility(frame, out / PLOT_FILE, titles=titles, metric=metric)
