"""The run loop: every round of a run, beside the plan that decided them.

:class:`RunLoop` drives a :class:`~fedfdp.round_engine.RoundEngine` from the first round
to the last (or to the budget's end): it **resumes** a run directory (the checks of
:func:`fedfdp.checkpoint.verify_resume`; the engine restores the ledger, the model, the
optimizer and ``C``), writes ``config.toml`` with the plan's ``[resolved]`` table
(:meth:`fedfdp.run_plan.RunPlan.resolved_table`), calls ``step(round)`` — the engine's
``begin_round`` … ``finish_round`` through whatever transport the engine uses (Flower,
or the centralised engine's loop over devices) —, **evaluates** on held-out data every
``eval-every`` rounds and after the last, keeps one **row** of ``metrics.csv`` per round,
**checkpoints** every ``checkpoint-every`` rounds, draws the progress bar, and stops
cleanly before a round that would exceed ``max-epsilon`` (or one that secure
aggregation had to abort every try).

It decides nothing about privacy: ε, δ, the relation and the event are the resolved
mechanism's, read from the engine.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fedfdp.accounting import PrivacyBudgetExhausted
from fedfdp.checkpoint import CHECKPOINT_FILE, Checkpoint, CheckpointMismatch
from fedfdp.entropy import REPRODUCIBLE_WARNING, noise_source
from fedfdp.evaluation import EvaluateFn
from fedfdp.health import RunDiverged
from fedfdp.ledger import LEDGER_FILE
from fedfdp.outputs import CONFIG_FILE
from fedfdp.round_engine import RoundAborted, RoundEngine, RoundOutcome
from fedfdp.run_files import Progress

if TYPE_CHECKING:
    from fedfdp.run_plan import RunPlan

log = logging.getLogger("fedfdp.server")

#: ``step(round) -> RoundOutcome``: one round through the engine (module docstring).
Step = Callable[[int], RoundOutcome]


class RunLoop:
    """Every round of ``plan`` on ``engine`` (module docstring).

    Parameters
    ----------
    plan : RunPlan
        The run's plan: its run directory, evaluation, settings and record.
    engine : RoundEngine
        The round engine :meth:`RunPlan.engine` built over the public facts.
    evaluate : callable, optional
        ``evaluate(round, model) -> metrics`` on held-out data (default: the plan's).

    Attributes
    ----------
    rows : list of dict
        One row of ``metrics.csv`` per completed round (a resumed run's included).
    stop_reason : str or None
        Why the run stopped early (budget exhausted, a round aborted), else None.
    """

    def __init__(self, plan: RunPlan, engine: RoundEngine, *, evaluate: EvaluateFn | None = None) -> None:
        self.plan = plan
        self.engine = engine
        self.files = plan.files
        self.evaluate = evaluate if evaluate is not None else plan.evaluate
        self.rows: list[dict[str, Any]] = []
        self.stop_reason: str | None = None

    # ---------------------------------------------------------------- resume
    def resume(self) -> int:
        """Check the run directory and restore a run from it; return the first round
        to run (:meth:`fedfdp.run_files.RunFiles.verify`, the engine's restore). A new
        run writes the ledger (the mechanism, its first entry) now.
        """
        files, engine = self.files, self.engine
        if files is None:
            return 1
        found = files.verify(engine.mechanism)
        if found.ledger is not None:  # a resume: the [resolved] table must be what the plan resolves
            self.verify_resolved()
        if found.checkpoint is not None and found.ledger is not None:
            recorded = found.ledger.checkpoint_every(found.checkpoint.head.entries)
            if found.checkpoint.every != recorded:
                raise CheckpointMismatch(
                    f"{files.out / CHECKPOINT_FILE}: checkpoint-every={found.checkpoint.every}, but the "
                    f"ledger's chain records {recorded} for the session that wrote it: the checkpoint was "
                    "edited; refusing to resume")
        first = 1
        if found.ledger is not None:
            engine.restore_ledger(found.ledger, found.unrecorded)
            if found.checkpoint is not None:
                engine.restore_state(found.checkpoint)
                self.rows = list(found.checkpoint.rows)
                first = found.checkpoint.round + 1
        else:  # a new run: the mechanism is the ledger's first entry
            self.record_session()
            files.write_ledger(engine.ledger)
        if found.ledger is not None and self.record_session():
            files.write_ledger(engine.ledger)
        if found.checkpoint is not None or found.ledger is not None:
            log.warning("resuming %s after round %d: epsilon so far %.4g (%d charges in the ledger)",
                        files.out, first - 1, engine.epsilon(), len(engine.ledger.charges))
        # every session starts from a checkpoint of the head it continues from
        files.checkpoint(self.checkpoint(first - 1))
        return first

    def verify_resolved(self) -> None:
        """Refuse to resume a run directory whose ``config.toml`` ``[resolved]`` table is
        missing or differs from what the plan resolves now (the table was edited: what the
        run directory says of the guarantee would no longer be the run's), naming the first
        differing value; before anything is written.
        """
        from fedfdp.config import load_toml_file

        if self.files is None:
            return
        path = self.files.out / CONFIG_FILE
        saved = load_toml_file(path).get("resolved")
        if not isinstance(saved, dict):
            raise CheckpointMismatch(f"{path}: no [resolved] table (the values the run resolved at its "
                                     "start); refusing to resume a run directory whose record was cut")
        expected = self.plan.resolved_table(self.engine)
        for key, value in expected.items():
            if saved.get(key) != value:
                raise CheckpointMismatch(
                    f"{path}: [resolved] {key}={saved.get(key)!r}, but the run resolves {value!r}: the "
                    "table was edited; refusing to resume (restore it, or start a new --out)")

    def record_session(self) -> bool:
        """Chain this session's ``checkpoint-every`` into the ledger when it differs from what
        the chain says (:meth:`fedfdp.ledger.Ledger.checkpoint_every`), before the session's
        first checkpoint: a resume then bounds the rounds a crashed session may have charged
        by the value the chain holds, not by the checkpoint's (editable) copy. Whether it
        appended.
        """
        every = self.plan.settings.checkpoint_every
        ledger = self.engine.ledger
        if ledger.checkpoint_every() == every:
            return False
        ledger.append_session(every)
        return True

    def checkpoint(self, round_: int) -> Checkpoint:
        """The run's state after ``round_``."""
        engine, state = self.engine, self.engine.state()
        m = engine.mechanism
        return Checkpoint(
            round=round_, config=self.plan.record, num_records=engine.num_records,
            mechanism_digest=m.digest(), head=state.head, rows=self.rows,
            clipping_norm=state.clipping_norm, every=self.plan.settings.checkpoint_every,
            model=state.model, optimizer=state.optimizer,
        )

    # ---------------------------------------------------------------- the loop
    def run(self, step: Step, *, resolved: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run every round with ``step(round) -> RoundOutcome``; evaluate server-side,
        write metrics, checkpoints and the final model. Stops cleanly before a round
        that would exceed ``max-epsilon`` (``resolved``: extra ``[resolved]`` values).
        """
        engine, files, settings = self.engine, self.files, self.plan.settings
        m = engine.mechanism
        first = self.resume()
        if m.reproducible_noise:
            log.warning(REPRODUCIBLE_WARNING)
        if files is not None and first == 1:
            files.write_config(self.plan.resolved_table(engine, resolved))
        total = m.num_rounds
        progress = Progress(total, first - 1, f"fedfdp {m.mode}", settings.progress)
        column = engine.accounting.column
        try:
            for r in range(first, total + 1):
                try:
                    outcome = step(r)
                except (PrivacyBudgetExhausted, RoundAborted) as exc:
                    self.stop_reason = f"stopped before round {r}: {exc}"
                    log.warning(self.stop_reason)
                    progress.write(self.stop_reason)
                    break
                except RunDiverged as exc:
                    raise self.diverged(exc) from None
                metrics: dict[str, float] = {}
                if self.evaluate is not None and (r % settings.eval_every == 0 or r == total):
                    metrics = {k: float(v) for k, v in (self.evaluate(r, engine.model) or {}).items()}
                    if "loss" in metrics and not math.isfinite(metrics["loss"]):
                        lr = self.plan.training.learning_rate
                        raise self.diverged(RunDiverged(
                            f"round {r}: the held-out loss is {metrics['loss']}; the model diverged (likely "
                            f"learning-rate={lr:g})"))
                row = self.row(r, outcome, metrics)
                self.rows.append(row)
                if files is not None:
                    if files.due(r):
                        files.checkpoint(self.checkpoint(r))
                    files.metrics(self.rows)
                progress.update(row.get(column, outcome.epsilon), row)
        finally:
            progress.close()
        if files is not None:
            files.model(engine.model)
        return self.rows

    def diverged(self, exc: RunDiverged) -> RunDiverged:
        """``exc`` (a run stopped by its numerical health) with what stays in the run
        directory and the way on: the charges already in the ledger stay (their noise was
        drawn); the run goes on with ``--resume`` (same settings, from the last checkpoint)
        or starts afresh with another value in a new ``--out``.
        """
        if self.files is None:
            return exc
        out, charges = self.files.out, len(self.engine.ledger.charges)
        kept = (f"the ledger {out / LEDGER_FILE} keeps the {charges} charge(s) spent (their noise was drawn)"
                if charges else f"nothing was charged ({out} holds the run's start)")
        return RunDiverged(f"{exc}; {kept}: go on with fedfdp run --resume {out} (same settings, from the "
                           "last checkpoint) or start afresh with another value and a new --out")

    def row(self, round_: int, outcome: RoundOutcome, metrics: dict[str, float]) -> dict[str, Any]:
        """The ``metrics.csv`` row of a round."""
        m = self.engine.mechanism
        phase = m.phase(round_)
        s = outcome.stats
        acc = metrics.pop("accuracy", float("nan"))
        loss = metrics.pop("loss", float("nan"))
        return {
            "round": round_,
            "phase": phase.name,
            "epsilon": outcome.epsilon,
            **(outcome.epsilons or {}),
            "delta": m.delta,
            "relation": str(m.relation),
            "accuracy": acc,
            "loss": loss,
            "public_loss": outcome.public_loss,
            "replies": s.replies,
            "rejected": s.rejected,
            "asked": s.asked,
            "missing": s.missing,
            "noise_multiplier": m.noise_multiplier if phase.noise else 0.0,
            "normaliser": outcome.normaliser if phase.has_private else float("nan"),
            "clipping_norm": outcome.clipping_norm if phase.noise else float("nan"),
            "noise_source": noise_source(m.reproducible_noise),
            **metrics,
        }
