"""Keyed deadlines served by one task: the earliest deadline wakes it; changes re-arm it.

Used for token expiry and grace windows. Nothing polls: the task sleeps until the next deadline
or until a deadline is added or cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable

import trio

log = logging.getLogger("swamp.timers")


class Deadlines:
    def __init__(self, name: str) -> None:
        self.name = name
        self._due: dict[Hashable, float] = {}
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return f"<Deadlines {self.name} pending={len(self._due)}>"

    def set(self, key: Hashable, when: float) -> None:
        """Arm (or re-arm) ``key`` at trio time ``when``."""
        self._due[key] = when
        self._changed.set()

    def cancel(self, key: Hashable) -> None:
        if self._due.pop(key, None) is not None:
            self._changed.set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._due

    async def run(
        self, on_due: Callable[[Hashable], Awaitable[None]], *, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            if self._changed.is_set():
                self._changed = trio.Event()
            if self._due:
                when = min(self._due.values())
                with trio.move_on_at(when):
                    await self._changed.wait()
            else:
                await self._changed.wait()
            now = trio.current_time()
            for key in [k for k, w in self._due.items() if w <= now]:
                del self._due[key]
                try:
                    await on_due(key)
                except Exception:  # one failed callback must not stop every other deadline
                    log.exception("%s: handling %r failed", self.name, key)
