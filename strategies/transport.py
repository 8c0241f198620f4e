"""Flower transport of a round: push messages, poll for their replies.

Flower's own ``Grid.send_and_receive`` sleeps 0.1 s (simulation) or 3 s (deployment)
between polls, which is most of a short round; :func:`exchange` polls the Grid at
short, growing intervals instead. The plain round (:mod:`strategies.fdp_strategy`) and
every stage of a secure-aggregation round (:mod:`strategies.secagg_round`) use it.
"""

from __future__ import annotations

import time

from flwr.app import Message
from flwr.serverapp import Grid

#: Replies are polled from the Grid first after this many seconds, then at
#: intervals growing by half up to :data:`POLL_MAX_SECONDS` (back to the first
#: after each reply); after :data:`POLL_FAST_SECONDS` of waiting, up to
#: :data:`POLL_SLOW_SECONDS`.
POLL_MIN_SECONDS = 0.002
POLL_MAX_SECONDS = 0.01
POLL_FAST_SECONDS = 2.0
POLL_SLOW_SECONDS = 0.2


def exchange(grid: Grid, messages: list[Message], timeout: float | None) -> list[Message]:
    """Send ``messages`` and collect their replies until all arrived or
    ``timeout`` seconds passed (Flower's ``Grid.send_and_receive`` contract),
    polling the Grid at short intervals.
    """
    pending = set(grid.push_messages(messages))
    start = time.monotonic()
    end = None if timeout is None else start + timeout
    replies: list[Message] = []
    pause = POLL_MIN_SECONDS
    while pending:
        got = list(grid.pull_messages(pending))
        if got:
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            pause = POLL_MIN_SECONDS
            continue
        now = time.monotonic()
        if end is not None and now >= end:
            break
        time.sleep(pause if end is None else max(0.0, min(pause, end - now)))
        cap = POLL_MAX_SECONDS if now - start < POLL_FAST_SECONDS else POLL_SLOW_SECONDS
        pause = min(pause * 1.5, cap)
    return replies
