"""Capability verbs a worker calls over its control socket while a dispatch runs."""

from __future__ import annotations

from swamp.domain.query import parse as parse_predicate
from swamp.errors import Forbidden, UserError
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.pool import Member
from swamp.protocol.messages import QueryDataReply, QueryDataRequest
from swamp.store.reader import WORKER_BUDGET

MAX_QUERY_RESULTS = 1000


async def query_data(dispatch: DispatchService, member: Member, params: dict) -> dict:
    """``capability.queryData {dispatchId, predicate, limit?}``: only during one's own dispatch,
    and only over what that dispatch may read (its model's data and what the model declares;
    never tokens, workers or leases). The scope is part of the query, so data out of scope is
    indistinguishable from data that does not exist. It runs off the event loop, within a time
    budget (``swamp.store.reader``)."""
    request = QueryDataRequest.decode(params)
    active = dispatch.active.get(request.dispatch_id)
    if active is None or active.member is not member:
        raise Forbidden("queryData is only available to a running dispatch of this worker")
    predicate = parse_predicate(request.predicate)
    limit = MAX_QUERY_RESULTS if request.limit is None else request.limit
    if not 0 < limit <= MAX_QUERY_RESULTS:
        raise UserError(f"limit must be an integer from 1 to {MAX_QUERY_RESULTS}")
    active.acknowledged = True  # it is running the method
    records = await dispatch.query(
        predicate, limit=limit, scope=active.read_scope, budget=WORKER_BUDGET, peer=member
    )
    return QueryDataReply([r.to_json() for r in records]).to_json()
