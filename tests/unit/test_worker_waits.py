"""What a worker says while it waits: for a place in a full fleet, or for a drain to end.

In-process, on trio's virtual clock: the connect loop with a session that the orchestrator
refuses, and the drain with a session whose dispatches never end.
"""

import io
import json
import time
from types import SimpleNamespace

import trio

from swamp.errors import FleetFull
from swamp.worker import agent
from swamp.worker.config import WorkerConfig
from swamp.worker.drain import Drain
from swamp.worker.events import Reporter

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
    code = await agent._connect_loop(config, reporter, "m4", "i4", None, tmp_path, None, drain)
    events = _events(out)
    kinds = [e["event"] for e in events]
    # each refusal: the orchestrator's words, then the wait; no "disconnected" or "retrying"
    assert kinds[:3] == ["connecting", "fleet_full", "waiting_for_place"]
    assert "disconnected" not in kinds and "retrying" not in kinds
    assert events[1]["reason"] == FULL
    assert _RefusedSession.attempts > 2  # it kept asking
    # the connect timeout still ends the wait, naming why
    assert code == 1 and kinds[-1] == "stopped"
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
