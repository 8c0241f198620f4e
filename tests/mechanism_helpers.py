"""Resolving a mechanism in tests over a given number of records (one device)."""

from __future__ import annotations

from fedfdp.config import Config
from fedfdp.mechanism import PublicFacts, ResolvedMechanism, resolve_mechanism


def resolve(cfg: Config, num_records: int, num_params: int = 10) -> ResolvedMechanism:
    """The mechanism ``cfg`` resolves to over ``num_records`` records on one device
    and a model of ``num_params`` parameters."""
    return resolve_mechanism(cfg, PublicFacts((num_records,), num_params))
