"""Each page rendered once for all who watch it.

Every open page fetches its main part when its topics change (at most twice a second), so at
10,000 workers sixty-four viewers of the fleet page once cost sixty-four renders of it per
event. Here a page's main part is kept with the counters of its topics (:meth:`Live.version`)
as they were when it was rendered: the next viewer who asks for the same page (the same path
and parameters, and — for pages with action buttons — the same session) gets it as it is
while nothing it shows has changed and it is younger than :data:`MAX_AGE` (so ages and "last
seen" stay right); otherwise it is rendered again, once, while the others asking meanwhile
wait for that render. At most :data:`MAX_PAGES` are kept, the least recently asked for going
first (the parameters are the browser's to choose).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable

import trio

from swamp.ui.live import Live

MAX_AGE = 1.0  # seconds a rendered page is shown without rendering it again
MAX_PAGES = 64  # rendered pages kept


class Rendered:
    def __init__(
        self,
        live: Live,
        *,
        max_age: float = MAX_AGE,
        max_pages: int = MAX_PAGES,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.live = live
        self.max_age = max_age
        self.max_pages = max_pages
        self.clock = clock
        self.renders = 0
        self.shared = 0  # answers given from a page already rendered
        self._pages: OrderedDict[Hashable, tuple[int, float, str]] = OrderedDict()
        self._rendering: dict[Hashable, trio.Event] = {}

    def __repr__(self) -> str:
        return f"<Rendered pages={len(self._pages)} renders={self.renders} shared={self.shared}>"

    async def get(
        self, key: Hashable, topics: Iterable[str], render: Callable[[], Awaitable[str]]
    ) -> str:
        """The page ``key`` (whose content follows ``topics``): as rendered, if still true."""
        topics = tuple(topics)
        while True:
            kept = self._pages.get(key)
            if kept is not None:
                version, at, html = kept
                if version == self.live.version(topics) and self.clock() - at < self.max_age:
                    self._pages.move_to_end(key)
                    self.shared += 1
                    return html
            pending = self._rendering.get(key)
            if pending is None:
                break
            await pending.wait()  # someone renders it now: take theirs (or render, if it failed)
        done = self._rendering[key] = trio.Event()
        try:
            version, at = self.live.version(topics), self.clock()  # before: a change meanwhile
            html = await render()  # makes the next ask render again
            self.renders += 1
            self._pages[key] = (version, at, html)
            self._pages.move_to_end(key)
            while len(self._pages) > self.max_pages:
                self._pages.popitem(last=False)
            return html
        finally:
            del self._rendering[key]
            done.set()
