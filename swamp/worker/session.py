"""One connection to the orchestrator: enroll, then serve dispatches until the socket ends.

Everything the session does lives in one nursery owned by the channel: the read loop, the
heartbeat, the session refresh and every running dispatch (one task per slot in use). When the
socket drops, all of it is cancelled, and the orchestrator decides what becomes of the steps.
"""

from __future__ import annotations

import math
import os
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from swamp import __version__
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain import environment
from swamp.domain.drain import refusal
from swamp.domain.workers import check_worker_name
from swamp.errors import (
    MalformedReply,
    Rejected,
    SwampError,
    UnknownMethod,
    UserError,
    WorkerBusy,
    WorkerDraining,
    WorkerStopped,
)
from swamp.hostinfo import local_platform
from swamp.models.runner import run_method
from swamp.plugins import ModelRegistry, default_seams
from swamp.protocol.frames import MAX_FRAME_BYTES, PROTOCOL_VERSION
from swamp.protocol.messages import Accepted, DispatchRequest, EnrollReply, EnrollRequest
from swamp.protocol.rpc import IncomingCall, RpcChannel
from swamp.protocol.transport import WebSocketTransport, open_websocket
from swamp.worker.config import WorkerConfig
from swamp.worker.drain import Drain
from swamp.worker.events import Reporter
from swamp.worker.reaper import Reaper
from swamp.worker.remote_context import RemoteContext

ENROLL_TIMEOUT = 30
CONNECT_TIMEOUT = 10
ACK_AFTER = 0.5  # a dispatch still running this long is acknowledged (one timer for all)


@dataclass
class Enrollment:
    worker_name: str
    token_expires_at: float
    reconnect: bool
    capacity: int  # the slots granted (the token may cap what was asked)


class Session:
    def __init__(
        self,
        config: WorkerConfig,
        *,
        machine_id: str,
        instance_id: str,
        registry: ModelRegistry,
        reporter: Reporter,
        cache_dir: Path | None = None,
        reaper: Reaper | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.config = config
        self.cache_dir = cache_dir
        self.machine_id = machine_id
        self.instance_id = instance_id
        self.registry = registry
        self.reporter = reporter
        self.reaper = reaper
        self.enrollment: Enrollment | None = None
        self._enrolled = trio.Event()
        self.drain = drain or Drain(reporter)
        self.drain.attach(self)
        self.running: dict[str, IncomingCall] = {}
        # dispatches running and not acknowledged yet, with when each started (trio time)
        self._unacknowledged: dict[str, tuple[IncomingCall, float]] = {}
        self.idle = trio.Event()  # set while no dispatch runs
        self.idle.set()
        self._idle_at = math.inf  # --idle-timeout: when this session's idle time is up
        self._idle_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.active = 0
        self.completed = 0
        # what every method sees of this machine's environment, worked out once, not per
        # dispatch (swamp's own variables already dropped)
        self._local_env = environment.own(os.environ)
        self._data_plane = config.data_plane()  # worked out once, like the environment
        self.channel: RpcChannel | None = None
        self.http: httpx.AsyncClient | None = None

    async def run(self) -> str:
        """Connect, enroll and serve; returns why the session ended. Raises ``Rejected`` for a
        permanent refusal and ``PeerError`` when the orchestrator cannot be reached."""
        context = await self.config.ssl_context()
        async with open_websocket(
            self.config.url,
            ssl_context=context,
            max_message_size=MAX_FRAME_BYTES * 2,
            connect_timeout=CONNECT_TIMEOUT,
        ) as ws:
            return await self._serve(ws, context)

    async def _serve(self, transport: WebSocketTransport, context: ssl.SSLContext | None) -> str:
        async with httpx.AsyncClient(verify=context or True, timeout=30) as http:
            self.http = http
            channel = RpcChannel(transport, self._handle, name="orchestrator")
            self.channel = channel
            async with open_unwrapping_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(channel.serve)
                await self._enroll(channel)
                nursery.start_soon(self._acknowledge)
                if self.config.idle_timeout:
                    self._set_idle_deadline()
                    nursery.start_soon(self._watch_idle)
                if self.drain.draining:  # it began while we were (re)connecting
                    nursery.start_soon(self.announce_drain, self.drain.reason)
                await channel.wait_closed()
                nursery.cancel_scope.cancel()
            return channel.close_reason

    async def _enroll(self, channel: RpcChannel) -> None:
        system, arch = local_platform()
        request = EnrollRequest(
            token=self.config.token,
            instance_id=self.instance_id,
            machine_id=self.machine_id,
            protocol_version=self.config.protocol_version or PROTOCOL_VERSION,
            version=__version__,
            platform=system,
            arch=arch,
            labels=self.config.labels,
            capacity=self.config.concurrency,
        )
        try:
            answer = await channel.call("worker.enroll", request.to_json(), timeout=ENROLL_TIMEOUT)
        except Rejected:
            raise  # permanent: the agent stops
        except UserError as exc:  # also permanent: our own handshake is wrong
            raise type(exc)(f"the orchestrator refused the enrollment: {exc.message}") from None
        try:
            reply = EnrollReply.decode(answer)
            name = check_worker_name(reply.worker_name)
        except UserError as exc:
            raise MalformedReply(
                f"the orchestrator sent a malformed enrollment reply: {exc.message}"
            ) from None
        self.enrollment = Enrollment(
            name,
            reply.token_expires_at_epoch,
            reply.reconnect,
            max(1, min(reply.capacity, self.config.concurrency)),
        )
        self._enrolled.set()
        if reply.heartbeat_seconds > 0:
            channel.heartbeat = reply.heartbeat_seconds
        if self.reaper is not None:  # frozen as long as the orchestrator would drop us
            reaper = self.reaper
            reaper.set_silence(channel.heartbeat * channel.missed)
            channel.on_heartbeat = lambda seconds: reaper.set_silence(seconds * channel.missed)
        if reply.orchestrator_version and reply.orchestrator_version != __version__:
            self.reporter.emit(
                "warning",
                message=(
                    f"this worker runs swamp {__version__} but the orchestrator runs "
                    f"{reply.orchestrator_version}: the matching build is at "
                    f"{self.config.data_plane()}/swamp.pyz"
                ),
            )
        capped = self.enrollment.capacity < self.config.concurrency
        self.reporter.emit(
            "enrolled",
            workerName=name,
            reconnect=self.enrollment.reconnect,
            tokenExpiresAt=reply.token_expires_at,
            capacity=self.enrollment.capacity,
            **({"requestedCapacity": self.config.concurrency} if capped else {}),
        )

    # -- dispatches -------------------------------------------------------------------------

    async def _handle(self, call: IncomingCall):
        if call.method == "drain.ask":  # 'swamp worker drain' or the web pages: as SIGTERM
            await self.drain.trigger("asked")  # begun and announced when this returns
            return {"running": self.active}
        if call.method != "worker.dispatch":
            raise UnknownMethod(f"unknown method {call.method!r}")
        if self.enrollment is None:
            # A step that waited for this worker is sent right behind the enrollment reply:
            # its frame can be read before the task that asked to enroll has taken the answer.
            with trio.move_on_after(ENROLL_TIMEOUT):
                await self._enrolled.wait()
            if self.enrollment is None:
                raise UnknownMethod("worker.dispatch before enrollment")
        http = self.http  # made as the session starts, before it enrolls
        if http is None:
            raise UnknownMethod("worker.dispatch before the session started")
        request = DispatchRequest.decode(call.params)
        capacity = self.enrollment.capacity
        refused = refusal(
            self.drain.stage,
            active=self.active,
            capacity=capacity if request.takes_slot else math.inf,
            started=self.drain.started if request.takes_slot else -1,
            max_dispatches=self.drain.max_dispatches,
        )
        if refused == "worker_draining":
            raise WorkerDraining(
                f"worker is draining ({self.drain.reason or 'max-dispatches'}): no new dispatches"
            )
        if refused == "worker_busy":
            raise WorkerBusy(f"worker is at capacity ({self.active}/{capacity} slots in use)")
        model_type = self.registry.runnable(request.model_type)
        method = model_type.method(request.method)
        args = method.validate(request.args)
        dispatch_id = request.dispatch_id
        # the last one --max-dispatches allows
        if request.takes_slot and self.drain.accepted() and self._nursery is not None:
            self._nursery.start_soon(self.drain.trigger, "max-dispatches")
        if self.active == 0:
            self.idle = trio.Event()  # set again when the last slot empties
        self.active += 1
        self._set_idle_deadline()
        started = time.monotonic()
        reporting = self.reporter.per_dispatch  # lines per dispatch: --json or --verbose only
        if reporting:
            self._report(
                "dispatch_started",
                dispatchId=dispatch_id,
                modelType=model_type.type,
                method=method.name,
            )
        try:
            ctx = RemoteContext(
                call=call,
                channel=call.channel,
                http=http,
                data_plane=self._data_plane,
                credential=request.credential,
                model_type=model_type,
                model_name=request.model_name,
                method=method.name,
                dispatch_id=dispatch_id,
                env=lambda: (
                    environment.with_shipped(self._local_env, request.environment)
                    | environment.step_identity(request.step_id, request.attempt)
                ),
                cache_dir=self.cache_dir,
                launcher=self.reaper,
                probe_seams=default_seams,
            )
            self.running[dispatch_id] = call  # a second signal stops it (stop_dispatches)
            self._unacknowledged[dispatch_id] = (call, trio.current_time())
            outcome = await run_method(method, args, ctx)
        except trio.Cancelled:
            self._report(
                "dispatch_finished",
                dispatchId=dispatch_id,
                status="stopped" if call.stopped else "cancelled",
                durationMs=round((time.monotonic() - started) * 1000),
            )
            raise
        finally:
            self.running.pop(dispatch_id, None)
            self._unacknowledged.pop(dispatch_id, None)
            self.active -= 1
            if self.active == 0:
                self.idle.set()
                if self._nursery is not None and self.drain.draining:
                    self._nursery.start_soon(self._check_drain)  # after this one has reported
            self._set_idle_deadline()
        self.completed += 1
        if reporting:
            self._report(
                "dispatch_finished",
                dispatchId=dispatch_id,
                status=outcome.status,
                durationMs=round((time.monotonic() - started) * 1000),
                error=outcome.error,
            )
        return outcome.to_message().to_json()

    async def _acknowledge(self) -> None:
        """Tell the orchestrator, once, of every dispatch still running :data:`ACK_AFTER` after
        it started (one that ends sooner is acknowledged by its answer): a dispatch it hears
        nothing of within a few heartbeats is taken back and given to another worker."""
        while True:
            await trio.sleep(ACK_AFTER)
            if not self._unacknowledged:
                continue
            due = trio.current_time() - ACK_AFTER
            for dispatch_id, (call, started) in list(self._unacknowledged.items()):
                if started <= due and self._unacknowledged.pop(dispatch_id, None) is not None:
                    try:
                        await call.emit(Accepted().to_json())
                    except SwampError:  # the socket is going: the orchestrator sees that
                        return

    def _report(self, event: str, **fields) -> None:
        if self.reporter.per_dispatch:
            self.reporter.emit(event, **fields)

    # -- the drain ----------------------------------------------------------------------------

    async def announce_drain(self, reason: str | None) -> None:
        """Tell the orchestrator the drain has started, so it sends nothing more. If the socket
        is gone, the orchestrator learns of it as a disconnect, and nothing is lost."""
        channel = self.channel
        if channel is None or channel.closed or self.enrollment is None:
            return
        try:
            await channel.call("worker.drain", {"reason": reason}, timeout=ENROLL_TIMEOUT)
        except SwampError as exc:
            self.reporter.emit("warning", message=f"could not announce the drain: {exc.message}")

    async def _check_drain(self) -> None:
        self.drain.check()

    def stop_dispatches(self, why: str = "a second signal during the drain stopped it") -> int:
        """Cancel every running dispatch (each then reports itself stopped, ``why``); how
        many."""
        for call in self.running.values():
            call.stop(WorkerStopped(why))
        return len(self.running)

    def leave(self, reason: str) -> None:
        """Close the socket normally once the last answers have gone out: the drain is over
        (or the worker is stopping)."""
        channel = self.channel
        if channel is None or channel.closed:
            return
        if self._nursery is not None:
            self._nursery.start_soon(channel.finish, 1000, reason)
        else:
            channel.abort(1000, reason)

    def _set_idle_deadline(self) -> None:
        timeout = self.config.idle_timeout
        if not timeout:
            return
        self._idle_at = trio.current_time() + timeout if self.active == 0 else math.inf
        self._idle_changed.set()

    async def _watch_idle(self) -> None:
        """``--idle-timeout``: drain after that long with no dispatch running. The time starts
        at enrollment and again each time the last slot empties."""
        while True:
            self._idle_changed = trio.Event()
            with trio.move_on_at(self._idle_at):
                await self._idle_changed.wait()
                continue
            if self.active == 0 and trio.current_time() >= self._idle_at:
                await self.drain.trigger("idle-timeout")
                return
