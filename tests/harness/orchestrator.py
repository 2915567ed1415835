"""In-process harnesses for the gateway and the connection: real SQLite, memory transports.

As the queue's (``tests/unit/test_dispatch_queue.py``): the real parts, built the way
``swamp serve`` builds them, with nothing but the sockets replaced.

- :func:`gateway` — enrollment, membership and live tokens over a real datastore, their
  background tasks running; a worker's socket is an :class:`RpcChannel` over a memory pair.
- :func:`orchestrator` — every part from the composition root (``compose``) on a real repo;
  :meth:`OrchestratorHarness.connect` opens a ``Connection`` on one end of a memory pair and
  serves it, and hands back a client channel on the other end.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from swamp import __version__
from swamp.bookkeeping.leases import LeaseBook
from swamp.bookkeeping.tokens import TokenBook
from swamp.bookkeeping.workers import WorkerBook
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.request_policy import RequestPolicy
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.compose import Orchestrator, Settings, compose
from swamp.orchestrator.connection import Connection
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.enrollment import Enrollment
from swamp.orchestrator.live_tokens import LiveTokens
from swamp.orchestrator.membership import Membership
from swamp.orchestrator.pool import Pool
from swamp.orchestrator.records import WorkerRecords
from swamp.plugins import default_registry
from swamp.protocol.frames import PROTOCOL_VERSION
from swamp.protocol.rpc import IncomingCall, RpcChannel
from swamp.repo import Repo
from swamp.store.datastore import Datastore
from swamp.store.journal import Journal
from swamp.store.records import SqliteRecords
from tests.memory_transport import pair as memory_pair


def hello(credential: str, *, machine: str = "machine-1", instance: str | None = None, **more):
    """A worker's ``worker.enroll`` params."""
    return {
        "token": credential,
        "instanceId": instance or str(uuid.uuid5(uuid.NAMESPACE_DNS, machine)),
        "machineId": machine,
        "protocolVersion": PROTOCOL_VERSION,
        "platform": "linux",
        "arch": "x86_64",
        "version": __version__,
        **more,
    }


async def _nothing(call: IncomingCall) -> dict:
    return {}


# -- the gateway ---------------------------------------------------------------------------------


@dataclass
class GatewayHarness:
    store: Datastore
    pool: Pool
    tokens: TokenBook
    records: WorkerRecords
    membership: Membership
    live_tokens: LiveTokens
    enrollment: Enrollment
    rejections: list[str] = field(default_factory=list)

    async def mint(
        self, name: str = "t", *, max_enrollments: int | str = 1, seconds: int = 3600
    ) -> str:
        """A token; its credential."""
        _, credential = await self.tokens.mint(
            name, duration_seconds=seconds, max_enrollments=max_enrollments
        )
        return credential

    def socket(self) -> RpcChannel:
        """The orchestrator's end of a worker socket (not served: enrollment only sets it up)."""
        ours, _theirs = memory_pair()
        return RpcChannel(ours, _nothing, pings=False)


@asynccontextmanager
async def gateway(
    path: Path, *, verify_on_enroll: bool = False, prober=None
) -> AsyncIterator[GatewayHarness]:
    """The gateway's three parts on a real datastore at ``path``, as ``compose`` wires them."""
    store = Datastore(path / "swamp.db", orchestrator=True)
    pool = Pool()
    credentials = Credentials()
    db = SqliteRecords(store)
    bookkeeper = Bookkeeper(LeaseBook(db))  # no journal: nothing is dispatched here
    records = WorkerRecords(WorkerBook(db), bookkeeper)
    membership = Membership(
        pool,
        credentials,
        records,
        grace_seconds=60,
        heartbeat_seconds=5,
        verify_on_enroll=verify_on_enroll,
    )
    tokens = TokenBook(SqliteRecords(store))  # the gateway's one seam, as compose makes it
    live_tokens = LiveTokens(store, pool, tokens)
    rejections: list[str] = []
    enrollment = Enrollment(
        pool, tokens, records, membership, live_tokens, on_rejection=rejections.append
    )
    harness = GatewayHarness(
        store, pool, tokens, records, membership, live_tokens, enrollment, rejections
    )
    try:
        async with open_unwrapping_nursery() as nursery:
            await nursery.start(bookkeeper.run)
            await nursery.start(functools.partial(membership.run, prober))
            await nursery.start(live_tokens.run)
            yield harness
            nursery.cancel_scope.cancel()
    finally:
        store.close()


# -- the connection, with every part from the composition root ----------------------------------


@dataclass
class OrchestratorHarness:
    repo: Repo
    parts: Orchestrator
    nursery: trio.Nursery

    async def connect(
        self, authorization: str | None = None, *, handler=_nothing
    ) -> tuple[RpcChannel, Connection]:
        """A socket served by the ``Connection`` the app makes for it (``authorization``: the
        header its upgrade sent); the client's channel on the other end, served too."""
        ours, theirs = memory_pair()
        headers = {"authorization": authorization} if authorization else {}
        connection = await self.parts.app.connection(ours, headers, peer="memory:1")
        client = RpcChannel(theirs, handler, heartbeat=5, name="client")
        self.nursery.start_soon(connection.serve)
        self.nursery.start_soon(client.serve)
        return client, connection


@asynccontextmanager
async def orchestrator(path: Path, **settings) -> AsyncIterator[OrchestratorHarness]:
    """Every part of ``swamp serve`` from ``compose``, on a real repo at ``path``, running;
    no listener: sockets come from :meth:`OrchestratorHarness.connect`."""
    repo, _ = Repo.init(path / "repo")
    store = repo.open_store(orchestrator=True)
    journal = Journal(repo.journal_path)
    policy = RequestPolicy.build(
        loopback=True, bind_host="127.0.0.1", allow_origins=(), trusted_hosts=()
    )
    parts = compose(repo, store, journal, default_registry(), Settings(**settings), policy=policy)
    try:
        async with open_unwrapping_nursery() as nursery:
            await nursery.start(parts.run)
            yield OrchestratorHarness(repo, parts, nursery)
            nursery.cancel_scope.cancel()
    finally:
        await parts.close()
        journal.close()
        store.close()
