"""Bounded before trust: what anyone who can reach the port can make the orchestrator hold.

Before, a socket never had to enroll: pinging sockets lived forever and a few hundred exhausted
file descriptors, and 100,000 requests pipelined before any auth took the orchestrator from
144 MB to 789 MB. These attacks are repeated here against a real ``swamp serve``.
"""

import json
import resource

import pytest
import trio
from wsproto.events import CloseConnection, Message
from wsproto.utilities import LocalProtocolError

from swamp.repo import Repo
from tests.integration.hostile import RawSocket, Refused, enroll_params, rss_bytes

pytestmark = pytest.mark.integration

SOCKETS = 1000


@pytest.fixture
def many_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, 4 * SOCKETS))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_sockets_that_never_enroll_are_closed_and_real_workers_still_enroll(
    cluster, many_files
):
    cluster.serve()
    token = cluster.mint("real")
    opened, closed = [], []
    all_open = trio.Event()

    async def squatter(i: int) -> None:
        try:
            ws = await RawSocket.open(cluster.url)
        except (Refused, OSError, trio.BrokenResourceError):
            # refused, or reset mid-upgrade: evicted before it was even open (how many are
            # depends on how fast the machine lets the server read each head)
            closed.append((i, "refused"))
            return
        opened.append(i)
        if len(opened) + len(closed) == SOCKETS:
            all_open.set()
        try:
            async with trio.open_nursery() as nursery:

                async def keep_pinging():
                    while True:  # the attack: look alive, never enroll
                        try:
                            await ws.send({"type": "ping"})
                        except LocalProtocolError:
                            return  # the server's close arrived: it is closing this socket
                        await trio.sleep(0.5)

                nursery.start_soon(keep_pinging)
                code, reason = await ws.wait_closed()
                closed.append((i, code, reason))
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            closed.append((i, "broken"))
        finally:
            await ws.aclose()

    # each is closed by its own deadline (the reason says so); the bound is only a safety net
    # for a flood that would otherwise live for ever
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for i in range(SOCKETS):
                nursery.start_soon(squatter, i)
            # while the flood holds its sockets, a real worker process enrolls
            worker = await trio.to_thread.run_sync(lambda: cluster.worker(token))
            assert worker.p.poll() is None
    assert len(closed) == SOCKETS and len(opened) > 0
    reasons = {c[2] for c in closed if len(c) == 3}
    assert any("enroll or authenticate within" in r for r in reasons), reasons
    # the server is fine: the real worker is listed and a dispatch reaches it
    assert [w["name"] for w in cluster.workers()] == ["real"]
    code, _ = cluster.run("swamp/echo", "echo", "--target", "real")
    assert code == 0


async def test_requests_pipelined_before_auth_do_not_grow_memory(cluster):
    serve = cluster.serve()
    pid = serve.p.pid
    before = rss_bytes(pid)
    ws = await RawSocket.open(cluster.url)
    frame = (
        '{"type":"request","id":"%d","method":"worker.list","params":{"pad":"' + "x" * 64 + '"}}'
    )
    sent = 0
    peak = before
    with trio.move_on_after(30):
        try:
            for i in range(100_000):
                await ws.send(frame % i)  # never reading a single reply
                sent += 1
                if i % 5000 == 0:
                    peak = max(peak, rss_bytes(pid))
        except trio.BrokenResourceError:
            pass  # cut off while still sending (how far it got is the machine's speed)
    peak = max(peak, rss_bytes(pid))
    with trio.fail_after(30):
        code, reason = await ws.wait_closed()
    await ws.aclose()
    after = rss_bytes(pid)
    print(f"sent {sent} frames; rss before {before >> 20} MiB, peak {peak >> 20} MiB")
    assert peak - before < 50 * 2**20, (before, peak, sent)
    assert after - before < 50 * 2**20, (before, after)
    assert code in (1008, 1006), (code, reason)
    # still serving
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []


async def test_a_worker_cannot_stretch_its_own_silence_deadline(cluster):
    """The interval travels orchestrator → worker, in a pong. A worker that sends the
    orchestrator a pong asking for an hour, then goes quiet, is still dropped after three of
    its heartbeats — and with it the fence before its steps may run elsewhere stays short."""
    serve = cluster.serve()
    token = cluster.mint("stretch")  # first: a socket has only seconds to enroll
    worker = await RawSocket.open(cluster.url)
    reply = await worker.request("worker.enroll", enroll_params(token))
    assert reply["type"] == "response" and reply["result"]["heartbeatSeconds"] == 1
    await worker.send({"type": "pong", "heartbeat": 3600})
    closed = None
    # three heartbeats, not an hour: the bound is only a loaded machine's margin
    with trio.fail_after(30):
        while closed is None:  # read, never answer: the sweeper's pings go unanswered
            data = await worker.stream.receive_some(65536)
            if not data:
                break
            worker.ws.receive_data(data)
            closed = next((e for e in worker.ws.events() if isinstance(e, CloseConnection)), None)
    assert closed is None or closed.code == 4000
    assert "no heartbeat from worker stretch" in serve.log.read_text()


FLOOD_SOCKETS = 128
FLOOD_MESSAGE = 4 * 1024 * 1024 - 1


async def _send_big_message(
    url: str, *, headers=(), enroll: str | None = None
) -> tuple[int, str] | dict:
    """Open a socket (enrolled with the token ``enroll``, if given) and send one text message
    of :data:`FLOOD_MESSAGE` bytes, in pieces as a socket takes them; what the server did about
    it: its close (code, reason) or its reply."""
    ws = await RawSocket.open(url, headers=list(headers))
    if enroll is not None:
        assert (await ws.request("worker.enroll", enroll_params(enroll)))["type"] == "response"
    frame = ws.ws.send(
        Message(data='{"type":"request","id":"1","method":"worker.list","params":{"p":"'
                + "x" * (FLOOD_MESSAGE - 68) + '"}}')
    )  # fmt: skip
    try:
        try:
            for at in range(0, len(frame), 65536):
                await ws._send_bytes(frame[at : at + 65536])
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # closed on us mid-message: the close frame says why
        return await _outcome(ws)
    finally:
        await ws.aclose()


async def _outcome(ws: RawSocket) -> tuple[int, str] | dict:
    """The server's reply to request "1", or its close (pings left unanswered: this socket
    may still be inside its message)."""
    while True:
        for event in ws.ws.events():
            if isinstance(event, Message):
                frame = json.loads(event.data)
                if frame.get("id") == "1":
                    return frame
            elif isinstance(event, CloseConnection):
                return (event.code, event.reason)
        try:
            data = await ws.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            return (1006, "connection lost")
        ws.ws.receive_data(data)


async def test_untrusted_sockets_cannot_make_the_orchestrator_buffer_large_messages(cluster):
    """Before, a socket that had neither enrolled nor authenticated could still send a 4 MB
    message, buffered whole: waves of 128 such sockets took the orchestrator from 43 MB to 3 GB
    of resident memory, still 3 GB after they closed. Until it has a role a socket's messages
    are small; a larger one closes it (1009, message too big) after the first 64 KiB."""
    serve = cluster.serve("--heartbeat", "10s")  # a loaded machine's margin: no silence drops
    pid = serve.p.pid
    before = rss_bytes(pid)
    peak = before
    done = trio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes(pid))
            with trio.move_on_after(0.05):
                await done.wait()

    outcomes = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        async with trio.open_nursery() as flood:
            for _ in range(FLOOD_SOCKETS):
                flood.start_soon(lambda: _append(outcomes, _send_big_message(cluster.url)))
        done.set()
    after = rss_bytes(pid)
    print(f"rss before {before >> 20} MiB, peak {peak >> 20} MiB, after {after >> 20} MiB")
    assert len(outcomes) == FLOOD_SOCKETS
    # each was closed: the message too big (1009), or, on a busy machine, its time to enroll
    # up (1008) first; what matters is what the orchestrator held meanwhile
    assert all(isinstance(o, tuple) and o[0] in (1009, 1008, 1006) for o in outcomes), outcomes
    assert peak - before < 100 * 2**20, (before, peak)  # 128 × 4 MiB = 512 MiB if buffered
    assert after - before < 40 * 2**20, (before, after)
    # one such socket alone is closed for its message, at once
    alone = await _send_big_message(cluster.url)
    assert isinstance(alone, tuple) and alone[0] == 1009, alone
    # the control: a socket with an admin credential may send the same message; it is read
    # whole and answered (here: the call's parameters are refused, the socket stays open)
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    reply = await _send_big_message(
        cluster.url, headers=[("authorization", f"Bearer {credential}")]
    )
    assert isinstance(reply, dict) and reply.get("id") == "1", reply
    # and so may an enrolled worker
    reply = await _send_big_message(cluster.url, enroll=cluster.mint("big"))
    assert isinstance(reply, dict) and reply["error"]["code"] == "forbidden", reply
    # a real worker still enrolls, the server still serves
    cluster.worker(cluster.mint("after"))
    assert [w["name"] for w in cluster.workers()] == ["after"]


async def _append(out: list, awaitable) -> None:
    out.append(await awaitable)


def _tiny_frames(count: int) -> bytes:
    """One text message in ``count`` masked 2-byte frames (never the last: it is not finished)."""
    key = b"\x00\x00\x00\x00"
    first = bytes((0x01, 0x82)) + key + b"ab"
    more = bytes((0x00, 0x82)) + key + b"cd"
    return first + more * (count - 1)


async def test_a_message_in_thousands_of_tiny_frames_is_refused_before_trust(cluster):
    """128 sockets that had not enrolled each sent one message as 32,700 two-byte frames: the
    websocket library kept an object per piece (41 → 244 MB in two waves) and the event loop
    spent seconds on them (admin calls waited 11 s). Before trust a message is one frame."""
    serve = cluster.serve("--heartbeat", "10s")  # a loaded machine's margin: no silence drops
    pid = serve.p.pid
    before = rss_bytes(pid)
    blob = _tiny_frames(32_700)
    outcomes: list = []

    async def one() -> None:
        ws = await RawSocket.open(cluster.url)
        try:
            for at in range(0, len(blob), 65536):
                await ws._send_bytes(blob[at : at + 65536])
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        try:
            outcomes.append(await _outcome(ws))
        finally:
            await ws.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(FLOOD_SOCKETS):
            nursery.start_soon(one)
    after = rss_bytes(pid)
    print(f"rss before {before >> 20} MiB, after {after >> 20} MiB")
    assert len(outcomes) == FLOOD_SOCKETS
    codes = {int(o[0]) for o in outcomes}
    assert codes <= {1009, 1006}, outcomes
    assert any(o[0] == 1009 and "frame" in o[1] for o in outcomes), outcomes[:3]
    assert after - before < 40 * 2**20, (before, after)
    # the control: a message in two frames is refused the same way before trust, but an admin
    # socket may send one (a client that fragments is not refused once it is trusted)
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    ws = await RawSocket.open(cluster.url, headers=[("authorization", f"Bearer {credential}")])
    text = b'{"type":"request","id":"1","method":"worker.list","params":{}}'
    key = b"\x00\x00\x00\x00"
    split = bytes((0x01, 0x80 | 10)) + key + text[:10]
    split += bytes((0x80, 0x80 | (len(text) - 10))) + key + text[10:]
    await ws._send_bytes(split)
    reply = await _outcome(ws)
    await ws.aclose()
    assert isinstance(reply, dict) and reply["result"]["workers"] == [], reply


async def test_a_read_or_metrics_token_does_not_lift_the_limit_before_trust(cluster):
    """Any accepted credential used to lift the message limit at the upgrade: a scraper's
    metrics token could send 4 MB messages it can do nothing with (56 → 549 MB)."""
    scraper = cluster.cli_json("server", "token", "create", "scraper", "--scope", "metrics")
    cluster.serve()
    bearer = [("authorization", f"Bearer {scraper['token']}")]
    outcome = await _send_big_message(cluster.url, headers=bearer)
    assert isinstance(outcome, tuple) and outcome[0] == 1009, outcome


async def test_a_worker_sending_a_large_message_slowly_is_not_dropped_as_silent(cluster):
    """Silence was counted from the last whole message: a worker whose 4 MB answer took longer
    to arrive than three heartbeats was dropped while its bytes kept coming."""
    serve = cluster.serve("--heartbeat", "2s")
    token = cluster.mint("slow")
    ws = await RawSocket.open(cluster.url)
    assert (await ws.request("worker.enroll", enroll_params(token)))["type"] == "response"
    frame = ws.ws.send(
        Message(data='{"type":"request","id":"1","method":"worker.list","params":{"p":"'
                + "x" * (FLOOD_MESSAGE - 68) + '"}}')
    )  # fmt: skip
    pieces = range(0, len(frame), 65536)
    for at in pieces:  # 64 pieces a tenth of a second apart: longer than the silence window
        await ws._send_bytes(frame[at : at + 65536])
        await trio.sleep(0.1)
    reply = await _outcome(ws)
    await ws.aclose()
    assert isinstance(reply, dict) and reply["error"]["code"] == "forbidden", reply
    assert "no heartbeat from worker slow" not in serve.log.read_text()
