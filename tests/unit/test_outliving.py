"""A step run for another orchestrator (``swamp.orchestrator.outliving``), in-process: the
origin's cancel stops it and it settles first; a broken link does not — it runs on, says it
runs while asked, and its answer (or its error) is kept for the origin; an origin cancels only
its own steps."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from swamp.errors import ChannelClosed, ClaimGone, FrameTooLarge
from swamp.orchestrator.outliving import NotStarted, Outliving


class Harness:
    def __init__(self) -> None:
        self.kept: list[tuple[str, str, dict]] = []
        self.keep_fails = 0
        self.outliving = Outliving(keep=self.keep)
        self.closed = False
        self.release = trio.Event()
        self.stopped = False
        self.kept_now = trio.Event()

    async def keep(self, origin: str, send_id: str, answer: dict) -> bool:
        if self.keep_fails:
            self.keep_fails -= 1
            raise ClaimGone("the database is away")
        self.kept.append((origin, send_id, answer))
        self.kept_now.set()
        return True

    async def step(self, emit) -> dict:
        await emit({"kind": "log", "line": "started"})
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.stopped = True
            raise
        await emit({"kind": "log", "line": "finished"})
        return {"how": "succeeded"}


@pytest.fixture
async def harness():
    h = Harness()
    async with trio.open_nursery() as nursery:
        await nursery.start(h.outliving.serve)
        yield h, nursery
        nursery.cancel_scope.cancel()


async def test_the_origins_cancel_stops_the_step_and_it_settles_first(harness):
    h, nursery = harness
    events: list[dict] = []

    async def emit(event: dict) -> None:
        events.append(event)

    with trio.move_on_after(1) as scope:
        await h.outliving.run("A", "s1", h.step, emit, lambda: h.closed)
    assert scope.cancelled_caught and h.stopped  # stopped before the call returned
    assert h.outliving.running == {} and h.kept == []
    assert events == [{"kind": "log", "line": "started"}]


async def test_a_broken_link_lets_the_step_run_on_and_keeps_its_answer(harness, autojump_clock):
    h, nursery = harness
    events: list[dict] = []

    async def emit(event: dict) -> None:
        if h.closed:
            raise ChannelClosed("the link went")
        events.append(event)

    with trio.CancelScope() as call:

        async def break_link() -> None:
            await trio.sleep(1)
            h.closed = True
            call.cancel()  # as the channel cancels its handlers when its socket goes

        nursery.start_soon(break_link)
        await h.outliving.run("A", "s1", h.step, emit, lambda: h.closed)
    assert call.cancelled_caught and not h.stopped
    assert h.outliving.outcome("A", "s1") == {"state": "running"}
    assert h.outliving.outcome("B", "s1") == {"state": "unknown"}  # only its origin's
    h.keep_fails = 2  # the database away twice: it keeps trying
    h.release.set()
    await h.kept_now.wait()
    await trio.testing.wait_all_tasks_blocked()  # (its run forgotten once kept)
    assert h.kept == [("A", "s1", {"reply": {"how": "succeeded"}})]
    assert h.outliving.outcome("A", "s1") == {"state": "unknown"}  # kept: not here now
    assert events == [{"kind": "log", "line": "started"}]  # nothing after the break


async def test_an_error_after_a_broken_link_is_kept_as_the_answer(harness):
    h, nursery = harness

    async def refused(emit) -> dict:
        await h.release.wait()
        raise ClaimGone("no worker here is free for it")

    with trio.CancelScope() as call:
        nursery.start_soon(lambda: _close_soon(h, call))
        await h.outliving.run("A", "s2", refused, None, lambda: h.closed)
    h.release.set()
    await h.kept_now.wait()
    [(origin, send_id, answer)] = h.kept
    assert (origin, send_id) == ("A", "s2")
    assert answer == {"error": {"code": "claim_gone", "message": "no worker here is free for it"}}


async def test_an_origin_cancels_only_its_own_step(harness):
    h, nursery = harness
    with trio.CancelScope() as call:
        nursery.start_soon(lambda: _close_soon(h, call))
        await h.outliving.run("A", "s3", h.step, None, lambda: h.closed)
    assert not h.outliving.cancel("B", "s3") and not h.stopped
    assert h.outliving.cancel("A", "s3")
    await trio.testing.wait_all_tasks_blocked()
    assert h.outliving.running == {}
    assert h.stopped and h.kept == []  # cancelled: nothing to keep


async def _close_soon(h: Harness, call: trio.CancelScope) -> None:
    await trio.sleep(0.01)
    h.closed = True
    call.cancel()


async def test_answers_given_just_before_the_link_went_are_kept_and_said_running_till_then(
    harness,
):
    """An answer sent as the link broke may never have arrived: when the link goes, the
    answers of the last moments are kept for the origin, which hears "running" until then."""
    h, nursery = harness

    async def quick(emit) -> dict:
        return {"how": "succeeded", "n": 1}

    assert await h.outliving.run("A", "s4", quick, None, lambda: False) == {
        "how": "succeeded",
        "n": 1,
    }
    await trio.testing.wait_all_tasks_blocked()
    assert h.kept == []  # given on the link: nothing kept while it stands
    h.outliving.link_lost("A")
    assert h.outliving.outcome("A", "s4") == {"state": "running"}  # (being kept)
    await h.kept_now.wait()
    await trio.testing.wait_all_tasks_blocked()
    assert h.kept == [("A", "s4", {"reply": {"how": "succeeded", "n": 1}})]
    assert h.outliving.outcome("A", "s4") == {"state": "unknown"}
    h.outliving.link_lost("A")  # once only
    await trio.testing.wait_all_tasks_blocked()
    assert len(h.kept) == 1


async def test_a_sending_id_runs_once_and_only_a_closed_link_cuts_the_relay(harness):
    h, nursery = harness

    async def run_twice() -> None:
        with pytest.raises(NotStarted):
            await h.outliving.run("A", "s5", h.step, None, lambda: False)

    with trio.move_on_after(0.5):
        async with trio.open_nursery() as inner:
            inner.start_soon(h.outliving.run, "A", "s5", h.step, None, lambda: False)
            await trio.testing.wait_all_tasks_blocked()
            await run_twice()  # the same origin and id: refused, the first untouched
            assert not h.stopped
            inner.cancel_scope.cancel()

    async def too_large(event: dict) -> None:
        raise FrameTooLarge("one event too large")

    with pytest.raises(FrameTooLarge):  # an event's own error is the step's, not a cut link
        await h.outliving.run("A", "s6", h.step, too_large, lambda: False)


async def test_an_answer_asked_after_before_this_end_saw_its_link_go_is_kept(harness):
    """The origin saw the link break first and asks over a new one: an answer given on the
    old link (which this end still thinks stands) is kept for it, "running" until then."""
    h, nursery = harness

    async def quick(emit) -> dict:
        return {"how": "succeeded"}

    await h.outliving.run("A", "s7", quick, None, lambda: False)
    await trio.testing.wait_all_tasks_blocked()
    assert h.outliving.outcome("A", "s7") == {"state": "running"}
    await h.kept_now.wait()
    await trio.testing.wait_all_tasks_blocked()
    assert h.kept == [("A", "s7", {"reply": {"how": "succeeded"}})]
    assert h.outliving.outcome("A", "s7") == {"state": "unknown"}
    h.outliving.link_lost("A")  # the old link's close, noticed now: kept once only
    await trio.testing.wait_all_tasks_blocked()
    assert len(h.kept) == 1


async def test_whoever_took_a_dead_origins_steps_is_answered_when_its_run_ends(
    harness, autojump_clock
):
    """``peer.step.wait``: the origin died (its link broke); the orchestrator that took its
    steps asks by step id and is answered once the run here ends — the same answer the origin
    would have had — and later asks are answered at once (whoever asks: a step's id is one
    step); an unknown step, or a step of a run cancelled by its origin, is "unknown"."""
    h, nursery = harness

    async def run() -> None:
        with trio.CancelScope() as call:
            nursery.start_soon(lambda: cut_after(call))
            await h.outliving.run("A", "send1", h.step, None, lambda: h.closed, step_id="step1")

    async def cut_after(call: trio.CancelScope) -> None:
        await trio.sleep(1)
        h.closed = True
        call.cancel()

    nursery.start_soon(run)
    await trio.testing.wait_all_tasks_blocked()
    assert await h.outliving.wait_step("nothing") == {"state": "unknown"}
    answered: list[dict] = []

    async def ask() -> None:
        answered.append(await h.outliving.wait_step("step1"))

    nursery.start_soon(ask)
    await trio.sleep(5)
    assert answered == []  # it runs: the asker waits
    h.release.set()
    await h.kept_now.wait()
    await trio.testing.wait_all_tasks_blocked()
    assert answered == [{"state": "ended", "answer": {"reply": {"how": "succeeded"}}}]
    assert await h.outliving.wait_step("step1") == answered[0]  # later: at once


async def test_a_step_its_origin_cancelled_is_unknown_to_a_taker(harness):
    h, nursery = harness
    with trio.move_on_after(1):
        await h.outliving.run("A", "send1", h.step, None, lambda: h.closed, step_id="step1")
    assert h.stopped
    assert await h.outliving.wait_step("step1") == {"state": "unknown"}
