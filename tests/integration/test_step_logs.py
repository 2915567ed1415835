"""Step logs on real processes: a step printing a million lines, every one of them readable
afterwards and followed live from a second process, while the run record stays small; an
ad-hoc run's output by its dispatch id; what a worker socket may not read."""

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import trio

from tests.integration.conftest import TIMEOUT
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration
LINES = 1_000_000
SLOW = 900  # seconds: a million lines through the whole path on a shared 2-core machine


class Lines:
    """A child's stdout read in a thread: the lines counted, the first and last few kept (a
    million of them are not held), and an event at the first."""

    def __init__(self, stream) -> None:
        self.count = 0
        self.head: list[str] = []
        self.tail: list[str] = []
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            self.count += 1
            if len(self.head) < 5:
                self.head.append(line)
            self.tail = [*self.tail[-4:], line]
            self.first.set()
        self.first.set()


class _OneLine:
    """A stream's first line only: what is behind it stays in the pipe."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def __iter__(self):
        yield self.stream.readline().decode()


def _popen(cluster, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swamp", *args],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=open(cluster.tmp / f"{args[0]}-{len(args)}.err", "w"),
        text=True,
        cwd=cluster.tmp,
    )


def _shell_workflow(
    cluster, name: str, step: str, placement: str, model: str, command: str
) -> None:
    """workflows/NAME.toml: one job, one ``command/shell`` step placed by ``placement``."""
    (cluster.repo / "workflows" / f"{name}.toml").write_text(
        textwrap.dedent(
            f"""\
            name = "{name}"
            [[jobs]]
            name = "main"
            [[jobs.steps]]
            name = "{step}"
            {placement}
            [jobs.steps.task]
            type = "model_method"
            modelType = "command/shell"
            modelName = "{model}"
            methodName = "run"
            inputs = {{ command = {json.dumps(command)} }}
            """
        )
    )


def test_a_million_lines_are_all_kept_followed_live_and_the_run_record_stays_small(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("printer"), "--label", "role=printer")
    gate = cluster.tmp / "gate"
    os.mkfifo(gate)
    _shell_workflow(
        cluster,
        "big",
        "print",
        'labels = { role = "printer" }',
        "printer",
        f"seq {LINES}; read go < {gate}; echo done",
    )
    started = time.monotonic()
    runner = _popen(cluster, "workflow", "run", "big", "--json")
    run_id = None
    for raw in runner.stdout:  # the run's first event names it
        event = json.loads(raw).get("event", {})
        if event.get("runId"):
            run_id = event["runId"]
            break
    assert run_id, "the run never started"
    drained = Lines(runner.stdout)  # the rest of its events, read so it never blocks

    # a second process follows the step while it prints; the step ends only after that
    follower = _popen(cluster, "logs", f"{run_id[:8]}/print", "--follow")
    followed = Lines(follower.stdout)
    assert followed.first.wait(SLOW) and followed.head[:1] == ["1"], followed.head
    opened = threading.Thread(target=lambda: gate.write_text("go\n"), daemon=True)
    opened.start()  # the step reads its gate once it has printed everything
    opened.join(SLOW)
    assert not opened.is_alive(), "the step never reached its gate"
    assert follower.wait(SLOW) == 0
    followed.thread.join(TIMEOUT)
    assert runner.wait(SLOW) == 0
    drained.thread.join(TIMEOUT)
    took = time.monotonic() - started
    assert followed.count == LINES + 1, followed.count
    assert followed.tail[-2:] == [str(LINES), "done"]

    # afterwards, straight on the repo: all of it, in order
    began = time.monotonic()
    reader = _popen(cluster, "logs", run_id[:8])
    read = Lines(reader.stdout)
    assert reader.wait(SLOW) == 0
    read.thread.join(TIMEOUT)
    read_took = time.monotonic() - began
    assert read.count == LINES + 1
    assert read.head[:3] == ["1", "2", "3"] and read.tail[-2:] == [str(LINES), "done"]

    # the run record holds no output but its short tail: it stays small
    [record] = cluster.query('modelType == "swamp/workflow-run"')
    size = len(json.dumps(record["attributes"]))
    assert size < 8 * 1024, size
    db = sqlite3.connect(f"file:{cluster.repo / '.swamp' / 'swamp.db'}?mode=ro", uri=True)
    chunks, stored = db.execute(
        "SELECT COUNT(*), SUM(LENGTH(body) + LENGTH(streams)) FROM step_log_chunk"
    ).fetchone()
    db.close()
    # many lines to a row, never a row per line: a chunk is sealed when full (4,096 lines) or
    # when a batch is written (every 0.2 s), so how many rows depends on the machine's speed,
    # but a row per line would be a million: a hundred lines a row at least holds on any
    assert chunks <= LINES / 100, f"{chunks} rows for {LINES} lines"
    print(
        f"\n{LINES} lines: run {took:.1f}s (followed live), read back {read_took:.1f}s, "
        f"{chunks} chunks, {stored / 1e6:.1f} MB stored, run record {size} bytes"
    )


def test_an_ad_hoc_run_is_read_by_its_dispatch_id_on_both_routes(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    code, lines = cluster.run(
        "command/shell", "run", "--target", "w1", "--arg", "command=printf 'a\\033[2Jb\\nsecond\\n'"
    )
    assert code == 0
    dispatch = next(line["result"]["logId"] for line in lines if "result" in line)
    for route in ((), ("--server", cluster.url)):
        shown = cluster.cli("logs", dispatch[:20], *route)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines() == ["a\\x1b[2Jb", "second"]  # escaped, never obeyed
        as_json = cluster.cli("logs", dispatch, "--json", *route)
        objects = [json.loads(line) for line in as_json.stdout.splitlines()]
        assert [o["line"] for o in objects] == ["a\x1b[2Jb", "second"]
        assert {o["stream"] for o in objects} == {"stdout"} and objects[0]["step"] is None
    # a run in the orchestrator's own process (no placement) has no dispatch id: its log id
    code, lines = cluster.run("swamp/echo", "echo", "--arg", "message=in the orchestrator")
    here = next(line["result"]["logId"] for line in lines if "result" in line)
    assert cluster.cli("logs", here).stdout == "in the orchestrator\n"
    missing = cluster.cli("logs", "abcdef12")
    assert missing.returncode != 0 and "no workflow run or dispatch" in missing.stderr
    bad = cluster.cli("logs", "not-an-id")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_a_run_straight_on_the_repo_keeps_its_lines_too(cluster):
    ran = cluster.cli(
        "model", "method", "run", "swamp/echo", "echo", "--arg", "message=hi", "--json"
    )
    assert ran.returncode == 0, ran.stderr
    log_id = json.loads(ran.stdout.splitlines()[-1])["result"]["logId"]
    assert cluster.cli("logs", log_id).stdout == "hi\n"


def test_a_worker_socket_cannot_read_logs(cluster):
    cluster.serve()
    token = cluster.mint("raw")

    async def main() -> dict:
        worker = await RawSocket.open(cluster.url)
        try:
            enrolled = await worker.request("worker.enroll", enroll_params(token))
            assert enrolled["type"] == "response", enrolled
            return await worker.request("logs.read", {"ref": "abcd"})
        finally:
            await worker.aclose()

    reply = trio.run(main)
    assert reply["type"] == "error" and reply["error"]["code"] == "forbidden", reply


def test_follow_without_a_live_orchestrator_prints_what_is_stored_and_says_so(cluster):
    serve = cluster.serve()
    cluster.worker(cluster.mint("w1"))
    gate = cluster.tmp / "gate"
    os.mkfifo(gate)
    _shell_workflow(
        cluster, "stuck", "wait", 'target = "w1"', "waiter", f"echo first; read go < {gate}"
    )
    runner = cluster.spawn("workflow", "run", "stuck", "--json")
    run_id = runner.wait_for(lambda e: e.get("event", {}).get("line") == "first")["event"]["runId"]
    follower = _popen(cluster, "logs", run_id, "--follow")
    followed = Lines(follower.stdout)
    assert followed.first.wait(TIMEOUT) and followed.head == ["wait │ first"]  # stored
    serve.signal(9)  # the orchestrator dies with the run in it
    assert follower.wait(TIMEOUT) != 0  # its connection is gone
    shown = cluster.cli("logs", run_id, "--follow")  # no orchestrator: straight on the repo
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["wait │ first"]  # a run's: after its step's name
    assert "is not live" in shown.stderr


def test_a_reader_that_stops_reading_never_slows_the_step(cluster):
    """A follower whose output nobody reads (a paused pager) stops asking for pages; the step
    prints on and ends, and everything is stored."""
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    gate = cluster.tmp / "gate"
    os.mkfifo(gate)
    lines = 200_000  # far more than a pipe holds
    _shell_workflow(
        cluster,
        "chatty",
        "talk",
        'target = "w1"',
        "talker",
        f"echo ready; read go < {gate}; seq {lines}",
    )
    runner = cluster.spawn("workflow", "run", "chatty", "--json")
    run_id = runner.wait_for(lambda e: e.get("event", {}).get("what") == "started")["event"]
    run_id = run_id["runId"]
    stalled = subprocess.Popen(  # its stdout is a pipe nobody reads
        [sys.executable, "-m", "swamp", "logs", run_id, "--follow"],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=cluster.tmp,
    )
    try:
        first = Lines(_OneLine(stalled.stdout))  # its first line, then it is read no more
        assert first.first.wait(TIMEOUT) and first.head == ["talk │ ready"]
        gate.write_text("go\n")  # now the step prints, the follower following
        status = runner.wait_exit(SLOW)
        said = "\n".join(runner.lines[-10:]) + runner.log.read_text()[-2000:]
        assert status == 0, said
        assert stalled.poll() is None  # still waiting to write what it was given
        shown = cluster.cli("logs", f"{run_id}/talk", timeout=SLOW)
        assert shown.stdout.splitlines() == ["ready", *(str(n) for n in range(1, lines + 1))]
    finally:
        stalled.kill()
        stalled.wait()


def test_past_the_serve_cap_the_oldest_part_goes_and_a_line_says_so(cluster):
    cluster.serve("--step-log-cap", "512KiB")
    cluster.worker(cluster.mint("w1"))
    code, lines = cluster.run(
        "command/shell", "run", "--target", "w1", "--arg", "command=seq 300000"
    )
    assert code == 0  # about 2 MB printed: four times the cap
    dispatch = next(line["result"]["logId"] for line in lines if "result" in line)
    shown = cluster.cli("logs", dispatch, "--server", cluster.url).stdout.splitlines()
    marker, *kept = shown
    assert marker.startswith("… ") and "dropped here" in marker and "512.0 KiB" in marker
    dropped = int(marker.split()[1].replace(",", ""))
    assert kept == [str(n) for n in range(dropped + 1, 300001)]  # the newest, whole
    assert 300000 - dropped < 512 * 1024 / 7  # within the cap
