"""The one family of number checks: a real, a finite real, a positive real, a rate, a
weight, a δ, a count.

Every check returns the value in its canonical type (``float`` or ``int``) or raises
``ValueError`` naming ``name=value`` and what it must be, in one line (the
configuration's and the CLI's messages are built from these: the CLI passes its flag
as the name, ``--sampling-rate=1.5: must be in (0, 1]``). Shared rules: ``bool`` is
refused wherever a number is asked for; numpy scalars are accepted (and named by their
Python value); NaN is refused.

This module sits at the bottom of the import graph: it imports the standard library
and numpy only, so the event vocabulary, the accountants, secure aggregation and the
CLI all check numbers the same way.

Examples
--------
>>> rate("sampling_rate", 0.05), count("rounds", 150)
(0.05, 150)
>>> rate("sampling_rate", 1.5)
Traceback (most recent call last):
...
ValueError: sampling_rate=1.5: must be in (0, 1]
>>> positive("noise_multiplier", True)
Traceback (most recent call last):
...
ValueError: noise_multiplier=True: must be a real number
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["at_least", "count", "finite", "open_unit", "positive", "rate", "real", "unit"]


def real(name: str, value: Any) -> float:
    """``value`` as a float: an ``int``, a ``float`` or a numpy scalar, not ``bool``,
    not NaN (``±∞`` pass).
    """
    if isinstance(value, np.integer | np.floating):
        value = float(value)  # named by its Python value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r}: must be a real number")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name}={value!r}: must not be NaN")
    return v


def finite(name: str, value: Any) -> float:
    """``value`` as a finite float (:func:`real`, ``±∞`` refused)."""
    v = real(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name}={value!r}: must be finite")
    return v


def positive(name: str, value: Any, *, allow_inf: bool = False) -> float:
    """``value`` as a float in ``(0, ∞)`` (``+∞`` too with ``allow_inf``): a noise
    multiplier, a scale, a variance.
    """
    v = real(name, value)
    if math.isinf(v) and not (allow_inf and v > 0):
        raise ValueError(f"{name}={value!r}: must be finite")
    if not v > 0:
        raise ValueError(f"{name}={value!r}: must be > 0")
    return v


def at_least(name: str, value: Any, minimum: float) -> float:
    """``value`` as a float ``>= minimum`` (:func:`real`)."""
    v = real(name, value)
    if not v >= minimum:
        raise ValueError(f"{name}={value!r}: must be >= {minimum:g}")
    return v


def rate(name: str, value: Any) -> float:
    """``value`` as a float in ``(0, 1]``: a sampling rate, a participation, a
    precision target.
    """
    v = real(name, value)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"{name}={value!r}: must be in (0, 1]")
    return v


def unit(name: str, value: Any) -> float:
    """``value`` as a float in ``[0, 1]``: a weight, a probability that may be 0."""
    v = real(name, value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name}={value!r}: must be in [0, 1]")
    return v


def open_unit(name: str, value: Any) -> float:
    """``value`` as a float in ``(0, 1)``: the δ of an ``(ε, δ)`` statement, a relative
    tolerance.
    """
    v = real(name, value)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name}={value!r}: must be in (0, 1)")
    return v


#: The largest count :func:`count` accepts: a signed 64-bit integer (numpy's ``int64``).
MAX_INT64 = 2**63 - 1


def count(name: str, value: Any, minimum: int = 1, maximum: int = MAX_INT64) -> int:
    """``value`` as an int in ``[minimum, maximum]``: an ``int`` or a numpy integer, not
    ``bool``; ``maximum`` defaults to the largest 64-bit integer (what fits the machine).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")
    if value > maximum:
        raise ValueError(f"{name}={value!r}: must be at most {maximum}")
    return int(value)
