"""``EventLog``: a child's JSON lines kept as they arrive, and waits that wake on them."""

import pytest
import trio
import trio.testing

from swamp.processes import EventLog, LineReader


async def _log(nursery) -> tuple[trio.testing.MemorySendStream, EventLog]:
    send, receive = trio.testing.memory_stream_one_way_pair()
    log = EventLog(LineReader(receive))
    nursery.start_soon(log.follow)
    return send, log


async def test_a_waiter_gets_the_line_that_arrives_later_split_across_writes():
    async with trio.open_nursery() as nursery:
        send, log = await _log(nursery)
        got = []

        async def waiter():
            got.append(await log.wait_for(lambda e: e.get("event") == "enrolled"))

        nursery.start_soon(waiter)
        await send.send_all(b'{"event": "connecting"}\nnot json at all\n{"event": "enr')
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and [e["event"] for e in log.events] == ["connecting"]
        await send.send_all(b'olled", "workerName": "w1"}\n')
        await trio.testing.wait_all_tasks_blocked()
        assert got == [{"event": "enrolled", "workerName": "w1"}]
        nursery.cancel_scope.cancel()


async def test_start_skips_the_lines_before_it():
    async with trio.open_nursery() as nursery:
        send, log = await _log(nursery)
        await send.send_all(b'{"event": "draining", "n": 1}\n{"event": "x"}\n')
        await trio.testing.wait_all_tasks_blocked()
        mark = len(log.events)
        await send.send_all(b'{"event": "draining", "n": 2}\n')
        found = await log.wait_for(lambda e: e.get("event") == "draining", start=mark)
        assert found["n"] == 2
        assert log.find(lambda e: e.get("event") == "draining")["n"] == 1
        nursery.cancel_scope.cancel()


async def test_output_that_ends_without_the_line_is_an_error_not_a_hang():
    async with trio.open_nursery() as nursery:
        send, log = await _log(nursery)
        await send.send_all(b'{"event": "connecting"}\n')
        await send.aclose()
        with pytest.raises(RuntimeError, match="exited"):
            await log.wait_for(lambda e: e.get("event") == "enrolled")
        assert log.ended and [e["event"] for e in log.events] == ["connecting"]
