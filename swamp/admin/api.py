"""The admin operations, as one interface both routes implement."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from swamp.protocol.messages import (
    DataQueryRequest,
    Empty,
    Message,
    MethodRunRequest,
    QueryReply,
    QueueReply,
    RunResult,
    TokenCreateRequest,
    TokenItem,
    TokenListReply,
    TokenRevokeRequest,
    VerifyReport,
    VerifyRequest,
    WorkerListReply,
    WorkerListRequest,
)

EventSink = Callable[[dict], Awaitable[None]]


class AdminApi(Protocol):
    """Requests and replies are messages (``swamp.protocol.messages``), the same on both
    routes; the server route sends them as they are."""

    async def token_create(self, request: TokenCreateRequest) -> TokenItem: ...

    async def token_list(self, request: Empty = Empty()) -> TokenListReply: ...

    async def token_revoke(self, request: TokenRevokeRequest) -> TokenItem: ...

    async def worker_list(self, request: WorkerListRequest) -> WorkerListReply: ...

    async def worker_verify(self, request: VerifyRequest) -> VerifyReport: ...

    async def worker_queue(self, request: Empty = Empty()) -> QueueReply: ...

    async def data_query(self, request: DataQueryRequest) -> QueryReply: ...

    async def method_run(
        self, request: MethodRunRequest, on_event: EventSink | None = None
    ) -> RunResult: ...


#: wire method → (API method, request message). The server's admin frames are exactly these.
OPERATIONS: dict[str, tuple[str, type[Message]]] = {
    "worker.token.create": ("token_create", TokenCreateRequest),
    "worker.token.list": ("token_list", Empty),
    "worker.token.revoke": ("token_revoke", TokenRevokeRequest),
    "worker.list": ("worker_list", WorkerListRequest),
    "worker.verify": ("worker_verify", VerifyRequest),
    "worker.queue.list": ("worker_queue", Empty),
    "data.query": ("data_query", DataQueryRequest),
    "model.method.run": ("method_run", MethodRunRequest),
}
