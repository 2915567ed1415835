"""Real faults: SIGKILLed workers, a crashed orchestrator, a frozen (SIGSTOPped) worker."""

import signal
import sqlite3

import pytest

from swamp.client import connect
from swamp.repo import Repo
from tests.integration.conftest import Proc, logs_of, result_of, wait_until

pytestmark = pytest.mark.integration


def _run_in_background(cluster, *args: str) -> Proc:
    """``swamp model method run ... --json`` as a process we can watch while it runs."""
    return cluster.spawn("model", "method", "run", *args, "--server", cluster.url, "--json")


def test_a_worker_killed_before_writing_is_redispatched(cluster):
    cluster.serve()
    workers = {
        name: cluster.worker(cluster.mint(name), "--label", "pool=x") for name in ("w1", "w2")
    }
    marker = cluster.tmp / "marker"
    command = (
        f"if [ -e {marker} ]; then echo second-run; else touch {marker}; "
        "echo first-run; sleep 60; fi"
    )
    run = _run_in_background(
        cluster, "command/shell", "run", "--arg", f"command={command}", "--label", "pool=x"
    )
    first = run.wait_for(lambda e: e.get("event", {}).get("line") == "first-run")["event"]
    workers[first["worker"]].p.kill()  # SIGKILL mid-dispatch, nothing written yet
    assert run.wait_exit() == 0
    lines = run.events()
    redispatch = [e["event"] for e in lines if e.get("event", {}).get("kind") == "redispatch"]
    assert redispatch and redispatch[0]["worker"] == first["worker"]
    result = result_of(lines)
    assert result["status"] == "succeeded" and result["worker"] != first["worker"]
    assert "second-run" in logs_of(lines)
    leases = {
        e["attributes"]["workerName"]: e["attributes"]
        for e in cluster.query('modelType == "swamp/step-lease"')
    }
    assert leases[first["worker"]]["state"] == "expired"
    assert "before writing" in leases[first["worker"]]["error"]
    assert leases[result["worker"]]["state"] == "completed"


def test_a_worker_killed_after_writing_fails_the_step(cluster):
    cluster.serve()
    workers = {
        name: cluster.worker(cluster.mint(name), "--label", "pool=x") for name in ("w1", "w2")
    }
    run = _run_in_background(cluster, "test/steps", "write_then_wait", "--label", "pool=x")
    wrote = run.wait_for(lambda e: e.get("event", {}).get("line") == "wrote")["event"]
    workers[wrote["worker"]].p.kill()
    assert run.wait_exit() == 1
    error = result_error(run)
    assert "write-then-drop" in error and wrote["worker"] in error
    lease = cluster.query('modelType == "swamp/step-lease"')[0]["attributes"]
    assert lease["state"] == "failed" and lease["hasWrites"] is True


def result_error(proc: Proc) -> str:
    for line in proc.events():
        if "error" in line:
            return line["error"]["message"]
    raise AssertionError(proc.events())


def test_a_lost_target_with_no_other_match_goes_back_in_the_queue_under_its_deadline(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("only"))
    run = _run_in_background(
        cluster, "test/steps", "wait", "--target", "only", "--queue-timeout", "8s"
    )
    run.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")
    worker.p.kill()
    run.wait_for(lambda e: e.get("event", {}).get("kind") == "redispatch")
    queued = run.wait_for(lambda e: e.get("event", {}).get("kind") == "queued")["event"]
    assert run.wait_exit(timeout=40) == 1
    assert result_error(run) == (
        "timed out waiting for a worker matching target 'only' to become available"
    )
    [episode] = cluster.query('modelType == "swamp/pending-dispatch"')
    assert episode["attributes"]["queueId"] == queued["queueId"]
    assert episode["attributes"]["state"] == "timed_out"


def test_orchestrator_restart_reconciles_and_workers_come_back_by_themselves(cluster):
    serve = cluster.serve()
    port = cluster.url.rsplit(":", 1)[1]
    worker = cluster.worker(cluster.mint("w1"), cache_dir=cluster.tmp / "cache")
    run = _run_in_background(cluster, "test/steps", "wait", "--target", "w1")
    run.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")
    # a running dispatch's lease row is written behind, within moments of its start
    wait_until(lambda: cluster.query('modelType == "swamp/step-lease"'), what="the lease's row")
    serve.p.kill()  # a crash: nothing is cleaned up
    serve.wait_exit()
    assert run.wait_exit() != 0
    mark = worker.mark()
    worker.wait_for(lambda e: e.get("event") == "disconnected", start=mark)

    stale = cluster.query('modelType == "swamp/step-lease"')[0]["attributes"]
    assert stale["state"] == "active"  # the crash left it behind
    restarted = cluster.serve(port=int(port))
    booted = restarted.wait_for(lambda e: e.get("event") == "listening")
    assert booted["reconciled"] == {
        "tokens": 0,
        "leases": 1,
        "workers": 1,
        "queued": 0,
        "runs": 0,
    }
    lease = cluster.query('modelType == "swamp/step-lease"')[0]["attributes"]
    assert lease["state"] == "expired" and lease["error"] == "orchestrator restart"

    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark, timeout=60)
    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=echo back", "--target", "w1"
    )
    assert code == 0 and "back" in logs_of(lines)
    history = cluster.cli_json(
        "data",
        "query",
        'modelType == "swamp/worker"',
        "--all-versions",
        "--repo-dir",
        str(cluster.repo),
    )
    assert "disconnected" in [r["attributes"]["status"] for r in history]


def test_a_silent_worker_is_dropped_and_rejoins_as_the_same_member(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"), cache_dir=cluster.tmp / "cache")
    first = worker.wait_for(lambda e: e.get("event") == "enrolled")
    worker.signal(signal.SIGSTOP)  # alive, connected, but silent
    try:
        wait_until(
            lambda: cluster.workers("--all")[0]["status"] == "disconnected",
            what="the orchestrator to drop the silent worker",
        )
        reason = cluster.workers("--all")[0]["disconnectReason"]
        assert "heartbeat" in reason
    finally:
        worker.signal(signal.SIGCONT)
    mark = worker.mark()
    again = worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    assert again["workerName"] == first["workerName"] and again["reconnect"] is True
    wait_until(lambda: cluster.workers()[0]["status"] == "idle", what="worker back to idle")


def test_a_cancelled_step_holds_its_slot_until_the_worker_has_let_go(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))  # one slot
    release = cluster.tmp / "let-go"
    run = _run_in_background(
        cluster, "test/steps", "slow_cleanup", "--arg", f"release={release}", "--target", "w1"
    )
    run.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")
    mark = worker.mark()
    run.signal(signal.SIGINT)  # the operator cancels: the method lets go only when told
    assert run.wait_exit() == 130

    def active() -> list:
        listing = cluster.cli_json("worker", "list", "--server", cluster.url)
        return listing["workers"][0].get("activeDispatchIds", [])

    assert len(active()) == 1  # still the cancelled method's: the worker has not let go yet
    release.touch()  # the method's cleanup ends now
    stopped = worker.wait_for(lambda e: e.get("event") == "dispatch_finished", start=mark)
    assert stopped["status"] == "cancelled"
    wait_until(lambda: not active(), what="the slot to be freed once the worker let go")
    code, lines = cluster.run("swamp/echo", "echo", "--target", "w1")
    assert code == 0 and result_of(lines)["worker"] == "w1"
    assert not any(
        "capacity" in str(e.get("error", "")) for e in worker.events()
    )  # the worker never had to refuse one as "at capacity"


def _counting_command(counter, pidfile) -> str:
    """Appends "start N" (N = runs so far) and the step's id and attempt as swamp tells them;
    the first run then waits a long time, later runs end at once. Its process group id goes to
    ``pidfile``."""
    return (
        f"echo $$ > {pidfile}; n=$(wc -l < {counter} 2>/dev/null || echo 0); "
        f'echo "start $n $SWAMP_ATTEMPT $SWAMP_STEP_ID" >> {counter}; '
        f'if [ "$n" = 0 ]; then sleep 60; fi; echo "end $n" >> {counter}'
    )


def _group_gone(pgid: int) -> bool:
    """No live process left in the group (a killed orphan may linger as a zombie until init
    reaps it: it runs nothing)."""
    from pathlib import Path

    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            return False
    return True


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_lost_worker_takes_its_command_with_it_and_the_step_runs_once_more(cluster, fault):
    cluster.serve()
    workers = {
        name: cluster.worker(cluster.mint(name), "--label", "pool=x") for name in ("w1", "w2")
    }
    counter, pidfile = cluster.tmp / "counter", cluster.tmp / "pgid"
    run = _run_in_background(
        cluster,
        "command/shell",
        "run",
        "--arg",
        f"command={_counting_command(counter, pidfile)}",
        "--label",
        "pool=x",
    )
    first = run.wait_for(lambda e: e.get("event", {}).get("kind") == "dispatched")["event"]
    wait_until(lambda: counter.exists() and pidfile.exists(), what="the first run to start")
    pgid = int(pidfile.read_text())
    victim = workers[first["worker"]]
    if fault == "kill":
        victim.p.kill()  # SIGKILL: the worker runs no cleanup at all
        # at once, as the reaper sees its pipe close; the bound is only a loaded machine's
        # margin, far short of the command's own 60 s
        wait_until(lambda: _group_gone(pgid), timeout=20, what="the command to die with it")
    else:
        victim.signal(signal.SIGSTOP)  # frozen: its reaper notices the silence
        wait_until(lambda: _group_gone(pgid), timeout=30, what="the reaper to kill the command")
    try:
        assert run.wait_exit(timeout=60) == 0
    finally:
        if fault == "stop":
            victim.signal(signal.SIGCONT)
    result = result_of(run.events())
    assert result["status"] == "succeeded" and result["worker"] != first["worker"]
    # the counter file, written by the command itself: the first copy never ran on; the second
    # was told it is the same step's second attempt
    first_start, second_start, end = counter.read_text().split("\n")[:-1]
    step_id = first_start.split()[-1]
    assert len(step_id) == 32
    assert (first_start, second_start, end) == (
        f"start 0 1 {step_id}",
        f"start 1 2 {step_id}",
        "end 1",
    )


def test_a_step_that_must_not_repeat_fails_instead(cluster):
    cluster.serve()
    workers = {
        name: cluster.worker(cluster.mint(name), "--label", "pool=x") for name in ("w1", "w2")
    }
    counter, pidfile = cluster.tmp / "counter", cluster.tmp / "pgid"
    (cluster.repo / "models" / "once.toml").write_text(
        'type = "command/shell"\nretry = "never"\n'
        f"[args]\ncommand = '''{_counting_command(counter, pidfile)}'''\n"
    )
    run = _run_in_background(cluster, "once", "run", "--label", "pool=x")
    first = run.wait_for(lambda e: e.get("event", {}).get("kind") == "dispatched")["event"]
    wait_until(lambda: counter.exists(), what="the run to start")
    workers[first["worker"]].p.kill()
    assert run.wait_exit() == 1
    assert 'retry = "never"' in result_error(run)
    [only] = counter.read_text().splitlines()  # one start, no second
    assert only.startswith("start 0 1 ")


def test_a_step_waiting_for_a_revoked_target_fails_at_once(cluster):
    cluster.serve("--grace-window", "60s")
    cluster.worker(cluster.mint("w1"))
    run = _run_in_background(cluster, "test/steps", "wait", "--target", "w1")
    run.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")
    revoked = cluster.cli("worker", "token", "revoke", "w1")
    assert revoked.returncode == 0
    assert run.wait_exit(timeout=20) == 1  # not after the 60 s grace window
    assert "can never return" in result_error(run) and "revoked" in result_error(run)


def test_a_step_whose_command_already_ran_is_not_run_again(cluster):
    cluster.serve()
    workers = {
        name: cluster.worker(cluster.mint(name), "--label", "pool=x") for name in ("w1", "w2")
    }
    counter = cluster.tmp / "counter"
    run = _run_in_background(
        cluster, "test/steps", "run_then_wait", "--arg", f"command=echo ran >> {counter}",
        "--label", "pool=x",
    )  # fmt: skip
    ran = run.wait_for(lambda e: e.get("event", {}).get("line") == "ran")["event"]
    workers[ran["worker"]].p.kill()  # its command has run; the result has not come home
    assert run.wait_exit(timeout=40) == 1
    assert "had run a command" in result_error(run)
    assert counter.read_text() == "ran\n"  # once, not again on the other worker
    # the stored lease says so too (the command's exit used to be remembered in memory only)
    [lease] = cluster.query('modelType == "swamp/step-lease"')
    assert lease["attributes"]["state"] == "failed" and lease["attributes"]["hasWrites"] is True


def test_a_command_that_ran_and_wrote_its_result_leaves_a_write_bearing_lease(cluster):
    """Replayed from the original's test cases: a command/shell dispatch that wrote its result
    had a lease with hasWrites false (the command's exit set the flag in memory, and the write
    that followed then skipped the durable mark). Short and long dispatches alike."""
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    for command in ("echo quick", "sleep 0.3; echo slower"):  # lease row journaled, or stored
        code, lines = cluster.run(
            "command/shell", "run", "--arg", f"command={command}", "--target", "w1"
        )
        assert code == 0, lines
        dispatch = result_of(lines)["dispatchId"]
        [lease] = wait_until(
            lambda d=dispatch: cluster.query(
                f'modelType == "swamp/step-lease" && attributes.dispatchId == "{d}"'
            ),
            what="the lease in the store",
        )
        assert lease["attributes"]["state"] == "completed"
        assert lease["attributes"]["hasWrites"] is True, lease
    # the control: a dispatch that wrote nothing and ran nothing has a lease without writes
    code, lines = cluster.run("swamp/echo", "echo", "--target", "w1")
    dispatch = result_of(lines)["dispatchId"]
    [lease] = wait_until(
        lambda: cluster.query(
            f'modelType == "swamp/step-lease" && attributes.dispatchId == "{dispatch}"'
        ),
        what="the lease in the store",
    )
    assert lease["attributes"]["hasWrites"] is False


async def test_a_result_its_client_saw_survives_a_kill_of_the_orchestrator(cluster):
    """The lease's end is durable before the client has the result: here it is still only in
    the journal when the orchestrator is killed, and the next boot puts it in the store."""
    serve = cluster.serve()
    cluster.worker(cluster.mint("w1"))
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    params = {"model": "swamp/echo", "method": "echo", "args": {}, "placement": {"target": "w1"}}
    # Another process holds the database's write lock meanwhile, so the row cannot reach the
    # store before the kill however slowly this test gets to it (the orchestrator retries the
    # write; the journal is a file of its own).
    lock = sqlite3.connect(cluster.repo / ".swamp" / "swamp.db", isolation_level=None)
    async with connect(cluster.url, server_token=credential) as channel:
        lock.execute("BEGIN IMMEDIATE")
        try:
            result = await channel.call("model.method.run", params, timeout=30)
            serve.p.kill()  # with the result here and the row not yet in the store
            serve.wait_exit()
        finally:
            lock.execute("ROLLBACK")
            lock.close()
    assert result["status"] == "succeeded"
    assert cluster.query('modelType == "swamp/step-lease"') == []  # not in the store yet
    assert (cluster.repo / ".swamp" / "swamp.journal").stat().st_size > 0  # but durable

    cluster.serve()
    [lease] = cluster.query('modelType == "swamp/step-lease"')
    assert lease["attributes"]["dispatchId"] == result["dispatchId"]
    assert lease["attributes"]["state"] == "completed" and lease["version"] == 1
    assert (cluster.repo / ".swamp" / "swamp.journal").stat().st_size == 0
