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
    ε of a finished or interrupted run, from its write-ahead privacy ledger
    ``DIR/ledger.json`` (every charged round, re-run rounds included) and δ from
    ``[resolved]`` in ``DIR/config.toml`` unless ``--delta`` is given.

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
import tomllib
from pathlib import Path
from typing import Any

from fedfdp.config import ConfigError

LEDGER_FILE = "ledger.json"  # fedfdp.checkpoint.LEDGER_FILE (not imported: it pulls in torch)
CONFIG_FILE = "config.toml"  # fedfdp.outputs.CONFIG_FILE


# ------------------------------------------------------------------ validation
def _real(flag: str, value: float) -> float:
    if not math.isfinite(value):
        raise ConfigError(f"{flag}={value!r}: must be a finite number")
    return value


def _positive(flag: str, value: float) -> float:
    if _real(flag, value) <= 0:
        raise ConfigError(f"{flag}={value!r}: must be > 0")
    return value


def _rate(flag: str, value: float) -> float:
    if not 0.0 < _real(flag, value) <= 1.0:
        raise ConfigError(f"{flag}={value!r}: must be in (0, 1]")
    return value


def _delta(flag: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{flag}={value!r}: must be a number in (0, 1)")
    if not 0.0 < float(value) < 1.0:
        raise ConfigError(f"{flag}={value!r}: must be in (0, 1)")
    return float(value)


def _unit(flag: str, value: float) -> float:
    if not 0.0 <= _real(flag, value) <= 1.0:
        raise ConfigError(f"{flag}={value!r}: must be in [0, 1]")
    return value


def _count(flag: str, value: int) -> int:
    if value < 1:
        raise ConfigError(f"{flag}={value!r}: must be an integer >= 1")
    return value


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _delta_of(args: argparse.Namespace, fallback: float | None, fallback_name: str) -> float:
    """δ from ``--delta``, else ``--num-records``, else ``fallback`` (a run's)."""
    if args.delta is not None and args.num_records is not None:
        raise ConfigError(f"--delta={args.delta!r} and --num-records={args.num_records!r}: give one")
    if args.delta is not None:
        return _delta("--delta", args.delta)
    if args.num_records is not None:
        return 1.0 / (2 * _count("--num-records", args.num_records))
    if fallback is None:
        raise ConfigError(f"--delta is required ({fallback_name})")
    return fallback


# ------------------------------------------------------------------ sources of a ledger
def _direct(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """An accountant for ``--noise-multiplier``/``--target-epsilon`` mode."""
    from fedfdp.accounting import FDPAccountant, calibrate_noise_multiplier

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
    q = _rate("--sampling-rate", args.sampling_rate)
    p = 1.0
    if args.device_sampling_rate is not None:
        p = _rate("--device-sampling-rate", args.device_sampling_rate)
    rounds = _count("--rounds", args.rounds)
    delta = _delta_of(args, None, "or --num-records N for δ = 1/(2N)")
    info: dict[str, Any] = {}
    if args.target_epsilon is not None:
        target = _positive("--target-epsilon", args.target_epsilon)
        try:
            sigma = calibrate_noise_multiplier(target, q, rounds, delta, eps_error=args.eps_error,
                                               participation=p)
        except ValueError:
            hint = (f"; with --eps-error={args.eps_error:g} the upper bound of a subsampled "
                    f"mechanism stays above about {0.9 * args.eps_error:.3g}" if q < 1 or p < 1 else "")
            dev = f", device sampling rate {p:g}" if p < 1 else ""
            raise ConfigError(
                f"--target-epsilon={target!r}: unreachable, no noise multiplier <= 1e4 brings the "
                f"ε upper bound down to it (sampling rate {q:g}{dev}, {rounds} rounds, "
                f"δ = {delta:.3g}){hint}"
            ) from None
        info["target_epsilon"] = target
    else:
        sigma = _positive("--noise-multiplier", args.noise_multiplier)
    acc = FDPAccountant(eps_error=args.eps_error)
    acc.compose(sigma, q, rounds, participation=p)
    info.update(noise_multiplier=sigma, sampling_rate=q, device_sampling_rate=p)
    return acc, dict(info, delta=delta)


def _read_run(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """An accountant restored from ``DIR/ledger.json`` (``--run`` mode)."""
    from fedfdp.accounting import FDPAccountant

    for flag in ("noise_multiplier", "target_epsilon", "sampling_rate", "rounds", "device_sampling_rate"):
        if getattr(args, flag) is not None:
            name = "--" + flag.replace("_", "-")
            raise ConfigError(
                f"{name}={getattr(args, flag)!r}: not with --run (the run's ledger says what was spent)"
            )
    run = Path(args.run)
    if not run.is_dir():
        raise ConfigError(f"--run={args.run!r}: no such directory")
    doc: dict[str, Any] = {}
    cfg_path = run / CONFIG_FILE
    if cfg_path.is_file():
        try:
            doc = tomllib.loads(cfg_path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--run={args.run!r}: {cfg_path} is not valid TOML ({exc})") from None
    resolved = doc.get("resolved", {})
    if not isinstance(resolved, dict):
        raise ConfigError(f"--run={args.run!r}: [resolved] in {cfg_path} is not a table")
    ledger_path = run / LEDGER_FILE
    if not ledger_path.is_file():
        mode = doc.get("mode")
        why = f"mode={mode!r}; " if mode is not None else ""
        raise ConfigError(
            f"--run={args.run!r}: no {LEDGER_FILE} there ({why}a run writes it before its first "
            "private round; a public or non-private run, or a --centralised one, has none)"
        )
    try:
        ledger = json.loads(ledger_path.read_text())
        if not isinstance(ledger, dict) or set(ledger) != {"accountant", "charges"}:
            raise ValueError('expected {"accountant": ..., "charges": [[round, attempt], ...]}')
        charges = ledger["charges"]
        if not isinstance(charges, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(type(v) is int and v >= 0 for v in c)
            for c in charges
        ):
            raise ValueError("charges: expected a list of [round, attempt] integer pairs")
        acc = FDPAccountant(eps_error=args.eps_error)
        acc.load_state_dict(ledger["accountant"])
        if acc.rounds != len(charges):
            raise ValueError(f"{len(charges)} charges but the accountant holds {acc.rounds} rounds")
    except (ValueError, UnicodeDecodeError) as exc:  # json.JSONDecodeError is a ValueError
        raise ConfigError(f"--run={args.run!r}: malformed {ledger_path} ({exc})") from None

    if "delta" in resolved:
        flag = f"--run={args.run!r}: {cfg_path} [resolved] delta"
        run_delta: float | None = _delta(flag, resolved["delta"])
        why = ""
    else:
        run_delta = None
        why = f"{cfg_path} has no [resolved] delta" if doc else f"no {cfg_path} to read δ from"
    delta = _delta_of(args, run_delta, why)
    events = acc.ledger
    sigmas = {e.noise_multiplier for e in events}
    rates = {e.sampling_rate for e in events}
    shares = {e.participation for e in events}
    info: dict[str, Any] = {
        "noise_multiplier": sigmas.pop() if len(sigmas) == 1 else None,
        "sampling_rate": rates.pop() if len(rates) == 1 else None,
        "device_sampling_rate": shares.pop() if len(shares) == 1 else (None if shares else 1.0),
        "delta": delta,
        "run": str(run),
        "mode": doc.get("mode"),
        "charges": len(charges),
        "charged_rounds": len({r for r, _ in charges}),
        "planned_private_rounds": resolved.get("private-rounds"),
        "ledger": [
            {"noise_multiplier": e.noise_multiplier, "sampling_rate": e.sampling_rate, "count": e.count,
             "participation": e.participation}
            for e in events
        ],
    }
    return acc, info


# ------------------------------------------------------------------ the command
def account(args: argparse.Namespace) -> dict[str, Any]:
    """Compute the report of ``fedfdp account`` (a JSON-ready dict)."""
    from fedfdp.accounting import attribute_inference_bound, plot_tradeoff, save_tradeoff_csv

    if not 0.0 < _real("--eps-error", args.eps_error) <= 1.0:
        raise ConfigError(f"--eps-error={args.eps_error!r}: must be in (0, 1]")
    if args.ball is not None:
        _unit("--ball", args.ball)
    if args.tradeoff is not None and not str(args.tradeoff).strip():
        raise ConfigError(f"--tradeoff={args.tradeoff!r}: must be a path prefix")
    acc, info = _read_run(args) if args.run is not None else _direct(args)
    delta = info["delta"]
    bound = acc.epsilon_bound(delta, "add-remove")
    replacement = acc.epsilon_bound(delta, "replacement")
    out: dict[str, Any] = {
        "epsilon": _finite_or_none(bound.upper),
        "epsilon_estimate": _finite_or_none(bound.estimate),
        "epsilon_lower": _finite_or_none(bound.lower),
        "epsilon_replacement": _finite_or_none(replacement.upper),
        "delta": delta,
        "noise_multiplier": info.pop("noise_multiplier"),
        "sampling_rate": info.pop("sampling_rate"),
        "device_sampling_rate": info.pop("device_sampling_rate"),
        "rounds": acc.rounds,
        "relation": "add-remove",
        "eps_error": acc.eps_error,
    }
    out.update({k: v for k, v in info.items() if k != "delta"})
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


def _fmt(x: float | None, digits: int = 4) -> str:
    return "∞" if x is None else f"{x:.{digits}f}"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable table of a report from :func:`account`."""
    rows: list[tuple[str, str]] = []
    if "run" in r:
        extra = r["charges"] - r["charged_rounds"]
        again = f"; {extra} re-run after a crash, charged again" if extra else ""
        planned = r.get("planned_private_rounds")
        of = f" of {planned} planned" if planned is not None else ""
        rows.append(("run", f"{r['run']} (mode {r.get('mode') or '?'})"))
        rows.append(("rounds charged", f"{r['rounds']}{of}{again}"))
        if r["noise_multiplier"] is None or r["sampling_rate"] is None or r["device_sampling_rate"] is None:
            for ev in r["ledger"]:
                share = f", p = {ev['participation']:.6g}" if ev["participation"] != 1.0 else ""
                rows.append(("  events", f"{ev['count']} × (σ = {ev['noise_multiplier']:.6g}, "
                                         f"q = {ev['sampling_rate']:.6g}{share})"))
    else:
        rows.append(("rounds T", str(r["rounds"])))
    if r["noise_multiplier"] is not None:
        calibrated = (f"  (calibrated for target ε = {r['target_epsilon']:g})"
                      if "target_epsilon" in r else "")
        rows.append(("noise multiplier σ", f"{r['noise_multiplier']:.6g}{calibrated}"))
    if r["sampling_rate"] is not None:
        rows.append(("sampling rate q", f"{r['sampling_rate']:.6g}"))
    if r["device_sampling_rate"] is not None and r["device_sampling_rate"] != 1.0:
        rows.append(("device sampling p", f"{r['device_sampling_rate']:.6g}  (exact mixture: with prob. p a "
                                          "q-subsampled round, else none; not rate p·q)"))
    d = f"δ = {r['delta']:.3g}"
    rows.append(("ε add/remove", f"{_fmt(r['epsilon'])}  (upper bound, add/remove, {d}; "
                                 f"estimate {_fmt(r['epsilon_estimate'])}, "
                                 f"lower {_fmt(r['epsilon_lower'])})"))
    rows.append(("ε replacement", f"{_fmt(r['epsilon_replacement'])}  (upper bound, replacement "
                                  f"via Prop. 1, {d})"))
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
    p.add_argument("--run", metavar="DIR", help="account a run from DIR/ledger.json and DIR/config.toml")
    p.add_argument("--ball", type=float, metavar="P",
                   help="also bound attribute-inference success (Theorem 4) for Ball = P")
    p.add_argument("--tradeoff", metavar="PREFIX",
                   help="write the composed trade-off curve to PREFIX.csv and PREFIX.png")
    p.add_argument("--eps-error", type=float, default=0.05, metavar="E",
                   help="accountant precision: upper − estimate ≈ 0.9·E (default 0.05)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_account)
