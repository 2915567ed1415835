"""Server-token scopes: which scope every admin verb needs, and the one refusal (pure, and the
token book on a real store)."""

import itertools

import pytest

from swamp.bookkeeping.server_tokens import TYPE, ServerTokenBook
from swamp.domain import scopes
from swamp.domain.scopes import VERBS, Scope, needed, parse_scope, refusal, stored_scope
from swamp.domain.tokens import hash_secret
from swamp.errors import ScopeTooNarrow, UserError
from swamp.orchestrator.admin_auth import AdminAuth, Principal, authorize
from swamp.protocol.admin import OPERATIONS, AdminApi
from swamp.protocol.messages import REQUESTS
from swamp.store.datastore import Datastore, Key, SpecPolicy
from swamp.store.records import SqliteRecords

#: the HTTP routes an admin credential opens (swamp.orchestrator.dataplane)
HTTP = {"GET /metrics", "GET /health (details)", "GET /swamp.pyz (private downloads)"}
#: admin frames the orchestrator serves besides the admin API's operations
EXTRA_FRAMES = {"server.info", "ui.login"}
#: frames of the worker protocol, either way (drain.ask: the orchestrator to a worker)
WORKER_FRAMES = {
    "worker.enroll",
    "worker.dispatch",
    "capability.queryData",
    "worker.drain",
    "drain.ask",
}


def test_every_admin_verb_has_a_scope_and_nothing_else_does():
    """A new admin frame (an OPERATIONS entry, or a frame of its own) fails here until it
    says which scope it needs; a scope for a verb that is gone fails too."""
    frames = set(OPERATIONS) | EXTRA_FRAMES
    assert set(VERBS) == frames | HTTP
    # the wire's list of requests is the admin frames and the worker's, nothing unscoped
    assert set(REQUESTS) - WORKER_FRAMES == frames


def test_every_operation_of_the_admin_api_is_a_frame():
    """The API's operations are the frames (server tokens only with the local credential)."""
    api = {name for name in vars(AdminApi) if not name.startswith("_")}
    assert api == {name for name, _ in OPERATIONS.values()}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_what_runs_mints_revokes_or_cancels_needs_admin(verb):
    changes = ("create", "revoke", "run", "cancel", "verify", "drain")
    if any(word in verb.split(".") for word in changes):
        assert VERBS[verb] is Scope.ADMIN
    elif verb in HTTP:
        assert VERBS[verb] in (Scope.METRICS, Scope.READ)
    else:
        assert VERBS[verb] is Scope.READ, "a verb that only looks needs read"
    assert needed(verb) is VERBS[verb]


def test_metrics_opens_only_the_metrics_route():
    assert [verb for verb, scope in VERBS.items() if scope is Scope.METRICS] == ["GET /metrics"]


def test_a_verb_nobody_listed_needs_admin():
    assert needed("worker.something.new") is Scope.ADMIN
    assert refusal("worker.something.new", Scope.READ, who="t") is not None


@pytest.mark.parametrize("held,need", list(itertools.product(Scope, Scope)))
def test_scopes_are_ordered(held, need):
    order = [Scope.METRICS, Scope.READ, Scope.ADMIN]
    assert held.covers(need) == (order.index(held) >= order.index(need))


@pytest.mark.parametrize("verb,held", list(itertools.product(sorted(VERBS), Scope)))
def test_the_refusal_names_both_scopes(verb, held):
    reason = refusal(verb, held, who="server token 'prom'")
    if held.covers(VERBS[verb]):
        assert reason is None
        return
    assert reason.startswith(f"server token 'prom' has the {held.value} scope")
    assert f"{verb} needs {VERBS[verb].value}" in reason
    assert f"--scope {VERBS[verb].value}" in reason
    assert "\n" not in reason


def test_parse_and_stored_scopes():
    assert [parse_scope(name) for name in scopes.NAMES] == list(Scope)
    for bad in ("", "ADMIN", "write", None, 3, "x" * 1000):
        with pytest.raises(UserError, match="expected one of metrics, read, admin"):
            parse_scope(bad)
    assert stored_scope({}) is Scope.ADMIN  # minted before scopes existed
    assert stored_scope({"scope": "read"}) is Scope.READ
    assert stored_scope({"scope": "superuser"}) is Scope.METRICS  # unknown: fails closed
    assert scopes.DEFAULT is Scope.ADMIN


def test_local_and_anyone_are_admin():
    for principal in (Principal("local", "local"), Principal("anyone", "anyone")):
        for verb in VERBS:
            authorize(principal, verb)


def test_authorize_raises_the_coded_refusal():
    with pytest.raises(ScopeTooNarrow) as info:
        authorize(Principal("server-token", "prom", Scope.METRICS), "worker.list")
    assert info.value.code == "insufficient_scope" and info.value.exit_status == 1
    assert "'prom' has the metrics scope, and worker.list needs read" in info.value.message


@pytest.fixture
async def db(tmp_path):
    db = SqliteRecords(Datastore(tmp_path / "swamp.db"))
    yield db
    await db.aclose()


async def test_tokens_keep_their_scope_and_old_ones_are_admin(db):
    book = ServerTokenBook(db)
    _, prom = await book.create("prom", Scope.METRICS)
    _, ops = await book.create("ops")
    # a token stored before scopes existed has no scope field
    old = {"name": "old", "state": "active", "createdAt": "t0", "secretHash": hash_secret("s" * 64)}
    await db.write(Key(TYPE, "old", "token"), old, policy=SpecPolicy("token"))
    auth = AdminAuth(mode="token", server_tokens=book, local_credential="local.x")
    assert (await auth.identify(f"Bearer {prom}")).scope is Scope.METRICS
    assert (await auth.identify(f"Bearer {ops}")).scope is Scope.ADMIN
    assert (await auth.identify(f"Bearer old.{'s' * 64}")).scope is Scope.ADMIN
    assert (await auth.identify("Bearer local.x")).scope is Scope.ADMIN
    assert {t.name: t.scope for t in await book.all()} == {
        "prom": Scope.METRICS,
        "ops": Scope.ADMIN,
        "old": Scope.ADMIN,
    }
    # as stored: the old one was not rewritten to say so
    stored = {r.model_name: r.attributes.get("scope") for r in await db.latest_of_type(TYPE)}
    assert stored == {"prom": "metrics", "ops": "admin", "old": None}


async def test_a_name_revoked_and_minted_again_is_another_principal(db):
    """Sockets of the first minting close, even when the second comes within one repo check
    (and with a narrower scope)."""
    book = ServerTokenBook(db)
    auth = AdminAuth(mode="token", server_tokens=book, local_credential=None)
    _, first = await book.create("ops")
    before = await auth.identify(f"Bearer {first}")
    assert isinstance(before, Principal)
    assert (await auth.validity())(before)
    await book.revoke("ops")
    _, second = await book.create("ops", Scope.METRICS)
    still_valid = await auth.validity()  # one read of the server tokens, then plain checks
    assert not still_valid(before)
    after = await auth.identify(f"Bearer {second}")
    assert isinstance(after, Principal) and still_valid(after)
    assert still_valid(Principal("local", "local"))  # the local credential always holds
