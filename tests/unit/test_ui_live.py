"""Live pages: a change marks a topic; an open page is told at most twice a second, nothing
when nothing changed, and never more pages than the bound (virtual time)."""

from __future__ import annotations

import functools

import trio
import trio.testing

from swamp.ui.live import INTERVAL, SEND_TIMEOUT, Live
from swamp.ui.rendered import Rendered


class Page:
    """One open page's stream: what it was sent, and a way to close it."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.events: list[float] = []
        self.gone = trio.Event()

    async def receive(self):
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif b"event: changed" in message.get("body", b""):
            self.events.append(trio.current_time())


async def open_page(nursery, live: Live, topics=("fleet",), **session) -> Page:
    page = Page()
    nursery.start_soon(
        functools.partial(live.stream, frozenset(topics), page.receive, page.send, [], **session)
    )
    await trio.testing.wait_all_tasks_blocked()
    return page


async def test_a_change_is_pushed_and_a_burst_is_coalesced(autojump_clock):
    live = Live()
    async with trio.open_nursery() as nursery:
        page = await open_page(nursery, live)
        assert page.status == 200 and page.events == []
        for _ in range(1000):  # a busy fleet: a thousand slot changes at once
            live.changed("fleet")
        await trio.sleep(INTERVAL * 4)
        assert len(page.events) == 1, "one event for the whole burst"
        start = trio.current_time()
        for _ in range(20):  # a change every 50 ms for a second
            live.changed("fleet")
            await trio.sleep(0.05)
        await trio.sleep(INTERVAL * 2)
        during = [t for t in page.events if t >= start]
        assert 2 <= len(during) <= 3, during  # at most two a second
        assert all(b - a >= INTERVAL for a, b in zip(page.events, page.events[1:], strict=False))
        page.gone.set()
    assert live.viewers == 0


async def test_nothing_is_sent_for_another_topic_or_when_nothing_changed(autojump_clock):
    live = Live(lifetime=7200)
    async with trio.open_nursery() as nursery:
        page = await open_page(nursery, live, ("queue",))
        live.changed("fleet")
        await trio.sleep(3600)  # an idle hour: no event, no timer woke
        assert page.events == []
        live.changed("queue")
        await trio.sleep(1)
        assert len(page.events) == 1
        page.gone.set()


async def test_past_the_bound_a_page_gets_a_clear_503(autojump_clock):
    live = Live(max_viewers=2)
    async with trio.open_nursery() as nursery:
        pages = [await open_page(nursery, live) for _ in range(3)]
        assert [p.status for p in pages] == [200, 200, 503]
        assert live.viewers == 2 and live.refused == 1
        for p in pages:
            p.gone.set()
    assert live.viewers == 0


async def test_a_slow_viewer_is_dropped_without_holding_anyone_up(autojump_clock):
    live = Live()

    class Stuck(Page):
        async def send(self, message):
            if b"event: changed" in message.get("body", b""):
                await trio.sleep_forever()  # its socket takes nothing
            await super().send(message)

    async with trio.open_nursery() as nursery:
        stuck = Stuck()
        nursery.start_soon(live.stream, frozenset({"fleet"}), stuck.receive, stuck.send, [])
        fine = await open_page(nursery, live)
        live.changed("fleet")
        await trio.sleep(1)
        assert len(fine.events) == 1  # told at once, whatever the stuck one does
        await trio.sleep(SEND_TIMEOUT + 1)
        assert live.dropped == 1 and live.viewers == 1
        fine.gone.set()


async def test_one_session_cannot_take_every_place(autojump_clock):
    live = Live(max_viewers=64, max_per_holder=2)
    async with trio.open_nursery() as nursery:
        greedy = [await open_page(nursery, live, holder="a") for _ in range(3)]
        other = await open_page(nursery, live, holder="b")
        assert [p.status for p in greedy] == [200, 200, 503] and other.status == 200
        greedy[0].gone.set()
        await trio.testing.wait_all_tasks_blocked()
        assert (await open_page(nursery, live, holder="a")).status == 200  # its place is free
        nursery.cancel_scope.cancel()
    assert live.viewers == 0 and not live._holders


async def test_a_stream_ends_with_its_session(autojump_clock):
    """Logged out or revoked: the session's open pages stop being told anything at once
    (``sessions_ended`` wakes them to look), while other sessions' pages go on."""
    live = Live()
    open_sessions = {"a", "b"}
    async with trio.open_nursery() as nursery:
        ended = await open_page(nursery, live, holder="a", still_open=lambda: "a" in open_sessions)
        kept = await open_page(nursery, live, holder="b", still_open=lambda: "b" in open_sessions)
        assert live.viewers == 2
        open_sessions.discard("a")
        live.sessions_ended()
        await trio.testing.wait_all_tasks_blocked()
        assert live.viewers == 1 and ended.events == []
        live.changed("fleet")
        await trio.sleep(1)
        assert len(kept.events) == 1 and ended.events == []
        nursery.cancel_scope.cancel()


async def test_a_stream_lasts_its_lifetime_then_the_browser_opens_it_again(autojump_clock):
    live = Live(lifetime=600)
    async with trio.open_nursery() as nursery:
        await open_page(nursery, live)
        await trio.sleep(599)
        assert live.viewers == 1
        await trio.sleep(2)
        assert live.viewers == 0  # ended: EventSource reconnects, its cookie checked again
        nursery.cancel_scope.cancel()


# -- one rendering shared (swamp.ui.rendered) --------------------------------------------------


async def _ask_all(rendered, render, viewers: int = 10) -> None:
    async with trio.open_nursery() as nursery:
        for _ in range(viewers):
            nursery.start_soon(rendered.get, ("/ui/runs", (), None), ["runs"], render)


async def test_viewers_asking_during_a_render_take_it_even_if_something_changed(autojump_clock):
    """A busy orchestrator changes what a page shows during its render: the viewers who asked
    meanwhile take that render (the change has told their pages, which ask again) rather
    than each waiting for a render of their own, one after another."""
    live = Live()
    rendered = Rendered(live)

    async def render() -> str:
        await trio.sleep(0.1)  # e.g. the runs page's query on its reader thread
        live.changed("runs")
        return "<p>runs</p>"

    start = trio.current_time()
    await _ask_all(rendered, render)
    assert rendered.renders == 1 and rendered.shared == 9
    assert trio.current_time() - start < 0.2


async def test_a_render_slower_than_the_age_is_still_shared(autojump_clock):
    live = Live()
    rendered = Rendered(live, max_age=0.05)

    async def render() -> str:
        await trio.sleep(0.1)
        return "<p>runs</p>"

    await _ask_all(rendered, render)
    assert rendered.renders == 1


async def test_pages_past_their_age_are_dropped_and_the_text_kept_is_bounded(autojump_clock):
    """Pages a browser names with parameters of its choosing (or a run's page of megabytes)
    are never pinned: past their age they go, and the text kept is bounded in all."""
    live = Live()
    rendered = Rendered(live, max_bytes=1000)
    for i in range(10):
        await rendered.get(("/ui/runs/x", (("junk", str(i)),), None), ["runs"], _text(300))
    assert rendered.bytes <= 1000 and len(rendered._pages) == 3
    await rendered.get(("/ui/huge", (), None), ["runs"], _text(5000))  # served, not kept
    assert rendered.bytes <= 1000
    await trio.sleep(2)  # past the age
    await rendered.get(("/ui/", (), None), ["fleet"], _text(10))
    assert len(rendered._pages) == 1 and rendered.bytes == 10


def _text(size: int):
    async def render() -> str:
        return "x" * size

    return render
