"""The worker's drain, as the session and the signal handler share it.

:class:`Drain` holds the stage (``swamp.domain.drain``), the reason, and how many dispatches the
worker has taken in its life (``--max-dispatches`` counts across reconnects). The session asks
it whether to accept a dispatch, tells it when one starts and ends, and is told to announce the
drain, to stop its running dispatches, or to leave.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from swamp.domain.drain import (
    EXIT_FORCED,
    EXIT_OK,
    Action,
    Stage,
    on_drain_timeout,
    on_signal,
    on_trigger,
    timeout_reached,
)
from swamp.worker.events import Reporter


class Draining(Protocol):
    """What the drain asks of the session of the moment (``swamp.worker.session.Session``):
    the drain outlives each connection, so it knows the session only by this."""

    enrollment: Any  # None until enrolled

    @property
    def active(self) -> int: ...  # dispatches running

    @property
    def idle(self) -> trio.Event: ...  # set while none runs

    async def announce_drain(self, reason: str | None) -> None: ...

    def stop_dispatches(self, why: str = ...) -> int: ...

    def leave(self, reason: str) -> None: ...


FORCE_GRACE = 3.0  # after a second signal: how long the stopped dispatches get to report


class Drain:
    def __init__(self, reporter: Reporter, *, max_dispatches: int | None = None) -> None:
        self.reporter = reporter
        self.max_dispatches = max_dispatches
        self.stage = Stage.RUNNING
        self.reason: str | None = None
        self.started = 0  # dispatches accepted, over the worker's life
        self.session: Draining | None = None  # the connection of the moment (attach)
        self.exit_code = EXIT_OK
        self.done = trio.Event()  # the worker should exit now, with ``exit_code``
        self.began = trio.Event()  # the drain has started

    def __repr__(self) -> str:
        return f"<Drain {self.stage.value} reason={self.reason} started={self.started}>"

    def attach(self, session: Draining) -> None:
        """A new connection's session: the one the drain announces itself to and stops."""
        self.session = session

    @property
    def draining(self) -> bool:
        return self.stage is not Stage.RUNNING

    async def trigger(self, reason: str) -> None:
        """``max-dispatches``, ``idle-timeout`` or ``asked`` (the orchestrator, for
        ``swamp worker drain`` or the web pages): drain, once."""
        self.stage, action = on_trigger(self.stage)
        if action is Action.DRAIN:
            await self._start(reason)

    async def signal(self, name: str) -> None:
        self.stage, action = on_signal(self.stage)
        if action is Action.DRAIN:
            await self._start("signal", detail=name)
        elif action is Action.FORCE:
            await self._force(name)
        elif action is Action.EXIT_NOW:
            self.reporter.emit(
                "stopped", reason=f"received {name} a third time", exitCode=EXIT_FORCED
            )
            self.exit_code = EXIT_FORCED
            self.done.set()

    async def timed_out(self, seconds: float) -> None:
        """``--drain-timeout`` (``seconds``) passed with the drain not done: stop what runs."""
        self.stage, action = on_drain_timeout(self.stage)
        if action is Action.FORCE:
            await self._force(after=seconds)

    async def _start(self, reason: str, *, detail: str | None = None) -> None:
        self.reason = reason
        self.began.set()
        running = self.session.active if self.session is not None else 0
        self.reporter.emit(
            "draining", reason=reason, running=running, **({"signal": detail} if detail else {})
        )
        session = self.session
        if session is None or session.enrollment is None:
            self.finish()  # not connected: nothing runs here, nothing to announce
            return
        await session.announce_drain(reason)
        self.check()

    def check(self) -> None:
        """Called as dispatches end: a drain with no dispatch left is complete."""
        session = self.session
        if self.stage is Stage.DRAINING and (session is None or session.active == 0):
            self.finish()

    def finish(self) -> None:
        if self.done.is_set():
            return
        self.reporter.emit("drain_complete", reason=self.reason)
        self.reporter.emit("stopped", reason=f"drained ({self.reason})", exitCode=EXIT_OK)
        self.exit_code = EXIT_OK
        if self.session is not None:
            self.session.leave(f"drained ({self.reason})")
        self.done.set()

    async def _force(self, name: str | None = None, *, after: float | None = None) -> None:
        """Second signal (``name``) or the drain timeout, reached ``after`` seconds: stop the
        running dispatches, let them report, exit non-zero."""
        session = self.session
        stopped = 0
        if session is not None and after is not None:
            stopped = session.stop_dispatches(f"the drain timeout ({after:g}s) stopped it")
        elif session is not None:
            stopped = session.stop_dispatches()
        if after is not None:
            said = timeout_reached(after, stopped)
            self.reporter.emit("forcing", reason=said, timeoutSeconds=after, stopping=stopped)
            why = f"drain timeout ({after:g}s) reached: {stopped} dispatch(es) stopped"
        else:
            self.reporter.emit("forcing", signal=name, stopping=stopped)
            why = f"received {name} during the drain: {stopped} dispatch(es) stopped"
        if session is not None:
            with trio.move_on_after(FORCE_GRACE):
                await session.idle.wait()
        self.reporter.emit("stopped", reason=why, exitCode=EXIT_FORCED)
        self.exit_code = EXIT_FORCED
        if session is not None:
            session.leave("worker stopped")
        self.done.set()

    # -- what the session reports ------------------------------------------------------------

    def accepted(self) -> bool:
        """A dispatch was accepted; ``True`` if it is the last one ``--max-dispatches`` allows
        (the caller then starts the drain, so the orchestrator sends no more)."""
        self.started += 1
        return self.max_dispatches is not None and self.started >= self.max_dispatches
