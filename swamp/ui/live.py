"""Live pages: the events that change what a page shows, pushed as server-sent events.

What happens in the orchestrator — a member joins or leaves, a slot is taken or given back, a
step starts or stops waiting, a run's changes are saved, a batch of step output is stored —
only marks a *topic* out of date (:meth:`Live.changed`: a counter, and waking the streams if
any is parked; nothing is rendered on the dispatch path). Each open page holds one stream
(``GET /ui/events?topics=…``): when one of its topics changed it is sent one ``changed``
event and its script fetches the page's main part again; then the stream rests
:data:`INTERVAL` seconds, so a page is told at most twice a second however busy the fleet —
and an idle fleet sends nothing, with no timer running. Streams are bounded
(:data:`MAX_VIEWERS`: past it a clear 503), hold no buffer of their own (an event is one small
write) and a viewer that does not take a write within :data:`SEND_TIMEOUT` is dropped rather
than holding anyone up.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("swamp.ui")

TOPICS = frozenset({"fleet", "queue", "runs", "logs"})
MAX_VIEWERS = 64  # open pages at once, all sessions together
INTERVAL = 0.5  # seconds between two events to one page: at most 2 a second
SEND_TIMEOUT = 5.0  # a viewer that takes no write for this long is dropped


class Live:
    def __init__(self, *, max_viewers: int = MAX_VIEWERS, interval: float = INTERVAL) -> None:
        self.max_viewers = max_viewers
        self.interval = interval
        self.generations: Counter[str] = Counter()
        self.viewers = 0
        self.sent = 0
        self.dropped = 0  # slow viewers let go
        self.refused = 0  # past max_viewers
        self._changed = trio.Event()
        self._parked = False  # a stream waits on _changed

    def __repr__(self) -> str:
        return f"<Live viewers={self.viewers} sent={self.sent} dropped={self.dropped}>"

    # -- what the orchestrator tells (in the event: never waits) -------------------------------

    def changed(self, *topics: str) -> None:
        if not self.viewers:
            return  # nobody looks: a stream that opens later starts from what is then
        for topic in topics:
            self.generations[topic] += 1
        if self._parked:
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

    def _version(self, topics: frozenset[str]) -> int:
        return sum(self.generations[t] for t in topics)

    async def stream(self, topics: frozenset[str], receive, send, headers: list) -> None:
        """Serve one page's event stream until the browser goes away (or is too slow)."""
        if self.viewers >= self.max_viewers:
            self.refused += 1
            body = (
                f"too many pages open ({self.max_viewers}): close some, or reload this one later\n"
            ).encode()
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
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_gone, receive, nursery.cancel_scope)
                await self._serve(topics, send, headers)
                nursery.cancel_scope.cancel()
        finally:
            self.viewers -= 1

    async def _serve(self, topics: frozenset[str], send, headers: list) -> None:
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
        seen = self._version(topics)
        if not await self._write(send, b"retry: 2000\n\n"):
            return
        while True:
            while self._version(topics) == seen:
                self._parked = True
                await self._changed.wait()
            seen = self._version(topics)
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
