"""Resolving a mechanism in tests over a given number of records (one device), and
reading what a run wrote (its ledger, its charges' events)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from fedfdp.accounting import PrivacyEvent, SubsampledGaussian, ThresholdedHistogram
from fedfdp.config import Config
from fedfdp.ledger import Ledger, read_ledger
from fedfdp.mechanism import PublicFacts, ResolvedMechanism, resolve_mechanism


def resolve(cfg: Config, num_records: int, num_params: int = 10, devices: int = 1) -> ResolvedMechanism:
    """The mechanism ``cfg`` resolves to over ``num_records`` records split evenly over
    ``devices`` devices, and a model of ``num_params`` parameters."""
    sizes = [num_records // devices + (1 if d < num_records % devices else 0) for d in range(devices)]
    return resolve_mechanism(cfg, PublicFacts(tuple(sizes), num_params))


def written_ledger(run_dir: str | Path) -> Ledger:
    """The verified ledger of ``run_dir``; fails the test if the run wrote none."""
    ledger = read_ledger(run_dir)
    assert ledger is not None, f"{run_dir}: no ledger"
    return ledger


def fdp_event(event: PrivacyEvent | None) -> SubsampledGaussian | ThresholdedHistogram:
    """``event`` as an event :class:`~fedfdp.accounting.FDPAccountant` composes; fails
    the test if it is another kind (or None: a mechanism entry has no event)."""
    assert isinstance(event, SubsampledGaussian | ThresholdedHistogram), event
    return event


E = TypeVar("E", bound=PrivacyEvent)


def events_as(kind: type[E], events: Iterable[PrivacyEvent | None]) -> list[E]:
    """``events``, each checked to be a ``kind`` (fails the test on any other)."""
    out = []
    for event in events:
        assert isinstance(event, kind), event
        out.append(event)
    return out


def ledger_doc(run_dir) -> dict:
    """The verified ledger of ``run_dir`` as a mapping (``version``, ``entries``)."""
    from fedfdp.ledger import read_ledger

    ledger = read_ledger(run_dir)
    if ledger is None:
        raise FileNotFoundError(f"{run_dir}: no ledger")
    return ledger.to_dict()


def write_ledger_doc(run_dir, doc: dict) -> None:
    """Write ``doc``'s entries to ``run_dir``'s ledger file as they are (no hashing,
    no checks): how a test edits a ledger on disk."""
    import json
    from pathlib import Path

    from fedfdp.ledger import HEADER, LEDGER_FILE

    lines = [json.dumps(HEADER), *(json.dumps(e) for e in doc["entries"])]
    (Path(run_dir) / LEDGER_FILE).write_text("\n".join(lines) + "\n")
