"""An RPC channel over one websocket: requests, responses, streamed events, cancels, heartbeats.

Both ends run the same class. :meth:`RpcChannel.serve` owns everything the channel does: the read
loop, one task per incoming request, and the heartbeat. When the socket goes away ``serve``
returns, every handler task is cancelled and every outstanding :meth:`call` fails with
``ChannelClosed``: nothing waits on a dead peer.

Liveness is an application frame, because Hypercorn sends no websocket pings: each side sends
``ping`` every ``heartbeat`` seconds, and a peer from which nothing at all arrived for
``heartbeat * missed`` seconds is dropped. This also catches half-open TCP connections.

What a peer can make the channel hold is bounded: at most ``max_in_flight`` requests are handled
at once (one more gets a coded ``busy`` error), and every answer the read loop itself owes — a
pong, an error for a malformed or excess frame — is sent inline, so a peer that pipelines
without reading stalls only its own socket instead of piling up tasks and unsent replies. An
untrusted peer also has a ``frame_budget``: past it the socket is closed, while the little it
was sent still fits in the socket's buffer — a send to a peer that does not read can block for
good (Hypercorn shields it), so the close must never have to wait behind a full buffer.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from swamp.concurrency import open_unwrapping_nursery
from swamp.errors import (
    Busy,
    CallTimeout,
    Cancelled,
    ChannelClosed,
    DuplicateId,
    FrameTooLarge,
    HandlerFailed,
    MalformedFrame,
    SwampError,
    from_wire,
)
from swamp.protocol import frames
from swamp.protocol.transport import Transport, TransportClosed

log = logging.getLogger("swamp.rpc")

EventSink = Callable[[dict], Awaitable[None]]


class IncomingCall:
    """One request being handled: its params, and a way to stream events back to the caller."""

    def __init__(self, channel: RpcChannel, request: frames.Request) -> None:
        self.channel = channel
        self.id = request.id
        self.method = request.method
        self.params = request.params

    async def emit(self, event: dict) -> None:
        await self.channel._send(frames.Stream(self.id, event))


Handler = Callable[[IncomingCall], Awaitable[Any]]


class _Pending:
    __slots__ = ("done", "result", "error", "on_event")

    def __init__(self, on_event: EventSink | None) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: SwampError | None = None
        self.on_event = on_event


class RpcChannel:
    def __init__(
        self,
        transport: Transport,
        handler: Handler,
        *,
        heartbeat: float = 5.0,
        missed: int = 3,
        name: str = "peer",
        max_in_flight: int = 1024,
    ) -> None:
        self.transport = transport
        self.handler = handler
        self.heartbeat = heartbeat
        self.missed = missed
        self.name = name
        self.max_in_flight = max_in_flight  # requests handled at once; the owner may change it
        self.frame_budget: int | None = None  # frames the peer may still send (None: no limit)
        self.closed = False
        self.close_reason = ""
        self._close_code = 1000
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}
        self._incoming: dict[str, trio.CancelScope] = {}
        self._send_lock = trio.Lock()
        self._scope: trio.CancelScope | None = None
        self._last_heard = trio.current_time()
        self._closed_event = trio.Event()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"<RpcChannel {self.name} {state} pending={len(self._pending)} "
            f"handling={len(self._incoming)}>"
        )

    # -- running ----------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> str:
        """Run until the socket closes (or :meth:`close`); returns why it ended."""
        try:
            async with open_unwrapping_nursery() as nursery:
                self._scope = nursery.cancel_scope
                self._last_heard = trio.current_time()
                if self.heartbeat and math.isfinite(self.heartbeat):
                    nursery.start_soon(self._heartbeat)
                task_status.started()
                try:
                    await self._read_loop(nursery)
                except TransportClosed as exc:
                    self._mark_closed(exc.message)
                nursery.cancel_scope.cancel()
        finally:
            self._mark_closed(self.close_reason or "channel stopped")
            with trio.CancelScope(shield=True):
                await self.transport.aclose(
                    self._close_code, self.close_reason if self._close_code != 1000 else ""
                )
        return self.close_reason

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket with a code and reason the peer will see, and stop serving."""
        self._mark_closed(reason or "closed")
        await self.transport.aclose(code, reason)
        if self._scope is not None:
            self._scope.cancel()

    def abort(self, code: int, reason: str) -> None:
        """Stop serving without waiting: :meth:`serve` closes the socket with this code and reason
        on its way out. For decisions taken on behalf of another connection (an eviction, a
        deadline), which must never wait on this socket."""
        if self.closed:
            return
        self._close_code = code
        self._mark_closed(reason)
        if self._scope is not None:
            self._scope.cancel()

    async def wait_closed(self) -> str:
        """Wait until the channel has closed, for whatever reason; returns the reason."""
        await self._closed_event.wait()
        return self.close_reason

    def _mark_closed(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._closed_event.set()
        for pending in self._pending.values():
            if not pending.done.is_set():
                pending.error = ChannelClosed(f"{self.name}: {reason}")
                pending.done.set()
        self._pending.clear()

    async def _heartbeat(self) -> None:
        while True:
            await trio.sleep(self.heartbeat)
            silent = trio.current_time() - self._last_heard
            if silent > self.heartbeat * self.missed:
                reason = f"no heartbeat from {self.name} for {silent:.0f}s"
                log.warning("%s", reason)
                self._mark_closed(reason)
                await self.transport.aclose(4000, "heartbeat timeout")
                if self._scope is not None:
                    self._scope.cancel()
                return
            try:
                await self._send(frames.Ping())
            except ChannelClosed:
                return

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        while True:
            text = await self.transport.receive()
            self._last_heard = trio.current_time()
            if self.frame_budget is not None:
                self.frame_budget -= 1
                if self.frame_budget < 0:
                    self.abort(1008, "too many frames before enrolling or authenticating")
                    return
            try:
                frame = frames.decode(text)
            except MalformedFrame as exc:
                await self._send_error(exc.frame_id, exc)
                continue
            if isinstance(frame, frames.Request):
                if frame.id in self._incoming:
                    await self._send_error(
                        frame.id, DuplicateId(f"request id {frame.id!r} is already in flight")
                    )
                    continue
                if len(self._incoming) >= self.max_in_flight:
                    await self._send_error(
                        frame.id,
                        Busy(
                            f"{len(self._incoming)} requests are already in flight on this socket "
                            f"(the limit is {self.max_in_flight}); wait for their answers"
                        ),
                    )
                    continue
                scope = trio.CancelScope()
                self._incoming[frame.id] = scope
                nursery.start_soon(self._handle, frame, scope)
            elif isinstance(frame, (frames.Response, frames.Error)):
                pending = self._pending.pop(frame.id, None) if frame.id else None
                if pending is None:
                    continue  # a late answer to a call that timed out or was cancelled
                if isinstance(frame, frames.Response):
                    pending.result = frame.result
                else:
                    pending.error = from_wire(frame.error)
                pending.done.set()
            elif isinstance(frame, frames.Stream):
                pending = self._pending.get(frame.id)
                if pending is not None and pending.on_event is not None:
                    await pending.on_event(frame.event)
            elif isinstance(frame, frames.Cancel):
                scope = self._incoming.get(frame.id)
                if scope is not None:
                    scope.cancel()
            elif isinstance(frame, frames.Ping):
                await self._send_quietly(frames.Pong())

    async def _handle(self, request: frames.Request, scope: trio.CancelScope) -> None:
        call = IncomingCall(self, request)
        try:
            with scope:
                try:
                    result = await self.handler(call)
                except SwampError as exc:
                    await self._send_error(request.id, exc)
                    return
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    log.exception("handler for %s failed", request.method)
                    await self._send_error(
                        request.id,
                        HandlerFailed(
                            f"{request.method} failed: {type(exc).__name__}: {exc}"[:300]
                        ),
                    )
                    return
                await self._send_quietly(frames.Response(request.id, result))
            if scope.cancelled_caught and not self.closed:
                await self._send_error(request.id, Cancelled("cancelled by the caller"))
        finally:
            self._incoming.pop(request.id, None)

    # -- sending ----------------------------------------------------------------------------

    async def _send(self, frame: frames.Frame) -> None:
        if self.closed:
            raise ChannelClosed(f"{self.name}: {self.close_reason}")
        text = frames.encode(frame)
        if len(text) > frames.MAX_FRAME_BYTES:
            raise FrameTooLarge(
                f"refusing to send a {len(text)}-byte frame (limit {frames.MAX_FRAME_BYTES})"
            )
        async with self._send_lock:
            await self.transport.send(text)

    async def _send_quietly(self, frame: frames.Frame) -> None:
        try:
            await self._send(frame)
        except ChannelClosed:
            pass
        except SwampError as exc:
            if isinstance(frame, frames.Response):
                await self._send_error(frame.id, exc)

    async def _send_error(self, frame_id: str | None, exc: SwampError) -> None:
        await self._send_quietly(frames.Error(frame_id, exc.to_wire()))

    async def call(
        self,
        method: str,
        params: dict | None = None,
        *,
        timeout: float | None = 30.0,
        on_event: EventSink | None = None,
    ) -> Any:
        """Send a request and wait for its answer; ``timeout=None`` waits as long as it takes.

        On timeout, or if the caller is cancelled, the peer is told to cancel its handler.
        """
        if self.closed:
            raise ChannelClosed(f"{self.name}: {self.close_reason}")
        call_id = str(next(self._ids))
        pending = _Pending(on_event)
        self._pending[call_id] = pending
        try:
            await self._send(frames.Request(call_id, method, params or {}))
            with trio.move_on_after(timeout if timeout is not None else math.inf):
                await pending.done.wait()
        finally:
            if not pending.done.is_set():
                self._pending.pop(call_id, None)
                with trio.CancelScope(shield=True):
                    await self._send_quietly(frames.Cancel(call_id))
        if not pending.done.is_set():
            raise CallTimeout(f"{method} got no answer from {self.name} within {timeout}s")
        if pending.error is not None:
            raise pending.error
        return pending.result
