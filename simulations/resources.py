"""Memory estimates before the work starts: a command that cannot fit is refused in one
line naming the setting, instead of failing with an out-of-memory error after minutes.

Every estimate is a **lower bound** from public facts (the configuration, the
parameter count of the model built on the ``meta`` device, the width of a record
measured on a small draw of the same generator), compared with the memory this
machine has available (``MemAvailable`` of ``/proc/meminfo``, or the cgroup's
limit when lower). A command is refused only when even that lower bound does not
fit; nothing data-dependent is read (the synthetic generators' sizes are settings).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from fedfdp.config import Config, ConfigError

#: Datasets whose record count is ``num-devices × records-per-device`` (synthetic
#: generators; ``purchase100`` and ``criteo`` only without a ``data-path``).
GENERATED = ("fleet", "correlated")
GENERATED_WITHOUT_FILE = ("purchase100", "criteo")
#: Below this many generated records no estimate is made (they always fit).
SMALL_DATA = 1_000_000
#: Records of the probe that measures a generated record's width.
PROBE_RECORDS_PER_DEVICE = 64
#: Copies of a float32 parameter vector a round holds at least: the weights, their
#: gradient, the optimiser's state, the private and public sums, the noise.
MODEL_COPIES = 6
#: Copies of the generated arrays while they are made (the generator's own arrays,
#: then the split devices and the held-out split).
DATA_COPIES = 2


def available_memory() -> int | None:
    """Bytes of memory available to this process (``None`` when unknown)."""
    limits: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            limits.append(int(text))
    except OSError:
        pass
    if not limits:
        try:
            limits.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return min(limits)


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def refuse_unless_fits(need: float, setting: str, what: str) -> None:
    """Raise :class:`ConfigError` (``setting: what needs about X GB, Y GB available``)
    when ``need`` bytes exceed the available memory.
    """
    have = available_memory()
    if have is not None and need > have:
        raise ConfigError(f"{setting}: {what} needs at least {_gb(need)} of memory, more than the "
                          f"{_gb(have)} available; reduce it")


def generated_records(cfg: Config) -> int | None:
    """The record count of a generated dataset (``None`` for one read from a file)."""
    d = cfg.data
    if d.dataset in GENERATED or (d.dataset in GENERATED_WITHOUT_FILE and not d.data_path):
        return d.num_devices * d.records_per_device
    return None


def check_data_memory(cfg: Config) -> None:
    """Refuse a generated dataset whose arrays cannot fit, before generating it: the
    width of a record is measured on a small draw of the same generator.
    """
    from fedfdp.data import load_dataset

    n = generated_records(cfg)
    if n is None or n < SMALL_DATA:
        return
    probe = load_dataset(replace(cfg.data, records_per_device=PROBE_RECORDS_PER_DEVICE))
    arrays = sum(dev.x.nbytes + dev.y.nbytes for dev in probe.devices)
    arrays += probe.test_x.nbytes + probe.test_y.nbytes
    records = sum(len(dev.y) for dev in probe.devices) + len(probe.test_y)
    per_record = arrays / max(1, records)
    refuse_unless_fits(
        DATA_COPIES * per_record * n,
        f"records-per-device={cfg.data.records_per_device}",
        f"dataset={cfg.data.dataset!r} with num-devices={cfg.data.num_devices} ({n:,} records of "
        f"{per_record:.0f} bytes)",
    )


def check_model_memory(cfg: Config, num_params: int) -> None:
    """Refuse a model whose parameters cannot fit :data:`MODEL_COPIES` times."""
    t = cfg.training
    sizes = f", hidden-sizes={list(t.hidden_sizes)}" if t.hidden_sizes else f", hidden-size={t.hidden_size}"
    setting = f"model={t.model!r}" + (sizes if t.model in ("mlp", "cnn") else "")
    refuse_unless_fits(MODEL_COPIES * 4 * num_params, setting,
                       f"the model ({num_params:,} parameters, float32, {MODEL_COPIES} copies in a round)")


def check_audit_memory(rounds: int, canaries: int, arrays: int = 14) -> None:
    """Refuse a canary audit whose observations cannot fit: ``arrays`` numbers of 8
    bytes per canary and round (seven observed per trial, and their flattened copies).
    """
    refuse_unless_fits(8 * arrays * rounds * max(1, canaries), f"--rounds={rounds}",
                       f"the audit's observations ({canaries} canaries, {arrays} numbers per canary "
                       "and round)")
