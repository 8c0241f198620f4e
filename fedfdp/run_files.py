"""The run directory: every file a run writes, and the resume checks.

``config.toml`` (the configuration and the resolved mechanism), ``ledger.jsonl`` (the
write-ahead ledger, :mod:`fedfdp.ledger`), ``checkpoint.pt`` (:mod:`fedfdp.checkpoint`),
``rows.jsonl`` (the rows a resume continues from, :mod:`fedfdp.run_rows`), ``metrics.csv``
and ``model.pt``. :class:`RunFiles` and :class:`Progress` are the
collaborators of the run loop (:class:`fedfdp.run_loop.RunLoop`); the round engine writes
the ledger through :meth:`RunFiles.write_ledger` (its journal).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from fedfdp.checkpoint import CHECKPOINT_FILE, Checkpoint, Resume, on_cpu, save_checkpoint, verify_resume
from fedfdp.config import RunConfig
from fedfdp.ledger import LEDGER_FILE, Ledger, write_ledger
from fedfdp.outputs import CONFIG_FILE, METRICS_FILE, MetricsFile, atomic_write, write_config
from fedfdp.run_rows import ROWS_FILE, RowsLog

if TYPE_CHECKING:
    from fedfdp.mechanism import ResolvedMechanism

#: The final model's state_dict, written at the end of a run.
MODEL_FILE = "model.pt"
#: Files that mark a directory as holding a run.
RUN_FILES = (CONFIG_FILE, METRICS_FILE, LEDGER_FILE, CHECKPOINT_FILE, MODEL_FILE, ROWS_FILE)


def occupied(out: str | Path) -> list[str]:
    """The run files already in ``out``."""
    return [f for f in RUN_FILES if (Path(out) / f).exists()]


class Progress:
    """The progress bar of a run (tqdm; silent when ``enabled`` is False)."""

    def __init__(self, total: int, initial: int, desc: str, enabled: bool) -> None:
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit="round", disable=not enabled,
                        leave=True)

    def update(self, epsilon: float, row: Mapping[str, Any]) -> None:
        """One round done: ε, and the row's accuracy (a classifier) or Fréchet distance (a
        generative model) when the round evaluated it.
        """
        self.bar.update(1)
        shown = {"eps": f"{epsilon:.3g}"}
        for column, label in (("accuracy", "acc"), ("fd", "fd")):
            value = row.get(column)
            if isinstance(value, (int, float)) and math.isfinite(value):
                shown[label] = f"{value:.3f}"
                break
        self.bar.set_postfix(**shown)

    def write(self, line: str) -> None:
        self.bar.write(line)

    def close(self) -> None:
        self.bar.close()


class RunFiles:
    """The run directory of a run: every file it writes, and the resume checks.

    The ledger is written durably (write-ahead) by :meth:`write_ledger`, which the
    round engine calls before a round draws anything; everything else is written
    after a round (:mod:`fedfdp.checkpoint` for the rules).

    Parameters
    ----------
    out : str or Path
        The run directory.
    settings : RunConfig
        ``resume`` and ``checkpoint-every``.
    record : mapping
        The run's flat configuration (``config.toml``, every checkpoint; a resume must
        find the same guarantee in it).
    num_rounds : int
        The rounds of the run.
    """

    def __init__(
        self, out: str | Path, settings: RunConfig, record: Mapping[str, Any], num_rounds: int
    ) -> None:
        self.out = Path(out)
        self.settings = settings
        self.record = dict(record)
        self.num_rounds = num_rounds
        self._metrics = MetricsFile(self.out / METRICS_FILE)
        self._rows = RowsLog(self.out)

    def write_ledger(self, ledger: Ledger) -> None:
        write_ledger(self.out, ledger)

    def verify(self, mechanism: ResolvedMechanism) -> Resume:
        """The resume checks (:func:`fedfdp.checkpoint.verify_resume`)."""
        return verify_resume(
            self.out, self.record, mechanism.digest(), mechanism.num_records,
            resume=self.settings.resume, num_rounds=mechanism.num_rounds,
            private_round=lambda r: mechanism.phase(r).noise, occupied=occupied(self.out),
        )

    def write_config(self, values: dict[str, Any]) -> None:
        write_config(self.out, self.record, values)

    def due(self, round_: int) -> bool:
        """Whether a checkpoint is due after ``round_``."""
        every, total = self.settings.checkpoint_every, self.num_rounds
        return bool(every) and (round_ % every == 0 or round_ == total)

    def checkpoint(self, ckpt: Checkpoint) -> None:
        save_checkpoint(self.out, ckpt, self._rows)

    def metrics(self, rows: list[dict[str, Any]]) -> None:
        """``metrics.csv`` brought to ``rows``: a round's row appended, or the file rewritten
        (:class:`~fedfdp.outputs.MetricsFile`).
        """
        self._metrics.write(rows)

    def model(self, model: nn.Module) -> None:
        buf = io.BytesIO()
        torch.save(on_cpu(model.state_dict()), buf)
        atomic_write(self.out / MODEL_FILE, buf.getvalue())
