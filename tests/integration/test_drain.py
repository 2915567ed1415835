"""Drain and lifecycle on real processes: SIGTERM finishes the work, a second one stops it,
--max-dispatches and --idle-timeout, an ephemeral fleet, and the systemd unit (the README's
Kubernetes and Compose files are test_readme.py's; their containers run in test_pyz.py)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime

import httpx
import pytest

from tests.integration.conftest import Proc, wait_until

pytestmark = pytest.mark.integration


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _run(cluster, *args: str) -> Proc:
    return cluster.spawn("model", "method", "run", *args, "--server", cluster.url, "--json")


def _result(proc: Proc) -> dict:
    return next(e for e in proc.events() if "result" in e or "error" in e)


def _versions(cluster, name: str) -> list[dict]:
    records = cluster.cli_json(
        "data", "query", f'modelType == "swamp/worker" && modelName == "{name}"', "--all-versions"
    )
    return [r for r in records]


def _held(release) -> str:
    """A command that runs until the test creates ``release``."""
    return f"command=while [ ! -e {release} ]; do sleep 0.05; done; echo done"


def test_sigterm_finishes_the_running_step_and_takes_no_more(cluster):
    cluster.serve("--grace-window", "60s")
    drained = cluster.worker(cluster.mint("d1"), "--label", "pool=x")
    others = [cluster.worker(cluster.mint(f"o{i}"), "--label", "pool=x") for i in range(2)]
    # every step runs until the test lets it end, so what follows happens while they run
    release, release_others = cluster.tmp / "release", cluster.tmp / "release-others"
    step = _run(cluster, "command/shell", "run", "--arg", _held(release), "--target", "d1")
    busy = [
        _run(cluster, "command/shell", "run", "--arg", _held(release_others), "--target", f"o{i}")
        for i in range(2)
    ]
    scraper = cluster.cli_json("server", "token", "create", "scraper")["token"]
    for worker in (drained, *others):
        worker.wait_for(lambda e: e.get("event") == "dispatch_started")
    signalled = time.monotonic()
    drained.signal(signal.SIGTERM)
    draining = drained.wait_for(lambda e: e.get("event") == "draining")
    assert draining["reason"] == "signal" and draining["running"] == 1

    # /metrics counts it as draining, and its slot is not supply
    def scrape() -> str | None:
        text = httpx.get(
            cluster.url.replace("ws://", "http://") + "/metrics",
            headers={"Authorization": f"Bearer {scraper}"},
        ).text
        return text if 'status="draining"' in text else None

    metrics = wait_until(scrape, what="/metrics to count the draining worker")
    assert 'swamp_workers{fleet="d1",status="draining"} 1.0' in metrics
    assert 'swamp_slots{fleet="d1"}' not in metrics
    # the status version said draining when the worker announced it, with the reason — while
    # its step still ran, not when it left
    said = wait_until(
        lambda: next(
            (v for v in _versions(cluster, "d1") if v["attributes"]["status"] == "draining"), None
        ),
        what="the draining status version",
    )
    assert said["attributes"]["drainReason"] == "signal"
    # twenty more steps for the pool, all waiting (o0 and o1 are busy) when d1's slot frees
    burst = [
        _run(cluster, "command/shell", "run", "--arg", "command=true", "--label", "pool=x")
        for _ in range(20)
    ]
    wait_until(
        lambda: len(cluster.cli_json("worker", "queue", "--server", cluster.url)["items"]) == 20,
        timeout=120,
        what="the twenty steps to wait",
    )
    assert step.p.poll() is None
    release.touch()
    # it left once its step was done: not after the 60 s grace window (how soon exactly is
    # the machine's, not a rule; the test suite shares two cores with twenty CLI processes)
    assert drained.wait_exit(timeout=60) == 0
    assert time.monotonic() - signalled < 60
    assert step.wait_exit() == 0 and _result(step)["result"]["status"] == "succeeded"
    assert any(e.get("event", {}).get("line") == "done" for e in step.events())
    starts = [e for e in drained.events() if e.get("event") == "dispatch_started"]
    assert len(starts) == 1  # nothing after the signal, though twenty steps waited for a slot
    release_others.touch()
    for run in [*busy, *burst]:
        assert run.wait_exit(timeout=60) == 0
        assert _result(run)["result"]["worker"] in ("o0", "o1")

    # and it left at once: disconnected, drained, no 60 s grace window
    def left() -> list[dict] | None:
        versions = _versions(cluster, "d1")
        last = max(versions, key=lambda v: v["version"])["attributes"]
        return versions if last["status"] == "disconnected" else None

    final = max(wait_until(left, what="d1's last version"), key=lambda v: v["version"])
    assert final["attributes"]["disconnectReason"] == "drained (signal)"
    listed = cluster.cli_json("worker", "list", "--server", cluster.url)["workers"]
    assert [w["name"] for w in listed] == ["o0", "o1"]
    for other in others:
        assert other.p.poll() is None


def test_worker_drain_asks_a_worker_to_finish_its_step_and_leave(cluster):
    """'swamp worker drain' does from wherever the CLI reaches the orchestrator what SIGTERM
    does on the worker's machine: no new step, the running one finished, exit 0."""
    cluster.serve("--grace-window", "60s")
    drained = cluster.worker(cluster.mint("d1"), "--label", "pool=x")
    other = cluster.worker(cluster.mint("o1"), "--label", "pool=x")
    release = cluster.tmp / "release"
    step = _run(cluster, "command/shell", "run", "--arg", _held(release), "--target", "d1")
    drained.wait_for(lambda e: e.get("event") == "dispatch_started")
    asked = cluster.cli("worker", "drain", "d1", "--json")  # through the repo's serve
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == {"name": "d1", "running": 1, "already": False}
    draining = drained.wait_for(lambda e: e.get("event") == "draining")
    assert draining["reason"] == "asked" and draining["running"] == 1
    # the pool says so as soon as the command has answered
    listed = cluster.cli_json("worker", "list", "--server", cluster.url)["workers"]
    assert {w["name"]: w["status"] for w in listed}["d1"] == "draining"
    again = cluster.cli("worker", "drain", "d1", "--server", cluster.url)
    assert again.returncode == 0 and "draining already" in again.stdout, again.stderr
    # a step for the pool goes to the other worker now
    more = _run(cluster, "command/shell", "run", "--arg", "command=true", "--label", "pool=x")
    assert more.wait_exit(timeout=60) == 0 and _result(more)["result"]["worker"] == "o1"
    assert step.p.poll() is None  # still running: a drain finishes what runs
    release.touch()
    assert drained.wait_exit(timeout=60) == 0
    assert step.wait_exit() == 0 and _result(step)["result"]["status"] == "succeeded"
    missing = cluster.cli("worker", "drain", "nobody", "--server", cluster.url)
    assert missing.returncode != 0 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no connected worker named 'nobody'" in missing.stderr
    assert other.p.poll() is None


def test_a_second_sigterm_stops_the_step_and_exits_with_the_forced_code(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))
    step = _run(cluster, "command/shell", "run", "--arg", "command=sleep 30", "--target", "w1")
    worker.wait_for(lambda e: e.get("event") == "dispatch_started")
    worker.signal(signal.SIGTERM)
    worker.wait_for(lambda e: e.get("event") == "draining")
    worker.signal(signal.SIGTERM)
    # stopped, not finished: the forced exit code (a drain that waited for its 30 s step would
    # exit 0, and later than this bound)
    assert worker.wait_exit(timeout=20) == 3
    assert step.wait_exit() == 1
    error = _result(step)["error"]
    assert error["code"] == "worker_stopped"
    [lease] = cluster.query('modelType == "swamp/step-lease"')
    assert lease["attributes"]["state"] == "failed"
    assert lease["attributes"]["error"] == "worker stopped"


def test_the_drain_timeout_names_itself_when_it_stops_the_steps(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"), "--drain-timeout", "2s")
    step = _run(cluster, "command/shell", "run", "--arg", "command=sleep 30", "--target", "w1")
    worker.wait_for(lambda e: e.get("event") == "dispatch_started")
    worker.signal(signal.SIGTERM)
    forcing = worker.wait_for(lambda e: e.get("event") == "forcing", timeout=20)
    assert forcing["reason"] == ("drain timeout (2s) reached with 1 dispatch running: stopping it")
    assert worker.wait_exit(timeout=20) == 3
    stopped = worker.events()[-1]
    assert stopped["event"] == "stopped"
    assert stopped["reason"] == "drain timeout (2s) reached: 1 dispatch(es) stopped"
    assert step.wait_exit() == 1
    assert "the drain timeout (2s) stopped it" in _result(step)["error"]["message"]


def test_max_dispatches_runs_exactly_that_many_then_exits(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"), "--concurrency", "4", "--max-dispatches", "2")
    runs = [
        _run(
            cluster,
            "command/shell",
            "run",
            "--arg",
            "command=sleep 1",
            "--target",
            "w1",
            "--queue-timeout",
            "8s",
        )
        for _ in range(10)
    ]
    assert worker.wait_exit(timeout=60) == 0
    codes = [run.wait_exit(timeout=30) for run in runs]
    assert codes.count(0) == 2  # the other 8 waited for a w1 that drained, then timed out
    assert len([e for e in worker.events() if e.get("event") == "dispatch_started"]) == 2
    stopped = next(e for e in worker.events() if e.get("event") == "stopped")
    assert stopped == {**stopped, "reason": "drained (max-dispatches)", "exitCode": 0}


def test_idle_timeout_counts_from_the_last_dispatch(cluster):
    cluster.serve()
    token = cluster.mint("w1")
    # the step waits for the worker, so it is dispatched as the worker enrolls, however long
    # a command takes to start on a loaded machine (the idle time starts at enrollment)
    run = _run(cluster, "command/shell", "run", "--arg", "command=sleep 3", "--target", "w1")
    run.wait_for(lambda e: e.get("event", {}).get("kind") == "queued")
    worker = cluster.worker(token, "--idle-timeout", "2s")
    assert run.wait_exit() == 0  # a 3 s step under a 2 s idle timeout: no drain while it runs
    assert worker.wait_exit(timeout=10) == 0
    events = worker.events()
    ended = next(e for e in events if e.get("event") == "dispatch_finished")
    draining = next(e for e in events if e.get("event") == "draining")
    assert draining["reason"] == "idle-timeout"
    # not before the idle time is up, counted from the dispatch's end (the step outlasted the
    # timeout counted from enrollment); how soon after is the machine's
    assert _epoch(draining["time"]) - _epoch(ended["time"]) >= 1.9


def test_an_ephemeral_fleet_of_one_shot_workers_stays_bounded(cluster):
    # 32 here (three times the allowance); SWAMP_TEST_EPHEMERAL_WORKERS=200 for the full run
    total = int(os.environ.get("SWAMP_TEST_EPHEMERAL_WORKERS", "32"))
    cluster.serve("--worker-retention", "2s")
    token = cluster.mint_fleet("eph", "10")
    marks = cluster.tmp / "marks"
    marks.mkdir()
    batch = 8
    runs, exits = [], []
    for start in range(0, total, batch):
        workers = [
            cluster.worker(
                token, "--max-dispatches", "1", cache_dir=cluster.tmp / f"m{i}", wait=False
            )
            for i in range(start, min(start + batch, total))
        ]
        runs += [
            _run(
                cluster,
                "command/shell",
                "run",
                "--arg",
                f"command=touch {marks}/{i}",
                "--label",
                "fleet=eph",
                "--queue-timeout",
                "60s",
            )
            for i in range(start, min(start + batch, total))
        ]
        exits += [w.wait_exit(timeout=90) for w in workers]
        for w in workers:
            w.stderr.close()
        cluster.procs = [p for p in cluster.procs if p not in workers]
    assert exits == [0] * total
    assert [r.wait_exit(timeout=90) for r in runs] == [0] * total
    assert len(list(marks.iterdir())) == total  # every step ran, once

    # gone machines are forgotten and their bindings released: the store stays bounded
    def bounded() -> bool:
        tokens = cluster.cli_json("worker", "token", "list")
        return len(cluster.query('modelType == "swamp/worker"')) <= 2 * batch and all(
            len(t.get("bindings", [])) <= 10 for t in tokens
        )

    wait_until(bounded, timeout=60, what="old workers and bindings to be collected")


# -- service managers ----------------------------------------------------------------------------


def _lifecycle(cluster, argv: list[str], env: dict) -> None:
    """Run a manifest's worker command against this cluster, then stop it as the manager would."""
    proc = subprocess.Popen(
        argv,
        env={**cluster.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out = []
        deadline = time.monotonic() + 30
        for line in proc.stdout:
            out.append(line)
            if "enrolled as" in line or time.monotonic() > deadline:
                break
        assert any("enrolled as" in line for line in out), out
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_systemd_unit_verifies_and_runs_its_command(cluster):
    cluster.serve()
    exe = f"{sys.executable} -m swamp"
    unit = cluster.cli("worker", "unit", "--exec", sys.executable).stdout
    path = cluster.tmp / "swamp-worker.service"
    path.write_text(unit.replace(f"ExecStart={sys.executable} worker", f"ExecStart={exe} worker"))
    assert "KillSignal=SIGTERM" in unit and "TimeoutStopSec=300" in unit
    assert "Restart=on-failure" in unit and "RestartPreventExitStatus=1" in unit
    described = cluster.cli_json("worker", "unit", "--exec", sys.executable)
    assert described["content"] == unit and described["path"].endswith("swamp-worker.service")
    if shutil.which("systemd-analyze"):
        check = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True)
        assert check.returncode == 0, check.stderr
    command = re.search(r"^ExecStart=(.*)$", path.read_text(), re.M).group(1).split()
    env = {"SWAMP_ORCHESTRATOR_URL": cluster.url, "SWAMP_WORKER_TOKEN": cluster.mint("unit")}
    _lifecycle(cluster, command, env)
