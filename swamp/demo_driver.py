"""What ``swamp demo`` drives the fleet with: one admin channel, steps followed as they go,
worker processes whose JSON lines are kept.

Everything here waits on events — a streamed run event, a worker's line, a listing that must
change — each wait bounded by :data:`WAIT`, which is far above what a loaded machine needs: it
only turns a hang into one line and exit 1.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from swamp.errors import CallTimeout, SwampError
from swamp.processes import EventLog, start_worker
from swamp.protocol.messages import Dispatched, LogLine, Queued, decode_event
from swamp.protocol.rpc import RpcChannel

WAIT = 60.0  # seconds: the bound on any one wait of the demo


@dataclass
class Demo:
    """What the sections share: where things are, how to talk to the orchestrator, what was
    seen (``report``, printed by ``--json``)."""

    root: Path
    say: Callable[..., None]
    report: dict
    env: dict
    processes: list[trio.Process]
    url: str = ""
    channel: RpcChannel | None = None
    number: int = 0  # the section being shown
    names: dict[int, str] = field(default_factory=dict)  # a worker's pid → its name
    release: Callable[[], None] = lambda: None  # lets a held step end (section 7)

    def section(self, title: str) -> None:
        self.number += 1
        self.say(f"\n{self.number}. {title}")

    def proves(self, *lines: str) -> None:
        for i, line in enumerate(lines):
            self.say(f"   {'✓' if i == 0 else ' '} {line}")

    def check(self, ok: bool, message: str) -> None:
        """A claim of the section; false stops the demo (exit 1)."""
        if not ok:
            raise SwampError(f"not as designed: {message}")

    async def call(
        self,
        method: str,
        params: dict | None = None,
        *,
        timeout=WAIT,  # noqa: ASYNC109 - passed on to RpcChannel.call (the call's own deadline)
        on_event=None,
    ) -> Any:
        assert self.channel is not None
        return await self.channel.call(method, params or {}, timeout=timeout, on_event=on_event)

    async def until(
        self,
        fetch: Callable[[], Awaitable[Any]],
        pick: Callable[[Any], Any],
        *,
        what: str,
    ) -> Any:
        """Ask again until ``pick`` finds something in the answer. For what the orchestrator
        writes behind (a record) or learns from a socket (a status): there is no event for a
        client to wait on."""
        with trio.move_on_after(WAIT):
            # no event crosses the socket for this: ask again
            while (found := pick(await fetch())) is None:  # noqa: ASYNC110
                await trio.sleep(0.05)
            return found
        raise CallTimeout(f"waited {WAIT:g}s for {what}")


class Step:
    """One ``model.method.run`` of ``command/shell`` through the orchestrator, followed as it
    goes: queued, dispatched, its output, its result. :meth:`run` returns when it has ended;
    run it in a nursery to watch it meanwhile with :meth:`reached`."""

    def __init__(self, demo: Demo, placement: dict, command: str) -> None:
        self.demo = demo
        self.placement = placement
        self.command = command
        self.queued: Queued | None = None
        self.dispatched: Dispatched | None = None
        self.lines: list[str] = []
        self.result: dict | None = None
        self.error: SwampError | None = None
        self.ended = False
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return f"<Step {self.placement} {self.outcome}>"

    async def run(self) -> None:
        try:
            self.result = await self.demo.call(
                "model.method.run",
                {
                    "model": "command/shell",
                    "method": "run",
                    "args": {"command": self.command},
                    "placement": self.placement,
                },
                timeout=None,  # held by the demo's own bounded waits
                on_event=self._event,
            )
        except SwampError as exc:
            self.error = exc
        finally:
            self.ended = True
            self._wake()
        self.demo.report["runs"].append(self.summary())

    async def _event(self, payload: dict) -> None:
        event = decode_event(payload)
        if isinstance(event, Queued):
            self.queued = event
        elif isinstance(event, Dispatched):
            self.dispatched = event
        elif isinstance(event, LogLine):
            self.lines.append(event.line)
            self.demo.say(f"     [{event.worker}] {event.line}")
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def reached(self, stage: str) -> Any:
        """``queued``, ``dispatched`` or ``result``, once the step has got there."""
        with trio.move_on_after(WAIT):
            while getattr(self, stage) is None and not self.ended:
                await self._changed.wait()
            if getattr(self, stage) is None:
                raise SwampError(f"the step ended before it was {stage}: {self.outcome}")
            return getattr(self, stage)
        raise CallTimeout(f"waited {WAIT:g}s for a step to be {stage}")

    @property
    def succeeded(self) -> bool:
        return self.result is not None and self.result.get("status") == "succeeded"

    @property
    def worker(self) -> str | None:
        return self.result.get("worker") if self.result else None

    @property
    def outcome(self) -> str:
        if self.error is not None:
            return f"failed: {self.error.message}"
        if self.result is None:
            return "still running"
        if self.succeeded:
            return f"succeeded in {self.result.get('durationMs')} ms"
        return f"{self.result.get('status')}: {self.result.get('error')}"

    def summary(self) -> dict:
        return {
            "placement": self.placement,
            "queued": self.queued.requirement if self.queued else None,
            "worker": self.worker,
            "dispatchId": self.result.get("dispatchId") if self.result else None,
            "status": self.result.get("status") if self.result else "error",
            "error": self.error.message if self.error else None,
            "output": self.lines,
        }


@dataclass
class Member:
    """A ``swamp worker connect --json`` process of the fleet, and its lines so far."""

    process: trio.Process
    log: EventLog
    slots: int
    enrolled: dict = field(default_factory=dict)  # its ``enrolled`` line

    @property
    def name(self) -> str:
        return self.enrolled.get("workerName", "?")

    async def line(self, event: str, *, start: int = 0, **fields) -> dict:
        """Its first ``event`` line (from index ``start``) with these fields."""
        with trio.move_on_after(WAIT):
            try:
                return await self.log.wait_for(
                    lambda e: (
                        e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
                    ),
                    start=start,
                )
            except RuntimeError:
                raise SwampError(
                    f"worker {self.name} exited (status {self.process.poll()}) before its "
                    f"{event!r} line"
                ) from None
        raise CallTimeout(f"waited {WAIT:g}s for worker {self.name}'s {event!r} line")

    async def exited(self) -> int:
        with trio.move_on_after(WAIT):
            return await self.process.wait()
        raise CallTimeout(f"waited {WAIT:g}s for worker {self.name} to exit")


async def start_members(
    demo: Demo, nursery: trio.Nursery, credential: str, slots: list[int]
) -> list[Member]:
    """Start one worker process per entry of ``slots`` (all at once), each with its cache dir
    in the demo's directory; return them once each has enrolled."""
    members = []
    for count in slots:
        index = len(demo.processes) - 1  # the server is the first process
        process, reader = await start_worker(
            demo.url,
            credential,
            "--label",
            f"slot={index}",
            "--concurrency",
            str(count),
            "--cache-dir",
            str(demo.root / f"worker-{index}"),
            env=demo.env,
        )
        demo.processes.append(process)
        member = Member(process, EventLog(reader), count)
        nursery.start_soon(member.log.follow)
        members.append(member)
    for member in members:
        member.enrolled = await member.line("enrolled")
        demo.names[member.process.pid] = member.name
    return members


def gap_ms(earlier: str, later: str) -> int:
    """Milliseconds between two of a worker's event times (``…T12:00:00.123Z``)."""

    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return round((parse(later) - parse(earlier)).total_seconds() * 1000)
