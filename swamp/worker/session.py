"""One connection to the orchestrator: enroll, then serve dispatches until the socket ends.

Everything the session does lives in one nursery owned by the channel: the read loop, the
heartbeat and the acknowledgements. The dispatches themselves run beside it, in the worker's
own nursery (``swamp.worker.runs``), linked to the call that asked for each. When the socket
drops, the session ends: what runs is stopped — or, if the orchestrator said it adopts carried
runs and the socket was lost rather than closed by it, carried to the next orchestrator
(``swamp.domain.carrying``).
"""

from __future__ import annotations

import math
import os
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import trio

from swamp import __version__
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain import environment
from swamp.domain.carrying import STOP, WAIT, carry_until, may_carry
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
    WorkerLostError,
    WorkerStopped,
)
from swamp.hostinfo import local_platform
from swamp.models.runner import run_method
from swamp.plugins import ModelRegistry, default_seams
from swamp.protocol.frames import MAX_FRAME_BYTES, PROTOCOL_VERSION
from swamp.protocol.messages import (
    AbandonRequest,
    Accepted,
    AdoptRequest,
    CarriedRun,
    DispatchRequest,
    EnrollReply,
    EnrollRequest,
)
from swamp.protocol.rpc import IncomingCall, RpcChannel
from swamp.protocol.transport import WebSocketTransport, open_websocket
from swamp.worker.config import WorkerConfig
from swamp.worker.drain import Drain
from swamp.worker.events import Reporter
from swamp.worker.reaper import Reaper
from swamp.worker.remote_context import RemoteContext
from swamp.worker.runs import Link, Run, Runs

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
        runs: Runs | None = None,
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
        # every dispatch of the worker (they outlive this connection when carried)
        self.runs = runs or Runs()
        # dispatches running and not acknowledged yet, with when each started (trio time)
        self._unacknowledged: dict[str, tuple[IncomingCall, float]] = {}
        self._idle_at = math.inf  # --idle-timeout: when this session's idle time is up
        self._idle_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.carry_offered = False  # the orchestrator adopts runs carried across a lost socket
        self._transport: WebSocketTransport | None = None
        # what every method sees of this machine's environment, worked out once, not per
        # dispatch (swamp's own variables already dropped)
        self._local_env = environment.own(os.environ)
        self._data_plane = config.data_plane()  # worked out once, like the environment
        self.channel: RpcChannel | None = None
        self.http: httpx.AsyncClient | None = None

    @property
    def active(self) -> int:
        """Dispatches running on this worker (carried ones included)."""
        return self.runs.active

    @property
    def idle(self) -> trio.Event:
        return self.runs.idle

    @property
    def completed(self) -> int:
        return self.runs.completed

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
        self._transport = transport
        async with httpx.AsyncClient(verify=context or True, timeout=30) as http:
            self.http = http
            channel = RpcChannel(transport, self._handle, name="orchestrator")
            self.channel = channel
            try:
                async with open_unwrapping_nursery() as nursery:
                    self._nursery = nursery
                    self.runs.on_change = self._run_ended
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
            finally:  # (the runs outlive this session: they no longer tell it anything)
                self._nursery = None
                if self.runs.on_change == self._run_ended:
                    self.runs.on_change = _nothing
            carried = self.runs.carried()
            if carried:
                until = min(run.carry_until for run in carried)
                self.reporter.emit(
                    "carrying",
                    dispatches=len(carried),
                    seconds=round(max(0.0, until - trio.current_time()), 1),
                )
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
            carried=self._listed(),
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
        self.carry_offered = reply.carry
        self._settle_carried(reply)
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
        if call.method not in ("worker.dispatch", "worker.adopt", "worker.abandon"):
            raise UnknownMethod(f"unknown method {call.method!r}")
        if self.enrollment is None:
            # A step that waited for this worker is sent right behind the enrollment reply:
            # its frame can be read before the task that asked to enroll has taken the answer.
            with trio.move_on_after(ENROLL_TIMEOUT):
                await self._enrolled.wait()
            if self.enrollment is None:
                raise UnknownMethod(f"{call.method} before enrollment")
        http = self.http  # made as the session starts, before it enrolls
        if http is None:
            raise UnknownMethod(f"{call.method} before the session started")
        if call.method == "worker.adopt":
            return await self._adopt(call, http)
        if call.method == "worker.abandon":
            return self._abandon(call)
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
        if dispatch_id in self.runs.runs:
            raise WorkerBusy(f"dispatch {dispatch_id[:12]} runs here already")
        # the last one --max-dispatches allows
        if request.takes_slot and self.drain.accepted() and self._nursery is not None:
            self._nursery.start_soon(self.drain.trigger, "max-dispatches")
        run = Run(dispatch_id, takes_slot=request.takes_slot)
        run.attach(Link(call, http, self._data_plane, request.credential))
        ctx = RemoteContext(
            run=run,
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
        self._report(
            "dispatch_started",
            dispatchId=dispatch_id,
            modelType=model_type.type,
            method=method.name,
        )
        self.runs.begin(run)
        self._set_idle_deadline()
        self._unacknowledged[dispatch_id] = (call, trio.current_time())
        body = partial(self._execute, run, method, args, ctx)
        if not self.carry_offered:  # never carried: it runs in this call's own task
            try:
                await self.runs.run_here(run, body)
            finally:
                self._unacknowledged.pop(dispatch_id, None)
            return _answer(run)
        self.runs.start(run, body)
        return await self._follow(run, call)

    async def _execute(self, run: Run, method, args: dict, ctx: RemoteContext) -> None:
        """The method, in the worker's own nursery (see ``swamp.worker.runs``): its answer or
        error is the run's, for whichever call follows it."""
        reporter = self.reporter  # (this session may be long gone when the run ends)
        started = time.monotonic()
        finished = {"dispatchId": run.id}
        try:
            outcome = await run_method(method, args, ctx)
        except trio.Cancelled:
            status = "stopped" if run.stopped is not None else "cancelled"
            if reporter.per_dispatch:
                reporter.emit(
                    "dispatch_finished",
                    **finished,
                    status=status,
                    durationMs=round((time.monotonic() - started) * 1000),
                    **({"error": run.stopped.message} if run.stopped is not None else {}),
                )
            raise
        except Exception as exc:  # the call that follows it answers with it
            run.error = exc
            return
        self.runs.completed += 1
        run.reply = outcome.to_message().to_json()
        if reporter.per_dispatch:
            reporter.emit(
                "dispatch_finished",
                **finished,
                status=outcome.status,
                durationMs=round((time.monotonic() - started) * 1000),
                error=outcome.error,
            )

    async def _follow(self, run: Run, call: IncomingCall, *, first: Sequence[dict] = ()) -> dict:
        """Wait for ``run``'s answer on ``call`` (``first``: events to send before). Cancelled —
        the orchestrator's cancel, a second signal (``call.stop``), or the socket gone — the
        run is stopped and settles first, as if it ran here; only a socket lost as
        :func:`may_carry` allows is the run carried instead."""
        try:
            for event in first:
                await run.emit(event)
            await run.done.wait()
        except trio.Cancelled:
            channel = call.channel
            if (
                channel.closed  # (not the caller's cancel, nor a second signal)
                and self._may_carry()
                and run.takes_slot
                and not call.cancel_asked
                and call.stopped is None
                and not run.done.is_set()
            ):
                until = carry_until(channel.last_heard, channel.heartbeat, channel.missed)
                self.runs.carry(run, until)
            else:
                if call.stopped is not None:  # a second signal: the run reports itself stopped
                    run.stop(call.stopped)
                else:
                    run.scope.cancel()
                with trio.CancelScope(shield=True):
                    await run.done.wait()
            raise
        finally:
            self._unacknowledged.pop(run.id, None)
        return _answer(run)

    def _may_carry(self) -> bool:
        """The socket is gone: whether what runs is carried (see ``swamp.domain.carrying``)."""
        transport = self._transport
        if not hasattr(os, "killpg"):  # (a carried run's commands could not be paused)
            return False
        return may_carry(
            offered=self.carry_offered,
            draining=self.drain.draining,
            closed_by_peer=transport is None or transport.closed_by_peer,
        )

    def _listed(self) -> list[CarriedRun]:
        """What this worker carries, for the orchestrator it enrolls with."""
        now = trio.current_time()
        return [
            CarriedRun(run.id, round(max(0.0, run.carry_until - now), 3), run.had_effects)
            for run in self.runs.carried()
        ]

    def _settle_carried(self, reply: EnrollReply) -> None:
        """The orchestrator said what becomes of each carried run: it waits to be adopted, or
        stops now (one it does not name, or an orchestrator that adopts none, stops)."""
        for run in self.runs.carried():
            said = reply.carried.get(run.id, STOP) if reply.carry else STOP
            if said != WAIT:
                run.stop(WorkerStopped("the orchestrator the worker moved to did not take it over"))

    async def _adopt(self, call: IncomingCall, http: httpx.AsyncClient) -> dict:
        """``worker.adopt``: a carried run is linked to this session; its answer is this
        call's."""
        request = AdoptRequest.decode(call.params)
        run = self.runs.runs.get(request.dispatch_id)
        if run is None or not run.carried:  # (as a lost worker's: the lease rules decide)
            raise WorkerLostError(
                f"dispatch {request.dispatch_id[:12]} is not carried here (it ended or stopped)"
            )
        kept = run.attach(Link(call, http, self._data_plane, request.credential))
        self.reporter.emit("adopted", dispatchId=run.id)
        # (from here on the run is this call's: cancelled or cut off while the kept events go,
        # it is carried again or stopped, as any run this call follows)
        return await self._follow(run, call, first=[Accepted().to_json(), *kept])

    def _abandon(self, call: IncomingCall) -> dict:
        """``worker.abandon``: a carried run nobody took over stops now."""
        request = AbandonRequest.decode(call.params)
        run = self.runs.runs.get(request.dispatch_id)
        if run is not None and run.carried:
            run.stop(WorkerStopped("the orchestrator the worker moved to did not take it over"))
            return {"stopped": True}
        return {"stopped": False}

    def _run_ended(self) -> None:
        self._set_idle_deadline()
        if self.active == 0 and self._nursery is not None and self.drain.draining:
            try:
                self._nursery.start_soon(self._check_drain)  # after this one has reported
            except RuntimeError:  # (the session is ending: the connect loop sees the drain)
                pass

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
        return self.runs.stop_all(WorkerStopped(why))

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


def _nothing() -> None:
    return None


def _answer(run: Run) -> dict:
    """What the call that follows a run that ended answers."""
    if run.stopped is not None:
        raise run.stopped
    if run.error is not None:
        raise run.error
    if run.reply is None:  # (stopped from outside its call: the worker is stopping)
        raise WorkerStopped("the worker stopped it")
    return run.reply
