"""The same configuration releases the same run, on both engines (tests/pinned_runs.py).

Every case of :data:`tests.pinned_runs.CASES` is run to its end and its fingerprint (the
mechanism digest and the whole ledger, ``config.toml``'s ``[resolved]`` table, every row
of ``metrics.csv`` with ε to the last digit, the final model, ``fedfdp account --run``)
is compared with the reference written by the code before the configuration's one door.
A refactoring that changes σ, δ, q, the event, a charge, a public or secret draw, the
normaliser or the order of anything fails here, naming the case, the engine and what
moved.
"""

import json

import pytest

from tests.pinned_runs import (
    MECHANISM_REFERENCE,
    MECHANISMS,
    REFERENCE,
    all_cases,
    compare,
    resolve_for,
    run_case,
)

WANT = json.loads(REFERENCE.read_text())


@pytest.mark.parametrize(("name", "engine"), all_cases(), ids=[f"{n}/{e}" for n, e in all_cases()])
def test_the_run_is_the_one_pinned_before_the_refactoring(name, engine, tmp_path):
    got = run_case(name, engine, tmp_path)
    assert compare(name, got, WANT[f"{name}/{engine}"]) == []


def test_the_reference_covers_every_mode_both_engines_and_secure_aggregation():
    from tests.pinned_runs import CASES

    modes = {CASES[k.split("/")[0]][0].get("mode", "fdp") for k in WANT}
    assert modes == {"fdp", "dp", "fdp-dpsgd", "public", "nonprivate", "corrdp"}
    assert {k.split("/")[1] for k in WANT} == {"centralised", "flower"}
    assert any(CASES[k.split("/")[0]][0].get("aggregation") == "secagg" for k in WANT)
    assert set(WANT) == {f"{n}/{e}" for n, e in all_cases()}


MECHANISMS_WANT = json.loads(MECHANISM_REFERENCE.read_text())


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_the_resolved_mechanism_is_the_one_pinned_before_the_refactoring(name):
    """σ, δ, q, p, C, γ and the event of every mode, unit and target (calibrations
    included, secure aggregation's too), to the last digit of the digest."""
    got = resolve_for(MECHANISMS[name])
    want = MECHANISMS_WANT[name]
    assert got["mechanism"] == want["mechanism"]
    assert got["digest"] == want["digest"]
