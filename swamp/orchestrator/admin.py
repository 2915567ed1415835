"""Admin frames: the admin API, served over the control socket.

Each frame's params are decoded into the operation's request message (the contract,
``swamp.protocol.admin``), performed by the implementation this was given — in ``swamp serve``
the same :class:`~swamp.admin.local.RepoAdmin` the CLI uses straight on a repo, holding the live
orchestrator (the composition root builds it) — and answered with its reply. Only sockets that
presented an accepted admin credential reach these, and only for the verbs its scope covers
(``swamp.domain.scopes``); a worker socket never does.
"""

from __future__ import annotations

from collections.abc import Callable

from swamp.domain.scopes import VERBS, Scope
from swamp.errors import Forbidden, NotFound
from swamp.orchestrator.admin_auth import Principal
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.peers import PEER_ADMIN
from swamp.orchestrator.pool import Pool
from swamp.protocol.admin import LOCAL_ONLY, OPERATIONS, AdminApi
from swamp.protocol.messages import Empty, Message
from swamp.protocol.rpc import IncomingCall
from swamp.repo import Repo

#: a login code for the web pages, for whom, with what scope, on whose credential (revoked,
#: the session ends: ``swamp.ui.sessions``)
Login = Callable[[str, Scope, Principal], str]


class Admin:
    def __init__(
        self,
        api: AdminApi,
        *,
        repo: Repo,
        pool: Pool,
        dispatch: DispatchService,
        login: Login | None = None,
    ) -> None:
        self.api = api
        self.login = login  # None: no web pages are served
        self.repo = repo
        self.pool = pool
        self.dispatch = dispatch
        self.handlers = {
            method: self._frame(name, request) for method, (name, request) in OPERATIONS.items()
        }
        self.handlers["server.info"] = self.server_info
        self.handlers["ui.login"] = self.ui_login
        unscoped = sorted(set(self.handlers) - set(VERBS))
        if unscoped:  # a new admin frame must say which scope it needs
            raise RuntimeError(f"admin frames without a scope in swamp.domain.scopes: {unscoped}")

    def _frame(self, name: str, request_type: type[Message]):
        operation = getattr(self.api, name)

        local_only = any(OPERATIONS[verb][0] == name for verb in LOCAL_ONLY)

        async def handle(call: IncomingCall, caller: Principal) -> dict:
            if local_only and caller.kind != "local":
                raise Forbidden(
                    "server tokens are managed on the orchestrator's machine, with its repo's "
                    f"local credential (serve --auth token): {caller.describe()} cannot mint, "
                    "list or revoke them"
                )
            request = request_type.decode(call.params)
            if name in ("method_run", "workflow_run"):  # they stream events as they go
                emit = None if call.quiet else call.emit  # a quiet caller gets none built
                # its steps wait in the queue as the caller's (fair share between submitters)
                reply = await operation(request, emit, submitter=caller.submitter())
                return reply.to_json()
            return (await operation(request)).to_json()

        handle.__name__ = name
        return handle

    async def here(self, verb: str, params: dict) -> dict:
        """A peer's ask (a ``peer.*`` verb): the admin operation on what this orchestrator
        holds, performed here and never passed on again (the asking one checked the caller's
        credential and scope; a peer credential reaches nothing else)."""
        name, request_type = OPERATIONS[PEER_ADMIN[verb]]
        operation = getattr(self.api, name)
        return (await operation(request_type.decode(params), here=True)).to_json()

    async def server_info(self, call: IncomingCall, caller: Principal) -> dict:
        Empty.decode(call.params)
        return {
            "repo": str(self.repo.root),
            "pool": self.pool.statistics(),
            "activeDispatches": len(self.dispatch.active),
            "completedDispatches": self.dispatch.episodes.completed,
            "waitingSteps": len(self.dispatch.queue.waiting),
        }

    async def ui_login(self, call: IncomingCall, caller: Principal) -> dict:
        """A one-time login link to the web pages (``swamp ui``): its path and query, which
        the client joins to the address it reached us at; the session has the caller's
        scope. The code is shown to the caller only (never logged)."""
        Empty.decode(call.params)
        if self.login is None:
            raise NotFound("this orchestrator serves no web pages")
        code = self.login(caller.describe(), caller.scope, caller)
        return {"path": f"/ui/login?code={code}"}
