"""``fedfdp audit``: empirical privacy, through the real client and strategy code.

``fedfdp audit [--relation add-remove|replacement|both|corrdp] [--break BUG | --all-bugs] [--json]``
    A white-box **canary audit** (:mod:`simulations.auditing.canaries`): a 95% lower
    bound on the ε of what the server releases in one round, from many
    independent trials of the real node (:meth:`clients.node_runtime.NodeRuntime.train`) and
    :class:`strategies.fdp_strategy.FDPStrategy`, against the ε the accountant
    claims for the same ``q``, ``σ`` and one round (add/remove: Theorem 5 /
    Def. 6 with Algorithm 2's simulator; replacement: Def. 5, via Prop. 1).
    ``--clipping-quantile auto`` (or a ``γ > 0``) audits the default recipe's
    adaptive clipping: its noisy count, released through the next round's ``C``,
    is read by a counted canary.
    ``--break`` audits one planted bug (:mod:`simulations.auditing.bugs`): a
    broken component passed through the same seam a normal run uses; no
    configuration key reaches one. ``--relation corrdp`` audits ``mode = "corrdp"``
    (:mod:`simulations.auditing.corrdp`): canaries that differ in one insensitive
    feature, the bound against the accountant's ε of that class; its bugs are
    ``tv-no-inflation`` and ``tv-underestimated``.
``fedfdp audit --one-run [--canaries M] [--set KEY=VALUE ...] [--break BUG | --all-bugs] [--json]``
    **One-run auditing** of a whole training run (:mod:`simulations.auditing.one_run`;
    Steinke, Nasr and Jagielski 2023): ``M`` canaries — private value crafted, ``Ψ``
    fixed, each in or out (FDP's add/remove relation, the simulator standing in for
    an absent canary) by an independent fair coin — inserted into a fleet, **one**
    run of the production centralised engine with the configuration's recipe (secret
    randomness from the OS CSPRNG), every canary scored from the models the run
    releases, and two analyses of the guesses, each at ``alpha/2``: the ε–δ lower bound
    of Steinke et al. beside the run's printed ε, and the f-DP test of Mahloujifar,
    Melis and Chaudhuri 2024 against the run's own trade-off curve
    (:mod:`fedfdp.one_run_fdp`: the μ lower bound, its ε at the run's δ). A run that
    could not refute the claim even with every guess right says so in one line.
``fedfdp audit --attack attribute --run DIR [--run DIR ...] [--references K] [--plot PNG]``
    The **attribute-inference attack** of Theorem 4 on the model of each run
    directory (:func:`fedfdp.attack.attribute_attack_run`): success on the
    training and on the held-out records (loss attacks, and the attack
    calibrated against ``K`` reference models the attacker trains on fresh
    draws of the generative model), the model-free baselines, ``Ball`` and the
    bound ``1 − f(Ball)``.

Details, the default configuration and measured results: ``docs/audit.md``.
The heavy modules are imported when a command runs, so ``fedfdp --help`` and
the other subcommands stay fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedfdp.config import ConfigError

#: Planted bugs (names only: the components live in simulations.auditing.bugs,
#: imported when an audit runs).
BUG_NAMES = ("shared-batch", "no-clip", "realized-normalization", "low-noise", "predictable-noise",
             "pq-accounting", "count-public-stream", "count-low-noise")
#: Other spellings accepted by ``--break``.
BUG_ALIASES = {"no-clipping": "no-clip"}
#: Planted bugs of the CorrDP audit (``--relation corrdp``).
CORRDP_BUG_NAMES = ("tv-no-inflation", "tv-underestimated")
#: A one-run audit adds at most this many canaries per record of the audited run (the
#: documented setup adds 2.5: 5,000 canaries to 2,000 records).
MAX_CANARIES_PER_RECORD = 10

# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.3f}"


def _canaries(r: dict[str, Any]) -> str:
    c = r["canaries"]
    text = ", ".join(f"{c[g]} {g}" for g in ("alone", "twins", "crowd", "mates") if c[g])
    if r["device_sampling_rate"] is not None:
        text += f", p={r['device_sampling_rate']}"
    return f"{text}; q={r['sampling_rate']}, sigma={r['noise_multiplier']}, delta={r['delta']}"


def _print_audit(rows: Sequence[dict[str, Any]]) -> None:
    print(f"{'bug':<24}{'relation':<13}{'eps_lower':>10}{'eps_claimed':>12}  {'trials':>7}  verdict")
    for r in rows:
        print(
            f"{r['bug'] or 'none (correct)':<24}{r['relation']:<13}{_fmt(r['epsilon_lower']):>10}"
            f"{_fmt(r['epsilon_claimed']):>12}  {r['trials']:>7}  {r['verdict']}   [{_canaries(r)}]"
        )
    if rows:
        r = rows[0]
        print(
            f"(one round; 95% Clopper-Pearson lower bound, alpha/2 per error rate; C={r['clipping_norm']}; "
            f"secret randomness: {r['secrets']})"
        )


def _print_corrdp_audit(rows: Sequence[dict[str, Any]]) -> None:
    head = f"{'eps_lower':>10}{'eps_c claimed':>14}{'eps_corrdp':>11}{'eps/TV':>8}"
    print(f"{'bug':<24}{head}  {'trials':>7}  verdict")
    for r in rows:
        name = r["bug"] or "none (correct)"
        print(
            f"{name:<24}{_fmt(r['epsilon_lower']):>10}{_fmt(r['epsilon_claimed']):>14}"
            f"{_fmt(r['epsilon_corrdp']):>11}{_fmt(r['allowance']):>8}  {r['trials']:>7}  {r['verdict']}"
        )
    if rows:
        r = rows[0]
        print(
            f"(relation corrdp: {r['neighbours']}; one round, {r['canaries']} canaries, "
            f"q={r['sampling_rate']}, "
            f"sigma={r['noise_multiplier']}, C={r['clipping_norm']}, delta={r['delta']}; claimed TV "
            f"{r['tv_claimed']} = estimate {r['tv_hat']} + inflation {r['tv_inflation']}; eps_c: the "
            "accountant's epsilon of the canaries' class, eps_corrdp/TV: what the relation allows; 95% "
            f"Clopper-Pearson lower bound; secret randomness: {r['secrets']})"
        )


def _opt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _print_attack(rows: Sequence[dict[str, Any]]) -> None:
    print(
        f"{'mode':<12}{'epsilon':>8}{'acc':>7}{'loss':>7}{'bayes':>7}{'calib.':>8}{'held-out':>9}"
        f"{'z vs Ball':>10}{'marg.':>7}{'Ball':>7}{'bound':>7}  within"
    )
    for r in rows:
        z = r.get("calibrated_z_vs_ball")
        print(
            f"{r['mode']:<12}{_fmt(r['epsilon']):>8}{r['accuracy']:>7.3f}{r['success_loss']:>7.3f}"
            f"{r['success_bayes']:>7.3f}{_opt(r['success_calibrated']):>8}"
            f"{_opt(r['heldout_success_calibrated']):>9}{'-' if z is None else f'{z:.1f}':>10}"
            f"{r['prior_marginal']:>7.3f}{r['ball']:>7.3f}{r['bound']:>7.3f}  "
            f"{'yes' if r['within_bound'] else 'NO'}"
        )
    if rows:
        r = rows[0]
        print(
            f"(success on {r['targets']} training records, {r['cells']} cells; held-out: the calibrated "
            f"attack on {r['heldout_targets']} held-out records; calibrated: {r['references']} "
            f"reference models, weight {r['weight']}; z vs Ball in binomial standard errors; "
            "epsilon: add/remove relation, upper bound of the accountant's interval, at each run's "
            "delta (default 1/(2N)); the bound 1 - f(Ball) is computed from the same ledger)"
        )


def plot_attack(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Bar chart per mode: attack success, the model-free baselines and Theorem 4's bound."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 3.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    modes = [r["mode"] for r in rows]
    xs = np.arange(len(rows))
    series = [
        ("attack: loss", "success_loss", "#1f77b4"),
        ("attack: loss + marginal prior", "success_bayes", "#ff7f0e"),
        ("attack: calibrated (training records)", "success_calibrated", "#9467bd"),
        ("attack: calibrated (held-out records)", "heldout_success_calibrated", "#c5b0d5"),
        ("Ball (label-conditional mode)", "ball", "#2ca02c"),
    ]
    series = [s for s in series if all(r[s[1]] is not None for r in rows)]
    width = 0.8 / len(series)
    for i, (label, key, colour) in enumerate(series):
        ax.bar(xs + (i - (len(series) - 1) / 2) * width, [r[key] for r in rows], width, label=label,
               color=colour)
    finite = [r[key] for r in rows for _, key, _ in series] + [r["bound"] for r in rows if r["bound"] < 1]
    top = min(1.02, max(0.25, 1.25 * max(finite)))
    bounds = [min(r["bound"], top) for r in rows]
    ax.scatter(xs, bounds, marker="_", s=900, color="crimson", zorder=3, label="Theorem 4 bound 1 - f(Ball)")
    for x, r in zip(xs, rows, strict=True):
        if r["bound"] > top:
            ax.annotate(f"bound {r['bound']:.2g} (no guarantee)" if math.isinf(r["epsilon"]) else
                        f"bound {r['bound']:.2g}", (x, top), xytext=(0, -12), textcoords="offset points",
                        ha="center", fontsize=7, color="crimson")
    ax.set_xticks(xs, [f"{m}\n(eps={_fmt(r['epsilon'])})" for m, r in zip(modes, rows, strict=True)])
    ax.set_xlabel("eps: add/remove relation, upper bound, at each run's delta = 1/(2N)", fontsize=8)
    ax.set_ylabel(f"success rate ({rows[0]['cells']} cells)")
    ax.set_ylim(0, top)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=0.3)
    ax.set_title("Attribute inference (Theorem 4)")
    fig.tight_layout()
    fig.savefig(str(path), dpi=130, format="png")


def cmd_audit(args: argparse.Namespace) -> int:
    """``fedfdp audit``."""
    from fedfdp.outputs import atomic_write, prepare_output_file

    if args.out:
        prepare_output_file(args.out, "--out")  # before the (long) audit
    if args.plot:
        prepare_output_file(args.plot, "--plot")
    if args.attack is not None:
        from fedfdp.attack import attribute_attack_run

        if not args.run:
            raise ConfigError("--attack attribute needs --run DIR (one or more)")
        if args.references < 0:
            raise ConfigError(f"--references={args.references}: must be >= 0")
        if args.weight is not None and not (args.weight >= 0 and math.isfinite(args.weight)):
            raise ConfigError(f"--weight={args.weight}: must be finite and >= 0")
        if args.weight is None and args.references == 1:
            raise ConfigError("--references=1: choosing the weight needs >= 2 references (or give --weight)")
        for d in args.run:
            _check_attack_run(d)
        rows = [attribute_attack_run(d, args.references, args.weight) for d in args.run]
        shown: Any = rows if len(rows) > 1 else rows[0]
        if args.pool:
            from fedfdp.attack import pool_results

            pooled = pool_results(rows)
            shown = {"runs": rows, "pooled": pooled}
        if args.json:
            print(json.dumps(shown, indent=1))
        else:
            _print_attack(rows)
            if args.pool:
                print("pooled by mode:")
                _print_attack(pooled)
        if args.plot:
            plot_attack(pooled if args.pool else rows, args.plot)
        if args.out:
            atomic_write(args.out, json.dumps(shown if args.pool else rows, indent=1).encode())
        return 0
    args.break_ = BUG_ALIASES.get(args.break_, args.break_)
    if args.one_run:
        return _cmd_one_run(args)
    for name in ("canaries", "amplitude", "set", "score"):
        if getattr(args, name) is not None:
            raise ConfigError(f"--{name}: an option of --one-run")
    if args.relation == "corrdp":
        return _cmd_corrdp_audit(args)
    if args.break_ in CORRDP_BUG_NAMES:
        raise ConfigError(f"--break {args.break_}: a CorrDP bug; audit it with --relation corrdp")
    from simulations.auditing.analysis import run_audit
    from simulations.auditing.canaries import recommended_setup
    from simulations.resources import check_audit_memory

    relations = ["add-remove", "replacement"] if args.relation == "both" else [args.relation]
    given = {
        "sampling_rate": args.sampling_rate,
        "noise_multiplier": args.noise_multiplier,
        "delta": args.delta,
        "rounds": args.rounds,
    }
    chosen = {k: v for k, v in given.items() if v is not None}
    if args.clipping_quantile is not None:
        chosen["clipping_quantile"] = _quantile(args.clipping_quantile)
    rows = []
    audited: set[Any] = set()
    setups = [(bug, recommended_setup(bug, seed=args.seed, **chosen)) for bug in _bugs(args)]
    for _, setup in setups:  # before any trial: the observations of every round must fit
        canaries = setup.alone + setup.twins + setup.crowd + setup.mates + setup.counted
        check_audit_memory(setup.rounds, canaries)
    for bug, setup in setups:
        if args.all_bugs and bug is not None and setup not in audited:
            rows += run_audit(setup, relations, None)  # the correct mechanism on the same canaries
        audited.add(setup)
        rows += run_audit(setup, relations, bug)
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=1))
    else:
        _print_audit(rows)
    if args.out:
        atomic_write(args.out, json.dumps(rows, indent=1).encode())
    return 0


def _check_attack_run(run_dir: str) -> None:
    """Refuse, before any work, a ``--run`` that is not a run directory of the fleet
    (the attack's grid is the fleet's private columns).
    """
    from fedfdp.config import load_config, read_toml

    config = Path(run_dir) / "config.toml"
    if not config.is_file():
        raise ConfigError(f"--run={run_dir!r}: no config.toml there (not a fedfdp run directory)")
    dataset = load_config(read_toml(config)).data.dataset
    if dataset != "fleet":
        raise ConfigError(
            f"--run={run_dir!r}: dataset={dataset!r}; the attribute attack needs the fleet's private "
            "columns (heart_rate, latitude, longitude): a run of dataset = 'fleet'"
        )


def _cmd_corrdp_audit(args: argparse.Namespace) -> int:
    """``fedfdp audit --relation corrdp``."""
    from fedfdp.outputs import atomic_write
    from simulations.auditing.corrdp import CorrDPAuditSetup, run_corrdp_audit

    if args.break_ is not None and args.break_ not in CORRDP_BUG_NAMES:
        raise ConfigError(
            f"--break {args.break_}: not a CorrDP bug (--relation corrdp knows {', '.join(CORRDP_BUG_NAMES)})"
        )
    given = {
        "sampling_rate": args.sampling_rate,
        "noise_multiplier": args.noise_multiplier,
        "delta": args.delta,
        "rounds": args.rounds,
    }
    setup = CorrDPAuditSetup(seed=args.seed, **{k: v for k, v in given.items() if v is not None})
    bugs: list[str | None] = [None, *CORRDP_BUG_NAMES] if args.all_bugs else [args.break_]
    rows = [run_corrdp_audit(setup, bug) for bug in bugs]
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=1))
    else:
        _print_corrdp_audit(rows)
    if args.out:
        atomic_write(args.out, json.dumps(rows, indent=1).encode())
    return 0


def _bugs(args: argparse.Namespace) -> list[str | None]:
    return [None, *BUG_NAMES] if args.all_bugs else [args.break_]


def _quantile(text: str) -> float | None:
    """``--clipping-quantile``: ``auto`` (None) or a number in [0, 1)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--clipping-quantile={text!r}: auto or a number in [0, 1)") from None


def _canary_count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--canaries={text!r}: an integer >= 2, or auto") from None


def _check_canaries(canaries: int, cfg: Any) -> None:
    """Refuse, before any work, more canaries than :data:`MAX_CANARIES_PER_RECORD` per record
    of the audited run, or than the machine's memory holds: each canary is a record with a
    column of its own, so the inputs grow as ``(records + m) · m`` numbers.
    """
    from simulations.resources import DATA_COPIES, generated_records, refuse_unless_fits

    records = generated_records(cfg)
    if records is not None and canaries > MAX_CANARIES_PER_RECORD * records:
        raise ConfigError(f"--canaries={canaries}: more than {MAX_CANARIES_PER_RECORD} per record of the "
                          f"audited run's {records} records (at most {MAX_CANARIES_PER_RECORD * records}); "
                          "the canaries would be the run")
    rows = (records or 0) + canaries
    refuse_unless_fits(4.0 * DATA_COPIES * rows * canaries, f"--canaries={canaries}",
                       f"the canaries' inputs ({rows:,} records, one column per canary)")


def _print_one_run(rows: Sequence[dict[str, Any]]) -> None:
    print(f"{'bug':<24}{'eps_lower':>10}{'eps_claimed':>12}{'mu_lower':>9}{'mu(claim)':>10}"
          f"{'f-DP right/needed':>19}  verdict")
    for r in rows:
        f = r["fdp"]
        k = f["guesses_in"] + f["guesses_out"]
        need = "-" if f["needed"] is None else str(f["needed"])
        right = f"{f['correct']}/{need} of {k}"
        print(
            f"{r['bug'] or 'none (correct)':<24}{_fmt(r['epsilon_lower']):>10}"
            f"{_fmt(r['epsilon_claimed']):>12}{f['mu_lower']:>9.2f}{f['mu_of_claimed_epsilon']:>10.2f}"
            f"{right:>19}  {r['verdict']}"
        )
    if rows:
        r = rows[0]
        print(
            f"(one run of {r['rounds']} rounds, {r['num_records']} records of which {r['canaries']} canaries "
            f"({r['included']} in by the coins); relation {r['relation']}, delta={r['delta']:.3g}: the run's "
            f"printed epsilon. Two analyses, together at {r['confidence']:.0%} (each at half the error): the "
            f"epsilon-delta lower bound of Steinke, Nasr, Jagielski 2023 (best of {len(r['patterns'])} "
            f"guess patterns); the "
            f"f-DP test of Mahloujifar, Melis, Chaudhuri 2024 against the run's own trade-off curve "
            f"(mu_lower: the largest GDP mu the guesses reject; mu(claim): the Gaussian mechanism with the "
            f"claimed epsilon), best of {len(r['fdp']['patterns'])} patterns; score: {r['score']}; "
            f"q={r['sampling_rate']}, sigma={r['noise_multiplier']:.3g}, clipping-quantile "
            f"{r['clipping']['quantile']:.3g}; secret randomness: {r['secrets']})"
        )


def _cmd_one_run(args: argparse.Namespace) -> int:
    """``fedfdp audit --one-run``."""
    from fedfdp.config import parse_override
    from fedfdp.outputs import atomic_write
    from simulations.auditing.one_run import OneRunSetup, Score, run_one_run_audit

    if args.relation != "add-remove":
        raise ConfigError(f"--relation {args.relation}: the one-run audit is of the add/remove relation")
    if args.break_ in CORRDP_BUG_NAMES:
        raise ConfigError(f"--break {args.break_}: a CorrDP bug; the one-run audit runs fdp or dp")
    for name in ("rounds", "sampling_rate", "noise_multiplier", "delta", "clipping_quantile"):
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag}: an option of the canary audit; with --one-run use --set KEY=VALUE")
    config: dict[str, Any] = {}
    for item in args.set or []:
        key, value = parse_override(item)
        config[key] = value
    if args.seed:
        config.setdefault("seed", args.seed)
    setup = OneRunSetup(
        canaries=OneRunSetup.canaries if args.canaries in (None, "auto") else _canary_count(args.canaries),
        amplitude=OneRunSetup.amplitude if args.amplitude is None else args.amplitude,
        config=config,
        score=Score(args.score or "rounds"),
    )
    _check_canaries(setup.canaries, setup.run_config())
    if args.canaries == "auto":
        from fedfdp.data import load_dataset
        from fedfdp.run_plan import mechanism_for
        from simulations.auditing.one_run import CANARY_GRID, planned_canaries

        cfg = setup.run_config()
        planned = planned_canaries(mechanism_for(cfg, load_dataset(cfg.data)), cfg.privacy.num_rounds, setup)
        if planned is None:
            raise ConfigError(f"--canaries auto: up to {CANARY_GRID[-1]} canaries, no count catches a run "
                              "with half the noise in 9 of 10 modelled runs; give --canaries M")
        setup = dataclasses.replace(setup, canaries=planned)
    rows = [run_one_run_audit(setup, bug) for bug in _bugs(args)]
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=1))
    else:
        _print_one_run(rows)
    if args.out:
        atomic_write(args.out, json.dumps(rows, indent=1).encode())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``audit`` to the ``fedfdp`` parser."""
    p = sub.add_parser(
        "audit",
        help="empirical privacy: canary audit (lower bound on epsilon) or attribute-inference attack",
        description=(
            "Canary audit of one round of the real client and strategy: a 95% lower bound on "
            "epsilon vs the accountant's claim. With --one-run: one-run auditing of a whole training "
            "run (Steinke et al. 2023) against the run's printed epsilon. With --attack attribute: "
            "attribute inference on the model of a run directory (Theorem 4)."
        ),
    )
    p.add_argument("--relation", choices=["add-remove", "replacement", "both", "corrdp"],
                   default="add-remove",
                   help="neighbouring relation (corrdp: canaries differing in one insensitive feature)")
    p.add_argument("--break", dest="break_", choices=[*BUG_NAMES, *BUG_ALIASES, *CORRDP_BUG_NAMES],
                   default=None,
                   help="audit one planted bug (a broken component; testing the audit only; no-clipping is "
                        "no-clip)")
    p.add_argument("--all-bugs", action="store_true",
                   help="audit the correct mechanism and every planted bug")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of the real code, >= 3 (default 400)")
    p.add_argument("--sampling-rate", type=float, default=None, help="q (default 0.07)")
    p.add_argument("--noise-multiplier", type=float, default=None, help="sigma (default 0.5)")
    p.add_argument("--delta", type=float, default=None, help="delta (default 0.01)")
    p.add_argument("--clipping-quantile", default=None, metavar="GAMMA",
                   help="canary audit: clipping-quantile of the audited round, auto or a number in [0, 1) "
                        "(default: 0, a fixed C; auto for the count bugs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one-run", action="store_true",
                   help="one-run auditing of a whole training run (Steinke, Nasr, Jagielski 2023)")
    p.add_argument("--canaries", default=None, metavar="M|auto",
                   help="with --one-run: canaries (5000); auto: the fewest that catch sigma/2 in a "
                        "model of the run")
    p.add_argument("--amplitude", type=float, default=None,
                   help="with --one-run: each canary's private value (30)")
    p.add_argument("--score", choices=["rounds", "final"], default=None,
                   help="with --one-run: score each round's release (rounds, default) or the final model")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="with --one-run: a configuration key of the audited run (repeatable)")
    p.add_argument("--attack", choices=["attribute"], default=None)
    p.add_argument("--run", action="append", metavar="DIR", help="run directory (repeatable) for --attack")
    p.add_argument("--references", type=int, default=4, metavar="K",
                   help="with --attack: reference models for the calibrated attack (default 4; 0: none)")
    p.add_argument("--weight", type=float, default=None, metavar="LAMBDA",
                   help="with --attack: weight of the calibrated attack's likelihood ratio (default: "
                        "chosen by leave-one-out on the reference models)")
    p.add_argument("--pool", action="store_true",
                   help="with --attack: also pool the runs of each mode (e.g. several data seeds)")
    p.add_argument("--plot", metavar="PNG", help="with --attack: write a bar chart")
    p.add_argument("--out", metavar="JSON", help="also write the results to this file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_audit)
