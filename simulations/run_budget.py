"""What a run directory says it spent: its ledger, replayed, checked against its files.

:func:`read_run` reads a run directory's write-ahead privacy ledger through the library
(:func:`fedfdp.ledger.read_ledger`: the hash chain; the head the last checkpoint recorded
must still be in it, else it was rolled back), replays it into the accountant of the
relation its first entry names (:func:`fedfdp.ledger_replay.replay_ledger`, as the run
itself does), and checks it against the run's ``config.toml`` (its ``[resolved]`` δ,
relation and planned event) and ``metrics.csv`` (a ledger that composes to less than the
ε the run reported was rolled back). ``fedfdp account --run`` reports it
(:mod:`simulations.account`); ``fedfdp compare`` records the budget of an interrupted run
it keeps aside (:func:`spent_budget`). Every refusal is one line
(:class:`~fedfdp.config.ConfigError`) naming the run directory and what does not match.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfdp import validate
from fedfdp.config import ConfigError
from fedfdp.input_files import optional_file

if TYPE_CHECKING:
    from fedfdp.ledger_replay import LedgerReplay

CONFIG_FILE = "config.toml"  # fedfdp.outputs.CONFIG_FILE
METRICS_FILE = "metrics.csv"  # fedfdp.outputs.METRICS_FILE
#: The relations a run's ε is stated for (the values of ``fedfdp.accounting.Relation``), and
#: the ``metrics.csv`` column of each.
ADD_REMOVE = "add-remove"
CORRDP = "corrdp"
EPSILON_COLUMNS = {ADD_REMOVE: "epsilon", CORRDP: "epsilon_corrdp"}


def flag_check(check: Callable[..., Any], flag: str, value: Any, *args: Any) -> Any:
    """``check(flag, value, *args)`` (a :mod:`fedfdp.validate` check, naming the flag), its
    ``ValueError`` a :class:`~fedfdp.config.ConfigError`.
    """
    try:
        return check(flag, value, *args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class NoLedger(ConfigError):
    """A run directory without a privacy ledger (nothing was charged)."""


def run_ledger(run_dir: Path, *, delta_estimation: float = 0.0, eps_error: float | None = None
               ) -> LedgerReplay | None:
    """The ledger of ``run_dir``, read and replayed by the library (None: no ledger).

    The library verifies the hash chain (:func:`fedfdp.ledger.read_ledger`); the ledger
    must also contain the head the run's last checkpoint recorded (else it was rolled
    back). Its events are replayed by :func:`fedfdp.ledger_replay.replay_ledger` into the
    accountant of the relation its first entry (the resolved mechanism) names, as the run
    itself does: add/remove — :class:`~fedfdp.accounting.FDPAccountant` (every charge a
    Poisson-subsampled Gaussian round, Theorem 5); add/remove with secure aggregation —
    :class:`~fedfdp.accounting.distributed.DistributedAccountant` (every charge a
    distributed discrete Gaussian round, ε the smaller of routes A and B); ``corrdp`` —
    :class:`~fedfdp.corrdp.accounting.CorrDPAccountant` with ``delta_estimation`` (the δ a
    run's in-sample TV estimate set aside).

    Raises
    ------
    ConfigError
        A ledger the library refuses (malformed, edited), rolled back below its
        checkpoint or missing beside one, of an unknown relation, or whose events its
        accountant refuses.
    """
    from fedfdp.checkpoint import load_checkpoint
    from fedfdp.ledger import LEDGER_FILE, LedgerError, read_ledger
    from fedfdp.ledger_replay import replay_ledger

    path = Path(run_dir) / LEDGER_FILE
    try:
        ledger = read_ledger(run_dir)
        ckpt = load_checkpoint(run_dir, rows=False)  # its head; the rows are not read
    except LedgerError as exc:
        raise ConfigError(first_line(exc)) from None
    if ledger is None:
        if ckpt is not None:
            raise ConfigError(f"{path}: missing, but the run's checkpoint after round {ckpt.round} records "
                              f"{ckpt.head.charges} charges in it: the ledger was deleted")
        return None
    if ckpt is not None:
        head = ckpt.head
        if len(ledger.entries) < head.entries or ledger.entries[head.entries - 1].hash != head.hash:
            raise ConfigError(
                f"{path}: {len(ledger.charges)} charge(s), without the head its checkpoint recorded after "
                f"round {ckpt.round} ({head.charges} charges): the ledger was rolled back or replaced"
            )
        recorded = ledger.checkpoint_every(head.entries)
        if ckpt.every != recorded:
            raise ConfigError(f"{path}: its chain records checkpoint-every={recorded}, the run's checkpoint "
                              f"says {ckpt.every}: the checkpoint was edited")
    try:
        return replay_ledger(ledger, delta_estimation=delta_estimation, eps_error=eps_error)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def read_run(run: Path, *, delta: float | None = None, eps_error: float | None = None,
             label: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The accountant of a run directory's ledger (:func:`run_ledger`) and what
    :func:`account` reports of it.

    δ and the relation come from ``[resolved]`` in ``run/config.toml`` and must be
    those of the ledger's mechanism, as must every charged event be the run's
    ``[resolved] event`` (else the ledger or the configuration was edited); ``delta``
    overrides δ. A ledger that composes to less than the last ε the run reported in
    ``metrics.csv`` is refused (rolled back). Every refusal is a one-line
    :class:`~fedfdp.config.ConfigError` starting with ``label`` (default ``--run='DIR'``).
    """
    from fedfdp.ledger_replay import is_secagg

    label = label if label is not None else f"--run={str(run)!r}"
    if not run.is_dir():
        raise ConfigError(f"{label}: no such directory")
    cfg_path = run / CONFIG_FILE
    if optional_file(cfg_path) is None and node_ledger_in(run):  # a FIFO or a device: refused
        return read_node(run, delta=delta, eps_error=eps_error, label=label)
    if not cfg_path.is_file():
        raise ConfigError(
            f"{label}: no {CONFIG_FILE} there (the run's relation and δ are read from its [resolved] table)"
        )
    try:
        doc = tomllib.loads(cfg_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label}: {cfg_path} is not valid TOML ({first_line(exc)})") from None
    resolved = doc.get("resolved", {})
    if not isinstance(resolved, dict):
        raise ConfigError(f"{label}: [resolved] in {cfg_path} is not a table")
    relation = resolved.get("relation")
    if relation not in (ADD_REMOVE, CORRDP):
        raise ConfigError(f"{label}: {cfg_path} [resolved] relation={relation!r}: expected "
                          f"{ADD_REMOVE!r} or {CORRDP!r}")
    if "delta" not in resolved:
        raise ConfigError(f"{label}: {cfg_path} has no [resolved] delta")
    run_delta = flag_check(validate.open_unit, f"{label}: {cfg_path} [resolved] delta", resolved["delta"])
    estimation = resolved.get("corrdp-delta-estimation", 0.0)
    try:
        replayed = run_ledger(run, delta_estimation=estimation, eps_error=eps_error)
    except (ConfigError, ValueError, TypeError) as exc:
        raise ConfigError(f"{label}: {first_line(exc)}") from None
    if replayed is None:
        mode = doc.get("mode")
        why = f"mode={mode!r}; " if mode is not None else ""
        raise NoLedger(
            f"{label}: no privacy ledger there ({why}a run writes one before its first private round; "
            "a public or non-private run has none)"
        )
    mine = replayed.mechanism
    for key, value in (("relation", relation), ("delta", run_delta)):
        if mine.get(key) != value:
            raise ConfigError(
                f"{label}: {cfg_path} [resolved] {key}={value!r}, the ledger's mechanism has "
                f"{mine.get(key)!r}: the ledger or the configuration was edited"
            )
    planned = resolved.get("event")
    estimated = [e.get("event") for e in mine.get("estimates", [])]  # charged before round 1
    for event, _ in replayed.events:
        if planned is not None and event.to_dict() != planned and event.to_dict() not in estimated:
            raise ConfigError(
                f"{label}: the ledger charges {event.to_dict()}, {cfg_path} [resolved] event is "
                f"{planned}: the ledger or the configuration was edited"
            )
    acc = replayed.accountant
    if delta is None:
        _not_rolled_back(acc.epsilon(run_delta), run / METRICS_FILE, relation, label)
    secagg = is_secagg(mine)
    # σ of every Gaussian-like charge (a distributed round: its σ_eff), its rate and the share
    # of rounds that touch a record (a distributed round: 1, secagg draws no devices)
    events: list[tuple[Any, int]] = list(replayed.events)  # each kind's own fields, read below
    gaussian = [(e.noise_multiplier, e.sampling_rate, getattr(e, "participation", 1.0), n)
                for e, n in events
                if hasattr(e, "noise_multiplier")
                and (relation == ADD_REMOVE or e.to_dict() not in estimated)]  # corrdp: the rounds' only
    # the rounds' σ, rate and share (the estimates, charged before round 1, are listed apart)
    rounds_only = [(e, n) for e, n in events if e.to_dict() not in estimated]
    sigmas = {e.noise_multiplier for e, _ in rounds_only if hasattr(e, "noise_multiplier")}
    rates = {getattr(e, "sampling_rate", None) for e, _ in rounds_only}
    shares = {getattr(e, "participation", 1.0) for e, _ in rounds_only}
    info: dict[str, Any] = {
        "noise_multiplier": sigmas.pop() if len(sigmas) == 1 else None,
        "sampling_rate": rates.pop() if len(rates) == 1 else None,
        "device_sampling_rate": shares.pop() if len(shares) == 1 else (None if shares else 1.0),
        "delta": run_delta if delta is None else delta,
        "relation": relation,
        "run": str(run),
        "mode": doc.get("mode"),
        "charges": replayed.charges,
        "charged_rounds": replayed.charged_rounds,
        "estimates": [e.get("statistic") for e in mine.get("estimates", [])],
        "planned_private_rounds": resolved.get("private-rounds"),
        "unbounded": bool(mine.get("unbounded", False)),
        "ledger": [{"noise_multiplier": s, "sampling_rate": q, "count": n, "participation": p}
                   for s, q, p, n in gaussian]
        if relation == ADD_REMOVE and not secagg
        else [{**e.to_dict(), "count": n} for e, n in replayed.events],
    }
    if secagg:
        info["aggregation"] = "secagg"
    return acc, info


def node_ledger_in(run: Path) -> bool:
    """Whether ``run`` holds a node's ledger (:mod:`fedfdp.node_ledger`) rather than a run's."""
    from fedfdp.ledger import LEDGER_FILE, LedgerError, is_node_mechanism, read_ledger

    if not (run / LEDGER_FILE).is_file():
        return False
    try:
        ledger = read_ledger(run)
    except LedgerError:
        return False  # refused, naming the file, by the run's path
    return ledger is not None and is_node_mechanism(ledger.mechanism)


def read_node(run: Path, *, delta: float | None = None, eps_error: float | None = None,
              label: str) -> tuple[Any, dict[str, Any]]:
    """A node's state directory (``fedfdp run --node-state DIR``'s ``node-K``, or a
    SuperNode's ``node-state``): its ledger replayed by the library into the distributed
    accountant (every round the node charged itself, over every run), at the δ its
    first entry states (``delta`` overrides it). What :func:`read_run` reports of it.
    """
    from fedfdp.ledger import EntryKind, read_ledger

    try:
        replayed = run_ledger(run, eps_error=eps_error)
    except (ConfigError, ValueError, TypeError) as exc:
        raise ConfigError(f"{label}: {first_line(exc)}") from None
    ledger = read_ledger(run)
    if replayed is None or ledger is None:  # pragma: no cover - node_ledger_in saw one
        raise NoLedger(f"{label}: no node ledger there")
    runs = sorted({int(e.body["run"]) for e in ledger.entries if e.kind is EntryKind.NODE_CHARGE})
    mine = replayed.mechanism
    node_delta = flag_check(validate.open_unit, f"{label}: its ledger's delta", mine.get("delta"))
    events = list(replayed.events)
    rates = {getattr(e, "sampling_rate", None) for e, _ in events}
    sigmas = {getattr(e, "noise_multiplier", None) for e, _ in events}
    info: dict[str, Any] = {
        "noise_multiplier": sigmas.pop() if len(sigmas) == 1 else None,
        "sampling_rate": rates.pop() if len(rates) == 1 else None,
        "device_sampling_rate": 1.0,
        "delta": node_delta if delta is None else delta,
        "relation": str(mine.get("relation")),
        "run": str(run),
        "node": True,
        "runs": runs,
        "charges": replayed.charges,
        "charged_rounds": replayed.charged_rounds,
        "ledger": [{**e.to_dict(), "count": n} for e, n in events],
        "aggregation": "secagg",
    }
    return replayed.accountant, info


def _not_rolled_back(epsilon: float, metrics: Path, relation: str, label: str) -> None:
    """Refuse a ledger whose ε is below the last ε the run reported in ``metrics``
    (a rolled-back or truncated ledger: every reported ε was computed from charges
    the ledger held at the time).
    """
    import csv

    column = EPSILON_COLUMNS[relation]
    if not metrics.is_file():
        return
    try:
        with metrics.open(newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if r.get(column) not in (None, "", "nan")]
        reported = float(rows[-1][column]) if rows else None
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):
        return  # the ledger, not this cross-check, is what is accounted
    if reported is not None and epsilon < reported - 1e-9 * (1.0 + reported):
        raise ConfigError(
            f"{label}: the ledger composes to {column}={epsilon:.6g}, below the {reported:.6g} the run "
            f"reported in {metrics} round {rows[-1].get('round', '?')}: the ledger was rolled back or edited"
        )


@dataclass(frozen=True)
class SpentBudget:
    """What a run's ledger says it spent: the upper bound of ε at the run's δ, under
    the relation the run names (``corrdp``: a CorrDP ε), over ``charges`` charges.
    """

    epsilon: float
    delta: float
    relation: str
    charges: int


def spent_budget(run: str | Path) -> SpentBudget | None:
    """The budget a run directory's ledger records (:func:`read_run`), None when it has
    no ledger (a run writes one before its first private round: nothing was charged);
    raises a one-line :class:`~fedfdp.config.ConfigError` naming why a ledger cannot be
    accounted (malformed, edited, rolled back, no ``config.toml``).
    """
    path = Path(run)
    try:
        acc, info = read_run(path, label=str(path))
    except NoLedger:
        return None
    delta = info["delta"]
    epsilon = math.inf if info["unbounded"] else acc.epsilon(delta)
    return SpentBudget(epsilon, delta, info["relation"], info["charges"])
