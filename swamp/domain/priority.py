"""Priority and aging: the order in which waiting steps get a worker.

A step's *priority* is a whole number from ``MIN_PRIORITY`` to ``MAX_PRIORITY`` (default 0;
higher goes first), set on a run (``--priority``) or in a workflow file. Waiting raises it: a
step gains one point for every *aging interval* (``swamp serve --queue-aging``) that passes while
it waits, so a stream of higher-priority steps delays a lower one only for a bounded time.

Aging is counted in *epochs* — the aging interval's ticks of one clock, the same for every step —
rather than in each step's own waited time: a step that started waiting in epoch ``e`` with
priority ``p`` has, in epoch ``now``, the effective priority ``p + (now − e)``. Aging only lifts a
step into a higher priority's contest: the queue (:mod:`swamp.domain.queue`) lets the steps given
the highest priority waiting contend with those raised to it, and orders the contenders by fair
share between submitters, never by the tick each arrived in — so steps given the same priority
take turns whenever they arrived. Whether a step contends is worked out when a worker is free,
from its own tick (its oldest step is the most raised of a submitter's line): nothing is re-sorted
or rescanned as time passes, and no timer runs.
"""

from __future__ import annotations

import math
import re

from swamp.domain.durations import parse_duration
from swamp.errors import UserError

MIN_PRIORITY, MAX_PRIORITY = -100, 100
DEFAULT_PRIORITY = 0
# a waiting step gains a point every 30 s: a priority-0 step passes freshly queued priority-10
# steps after 5 minutes, within the default queue timeout (10 minutes)
DEFAULT_AGING = 30.0
RANGE = f"a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} (higher goes first; default 0)"
_MILLISECONDS = re.compile(r"\s*(\d+)ms\s*")


def check_priority(value: object, *, what: str = "--priority") -> int:
    """A priority as given (a number, or text from the command line), or a ``UserError``."""
    number: object = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if (
        isinstance(number, bool)
        or not isinstance(number, int)
        or not MIN_PRIORITY <= number <= MAX_PRIORITY
    ):
        raise UserError(f"invalid {what} {value!r}: expected {RANGE}")
    return number


def parse_aging(text: str, *, what: str = "--queue-aging") -> float:
    """Seconds per point of aging: a duration (``30s``, ``2m``) or milliseconds (``250ms``)."""
    match = _MILLISECONDS.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        milliseconds = int(match.group(1))
        if milliseconds <= 0:
            raise UserError(f"invalid {what} {text!r}: it must be positive")
        return milliseconds / 1000
    try:
        return float(parse_duration(text, what=what))
    except UserError as exc:
        raise UserError(f"{exc.message}; or milliseconds, e.g. 250ms") from None


def epoch(now: float, aging: float) -> int:
    """The aging tick ``now`` (seconds on a steady clock) falls in."""
    return math.floor(now / aging)


def effective(priority: int, started_epoch: int, now_epoch: int) -> int:
    """A waiting step's priority now: its own, plus a point per aging tick it has waited."""
    return priority + max(0, now_epoch - started_epoch)
