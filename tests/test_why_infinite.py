"""Every ∞ that ``fedfdp account`` prints comes with one line saying why (issue 30, point 3).

The reason is checked against the accountant itself (independent of the wording): an ∞
explained as "the thresholds' δ leaves nothing" must be one where the δ the thresholded
histograms take is at least the run's δ; one explained through Proposition 1 must be a
replacement ∞ whose add/remove ε is finite; and the CLI prints one ``why ∞`` line, and one
``why_infinite`` entry in ``--json``, for every ∞ column and for none else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fedfdp.accounting import FDPAccountant
from fedfdp.accounting.events import Relation, SubsampledGaussian, ThresholdedHistogram
from fedfdp.ledger_replay import why_infinite
from simulations.cli import main


def _accountant(histograms: int, delta_t: float) -> tuple[FDPAccountant, list[tuple[Any, int]]]:
    """A ledger like a dp run's with three estimates (issue 30's): σ_e ≈ 11, then rounds."""
    events: list[tuple[Any, int]] = [(ThresholdedHistogram(10.96, delta_t), histograms),
                                     (SubsampledGaussian(0.623, 0.05), 3)]
    acc = FDPAccountant()
    for event, count in events:
        acc.compose(event, count)
    return acc, events


def test_a_replacement_infinity_from_the_thresholds_is_explained_through_proposition_1():
    acc, events = _accountant(3, 3.47e-5)
    delta = 1.04e-3
    add_remove = acc.epsilon(delta)
    assert np.isfinite(add_remove)
    assert acc.epsilon(delta, Relation.REPLACEMENT) == np.inf  # the case to explain
    why = why_infinite(events, delta, Relation.REPLACEMENT, add_remove=add_remove)
    assert "\n" not in why
    assert why.startswith("replacement") and "Prop" in why and "3 thresholded histogram" in why
    assert f"{3 * -np.log1p(-3.47e-5):.3g}" in why  # the δ they take: Σ −ln(1 − δ_t)


def test_thresholds_taking_the_whole_delta_are_named_under_either_relation():
    acc, events = _accountant(4, 1e-3)
    delta = 2e-3  # below the thresholds' 4e-3
    for relation in (Relation.ADD_REMOVE, Relation.REPLACEMENT):
        assert acc.epsilon(delta, relation) == np.inf
        why = why_infinite(events, delta, relation)
        assert why.startswith(str(relation)) and "nothing is left" in why and "4 thresholded" in why


def test_training_without_noise_is_named():
    why = why_infinite([], 1e-5, Relation.ADD_REMOVE, mode="nonprivate", unbounded=True)
    assert "'nonprivate'" in why and "without noise" in why


def _run(tmp_path: Path, **keys: Any) -> Path:
    from fedfdp import run_centralised
    from fedfdp.config import load_config
    from fedfdp.run_plan import resolve_released

    rng = np.random.default_rng(0)
    table = tmp_path / "t.csv"
    pd.DataFrame({"speed": rng.normal(size=200), "age": rng.integers(18, 66, 200),
                  "label": rng.integers(0, 2, 200)}).to_csv(table, index=False)
    out = tmp_path / "run"
    cfg = load_config({"dataset": "csv", "data-path": str(table), "public-columns": "speed",
                       "private-columns": "age", "label-column": "label", "num-devices": 4, "num-rounds": 2,
                       "progress": False, "out-dir": str(out), **keys})
    run_centralised(resolve_released(cfg))
    return out


@pytest.mark.parametrize("keys", [
    {"private-statistics": "estimate", "target-epsilon": 3.0},  # replacement ∞ (issue 30)
    {"mode": "nonprivate", "private-ranges": "age=18:66"},  # both ∞
    {"private-ranges": "age=18:66", "noise-multiplier": 1.0},  # none
], ids=["estimates", "nonprivate", "finite"])
def test_account_run_explains_every_infinity_in_one_line(tmp_path, capsys, keys):
    out = _run(tmp_path, **keys)
    assert main(["account", "--run", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    infinite = {c for c in ("epsilon", "epsilon_replacement") if report[c] is None}
    assert set(report.get("why_infinite", {})) == infinite
    assert main(["account", "--run", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    shown = [line for line in text if line.split("  ")[0].startswith("ε ") and "∞" in line]
    why = [line for line in text if line.lstrip().startswith("why ∞")]
    assert len(shown) == len(why) == len(infinite)
    if keys.get("mode") == "nonprivate":
        assert all("without noise" in line for line in why)
    elif infinite:
        assert infinite == {"epsilon_replacement"} and "thresholded histogram" in why[0]
