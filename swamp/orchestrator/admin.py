"""Admin frames: what an operator's CLI asks of a running orchestrator.

Each handler validates its params, calls one service, and returns JSON. Only sockets that
presented a server token (or any socket, on a loopback server without auth) reach these; a worker
socket never does.
"""

from __future__ import annotations

import time

from swamp.bookkeeping.tokens import TokenBook, token_item
from swamp.bookkeeping.workers import WorkerBook, worker_items
from swamp.concurrency import open_nursery
from swamp.domain.claims import ClaimPolicy
from swamp.domain.durations import parse_duration
from swamp.domain.environment import check_names
from swamp.domain.labels import check_labels
from swamp.domain.placement import Placement
from swamp.domain.query import parse as parse_predicate
from swamp.domain.tokens import parse_max_enrollments
from swamp.errors import NotFound, UserError
from swamp.orchestrator.dispatch import DispatchService, RunRequest
from swamp.orchestrator.gateway import CLOSE_REVOKED, Gateway
from swamp.protocol.rpc import IncomingCall
from swamp.repo import Repo
from swamp.store.datastore import iso


def _text(params: dict, key: str, *, required: bool = True) -> str | None:
    value = params.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise UserError(f"{key!r} must be a non-empty string")
    return value


class Admin:
    def __init__(self, repo: Repo, gateway: Gateway, dispatch: DispatchService,
                 clock=time.time) -> None:
        self.repo = repo
        self.gateway = gateway
        self.dispatch = dispatch
        self.store = dispatch.store
        self.tokens = TokenBook(self.store, clock=clock)
        self.clock = clock
        self.handlers = {
            "server.info": self.server_info,
            "worker.list": self.worker_list,
            "worker.token.create": self.token_create,
            "worker.token.list": self.token_list,
            "worker.token.revoke": self.token_revoke,
            "model.method.run": self.method_run,
            "data.query": self.data_query,
            "worker.verify": self.worker_verify,
        }

    async def server_info(self, call: IncomingCall) -> dict:
        return {"repo": str(self.repo.root), "pool": self.gateway.pool.statistics(),
                "activeDispatches": len(self.dispatch.active),
                "completedDispatches": self.dispatch.completed}

    async def worker_list(self, call: IncomingCall) -> dict:
        live = {m.name: m.to_json() for m in self.gateway.pool.members.values()}
        records = WorkerBook(self.store).all()
        return worker_items(records, live, show_all=bool(call.params.get("all")))

    async def token_create(self, call: IncomingCall) -> dict:
        name = _text(call.params, "name")
        seconds = parse_duration(_text(call.params, "duration"), what="--duration")
        allowance = parse_max_enrollments(call.params.get("maxEnrollments", 1))
        allowed = call.params.get("allowLabels")
        if allowed is not None and not isinstance(allowed, list):
            raise UserError("'allowLabels' must be a list of label keys")
        claims = ClaimPolicy.build(pinned=check_labels(call.params.get("labels") or {},
                                                       source="--label"),
                                   allowed_keys=allowed,
                                   max_concurrency=call.params.get("maxConcurrency"))
        token, credential = self.tokens.mint(name, duration_seconds=seconds,
                                             max_enrollments=allowance, claims=claims)
        self.gateway.token_deadlines.set(token.name,
                                         self.gateway._trio_time(token.expires_at_epoch))
        return dict(token_item(token, self.clock()), token=credential)

    async def token_list(self, call: IncomingCall) -> dict:
        now = self.clock()
        return {"tokens": [token_item(t, now) for t in self.tokens.all()]}

    async def token_revoke(self, call: IncomingCall) -> dict:
        name = _text(call.params, "name")
        token, revoked = self.tokens.revoke(name)
        disconnected = await self.gateway.disconnect_token(
            name, CLOSE_REVOKED, f"token {name!r} has been revoked")
        return dict(token_item(token, self.clock()), alreadyRevoked=not revoked,
                    disconnected=disconnected)

    async def method_run(self, call: IncomingCall) -> dict:
        params = call.params
        model = self.repo.resolve_model(_text(params, "model"))
        args = params.get("args") or {}
        if not isinstance(args, dict):
            raise UserError("'args' must be an object")
        placement_raw = params.get("placement") or {}
        if not isinstance(placement_raw, dict):
            raise UserError("'placement' must be an object")
        placement = Placement(
            target=_text(placement_raw, "target", required=False),
            labels=check_labels(placement_raw.get("labels") or {}, source="placement labels"),
            platform=_text(placement_raw, "platform", required=False))
        env_names = params.get("env") or []
        if not isinstance(env_names, list):
            raise UserError("'env' must be a list of variable names")
        request = RunRequest(model, _text(params, "method"), args, placement,
                             env_names=check_names(env_names, source="--env"),
                             read_scope=self.repo.read_scope(model))
        started = iso(self.clock())
        result = await self.dispatch.run(request, call.emit)
        return dict(result, model=model.name, modelType=model.type, method=request.method,
                    startedAt=started)

    async def data_query(self, call: IncomingCall) -> dict:
        predicate = parse_predicate(call.params.get("predicate"))
        records = self.store.query(predicate, all_versions=bool(call.params.get("allVersions")))
        return {"records": [r.to_json() for r in records]}

    async def worker_verify(self, call: IncomingCall) -> dict:
        """Probe the selected connected workers, concurrently, through the dispatch path."""
        name = _text(call.params, "name", required=False)
        labels = check_labels(call.params.get("labels") or {}, source="labels")
        members = [m for m in self.gateway.pool.members.values() if m.connected]
        if name:
            members = [m for m in members if m.name == name]
            if not members:
                raise NotFound(f"no connected worker named {name!r}: see 'swamp worker list'")
        if labels:
            members = [m for m in members if all(m.labels.get(k) == v for k, v in labels.items())]
        verdicts: dict[str, dict] = {}

        async def probe(member_name: str) -> None:
            verdicts[member_name] = (await self.dispatch.probe(member_name)).to_json()

        async with open_nursery() as nursery:
            for member in members:
                nursery.start_soon(probe, member.name)
        ordered = [verdicts[m.name] for m in sorted(members, key=lambda m: m.name)]
        return {"workers": ordered, "total": len(ordered),
                "passed": sum(v["status"] == "pass" for v in ordered),
                "failed": sum(v["status"] == "fail" for v in ordered),
                "errors": sum(v["status"] == "error" for v in ordered)}
