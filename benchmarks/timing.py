"""Timing scaffolding shared by the benchmarks (not a test, not library code).

- :func:`interleaved_samples`: per-call times of several functions called
  round-robin, so that slow phases of a shared machine hit all of them alike.
- :func:`pick_clock`: torch's thread count and the clock (``cpu``: CPU time of
  the calling thread, robust to other processes; ``wall``: ``perf_counter``).
- :func:`quartiles`, :func:`malloc_env_set`: summary and environment helpers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

Clock = Callable[[], float]


def interleaved_samples(
    fns: dict[str, Callable[[], object]],
    seconds: float,
    clock: Clock,
    *,
    min_rounds: int,
    max_rounds: int,
) -> dict[str, list[float]]:
    """Per-call times (by ``clock``) of each function, calling them round-robin.

    Each function is called twice to warm up; one more round sizes the run to
    about ``seconds``, clamped to ``[min_rounds, max_rounds]`` rounds.
    """
    for f in fns.values():  # warm-up
        f()
        f()
    t0 = clock()
    for f in fns.values():
        f()
    per_round = max(clock() - t0, 1e-6)
    rounds = int(min(max_rounds, max(min_rounds, seconds / per_round)))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = clock()
            f()
            samples[k].append(clock() - t)
    return samples


def pick_clock(parser: argparse.ArgumentParser, clock: str, threads: int) -> Clock:
    """Set torch's thread count (``0``: leave it) and return the clock named ``clock``.

    ``"cpu"`` (CPU time of the calling thread) needs one torch thread; anything
    else is wall-clock ``time.perf_counter``.
    """
    if threads:
        torch.set_num_threads(threads)
    if clock == "cpu":
        if torch.get_num_threads() != 1:
            parser.error("--clock cpu needs --threads 1")
        return time.thread_time
    return time.perf_counter


def quartiles(values: list[float]) -> list[float]:
    """``[first quartile, third quartile]`` (both the value itself for one value; ``[]`` for none)."""
    if len(values) < 2:
        return [values[0], values[0]] if values else []
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def malloc_env_set() -> bool:
    """Whether glibc's allocator thresholds are set in the environment (see docs/clipping.md)."""
    return all(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))
