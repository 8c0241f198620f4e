"""``fedfdp run``: one federated training run.

``fedfdp run --config FILE.toml --out DIR [--set key=value ...] [--supernodes N]``
    One federated run on Flower's Simulation Runtime, submitted with ``flwr
    run`` to a SuperLink in simulation mode that this command starts and
    stops (Flower's supported path; ``flwr.simulation.run_simulation`` is
    deprecated). ``N`` virtual SuperNodes (default: one per core; one per
    device up to 8 devices) each serve their share of the devices in one call
    per round.
    Writes ``DIR/metrics.csv``, ``DIR/config.toml``, ``DIR/ledger.jsonl``,
    ``DIR/checkpoint.pt`` and ``DIR/model.pt``.
``fedfdp run --centralised ...``
    The same configuration through the single-machine reference
    (:mod:`fedfdp.algorithm`), without Flower.
``fedfdp run ... --node-policy FILE [--node-state DIR]``
    Every simulated SuperNode enforces the node policy ``FILE`` (:mod:`fedfdp.node_policy`)
    and keeps its own ledger in ``DIR/node-K`` (default ``DIR = OUT/nodes``; kept across
    runs, so a budget a node spent in one run stays spent: ``fedfdp account --run
    DIR/node-K``). Not with ``--centralised`` (it has no nodes).

The command checks everything it can before any process starts (the data, the memory a
run needs, the run directory and a resume, the model against the data, a cap below one
round) on the run's plan (:func:`fedfdp.run_plan.build_plan`), then runs it on the
centralised engine or on Flower's processes (:mod:`simulations.flower_processes`).
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfdp.config import Config, ConfigError, load_config, parse_override, read_toml
from fedfdp.entropy import REPRODUCIBLE_WARNING
from simulations.flower_processes import SimulationError, run_simulation_for, supernodes_for

if TYPE_CHECKING:
    from fedfdp.checkpoint import Resume
    from fedfdp.data import FederatedData
    from fedfdp.mechanism import ResolvedMechanism
    from fedfdp.run_plan import RunPlan


def build_config(config_path: str | None, overrides: Sequence[str], out: str | None) -> Config:
    """Defaults ← TOML file ← ``--set`` overrides ← ``--out``; validated once."""
    mapping: dict[str, Any] = dict(read_toml(config_path)) if config_path else {}
    for item in overrides:
        key, value = parse_override(item)
        mapping[key] = value
    if out is not None:
        mapping["out-dir"] = str(Path(out).resolve())
    return load_config(mapping)


#: The refusals a ServerApp may raise for a user's setting (status 2, like the centralised engine).
_USER_ERROR = re.compile(r"(?:^|\.)(?:RunDiverged|ConfigError|LedgerError|CheckpointMismatch|"
                         r"PrivacyBudgetExhausted): (.*)$")


def _simulation_failed(exc: SimulationError) -> int:
    """One line for a simulated run that did not complete: the error the ServerApp raised
    for a user's setting (status 2), or the cause with Flower's output written to a file
    (status 1).
    """
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [m.group(1) for line in lines if (m := _USER_ERROR.search(line))]
    if raised:
        print(f"error: {raised[-1]}", file=sys.stderr)
        return 2
    fd, path = tempfile.mkstemp(prefix="fedfdp-flower-", suffix=".txt")
    with open(fd, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    first = lines[0] if lines else "no output"
    cause = next((line for line in reversed(lines) if re.match(r"^[\w.]+(Error|Exception): ", line)), "")
    print(f"error: {first.rstrip(':')}{(' ' + cause) if cause else ''} (Flower's output in {path})",
          file=sys.stderr)
    return 1


def _epsilon_text(last: Any) -> str:
    """The final ε of a ``metrics.csv`` row in the column its accounting wrote (``epsilon``,
    or ``epsilon_corrdp`` with the relation spelled out in ``relation_text``).
    """
    delta = f"delta={last['delta']:.3g}, upper bound"
    corrdp = last.get("epsilon_corrdp", float("nan"))
    if isinstance(corrdp, float | int) and not math.isnan(corrdp):
        text = last.get("relation_text", "")
        relation = text if isinstance(text, str) and text else str(last["relation"])
        return f"epsilon_corrdp={corrdp:.4g} ({relation}; {delta})"
    return f"epsilon={last['epsilon']:.4g} ({last['relation']}, {delta})"


def _budget_split_line(out: Path) -> str:
    """What the statistics released before training cost, from ``config.toml``'s
    ``[resolved]`` (``estimates-epsilon`` alone, ``planned-epsilon`` with every planned
    round); empty when the run released none.
    """
    from fedfdp.config import load_toml_file
    from fedfdp.outputs import CONFIG_FILE

    try:
        resolved = load_toml_file(out / CONFIG_FILE).get("resolved", {})
    except ConfigError:
        return ""
    alone = resolved.get("estimates-epsilon")
    if alone is None:
        return ""
    planned = resolved.get("planned-epsilon")
    total = f" (planned total {float(planned):.4g})" if planned is not None else ""
    return f"of which released statistics: epsilon={float(alone):.4g} alone{total}"


def _summarise(out: Path, cfg: Config, num_classes: int) -> int:
    """What a completed run prints on stdout: the result line, what the released statistics
    cost (when there were any), the reproducible-noise warning (when set), why ``auc`` is
    empty (only for a binary task, where it is expected) and the files written.
    """
    import pandas as pd

    path = out / "metrics.csv"
    if not path.is_file():
        print(f"error: the run wrote no {path}", file=sys.stderr)
        return 1
    frame = pd.read_csv(path)
    last = frame.iloc[-1]
    score = "fd" if "fd" in frame and frame["accuracy"].isna().all() else "accuracy"  # fd: a diffusion model
    done = frame[score].dropna()
    acc = done.iloc[-1] if len(done) else float("nan")
    print(f"rounds={int(last['round'])} {score}={acc:.4f} {_epsilon_text(last)}")
    split = _budget_split_line(out)
    if split:
        print(split)
    if cfg.privacy.reproducible_noise:  # every output says so (stderr said it at the start)
        print(f"warning: {REPRODUCIBLE_WARNING}")
    line = empty_auc_line(frame, num_classes)
    if line:
        print(line)
    from fedfdp.run_files import RUN_FILES

    written = [name for name in RUN_FILES if (out / name).exists()]
    print(f"wrote {', '.join(written)} in {out}")
    return 0


def empty_auc_line(frame: Any, num_classes: int) -> str:
    """Why ``metrics.csv``'s ``auc`` column is empty, for a binary task only (AUC is reported
    for binary tasks; a task of more classes never has one, so an empty column says nothing
    there); empty when there is nothing to explain.
    """
    if num_classes != 2 or "auc" not in frame or not frame["auc"].isna().all():
        return ""
    return ("auc: empty in metrics.csv (the held-out split lacks one of the two classes, or no round "
            "was evaluated)")


def _check_run_dir(cfg: Config, data: FederatedData) -> tuple[RunPlan, Resume | None]:
    """The run's plan, after refusing an occupied output directory, or a resume whose
    checkpoint or ledger does not match, before any work starts (errors inside Flower's
    ServerApp thread are only logged).
    """
    from fedfdp.ledger import LedgerError
    from fedfdp.run_plan import build_plan, public_facts
    from simulations.resources import check_model_memory

    check_model_memory(cfg, public_facts(cfg, data).num_params)  # before the model is built
    plan = build_plan(cfg, data)
    # the mechanism the run's server will resolve (its mode's accounting: corrdp too)
    mechanism, _ = plan.resolve(data.sizes)
    if plan.files is None:  # pragma: no cover - fedfdp run always has an output directory
        raise ConfigError("--out DIR is required")
    try:
        found = plan.files.verify(mechanism)
    except LedgerError as exc:
        changed = _changed_guarantee_keys(cfg) if cfg.run.resume else ""
        raise ConfigError(f"{changed}{exc}") from exc
    if not cfg.run.resume:
        _check_first_round_fits(plan, mechanism)
        return plan, None
    return plan, found


def _changed_guarantee_keys(cfg: Config) -> str:
    """``key=new (the run has old); ...: `` for every key that defines the guarantee and
    differs from the run directory's config.toml (empty when none or unreadable).
    """
    from fedfdp.config import GUARANTEE_KEYS

    try:
        saved = load_config(read_toml(Path(cfg.run.out_dir) / "config.toml")).to_flat()
    except (ConfigError, OSError):
        return ""
    now = cfg.to_flat()
    diffs = [f"{k}={now[k]!r} (the run has {saved[k]!r})" for k in now
             if k in GUARANTEE_KEYS and k in saved and now[k] != saved[k]]
    if not diffs:
        return ""
    return "; ".join(diffs) + ": a resume keeps every setting that defines the guarantee; "


def _resuming_line(out: str, found: Resume, every: int) -> str:
    """What a resume continues from (the Flower path: the ServerApp's own log is not shown)."""
    charges = len(found.ledger.charges) if found.ledger is not None else 0
    spent = f"the ledger's {charges} charges stay counted" + (
        f" (and {found.unrecorded} unrecorded ones, pessimistically)" if found.unrecorded else "")
    if found.checkpoint is None or found.checkpoint.round == 0:
        return (f"resuming {out}: no checkpoint after a round (checkpoint-every={every}, or stopped before "
                f"the first): the training restarts at round 1; {spent}")
    return f"resuming {out} after round {found.checkpoint.round} (its checkpoint); {spent}"


def _check_data_path(cfg: Config) -> None:
    """``data-path``: a file for the tables (a folder only for ``images``), named as given."""
    for key, value in (("data-path", cfg.data.data_path), ("test-path", cfg.data.test_path)):
        if not value:
            continue
        path = Path(value)
        if path.is_dir() and not (key == "data-path" and cfg.data.dataset == "images"):
            raise ConfigError(f"{key}={value!r}: is a directory; dataset={cfg.data.dataset!r} reads a file")
        if not path.exists():
            raise ConfigError(f"{key}={value!r}: no such file")


def _check_model_and_data(plan: RunPlan, data: FederatedData) -> None:
    """The model the run builds, the data and Ψ fit together (:func:`fedfdp.evaluation.check_run_inputs`),
    checked here, before the Flower processes start.
    """
    from fedfdp.evaluation import check_run_inputs

    try:
        check_run_inputs(plan.model, data, plan.feature_map)
    except ConfigError as exc:
        text = str(exc)
        if text.startswith("model:"):  # name the configured model
            raise ConfigError(f"model={plan.training.model!r}:{text[len('model:'):]}") from exc
        raise


def _check_first_round_fits(plan: RunPlan, mechanism: ResolvedMechanism) -> None:
    """Refuse a cap (``max-epsilon``) below the ε of the first private round: the run
    would stop before it, with nothing trained.
    """
    if mechanism.event is None or mechanism.max_epsilon is None:
        return
    accountant = plan.server_parts.accounting.new()
    if not accountant.would_exceed(mechanism.event, 1, max_epsilon=mechanism.max_epsilon,
                                   delta=mechanism.delta):
        return
    accountant.compose(mechanism.event)
    one = float(accountant.epsilon(mechanism.delta))
    raise ConfigError(
        f"max-epsilon={mechanism.max_epsilon:g}: below the ε of one private round ({one:.4g} at "
        f"delta={mechanism.delta:.3g}, noise-multiplier={mechanism.noise_multiplier}); the run would stop "
        "before it: raise max-epsilon or the noise"
    )


class _StderrLines(logging.Handler):
    """``warning: message`` on the current ``sys.stderr`` (looked up at each record)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"{record.levelname.lower()}: {record.getMessage()}\n")
        except Exception:  # a closed stream: never fail a run for a warning
            self.handleError(record)


def _library_warnings_one_line() -> None:
    """Show the library's warnings (``fedfdp.*`` loggers) once each, as ``warning: message``
    on stderr (without a handler Python's last-resort one would print them bare).
    """
    logger = logging.getLogger("fedfdp")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        handler = _StderrLines(logging.WARNING)
        logger.addHandler(handler)


def cmd_run(args: argparse.Namespace) -> int:
    """``fedfdp run``."""
    from fedfdp.data import load_dataset
    from fedfdp.outputs import CONFIG_FILE, prepare_output_dir
    from fedfdp.run_plan import resolve_released
    from simulations.resources import check_data_memory

    if args.resume:
        if args.out or args.config:
            raise ConfigError("--resume DIR: reads DIR/config.toml; drop --out/--config")
        cfg = build_config(str(Path(args.resume) / CONFIG_FILE), [*(args.set or []), "resume=true"],
                           args.resume)
    else:
        if not args.out:
            raise ConfigError("--out DIR is required (or --resume DIR)")
        cfg = build_config(args.config, args.set or [], args.out)
    nodes = _node_settings(args, cfg)  # a bad policy file: refused before anything is made
    prepare_output_dir(cfg.run.out_dir, "--out", create=False)  # a file, too long, read-only: refused
    _check_data_path(cfg)
    check_data_memory(cfg)  # a generated dataset that cannot fit: refused before it is made
    data = load_dataset(cfg.data)  # fail on bad data before any work
    cfg = resolve_released(cfg, data)  # num-devices = 0: one device per unit of device-column
    if args.centralised:  # --supernodes is only range-checked (no SuperNodes here)
        if args.supernodes is not None and not 1 <= args.supernodes <= cfg.data.num_devices:
            raise ConfigError(f"--supernodes={args.supernodes}: must be in "
                              f"1..num-devices={cfg.data.num_devices}")
        supernodes = args.supernodes
    else:  # secagg: the default raised to n_min, fewer refused before the run directory exists
        supernodes = supernodes_for(cfg, args.supernodes)
    if nodes is not None and supernodes is not None:
        _write_simulated_identities(args.node_policy, Path(nodes["node-state"]), supernodes)
    plan, found = _check_run_dir(cfg, data)  # on an unreachable target ε, an occupied or mismatched out-dir
    _check_model_and_data(plan, data)  # a user's model or data that cannot train, on either path
    out = prepare_output_dir(cfg.run.out_dir, "--out")
    if args.centralised:
        from fedfdp.algorithm import run_plan_centrally
        from simulations.plain_output import plain_stderr

        _library_warnings_one_line()  # the engine's own warnings (reproducible-noise: once)
        with plain_stderr():  # redirected: the bar's final line, no escape codes
            run_plan_centrally(plan)
    else:
        if cfg.privacy.reproducible_noise:  # the ServerApp's log is not shown: say it here, once
            print(f"warning: {REPRODUCIBLE_WARNING}", file=sys.stderr)
        if found is not None:
            print(_resuming_line(cfg.run.out_dir, found, cfg.run.checkpoint_every), file=sys.stderr)
        try:
            run_simulation_for(cfg, verbose=args.verbose, supernodes=supernodes, nodes=nodes)
        except SimulationError as exc:
            return _simulation_failed(exc)
    code = _summarise(out, cfg, data.num_classes)
    if nodes is not None:
        _summarise_nodes(Path(nodes["node-state"]))
    return code


def _summarise_nodes(state: Path) -> None:
    """One line per simulated node: the ε its own ledger says (every run on this state)."""
    from simulations.run_budget import node_ledger_in, read_node

    for folder in sorted(state.glob("node-*")):
        if not node_ledger_in(folder):
            print(f"{folder.name}: no charge in {folder}")
            continue
        acc, info = read_node(folder, label=str(folder))
        print(f"{folder.name}: epsilon={acc.epsilon(info['delta']):.4g} (its own ledger, delta="
              f"{info['delta']:g}, {info['charges']} charges over {len(info['runs'])} run(s); fedfdp account "
              f"--run {folder})")


def _node_settings(args: argparse.Namespace, cfg: Config) -> dict[str, str] | None:
    """``--node-policy FILE`` (loaded and checked now) and ``--node-state DIR`` (default
    ``OUT/nodes``) as every simulated node's own settings, absolute; None without a policy.
    """
    from fedfdp.node_policy import POLICY_KEY, STATE_KEY, load_node_policy

    if args.node_policy is None:
        if args.node_state is not None:
            raise ConfigError(f"--node-state={args.node_state!r}: only with --node-policy FILE")
        return None
    if args.centralised:
        raise ConfigError(f"--node-policy={args.node_policy!r}: not with --centralised (the centralised "
                          "engine has no SuperNodes to enforce it)")
    load_node_policy(args.node_policy)
    state = Path(args.node_state) if args.node_state is not None else Path(cfg.run.out_dir) / "nodes"
    if state.exists() and not state.is_dir():
        raise ConfigError(f"--node-state={str(state)!r}: not a directory")
    return {POLICY_KEY: str(Path(args.node_policy).resolve()), STATE_KEY: str(state.resolve())}


def _write_simulated_identities(policy_path: str, state: Path, supernodes: int) -> None:
    """When the node policy names a ``roster``, stand in for the deployment authority:
    each simulated node's long-term signing key in its own state folder
    (``STATE/node-<partition-id>``, created from the OS CSPRNG the first time and kept) and
    the roster of their public keys written at the path the policy names
    (:func:`simulations.identities.write_identities`). The server is given neither.
    """
    from fedfdp.node_policy import load_node_policy
    from simulations.identities import write_identities

    policy = load_node_policy(policy_path)
    if policy.roster is None:
        return
    folders = {f"node-{p}": state / f"node-{p}" for p in range(int(supernodes))}
    try:
        write_identities(folders, policy.roster)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--node-policy={policy_path!r}: roster={str(policy.roster)!r}: "
                          f"cannot write the simulated nodes' identities ({exc})") from None


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` to the ``fedfdp`` parser."""
    run = sub.add_parser(
        "run", help="one federated training run",
        epilog="Configuration keys (--set KEY=VALUE, or an experiment TOML): `fedfdp keys` lists every key "
        "with its type, default, whether it defines the privacy guarantee and its meaning "
        "(docs/configuration.md).",
    )
    run.add_argument("--config", help="experiment TOML (flat kebab-case keys)")
    run.add_argument("--out", help="output directory")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a key (fedfdp keys lists them)")
    run.add_argument(
        "--centralised", action="store_true", help="run the single-machine reference instead of Flower"
    )
    run.add_argument("--verbose", action="store_true", help="show Flower and Ray logs")
    run.add_argument(
        "--supernodes", type=int, metavar="N",
        help="virtual SuperNodes of the simulation (default: one per core; one per device up to 8 devices)",
    )
    run.add_argument("--node-policy", metavar="FILE",
                     help="every simulated SuperNode enforces this node policy (docs/node_policy.md)")
    run.add_argument("--node-state", metavar="DIR",
                     help="the simulated nodes' own ledgers, DIR/node-K, kept across runs "
                     "(default OUT/nodes)")
    run.set_defaults(func=cmd_run)
