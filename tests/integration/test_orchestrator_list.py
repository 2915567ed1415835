"""A worker given several orchestrators (``SWAMP_ORCHESTRATOR_URL=url1,url2``): it connects to
the first it can reach, moving down the list with its backoff, and works there."""

from __future__ import annotations

import socket


def _closed_port() -> int:
    """A port nothing listens on (bound and let go: connecting is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_worker_moves_down_its_list_to_an_orchestrator_it_can_reach(cluster):
    cluster.serve()
    away = f"ws://127.0.0.1:{_closed_port()}"
    worker = cluster.spawn(
        "worker",
        "connect",
        "--json",
        env={
            "SWAMP_WORKER_TOKEN": cluster.mint("w1"),
            "SWAMP_ORCHESTRATOR_URL": f"{away},{cluster.url}",
        },
    )
    enrolled = worker.wait_for(lambda e: e.get("event") == "enrolled")
    tried = [e["url"] for e in worker.events() if e.get("event") == "connecting"]
    assert tried[0] == away and tried[-1] == cluster.url, tried
    assert any(e.get("event") == "disconnected" for e in worker.events())  # the first: away
    code, lines = cluster.run(
        "swamp/echo", "echo", "--arg", "message=hi", "--target", enrolled["workerName"]
    )
    assert code == 0, lines
