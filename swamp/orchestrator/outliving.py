"""A step run for another orchestrator outlives a broken relay (the claimer's side).

A claimed step runs on this orchestrator's worker while its events and its answer go back
to its origin over the peer link (``peer.dispatch``). When that link breaks — not when the
origin cancels the call — the step runs on to its end instead of being stopped, and its answer
is kept in the database for the origin (``PgPeers.write_outcome``, which wakes it). Meanwhile
the origin may ask over a new link whether it still runs here (``peer.outcome``), and cancel
it (``peer.cancel``: its caller left). So a broken relay loses nothing, and the origin runs the
step again only if this orchestrator died (its liveness lock says so) or never ran it, by the
lease rules: never two copies at once.

An answer sent just before the link broke may never have arrived: the answers of the last
:data:`RECENT` seconds (the last :data:`RECENT_MAX` of them) are kept too when a link goes,
or when the origin asks after one (the origin takes those it waits for; the others are
collected later), and the origin is told "running" until they are. Past those bounds the
origin hears "unknown" and fails the step with that reason: never run twice on a doubt.

When the origin died instead, the orchestrator that takes its steps over asks by step id
(``peer.step.wait``, :meth:`Outliving.wait_step`): it is answered when the run here ends, with
the same answer — or at once with one given or kept in the last :data:`RECENT` seconds — and
"unknown" when no run of that step is known here.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from swamp.errors import ChannelClosed, SwampError

log = logging.getLogger("swamp.peers")

KEEP_RETRY = 1.0  # seconds between attempts to keep an outcome while the database is away
RECENT = 60.0  # seconds an answer given may still be in flight when its link goes (a link
# is given up on after its peer's silence: three heartbeats and more)
RECENT_MAX = 1024  # answers remembered so, per origin

Run = Callable[[Callable[[dict], Awaitable[None]]], Awaitable[dict]]  # emit → its answer
Keep = Callable[[str, str, dict], Awaitable[bool]]  # origin, sending's id, answer → kept


class NotStarted(Exception):
    """The run did not start (this orchestrator is stopping, or the sending id is taken):
    its slot is the caller's to give back."""


class _Relay:
    """The events of a run, to its origin while the link stands; none once it broke."""

    def __init__(self, emit: Callable[[dict], Awaitable[None]] | None) -> None:
        self._emit = emit
        self.cut = False

    async def emit(self, event: dict) -> None:
        if self.cut or self._emit is None:
            return
        try:
            await self._emit(event)
        except ChannelClosed:  # the link is going: what follows goes nowhere
            self.cut = True


@dataclass
class _Running:
    scope: trio.CancelScope
    step_id: str = ""  # the step it runs (its origin's id for it; "" if not told)
    done: trio.Event = field(default_factory=trio.Event)
    reply: dict | None = None
    error: Exception | None = None
    cancelled: bool = False  # by its origin: nothing to keep


class Outliving:
    """The claimed steps running here (until their answer is given or kept)."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.running: dict[tuple[str, str], _Running] = {}  # by origin and sending's id
        self._recent: dict[str, deque[tuple[str, dict, float]]] = {}  # answers given
        # answers given or kept, by origin and step: for whoever takes a dead origin's steps
        self._ended: dict[str, deque[tuple[str, dict, float]]] = {}
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        return f"<Outliving running={len(self.running)}>"

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Where the runs live: beside the peer links, not inside their calls."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def run(
        self,
        origin: str,
        send_id: str,
        run: Run,
        emit: Callable[[dict], Awaitable[None]] | None,
        link_closed: Callable[[], bool],
        *,
        step_id: str = "",
    ) -> dict:
        """Run ``run`` for ``origin``; its answer. Cancelled by the origin, the run is
        cancelled and settles first, as if awaited here; cancelled because the link closed,
        it runs on and its answer is kept for the origin. :class:`NotStarted` if it could
        not start."""
        key = (origin, send_id)
        if key in self.running:
            raise NotStarted("a step with that sending id runs here already")
        relay = _Relay(emit)
        running = _Running(trio.CancelScope(), step_id)

        async def body() -> None:
            try:
                with running.scope:
                    try:
                        running.reply = await run(relay.emit)
                    except Exception as exc:  # (its caller's to raise, or the origin's to read)
                        running.error = exc
            finally:
                running.done.set()
            try:
                answer = _answer(running)
                if answer is None or running.cancelled:
                    return
                if step_id:
                    self._prune()
                    ended = self._ended.setdefault(origin, deque(maxlen=RECENT_MAX))
                    ended.append((step_id, answer, trio.current_time()))
                if relay.cut or link_closed():  # nobody waits on the link: the database
                    await self._keep(origin, send_id, answer)
                else:  # given on the link: remembered a while, should the link go now
                    recent = self._recent.setdefault(origin, deque(maxlen=RECENT_MAX))
                    recent.append((send_id, answer, trio.current_time()))
            finally:
                self.running.pop(key, None)  # (only now: "running" until it is kept)

        if self._nursery is None:
            raise NotStarted("claimed steps are not run here yet")
        try:
            self._nursery.start_soon(body)
        except RuntimeError:  # the nursery is closing: this orchestrator stops
            raise NotStarted("this orchestrator is stopping") from None
        self.running[key] = running
        try:
            await running.done.wait()
        except trio.Cancelled:
            if link_closed():
                relay.cut = True
                log.info(
                    "the link to orchestrator %s broke while step %s ran for it: it runs on, "
                    "and its outcome is kept for it",
                    origin[:12],
                    send_id[:12],
                )
            else:
                running.cancelled = True  # the origin's cancel: the step stops, and settles
                running.scope.cancel()
                with trio.CancelScope(shield=True):
                    await running.done.wait()
            raise
        if running.error is not None:
            raise running.error
        assert running.reply is not None
        return running.reply

    async def answer_later(
        self, origin: str, key: str, step_id: str, run: Callable[[], Awaitable[dict | None]]
    ) -> None:
        """A run carried here from ``origin``, which died (``swamp.orchestrator.adoption``):
        known as running ``step_id`` from now — whoever took the step over waits for it — and
        its answer, if it gives one, kept by step. No link: nothing is relayed or written."""
        running = _Running(trio.CancelScope(), step_id)
        self.running[(origin, key)] = running
        try:
            reply = await run()
            if reply is not None:
                self._prune()
                ended = self._ended.setdefault(origin, deque(maxlen=RECENT_MAX))
                ended.append((step_id, {"reply": reply}, trio.current_time()))
        finally:
            running.done.set()
            self.running.pop((origin, key), None)

    def link_lost(self, origin: str) -> None:
        """A link from ``origin`` closed: the answers given it in the last :data:`RECENT`
        seconds may not have arrived; they are kept for it (it takes those it waits for)."""
        recent = self._recent.pop(origin, None)
        since = trio.current_time() - RECENT
        self._keep_given(origin, [(s, a) for s, a, at in recent or () if at >= since])

    def _keep_given(self, origin: str, given: list[tuple[str, dict]]) -> None:
        """Keep answers already given on a link, each "running" to its origin until kept."""
        if not given or self._nursery is None:
            return
        marker = _Running(trio.CancelScope())

        async def keep_all() -> None:
            try:
                for send_id, answer in given:
                    await self._keep(origin, send_id, answer)
            finally:
                for send_id, _ in given:
                    if self.running.get((origin, send_id)) is marker:
                        del self.running[(origin, send_id)]

        for send_id, _ in given:
            self.running.setdefault((origin, send_id), marker)
        try:
            self._nursery.start_soon(keep_all)
        except RuntimeError:
            pass  # stopping: the origin hears "unknown" and goes by the lease rules

    async def _keep(self, origin: str, send_id: str, answer: dict) -> None:
        while True:
            try:
                await self.keep(origin, send_id, answer)
                return
            except SwampError as exc:  # the database is away: again (its origin asks meanwhile)
                log.warning("could not keep the outcome of step %s: %s", send_id[:12], exc)
            except Exception:  # never the end of the runs beside it
                log.exception("keeping the outcome of step %s failed", send_id[:12])
                return
            await trio.sleep(KEEP_RETRY)

    def outcome(self, origin: str, send_id: str) -> dict:
        """``peer.outcome``: whether a step sent by ``origin`` still runs here (or its answer
        is being kept); ``unknown`` when it does not (ended, or never run here)."""
        if (origin, send_id) in self.running:
            return {"state": "running"}
        recent = self._recent.get(origin)
        given = next((item for item in recent or () if item[0] == send_id), None)
        if recent is not None and given is not None:
            # answered on a link this end has not seen go yet (the origin has): kept now
            recent.remove(given)
            self._keep_given(origin, [(send_id, given[1])])
            return {"state": "running"}
        return {"state": "unknown"}

    async def wait_step(self, step_id: str) -> dict:
        """``peer.step.wait``: the origin of ``step_id`` died (or the one that took it over
        from it): did it run here? The answer once it ends (``{"state": "ended", "answer":
        …}``; the newest, if several episodes ran here), ``{"state": "unknown"}`` if no run of
        it is known here. By the step's id alone: whoever sent it, a step id is one step."""
        for running in list(self.running.values()):
            if running.step_id == step_id and not running.done.is_set():
                await running.done.wait()
        self._prune()
        found = [
            (at, answer)
            for ended in self._ended.values()
            for ended_step, answer, at in ended
            if ended_step == step_id
        ]
        if found:
            return {"state": "ended", "answer": max(found, key=lambda item: item[0])[1]}
        return {"state": "unknown"}

    def _prune(self) -> None:
        """Answers older than :data:`RECENT` go (and the origins with none left)."""
        since = trio.current_time() - RECENT
        for origin in list(self._ended):
            ended = self._ended[origin]
            while ended and ended[0][2] < since:
                ended.popleft()
            if not ended:
                del self._ended[origin]

    def cancel(self, origin: str, send_id: str) -> bool:
        """``peer.cancel``: the origin's caller left; whether a run was cancelled."""
        running = self.running.get((origin, send_id))
        if running is None or running.done.is_set():
            return False
        running.cancelled = True
        running.scope.cancel()
        return True


def _answer(running: _Running) -> dict | None:
    """What the origin is told of a run that ended (``None``: it was cancelled)."""
    if running.reply is not None:
        return {"reply": running.reply}
    if isinstance(running.error, SwampError):
        return {"error": {"code": running.error.code, "message": running.error.message}}
    if running.error is not None:
        return {"error": {"code": "internal", "message": str(running.error)}}
    return None
