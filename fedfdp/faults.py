"""Planted bugs, for testing the privacy audit only.

A privacy audit is only trustworthy if it demonstrably catches broken
mechanisms. This module lets the audit (``fedfdp audit --break NAME``) switch on
one known bug inside the real client and server code paths, for the duration
of a ``with planted_bug(NAME):`` block in the current process. No configuration
key reaches it: a normal run (``fedfdp run``, ``flwr run``) can never enable it.

=========================  ==================================================
bug                        what breaks
=========================  ==================================================
``shared-batch``           the public batch reuses the private Poisson sample
                           (Prop. 3: the public gradient reveals the coins,
                           amplification by subsampling is lost)
``no-clip``                private per-record gradients are not clipped
``low-noise``              the server adds noise with σ/2 (accounted as σ)
``realized-normalization`` the private sum is normalised by the realised batch
                           size instead of the expected ``q·N``
=========================  ==================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

BUGS = ("shared-batch", "no-clip", "low-noise", "realized-normalization")

_active: str | None = None


def active(name: str) -> bool:
    """Whether planted bug ``name`` is switched on (always False in normal runs)."""
    if name not in BUGS:
        raise ValueError(f"planted bug {name!r}: unknown (known: {', '.join(BUGS)})")
    return _active == name


@contextmanager
def planted_bug(name: str | None) -> Iterator[None]:
    """Switch on one planted bug in this process for the block (``None``: none)."""
    global _active
    if name is not None and name not in BUGS:
        raise ValueError(f"--break {name!r}: unknown (known: {', '.join(BUGS)})")
    previous, _active = _active, name
    try:
        yield
    finally:
        _active = previous
