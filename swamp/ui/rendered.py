"""Each page rendered once for all who watch it.

Every open page fetches its main part when its topics change (at most twice a second), so at
10,000 workers sixty-four viewers of the fleet page once cost sixty-four renders of it per
event. Here a page's main part is kept with the counters of its topics (:meth:`Live.version`)
as they were when it was rendered: the next viewer who asks for the same page (the same path
and parameters, and — for pages with action buttons — the same session) gets it as it is
while nothing it shows has changed and it is younger than :data:`MAX_AGE` (so ages and "last
seen" stay right); otherwise it is rendered again, once, and whoever asks meanwhile takes
that render when it is done (even if something changed during it: that change has told the
pages already, and they ask again) — viewers never queue behind one another's renders.
A page past its age is dropped, whoever asks; at most :data:`MAX_PAGES` are kept and
:data:`MAX_BYTES` in all, the least recently asked for going first (the parameters are the
browser's to choose, and a run's page can be megabytes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable

import trio

from swamp.ui.live import Live

MAX_AGE = 1.0  # seconds a rendered page is shown without rendering it again
MAX_PAGES = 64  # rendered pages kept
MAX_BYTES = 16 * 1024 * 1024  # their text, in all


class _Render:
    """One render in flight: those who ask meanwhile wait for it and take its page."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.html: str | None = None  # None: it failed (each waiter renders for itself)


class Rendered:
    def __init__(
        self,
        live: Live,
        *,
        max_age: float = MAX_AGE,
        max_pages: int = MAX_PAGES,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.live = live
        self.max_age = max_age
        self.max_pages = max_pages
        self.max_bytes = max_bytes
        self.clock = clock
        self.renders = 0
        self.shared = 0  # answers given from a page rendered for someone else
        self.bytes = 0  # the text of the pages kept
        self._pages: OrderedDict[Hashable, tuple[int, float, str]] = OrderedDict()
        self._rendering: dict[Hashable, _Render] = {}

    def __repr__(self) -> str:
        return (
            f"<Rendered pages={len(self._pages)} bytes={self.bytes} renders={self.renders} "
            f"shared={self.shared}>"
        )

    async def get(
        self, key: Hashable, topics: Iterable[str], render: Callable[[], Awaitable[str]]
    ) -> str:
        """The page ``key`` (whose content follows ``topics``): as rendered, if still true."""
        topics = tuple(topics)
        self._drop_old()
        kept = self._pages.get(key)
        if kept is not None and kept[0] == self.live.version(topics):
            self._pages.move_to_end(key)
            self.shared += 1
            return kept[2]
        pending = self._rendering.get(key)
        if pending is not None:  # someone renders it now: take theirs
            await pending.done.wait()
            if pending.html is not None:
                self.shared += 1
                return pending.html
        this = self._rendering[key] = _Render()
        try:
            version, at = self.live.version(topics), self.clock()  # before: a change meanwhile
            html = await render()  # makes the next ask render again
            self.renders += 1
            this.html = html
            self._keep(key, (version, at, html))
            return html
        finally:
            if self._rendering.get(key) is this:
                del self._rendering[key]
            this.done.set()

    def _keep(self, key: Hashable, page: tuple[int, float, str]) -> None:
        self._forget(key)
        if len(page[2]) > self.max_bytes:
            return  # larger than the whole cache: served, not kept
        self._pages[key] = page
        self.bytes += len(page[2])
        while len(self._pages) > self.max_pages or self.bytes > self.max_bytes:
            self._forget(next(iter(self._pages)))

    def _forget(self, key: Hashable) -> None:
        old = self._pages.pop(key, None)
        if old is not None:
            self.bytes -= len(old[2])

    def _drop_old(self) -> None:
        """Pages past their age are never shown again: they go (a look at each of at most
        :data:`MAX_PAGES`)."""
        now = self.clock()
        for key in [k for k, (_, at, _) in self._pages.items() if now - at >= self.max_age]:
            self._forget(key)
