"""What a worker says while it waits: for a place in a full fleet, or for a drain to end.

In-process, on trio's virtual clock: the connect loop with a session that the orchestrator
refuses, and the drain with a session whose dispatches never end.
"""

import io
import json
import time
from types import SimpleNamespace

import trio

from swamp.domain.drain import EXIT_UNREACHABLE, Stage
from swamp.errors import FleetFull
from swamp.worker import agent
from swamp.worker.config import WorkerConfig
from swamp.worker.drain import Drain
from swamp.worker.events import Reporter
from swamp.worker.runs import Runs

FULL = (
    "fleet token 'pool': enrollment allowance exhausted (3 / 3); a place frees when one of "
    "its machines has been gone for the orchestrator's --worker-retention"
)


class _RefusedSession:
    """A session the orchestrator answers with ``fleet_full`` every time."""

    attempts = 0

    def __init__(self, *args, **kwargs) -> None:
        self.enrollment = None

    async def run(self) -> str:
        type(self).attempts += 1
        raise FleetFull(FULL)


def _events(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_a_machine_past_a_full_fleet_is_told_the_allowance_then_waits(
    monkeypatch, tmp_path, autojump_clock
):
    monkeypatch.setattr(agent, "Session", _RefusedSession)
    # the connect timeout measured on the virtual clock
    monkeypatch.setattr(agent, "time", SimpleNamespace(monotonic=trio.current_time, time=time.time))
    config = WorkerConfig(url="ws://127.0.0.1:1", token="pool.x", connect_timeout=20)
    out = io.StringIO()
    reporter = Reporter(json_lines=True, stream=out)
    drain = Drain(reporter)
    code = await agent._connect_loop(
        config, reporter, "m4", "i4", None, tmp_path, None, drain, Runs()
    )
    events = _events(out)
    kinds = [e["event"] for e in events]
    # each refusal: the orchestrator's words, then the wait; no "disconnected" or "retrying"
    assert kinds[:3] == ["connecting", "fleet_full", "waiting_for_place"]
    assert "disconnected" not in kinds and "retrying" not in kinds
    assert events[1]["reason"] == FULL
    assert _RefusedSession.attempts > 2  # it kept asking
    # the connect timeout still ends the wait, naming why: 4, a stop a restart may cure
    assert code == EXIT_UNREACHABLE and kinds[-1] == "stopped"
    assert "enrollment allowance exhausted (3 / 3)" in events[-1]["reason"]

    # and for people: the allowance before the wait
    text = io.StringIO()
    human = Reporter(json_lines=False, stream=text)
    human.emit("fleet_full", reason=FULL)
    human.emit("waiting_for_place", delaySeconds=1.5)
    first, second = text.getvalue().splitlines()
    assert first.startswith("not enrolled: fleet token 'pool': enrollment allowance exhausted")
    assert "(3 / 3)" in first
    assert second == "waiting for a place in the fleet: asking again in 1.5s"


class _BusySession:
    """Two dispatches that run until they are stopped."""

    def __init__(self) -> None:
        self.enrollment = object()
        self.active = 2
        self.idle = trio.Event()
        self.stopped_with: str | None = None

    async def announce_drain(self, reason) -> None:
        return None

    def stop_dispatches(self, why: str = "a second signal") -> int:
        self.stopped_with = why
        self.active = 0
        self.idle.set()
        return 2

    def leave(self, reason: str) -> None:
        return None


async def test_a_drain_timeout_names_itself_and_the_steps_it_stops(autojump_clock):
    out = io.StringIO()
    drain = Drain(Reporter(json_lines=True, stream=out))
    drain.attach(session := _BusySession())
    await drain.signal("SIGTERM")  # the drain begins; its two dispatches go on running
    assert not drain.done.is_set()
    await drain.timed_out(300)
    assert drain.done.is_set() and drain.exit_code == 3
    forcing, stopped = _events(out)[-2:]
    assert forcing["event"] == "forcing" and forcing["timeoutSeconds"] == 300
    assert (
        forcing["reason"] == "drain timeout (300s) reached with 2 dispatches running: stopping them"
    )
    assert stopped["reason"] == "drain timeout (300s) reached: 2 dispatch(es) stopped"
    assert session.stopped_with == "the drain timeout (300s) stopped it"  # each step's error
    # for people: the same words
    text = io.StringIO()
    Reporter(json_lines=False, stream=text).emit(
        "forcing", **{k: v for k, v in forcing.items() if k not in ("event", "time")}
    )
    assert text.getvalue().strip() == forcing["reason"]
    # a drain already forced by a second signal is not forced again
    again = Drain(Reporter(json_lines=True, stream=io.StringIO()))
    again.attach(_BusySession())
    again.stage = Stage.FORCING
    await again.timed_out(300)
    assert not again.done.is_set() and again.session.stopped_with is None
