"""A node's ledger kept between charges: the same ε as a fresh replay, what another
process appended is read, and a file changed below what the node wrote is refused.

The reference is the file itself: :func:`fedfdp.ledger.read_ledger` (every hash, link
and event) replayed by :func:`fedfdp.ledger_replay.replay_ledger` into a fresh accountant.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfdp.accounting.events import SubsampledGaussian
from fedfdp.ledger import LEDGER_FILE, read_ledger
from fedfdp.ledger_replay import replay_ledger
from fedfdp.node_ledger import NodeLedger
from fedfdp.node_policy import NodePolicy, RoundRefused

POLICY = NodePolicy(max_epsilon=50.0, delta=1e-5, min_honest_shares=1, max_colluders=0, trust_server=True)
EVENT = SubsampledGaussian(2.0, 0.1)


def replayed(state: Path) -> tuple[float, int]:
    """ε of the file at the policy's δ, and its number of charges."""
    ledger = read_ledger(state)
    assert ledger is not None
    return float(replay_ledger(ledger).accountant.epsilon(POLICY.delta)), len(ledger.charges)


def test_charges_kept_between_them_account_as_the_file_replayed(tmp_path: Path) -> None:
    node, other = NodeLedger(tmp_path, POLICY), NodeLedger(tmp_path, POLICY)
    for r in range(1, 4):
        assert node.charge(1, r, EVENT) == replayed(tmp_path)[0]
    other_event = SubsampledGaussian(1.0, 0.3)  # another process of the node appends
    other.charge(1, 4, other_event)
    eps = node.charge(1, 5, EVENT)
    assert (eps, 5) == replayed(tmp_path)
    assert NodeLedger(tmp_path, POLICY).epsilon() == eps


@pytest.mark.parametrize("change", ["edit", "shrink", "delete"])
def test_a_file_changed_below_what_the_node_wrote_is_refused(tmp_path: Path, change: str) -> None:
    node = NodeLedger(tmp_path, POLICY)
    for r in range(1, 4):
        node.charge(1, r, EVENT)
    path = tmp_path / LEDGER_FILE
    raw = path.read_bytes()
    if change == "edit":  # same length: round 2 of the second entry says round 3
        at = raw.index(b'"round":2')
        changed = raw[:at] + b'"round":3' + raw[at + len(b'"round":2'):]
    elif change == "shrink":  # the last charge cut away, at a line boundary (a valid shorter chain)
        changed = raw[:raw.rstrip(b"\n").rindex(b"\n") + 1]
    else:
        changed = b""
    if changed:
        path.write_bytes(changed)
    else:
        path.unlink()
    for _ in range(2):  # and again: the node does not forget what it wrote
        with pytest.raises(RoundRefused, match="changed"):
            node.charge(1, 4, EVENT)
    assert (path.read_bytes() if changed else b"") == changed  # nothing written


def test_a_charge_after_its_own_parses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is parsed and replayed only when another process appended to it."""
    import fedfdp.node_ledger as module

    calls: list[Path] = []
    real = module.read_ledger

    def counted(state: Path) -> object:
        calls.append(state)
        return real(state)

    monkeypatch.setattr(module, "read_ledger", counted)
    node = NodeLedger(tmp_path, POLICY)
    node.charge(1, 1, EVENT)
    first = len(calls)
    node.charge(1, 2, EVENT)
    node.charge(1, 3, EVENT)
    assert len(calls) == first
    NodeLedger(tmp_path, POLICY).charge(1, 4, EVENT)  # another process of the node
    node.charge(1, 5, EVENT)
    assert len(calls) == first + 2
    assert replayed(tmp_path)[1] == 5
