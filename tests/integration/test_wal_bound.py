"""A burst of large writes through the data plane of a real ``swamp serve``, from a worker
spoken by hand: the write-ahead log stays within a bound the whole time, where it used to take
the whole burst (hundreds of MiB) until a quiet spell."""

import os
import subprocess
import sys
import threading

import httpx
import pytest
import trio

from swamp.store.datastore import WAL_TRUNCATE_BYTES
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration

SIZE = 8 << 20  # each write
PER_DISPATCH = 8
DISPATCHES = 3  # 192 MiB in all


class Peak:
    """The largest size a file reaches while it is watched (a measurement, not a wait)."""

    def __init__(self, path) -> None:
        self.path, self.size = path, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.001):
            try:
                self.size = max(self.size, os.stat(self.path).st_size)
            except FileNotFoundError:
                pass

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.size


async def test_a_burst_of_large_writes_keeps_the_wal_within_its_bound(cluster):
    serve = cluster.serve()
    ws = await RawSocket.open(cluster.url)
    assert "result" in await ws.request("worker.enroll", enroll_params(cluster.mint("w")))
    plane = cluster.url.replace("ws://", "http://") + "/data/resources"
    peak = Peak(cluster.repo / ".swamp" / "swamp.db-wal")
    body = os.urandom(SIZE)

    async def beat(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        while True:  # a live worker pings (it is dropped after 3 silent heartbeats)
            await ws.send({"type": "ping"})
            await trio.sleep(0.3)

    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=60) as http:
        await nursery.start(beat)
        for n in range(DISPATCHES):
            client = await trio.lowlevel.open_process(
                [sys.executable, "-m", "swamp", "model", "method", "run", "command/shell", "run",
                 "--arg", "command=true", "--target", "w", "--server", cluster.url],
                env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            while (frame := await ws.next_frame()) and frame.get("method") != "worker.dispatch":
                pass
            auth = {"authorization": f"Bearer {frame['params']['credential']}",
                    "content-type": "application/octet-stream"}  # fmt: skip
            for m in range(PER_DISPATCH):
                reply = await http.put(f"{plane}/result/blob-{n}-{m}", headers=auth, content=body)
                assert reply.status_code == 200, reply.text
            await ws.send(
                {"type": "response", "id": frame["id"], "result": {"status": "succeeded"}}
            )
            assert await client.wait() == 0
        nursery.cancel_scope.cancel()
    grown = peak.stop()
    written = cluster.query('modelType == "command/shell" && size > 0')
    assert len(written) == DISPATCHES * PER_DISPATCH  # all of it went in
    # a checkpoint starts at the write that passes the mark and truncates the log, with writes
    # held (retried) meanwhile: the log holds the mark and that write, not the burst
    assert grown <= WAL_TRUNCATE_BYTES + 2 * SIZE + (1 << 20), f"WAL peak {grown >> 20} MiB"
    assert 4 * grown < DISPATCHES * PER_DISPATCH * SIZE  # the control: the burst was far larger
    assert "Traceback" not in serve.log.read_text()
    await ws.aclose()
