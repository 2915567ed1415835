"""A worker that never reaches an orchestrator gives up after its connect timeout with exit
status 4 — not 1, which says "refused for good" and which the unit does not restart: a machine
that booted before its orchestrator was up must come back by itself."""

from __future__ import annotations

import io
import json
import socket

from swamp.domain.drain import EXIT_UNREACHABLE
from swamp.worker.agent import run_worker
from swamp.worker.config import WorkerConfig
from swamp.worker.events import Reporter


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when the block ends: nothing listens


async def test_no_orchestrator_for_the_whole_connect_timeout_exits_4(tmp_path):
    out = io.StringIO()
    config = WorkerConfig(
        url=f"ws://127.0.0.1:{_closed_port()}",
        token="w.0123",
        cache_dir=tmp_path,
        connect_timeout=1.5,
    )
    status = await run_worker(config, Reporter(json_lines=True, stream=out))
    assert status == EXIT_UNREACHABLE == 4
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    stopped = events[-1]
    assert stopped["event"] == "stopped" and stopped["exitCode"] == 4
    assert "could not enroll within 1.5s" in stopped["reason"]
    assert any(e["event"] == "retrying" for e in events)
