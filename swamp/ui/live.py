"""Live pages: the events that change what a page shows, pushed as server-sent events.

What happens in the orchestrator — a member joins or leaves, a slot is taken or given back, a
step starts or stops waiting, a run's changes are saved, a batch of step output is stored —
only marks a *topic* out of date (:meth:`Live.changed`: a counter, and waking the streams if
any is parked; nothing is rendered on the dispatch path). Each open page holds one stream
(``GET /ui/events?topics=…``): when one of its topics changed it is sent one ``changed``
event and its script fetches the page's main part again; then the stream rests
:data:`INTERVAL` seconds, so a page is told at most twice a second however busy the fleet —
and an idle fleet sends nothing, with no timer running. Streams are bounded
(:data:`MAX_VIEWERS` in all and :data:`MAX_PER_CREDENTIAL` for the sessions of one
credential — one token opens many sessions — past either a clear 503), hold no buffer of
their own (an event is one small write), and a viewer that does not take a write within
:data:`SEND_TIMEOUT` is dropped rather than holding anyone up.

A stream belongs to the session that opened it: it ends when that session does (logged out,
its token revoked — :meth:`Live.sessions_ended` wakes every stream to look), and after
:data:`MAX_LIFETIME` in any case (the browser opens it again, with its cookie checked anew).
The topics' counters also tell the pages' render cache (:mod:`swamp.ui.rendered`) whether a
page it holds is still what the page would show.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

import trio

log = logging.getLogger("swamp.ui")

TOPICS = frozenset({"fleet", "queue", "runs", "logs"})
MAX_VIEWERS = 64  # open pages at once, all sessions together
MAX_PER_CREDENTIAL = 16  # open pages of one credential's sessions: none takes every place
MAX_LIFETIME = 600.0  # seconds a stream lasts; the browser reconnects (and is checked again)
INTERVAL = 0.5  # seconds between two events to one page: at most 2 a second
SEND_TIMEOUT = 5.0  # a viewer that takes no write for this long is dropped


class Live:
    def __init__(
        self,
        *,
        max_viewers: int = MAX_VIEWERS,
        max_per_holder: int = MAX_PER_CREDENTIAL,
        interval: float = INTERVAL,
        lifetime: float = MAX_LIFETIME,
    ) -> None:
        self.max_viewers = max_viewers
        self.max_per_holder = max_per_holder
        self.interval = interval
        self.lifetime = lifetime
        self.generations: Counter[str] = Counter()
        self.viewers = 0
        self._holders: Counter[object] = Counter()  # open streams by credential
        self.sent = 0
        self.dropped = 0  # slow viewers let go
        self.refused = 0  # past max_viewers
        self._changed = trio.Event()
        self._parked = False  # a stream waits on _changed

    def __repr__(self) -> str:
        return f"<Live viewers={self.viewers} sent={self.sent} dropped={self.dropped}>"

    # -- what the orchestrator tells (in the event: never waits) -------------------------------

    def changed(self, *topics: str) -> None:
        for topic in topics:  # counted even unwatched: the render cache reads the counters
            self.generations[topic] += 1
        if self._parked:
            self._wake()

    def sessions_ended(self) -> None:
        """Sessions ended (``Logins``' hook): every stream looks whether its own still holds."""
        if self._parked:
            self._wake()

    def _wake(self) -> None:
        self._parked = False
        event, self._changed = self._changed, trio.Event()
        event.set()

    def member_changed(self, member: object) -> None:
        """The pool's watcher: a member, or one of its slots (the queue's free slots too)."""
        self.changed("fleet", "queue")

    def queue_event(self, what: str, value: float) -> None:
        """The queue's observer: a step started or stopped waiting."""
        self.changed("queue")

    def run_saved(self, run_id: str) -> None:
        self.changed("runs")

    async def watch_logs(
        self, written: Callable[[], Awaitable[None]], *, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        """Mark ``logs`` each time a batch of step output is stored (``StepLogs.written``)."""
        task_status.started()
        while True:
            await written()
            self.changed("logs")

    # -- one open page ---------------------------------------------------------------------

    def version(self, topics: Iterable[str]) -> int:
        return sum(self.generations[t] for t in topics)

    async def stream(
        self,
        topics: frozenset[str],
        receive,
        send,
        headers: list,
        *,
        holder: object = None,
        still_open: Callable[[], bool] = lambda: True,
    ) -> None:
        """Serve one page's event stream until the browser goes away (or is too slow), its
        session ends (``still_open`` says no) or :data:`MAX_LIFETIME` passes. ``holder`` is the
        credential the session acts for: at most :data:`MAX_PER_CREDENTIAL` streams each."""
        refusal = None
        if self.viewers >= self.max_viewers:
            refusal = (
                f"too many pages open ({self.max_viewers}): close some, or reload this one later"
            )
        elif self._holders[holder] >= self.max_per_holder:
            refusal = (
                f"{self.max_per_holder} pages are open already with this credential: close "
                "some, or reload this one later"
            )
        if refusal is not None:
            self.refused += 1
            body = (refusal + "\n").encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        *headers,
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", b"30"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        self.viewers += 1
        self._holders[holder] += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_gone, receive, nursery.cancel_scope)
                with trio.move_on_after(self.lifetime):
                    await self._serve(topics, send, headers, still_open)
                nursery.cancel_scope.cancel()
        finally:
            self.viewers -= 1
            self._holders[holder] -= 1
            if not self._holders[holder]:
                del self._holders[holder]

    async def _serve(
        self, topics: frozenset[str], send, headers: list, still_open: Callable[[], bool]
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    *headers,
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        seen = self.version(topics)
        if not await self._write(send, b"retry: 2000\n\n"):
            return
        while True:
            while self.version(topics) == seen and still_open():
                self._parked = True
                await self._changed.wait()
            if not still_open():
                return  # the session ended: the browser's reconnect meets the login page
            seen = self.version(topics)
            if not await self._write(send, b"event: changed\ndata: \n\n"):
                return
            self.sent += 1
            await trio.sleep(self.interval)  # what changes meanwhile goes in the next one

    async def _write(self, send, data: bytes) -> bool:
        with trio.move_on_after(SEND_TIMEOUT) as scope:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        if scope.cancelled_caught:
            self.dropped += 1
            log.info("dropped a page's event stream: it took no event for %gs", SEND_TIMEOUT)
            return False
        return True


async def _until_gone(receive, scope: trio.CancelScope) -> None:
    """The browser closed the page (or the connection): end its stream."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
