"""The RPC channel over an in-memory transport pair (trio.testing's virtual clock)."""

import json
import math

import pytest
import trio
import trio.testing

from swamp.errors import (
    CallTimeout,
    ChannelClosed,
    SwampError,
    UnknownMethod,
    UserError,
    WorkerStopped,
)
from swamp.protocol import frames
from swamp.protocol.outbox import OUTBOX_FRAMES, Outbox
from swamp.protocol.rpc import RpcChannel, SilenceSweeper
from tests.memory_transport import MemoryTransport, pair


def answering_side(transport, sweeper=None, heartbeat=1):
    """The orchestrator's side of a worker socket: it answers pings and sends none."""
    return RpcChannel(
        transport, echo_handler, heartbeat=heartbeat, missed=3, pings=False, sweeper=sweeper
    )


async def echo_handler(call):
    if call.method == "echo":
        for i in range(call.params.get("events", 0)):
            await call.emit({"n": i})
        return call.params
    if call.method == "fail":
        raise UserError("bad input")
    if call.method == "crash":
        raise RuntimeError("boom")
    if call.method == "hang":
        await trio.sleep_forever()
    raise UnknownMethod("unknown")


async def test_call_response_and_streamed_events(nursery):
    a, b = pair()
    client = RpcChannel(a, echo_handler, name="server")
    server = RpcChannel(b, echo_handler, name="client")
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    events = []

    async def on_event(event):
        events.append(event)

    assert await client.call("echo", {"x": 1, "events": 3}, on_event=on_event) == {
        "x": 1,
        "events": 3,
    }
    assert events == [{"n": 0}, {"n": 1}, {"n": 2}]


async def test_errors_keep_their_codes(nursery):
    a, b = pair()
    client, server = RpcChannel(a, echo_handler), RpcChannel(b, echo_handler)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    with pytest.raises(UserError) as info:
        await client.call("fail")
    assert info.value.code == "invalid_input"
    with pytest.raises(SwampError) as info:
        await client.call("crash")
    assert info.value.code == "handler_failed" and "boom" in info.value.message
    with pytest.raises(UserError) as info:
        await client.call("nope")
    assert info.value.code == "unknown_method"


async def test_timeout_cancels_the_peer_handler(nursery, autojump_clock):
    a, b = pair()
    client, server = RpcChannel(a, echo_handler), RpcChannel(b, echo_handler)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    with pytest.raises(CallTimeout):
        await client.call("hang", timeout=1)
    await trio.testing.wait_all_tasks_blocked()
    assert server._incoming == {}


async def test_closing_fails_pending_calls(nursery):
    a, b = pair()
    client, server = RpcChannel(a, echo_handler), RpcChannel(b, echo_handler)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    with trio.fail_after(5):
        async with trio.open_nursery() as inner:

            async def call_and_check():
                with pytest.raises(ChannelClosed):
                    await client.call("hang", timeout=None)

            inner.start_soon(call_and_check)
            await trio.testing.wait_all_tasks_blocked()
            await server.close(4001, "token revoked")
    assert client.closed and server.closed


async def test_malformed_and_oversized_frames_get_coded_errors(nursery):
    a, b = pair()
    server = RpcChannel(b, echo_handler)
    await nursery.start(server.serve)
    for text, code in [
        ("not json", "malformed_frame"),
        ("[]", "malformed_frame"),
        ('{"type":"request","id":"1"}', "malformed_frame"),
        ('{"type":"request","id":"1","method":"echo","params":[]}', "malformed_frame"),
        ('{"type":"weird"}', "malformed_frame"),
        ("x" * (frames.MAX_FRAME_BYTES + 1), "frame_too_large"),
    ]:
        await a.tx.send(text)
        reply = json.loads(await a.rx.receive())
        assert reply["type"] == "error" and reply["error"]["code"] == code
    await a.tx.send('{"type":"request","id":"9","method":"echo","params":{"ok":1}}')
    assert json.loads(await a.rx.receive()) == {"type": "response", "id": "9", "result": {"ok": 1}}


async def test_a_request_holding_a_lone_surrogate_is_answered_by_its_id(nursery):
    """Its caller gets the refusal at once (it used to go out with no id, and a CLI waited
    until the socket was closed for not authenticating); an id that is no text, or the id of
    anything but a request, is not echoed."""
    a, b = pair()
    server = RpcChannel(b, echo_handler)
    await nursery.start(server.serve)
    for text, answered in [
        ('{"type":"request","id":"s1","method":"echo","params":{"p":"x\\udcff"}}', "s1"),
        ('{"type":"request","id":"s\\ud800","method":"echo","params":{}}', None),
        ('{"type":"response","id":"7","result":"\\ud800"}', None),
    ]:
        await a.tx.send(text)
        reply = json.loads(await a.rx.receive())
        assert reply["type"] == "error" and reply["id"] == answered
        assert reply["error"]["code"] == "malformed_frame"
        assert "lone surrogate" in reply["error"]["message"]


async def test_a_silent_peer_is_dropped(nursery, autojump_clock):
    a, b = pair()
    server = RpcChannel(b, echo_handler, heartbeat=1, missed=3)
    await nursery.start(server.serve)
    # ``a`` never answers: after three intervals the server gives up on it
    with trio.fail_after(10):
        reason = await server.wait_closed()
    assert "no heartbeat" in reason
    await trio.testing.wait_all_tasks_blocked()
    assert b.closed_with[0] == 4000 and "no heartbeat" in b.closed_with[1]


async def test_pings_are_answered_and_keep_the_peer_alive(nursery, autojump_clock):
    a, b = pair()
    client = RpcChannel(a, echo_handler, heartbeat=1, missed=3)
    server = RpcChannel(b, echo_handler, heartbeat=1, missed=3)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    await trio.sleep(20)
    assert not client.closed and not server.closed


async def test_the_answering_side_only_answers_and_one_sweeper_drops_silence(
    nursery, autojump_clock
):
    """The orchestrator's sockets: the worker pings, the orchestrator answers; one sweeper task
    watches every socket's silence. A peer that keeps pinging stays and is sent nothing but
    pongs; a peer that goes quiet is dropped after ``heartbeat * missed``."""
    sweeper = SilenceSweeper(tick=0.5)
    await nursery.start(sweeper.run)
    a_tx, b_rx = trio.open_memory_channel(100)
    b_tx, tap = trio.open_memory_channel(100)
    c_tx, a_rx = trio.open_memory_channel(100)
    sent = []

    async def relay():  # what the answering side sends, on its way to the pinger
        async for text in tap:
            sent.append(json.loads(text)["type"])
            await c_tx.send(text)

    nursery.start_soon(relay)
    pinger = RpcChannel(MemoryTransport(a_tx, a_rx), echo_handler, heartbeat=1, missed=3)
    answering = answering_side(MemoryTransport(b_tx, b_rx), sweeper)
    await nursery.start(pinger.serve)
    await nursery.start(answering.serve)
    await trio.sleep(20)
    assert not pinger.closed and not answering.closed and sweeper.channels == {answering}
    assert len(sent) >= 18 and set(sent) == {"pong"}
    quiet_tx, quiet_rx = trio.open_memory_channel(100)
    heard_tx, heard = trio.open_memory_channel(100)
    quiet = answering_side(MemoryTransport(heard_tx, quiet_rx), sweeper)
    await nursery.start(quiet.serve)
    started = trio.current_time()
    assert (await quiet.wait_closed()).startswith("no heartbeat from peer for")
    assert 3 < trio.current_time() - started <= 3.5 + 0.01  # one tick past the deadline
    assert sweeper.dropped == 1 and quiet not in sweeper.channels
    assert not answering.closed


def _writers(channel) -> int:
    """How many writer tasks ``channel`` has right now."""
    return sum(
        1
        for task in channel._nursery.child_tasks
        if task.coro.cr_code is RpcChannel._writer.__code__
    )


async def test_an_idle_answering_socket_gives_up_its_writer_and_gets_it_back(
    nursery, autojump_clock
):
    """Ten thousand idle workers need not keep a task each waiting to send: the sweeper lets an
    idle socket's writer go, and the next frame starts one — nothing queued is lost."""
    sweeper = SilenceSweeper(tick=0.5)
    await nursery.start(sweeper.run)
    ours, theirs = pair()
    answering = answering_side(ours, sweeper, heartbeat=10)
    peer = RpcChannel(theirs, echo_handler, heartbeat=10, pings=False, drop_silent=False)
    await nursery.start(answering.serve)
    await nursery.start(peer.serve)
    assert _writers(answering) == 0  # nothing sent yet: no writer
    assert await peer.call("echo", {"n": 1}) == {"n": 1}
    assert _writers(answering) == 1
    await trio.sleep(2)  # idle past a tick
    assert _writers(answering) == 0 and not answering.closed
    for i in range(50):  # a burst after the pause: every answer arrives, in order
        assert await peer.call("echo", {"n": i}) == {"n": i}
    await trio.sleep(2)
    results = []

    async def one(i: int) -> None:
        results.append((await peer.call("echo", {"i": i}))["i"])

    async with trio.open_nursery() as calls:  # many at once: still one writer
        for i in range(20):
            calls.start_soon(one, i)
            assert _writers(answering) <= 1
    assert sorted(results) == list(range(20))


async def test_a_longer_interval_travels_in_a_pong_and_only_the_pinging_side_takes_it(
    nursery, autojump_clock
):
    """The pool grew: a worker that enrolled when it was small is told the longer interval in
    the answer to its next ping; the orchestrator's deadline for it follows; a pong sent *to*
    the answering side (a hostile worker) changes nothing there."""
    a, b = pair()
    told = []
    wanted = [1.0]
    pinger = RpcChannel(a, echo_handler, heartbeat=1, missed=3)
    pinger.on_heartbeat = told.append
    answering = answering_side(b)
    answering.heartbeat_source = lambda: wanted[0]
    await nursery.start(pinger.serve)
    await nursery.start(answering.serve)
    await trio.sleep(5)
    assert pinger.heartbeat == 1 and told == []
    wanted[0] = 4.0
    await trio.sleep(2)
    assert pinger.heartbeat == answering.heartbeat == 4.0 and told == [4.0]
    await trio.sleep(30)  # pinging every 4 s now: nobody is dropped
    assert not pinger.closed and not answering.closed
    await a.tx.send('{"type":"pong","heartbeat":3600}')
    await trio.sleep(1)
    assert answering.heartbeat == 4.0


async def test_the_sweeper_pings_a_socket_whose_answers_are_stuck(nursery, autojump_clock):
    """A socket that sent nothing for 1.5 heartbeats (its pongs wait behind frames it has not
    read) gets a ping from the sweeper, written beside the read loop, so its peer hears it."""
    sweeper = SilenceSweeper(tick=0.5)
    await nursery.start(sweeper.run)
    a_tx, b_rx = trio.open_memory_channel(100)
    b_tx, a_rx = trio.open_memory_channel(100)
    answering = answering_side(MemoryTransport(b_tx, b_rx), sweeper, heartbeat=2)
    await nursery.start(answering.serve)
    started = trio.current_time()
    assert json.loads(await a_rx.receive()) == {"type": "ping"}
    assert 3 < trio.current_time() - started <= 3.5 + 0.01


async def test_a_quiet_call_is_sent_no_events_but_its_answer(nursery):
    a, b = pair()
    sent = []
    original = b.send

    async def spy(text):
        sent.append(json.loads(text)["type"])
        await original(text)

    b.send = spy
    client = RpcChannel(a, echo_handler)
    server = RpcChannel(b, echo_handler)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    assert await client.call("echo", {"events": 50}) == {"events": 50}  # no sink: quiet
    assert sent == ["response"]
    seen = []

    async def sink(event):
        seen.append(event)

    assert await client.call("echo", {"events": 3}, on_event=sink) == {"events": 3}
    assert seen == [{"n": 0}, {"n": 1}, {"n": 2}]


async def test_requests_beyond_the_in_flight_limit_get_busy_and_nothing_piles_up(nursery):
    a, b = pair()
    server = RpcChannel(b, echo_handler, max_in_flight=2)
    await nursery.start(server.serve)
    for i in range(5):
        await a.tx.send(json.dumps({"type": "request", "id": f"h{i}", "method": "hang"}))
    replies = [json.loads(await a.rx.receive()) for _ in range(3)]
    assert [r["id"] for r in replies] == ["h2", "h3", "h4"]
    assert {r["error"]["code"] for r in replies} == {"busy"}
    assert len(server._incoming) == 2
    server.max_in_flight = 3  # the owner raises it once the peer is trusted
    await a.tx.send(
        json.dumps({"type": "request", "id": "e", "method": "echo", "params": {"v": 1}})
    )
    assert json.loads(await a.rx.receive())["result"] == {"v": 1}


async def test_a_peer_that_never_reads_stalls_only_its_own_socket(nursery):
    """Pings and errors are answered through the bounded outbox: when the peer stops reading,
    the read loop stops once the outbox is full (backpressure on that peer only) instead of
    spawning a task or holding a reply per frame."""
    a_tx, b_rx = trio.open_memory_channel(5000)
    b_tx, a_rx = trio.open_memory_channel(0)  # nobody ever reads what the server sends
    server = RpcChannel(MemoryTransport(b_tx, b_rx), echo_handler, heartbeat=math.inf)
    await nursery.start(server.serve)
    for _ in range(3000):
        a_tx.send_nowait('{"type":"ping"}')
    await trio.testing.wait_all_tasks_blocked()
    read = 3000 - b_rx.statistics().current_buffer_used
    assert read <= OUTBOX_FRAMES + 3  # the outbox, one in the writer's hands, one being read


async def test_abort_closes_with_a_code_without_waiting(nursery):
    a, b = pair()
    server = RpcChannel(b, echo_handler)
    await nursery.start(server.serve)
    server.abort(1008, "enroll or authenticate within 5s of connecting")
    with trio.fail_after(5):
        assert await server.wait_closed() == "enroll or authenticate within 5s of connecting"
    await trio.testing.wait_all_tasks_blocked()
    assert b.closed_with == (1008, "enroll or authenticate within 5s of connecting")


async def test_an_untrusted_peer_past_its_frame_budget_is_closed(nursery):
    a, b = pair()
    server = RpcChannel(b, echo_handler)
    server.frame_budget = 3
    await nursery.start(server.serve)
    for _ in range(3):
        await a.tx.send('{"type":"ping"}')
        assert json.loads(await a.rx.receive()) == {"type": "pong"}
    await a.tx.send('{"type":"ping"}')
    with trio.fail_after(5):
        reason = await server.wait_closed()
    assert "too many frames" in reason
    await trio.testing.wait_all_tasks_blocked()
    assert b.closed_with[0] == 1008


async def test_events_for_a_caller_that_does_not_read_are_dropped_and_counted(nursery):
    async def chatty(call):
        for i in range(50):
            await call.emit({"kind": "log", "line": f"line {i}"})
        return "done"

    a_tx, b_rx = trio.open_memory_channel(10)
    b_tx, a_rx = trio.open_memory_channel(0)  # the caller reads nothing until the end
    server = RpcChannel(MemoryTransport(b_tx, b_rx), chatty, drop_events=True)
    server.outbox = Outbox(max_event_bytes=400)  # room for a few events only
    await nursery.start(server.serve)
    await a_tx.send('{"type":"request","id":"r","method":"chatty","params":{}}')
    await trio.testing.wait_all_tasks_blocked()  # the handler ran to its end without waiting
    frames_ = []
    with trio.fail_after(5):
        while not frames_ or frames_[-1]["type"] != "response":
            frames_.append(json.loads(await a_rx.receive()))
    lines = [f for f in frames_ if f.get("event", {}).get("kind") == "log"]
    dropped = [f["event"]["count"] for f in frames_ if f.get("event", {}).get("kind") == "dropped"]
    assert frames_[-1]["result"] == "done"
    assert sum(dropped) > 0 and len(lines) + sum(dropped) == 50
    assert frames_[-2]["event"]["kind"] == "dropped"  # told before the answer


async def test_without_drop_events_an_emit_waits_for_room(nursery):
    sent = []

    async def chatty(call):
        for i in range(20):
            await call.emit({"kind": "log", "line": f"line {i}"})
            sent.append(i)
        return "done"

    a_tx, b_rx = trio.open_memory_channel(10)
    b_tx, a_rx = trio.open_memory_channel(0)
    server = RpcChannel(MemoryTransport(b_tx, b_rx), chatty)
    server.outbox = Outbox(max_event_bytes=400)
    await nursery.start(server.serve)
    await a_tx.send('{"type":"request","id":"r","method":"chatty","params":{}}')
    await trio.testing.wait_all_tasks_blocked()
    assert len(sent) < 20  # held back, not dropped
    received = []
    with trio.fail_after(5):
        while not received or received[-1]["type"] != "response":
            received.append(json.loads(await a_rx.receive()))
    assert len([f for f in received if f["type"] == "stream"]) == 20 and len(sent) == 20


async def test_a_cancelled_call_can_wait_for_the_peer_to_let_go(nursery, autojump_clock):
    cleaned = []

    async def slow_cleanup(call):
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(3)  # e.g. a command's process group being killed
                cleaned.append(True)

    a, b = pair()
    client, server = RpcChannel(a, echo_handler), RpcChannel(b, slow_cleanup)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    with trio.move_on_after(1):
        await client.call("slow", timeout=None, settle=30)
    assert cleaned == [True]  # the call returned only once the peer had let go


async def test_close_callbacks_run_at_once_whatever_the_tasks_are_doing(nursery):
    a, b = pair()
    server = RpcChannel(b, echo_handler)
    seen = []
    server.on_close(seen.append)
    server.on_close(lambda reason: 1 / 0)  # a broken owner does not stop the others
    server.on_close(lambda reason: seen.append("second"))
    await nursery.start(server.serve)
    server.abort(1008, "gone")
    assert seen == ["gone", "second"]


async def test_a_handler_stopped_from_its_own_side_answers_why(nursery):
    """A worker's second signal stops a running dispatch through the call itself (no cancel
    scope of its own per dispatch): the caller gets the reason, not ``cancelled``."""
    a, b = pair()
    calls = []

    async def handler(call):
        calls.append(call)
        await trio.sleep_forever()

    client = RpcChannel(a, echo_handler, heartbeat=math.inf)
    server = RpcChannel(b, handler, heartbeat=math.inf)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    async with trio.open_nursery() as inner:
        failures = []

        async def call() -> None:
            try:
                await client.call("work", {}, timeout=None)
            except SwampError as exc:
                failures.append(exc)

        inner.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        calls[0].stop(WorkerStopped("a second signal during the drain stopped it"))
    [failure] = failures
    assert isinstance(failure, WorkerStopped) and "second signal" in failure.message
    assert not server.closed and server._incoming == {}


class Gated(MemoryTransport):
    """A socket whose first writes wait for the test to open it (a write still going out)."""

    def __init__(self, send_channel, receive_channel):
        super().__init__(send_channel, receive_channel)
        self.open = trio.Event()

    async def send(self, text):
        await self.open.wait()
        await super().send(text)


async def writing_frame_0(nursery):
    """A channel whose writer is busy sending frame 0 (the socket's far end, to read from)."""
    a_tx, b_rx = trio.open_memory_channel(1000)
    b_tx, a_rx = trio.open_memory_channel(1000)
    socket = Gated(a_tx, a_rx)
    channel = RpcChannel(socket, echo_handler, heartbeat=math.inf)
    await nursery.start(channel.serve)
    assert channel._offer(frames.Response("0", {"n": 0}))
    await trio.testing.wait_all_tasks_blocked()
    return socket, channel, b_rx


async def test_frames_that_queue_up_during_a_write_go_out_together_in_order(nursery):
    socket, channel, far_end = await writing_frame_0(nursery)
    for n in range(1, 100):
        assert channel._offer(frames.Response(str(n), {"n": n}))
    socket.open.set()
    got = [json.loads(await far_end.receive())["result"]["n"] for _ in range(100)]
    assert got == list(range(100))
    assert socket.writes == [64, 35]  # after the lone frame 0: at most 64 frames a write


async def test_a_write_of_several_frames_stays_near_its_byte_bound(nursery):
    socket, channel, far_end = await writing_frame_0(nursery)
    big = "x" * 100_000
    for n in range(1, 10):
        assert channel._offer(frames.Response(str(n), {"n": n, "pad": big}))
    socket.open.set()
    for _ in range(10):
        await far_end.receive()
    assert sum(socket.writes) == 9 and max(socket.writes) <= 3  # 256 KiB and one frame more


async def test_a_handler_tells_its_callers_cancel_from_its_socket_going(nursery, autojump_clock):
    """Cancelled by a cancel frame, ``cancel_asked``; cancelled because the socket closed,
    not — however the two arrive (a peer's step outlives the one, not the other)."""
    seen: list[tuple[bool, bool]] = []

    async def handler(call):
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            seen.append((call.cancel_asked, call.channel.closed))
            raise

    a, b = pair()
    client, server = RpcChannel(a, echo_handler), RpcChannel(b, handler)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    with pytest.raises(CallTimeout):
        await client.call("hang", timeout=1)  # (a timeout sends the cancel frame)
    await trio.testing.wait_all_tasks_blocked()
    assert seen == [(True, False)] and server._cancel_asked == set()  # (forgotten)

    async def call_then_close() -> None:
        with pytest.raises(ChannelClosed):
            await client.call("hang", timeout=None)

    nursery.start_soon(call_then_close)
    await trio.testing.wait_all_tasks_blocked()
    await client.close()
    await trio.testing.wait_all_tasks_blocked()
    assert seen[1:] == [(False, True)]
