"""The connect loop: keep a session up for as long as the token lives.

After a drop the worker reconnects with capped exponential backoff (1 s doubling to 30 s) until
its token's deadline — to the next orchestrator of its list, when it was given several; before
its first enrollment it keeps trying for ``connect_timeout`` (a fleet token whose places are
all taken is such a wait: it says so, then waits for a place). A permanent rejection (revoked,
expired, wrong secret, unknown token, protocol mismatch) stops it at once with exit status 1
and a one-line reason. SIGINT/SIGTERM stop it cleanly with exit 0.

A token from a source that can change (a file, a secret store: ``config.token_again``) is asked
for again when the orchestrator refuses the token in hand for good, or its deadline passes: a
different answer is a rotated secret, enrolled with after the usual backoff; the same answer, or
a source that fails, stops the worker as before. Not at every reconnect: a blip or an
orchestrator restart leaves the token valid, and should not need the secret store to be up.
A new token makes a new worker to the orchestrator (its own binding and name), so it enrolls
with a fresh instance id: the old one stays the refused worker's until its grace window ends.
"""

from __future__ import annotations

import random
import shutil
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import trio

from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.drain import EXIT_UNREACHABLE, Stage
from swamp.domain.token_sources import another_token_may_help
from swamp.domain.urls import redact
from swamp.errors import (
    FleetFull,
    PinMismatch,
    ProtocolMismatch,
    Rejected,
    SwampError,
    UserError,
    WorkerStopped,
    WrongScheme,
)
from swamp.plugins import default_registry
from swamp.protocol import messages
from swamp.worker.config import WorkerConfig
from swamp.worker.drain import Drain
from swamp.worker.events import Reporter
from swamp.worker.identity import instance_id, machine_id
from swamp.worker.reaper import Reaper
from swamp.worker.runs import Runs
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
    runs = Runs()  # every dispatch, beside the connections (one may carry it to the next)
    loop_done = trio.Event()
    async with open_unwrapping_nursery() as nursery:
        await nursery.start(runs.serve)

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
                await drain.timed_out(config.drain_timeout)

        async def exit_when_done() -> None:
            await drain.done.wait()
            await _stop_carried(runs, reporter)  # (a drain begun while it moved)
            outcome.append(drain.exit_code)
            if drain.stage is not Stage.EXITING:
                # the session closes its socket itself (a normal close the orchestrator hears
                # at once); give it a moment, then go
                with trio.move_on_after(STOP_GRACE):
                    await loop_done.wait()
            nursery.cancel_scope.cancel()

        async def connect_loop() -> None:
            outcome.append(
                await _connect_loop(
                    config, reporter, mid, iid, registry, cache_dir, reaper, drain, runs
                )
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
    runs: Runs,
) -> int:
    backoff = Backoff()
    started = time.monotonic()
    token_deadline: float | None = None
    attempt = 0
    proven: set[str] = set()  # orchestrators enrolled at: what the pin names is each of them
    # with several orchestrators, what refused this worker at each since it last enrolled: a
    # refusal of one orchestrator's own (its pin, its protocol version, its scheme) moves on
    # to the next; only when every one refused does the worker stop
    refused: dict[str, str] = {}
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
            runs=runs,
        )
        full = False  # every place of its fleet token is taken: it waits for one
        try:
            reason = await session.run()
        except PinMismatch as exc:
            if config.url not in proven and not _another_may_take(config, refused, exc):
                # a pin that never let it in: a wrong pin, or not this orchestrator
                reporter.emit("stopped", reason=exc.message, code=exc.code, exitCode=1)
                return 1
            # The pin has let this worker in here before: a CA answer that does not match it
            # now came from whatever sits on the path (a load balancer's page, an impostor),
            # not from a wrong pin. Nothing was sent; ask again, as for an orchestrator away.
            # (Or another orchestrator of the list may take it.)
            reason = exc.message
        except (ProtocolMismatch, WrongScheme) as exc:
            if not _another_may_take(config, refused, exc):
                reporter.emit("stopped", reason=exc.message, code=exc.code, exitCode=1)
                return 1
            reason = exc.message  # this orchestrator's own: another of the list may take it
        except (Rejected, UserError) as exc:  # it will never work as presented: stop
            fresh, why = None, exc.message
            if another_token_may_help(exc.code):
                fresh, why = await _another_token(config, reporter, exc.message, exc.code)
            if fresh is None:
                reporter.emit("stopped", reason=why, code=exc.code, exitCode=1)
                return 1
            config, iid = replace(config, token=fresh), instance_id()
            token_deadline, started = None, time.monotonic()
            delay = backoff.next()  # a source flipping between two refused tokens is no hot loop
            reporter.emit("retrying", delaySeconds=delay)
            await trio.sleep(delay)
            if drain.draining:
                return drain.exit_code
            continue
        except FleetFull as exc:  # not permanent: a gone member's place frees in time
            reason, full = exc.message, True
        except SwampError as exc:  # the orchestrator is away, busy, or this was a blip: retry
            reason = exc.message
        if drain.draining:  # drained, stopped, or the socket ended mid-drain: no reconnect
            await _stop_carried(runs, reporter)
            drain.finish()
            await drain.done.wait()
            return drain.exit_code
        if session.enrollment is not None:
            token_deadline = session.enrollment.token_expires_at
            backoff.reset()
            proven.add(config.url)
            refused.clear()
        # the orchestrator's words first (they name the allowance: "… exhausted (3 / 3)")
        reporter.emit("fleet_full" if full else "disconnected", reason=reason)
        delay = backoff.next()
        if token_deadline is not None:
            if time.time() + delay >= token_deadline:
                fresh, why = await _another_token(
                    config,
                    reporter,
                    "the token has expired (its deadline has passed)",
                    "token_expired",
                )
                if fresh is None:
                    reporter.emit("stopped", reason=why, code="token_expired", exitCode=1)
                    return 1
                config, iid = replace(config, token=fresh), instance_id()
                token_deadline, started = None, time.monotonic()
        elif time.monotonic() - started + delay > config.connect_timeout:
            reporter.emit(
                "stopped",
                reason=f"could not enroll within "
                f"{config.connect_timeout:g}s (last error: {reason})",
                exitCode=EXIT_UNREACHABLE,
            )
            return EXIT_UNREACHABLE
        # several orchestrators on one database: the next of the list is tried next (any of
        # them takes any worker); with one, the same again
        config = config.next_orchestrator()
        reporter.emit("waiting_for_place" if full else "retrying", delaySeconds=delay)
        await trio.sleep(delay)
        if drain.draining:  # signalled while away: nothing to finish, bar what it carried
            await _stop_carried(runs, reporter)
            return drain.exit_code


async def _stop_carried(runs: Runs, reporter: Reporter) -> None:
    """A worker that drains while it carries runs from a lost orchestrator (no orchestrator
    to finish them for) stops them, saying so, before it exits."""
    carried = runs.carried()
    if not carried:
        return
    why = "the worker drained while it carried this run from a lost orchestrator"
    for run in carried:
        run.stop(WorkerStopped(why))
    reporter.emit("warning", message=f"stopping {len(carried)} carried dispatch(es): {why}")
    with trio.move_on_after(STOP_GRACE):
        await runs.idle.wait()


def _another_may_take(config: WorkerConfig, refused: dict[str, str], exc: SwampError) -> bool:
    """Whether the worker should go on to the next orchestrator after this one refused it
    in a way of its own: with a list, until every one has refused since it last enrolled."""
    refused[config.url] = exc.message
    return len(config.urls) > 1 and len(refused) < len(config.urls)


async def _another_token(
    config: WorkerConfig, reporter: Reporter, why: str, code: str
) -> tuple[str | None, str]:
    """Ask the token's source again once the token in hand can no longer work (``why``):
    a different token, or ``None`` and the reason to stop with. Never shows a token."""
    if config.token_again is None:
        return None, why
    try:
        fresh = await trio.to_thread.run_sync(config.token_again, abandon_on_cancel=True)
    except SwampError as exc:
        return None, f"{why}; asking {config.token_source} for another failed: {exc.message}"
    if fresh == config.token:
        return None, f"{why} ({config.token_source} still gives the same token)"
    reporter.emit("token_renewed", source=config.token_source, after=code)
    return fresh, why
