"""The README's main job, as a user runs it: every section happened as it says, on real
processes, and nothing is left behind — after a full run or a Ctrl-C.

The verdicts are on what the processes and the orchestrator recorded (event lines in the order
a process printed them, records on the orchestrator's clock, exit statuses), never on how fast
this machine is.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.conftest import wait_until

pytestmark = pytest.mark.integration


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _index(events: list[dict], event: str, start: int = 0, **fields) -> int:
    """Where the first such line is, from ``start``; fails the test if there is none."""
    for i, e in enumerate(events[start:], start):
        if e.get("event") == event and all(e.get(k) == v for k, v in fields.items()):
            return i
    raise AssertionError(f"no {event} {fields} line after {start}: {events[start:]}")


def _left_behind(tmp: Path) -> list[str]:
    return sorted(
        p.name for p in tmp.iterdir() if p.name.startswith(("swamp-demo-", "swamp-worker-"))
    )


def test_the_demo_shows_each_section_on_real_processes_and_cleans_up(cluster):
    result = cluster.cli("demo", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "error" not in report
    members = {w["name"] for w in report["workers"]}
    assert len(members) == 2 and all(name.startswith("demo-") for name in members)
    assert all(w["labels"]["fleet"] == "demo" for w in report["workers"])

    # 2. the queued step: listed with no matching worker, then dispatched to the first worker
    queue = report["queue"]
    [demand] = queue["listing"]["summary"]
    assert (demand["waiting"], demand["connected"]) == (1, 0)
    assert queue["step"]["queued"] == "labels fleet=demo"
    assert queue["step"]["status"] == "succeeded"
    assert queue["step"]["worker"] == queue["worker"] and queue["worker"] in members
    assert queue["step"]["output"] == ["picked up from the queue"]
    episode = queue["episode"]
    assert episode["state"] == "dispatched"
    assert episode["dispatchId"] == queue["dispatchId"] == queue["step"]["dispatchId"]
    # on the orchestrator's clock: queued, then the worker enrolled, then the wait ended
    assert _at(episode["queuedAt"]) <= _at(queue["enrolledAt"]) <= _at(episode["endedAt"])
    # and in the worker's own lines: it enrolled, then the queued step was its first dispatch
    events = queue["workerEvents"]
    enrolled = _index(events, "enrolled")
    first = _index(events, "dispatch_started")
    assert enrolled < first and events[first]["dispatchId"] == queue["dispatchId"]

    # 4. placement: by target on each member, then by label on the one with the most slots
    runs = report["runs"]
    assert all(r["status"] == "succeeded" for r in runs), runs
    by_target = [r for r in runs if "target" in r["placement"]]
    assert {r["worker"] for r in by_target} >= members
    assert all(r["worker"] == r["placement"]["target"] for r in by_target)
    assert report["verify"]["passed"] == 2

    # 6. the fan-out: one step per member, each on its member
    fan_out = report["fanOut"]
    assert fan_out["status"] == "succeeded"
    assert sorted(s["worker"] for s in fan_out["steps"]) == sorted(members)
    assert all(s["name"] == f"uptime-{s['worker']}" for s in fan_out["steps"])
    assert all(s["status"] == "succeeded" for s in fan_out["steps"])

    # 7. the drain: after SIGTERM the worker started nothing, finished its step, exited 0
    drain = report["drain"]
    drained, after = drain["worker"], drain["events"][drain["signalledAt"] :]
    held = drain["heldStep"]
    assert held["worker"] == drained and held["status"] == "succeeded"
    assert held["output"] == ["finished"]
    draining = _index(after, "draining", reason="signal", running=1)
    finished = _index(after, "dispatch_finished", draining, dispatchId=held["dispatchId"])
    assert after[finished]["status"] == "succeeded"
    complete = _index(after, "drain_complete", finished)
    assert after[_index(after, "stopped", complete)]["exitCode"] == 0
    assert not [e for e in after if e["event"] == "dispatch_started"]
    assert drain["exitCode"] == 0
    # while it drained it had the most free slots, yet the new step went to another member
    listed = {w["name"]: w for w in drain["listedDraining"]}
    assert listed[drained]["status"] == "draining"

    def free(w: dict) -> int:
        return w["capacity"] - len(w.get("activeDispatchIds", []))

    assert all(free(listed[drained]) > free(w) for name, w in listed.items() if name != drained)
    during = drain["duringDrain"]
    assert during["status"] == "succeeded" and during["worker"] in members - {drained}
    assert drain["left"]["status"] == "disconnected"
    assert drain["left"]["disconnectReason"] == "drained (signal)"

    # 8. every process stopped cleanly; the temporary directory (repo, cache dirs) is gone
    assert set(report["exitCodes"]) == {"serve", *members}
    assert set(report["exitCodes"].values()) == {0}
    assert not Path(report["repo"]).exists()
    assert _left_behind(cluster.tmp / "tmp") == []


NUL = b"\0"


def _ours(tmp: Path) -> dict[int, str]:
    """Processes whose command line names ``tmp``: the orchestrator (its repo), the workers
    (their cache dirs), the held step's shell (its release file)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(tmp).encode() in argv:
            found[int(pid)] = argv.replace(NUL, b" ").decode(errors="replace")
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("whole_group", [True, False], ids=["terminal-ctrl-c", "demo-only"])
def test_ctrl_c_mid_drain_stops_every_process_and_removes_the_temp_dir(cluster, whole_group):
    """Ctrl-C while a step is held on a draining worker. At a terminal every process of the
    group gets SIGINT; sent to the demo alone, it must stop its children itself."""
    tmp = cluster.tmp / "demo-tmp"
    tmp.mkdir()
    demo = subprocess.Popen(
        [sys.executable, "-m", "swamp", "demo"],
        env={**cluster.env, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as at a terminal
    )
    lines: list[str] = []
    held = threading.Event()

    def read() -> None:
        for line in demo.stdout:
            lines.append(line)
            if "runs until the demo releases it" in line:
                held.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    settled = False
    try:
        assert held.wait(120), "".join(lines) + demo.stderr.read()
        assert _ours(tmp), "the demo's processes should be running now"
        if whole_group:
            os.killpg(demo.pid, signal.SIGINT)
        else:
            demo.send_signal(signal.SIGINT)
        status = demo.wait(timeout=60)
        said = demo.stderr.read()
        left = "\n".join(_ours(tmp).values())
        assert status == 130, f"exit {status}:\n{said}\n{''.join(lines[-10:])}\nleft:\n{left}"
        assert "interrupted" in said
        settled = True
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        if not settled:  # a failed run leaves nothing running on the machine (once, it did)
            for pid in _ours(tmp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    # its children were waited for; a grandchild (the step's shell) is ended by its worker's
    # reaper, which may be a moment behind
    try:
        wait_until(lambda: not _ours(tmp), what=f"the processes of {tmp} to end")
    finally:
        for pid in _ours(tmp):  # a failed run leaves nothing running on the machine either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert list(tmp.iterdir()) == []
