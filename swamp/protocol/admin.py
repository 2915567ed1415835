"""The admin contract: every operation an operator asks of swamp, its wire verb and its request
and reply messages, as one interface both routes implement.

It lives with the wire because both sides speak it: ``swamp.admin`` performs it (on the repo, or
holding the live orchestrator) and sends it (to a running ``swamp serve``), and the
orchestrator's admin frames (``swamp.orchestrator.admin``) decode it into whatever
implementation they were given. The scope each verb needs is ``swamp.domain.scopes``.
"""

from __future__ import annotations

from typing import Protocol

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
from swamp.protocol.rpc import EventSink  # what a streamed event is handed to


class AdminApi(Protocol):
    """Requests and replies are messages (``swamp.protocol.messages``), the same on both
    routes; the server route sends them as they are."""

    async def token_create(self, request: TokenCreateRequest) -> TokenItem: ...

    async def token_list(self, request: Empty = Empty()) -> TokenListReply: ...

    async def token_revoke(self, request: TokenRevokeRequest) -> TokenItem: ...

    async def worker_list(self, request: WorkerListRequest) -> WorkerListReply: ...

    async def worker_verify(self, request: VerifyRequest) -> VerifyReport: ...

    async def worker_queue(self, request: Empty = Empty()) -> QueueReply: ...

    async def worker_drain(self, request: WorkerDrainRequest) -> WorkerDrainReply: ...

    async def data_query(self, request: DataQueryRequest) -> QueryReply: ...

    async def method_run(
        self, request: MethodRunRequest, on_event: EventSink | None = None, *, submitter: str = ""
    ) -> RunResult:
        """``submitter``: who asked, as the server knows it from the caller's credential (the
        queue shares slots between submitters); a client sends none."""

    async def method_follow(self, request: MethodFollowRequest) -> RunResult:
        """The outcome of a step placed through any orchestrator of a shared database, once
        it has one (a client whose orchestrator died asks another)."""

    async def workflow_list(self, request: Empty = Empty()) -> WorkflowListReply: ...

    async def workflow_show(self, request: WorkflowRequest) -> WorkflowShowReply: ...

    async def workflow_validate(self, request: WorkflowRequest) -> WorkflowValidateReply: ...

    async def workflow_run(
        self, request: WorkflowRunRequest, on_event: EventSink | None = None, *, submitter: str = ""
    ) -> WorkflowRunReply:
        """``submitter``: as for :meth:`method_run`, for every step of the run."""

    async def workflow_history(self, request: WorkflowRequest) -> WorkflowHistoryReply: ...

    async def workflow_history_get(self, request: RunRef) -> WorkflowRunReply: ...

    async def workflow_cancel(self, request: RunRef) -> WorkflowRunReply: ...

    async def logs_read(self, request: LogsRequest) -> LogsPage: ...

    async def server_token_create(self, request: ServerTokenCreateRequest) -> ServerTokenItem: ...

    async def server_token_list(self, request: Empty = Empty()) -> ServerTokenListReply: ...

    async def server_token_revoke(self, request: NameRequest) -> ServerTokenItem: ...


#: wire method → (API method, request message). The server's admin frames are exactly these.
OPERATIONS: dict[str, tuple[str, type[Message]]] = {
    "worker.token.create": ("token_create", TokenCreateRequest),
    "worker.token.list": ("token_list", Empty),
    "worker.token.revoke": ("token_revoke", TokenRevokeRequest),
    "worker.list": ("worker_list", WorkerListRequest),
    "worker.verify": ("worker_verify", VerifyRequest),
    "worker.queue.list": ("worker_queue", Empty),
    "worker.drain.ask": ("worker_drain", WorkerDrainRequest),
    "workflow.list": ("workflow_list", Empty),
    "workflow.show": ("workflow_show", WorkflowRequest),
    "workflow.validate": ("workflow_validate", WorkflowRequest),
    "workflow.run": ("workflow_run", WorkflowRunRequest),
    "workflow.history": ("workflow_history", WorkflowRequest),
    "workflow.history.get": ("workflow_history_get", RunRef),
    "workflow.cancel": ("workflow_cancel", RunRef),
    "data.query": ("data_query", DataQueryRequest),
    "model.method.run": ("method_run", MethodRunRequest),
    "model.method.follow": ("method_follow", MethodFollowRequest),
    "logs.read": ("logs_read", LogsRequest),
    # the orchestrator's own machine only (its repo's local credential): see Admin
    "server.token.create": ("server_token_create", ServerTokenCreateRequest),
    "server.token.list": ("server_token_list", Empty),
    "server.token.revoke": ("server_token_revoke", NameRequest),
}
#: the verbs only the orchestrator's own machine may call (its repo's local credential, as
#: straight on its repo): a server token never mints or revokes another
LOCAL_ONLY = frozenset({"server.token.create", "server.token.list", "server.token.revoke"})
