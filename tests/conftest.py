"""Fixtures shared by the test files (pytest collects this module first).

``deployment``
    ``make(**kwargs) -> Deployment``: real ``flower-superlink`` / ``flower-supernode``
    processes on loopback (:class:`tests.deploy_helpers.Deployment`); every deployment
    made is closed after the test, and the test fails if a process of it is left.
``sites``
    ``(folder, table)``: the trips table (:func:`tests.site_tables.trips`) split into one
    file per phone (``site-K.csv``) and a held-out file, as ``fedfdp sites`` writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    from tests.deploy_helpers import Deployment

    made: list[Deployment] = []

    def make(**kwargs: Any) -> Deployment:
        d = Deployment(tmp_path / f"deploy{len(made)}", **kwargs)
        made.append(d)
        return d

    try:
        yield make
    finally:
        errors = []
        for d in made:
            print(f"[{d.root.name}: {d.cpu_seconds():.0f} CPU-s in its processes]")
            try:
                d.close()
            except RuntimeError as exc:
                errors.append(str(exc))
        assert not errors, errors
        assert all(not d.leftover() for d in made)


@pytest.fixture
def sites(tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    from simulations.sites import split_sites
    from tests.site_tables import trips

    table = trips()
    table.to_csv(tmp_path / "trips.csv", index=False)
    split_sites(tmp_path / "trips.csv", "phone", tmp_path / "sites", test_fraction=0.25, seed=1)
    return tmp_path / "sites", table
