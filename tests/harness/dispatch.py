"""The dispatch path in-process: a real datastore, pool, queue and episodes, and workers whose
sockets are memory transports to a stand-in that answers ``worker.dispatch`` (succeeded).

    async with dispatch_harness(tmp_path, workers=1) as harness:
        result = await harness.run(RunRequest(...))

Everything the orchestrator side does is real: the step is placed through the queue, its
lease is written behind (the journal included), its frame goes down a real ``RpcChannel``.
Only the worker is a stand-in (a handler on the other end of the memory pair).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.placement import Placement
from swamp.domain.workers import fence_seconds
from swamp.models.builtin import ECHO
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.dispatch import DispatchService, RunRequest
from swamp.orchestrator.episode import Episodes
from swamp.orchestrator.metrics import Metrics
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.queue import DispatchQueue
from swamp.plugins import default_registry
from swamp.protocol.messages import DispatchResult, RunResult
from swamp.protocol.rpc import IncomingCall, RpcChannel, no_events
from swamp.repo import ModelInstance
from swamp.store.datastore import Datastore
from swamp.store.journal import Journal
from swamp.store.records import SqliteRecords
from tests.memory_transport import MemoryTransport, pair


def memory_pair() -> tuple[MemoryTransport, MemoryTransport]:
    """A socket with room: what ``write_now`` writes goes straight to the peer."""
    return pair(256, immediate=True)


async def succeed(call: IncomingCall) -> dict:
    """The stand-in worker: every dispatch succeeds at once."""
    assert call.method == "worker.dispatch", call.method
    return DispatchResult(status="succeeded").to_json()


async def _refuse(call: IncomingCall) -> None:
    raise AssertionError(f"the worker called {call.method} in a dispatch harness")


def echo_request(labels: dict[str, str] | None = None) -> RunRequest:
    """``swamp/echo`` placed by label (``role=bench``): what ``bench/dispatch.py`` runs."""
    return RunRequest(
        model=ModelInstance(name="default", type=ECHO.type, args={}, source="<harness>"),
        method="echo",
        args={"message": "hello"},
        placement=Placement(labels=labels or {"role": "bench"}),
    )


@dataclass
class DispatchHarness:
    store: Datastore
    bookkeeper: Bookkeeper
    pool: Pool
    episodes: Episodes
    queue: DispatchQueue
    service: DispatchService
    workers: list[Member] = field(default_factory=list)

    async def run(
        self, request: RunRequest, emit: Callable[[dict], Awaitable[None]] = no_events
    ) -> RunResult:
        return await self.service.run(request, emit)


@asynccontextmanager
async def dispatch_harness(
    tmp: Path,
    *,
    workers: int = 1,
    capacity: int = 4,
    labels: dict[str, str] | None = None,
    answer: Callable[[IncomingCall], Awaitable[object]] = succeed,
) -> AsyncIterator[DispatchHarness]:
    store = Datastore(tmp / "swamp.db", orchestrator=True)
    journal = Journal(tmp / "swamp.journal")
    pool = Pool()
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)), journal)
    episodes = Episodes(bookkeeper, Credentials())
    metrics = Metrics()
    # what the queue knows of tokens: none is minted here
    queue = DispatchQueue(
        pool,
        bookkeeper.leases.db,
        bookkeeper,
        tokens=lambda name: None,
        observe=metrics.on_queue,
    )
    service = DispatchService(  # composed as `swamp serve` composes it
        store,
        bookkeeper.leases.db,
        default_registry(),
        pool,
        episodes,
        queue,
        environ={},
        fence=lambda member: fence_seconds(member.heartbeat),
        observe=metrics.on_dispatch,
    )
    harness = DispatchHarness(store, bookkeeper, pool, episodes, queue, service)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(bookkeeper.run)
            for n in range(workers):
                ours, theirs = memory_pair()
                channel = RpcChannel(ours, _refuse, name=f"w{n}", pings=False)
                peer = RpcChannel(theirs, answer, name="orchestrator", pings=False)
                await nursery.start(channel.serve)
                await nursery.start(peer.serve)
                member = Member(
                    name=f"w{n}",
                    instance_id=str(uuid.uuid4()),
                    machine_id=f"m{n}",
                    token_name="t",
                    labels=dict(labels or {"role": "bench"}),
                    platform="linux",
                    arch="x86_64",
                    capacity=capacity,
                    version="1",
                    channel=channel,
                )
                pool.put(member)
                harness.workers.append(member)
            yield harness
            nursery.cancel_scope.cancel()
    finally:
        await bookkeeper.flush()
        journal.close()
        store.close()
