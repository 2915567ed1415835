"""Demand per requirement as an autoscaler reads it (``/metrics``), and which requirements get
series — a bounded set.

A *requirement* is what a placed step asks of a worker (labels, platform, or a target; see
:class:`swamp.domain.scheduler.Requirement`), named by :meth:`Requirement.text`. For each one
that has series, ``/metrics`` gives the steps waiting, the steps running (each holds a slot), the
free slots of the schedulable workers that match it, and the oldest wait.

:class:`Series` decides which requirements those are, at each scrape:

- every requirement with a step waiting or running;
- and, at 0, every one that a scrape saw with a step in the last :data:`RECENT_SECONDS`: the
  series of a requirement whose last step ended reads 0 instead of vanishing. An autoscaler
  needs that 0 to scale in (to zero, too); a vanished series leaves Prometheus repeating the
  last value for five minutes, then nothing at all — "no data" rather than "no demand";
- at most :data:`MAX_SERIES` in all. Past it, those with nothing waiting or running go first
  (the longest idle first), then those with the least demand (steps waiting plus running;
  ties by name). How many were left out is a series of its own.

"Seen" is what a scrape saw: a requirement whose steps came and went between two scrapes never
had a series, as a gauge never shows what happened between two reads. Pure: the shell passes
the clock's reading.
"""

from __future__ import annotations

from typing import NamedTuple

from swamp.domain.scheduler import Requirement

RECENT_SECONDS = 900.0  # 15 minutes: longer than KEDA's cooldown and the HPA's scale-in window
MAX_SERIES = 1000  # requirements with series at once (each has four)


class Demand(NamedTuple):
    """One requirement's demand: steps ``waiting`` for a worker, steps ``running`` on one, and
    how long the oldest waiting step has waited (``oldest_wait``, seconds; 0 if none waits)."""

    waiting: int = 0
    running: int = 0
    oldest_wait: float = 0.0

    @property
    def steps(self) -> int:
        return self.waiting + self.running


IDLE = Demand()


class Series:
    """Which requirements get series, scrape after scrape (see the module's docstring)."""

    def __init__(self, *, keep: float = RECENT_SECONDS, limit: int = MAX_SERIES) -> None:
        self.keep = keep
        self.limit = limit
        self.seen: dict[Requirement, float] = {}  # requirement → when a scrape last saw a step
        self.omitted = 0  # requirements with steps left out at the last scrape

    def __repr__(self) -> str:
        return f"<Series seen={len(self.seen)} limit={self.limit} omitted={self.omitted}>"

    def select(self, demand: dict[Requirement, Demand], now: float) -> list[Requirement]:
        """The requirements to report at ``now`` (the shell's clock, in seconds), given the
        ``demand`` of those with steps: theirs first, then the recently seen; at most
        ``limit``. What is left out, and what was seen longer ago than ``keep``, is forgotten:
        :attr:`seen` never holds more than ``limit``."""
        active = [r for r, d in demand.items() if d.steps]
        seen = self.seen
        for requirement in active:
            seen[requirement] = now
        horizon = now - self.keep
        recent = [
            (when, r)
            for r, when in seen.items()
            if when >= horizon and not demand.get(r, IDLE).steps
        ]
        recent.sort(key=lambda pair: pair[0], reverse=True)  # the most recently seen first
        if len(active) > self.limit:
            active.sort(key=lambda r: (-demand[r].steps, r.text()))
        chosen = (active + [r for _, r in recent])[: self.limit]
        self.omitted = max(0, len(active) - self.limit)
        self.seen = {r: seen[r] for r in chosen}
        return chosen
