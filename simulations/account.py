"""``fedfdp account``: privacy accounting without training.

``fedfdp account --noise-multiplier S --sampling-rate Q --rounds T --delta D [--json]``
    ε of ``T`` rounds of the Poisson-subsampled Gaussian mechanism (Theorem 5).
    ``--device-sampling-rate P``: each round touches a record only if its device
    is drawn (probability ``P``, revealed by the record's device-mates); the
    accountant composes that exact mixture (never rate ``P·Q``, which is not a
    valid bound).
``fedfdp account --target-epsilon E --sampling-rate Q --rounds T --delta D [--json]``
    The smallest σ (to 0.1%) whose ε is at most ``E`` (never above), and that ε.
``fedfdp account --run DIR [--delta D] [--json]``
    ε of a finished or interrupted run: its write-ahead privacy ledger, read by
    the library (:func:`fedfdp.checkpoint.read_ledger`; every charged round,
    re-run rounds included), replayed into the accountant of the relation the
    run names, at δ and relation from ``[resolved]`` in ``DIR/config.toml``
    (``--delta`` overrides δ). It equals the ε of the run's last ``metrics.csv``
    row when the run ended normally. A CorrDP run (relation ``corrdp``) is replayed
    by the CorrDP accountant (its per-class events and the TV estimate's δ from
    ``[resolved]``) and reports ``epsilon_corrdp``, a CorrDP ε. A run with
    ``aggregation = "secagg"`` is replayed by the distributed accountant: ε is the
    smaller of route A and route B (both reported), as the run printed; ``--ball``
    and ``--tradeoff`` are refused for it.
    :func:`simulations.run_budget.read_run` reads it; the library replays it
    (:func:`fedfdp.ledger_replay.replay_ledger`, as the run itself does).
``fedfdp account --run NODE_DIR [--delta D] [--json]``
    A node's state directory (``fedfdp run --node-policy``'s ``OUT/nodes/node-K``, or a
    SuperNode's ``node-state``): every round the node charged itself, over every run on
    that state (:mod:`fedfdp.node_ledger`), replayed by the distributed accountant at the
    δ its ledger states (``--delta`` overrides it, e.g. to compare with the server's ε).

With any of them:

``--ball P``
    Theorem 4's upper bound on attribute-inference success, ``1 − f(P)``, where
    ``P`` is the success rate of the best guess that does not see the model
    (``Ball`` of Definition 8) and ``f`` the composed trade-off function.
``--tradeoff PREFIX``
    Writes ``PREFIX.csv`` (columns ``alpha,beta``) and ``PREFIX.png``: the
    composed add/remove trade-off function ``f`` (a certified lower bound).
``--num-records N``
    δ = 1/(2N), the default of ``fedfdp run``, instead of ``--delta``.

Memory and time are bounded for every input (the accountant's arrays stay below
``fedfdp.accounting.composition.MEMORY_LIMIT_BYTES`` = 1 GiB): an input the
numerical accountant cannot resolve gets a coarser certified interval or the
Rényi-DP bound, both valid upper bounds.

Every ε is the **upper** end of the accountant's error interval
(:class:`fedfdp.accounting.EpsilonBound`), for the **add/remove** relation
(Definition 6) at the stated δ; ``epsilon_replacement`` is the replacement
relation (Definition 5) at the same δ, obtained by Proposition 1
(``(ε, δ_i) ⇒ (2ε, δ_i(1 + e^ε))``, see :mod:`fedfdp.accounting`). In
``--json`` output an infinite (vacuous) bound is ``null``.

Bad input exits with status 2 and a message naming the flag and its value;
any ``ValueError`` from the accountant is reported the same way (one line on
stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from fedfdp import validate
from fedfdp.config import ConfigError
from simulations.run_budget import ADD_REMOVE, CORRDP, flag_check, read_run

#: ``eps_error`` of ``--noise-multiplier`` / ``--target-epsilon`` when not given
#: (a run's ledger is replayed at the run's own).
DEFAULT_EPS_ERROR = 0.05


# ------------------------------------------------------------------ validation


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _delta_of(args: argparse.Namespace, fallback: float | None, fallback_name: str) -> float:
    """δ from ``--delta``, else ``--num-records``, else ``fallback`` (a run's)."""
    if args.delta is not None and args.num_records is not None:
        raise ConfigError(f"--delta={args.delta!r} and --num-records={args.num_records!r}: give one")
    if args.delta is not None:
        return flag_check(validate.open_unit, "--delta", args.delta)
    if args.num_records is not None:
        from fedfdp.accounting.protocol import default_delta

        return default_delta(flag_check(validate.count, "--num-records", args.num_records))
    if fallback is None:
        raise ConfigError(f"--delta is required ({fallback_name})")
    return fallback


# ------------------------------------------------------------------ sources of a ledger
def _direct(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """An accountant for ``--noise-multiplier``/``--target-epsilon`` mode."""
    from fedfdp.accounting import FDPAccountant, SubsampledGaussian, calibrate_noise_multiplier

    if args.noise_multiplier is not None and args.target_epsilon is not None:
        raise ConfigError(
            f"--noise-multiplier={args.noise_multiplier!r} and --target-epsilon={args.target_epsilon!r}: "
            "give one (σ to account, or a target ε to calibrate σ for)"
        )
    if args.noise_multiplier is None and args.target_epsilon is None:
        raise ConfigError("give --noise-multiplier S or --target-epsilon E (or --run DIR)")
    for flag, value in (("--sampling-rate", args.sampling_rate), ("--rounds", args.rounds)):
        if value is None:
            raise ConfigError(f"{flag} is required with --noise-multiplier/--target-epsilon")
    q = flag_check(validate.rate, "--sampling-rate", args.sampling_rate)
    p = 1.0
    if args.device_sampling_rate is not None:
        p = flag_check(validate.rate, "--device-sampling-rate", args.device_sampling_rate)
    rounds = flag_check(validate.count, "--rounds", args.rounds)
    delta = _delta_of(args, None, "or --num-records N for δ = 1/(2N)")
    eps_error = args.eps_error if args.eps_error is not None else DEFAULT_EPS_ERROR
    info: dict[str, Any] = {}
    if args.target_epsilon is not None:
        target = flag_check(validate.positive, "--target-epsilon", args.target_epsilon)
        try:
            sigma = calibrate_noise_multiplier(target_epsilon=target, sampling_rate=q, rounds=rounds,
                                               delta=delta, eps_error=eps_error, participation=p)
        except ValueError:
            hint = (f"; with --eps-error={eps_error:g} the upper bound of a subsampled "
                    f"mechanism stays above about {0.9 * eps_error:.3g}" if q < 1 or p < 1 else "")
            dev = f", device sampling rate {p:g}" if p < 1 else ""
            raise ConfigError(
                f"--target-epsilon={target!r}: unreachable, no noise multiplier <= 1e4 brings the "
                f"ε upper bound down to it (sampling rate {q:g}{dev}, {rounds} rounds, "
                f"δ = {delta:.3g}){hint}"
            ) from None
        info["target_epsilon"] = target
    else:
        sigma = flag_check(validate.positive, "--noise-multiplier", args.noise_multiplier)
    acc = FDPAccountant(eps_error=eps_error)
    acc.compose(SubsampledGaussian(sigma, q, p), rounds)
    info.update(noise_multiplier=sigma, sampling_rate=q, device_sampling_rate=p)
    return acc, dict(info, delta=delta)


def _read_run(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """``--run`` mode: :func:`read_run` after checking the flags."""
    for flag in ("noise_multiplier", "target_epsilon", "sampling_rate", "rounds", "device_sampling_rate"):
        if getattr(args, flag) is not None:
            name = "--" + flag.replace("_", "-")
            raise ConfigError(
                f"{name}={getattr(args, flag)!r}: not with --run (the run's ledger says what was spent)"
            )
    delta = _delta_of(args, 0.0, "") if args.delta is not None or args.num_records is not None else None
    return read_run(Path(args.run), delta=delta, eps_error=args.eps_error, label=f"--run={args.run!r}")


# ------------------------------------------------------------------ the command
def account(args: argparse.Namespace) -> dict[str, Any]:
    """Compute the report of ``fedfdp account`` (a JSON-ready dict)."""
    from fedfdp.accounting import (
        EpsilonBound,
        Relation,
        attribute_inference_bound,
        plot_tradeoff,
        save_tradeoff_csv,
    )

    if args.eps_error is not None:
        flag_check(validate.rate, "--eps-error", args.eps_error)
    if args.ball is not None:
        flag_check(validate.unit, "--ball", args.ball)
    if args.tradeoff is not None and not str(args.tradeoff).strip():
        raise ConfigError(f"--tradeoff={args.tradeoff!r}: must be a path prefix")
    acc, info = _read_run(args) if args.run is not None else _direct(args)
    delta = info["delta"]
    relation = info.pop("relation", ADD_REMOVE)
    if relation == CORRDP:
        return _corrdp_report(args, acc, info)
    if info.get("aggregation") == "secagg":
        return _secagg_report(args, acc, info)
    if info.get("unbounded"):  # nonprivate: private data without noise
        for flag, value in (("--ball", args.ball), ("--tradeoff", args.tradeoff)):
            if value is not None:
                raise ConfigError(f"{flag}={value!r}: mode {info.get('mode')!r} trains on private data "
                                  "without noise (ε = ∞)")
        bound = replacement = EpsilonBound(math.inf, math.inf, math.inf, delta, Relation.ADD_REMOVE)
    else:
        bound = acc.epsilon_bound(delta, Relation.ADD_REMOVE)
        replacement = acc.epsilon_bound(delta, Relation.REPLACEMENT)
    out: dict[str, Any] = {
        "epsilon": _finite_or_none(bound.upper),
        "epsilon_estimate": _finite_or_none(bound.estimate),
        "epsilon_lower": _finite_or_none(bound.lower),
        "epsilon_replacement": _finite_or_none(replacement.upper),
        "delta": delta,
        "noise_multiplier": info.pop("noise_multiplier"),
        "sampling_rate": info.pop("sampling_rate"),
        "device_sampling_rate": info.pop("device_sampling_rate"),
        "rounds": acc.rounds - len(info.get("estimates", ())),  # the estimates are charged before round 1
        "relation": relation,
        "eps_error": acc.eps_error,
    }
    out.update({k: v for k, v in info.items() if k != "delta"})
    _explain_infinities(out, acc, delta, ADD_REMOVE)
    if args.ball is not None:
        out["ball"] = args.ball
        out["attribute_inference_bound"] = attribute_inference_bound(acc, args.ball)
    if args.tradeoff is not None:
        prefix = Path(args.tradeoff)
        csv_path = prefix.with_name(prefix.name + ".csv")
        png_path = prefix.with_name(prefix.name + ".png")
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        save_tradeoff_csv(csv_path, acc)
        eps = "∞" if out["epsilon"] is None else f"{out['epsilon']:.3g}"
        title = f"T={acc.rounds}: ε ≤ {eps} (add/remove, δ={delta:.2g})"
        plot_tradeoff(png_path, acc, title=title)
        out["tradeoff_csv"] = str(csv_path)
        out["tradeoff_png"] = str(png_path)
    return out


def _corrdp_report(args: argparse.Namespace, acc: Any, info: dict[str, Any]) -> dict[str, Any]:
    """The report of a CorrDP run: its CorrDP ε (``epsilon_corrdp``; ``epsilon``, the
    DP/FDP column, stays empty: a different guarantee). Theorem 4 and the trade-off
    curve are statements about an add/remove ε, so ``--ball`` and ``--tradeoff`` are
    refused.
    """
    for flag, value in (("--ball", args.ball), ("--tradeoff", args.tradeoff)):
        if value is not None:
            raise ConfigError(f"{flag}={value!r}: not for a CorrDP run (relation {CORRDP!r}: its ε is a "
                              "CorrDP ε, not the add/remove ε these are stated for)")
    delta = info.pop("delta")
    out: dict[str, Any] = {
        "epsilon": None,
        "epsilon_corrdp": _finite_or_none(acc.epsilon(delta)),
        "delta": delta,
        "noise_multiplier": info.pop("noise_multiplier"),
        "sampling_rate": info.pop("sampling_rate"),
        "device_sampling_rate": info.pop("device_sampling_rate"),
        "rounds": acc.rounds,
        "relation": CORRDP,
        "eps_error": acc.eps_error,
    }
    out.update(info)
    _explain_infinities(out, acc, delta, CORRDP)
    return out


def _secagg_report(args: argparse.Namespace, acc: Any, info: dict[str, Any]) -> dict[str, Any]:
    """The report of a run with secure aggregation: its rounds are distributed discrete
    Gaussian events (:class:`~fedfdp.accounting.distributed.DistributedDiscreteGaussian`:
    sensitivity ``Δ = s + √d`` in integer units, add/remove, ``n_min − t_c`` honest
    parties' noise), replayed into
    :class:`~fedfdp.accounting.distributed.DistributedAccountant`. ``epsilon`` is what the
    run prints, the smaller of two upper bounds: route A (``epsilon_route_a``, the PRV bound
    of the smoothed Gaussian rounds at ``δe^{−Λ}`` plus ``2Λ``, ``docs/secagg_accounting.md``;
    its ``epsilon_estimate`` and ``epsilon_lower`` are route A's too) and route B
    (``epsilon_route_b``, Rényi DP of the discrete Gaussian sums). ``epsilon_replacement``
    is route A for the replacement relation (the density-ratio transfer holds for either
    relation). ``noise_multiplier`` is the rounds' ``σ_eff``. Theorem 4's bound and the
    trade-off curve need the rounds' trade-off function, which route A only bounds in ε:
    ``--ball`` and ``--tradeoff`` are refused.
    """
    from fedfdp.accounting.distributed import route_a_epsilon
    from fedfdp.accounting.events import DistributedDiscreteGaussian, Relation, event_from_dict

    for flag, value in (("--ball", args.ball), ("--tradeoff", args.tradeoff)):
        if value is not None:
            raise ConfigError(f"{flag}={value!r}: not for a run with aggregation='secagg' (its ε is a "
                              "bound by routes A and B, not a trade-off curve)")
    delta = info.pop("delta")
    both = acc.epsilon_bound(delta)
    charged: list[tuple[Any, int]] = [(event_from_dict(item["event"]), int(item["count"]))
                                      for item in acc.state_dict()["ledger"]]
    replacement = route_a_epsilon(charged, delta, Relation.REPLACEMENT, eps_error=acc.eps_error)
    distributed = [e for e, _ in charged if isinstance(e, DistributedDiscreteGaussian)]
    out: dict[str, Any] = {
        "epsilon": _finite_or_none(both.epsilon),
        "epsilon_estimate": _finite_or_none(both.route_a.estimate),
        "epsilon_lower": _finite_or_none(both.route_a.lower),
        "epsilon_replacement": _finite_or_none(replacement.upper),
        "epsilon_route_a": _finite_or_none(both.route_a.upper),
        "epsilon_route_b": _finite_or_none(both.route_b),
        "slack": both.slack,
        "delta": delta,
        "noise_multiplier": info.pop("noise_multiplier"),
        "sampling_rate": info.pop("sampling_rate"),
        "device_sampling_rate": info.pop("device_sampling_rate"),
        "local_sigma": _one({e.local_sigma for e in distributed}),
        "honest_parties": _one({e.honest_parties for e in distributed}),
        "scale": _one({e.scale for e in distributed}),
        "rounds": acc.rounds - len(info.get("estimates", ())),  # the estimates are charged before round 1
        "relation": ADD_REMOVE,
        "eps_error": acc.eps_error,
    }
    out.update(info)
    _explain_infinities(out, acc, delta, ADD_REMOVE)
    return out


#: The ε columns of a report, and the relation each is stated for.
_EPSILON_COLUMNS = {"epsilon": ADD_REMOVE, "epsilon_replacement": "replacement",
                    "epsilon_route_a": ADD_REMOVE, "epsilon_route_b": ADD_REMOVE, "epsilon_corrdp": CORRDP}


def _explain_infinities(out: dict[str, Any], acc: Any, delta: float, relation: str) -> None:
    """``out["why_infinite"]``: for every ε column of ``out`` that is ∞ (``None``), one line
    saying which events have no bound under which relation, and why
    (:func:`fedfdp.ledger_replay.why_infinite`); absent when every ε is finite. A CorrDP
    report's ``epsilon`` is not ∞ but not applicable (its ε is ``epsilon_corrdp``).
    """
    from fedfdp.accounting.events import Relation, event_from_dict
    from fedfdp.ledger_replay import why_infinite

    infinite = [c for c in _EPSILON_COLUMNS if c in out and out[c] is None
                and not (relation == CORRDP and c == "epsilon")]
    if not infinite:
        return
    try:
        events = [(event_from_dict(item["event"]), int(item["count"])) for item in acc.state_dict()["ledger"]]
    except (AttributeError, KeyError, TypeError, ValueError):  # an accountant that keeps no event list
        events = []
    why = {}
    for column in infinite:
        rel = Relation(_EPSILON_COLUMNS[column])
        why[column] = why_infinite(events, delta, rel, mode=out.get("mode"),
                                   unbounded=bool(out.get("unbounded")), add_remove=out.get("epsilon"))
    out["why_infinite"] = why


def _one(values: set[Any]) -> Any:
    """The one value of ``values``, else None (none, or several)."""
    return values.pop() if len(values) == 1 else None


_WHY_LABEL = {"epsilon": "add/remove", "epsilon_replacement": "replacement", "epsilon_route_a": "route A",
              "epsilon_route_b": "route B", "epsilon_corrdp": "CorrDP"}


def _fmt(x: float | None, digits: int = 4) -> str:
    return "∞" if x is None else f"{x:.{digits}f}"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable table of a report from :func:`account`."""
    rows: list[tuple[str, str]] = []
    if r.get("node"):  # a node's state directory: every round it charged itself, over every run
        rows.append(("node ledger", f"{r['run']} (the node's own charges, every run on this state)"))
        rows.append(("rounds charged", f"{r['rounds']} over {len(r['runs'])} run(s)"))
    elif "run" in r:
        extra = r["charges"] - r["charged_rounds"]
        again = f"; {extra} re-run after a crash, charged again" if extra else ""
        planned = r.get("planned_private_rounds")
        of = f" of {planned} planned" if planned is not None else ""
        rows.append(("run", f"{r['run']} (mode {r.get('mode') or '?'})"))
        rows.append(("rounds charged", f"{r['rounds']}{of}{again}"))
        if r.get("estimates"):
            rows.append(("estimates", f"{', '.join(r['estimates'])} (charged before round 1, in the ε)"))
        mixed = None in (r["noise_multiplier"], r["sampling_rate"], r["device_sampling_rate"])
        if mixed and r.get("aggregation") == "secagg":
            for ev in r["ledger"]:
                fields = ", ".join(f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}"
                                   for k, v in ev.items() if k not in ("kind", "count"))
                rows.append(("  events", f"{ev['count']} × {ev['kind']} ({fields})"))
        elif mixed and r["relation"] != CORRDP:
            for ev in r["ledger"]:
                share = f", p = {ev['participation']:.6g}" if ev["participation"] != 1.0 else ""
                rows.append(("  events", f"{ev['count']} × (σ = {ev['noise_multiplier']:.6g}, "
                                         f"q = {ev['sampling_rate']:.6g}{share})"))
    else:
        rows.append(("rounds T", str(r["rounds"])))
    if r.get("aggregation") == "secagg":
        rows.append(("aggregation", "secagg (distributed discrete Gaussian noise, secure aggregation)"))
        if r["local_sigma"] is not None:
            rows.append(("local noise σ_loc", f"{r['local_sigma']:.6g}  (integer units, scale s = "
                                              f"{r['scale']:.6g}, n_h = {r['honest_parties']} "
                                              "honest parties)"))
    if r["noise_multiplier"] is not None:
        calibrated = (f"  (calibrated for target ε = {r['target_epsilon']:g})"
                      if "target_epsilon" in r else "")
        effective = "  (σ_eff of the distributed rounds)" if r.get("aggregation") == "secagg" else ""
        rows.append(("noise multiplier σ", f"{r['noise_multiplier']:.6g}{calibrated}{effective}"))
    if r["sampling_rate"] is not None:
        rows.append(("sampling rate q", f"{r['sampling_rate']:.6g}"))
    if r["device_sampling_rate"] is not None and r["device_sampling_rate"] != 1.0:
        rows.append(("device sampling p", f"{r['device_sampling_rate']:.6g}  (exact mixture: with prob. p a "
                                          "q-subsampled round, else none; not rate p·q)"))
    d = f"δ = {r['delta']:.3g}"
    if r["relation"] == CORRDP:
        rows.append(("ε CorrDP", f"{_fmt(r['epsilon_corrdp'])}  (upper bound, CorrDP relation, {d}; "
                                 "not a DP or FDP ε)"))
        rows += [("  why ∞", why) for why in r.get("why_infinite", {}).values()]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    route = "the smaller of routes A and B; route A's " if r.get("aggregation") == "secagg" else ""
    rows.append(("ε add/remove", f"{_fmt(r['epsilon'])}  (upper bound, add/remove, {d}; "
                                 f"{route}estimate {_fmt(r['epsilon_estimate'])}, "
                                 f"lower {_fmt(r['epsilon_lower'])})"))
    if r.get("aggregation") == "secagg":
        rows.append(("  route A", f"{_fmt(r['epsilon_route_a'])}  (PRV of the smoothed Gaussian rounds "
                                  f"+ 2Λ, Λ = {r['slack']:.3g})"))
        rows.append(("  route B", f"{_fmt(r['epsilon_route_b'])}  (Rényi DP of the discrete Gaussian sums)"))
        rows.append(("ε replacement", f"{_fmt(r['epsilon_replacement'])}  (upper bound, replacement, "
                                      f"route A, {d})"))
    else:
        rows.append(("ε replacement", f"{_fmt(r['epsilon_replacement'])}  (upper bound, replacement "
                                      f"via Prop. 1, {d})"))
    rows += [(f"  why ∞ ({_WHY_LABEL.get(c, c)})", why) for c, why in r.get("why_infinite", {}).items()]
    if "ball" in r:
        rows.append(("attribute inference", f"{r['attribute_inference_bound']:.4f}  (upper bound on "
                                            f"success, Theorem 4, Ball = {r['ball']:g}; add/remove)"))
    if "tradeoff_csv" in r:
        rows.append(("trade-off curve f", f"{r['tradeoff_csv']}, {r['tradeoff_png']}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def cmd_account(args: argparse.Namespace) -> int:
    """``fedfdp account``.

    A ``ValueError`` from the accountant (input it refuses) becomes a
    :class:`~fedfdp.config.ConfigError`: one line on stderr, exit status 2.
    """
    try:
        report = account(args)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if args.json:
        print(json.dumps(report, indent=1, allow_nan=False))
    else:
        print(format_report(report))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``account`` to the ``fedfdp`` parser."""
    p = sub.add_parser(
        "account",
        help="privacy accounting: ε of (σ, q, T) or of a run, calibration, Theorem 4, trade-off curve",
        description="Every ε is the upper end of the accountant's interval, add/remove relation "
        "(replacement via Prop. 1 alongside), at the stated δ.",
    )
    p.add_argument("--noise-multiplier", type=float, metavar="S", help="σ (noise std / clip norm)")
    p.add_argument("--target-epsilon", type=float, metavar="E",
                   help="calibrate σ so that ε ends at, never above, E")
    p.add_argument("--sampling-rate", type=float, metavar="Q",
                   help="Poisson rate of the privacy unit in a round that touches it: q (record unit), "
                        "p (privacy-unit=device)")
    p.add_argument("--device-sampling-rate", type=float, metavar="P",
                   help="record unit with Poisson device sampling: a round touches a record only if its "
                        "device is drawn (probability P, known to the adversary); accounted as the exact "
                        "mixture, not as rate P·Q (default: every device, P = 1)")
    p.add_argument("--rounds", type=int, metavar="T", help="number of private rounds")
    p.add_argument("--delta", type=float, metavar="D", help="δ of every ε (with --run: default the run's)")
    p.add_argument("--num-records", type=int, metavar="N", help="δ = 1/(2N) instead of --delta")
    p.add_argument("--run", metavar="DIR",
                   help="account a run: its ledger replayed, at δ and relation of DIR/config.toml")
    p.add_argument("--ball", type=float, metavar="P",
                   help="also bound attribute-inference success (Theorem 4) for Ball = P")
    p.add_argument("--tradeoff", metavar="PREFIX",
                   help="write the composed trade-off curve to PREFIX.csv and PREFIX.png")
    p.add_argument("--eps-error", type=float, default=None, metavar="E",
                   help="accountant precision: upper − estimate ≈ 0.9·E (default 0.05; with --run "
                        "the run's own)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_account)
