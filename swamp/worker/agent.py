"""The connect loop: keep a session up for as long as the token lives.

After a drop the worker reconnects with capped exponential backoff (1 s doubling to 30 s) until
its token's deadline; before its first enrollment it keeps trying for ``connect_timeout``. A
permanent rejection (revoked, expired, wrong secret, unknown token, protocol mismatch) stops it at
once with exit status 1 and a one-line reason. SIGINT/SIGTERM stop it cleanly with exit 0.
"""

from __future__ import annotations

import random
import shutil
import signal
import tempfile
import time
from pathlib import Path

import trio

from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.drain import Stage
from swamp.domain.urls import redact
from swamp.errors import Rejected, SwampError, UserError
from swamp.plugins import default_registry
from swamp.protocol import messages
from swamp.worker.config import WorkerConfig
from swamp.worker.drain import Drain
from swamp.worker.events import Reporter
from swamp.worker.identity import instance_id, machine_id
from swamp.worker.reaper import Reaper
from swamp.worker.session import Session

BACKOFF_START = 1.0
BACKOFF_CAP = 30.0
STOP_GRACE = 3.0  # how long a finished drain gives its socket to close before it just exits
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Backoff:
    """Doubling delays with ±25 % jitter, so a fleet cut off at once (an orchestrator restart)
    does not come back in one synchronized burst."""

    def __init__(
        self, start: float = BACKOFF_START, cap: float = BACKOFF_CAP, jitter=random.random
    ) -> None:
        self.start, self.cap, self.delay = start, cap, start
        self.jitter = jitter

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.cap, self.delay * 2)
        return round(delay * (0.75 + self.jitter() / 2), 3)

    def reset(self) -> None:
        self.delay = self.start


async def run_worker(config: WorkerConfig, reporter: Reporter) -> int:
    temp_dir = None
    cache_dir = config.cache_dir
    if cache_dir is None:
        temp_dir = Path(tempfile.mkdtemp(prefix="swamp-worker-"))
        cache_dir = temp_dir
    try:
        mid = machine_id(Path(cache_dir))
        iid = instance_id()
        registry = default_registry()
        # what every dispatch decodes and answers, ready before the first one
        messages.prepare(
            messages.EnrollReply,
            messages.DispatchRequest,
            messages.DispatchResult,
            messages.OutputHandle,
            messages.LogLine,
        )
        outcome: list[int] = []
        reaper = await Reaper.start()
        try:
            # the reaper's own tasks outlive everything that runs commands through it: a
            # dispatch cancelled as the worker stops still has its command killed
            async with trio.open_nursery() as helpers:
                await helpers.start(reaper.serve)
                try:
                    await _run(
                        config, reporter, mid, iid, registry, Path(cache_dir), reaper, outcome
                    )
                finally:
                    helpers.cancel_scope.cancel()
        finally:
            await reaper.aclose()
        return outcome[0] if outcome else 0
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


async def _run(
    config, reporter, mid, iid, registry, cache_dir: Path, reaper: Reaper, outcome: list[int]
) -> None:
    drain = Drain(reporter, max_dispatches=config.max_dispatches)
    loop_done = trio.Event()
    async with open_unwrapping_nursery() as nursery:

        async def on_signals() -> None:
            with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
                async for signum in signals:
                    # each in its own task: a forced stop waits for reports, and a third
                    # signal must still be heard meanwhile
                    nursery.start_soon(drain.signal, signal.Signals(signum).name)

        async def on_drain_timeout() -> None:
            await drain.began.wait()
            await trio.sleep(config.drain_timeout)
            if not drain.done.is_set():
                await drain.signal("the drain timeout")

        async def exit_when_done() -> None:
            await drain.done.wait()
            outcome.append(drain.exit_code)
            if drain.stage is not Stage.EXITING:
                # the session closes its socket itself (a normal close the orchestrator hears
                # at once); give it a moment, then go
                with trio.move_on_after(STOP_GRACE):
                    await loop_done.wait()
            nursery.cancel_scope.cancel()

        async def connect_loop() -> None:
            outcome.append(
                await _connect_loop(config, reporter, mid, iid, registry, cache_dir, reaper, drain)
            )
            loop_done.set()
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_signals)
        nursery.start_soon(exit_when_done)
        if config.drain_timeout:
            nursery.start_soon(on_drain_timeout)
        nursery.start_soon(connect_loop)


async def _connect_loop(
    config: WorkerConfig,
    reporter: Reporter,
    mid: str,
    iid: str,
    registry,
    cache_dir: Path,
    reaper: Reaper,
    drain: Drain,
) -> int:
    backoff = Backoff()
    started = time.monotonic()
    token_deadline: float | None = None
    attempt = 0
    while True:
        attempt += 1
        reporter.emit("connecting", url=redact(config.url), attempt=attempt)
        session = Session(
            config,
            machine_id=mid,
            instance_id=iid,
            registry=registry,
            reporter=reporter,
            cache_dir=cache_dir,
            reaper=reaper,
            drain=drain,
        )
        try:
            reason = await session.run()
        except (Rejected, UserError) as exc:  # it will never work as presented: stop
            reporter.emit("stopped", reason=exc.message, code=exc.code, exitCode=1)
            return 1
        except SwampError as exc:  # the orchestrator is away, busy, or this was a blip: retry
            reason = exc.message
        if drain.draining:  # drained, stopped, or the socket ended mid-drain: no reconnect
            drain.finish()
            await drain.done.wait()
            return drain.exit_code
        if session.enrollment is not None:
            token_deadline = session.enrollment.token_expires_at
            backoff.reset()
        reporter.emit("disconnected", reason=reason)
        delay = backoff.next()
        if token_deadline is not None:
            if time.time() + delay >= token_deadline:
                reporter.emit(
                    "stopped",
                    reason="the token has expired (its deadline has passed)",
                    code="token_expired",
                    exitCode=1,
                )
                return 1
        elif time.monotonic() - started + delay > config.connect_timeout:
            reporter.emit(
                "stopped",
                reason=f"could not enroll within "
                f"{config.connect_timeout:g}s (last error: {reason})",
                exitCode=1,
            )
            return 1
        reporter.emit("retrying", delaySeconds=delay)
        await trio.sleep(delay)
        if drain.draining:  # signalled while away: there is nothing to finish
            return drain.exit_code
