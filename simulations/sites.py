"""``fedfdp sites``: split one table into per-site files, to try ``data-location = "node"``.

``fedfdp sites TABLE --by COLUMN --out DIR [--test-fraction 0.2] [--seed 0]``
    One file per distinct value of ``COLUMN`` (a site: a device, a phone, a
    hospital), ``DIR/site-K.csv`` for ``K = 0..S-1`` in the sorted order of
    the values, each holding that site's training rows (all columns but
    ``COLUMN``); ``test-fraction`` of every site's rows go to the server's
    held-out file ``DIR/heldout.csv``; ``DIR/sites.csv`` maps ``K`` to the
    value and its row counts. It prints the node config of every SuperNode
    and the run-config keys that go with them.

In a real deployment every site already holds its own file: this command is
for trials on one machine (``docs/deploy.md``, "Each site's own data").
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from fedfdp.config import ConfigError

if TYPE_CHECKING:
    import pandas as pd

SITE_FILE = "site-{}.csv"
HELDOUT_FILE = "heldout.csv"
INDEX_FILE = "sites.csv"


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


def split_sites(table: str | Path, by: str, out: str | Path, test_fraction: float = 0.2,
                seed: int = 0) -> pd.DataFrame:
    """Write the per-site files and the held-out file; return the index
    (``site, value, train_rows, heldout_rows``).

    Raises
    ------
    ConfigError
        Unknown column, missing site values, a test fraction outside [0, 1),
        a site left without training rows, or an ``out`` that is not an empty
        (or new) directory (nothing is overwritten).
    """
    import numpy as np  # imported here: `fedfdp --help` stays fast
    import pandas as pd

    from fedfdp.data.tabular import read_table
    from fedfdp.outputs import prepare_output_dir

    if not 0 <= test_fraction < 1:
        raise ConfigError(f"--test-fraction={test_fraction}: must be in [0, 1)")
    frame = read_table(table, key="TABLE")
    if by not in frame.columns:
        raise ConfigError(
            f"--by={by!r}: no such column in {str(table)!r} (columns: {list(frame.columns)[:30]})"
        )
    if frame[by].isna().any():
        raise ConfigError(f"--by={by!r}: {int(frame[by].isna().sum())} row(s) have no site")
    out = prepare_output_dir(out, "--out", empty=True)
    rng = np.random.default_rng(seed)
    values = frame[by].astype(str)
    rows, heldout = [], []
    for k, value in enumerate(sorted(values.unique())):
        part = frame[values == value].drop(columns=[by])
        n_test = round(test_fraction * len(part))
        if n_test >= len(part):
            raise ConfigError(
                f"--test-fraction={test_fraction}: site {value!r} ({len(part)} rows) keeps no training row"
            )
        order = rng.permutation(len(part))
        heldout.append(part.iloc[np.sort(order[:n_test])])
        _write_csv(part.iloc[np.sort(order[n_test:])], out / SITE_FILE.format(k))
        rows.append({"site": k, "value": value, "train_rows": len(part) - n_test, "heldout_rows": n_test})
    if test_fraction > 0:
        _write_csv(pd.concat(heldout), out / HELDOUT_FILE)
    index = pd.DataFrame(rows)
    _write_csv(index, out / INDEX_FILE)
    return index


def _cmd(args: argparse.Namespace) -> int:
    index = split_sites(args.table, args.by, args.out, args.test_fraction, args.seed)
    out = Path(args.out).resolve()
    sites = len(index)
    print(f"{sites} sites, {int(index['train_rows'].sum())} training rows, "
          f"{int(index['heldout_rows'].sum())} held out, in {out}")
    print("\nSuperNode node configs (one SuperNode per site):")
    for k in index["site"]:
        print(f'  --node-config "partition-id={k} num-partitions={sites} '
              f"data-path='{out / SITE_FILE.format(k)}'\"")
    print("\nRun config (plus your column lists and their declared encodings):")
    print(f"  dataset = \"csv\"\n  data-location = \"node\"\n  num-devices = {sites}")
    if args.test_fraction > 0:
        print(f"  test-path = \"{out / HELDOUT_FILE}\"")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``fedfdp sites`` to the command line."""
    p = sub.add_parser("sites", help="split one table into per-site files (data-location='node')")
    p.add_argument("table", help="a .csv, .tsv or .parquet file")
    p.add_argument("--by", required=True, help="the column whose values are the sites")
    p.add_argument("--out", required=True, help="an empty folder for the site files")
    p.add_argument("--test-fraction", type=float, default=0.2, help="held-out share of each site")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out choice")
    p.set_defaults(func=_cmd)

