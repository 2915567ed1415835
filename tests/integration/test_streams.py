"""Streams never block liveness: a client that stops reading, an orchestrator that stops."""

import signal

import pytest
import trio

from swamp.repo import Repo
from tests.integration.conftest import wait_until
from tests.integration.hostile import RawSocket

pytestmark = pytest.mark.integration

LINES = 100_000


async def test_a_stalled_client_costs_it_lines_not_the_worker_its_connection(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    # the client asks for 100,000 lines and then reads nothing at all (a pager left open)
    client = await RawSocket.open(cluster.url, headers=[("authorization", f"Bearer {credential}")])
    await client.send(
        {
            "type": "request",
            "id": "run",
            "method": "model.method.run",
            "params": {
                "model": "command/shell",
                "method": "run",
                # 100,000 lines of 200 characters: more than an orchestrator holds for a client
                "args": {"command": f"yes {'x' * 200} | head -n {LINES}"},
                "placement": {"target": "w1"},
            },
        }
    )
    # the worker streams them all and finishes: the client's stall never reached it
    finished = await trio.to_thread.run_sync(
        lambda: worker.wait_for(lambda e: e.get("event") == "dispatch_finished", timeout=120)
    )
    assert finished["status"] == "succeeded"
    lease = await trio.to_thread.run_sync(
        lambda: wait_until(
            lambda: [
                r
                for r in cluster.query('modelType == "swamp/step-lease"')
                if r["attributes"]["state"] == "completed"
            ],
            what="the lease to complete",
        )
    )
    assert lease[0]["attributes"]["workerName"] == "w1"
    assert [(w["name"], w["status"]) for w in cluster.workers()] == [("w1", "idle")]
    assert not any(e.get("event") == "disconnected" for e in worker.events())
    # when the client reads at last, it is told what it missed, then gets the result
    lines, dropped, result = 0, 0, None
    with trio.fail_after(60):
        while result is None:
            frame = await client.next_frame()
            assert frame is not None, client.closed
            if frame.get("type") == "stream" and frame["event"].get("kind") == "log":
                lines += 1
            elif frame.get("type") == "stream" and frame["event"].get("kind") == "dropped":
                dropped += frame["event"]["count"]
            elif frame.get("type") in ("response", "error") and frame.get("id") == "run":
                assert frame["type"] == "response", frame
                result = frame["result"]
    await client.aclose()
    assert result["status"] == "succeeded"
    assert dropped > 0 and lines + dropped == LINES


def test_a_stopped_orchestrator_is_noticed_by_a_streaming_worker(cluster):
    serve = cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))
    run = cluster.spawn(
        "model",
        "method",
        "run",
        "command/shell",
        "run",
        "--arg",
        "command=while true; do echo tick; done",
        "--target",
        "w1",
        "--server",
        cluster.url,
        "--json",
    )
    run.wait_for(lambda e: e.get("event", {}).get("line") == "tick")
    mark = worker.mark()
    serve.signal(signal.SIGSTOP)  # a frozen orchestrator, while the worker is busy streaming
    try:
        # heartbeat 1 s, three missed: the worker gives up on it within seconds, not never
        gone = worker.wait_for(lambda e: e.get("event") == "disconnected", start=mark, timeout=20)
        assert "no heartbeat" in gone["reason"]
    finally:
        serve.signal(signal.SIGCONT)
    back = worker.wait_for(
        lambda e: e.get("event") == "enrolled" and e.get("reconnect"), start=mark, timeout=60
    )
    assert back["workerName"] == "w1"
    run.stop()


def test_a_cli_whose_output_is_not_read_keeps_its_connection_and_says_what_it_dropped(cluster):
    import subprocess
    import sys
    import threading

    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))
    # `swamp model method run … | less` with the pager never scrolled: nobody reads stdout
    cli = subprocess.Popen(
        [sys.executable, "-m", "swamp", "model", "method", "run", "command/shell", "run",
         "--arg", f"command=seq {LINES}", "--target", "w1", "--server", cluster.url],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        finished = worker.wait_for(lambda e: e.get("event") == "dispatch_finished", timeout=120)
        assert finished["status"] == "succeeded"
        # the CLI says so the moment it starts dropping (its stderr is read, its stdout not)
        said: list[str] = []

        def until_dropping() -> None:
            for raw in iter(cli.stderr.readline, b""):
                said.append(raw.decode())
                if "dropping lines" in said[-1]:
                    return

        reader = threading.Thread(target=until_dropping, daemon=True)
        reader.start()
        reader.join(60)
        assert any("not being read fast enough: dropping lines" in line for line in said)
        out, rest = cli.communicate(timeout=60)  # the pager scrolls at last
    finally:
        cli.kill()
    err = "".join(said) + rest.decode()
    assert cli.returncode == 0, err
    shown = out.decode().splitlines()
    notes = [line for line in err.splitlines() if "dropped" in line]
    assert len(notes) == 1 and "not being read" in notes[0]
    dropped = int(notes[0].split()[1])
    assert dropped > 0 and len(shown) + dropped == LINES
    assert "succeeded on w1" in err
    assert not any(e.get("event") == "disconnected" for e in worker.events())
