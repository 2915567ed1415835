"""Everything a command starts dies with its worker, or with its dispatch — daemons included.

The command of each step here daemonizes twice, the ways real commands do: ``setsid -f`` (a
double fork: the daemon leaves the command's process group *and* its tree) and ``setsid … &``
(it leaves the group, its parent stays). Each daemon writes its pid to a file; the detector is
whether that pid is a live process. The control runs the same command outside any worker and
kills its process group, as the reaper used to: both daemons survive that.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import logs_of, result_of

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adopting orphans: Linux"),
    pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid"),
]
DEADLINE = 60  # generous: a busy machine is slow, never wrong


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for(check, what: str):
    deadline = time.monotonic() + DEADLINE
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def daemons(directory: Path) -> tuple[Path, Path]:
    return directory / "double-forked", directory / "own-session"


def daemonize(directory: Path) -> str:
    """Start both daemons (each writes its pid), then wait."""
    double, session = daemons(directory)

    def daemon(pidfile: Path) -> str:
        return (
            f"sh -c 'echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 600' "
            "< /dev/null > /dev/null 2>&1"
        )

    return f"setsid -f {daemon(double)}; setsid {daemon(session)} & sleep 600"


STARTED: list[int] = []  # every daemon a test saw start, killed after it whatever happened


@pytest.fixture(autouse=True)
def _no_daemon_left():
    yield
    while STARTED:
        pid = STARTED.pop()
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00600\x00":
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # gone


def pids_of(directory: Path) -> list[int]:
    files = daemons(directory)
    wait_for(lambda: all(f.exists() for f in files), "the daemons to start")
    pids = [int(f.read_text()) for f in files]
    STARTED.extend(pids)
    return pids


def test_the_control_both_daemons_outlive_a_kill_of_the_commands_group(tmp_path):
    command = subprocess.Popen(["/bin/sh", "-c", daemonize(tmp_path)], start_new_session=True)
    pids = pids_of(tmp_path)
    os.killpg(command.pid, signal.SIGKILL)  # all the reaper used to do
    command.wait()
    assert all(alive(pid) for pid in pids)  # the detector fires on both


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_lost_workers_daemons_die_before_its_step_runs_again(cluster, fault):
    cluster.serve()
    workers = {
        name: cluster.worker(cluster.mint(name), "--label", "pool=x") for name in ("w1", "w2")
    }
    first_try = cluster.tmp / "first"
    first_try.mkdir()
    double, session = daemons(first_try)
    # the first attempt starts the daemons and runs on; the second says whether they live
    command = (
        f'if [ "$SWAMP_ATTEMPT" = 1 ]; then {daemonize(first_try)}; fi; '
        f"for f in {double} {session}; do kill -0 $(cat $f) 2>/dev/null && echo alive $f; done; "
        "echo second"
    )
    run = cluster.spawn("model", "method", "run", "command/shell", "run",
                        "--arg", f"command={command}", "--label", "pool=x",
                        "--server", cluster.url, "--json")  # fmt: skip
    first = run.wait_for(lambda e: e.get("event", {}).get("kind") == "dispatched")["event"]
    pids = pids_of(first_try)
    victim = workers[first["worker"]]
    if fault == "kill":
        victim.p.kill()  # SIGKILL: the worker runs no cleanup at all
    else:
        victim.signal(signal.SIGSTOP)  # frozen: its reaper hears no beat
    try:
        wait_for(lambda: not any(alive(pid) for pid in pids), "the daemons to die")
        assert run.wait_exit(timeout=DEADLINE) == 0
    finally:
        if fault == "stop":
            victim.signal(signal.SIGCONT)
    result = result_of(run.events())
    assert result["status"] == "succeeded" and result["worker"] != first["worker"]
    assert logs_of(run.events()) == ["second"]  # neither daemon was alive when it ran again


@pytest.mark.parametrize("end", ["timeout", "cancel"])
def test_a_dispatch_that_times_out_or_is_cancelled_takes_its_daemons(cluster, end):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))
    extra = ["--arg", "timeout=10s"] if end == "timeout" else []
    run = cluster.spawn("model", "method", "run", "command/shell", "run",
                        "--arg", f"command={daemonize(cluster.tmp)}", *extra,
                        "--target", "w1", "--server", cluster.url, "--json")  # fmt: skip
    pids = pids_of(cluster.tmp)
    if end == "cancel":
        run.signal(signal.SIGINT)  # the operator's Ctrl-C
    assert run.wait_exit(timeout=DEADLINE) == (1 if end == "timeout" else 130)
    wait_for(lambda: not any(alive(pid) for pid in pids), "the daemons to die")
    # and the worker carries on
    worker.wait_for(lambda e: e.get("event") == "dispatch_finished")
    code, lines = cluster.run("command/shell", "run", "--arg", "command=echo ok",
                              "--target", "w1")  # fmt: skip
    assert code == 0 and logs_of(lines) == ["ok"]


def test_a_finished_commands_daemon_runs_on_until_its_worker_stops(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))
    command = daemonize(cluster.tmp).removesuffix(" sleep 600") + " true"
    code, lines = cluster.run("command/shell", "run", "--arg", f"command={command}",
                              "--target", "w1")  # fmt: skip
    assert code == 0, lines
    pids = pids_of(cluster.tmp)
    assert all(alive(pid) for pid in pids)  # a service a step started keeps running ...
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0
    wait_for(lambda: not any(alive(pid) for pid in pids), "the daemons to die")  # ... not longer
