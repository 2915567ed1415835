"""A refused websocket upgrade is an answer, not a crash: a worker behind a proxy that says 503
(a load balancer during a deploy) keeps trying, on its first connect and mid-session."""

import pytest
import trio

pytestmark = pytest.mark.integration


class FlakyProxy:
    """A TCP proxy in front of the orchestrator that answers 503 while ``refusing``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.refusing = True
        self.refused = 0
        self._cut = trio.Event()
        self._refusal = trio.Event()

    async def next_refusal(self) -> None:
        await self._refusal.wait()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    def cut(self) -> None:
        """Drop every connection passing through (a deploy restarting the balancer)."""
        self._cut.set()
        self._cut = trio.Event()

    async def _handle(self, client: trio.SocketStream) -> None:
        if self.refusing:
            self.refused += 1
            self._refusal.set()
            self._refusal = trio.Event()
            await client.receive_some(65536)
            await client.send_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n"
            )
            await client.aclose()
            return
        upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        cut = self._cut
        async with trio.open_nursery() as nursery:

            async def pump(source, sink) -> None:
                try:
                    while data := await source.receive_some(65536):
                        await sink.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, client, upstream)
            nursery.start_soon(pump, upstream, client)
            await cut.wait()
            nursery.cancel_scope.cancel()
        await client.aclose()
        await upstream.aclose()


async def test_a_worker_behind_a_proxy_answering_503_enrolls_and_re_enrolls(cluster, nursery):
    cluster.serve()
    proxy = FlakyProxy(int(cluster.url.rsplit(":", 1)[1]))
    port = await nursery.start(proxy.serve)
    token = cluster.mint("w1")
    worker = cluster.spawn(
        "worker", "connect", f"ws://127.0.0.1:{port}", "--json",
        env={"SWAMP_WORKER_TOKEN": token},
    )  # fmt: skip
    # first connect: refused three times over (at once, then backing off), then let through
    with trio.fail_after(30):
        while proxy.refused < 3:
            await proxy.next_refusal()
    assert worker.p.poll() is None, "the worker died of a refused upgrade"
    # its own account of them (its output is read by a thread that may lag the proxy)
    await trio.to_thread.run_sync(
        lambda: worker.wait_for(lambda e: e.get("event") == "disconnected")
    )
    refusals = [e for e in worker.events() if e.get("event") == "disconnected"]
    assert refusals and all("HTTP 503" in e["reason"] for e in refusals)
    proxy.refusing = False
    enrolled = await trio.to_thread.run_sync(
        lambda: worker.wait_for(lambda e: e.get("event") == "enrolled", timeout=60)
    )
    assert enrolled["workerName"] == "w1"
    # mid-session: the balancer drops the connection and refuses for a while
    mark = worker.mark()
    proxy.refusing = True
    proxy.cut()
    with trio.fail_after(30):
        await proxy.next_refusal()  # it tried again at once, and was refused
        await proxy.next_refusal()  # and again, after backing off
    assert worker.p.poll() is None
    proxy.refusing = False
    again = await trio.to_thread.run_sync(
        lambda: worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark, timeout=60)
    )
    assert again["workerName"] == "w1" and again["reconnect"] is True
    assert not [e for e in worker.events() if e.get("event") == "stopped"]
    assert "Traceback" not in worker.log.read_text()
