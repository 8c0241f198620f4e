"""Results pages of the docs site, generated from the files under ``docs/results/``.

``docs/results/manifest.toml`` lists every results set: its files, the
commands that produced them, the machine and a note. Each set becomes one
page ``results/<page>.md`` whose tables are computed here from the raw files
(mean ± sample standard deviation over seeds), so a page cannot drift from
its data. ``results/index.md`` lists the sets.

Two ways to use it:

* as a mkdocs hook (``hooks: [docs/gen_results.py]`` in ``mkdocs.yml``): the
  pages are added to the site in memory at build time; the build fails if a
  file under ``docs/results/`` is claimed by no set, if a claimed file is
  missing, or if a name of ``fedfdp.__all__`` is missing from ``docs/api.md``;
* as a script, ``python docs/gen_results.py OUT_DIR``: writes the same pages
  as Markdown files into ``OUT_DIR`` (to read them without building the site).
"""

from __future__ import annotations

import ast
import json
import math
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

DOCS = Path(__file__).resolve().parent
RESULTS = DOCS / "results"
MANIFEST = RESULTS / "manifest.toml"
KINDS = ("ddpm-fid", "runs-jsonl")


class ResultsError(ValueError):
    """A results file or the manifest is inconsistent; the message names it."""


@dataclass(frozen=True)
class ResultSet:
    """One ``[[set]]`` of the manifest."""

    page: str
    title: str
    kind: str
    files: tuple[str, ...]
    also: tuple[str, ...]
    commands: tuple[str, ...]
    machine: str
    note: str
    discussion: str
    figure: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ResultsError(f"manifest: kind={self.kind!r} of set {self.page!r}: must be one of {KINDS}")
        if not self.files:
            raise ResultsError(f"manifest: set {self.page!r} names no files")
        for name in self.files + self.also:
            if not (RESULTS / name).is_file():
                raise ResultsError(f"manifest: file {name!r} of set {self.page!r} does not exist")


def load_sets() -> list[ResultSet]:
    """The manifest's sets, checked against the files under ``docs/results/``."""
    raw = tomllib.loads(MANIFEST.read_text(encoding="utf-8"))
    sets = [
        ResultSet(
            page=s["page"],
            title=s["title"],
            kind=s["kind"],
            files=tuple(s["files"]),
            also=tuple(s.get("also", ())),
            commands=tuple(s.get("commands", ())),
            machine=s.get("machine", ""),
            note=s.get("note", ""),
            discussion=s.get("discussion", ""),
            figure=s.get("figure", ""),
        )
        for s in raw.get("set", [])
    ]
    claimed = {name for s in sets for name in s.files + s.also}
    present = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file() and p != MANIFEST}
    unclaimed = sorted(present - claimed)
    if unclaimed:
        raise ResultsError(f"docs/results: {unclaimed} claimed by no set of manifest.toml")
    pages = [s.page for s in sets]
    if len(set(pages)) != len(pages) or "index" in pages:
        raise ResultsError(f"manifest: page names {pages} must be unique and not 'index'")
    return sets


def mean_sd(values: pd.Series, digits: int) -> str:
    """``mean ± sd`` (sample standard deviation, ``ddof=1``); the mean alone for one value."""
    v = values.dropna().astype(float)
    if v.empty:
        return "—"
    if len(v) == 1:
        return f"{v.iloc[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_eps(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return "∞" if math.isinf(float(value)) else f"{float(value):.4g}"


def ddpm_body(s: ResultSet) -> str:
    frames = []
    for name in s.files:
        frame = pd.read_csv(RESULTS / name)
        frame["file"] = name.rsplit("/", 1)[-1]
        frames.append(frame)
    data = pd.concat(frames, ignore_index=True)
    ref = data[data["method"].str.startswith("reference:")].drop_duplicates("method")
    runs = data[~data["method"].str.startswith("reference:")].copy()
    runs["alpha"] = runs["alpha"].fillna(1.0)
    check_against_summaries(s, runs)
    keys = ["file", "method", "alpha", "target_epsilon"]
    rows = []
    for key, group in runs.groupby(keys, sort=False, dropna=False):
        file, method, alpha, _ = key
        label = method if float(alpha) == 1.0 else f"{method} (α = {float(alpha):g})"
        sigma = group["noise_multiplier"].dropna()
        rows.append(
            [
                f"`{label}`",
                fmt_eps(group["epsilon"].max()),
                f"{sigma.iloc[0]:.3f}" if not sigma.empty else "—",
                str(group["seed"].nunique()),
                f"{int(group['steps'].iloc[0])}",
                mean_sd(group["fid"], 1),
                mean_sd(group["wall_seconds"], 0),
                f"`{file}`",
            ]
        )
    header = ["method", "ε (accounted, upper)", "σ", "seeds", "steps", "FD", "wall s", "file"]
    parts = ["## Fréchet distance, mean ± sd over seeds", markdown_table(header, rows)]
    parts.append(
        "References (no training): "
        + "; ".join(
            f"{m.split(':', 1)[1]} FD {v:.2f}" for m, v in zip(ref["method"], ref["fid"], strict=True)
        )
        + "."
    )
    classes = [c for c in data.columns if c.startswith("fid_class")]
    if classes:
        crow = []
        for key, group in runs.groupby(keys, sort=False, dropna=False):
            file, method, alpha, target = key
            label = method if float(alpha) == 1.0 else f"{method} (α = {float(alpha):g})"
            crow.append(
                [f"`{label}`", fmt_eps(target), f"`{file}`"] + [f"{group[c].mean():.1f}" for c in classes]
            )
        parts.append("## Per-class FD, mean over seeds")
        parts.append(
            markdown_table(
                ["method", "target ε", "file"] + [c.removeprefix("fid_class") for c in classes], crow
            )
        )
    return "\n\n".join(parts)


def check_against_summaries(s: ResultSet, runs: pd.DataFrame) -> None:
    """The run's own summaries (``also``, written by the benchmark) agree with the CSVs.

    Each summary row ``| method | ε | σ | seeds | fid | ...`` gives ``mean ± sd`` at three
    decimals; the same statistic recomputed here from the CSV rows must print identically.
    """
    computed = set()
    for (_, method, alpha, _), group in runs.groupby(
        ["file", "method", "alpha", "target_epsilon"], dropna=False
    ):
        label = method if float(alpha) == 1.0 else f"{method} (α = {float(alpha):g})"
        fid = group["fid"].astype(float)
        computed.add((label, f"{fid.mean():.3f} ± {fid.std(ddof=1):.3f}"))
    for name in s.also:
        if not name.endswith(".md"):
            continue
        for line in (RESULTS / name).read_text(encoding="utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 5 or cells[0] in ("method", "") or set(cells[0]) <= {"-"}:
                continue
            if "±" in cells[4] and (cells[0], cells[4]) not in computed:
                raise ResultsError(f"{name}: row {cells[0]!r} FD {cells[4]!r} disagrees with the CSV files")


def read_jsonl(path: Path) -> tuple[pd.DataFrame, int]:
    """The JSON-object lines of ``path`` and the number of other non-empty lines."""
    records, other = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            other += bool(line.strip())
            continue
        if isinstance(value, dict):
            records.append(value)
        else:
            other += 1
    if not records:
        raise ResultsError(f"{path}: no JSON records")
    return pd.DataFrame.from_records(records), other


def runs_body(s: ResultSet) -> tuple[str, list[str]]:
    frames, skipped = [], 0
    for name in s.files:
        frame, other = read_jsonl(RESULTS / name)
        frames.append(frame)
        skipped += other
    data = pd.concat(frames, ignore_index=True)
    missing = {"task", "variant", "eps", "seed", "acc", "loss"} - set(data.columns)
    if missing:
        raise ResultsError(f"{s.files}: records lack {sorted(missing)}")
    commands = list(s.commands)
    if not commands and "study" in data.columns:
        for study, group in data.groupby("study", sort=True):
            product = (
                group["task"].nunique()
                * group["variant"].nunique()
                * group["eps"].nunique()
                * group["seed"].nunique()
            )
            cmd = (
                "python benchmarks/recipe_candidates.py"
                f" --tasks {','.join(sorted(group['task'].unique()))}"
                f" --variants {','.join(sorted(group['variant'].unique()))}"
                f" --eps {','.join(f'{e:g}' for e in sorted(group['eps'].unique()))}"
                f" --seeds {','.join(str(int(x)) for x in sorted(group['seed'].unique()))}"
                f"   # study {study}: {len(group)} runs"
                + ("" if len(group) == product else f" (not the full product of {product})")
            )
            commands.append(cmd)
    parts = [
        f"{len(data)} runs; {data['task'].nunique()} tasks, {data['variant'].nunique()} variants, "
        f"ε ∈ {{{', '.join(f'{e:g}' for e in sorted(data['eps'].unique()))}}}"
        + (f"; {skipped} non-JSON lines skipped." if skipped else ".")
    ]
    for task, group in data.groupby("task", sort=True):
        eps_values = sorted(group["eps"].unique())
        rows = []
        for variant, vgroup in group.groupby("variant", sort=True):
            row = [f"`{variant}`"]
            for eps in eps_values:
                cell = vgroup[vgroup["eps"] == eps]
                row.append(
                    "—"
                    if cell.empty
                    else f"{mean_sd(100 * cell['acc'], 2)} / {mean_sd(cell['loss'], 3)} (n={len(cell)})"
                )
            rows.append(row)
        parts.append(f"## `{task}`: held-out accuracy % / log loss, mean ± sd")
        parts.append(markdown_table(["variant"] + [f"ε = {e:g}" for e in eps_values], rows))
    return "\n\n".join(parts), commands


def page(s: ResultSet) -> str:
    """The Markdown of one set's page (it lives at ``results/<page>.md``)."""
    if s.kind == "ddpm-fid":
        body, commands = ddpm_body(s), list(s.commands)
    else:
        body, commands = runs_body(s)
    out = [f"# {s.title}", "<!-- Generated by docs/gen_results.py from docs/results/; do not edit. -->"]
    if s.note:
        out.append(" ".join(s.note.split()))
    if s.discussion:
        out.append(f"Discussion: [{s.discussion.split('#')[0]}](../{s.discussion}).")
    if s.machine:
        out.append(f"Machine: {s.machine}.")
    if commands:
        out.append("## Commands\n\n```bash\n" + "\n".join(commands) + "\n```")
    out.append(body)
    if s.figure:
        out.append(f"![samples]({'../' + s.figure})")
    files = ", ".join(f"[`{name}`]({name})" for name in s.files + s.also)
    out.append(f"Raw files (under `docs/results/`): {files}.")
    return "\n\n".join(out) + "\n"


def index_page(sets: list[ResultSet]) -> str:
    rows = [[f"[{s.title}]({s.page}.md)", ", ".join(f"`{f}`" for f in s.files)] for s in sets]
    return (
        "# Results\n\n"
        "Measured runs, one page per results set. Every table is computed at build time\n"
        "by `docs/gen_results.py` from the raw files under `docs/results/` (listed with\n"
        "the commands that produced them in `docs/results/manifest.toml`), so the pages\n"
        "cannot drift from the data. The discussion of each set lives in its guide.\n\n"
        + markdown_table(["set", "files"], rows)
        + "\n"
    )


def pages() -> dict[str, str]:
    """``{path under docs/: Markdown}`` of every generated page."""
    sets = load_sets()
    out = {"results/index.md": index_page(sets)}
    for s in sets:
        out[f"results/{s.page}.md"] = page(s)
    return out


def public_names() -> list[str]:
    """``fedfdp.__all__``, read from the source without importing the package."""
    tree = ast.parse((DOCS.parent / "fedfdp" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [str(ast.literal_eval(e)) for e in node.value.elts]  # type: ignore[attr-defined]
    raise ResultsError("fedfdp/__init__.py: no __all__")


def check_api_page() -> None:
    """Every public name has a ``::: fedfdp.<module>.<name>`` entry in ``docs/api.md``."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = {line.split()[1].rsplit(".", 1)[-1] for line in text.splitlines() if line.startswith("::: ")}
    missing = sorted(set(public_names()) - documented)
    if missing:
        raise ResultsError(f"docs/api.md: public names {missing} have no '::: fedfdp.…' entry")


# mkdocs hook -----------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Add the generated results pages to the site (mkdocs hook)."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    try:
        check_api_page()
        generated = pages()
    except (ResultsError, OSError, KeyError, ValueError) as exc:
        raise PluginError(f"docs/gen_results.py: {exc}") from exc
    for path, content in generated.items():
        if files.get_file_from_path(path) is not None:
            raise PluginError(f"docs/gen_results.py: {path} exists in docs/; it is generated")
        files.append(File.generated(config, path, content=content))
    return files


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/gen_results.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    check_api_page()
    for path, content in pages().items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
