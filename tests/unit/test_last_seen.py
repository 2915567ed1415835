"""LAST SEEN of a connected worker is its socket's last frame: an idle worker, which sends
nothing but heartbeats, is fresh, and nothing is written per heartbeat."""

from dataclasses import replace

import trio

from swamp.orchestrator.pool import Member
from swamp.protocol.rpc import RpcChannel
from swamp.store.datastore import iso
from tests.unit.test_episode_leases import member
from tests.unit.test_rpc import answering_side, echo_handler, pair

ENROLLED = "2026-01-01T00:00:00.000Z"  # what the record says: its enrollment


def _member(channel) -> Member:
    return replace(member(channel), capacity=1, last_seen_at=ENROLLED)


async def test_an_idle_connected_worker_is_seen_at_its_last_heartbeat(nursery, autojump_clock):
    a, b = pair()
    worker = RpcChannel(a, echo_handler, heartbeat=1, missed=3)  # the worker pings
    orchestrator = answering_side(b)
    await nursery.start(worker.serve)
    await nursery.start(orchestrator.serve)
    member = _member(orchestrator)
    # a peer that sends nothing at all, for contrast
    c, d = pair()
    await nursery.start(answering_side(c).serve)
    hushed = answering_side(d)
    await nursery.start(hushed.serve)
    quiet = _member(hushed)
    await trio.sleep(2)
    wall = 1_900_000_000.0
    assert quiet.last_seen(wall, trio.current_time()) == iso(wall - 2)  # heard nothing since

    await trio.sleep(60)  # a minute idle: nothing but heartbeats
    seen = member.last_seen(wall, trio.current_time())
    assert iso(wall - 1.5) <= seen <= iso(wall)  # within a heartbeat of now
    assert member.to_json(last_seen=seen)["lastSeenAt"] == seen
    assert member.last_seen_at == ENROLLED  # kept in memory: no write per heartbeat
    # disconnected: the time kept (its disconnect, as recorded)
    member.channel = None
    assert member.last_seen(wall, trio.current_time()) == ENROLLED
    assert member.to_json()["lastSeenAt"] == ENROLLED
