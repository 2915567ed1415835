"""The admin operations, sent over the websocket to a running ``swamp serve``.

Each method sends its request message as an admin frame and returns the reply — the reply the
server's own :class:`~swamp.admin.local.RepoAdmin` produced — checked for shape. Errors come back
as the same classes (``swamp.errors`` decodes them by code), so a command fails with the same
message and exit status as straight on the repo.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

from swamp import client
from swamp.errors import MalformedFrame, MalformedReply
from swamp.protocol.messages import (
    DataQueryRequest,
    Empty,
    LogsPage,
    LogsRequest,
    Message,
    MethodFollowRequest,
    MethodRunRequest,
    NameRequest,
    QueryReply,
    QueueReply,
    RunRef,
    RunResult,
    ServerTokenCreateRequest,
    ServerTokenItem,
    ServerTokenListReply,
    TokenCreateRequest,
    TokenItem,
    TokenListReply,
    TokenRevokeRequest,
    VerifyReport,
    VerifyRequest,
    WorkerDrainReply,
    WorkerDrainRequest,
    WorkerListReply,
    WorkerListRequest,
    WorkflowHistoryReply,
    WorkflowListReply,
    WorkflowRequest,
    WorkflowRunReply,
    WorkflowRunRequest,
    WorkflowShowReply,
    WorkflowValidateReply,
)
from swamp.protocol.rpc import EventSink, RpcChannel

M = TypeVar("M", bound=Message)
DEFAULT_TIMEOUT = 60
VERIFY_TIMEOUT = 180
LOGS_WAIT_MAX = 60  # the longest a logs.read waits for lines (the server's bound as well)


class RemoteAdmin:
    def __init__(self, channel: RpcChannel, url: str) -> None:
        self.channel = channel
        self.url = url

    def __repr__(self) -> str:
        return f"<RemoteAdmin {self.url}>"

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        url: str,
        *,
        credential: str | None = None,
        ca_cert: Path | None = None,
        ca_pem: str | None = None,
    ) -> AsyncIterator[RemoteAdmin]:
        async with client.connect(
            url, server_token=credential, ca_cert=ca_cert, ca_pem=ca_pem
        ) as channel:
            yield cls(channel, url)

    async def _call(
        self,
        method: str,
        request: Message,
        reply: type[M],
        *,
        timeout=DEFAULT_TIMEOUT,
        on_event: EventSink | None = None,
    ) -> M:
        answer = await self.channel.call(
            method, request.to_json(), timeout=timeout, on_event=on_event
        )
        try:
            return reply.decode(answer, where=f"the reply to {method}")
        except MalformedFrame as exc:
            raise MalformedReply(
                f"the orchestrator at {self.url} sent a malformed reply: {exc.message}"
            ) from None

    async def token_create(self, request: TokenCreateRequest) -> TokenItem:
        return await self._call("worker.token.create", request, TokenItem)

    async def token_list(self, request: Empty = Empty()) -> TokenListReply:
        return await self._call("worker.token.list", request, TokenListReply)

    async def token_revoke(self, request: TokenRevokeRequest) -> TokenItem:
        return await self._call("worker.token.revoke", request, TokenItem)

    async def worker_list(self, request: WorkerListRequest) -> WorkerListReply:
        return await self._call("worker.list", request, WorkerListReply)

    async def worker_verify(self, request: VerifyRequest) -> VerifyReport:
        return await self._call("worker.verify", request, VerifyReport, timeout=VERIFY_TIMEOUT)

    async def worker_queue(self, request: Empty = Empty()) -> QueueReply:
        return await self._call("worker.queue.list", request, QueueReply)

    async def worker_drain(self, request: WorkerDrainRequest) -> WorkerDrainReply:
        return await self._call("worker.drain.ask", request, WorkerDrainReply)

    async def data_query(self, request: DataQueryRequest) -> QueryReply:
        return await self._call("data.query", request, QueryReply)

    async def workflow_list(self, request: Empty = Empty()) -> WorkflowListReply:
        return await self._call("workflow.list", request, WorkflowListReply)

    async def workflow_show(self, request: WorkflowRequest) -> WorkflowShowReply:
        return await self._call("workflow.show", request, WorkflowShowReply)

    async def workflow_validate(self, request: WorkflowRequest) -> WorkflowValidateReply:
        return await self._call("workflow.validate", request, WorkflowValidateReply)

    async def workflow_run(
        self, request: WorkflowRunRequest, on_event: EventSink | None = None, *, submitter: str = ""
    ) -> WorkflowRunReply:  # the server knows who submits: by the credential this presents
        return await self._call(
            "workflow.run", request, WorkflowRunReply, timeout=None, on_event=on_event
        )

    async def workflow_history(self, request: WorkflowRequest) -> WorkflowHistoryReply:
        return await self._call("workflow.history", request, WorkflowHistoryReply)

    async def workflow_history_get(self, request: RunRef) -> WorkflowRunReply:
        return await self._call("workflow.history.get", request, WorkflowRunReply)

    async def workflow_cancel(self, request: RunRef) -> WorkflowRunReply:
        return await self._call("workflow.cancel", request, WorkflowRunReply)

    async def method_run(
        self, request: MethodRunRequest, on_event: EventSink | None = None, *, submitter: str = ""
    ) -> RunResult:  # the server knows who submits: by the credential this presents
        return await self._call(
            "model.method.run", request, RunResult, timeout=None, on_event=on_event
        )

    async def server_token_create(self, request: ServerTokenCreateRequest) -> ServerTokenItem:
        return await self._call("server.token.create", request, ServerTokenItem)

    async def server_token_list(self, request: Empty = Empty()) -> ServerTokenListReply:
        return await self._call("server.token.list", request, ServerTokenListReply)

    async def server_token_revoke(self, request: NameRequest) -> ServerTokenItem:
        return await self._call("server.token.revoke", request, ServerTokenItem)

    async def method_follow(self, request: MethodFollowRequest) -> RunResult:
        return await self._call("model.method.follow", request, RunResult, timeout=None)

    async def logs_read(self, request: LogsRequest) -> LogsPage:
        timeout = DEFAULT_TIMEOUT + min(max(request.wait, 0), LOGS_WAIT_MAX)
        return await self._call("logs.read", request, LogsPage, timeout=timeout)
