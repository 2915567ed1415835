"""Enrollment admission: the pure decision, then the gateway in-process (real SQLite, sockets
over memory) performing it — the record, the pool, refusals counted, the old socket replaced,
held-back machines, verification, a revoked token cutting its workers off."""

from dataclasses import dataclass

import trio
import trio.testing

from swamp.bookkeeping.tokens import TokenBook
from swamp.bookkeeping.workers import WorkerBook
from swamp.domain.enrollment import VERIFYING, Admit, Present, Refuse, Wait, admit, instance_clash
from swamp.domain.tokens import TokenState
from swamp.domain.workers import WorkerStatus
from swamp.errors import AlreadyConnected, Conflict, FleetFull, SwampError, TokenInvalid
from swamp.protocol.messages import Verdict
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords
from tests.harness.orchestrator import gateway, hello


@dataclass(frozen=True)
class Hello:
    instance_id: str = "i-1"
    machine_id: str = "m-1"


def decide(**given):
    given.setdefault("token", "w1")
    given.setdefault("twin", None)
    given.setdefault("existing", None)
    given.setdefault("verify_on_enroll", False)
    given.setdefault("held_back", None)
    return admit(Hello(), hold_back_seconds=300, **given)


# -- the rule ---------------------------------------------------------------------------------


def test_a_new_worker_is_admitted_idle_as_the_name_its_token_gave():
    assert decide() == Admit("w1", WorkerStatus.IDLE, None, False, False, False)


def test_under_verify_on_enroll_it_starts_unverified_and_is_probed():
    decision = decide(verify_on_enroll=True)
    assert decision == Admit("w1", WorkerStatus.UNVERIFIED, VERIFYING, True, False, False)


def test_a_held_back_machine_comes_back_unresponsive_and_is_not_probed():
    decision = decide(verify_on_enroll=True, held_back="left d-1 unanswered")
    assert isinstance(decision, Admit) and decision.status is WorkerStatus.UNRESPONSIVE
    assert decision.reason == (
        "left d-1 unanswered (held back for 300s from then, reconnects included)"
    )
    assert not decision.verify


def test_a_full_fleet_waits_and_a_refused_token_is_refused_with_its_code():
    full = FleetFull("fleet token 'f': enrollment allowance exhausted")
    assert decide(token=full) == Wait(full) and decide(token=full).code == "fleet_full"
    wrong = TokenInvalid(name="t", detail="the secret does not match")
    refused = decide(token=wrong)
    assert isinstance(refused, Refuse) and refused.code == "token_invalid"


def test_the_same_process_replaces_its_socket_another_one_is_refused():
    same = Present("w1", "i-1", "m-1", connected=True)
    assert decide(existing=same, twin=same) == Admit(
        "w1", WorkerStatus.IDLE, None, False, replaces=True, reconnect=True
    )
    gone = Present("w1", "i-1", "m-1", connected=False)
    assert decide(existing=gone, twin=gone).reconnect and not decide(existing=gone).replaces
    other = Present("w1", "i-2", "m-1", connected=True)
    refused = decide(existing=other)
    assert isinstance(refused, Refuse) and isinstance(refused.error, AlreadyConnected)


def test_an_instance_id_another_member_holds_is_refused_before_the_token_is_redeemed():
    elsewhere = Present("w9", "i-1", "m-2", connected=True)
    early = instance_clash(Hello(), elsewhere)
    assert isinstance(early, Refuse) and isinstance(early.error, Conflict)
    assert instance_clash(Hello(), None) is None
    other_name = Present("w9", "i-1", "m-1", connected=True)  # same machine, another token
    assert instance_clash(Hello(), other_name) is None
    assert isinstance(decide(twin=other_name), Refuse)


# -- the gateway in-process -------------------------------------------------------------------


async def test_an_admitted_worker_is_recorded_and_joins_the_pool(tmp_path):
    async with gateway(tmp_path) as g:
        credential = await g.mint("t")
        reply, member = await g.enrollment.enroll(g.socket(), hello(credential, capacity=2))
        assert reply.worker_name == member.name and not reply.reconnect
        assert g.pool.get(member.name) is member and member.status == "idle"
        assert member.capacity == 2  # what it asked for: the token caps nothing
        await g.records.settled()
        [record] = await WorkerBook(SqliteRecords(g.store)).all()
        assert record["name"] == member.name and record["status"] == "idle"
        assert g.rejections == []


async def test_a_refusal_is_raised_and_counted_and_binds_nothing(tmp_path):
    async with gateway(tmp_path) as g:
        credential = await g.mint("t")
        await g.enrollment.enroll(g.socket(), hello(credential, machine="m1"))
        try:
            await g.enrollment.enroll(g.socket(), hello(credential, machine="m2"))
        except SwampError as exc:
            assert exc.code == "allowance_exhausted"
        else:
            raise AssertionError("a second machine took a single-use token")
        try:
            await g.enrollment.enroll(g.socket(), hello("t.wrong-secret", machine="m3"))
        except SwampError as exc:
            assert exc.code == "token_invalid"
        assert g.rejections == ["allowance_exhausted", "token_invalid"]
        assert len(g.pool.members) == 1


async def test_a_full_fleet_is_told_to_wait(tmp_path):
    async with gateway(tmp_path) as g:
        credential = await g.mint("f", max_enrollments=2)
        for machine in ("m1", "m2"):
            await g.enrollment.enroll(g.socket(), hello(credential, machine=machine))
        try:
            await g.enrollment.enroll(g.socket(), hello(credential, machine="m3"))
        except FleetFull:
            pass
        else:
            raise AssertionError("a third machine joined a fleet of two")
        assert g.rejections == ["fleet_full"]


async def test_the_same_process_reconnecting_replaces_its_old_socket(tmp_path):
    async with gateway(tmp_path) as g:
        credential = await g.mint("t")
        old = g.socket()
        _, first = await g.enrollment.enroll(old, hello(credential))
        new = g.socket()
        reply, second = await g.enrollment.enroll(new, hello(credential))
        assert old.closed and old.close_reason == "replaced by a newer connection"
        assert reply.reconnect and second.name == first.name and second.channel is new


async def test_a_machine_held_back_reconnects_unresponsive(tmp_path):
    async with gateway(tmp_path) as g:
        credential = await g.mint("t")
        socket = g.socket()
        _, member = await g.enrollment.enroll(socket, hello(credential))
        g.membership.unresponsive(member, "left d-1 unanswered")
        g.membership.disconnected(member, socket)
        _, again = await g.enrollment.enroll(g.socket(), hello(credential))
        assert again.status == "unresponsive"
        assert again.unresponsive_reason.startswith("left d-1 unanswered (held back for")


async def test_verify_on_enroll_makes_it_schedulable_only_once_the_probe_passes(tmp_path):
    probed = trio.Event()
    answer = trio.Event()

    async def prober(name: str) -> Verdict:
        probed.set()
        await answer.wait()
        return Verdict(name, "pass")

    async with gateway(tmp_path, verify_on_enroll=True, prober=prober) as g:
        credential = await g.mint("t")
        _, member = await g.enrollment.enroll(g.socket(), hello(credential))
        await probed.wait()
        assert member.status == "unverified" and member.verify_failure_reason == VERIFYING
        answer.set()
        await trio.testing.wait_all_tasks_blocked()
        assert member.status == "idle" and member.verify_failure_reason is None


async def test_a_revoked_token_cuts_its_workers_off(tmp_path):
    async with gateway(tmp_path) as g:
        credential = await g.mint("t")
        socket = g.socket()
        await g.enrollment.enroll(socket, hello(credential))
        await g.tokens.revoke("t")
        await g.live_tokens.token_changed("t")
        assert socket.closed and socket.close_reason == "token 't' has been revoked"


async def test_the_live_tokens_answer_with_what_was_last_read(tmp_path):
    """What a decision asks without waiting on the store (the queue: is a target's token still
    live?) is the token as this process last read it: after its own writes, and after another
    process's commit, which the repo watcher notices."""
    async with gateway(tmp_path) as g:
        credential = await g.mint("t")  # written here after the first read, and not told: unknown
        assert g.live_tokens.token("t") is None
        await g.enrollment.enroll(g.socket(), hello(credential))
        assert g.live_tokens.token("t").state is TokenState.ENROLLED  # its redemption, read
        await TokenBook(SqliteRecords(Datastore(g.store.path))).revoke("t")  # the CLI, on the repo
        with trio.fail_after(5):
            while g.live_tokens.token("t").state is not TokenState.REVOKED:  # noqa: ASYNC110
                await trio.sleep(0.05)


async def test_an_older_read_of_a_token_answering_last_does_not_undo_a_newer_one(tmp_path):
    """On a server an older read may answer after a newer one (a redemption's re-read, slow,
    and an admin's revoke re-read meanwhile): the live tokens keep the newer answer."""
    async with gateway(tmp_path) as g:
        await g.mint("t")
        book = g.live_tokens.tokens
        live = await book.get("t")
        slow, answer = trio.Event(), trio.Event()
        original = book.get

        async def get(name):  # the first read answers what it read, once the test says so
            if not slow.is_set():
                slow.set()
                await answer.wait()
                return live
            return await original(name)

        book.get = get
        async with trio.open_nursery() as nursery:
            nursery.start_soon(g.live_tokens.reread, "t")  # started first, answers last
            await slow.wait()
            await original.__self__.revoke("t")
            await g.live_tokens.reread("t")  # started second, answers first: revoked
            answer.set()
        assert g.live_tokens.token("t").state is TokenState.REVOKED
