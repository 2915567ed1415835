"""Capability verbs a worker calls over its control socket while a dispatch runs."""

from __future__ import annotations

from swamp.domain.query import parse as parse_predicate
from swamp.errors import Forbidden, UserError
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.pool import Member

MAX_QUERY_RESULTS = 1000


def query_data(dispatch: DispatchService, member: Member, params: dict) -> dict:
    """``capability.queryData {dispatchId, predicate, limit?}``: only during one's own dispatch,
    and only over what that dispatch may read (its model's data and what the model declares;
    never tokens, workers or leases). The scope is part of the query, so data out of scope is
    indistinguishable from data that does not exist."""
    dispatch_id = params.get("dispatchId")
    active = dispatch.active.get(dispatch_id) if isinstance(dispatch_id, str) else None
    if active is None or active.member is not member:
        raise Forbidden("queryData is only available to a running dispatch of this worker")
    predicate = parse_predicate(params.get("predicate"))
    limit = params.get("limit", MAX_QUERY_RESULTS)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= MAX_QUERY_RESULTS:
        raise UserError(f"limit must be an integer from 1 to {MAX_QUERY_RESULTS}")
    records = dispatch.store.query(predicate, limit=limit, scope=active.read_scope)
    return {"records": [r.to_json() for r in records]}
