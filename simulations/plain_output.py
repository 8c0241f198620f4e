r"""What ``fedfdp`` writes to a file or a pipe: plain text.

A terminal shows colours (ANSI escape sequences) and a progress bar that rewrites its
line in place (``\r``). Redirected to a file, the same bytes are hundreds of bar updates
and raw escape codes. :class:`PlainText` keeps what a reader of the file wants: each
line's last state (a bar's final line), without escape sequences. ``fedfdp run`` writes
through it whenever its stderr is not a terminal (:func:`plain_stderr`, and the echo of
Flower's output in :mod:`simulations.flower_processes`).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator
from typing import TextIO

__all__ = ["ANSI_ESCAPE", "PlainText", "plain_stderr"]

#: An ANSI escape sequence (colours, cursor moves).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _last_state(line: str) -> str:
    r"""The last non-empty state of a line rewritten in place with ``\r``."""
    states = [s for s in line.split("\r") if s.strip()]
    return states[-1] if states else ""


class PlainText(io.TextIOBase):
    r"""A text stream writing to ``out`` each line's last ``\r`` state, without ANSI
    escape sequences; a line is written when its ``\n`` arrives (or at :meth:`finish`).
    """

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out
        self._line = ""

    def write(self, text: str) -> int:
        *done, rest = (self._line + ANSI_ESCAPE.sub("", text)).split("\n")
        if done:
            self._out.write("".join(_last_state(line) + "\n" for line in done))
        self._line = "\r" + _last_state(rest) if "\r" in rest else rest
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def finish(self) -> None:
        """Write the unfinished line (its last state), if any."""
        last = _last_state(self._line)
        self._line = ""
        if last:
            self._out.write(last + "\n")
        self._out.flush()


@contextlib.contextmanager
def plain_stderr() -> Iterator[None]:
    """``sys.stderr`` through :class:`PlainText` inside the block when it is not a terminal
    (a progress bar writes its final line only; no escape codes); unchanged on a terminal.
    """
    stream = sys.stderr
    if stream.isatty():
        yield
        return
    plain = PlainText(stream)
    sys.stderr = plain
    try:
        yield
    finally:
        sys.stderr = stream
        plain.finish()
