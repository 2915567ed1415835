"""An RPC channel over one websocket: requests, responses, streamed events, cancels, heartbeats.

Both ends run the same class. :meth:`RpcChannel.serve` owns everything the channel does: the
read loop, one task per incoming request, the writer (started when there is a frame to send; an
orchestrator's idle socket gives it up), the pinger and the silence watcher. The read loop is
wherever the transport reads the socket (:meth:`Transport.pump`): over a websocket, each
frame is taken in the task that reads the socket as it is parsed, no queue or task between. When
the socket goes away every outstanding :meth:`call` fails with ``ChannelClosed`` and the owner's
:meth:`on_close` callbacks run at once: nothing waits on a dead peer.

**Nobody but the writer waits to send.** A frame with nothing queued or being written before
it goes to the socket at once if the socket has room (a write that cannot wait, so the peer
starts on it while this side goes on); otherwise it goes into a bounded outbox, and what
queued up while the writer's last write went out goes together in its next one (one system
call and one wake-up of the peer instead of one per frame, which under load is most of what
sending costs). A send to a peer that does not read can block for good (Hypercorn
even shields it from cancellation), so no read loop, heartbeat or handler of *another* socket
may ever wait on one: the orchestrator relays a worker's output to a client without awaiting
the client, and a channel with ``drop_events`` drops streamed events when its outbox is full,
counting them, and tells the caller how many before its answer. Requests, answers and errors
are never dropped.

Liveness is an application frame, because Hypercorn sends no websocket pings. The side that
dialled sends ``ping`` every ``heartbeat`` seconds and the other answers ``pong``; the answering
side (``pings=False``: the orchestrator, with thousands of idle workers) sends nothing of its
own. Where ``drop_silent``, a peer from which nothing at all arrived for ``heartbeat * missed``
seconds is dropped — by a watcher task of the channel's own, or, for the orchestrator's many
sockets, by one :class:`SilenceSweeper` for all of them. The watcher never sends, so a blocked
send cannot hide a silent peer. This also catches half-open connections.

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
    MalformedReply,
    SwampError,
    from_wire,
)
from swamp.protocol import frames
from swamp.protocol.outbox import WRITE_BYTES, WRITE_FRAMES, Outbox
from swamp.protocol.transport import Transport, TransportClosed

log = logging.getLogger("swamp.rpc")

EventSink = Callable[[dict], Awaitable[None]]


async def no_events(event: dict) -> None:
    """The sink of a caller that reads no events: whoever emits may skip building them."""
    return None


DROPPED_KIND = "dropped"


class IncomingCall:
    """One request being handled: its params, and a way to stream events back to the caller."""

    def __init__(
        self,
        channel: RpcChannel,
        request: frames.Request,
        scope: trio.CancelScope | None = None,
    ) -> None:
        self.channel = channel
        self.id = request.id
        self.method = request.method
        self.params = request.params
        self.quiet = request.quiet  # the caller said it reads no events
        self.dropped = 0  # events dropped because the caller was not reading
        self._scope = scope  # the handler's: the caller's cancel, or stop(), cancels it
        self.stopped: SwampError | None = None  # why stop() ended it, if it did

    @property
    def cancel_asked(self) -> bool:
        """Whether the caller said to cancel it (not: its socket went)."""
        return self.channel.cancel_asked(self.id)

    def stop(self, why: SwampError) -> None:
        """End the handler from this side: it is cancelled, and the caller is answered ``why``
        (not ``cancelled``). A handler needs no cancel scope of its own for this."""
        if self._scope is not None and self.stopped is None:
            self.stopped = why
            self._scope.cancel()

    async def emit(self, event: dict) -> None:
        """Stream an event to the caller. On a ``drop_events`` channel this never waits: when
        the caller is not reading, the event is dropped and counted. To a quiet caller nothing
        is sent."""
        if self.quiet:
            return
        channel = self.channel
        if not channel.drop_events:
            await channel._send(frames.Stream(self.id, event))
            return
        if channel.closed:
            raise ChannelClosed(f"{channel.name}: {channel.close_reason}")
        # through the writer, not written at once: the events of a burst (a workflow's steps
        # starting and ending by the hundred) go out a batch a write, not a system call each
        if self.dropped and channel._offer(self._dropped_notice(), now=False):
            self.dropped = 0
        if self.dropped or not channel._offer(frames.Stream(self.id, event), now=False):
            self.dropped += 1

    def _dropped_notice(self) -> frames.Stream:
        return frames.Stream(self.id, {"kind": DROPPED_KIND, "count": self.dropped})


Handler = Callable[[IncomingCall], Awaitable[Any]]


class _Pending:
    __slots__ = ("done", "result", "error", "on_event")

    def __init__(self, on_event: EventSink | None) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: SwampError | None = None
        self.on_event = on_event


class SilenceSweeper:
    """One watcher for many channels: every ``tick`` seconds, drop each channel whose peer has
    been silent past its own deadline (``heartbeat * missed``), and ping each that has sent
    nothing for ``1.5 * heartbeat`` — its answers to the peer's pings are stuck behind frames it
    has not read yet (a worker streaming a flood of output), so the peer would think it gone.
    An idle socket's pongs keep it from ever needing one. A task per socket waking twice a
    heartbeat costs the orchestrator more than its idle workers' heartbeats do."""

    def __init__(self, tick: float = 1.0) -> None:
        self.tick = tick
        self.channels: set[RpcChannel] = set()
        self.dropped = 0

    def __repr__(self) -> str:
        return f"<SilenceSweeper channels={len(self.channels)} dropped={self.dropped}>"

    def sweep(self, now: float) -> None:
        for channel in list(self.channels):
            if channel.closed:
                self.channels.discard(channel)
            elif channel.silent_too_long(now):
                self.dropped += 1
            elif now - channel.last_sent > 1.5 * channel.heartbeat:
                channel.last_sent = now
                channel._offer(frames.Ping())
            else:
                channel.release_idle_writer(now, self.tick)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.tick)
            self.sweep(trio.current_time())


class RpcChannel:
    # slots: an orchestrator holds one channel per worker (10,000 of them), and an instance
    # dictionary of this many attributes is most of a channel's size
    __slots__ = (
        "transport",
        "handler",
        "_heartbeat",
        "_heartbeat_changed",
        "missed",
        "pings",
        "heartbeat_source",
        "on_heartbeat",
        "sweeper",
        "name",
        "max_in_flight",
        "frame_budget",
        "drop_silent",
        "drop_events",
        "closed",
        "close_reason",
        "_close_code",
        "_ids",
        "_pending",
        "_incoming",
        "_cancel_asked",
        "_sending",
        "_settled",
        "outbox",
        "_writing",
        "_nursery",
        "_scope",
        "_last_heard",
        "last_sent",
        "_closed_event",
        "_on_close",
        "__weakref__",
    )

    def __init__(
        self,
        transport: Transport,
        handler: Handler,
        *,
        heartbeat: float = 5.0,
        missed: int = 3,
        name: str = "peer",
        max_in_flight: int = 1024,
        drop_silent: bool = True,
        drop_events: bool = False,
        pings: bool = True,
        sweeper: SilenceSweeper | None = None,
    ) -> None:
        self.transport = transport
        self.handler = handler
        self._heartbeat = heartbeat
        self._heartbeat_changed: trio.Event | None = None  # the pinger waits on it
        self.missed = missed
        self.pings = pings  # False: only answer the peer's pings
        # the answering side: the interval the peer should use now (it only ever grows); told
        # in the pong, and this channel's own silence deadline follows it
        self.heartbeat_source: Callable[[], float] | None = None
        # the pinging side: told when the peer asked for a longer interval
        self.on_heartbeat: Callable[[float], None] | None = None
        self.sweeper = sweeper  # None: a watcher task of this channel's own
        self.name = name
        # The owner may change these as it learns who the peer is.
        self.max_in_flight = max_in_flight  # requests handled at once
        self.frame_budget: int | None = None  # frames the peer may still send (None: no limit)
        self.drop_silent = drop_silent  # drop a peer silent for heartbeat * missed
        self.drop_events = drop_events  # drop streamed events rather than wait for the peer
        self.closed = False
        self.close_reason = ""
        self._close_code = 1000
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}
        self._incoming: dict[str, trio.CancelScope] = {}
        self._cancel_asked: set[str] = set()  # incoming calls the peer said to cancel
        self._sending = False  # the writer is inside transport.send
        # made by finish() and set (then dropped) as answers are handed over and sent
        self._settled: trio.Event | None = None
        self.outbox = Outbox()
        self._writing = False  # a writer task runs (it is started when there is a frame)
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._last_heard = trio.current_time()
        self.last_sent = self._last_heard  # when the writer last sent a frame
        self._closed_event: trio.Event | None = None  # made by wait_closed()
        self._on_close: list[Callable[[str], None]] = []

    @property
    def last_heard(self) -> float:
        """When the last frame arrived from the peer (a heartbeat counts), on trio's clock."""
        return self._last_heard

    @property
    def heartbeat(self) -> float:
        return self._heartbeat

    @heartbeat.setter
    def heartbeat(self, seconds: float) -> None:
        """The peer told us its interval (a worker learns it at enrollment): the pinger follows
        at once, not after the sleep it began under the old one."""
        self._heartbeat = seconds
        if self._heartbeat_changed is not None:
            self._heartbeat_changed.set()
            self._heartbeat_changed = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"<RpcChannel {self.name} {state} pending={len(self._pending)} "
            f"handling={len(self._incoming)}>"
        )

    # -- running ----------------------------------------------------------------------------

    async def serve(
        self,
        *,
        alongside: Callable[[], Awaitable[None]] | None = None,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> str:
        """Run until the socket closes (or :meth:`close`); returns why it ended. ``alongside``
        runs in the channel's own nursery, cancelled with it (an owner's timer needs no
        nursery of its own)."""
        try:
            async with open_unwrapping_nursery() as nursery:
                self._scope = nursery.cancel_scope
                self._nursery = nursery
                self._last_heard = trio.current_time()
                self.outbox.on_item = self._want_writer
                if self.outbox.frames or self.outbox.event_bytes:
                    self._want_writer()
                if alongside is not None:
                    nursery.start_soon(alongside)
                if self.heartbeat and math.isfinite(self.heartbeat):
                    if self.pings:
                        nursery.start_soon(self._send_pings)
                    if self.sweeper is not None:
                        self.sweeper.channels.add(self)
                    else:
                        nursery.start_soon(self._watch_silence)
                task_status.started()
                try:
                    await self.transport.pump(self._take)
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
        self.abort(code, reason or "closed")

    def cancel_asked(self, call_id: str) -> bool:
        """Whether the peer sent a cancel for its call ``call_id`` (still being handled)."""
        return call_id in self._cancel_asked

    def on_close(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` the moment the channel closes, whatever the cause. Owners
        clean up here rather than after :meth:`serve` returns: a writer stuck on a peer that
        never reads can keep ``serve`` from returning for as long as the peer stays."""
        self._on_close.append(callback)

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

    def _settle(self) -> None:
        if self._settled is not None:
            self._settled.set()
            self._settled = None

    async def finish(self, code: int, reason: str, *, grace: float = 5.0) -> None:
        """Close once every call being handled has answered and every answer has gone out: a
        drained worker's last result must reach the orchestrator before the close does (and
        after ``grace`` seconds, it closes regardless)."""
        with trio.move_on_after(grace):
            while (
                self._incoming
                or self.outbox.frames
                or self.outbox.event_bytes
                or self._sending
                or self.transport.unflushed
            ):
                if self._settled is None:
                    self._settled = trio.Event()
                await self._settled.wait()
        self.abort(code, reason)

    async def wait_closed(self) -> str:
        """Wait until the channel has closed, for whatever reason; returns the reason."""
        if not self.closed:
            if self._closed_event is None:
                self._closed_event = trio.Event()
            await self._closed_event.wait()
        return self.close_reason

    def _mark_closed(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        if self._closed_event is not None:
            self._closed_event.set()
        if self.sweeper is not None:
            self.sweeper.channels.discard(self)
        self.outbox.close()
        for pending in self._pending.values():
            if not pending.done.is_set():
                pending.error = ChannelClosed(f"{self.name}: {reason}")
                pending.done.set()
        self._pending.clear()
        for callback in self._on_close:
            try:
                callback(reason)
            except Exception:  # one owner's bug must not keep the others from cleaning up
                log.exception("a close callback of %s failed", self.name)

    def _want_writer(self) -> None:
        if not self._writing and self._nursery is not None and not self.closed:
            try:
                self._nursery.start_soon(self._writer)
            except RuntimeError:  # serve() is on its way out: nothing will be sent now
                return
            self._writing = True

    async def _writer(self) -> None:
        """The one task that sends on the socket, while there is something to send."""
        try:
            while True:
                if self.transport.unflushed:  # the rest of a frame written at once goes first
                    batch = []
                else:
                    try:
                        text = await self.outbox.get()
                    except trio.EndOfChannel:
                        return
                    if text is None:  # released: the next frame starts a writer again
                        return
                    if not text:  # kicked: look again
                        continue
                    # what queued up while the last write went out goes in the same write
                    batch = [text] + self.outbox.take_ready(
                        max_frames=WRITE_FRAMES - 1, max_bytes=WRITE_BYTES - len(text)
                    )
                self._sending = True
                try:
                    if len(batch) == 1 and not self.transport.unflushed:
                        await self.transport.send(batch[0])
                    else:
                        await self.transport.send_many(batch)
                    self.last_sent = trio.current_time()
                except TransportClosed as exc:
                    self.abort(1006, exc.message)
                    return
                finally:
                    self._sending = False
                    self._settle()
        finally:
            self._writing = False

    def _write_now(self, text: str) -> bool:
        """Write a frame to the socket at once, without waiting, when nothing is queued or being
        written before it and the socket has room. The peer can start on it while this side
        goes on, and no writer needs waking: frames handed to the writer go out only after
        every task woken with the sender has run (a worker would get a burst of dispatches
        together, late, and sit idle in between). A frame the socket takes only part of is
        finished by the writer before anything else."""
        if self.outbox.waiting or self._sending or self._nursery is None:
            return False
        written = self.transport.write_now(text)
        if written is None:
            return False
        self.last_sent = trio.current_time()
        if not written:
            self._want_writer()
            self.outbox.kick()
        return True

    def release_idle_writer(self, now: float, idle: float) -> None:
        """Let the writer go if nothing was sent for ``idle`` seconds: thousands of idle
        workers need no task each waiting to send (it comes back with the next frame)."""
        if self._writing and not self._sending and now - self.last_sent > idle:
            self.outbox.release()

    async def _send_pings(self) -> None:
        last = trio.current_time()
        while True:
            if self._heartbeat_changed is None:
                self._heartbeat_changed = trio.Event()
            changed = self._heartbeat_changed
            with trio.move_on_at(last + self.heartbeat):
                await changed.wait()
                continue  # a new interval: measure it from the last ping
            self._offer(frames.Ping())  # a full outbox already tells the peer we are here
            last = trio.current_time()

    async def _watch_silence(self) -> None:
        """Drop a peer silent for ``heartbeat * missed`` seconds. Never sends anything."""
        # silence is the absence of an event: only the clock can tell (the orchestrator's
        # sweeper ticks the same way for all of its channels)
        while not self.silent_too_long(trio.current_time()):  # noqa: ASYNC110
            await trio.sleep(self.heartbeat / 2)

    def _announce(self) -> float | None:
        if self.heartbeat_source is None:
            return None
        wanted = self.heartbeat_source()
        if wanted <= self.heartbeat:
            return None
        self.heartbeat = wanted
        return wanted

    def silent_too_long(self, now: float) -> bool:
        """Drop the peer (and say so) if nothing arrived from it for ``heartbeat * missed``."""
        silent = now - self._last_heard
        if not self.drop_silent or silent <= self.heartbeat * self.missed:
            return False
        idle = getattr(self.transport, "idle", None)
        if idle is not None and idle() <= self.heartbeat * self.missed:
            return False  # bytes still arrive: a large message on its way is not silence
        reason = f"no heartbeat from {self.name} for {silent:.0f}s"
        log.warning("%s", reason)
        self.abort(4000, reason)
        return True

    async def _take(self, text: str) -> None:
        """One frame from the peer. Called where the socket is read (see
        :meth:`Transport.pump`), one frame at a time, in order: whatever this awaits holds up
        the frames behind it, which is the bound on what a peer can make the channel hold."""
        if self.closed:
            return  # the socket's last frames after a close: nobody is listening
        self._last_heard = trio.current_time()
        if self.frame_budget is not None:
            self.frame_budget -= 1
            if self.frame_budget < 0:
                self.abort(1008, "too many frames before enrolling or authenticating")
                return
        try:
            frame = frames.decode(text)
        except MalformedFrame as exc:
            if exc.frame_type in ("response", "error") and exc.frame_id in self._pending:
                # an answer we cannot take (nested too deeply): its call fails, in one line
                pending = self._pending.pop(exc.frame_id)
                log.warning("%s: refused its answer to a call: %s", self.name, exc.message)
                pending.error = MalformedReply(f"the answer of {self.name}: {exc.message}")
                pending.done.set()
                return
            await self._send_error(exc.frame_id, exc)
            return
        if isinstance(frame, frames.Request):
            if frame.id in self._incoming:
                await self._send_error(
                    frame.id, DuplicateId(f"request id {frame.id!r} is already in flight")
                )
                return
            if len(self._incoming) >= self.max_in_flight:
                await self._send_error(
                    frame.id,
                    Busy(
                        f"{len(self._incoming)} requests are already in flight on this socket "
                        f"(the limit is {self.max_in_flight}); wait for their answers"
                    ),
                )
                return
            scope = trio.CancelScope()
            if self._nursery is None:  # serve() has not started: nobody would answer
                return
            try:
                self._nursery.start_soon(self._handle, frame, scope)
            except RuntimeError:  # serve() is on its way out: nobody would answer
                return
            self._incoming[frame.id] = scope
        elif isinstance(frame, (frames.Response, frames.Error)):
            answered = self._pending.pop(frame.id, None) if frame.id else None
            if answered is None:
                return  # a late answer to a call that timed out or was cancelled
            if isinstance(frame, frames.Response):
                answered.result = frame.result
            else:
                answered.error = from_wire(frame.error)
            answered.done.set()
        elif isinstance(frame, frames.Stream):
            # the sink must not wait on another socket (see the module docstring)
            streaming = self._pending.get(frame.id)
            if streaming is not None and streaming.on_event is not None:
                await streaming.on_event(frame.event)
        elif isinstance(frame, frames.Cancel):
            running = self._incoming.get(frame.id)
            if running is not None:
                self._cancel_asked.add(frame.id)
                running.cancel()
        elif isinstance(frame, frames.Ping):
            await self._send_quietly(frames.Pong(self._announce()))
        elif (
            isinstance(frame, frames.Pong)
            and self.pings  # only the side that pings takes an interval from the other
            and frame.heartbeat
            and frame.heartbeat > self.heartbeat
        ):  # the peer's pool grew: ping less often
            self.heartbeat = frame.heartbeat
            if self.on_heartbeat is not None:
                self.on_heartbeat(frame.heartbeat)

    async def _handle(self, request: frames.Request, scope: trio.CancelScope) -> None:
        call = IncomingCall(self, request, scope)
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
                if call.dropped:
                    await self._send_quietly(call._dropped_notice())
                await self._send_quietly(frames.Response(request.id, result))
            if scope.cancelled_caught and not self.closed:
                await self._send_error(
                    request.id, call.stopped or Cancelled("cancelled by the caller")
                )
        finally:
            self._incoming.pop(request.id, None)
            self._cancel_asked.discard(request.id)
            self._settle()

    # -- sending ----------------------------------------------------------------------------

    def _encode(self, frame: frames.Frame) -> str:
        if self.closed:
            raise ChannelClosed(f"{self.name}: {self.close_reason}")
        text = frames.encode(frame)
        if len(text) > frames.MAX_FRAME_BYTES:
            raise FrameTooLarge(
                f"refusing to send a {len(text)}-byte frame (limit {frames.MAX_FRAME_BYTES})"
            )
        return text

    async def _send(self, frame: frames.Frame) -> None:
        """Write a frame at once if it can be, else queue it for the writer (waiting while the
        outbox is full)."""
        text = self._encode(frame)
        if self._write_now(text):
            return
        try:
            await self.outbox.put(text, event=isinstance(frame, frames.Stream))
        except trio.ClosedResourceError:
            raise ChannelClosed(f"{self.name}: {self.close_reason or 'closed'}") from None

    def _offer(self, frame: frames.Frame, *, now: bool = True) -> bool:
        """Write (``now``) or queue a frame if there is room now; never waits."""
        try:
            text = self._encode(frame)
        except (ChannelClosed, MalformedFrame):  # too large or too deep: not sent
            return False
        return (now and self._write_now(text)) or self.outbox.offer(
            text, event=isinstance(frame, frames.Stream)
        )

    async def _send_quietly(self, frame: frames.Frame) -> None:
        try:
            await self._send(frame)
        except ChannelClosed:
            pass
        except SwampError as exc:
            if isinstance(frame, frames.Response):  # an answer that cannot go: say why instead
                log.warning("%s: could not send an answer: %s", self.name, exc.message)
                await self._send_error(frame.id, exc)

    async def _send_error(self, frame_id: str | None, exc: SwampError) -> None:
        await self._send_quietly(frames.Error(frame_id, exc.to_wire()))

    async def call(
        self,
        method: str,
        params: dict | None = None,
        *,
        # the call's own deadline, part of the protocol: a CallTimeout naming the method, and
        # the settle that follows it, which a caller's cancel scope would cut short
        timeout: float | None = 30.0,  # noqa: ASYNC109
        on_event: EventSink | None = None,
        settle: float | Callable[[], float] = 0,
    ) -> Any:
        """Send a request and wait for its answer; ``timeout=None`` waits as long as it takes.

        On timeout, or if the caller is cancelled, the peer is told to cancel its handler; with
        ``settle`` the call then keeps waiting (up to that many seconds) for the peer to say its
        handler has stopped, so that whatever the handler held is really free when this
        returns. A callable ``settle`` is asked at that moment (a caller giving up on a peer
        that does not answer waits for nothing).
        """
        if self.closed:
            raise ChannelClosed(f"{self.name}: {self.close_reason}")
        call_id = str(next(self._ids))
        pending = _Pending(on_event)
        self._pending[call_id] = pending
        request = frames.Request(call_id, method, params or {}, on_event is None)
        try:
            if timeout is None:  # no deadline: no cancel scope to keep
                await self._send(request)
                await pending.done.wait()
            else:
                with trio.move_on_after(timeout):
                    await self._send(request)
                    await pending.done.wait()
        finally:
            if not pending.done.is_set():
                wait = settle() if callable(settle) else settle
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(max(wait, 1)):
                        await self._send_quietly(frames.Cancel(call_id))
                    with trio.move_on_after(wait):
                        await pending.done.wait()  # the peer's last word on it, or its loss
                self._pending.pop(call_id, None)
        if not pending.done.is_set():
            raise CallTimeout(f"{method} got no answer from {self.name} within {timeout}s")
        if pending.error is not None:
            raise pending.error
        return pending.result
