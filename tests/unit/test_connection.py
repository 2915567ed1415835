"""A control socket in-process: every part from the composition root on a real repo, the socket
a memory pair. Its first call gives it a role, and the role decides what it may call."""

import pytest
import trio

from swamp.bookkeeping.server_tokens import ServerTokenBook
from swamp.bookkeeping.tokens import TokenBook
from swamp.bookkeeping.workers import WorkerBook
from swamp.errors import SwampError
from swamp.store.records import SqliteRecords
from tests.harness.orchestrator import hello, orchestrator

LOCAL = "local-credential-for-tests"


async def refused(call) -> str:
    try:
        await call
    except SwampError as exc:
        return exc.code
    raise AssertionError("the call was answered")


@pytest.fixture
async def served(tmp_path):
    async with orchestrator(tmp_path, local_credential=LOCAL) as harness:
        yield harness


async def test_a_worker_socket_enrolls_and_may_then_call_only_worker_verbs(served):
    _, credential = await TokenBook(served.parts.db).mint("t", duration_seconds=3600)
    client, connection = await served.connect()
    reply = await client.call("worker.enroll", hello(credential))
    assert connection.role == "worker" and connection.member.name == reply["workerName"]
    assert served.parts.pool.get(reply["workerName"]) is connection.member
    assert await refused(client.call("server.info")) == "forbidden"
    assert await refused(client.call("worker.enroll", hello(credential))) == "forbidden"
    assert await client.call("worker.drain", {"reason": "signal"}) == {}
    await served.parts.records.settled()
    [record] = await WorkerBook(served.parts.db).all()
    assert record["status"] == "draining"


async def test_a_refused_enrollment_is_counted_by_the_metrics_the_root_wired(served):
    client, connection = await served.connect()
    assert await refused(client.call("worker.enroll", hello("t.nope"))) == "token_invalid"
    assert connection.role is None
    assert "token_invalid" in served.parts.metrics.render().decode()


async def test_admin_frames_need_the_credential_and_answer_from_the_live_parts(served):
    stranger, _ = await served.connect()
    assert await refused(stranger.call("server.info")) == "unauthorized"
    admin, connection = await served.connect(f"Bearer {LOCAL}")
    info = await admin.call("server.info")
    assert connection.role == "admin" and info["pool"]["members"] == 0
    assert await refused(admin.call("worker.enroll", hello("t.x"))) == "forbidden"
    made = await admin.call(
        "worker.token.create", {"name": "w", "duration": "1h", "maxEnrollments": 1}
    )
    assert made["name"] == "w" and "w" in served.parts.live_tokens.token_deadlines


async def test_a_server_token_revoked_on_the_repo_closes_its_admin_socket(served):
    """The wiring of the root: the live tokens' repo watcher tells admission, which closes the
    admin sockets whose credential no longer holds."""
    _, credential = await ServerTokenBook(served.parts.db).create("ops")
    admin, connection = await served.connect(f"Bearer {credential}")
    await admin.call("server.info")
    other = SqliteRecords(served.repo.open_store())  # another connection: the CLI on the repo
    try:
        await ServerTokenBook(other).revoke("ops")
    finally:
        await other.aclose()
    with trio.fail_after(30):  # the watcher looks every quarter second; a bound, not a pace
        reason = await connection.channel.wait_closed()
    assert "server token 'ops' has been revoked" in reason


@pytest.mark.parametrize(
    "carried",
    [
        [{"dispatchId": "not-a-dispatch-id", "seconds": 5}],  # not 32 hex digits
        [{"dispatchId": "1" * 32, "seconds": -1}],
        [{"dispatchId": "1" * 32, "seconds": 1e9}],  # longer than any carry
        [{"dispatchId": "1" * 32}],  # no seconds
        "every one",  # not a list
        [{"dispatchId": f"{n:032x}", "seconds": 5} for n in range(257)],  # too many
    ],
)
async def test_a_bad_list_of_carried_runs_is_refused_and_nothing_is_written(served, carried):
    _, credential = await TokenBook(served.parts.db).mint("t", duration_seconds=3600)
    client, connection = await served.connect()
    code = await refused(client.call("worker.enroll", hello(credential, carried=carried)))
    assert code in ("invalid_input", "malformed_frame"), code
    assert connection.role is None and served.parts.pool.members == {}
    assert await WorkerBook(served.parts.db).all() == []


async def test_an_orchestrator_on_sqlite_adopts_nothing_and_says_so(served):
    """One orchestrator alone (SQLite): a worker that lists a run it carries is told to stop
    it (the reply names nothing to wait for, and says this one adopts none)."""
    _, credential = await TokenBook(served.parts.db).mint("t", duration_seconds=3600)
    client, _ = await served.connect()
    listed = [{"dispatchId": "1" * 32, "seconds": 5}]
    reply = await client.call("worker.enroll", hello(credential, carried=listed))
    assert reply.get("carry", False) is False and reply.get("carried", {}) == {}
    assert not served.parts.pool.get(reply["workerName"]).active
