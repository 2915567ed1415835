"""A step run for another orchestrator outlives a broken relay (the claimer's side).

A claimed step runs on this orchestrator's worker while its events and its answer go back
to its origin over the peer link (``peer.dispatch``). When that link breaks — not when the
origin cancels the call — the step runs on to its end instead of being stopped, and its answer
is kept in the database for the origin (``PgPeers.write_outcome``, which wakes it). Meanwhile
the origin may ask over a new link whether it still runs here (``peer.outcome``), and cancel
it (``peer.cancel``: its caller left). So a broken relay loses nothing, and the origin runs the
step again only if this orchestrator died (its liveness lock says so) or never ran it, by the
lease rules: never two copies at once.

One window stays: an answer sent as the link broke, which the origin never got and which is
not kept (the run had ended with the link still up). The origin asks, hears "unknown", and
goes by what it knows: a step that had an effect fails with that reason, one that had none
runs again — as for a worker lost at the same instant.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from swamp.errors import SwampError

log = logging.getLogger("swamp.peers")

KEEP_RETRY = 1.0  # seconds between attempts to keep an outcome while the database is away

Run = Callable[[Callable[[dict], Awaitable[None]]], Awaitable[dict]]  # emit → its answer
Keep = Callable[[str, str, dict], Awaitable[bool]]  # origin, sending's id, answer → kept


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
        except SwampError:  # the link is going: what follows goes nowhere
            self.cut = True


@dataclass
class _Running:
    origin: str
    scope: trio.CancelScope
    done: trio.Event = field(default_factory=trio.Event)
    reply: dict | None = None
    error: Exception | None = None


class Outliving:
    """The claimed steps running here (until their answer is given or kept)."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.running: dict[str, _Running] = {}  # by the sending's id
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
    ) -> dict:
        """Run ``run`` for ``origin``; its answer. Cancelled by the origin (its link open),
        the run is cancelled and settles first, as if awaited here; cancelled because the
        link closed, it runs on and its answer is kept for the origin."""
        assert self._nursery is not None
        relay = _Relay(emit)
        running = _Running(origin, trio.CancelScope())
        self.running[send_id] = running

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
                answer = self._answer(running)
                if relay.cut and answer is not None:  # nobody waits on the link: the database
                    await self._keep(origin, send_id, answer)
            finally:
                self.running.pop(send_id, None)  # (only now: "running" until it is kept)

        self._nursery.start_soon(body)
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
                running.scope.cancel()  # the origin's cancel: the step stops, and settles
                with trio.CancelScope(shield=True):
                    await running.done.wait()
            raise
        if running.error is not None:
            raise running.error
        assert running.reply is not None
        return running.reply

    @staticmethod
    def _answer(running: _Running) -> dict | None:
        """What the origin is told of a run that ended (``None``: it was cancelled)."""
        if running.reply is not None:
            return {"reply": running.reply}
        if isinstance(running.error, SwampError):
            return {"error": {"code": running.error.code, "message": running.error.message}}
        if running.error is not None:
            return {"error": {"code": "internal", "message": str(running.error)}}
        return None

    async def _keep(self, origin: str, send_id: str, answer: dict) -> None:
        while True:
            try:
                await self.keep(origin, send_id, answer)
                return
            except SwampError as exc:  # the database is away: again (its origin asks meanwhile)
                log.warning("could not keep the outcome of step %s: %s", send_id[:12], exc)
                await trio.sleep(KEEP_RETRY)

    def outcome(self, origin: str, send_id: str) -> dict:
        """``peer.outcome``: whether a step sent by ``origin`` still runs here (or its answer
        is being kept); ``unknown`` when it does not (ended, or never run here)."""
        running = self.running.get(send_id)
        if running is not None and running.origin == origin:
            return {"state": "running"}
        return {"state": "unknown"}

    def cancel(self, origin: str, send_id: str) -> bool:
        """``peer.cancel``: the origin's caller left; whether a run was cancelled."""
        running = self.running.get(send_id)
        if running is None or running.origin != origin:
            return False
        running.scope.cancel()
        return True
