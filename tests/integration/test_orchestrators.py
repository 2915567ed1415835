"""Several orchestrators on one real PostgreSQL, on real processes: a worker given both URLs
enrolls with the first; a step sent through the other runs on it, its output at the client
while it runs; ``worker list`` through either says which holds the worker; the holder killed
with SIGKILL, the worker moves to the survivor and runs steps through it, and the survivor
reconciles what the dead one left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime

import pytest
import trio

from swamp.errors import Forbidden, Unauthorized
from tests.integration.conftest import logs_of, result_of, wait_until
from tests.integration.test_postgres_serve import _rows

pytestmark = [pytest.mark.postgres]


def _latest(url: str, model_type: str) -> list[str]:
    """The attributes of each record of ``model_type`` as last written."""
    return [
        row[0]
        for row in _rows(
            url,
            "SELECT DISTINCT ON (model_name, name) attributes FROM data "
            f"WHERE model_type = '{model_type}' ORDER BY model_name, name, version DESC",
        )
    ]


def _fleet_worker(cluster, *urls: str):
    """A worker of the fleet token ``edge`` (label ``fleet=edge``) given ``urls``, enrolled."""
    token = cluster.mint_fleet("edge", "2")
    worker = cluster.spawn(
        "worker", "connect", ",".join(urls), "--json", env={"SWAMP_WORKER_TOKEN": token}
    )
    worker.wait_for(lambda e: e.get("event") == "enrolled")
    return worker


def _lease_states(url: str) -> list[str]:
    """The state of every lease as last written."""
    return [json.loads(a)["state"] for a in _latest(url, "swamp/step-lease")]


def _serve_other(cluster, name: str, *extra: str):
    """A second orchestrator, in a repo of its own (one per repo), on the same database."""
    other = cluster.tmp / name
    assert cluster.cli("init", str(other)).returncode == 0
    proc = cluster.spawn(
        "serve", "--repo-dir", str(other), "--port", "0", "--json", "--heartbeat", "1s",
        "--grace-window", "10s", *extra,
    )  # fmt: skip
    url = proc.wait_for(lambda e: e.get("event") == "listening")["url"]
    return proc, url, {"SWAMP_REPO_DIR": str(other)}


def test_two_orchestrators_share_one_database(cluster, pg_url, tmp_path):
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    second, second_url, second_env = _serve_other(cluster, "second", *database)
    token = cluster.mint_fleet("edge", "2")  # minted through the first
    worker = cluster.spawn(
        "worker", "connect", f"{first_url},{second_url}", "--json",
        env={"SWAMP_WORKER_TOKEN": token},
    )  # fmt: skip
    name = worker.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]

    # through the second, which holds no worker: the step waits in the shared queue, the
    # first claims it and runs it on its worker; the client sees the first line while the
    # step still runs (it ends only once the test has seen that line and says go)
    go = tmp_path / "go"
    command = f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; echo second"
    client = cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--arg", f"command={command}",
        "--label", "fleet=edge", "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    client.wait_for(lambda e: e.get("event", {}).get("line") == "first")
    go.touch()
    assert client.wait_exit() == 0
    lines = client.events()
    result = result_of(lines)
    assert result["status"] == "succeeded" and result["worker"] == name
    assert logs_of(lines) == ["first", "second"]

    # one for that worker by name, through the second: told to the first alone, run there
    named = cluster.cli(
        "model", "method", "run", "swamp/echo", "echo", "--arg", "message=named",
        "--target", name, "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    assert result_of([json.loads(x) for x in named.stdout.splitlines()])["worker"] == name

    # either says which orchestrator holds the worker's socket
    for env in ({}, second_env):
        url = first_url if not env else second_url
        listed = cluster.cli_json("worker", "list", "--server", url, env=env)["workers"]
        assert [(w["name"], w.get("orchestrator")) for w in listed] == [(name, first_url)]

    # the holder killed: the worker moves to the second and runs a step through it; the
    # second reconciles what the first left (its row goes)
    mark = worker.mark()
    first.signal(signal.SIGKILL)
    first.wait_exit()
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    code = cluster.cli(
        "model", "method", "run", "swamp/echo", "echo", "--arg", "message=survived",
        "--target", name, "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    assert code.returncode == 0, code.stderr
    listed = cluster.cli_json("worker", "list", "--server", second_url, env=second_env)
    assert [(w["name"], w.get("orchestrator")) for w in listed["workers"]] == [(name, second_url)]
    wait_until(
        lambda: "is gone: reconciled what it left" in second.log.read_text(),
        what="the survivor to reconcile the dead orchestrator",
    )
    assert second.p.poll() is None and json.loads(code.stdout.splitlines()[-1])["result"]


def test_a_step_whose_holder_dies_runs_again_on_the_survivor(cluster, pg_url, tmp_path):
    """Sent through the second, running on the first's worker, when the first is killed: the
    worker stops its copy as its socket drops; the step had no effect yet, so after the fence
    it runs again — on the same worker, now held by the second — and succeeds: nothing lost,
    never two copies at once."""
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    _, second_url, second_env = _serve_other(cluster, "second", *database)
    worker = _fleet_worker(cluster, first_url, second_url)
    go, runs = tmp_path / "go", tmp_path / "runs"
    command = f"echo run >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.05; done"
    client = cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--arg", f"command={command}",
        "--label", "fleet=edge", "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started")

    wait_until(
        lambda: _lease_states(pg_url) == ["active"],
        what="the running step's lease in the database (written behind)",
    )
    open_logs = "SELECT orchestrator FROM step_log WHERE ended_epoch IS NULL"
    wait_until(lambda: len(_rows(pg_url, open_logs)) == 1, what="the running step's log")
    [(writer,)] = _rows(pg_url, open_logs)  # the first's, which runs it on its worker
    mark = worker.mark()
    first.signal(signal.SIGKILL)
    first.wait_exit()
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    redispatched = client.wait_for(lambda e: e.get("event", {}).get("kind") == "redispatch")
    assert "was lost" in redispatched["event"]["reason"]
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started", start=client.mark())
    go.touch()
    assert client.wait_exit() == 0
    assert result_of(client.events())["status"] == "succeeded"
    assert runs.read_text().count("run") == 2  # the first copy, stopped; the second

    # the survivor reconciled what the dead one left: its row is gone, the lease of the copy it
    # ran expired, and the worker it held — moved to the survivor — is not marked disconnected
    def reconciled() -> bool:
        return _rows(pg_url, "SELECT count(*) FROM swamp_orchestrator") == [(1,)]

    wait_until(reconciled, what="the dead orchestrator's row to go")
    states = sorted(json.loads(lease)["state"] for lease in _latest(pg_url, "swamp/step-lease"))
    assert states == ["completed", "expired"], states
    [record] = _latest(pg_url, "swamp/worker")
    assert json.loads(record)["status"] != "disconnected"
    # the log of the copy it ran, left open when it died, is ended (so is the second's)
    assert writer is not None and writer.isalnum()
    wait_until(lambda: _rows(pg_url, open_logs) == [], what="every step log ended")
    ended = f"SELECT count(*) FROM step_log WHERE orchestrator = '{writer}'"
    assert _rows(pg_url, ended) == [(1,)]


def test_tokens_and_credentials_across_orchestrators(cluster, pg_url):
    """A worker token revoked through one orchestrator disconnects its worker held by the
    other; an admin credential cannot send a step or ask for a drain as a peer would, and a
    forged peer credential is refused."""
    from swamp import client

    database = ("--database", pg_url)
    cluster.serve(*database)
    first_url = cluster.url
    _, second_url, second_env = _serve_other(cluster, "second", *database)
    token = cluster.mint_fleet("edge", "2")
    worker = cluster.worker(token)  # on the first
    revoked = cluster.cli(
        "worker", "token", "revoke", "edge", "--server", second_url, env=second_env
    )
    assert revoked.returncode == 0, revoked.stderr
    assert worker.wait_exit() != 0  # told it was revoked: it stops for good
    assert "has been revoked" in "\n".join(worker.lines), worker.lines

    local = json.loads((cluster.repo / ".swamp" / "serve.json").read_text())["adminCredential"]

    async def attempts() -> None:
        async with client.connect(first_url, server_token=local) as channel:
            for verb, params in (
                ("peer.dispatch", {"queueId": "q"}),
                ("peer.worker.drain", {"name": "edge-1"}),
                ("peer.workflow.cancel", {"run": "r"}),
                ("peer.outcome", {"sendId": "s"}),
                ("peer.cancel", {"sendId": "s"}),
            ):
                with pytest.raises(Forbidden, match="only another orchestrator"):
                    await channel.call(verb, params)
        async with client.connect(first_url, server_token="peer:someone.forged") as channel:
            with pytest.raises(Unauthorized):
                await channel.call("worker.list", {})
            for verb in ("peer.dispatch", "peer.worker.verify"):
                with pytest.raises((Unauthorized, Forbidden)):
                    await channel.call(verb, {"queueId": "q"})

    trio.run(attempts)


def test_a_step_goes_straight_to_the_orchestrator_that_claimed_its_kind(cluster, pg_url, tmp_path):
    """The first step of its kind through the orchestrator without workers waits and is
    claimed; the next goes straight to the claimer (it never waits: no ``queued``); when the
    claimer's worker is busy, a step sent straight comes back and waits for a claim as the
    first did — and runs once the worker is free."""
    database = ("--database", pg_url)
    cluster.serve(*database)
    first_url = cluster.url
    _, second_url, second_env = _serve_other(cluster, "second", *database)
    token = cluster.mint_fleet("edge", "2")  # a fleet: its workers labelled fleet=edge
    cluster.worker(token)  # on the first, one slot

    def through_second(*extra: str) -> list[dict]:
        run = cluster.cli(
            "model", "method", "run", "swamp/echo", "echo", "--arg", "message=hi",
            "--label", "fleet=edge", "--server", second_url, "--json", *extra, env=second_env,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]

    def queued(lines: list[dict]) -> bool:
        return any(line.get("event", {}).get("kind") == "queued" for line in lines)

    assert queued(through_second())  # waited, and was claimed
    assert not queued(through_second())  # straight to the claimer
    go = tmp_path / "go"
    busy = cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--label", "fleet=edge",
        "--arg", f"command=echo busy; while [ ! -e {go} ]; do sleep 0.05; done",
        "--server", first_url, "--json",
    )  # fmt: skip
    busy.wait_for(lambda e: e.get("event", {}).get("line") == "busy")
    waiting = cluster.spawn(
        "model", "method", "run", "swamp/echo", "echo", "--arg", "message=after",
        "--label", "fleet=edge", "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    waiting.wait_for(lambda e: e.get("event", {}).get("kind") == "queued")  # came back, waits
    go.touch()
    assert busy.wait_exit() == 0 and waiting.wait_exit() == 0
    assert result_of(waiting.events())["status"] == "succeeded"


def test_a_step_with_many_labels_runs_on_the_other_orchestrators_worker(cluster, pg_url):
    """A placement too large for a notification's payload (50 long labels, ~8.8 kB, valid)
    is still shared: the others read it from the table."""
    database = ("--database", pg_url)
    cluster.serve(*database)
    first_url = cluster.url
    second, second_url, second_env = _serve_other(cluster, "second", *database)
    labels = [f"--label=k{i:02d}{'x' * 38}={'v' * 128}" for i in range(50)]
    token = cluster.mint_fleet("edge", "1", *labels)
    worker = cluster.spawn(
        "worker", "connect", first_url, "--json", env={"SWAMP_WORKER_TOKEN": token}
    )
    name = worker.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    client = cluster.cli(
        "model", "method", "run", "swamp/echo", "echo", "--arg", "message=hi", *labels,
        "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    assert client.returncode == 0, second.log.read_text()[-2000:]
    lines = [json.loads(x) for x in client.stdout.splitlines() if x.strip()]
    assert result_of(lines)["worker"] == name


def test_orchestrators_each_with_its_own_ca_reach_each_other(cluster, pg_url):
    """``--tls auto`` on both: each made its own CA, and the other trusts it through the
    database (its certificate is registered with its row) when it sends a step there."""
    database = ("--database", pg_url)
    cluster.serve(*database, "--tls", "auto")
    first_url = cluster.url
    assert first_url.startswith("wss://")
    _, second_url, second_env = _serve_other(cluster, "second", *database, "--tls", "auto")
    assert second_url.startswith("wss://")
    pin = json.loads((cluster.repo / ".swamp" / "serve.json").read_text())["caPin"]
    token = cluster.mint_fleet("edge", "2")
    worker = cluster.spawn(
        "worker", "connect", first_url, "--json",
        env={"SWAMP_WORKER_TOKEN": token, "SWAMP_CA_PIN": pin},
    )  # fmt: skip
    name = worker.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    run = cluster.cli(
        "model", "method", "run", "swamp/echo", "echo", "--arg", "message=over tls",
        "--label", "fleet=edge", "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.strip()]
    assert result_of(lines)["worker"] == name


def test_admin_verbs_reach_what_another_orchestrator_holds(cluster, pg_url):
    """Behind a load balancer any orchestrator gets any admin call: verifying, draining a
    worker and cancelling a workflow run that another holds are performed there, and the queue
    lists every orchestrator's waiting steps, with the answers the holder itself gives."""
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    _, second_url, second_env = _serve_other(cluster, "second", *database)
    worker = cluster.worker(cluster.mint("w1"))

    def through_second(*args: str):
        return cluster.cli(*args, "--server", second_url, env=second_env)

    report = json.loads(through_second("worker", "verify", "--json").stdout)
    assert (report["total"], report["passed"]) == (1, 1), report
    assert [(w["name"], w["status"]) for w in report["workers"]] == [("w1", "pass")]
    named = json.loads(through_second("worker", "verify", "w1", "--json").stdout)
    assert [(w["name"], w["status"]) for w in named["workers"]] == [("w1", "pass")]
    missing = through_second("worker", "verify", "nobody")
    assert missing.returncode != 0 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no connected worker named 'nobody'" in missing.stderr

    # a run the first runs, cancelled through the second
    (cluster.repo / "workflows" / "slow.toml").write_text(
        'name = "slow"\n[[jobs]]\nname = "main"\n[[jobs.steps]]\nname = "wait"\n'
        'target = "w1"\n[jobs.steps.task]\ntype = "model_method"\n'
        'modelIdOrName = "test/steps"\nmethodName = "wait"\ninputs = { seconds = 60 }\n'
    )
    running = cluster.spawn("workflow", "run", "slow", "--json", "--server", first_url)
    started = running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")["event"]
    cancelled = through_second("workflow", "cancel", started["runId"][:8], "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["run"]["status"] == "cancelled"
    assert running.wait_exit() != 0
    # one step of it, through the second: the step ends failed with the reason, the run too
    running = cluster.spawn("workflow", "run", "slow", "--json", "--server", first_url)
    started = running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")["event"]
    one = through_second(
        "workflow", "cancel", started["runId"][:8], "--step", "main.wait", "--reason", "enough",
        "--json",
    )  # fmt: skip
    assert one.returncode == 0, one.stderr
    assert running.wait_exit() != 0
    run = cluster.cli_json("workflow", "history", "get", started["runId"])["run"]
    [step] = run["jobs"][0]["steps"]
    assert (run["status"], step["status"]) == ("failed", "failed"), step
    assert "enough" in step["error"], step

    # a step waiting at the first is in the queue the second lists
    waiting = cluster.spawn(
        "model", "method", "run", "swamp/echo", "echo", "--arg", "message=x",
        "--label", "pool=nobody", "--server", first_url, "--json",
    )  # fmt: skip
    wait_until(
        lambda: (
            [
                (i["requirement"], i.get("methodName"))
                for i in json.loads(through_second("worker", "queue", "--json").stdout)["items"]
            ]
            == [("pool=nobody", "echo")]
        ),
        what="the first's waiting step in the second's queue",
    )
    [summary] = json.loads(through_second("worker", "queue", "--json").stdout)["summary"]
    assert (summary["requirement"], summary["waiting"], summary["connected"]) == (
        "pool=nobody", 1, 0,
    )  # fmt: skip
    waiting.signal(signal.SIGINT)
    waiting.wait_exit()

    # the first stopped (alive to the database, deaf to everyone): its worker gets no verdict
    # and says why, and the verify still answers
    first.signal(signal.SIGSTOP)
    try:
        stuck = json.loads(through_second("worker", "verify", "--json").stdout)
        refused = through_second("worker", "drain", "w1")  # one line, exit 1, nothing done
    finally:
        first.signal(signal.SIGCONT)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"the orchestrator holding it ({first_url}) did not answer" in refused.stderr
    [verdict] = stuck["workers"]
    assert (verdict["name"], verdict["status"]) == ("w1", "error"), stuck
    assert verdict["error"].startswith(f"the orchestrator holding it ({first_url}) did not answer")
    wait_until(
        lambda: json.loads(through_second("worker", "verify", "--json").stdout)["passed"] == 1,
        what="the first to answer again",
    )

    # drained through the second: the worker leaves with exit 0
    drained = through_second("worker", "drain", "w1", "--json")
    assert drained.returncode == 0, drained.stderr
    assert json.loads(drained.stdout) == {"name": "w1", "running": 0, "already": False}
    assert worker.wait_exit() == 0


def _cut_links(from_pid: int, to_url: str) -> int:
    """Destroy every TCP connection process ``from_pid`` holds to ``to_url``'s port (the
    kernel resets both ends, as a broken network would); how many it cut."""
    port = to_url.rsplit(":", 1)[1]
    listed = subprocess.run(
        ["ss", "-tnpH", "state", "established", "dport", "=", f":{port}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    cut = 0
    for line in listed.splitlines():
        if f"pid={from_pid}," not in line:
            continue
        local = line.split()[2]  # (state is filtered: recv-q, send-q, local, peer, process)
        sport = local.rsplit(":", 1)[1]
        subprocess.run(
            ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{port}", "sport", "=", f":{sport}"],
            capture_output=True, check=True,
        )  # fmt: skip
        cut += 1
    return cut


def test_a_broken_link_between_orchestrators_loses_nothing(cluster, pg_url, tmp_path):
    """Sent through the second, running on the first's worker, when the link between the two
    orchestrators breaks (its TCP connection reset by the kernel; both stay up): the step runs
    on to its end, its outcome is kept in the database for the second, which answers its
    client with it — run once, succeeded, never run again."""
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    second, second_url, second_env = _serve_other(cluster, "second", *database)
    worker = cluster.worker(cluster.mint("w1"))
    go, runs = tmp_path / "go", tmp_path / "runs"
    command = (
        f"echo run >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.05; done; echo finished"
    )
    client = cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--arg", f"command={command}",
        "--target", "w1", "--server", second_url, "--json", env=second_env,
    )  # fmt: skip
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started")
    assert _cut_links(second.p.pid, first_url) >= 1
    wait_until(
        lambda: "broke while step" in first.log.read_text(),
        what="the first to see the link break and run the step on",
    )
    go.touch()
    assert client.wait_exit() == 0, client.lines
    result = result_of(client.events())
    assert (result["status"], result["worker"]) == ("succeeded", "w1"), result
    assert runs.read_text().count("run") == 1  # never run again
    assert not [e for e in client.events() if e.get("event", {}).get("kind") == "redispatch"]
    assert _rows(pg_url, "SELECT count(*) FROM swamp_shared_outcome") == [(0,)]  # taken
    assert worker.p.poll() is None


def test_a_client_that_leaves_stops_its_step_on_the_other_orchestrators_worker(cluster, pg_url):
    """Ctrl-C on a client of the second, its step running on the first's worker: the link
    stands, so the step is cancelled there (not run on as after a broken link)."""
    database = ("--database", pg_url)
    cluster.serve(*database)
    _, second_url, second_env = _serve_other(cluster, "second", *database)
    worker = cluster.worker(cluster.mint("w1"))
    client = cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--arg",
        "command=echo started; sleep 60", "--target", "w1", "--server", second_url, "--json",
        env=second_env,
    )  # fmt: skip
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started")
    client.signal(signal.SIGINT)
    assert client.wait_exit() == 130
    finished = worker.wait_for(lambda e: e.get("event") == "dispatch_finished")
    assert finished.get("status") != "succeeded", finished
    wait_until(
        lambda: _lease_states(pg_url) == ["cancelled"],
        what="the first's lease of it to end cancelled",
    )


def _client_of_both(cluster, first_url: str, second_url: str, *args: str):
    """A client given both orchestrators (``--server A,B``) with a server token good at
    both (minted through the first: the database holds it): one whose orchestrator dies
    follows its step through the other."""
    name = f"client{len(cluster.procs)}"
    minted = cluster.cli_json("server", "token", "create", name, "--scope", "admin")
    return cluster.spawn(
        "model", "method", "run", *args, "--server", f"{first_url},{second_url}", "--json",
        env={"SWAMP_SERVER_TOKEN": minted["token"]},
    )  # fmt: skip


def _recorded(client) -> str:
    return client.wait_for(lambda e: e.get("event", {}).get("kind") == "recorded")["event"][
        "stepId"
    ]


def test_a_client_whose_orchestrator_dies_reads_its_step_through_the_survivor(
    cluster, pg_url, tmp_path
):
    """Sent through the first, running on the second's worker, when the first is killed: the
    step runs on there; the client, told its connection closed, follows the step through the
    second, which took the dead one's steps over and answers with the outcome the run gave —
    the same result and exit status, run once."""
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    second, second_url, second_env = _serve_other(cluster, "second", *database)
    worker = _fleet_worker(cluster, second_url)
    name = worker.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    # a model whose file holds a value no JSON can (a TOML date), overridden by the run: the
    # step runs (its record holds the arguments as checked) and the orchestrator stays up
    (cluster.repo / "models" / "dated.toml").write_text(
        'type = "swamp/echo"\n[args]\nmessage = 2024-01-01\n'
    )
    dated = cluster.cli(
        "model", "method", "run", "dated", "echo", "--arg", "message=hi", "--label",
        "fleet=edge", "--server", first_url, "--json",
    )  # fmt: skip
    assert dated.returncode == 0, dated.stderr
    go, runs = tmp_path / "go", tmp_path / "runs"
    command = f"echo run >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.05; done"
    client = _client_of_both(
        cluster, first_url, second_url,
        "command/shell", "run", "--arg", f"command={command}; echo finished",
        "--label", "fleet=edge",
    )  # fmt: skip
    step_id = _recorded(client)
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started")
    first.signal(signal.SIGKILL)
    first.wait_exit()
    wait_until(
        lambda: "following step" in client.log.read_text() or client.p.poll() is not None,
        what="the client to follow its step through the second",
    )
    wait_until(
        lambda: "took over 1 step(s)" in second.log.read_text(),
        what="the second to take the dead one's step over",
    )
    go.touch()
    assert client.wait_exit() == 0, client.lines
    result = result_of(client.events())
    assert (result["status"], result["worker"]) == ("succeeded", name), result
    assert runs.read_text().count("run") == 1  # never run again
    assert f"following step {step_id}" in client.log.read_text()
    recorded = _rows(pg_url, f"SELECT outcome IS NOT NULL FROM swamp_step WHERE id = '{step_id}'")
    assert recorded == [(True,)]
    assert "Traceback" not in second.log.read_text()
    # bad input on the new surfaces: one line, exit 2, nothing changed
    for bad in ("x" * 65, ""):
        refused = cluster.cli(
            "model", "method", "follow", bad, "--server", second_url, env=second_env
        )
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    unknown = cluster.cli(
        "model", "method", "follow", "0" * 32, "--server", second_url, env=second_env
    )
    assert unknown.returncode == 2 and "no step" in unknown.stderr, unknown.stderr


def test_the_waiting_and_running_steps_of_a_dead_orchestrator_are_taken_over(
    cluster, pg_url, tmp_path
):
    """Two steps through the first, which holds the only worker: one runs on it, one waits
    (the worker has one slot). The first is killed: its worker carries the running copy to
    the second, which takes both steps over — the running one adopted where it runs, the
    waiting one run again after the fence, once the slot is free. Each client follows its
    step through the second and gets its result: nothing lost, nothing run twice."""
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    second, second_url, _ = _serve_other(cluster, "second", *database)
    worker = _fleet_worker(cluster, first_url, second_url)
    go, runs = tmp_path / "go", tmp_path / "runs"
    command = f"echo run >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.05; done"
    running = _client_of_both(
        cluster, first_url, second_url,
        "command/shell", "run", "--arg", f"command={command}", "--label", "fleet=edge",
    )  # fmt: skip
    running.wait_for(lambda e: e.get("event", {}).get("line") == "started")
    waiting = _client_of_both(
        cluster, first_url, second_url,
        "swamp/echo", "echo", "--arg", "message=waited", "--label", "fleet=edge",
    )  # fmt: skip
    waiting.wait_for(lambda e: e.get("event", {}).get("kind") == "queued")

    wait_until(
        lambda: _lease_states(pg_url) == ["active"],
        what="the running step's lease in the database (written behind)",
    )
    mark = worker.mark()
    first.signal(signal.SIGKILL)
    first.wait_exit()
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    wait_until(
        lambda: "took over 2 step(s)" in second.log.read_text(),
        what="the second to take both steps over",
    )
    worker.wait_for(lambda e: e.get("event") == "adopted", start=mark)
    go.touch()
    assert running.wait_exit() == 0, running.lines
    assert result_of(running.events())["status"] == "succeeded"
    assert waiting.wait_exit() == 0, waiting.lines
    assert result_of(waiting.events())["status"] == "succeeded"
    assert runs.read_text().count("run") == 1  # the running copy ran on: never again
    assert _rows(pg_url, "SELECT count(*) FROM swamp_step WHERE outcome IS NULL") == [(0,)]


def _state(pid: str) -> str | None:
    """A process's state as /proc says (``T``: stopped), ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_a_running_step_is_carried_to_the_survivor_and_runs_on(cluster, pg_url, tmp_path):
    """Sent through the first, running on the first's worker, when the first is killed: the
    worker keeps the step's command running, moves to the second and lists it; the second
    adopts it once the dead one is buried, and the run goes on to its end there — the same
    process, run once. The client follows the step through the second and gets its result;
    the lease moved to the second, which ended it."""
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    second, second_url, _ = _serve_other(cluster, "second", *database)
    worker = _fleet_worker(cluster, first_url, second_url)
    go, runs = tmp_path / "go", tmp_path / "runs"
    command = (
        f"echo $$ >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.05; done; echo finished"
    )
    client = _client_of_both(
        cluster, first_url, second_url,
        "command/shell", "run", "--arg", f"command={command}", "--label", "fleet=edge",
    )  # fmt: skip
    step_id = _recorded(client)
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started")
    [pid] = runs.read_text().split()
    wait_until(
        lambda: _lease_states(pg_url) == ["active"],
        what="the running step's lease in the database (written behind)",
    )
    [(first_id,)] = _rows(pg_url, "SELECT id FROM swamp_orchestrator ORDER BY started_epoch")[:1]
    mark = worker.mark()
    first.signal(signal.SIGKILL)
    first.wait_exit()
    carrying = worker.wait_for(lambda e: e.get("event") == "carrying", start=mark)
    assert carrying["dispatches"] == 1 and carrying["seconds"] > 0, carrying
    # paused while carried (through the worker's reaper): no effect before it is adopted
    wait_until(lambda: _state(pid) == "T", what="the carried command paused")
    assert '"event": "adopted"' not in "\n".join(worker.lines[mark:])  # (not yet)
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    worker.wait_for(lambda e: e.get("event") == "adopted", start=mark)
    wait_until(lambda: _state(pid) not in ("T", None), what="the adopted command going on")
    assert _state(pid) != "Z"  # the same process runs on
    go.touch()
    assert client.wait_exit() == 0, client.lines
    result = result_of(client.events())
    assert result["status"] == "succeeded", result
    assert runs.read_text().split() == [pid]  # run once
    assert f"following step {step_id}" in client.log.read_text()
    [lease] = [json.loads(a) for a in _latest(pg_url, "swamp/step-lease")]
    assert (lease["state"], lease["carriedFrom"]) == ("completed", first_id), lease
    assert lease["orchestrator"] != first_id and "carriedBy" not in lease
    assert "adopted dispatch" in second.log.read_text()
    assert "Traceback" not in second.log.read_text()


def test_a_run_carried_away_from_a_living_holder_stops_before_it_runs_again(
    cluster, pg_url, tmp_path
):
    """The worker's connection to the first is reset (the first stays up): the worker carries
    its running step to the second, which does not adopt it — its holder lives, and its own
    lease rules decide — so the copy stops, and the first runs the step again after the fence,
    once that copy is gone: two runs, never at once."""
    database = ("--database", pg_url)
    cluster.serve(*database)
    first_url = cluster.url
    second, second_url, _ = _serve_other(cluster, "second", *database)
    worker = _fleet_worker(cluster, first_url, second_url)
    go, runs, overlaps = tmp_path / "go", tmp_path / "runs", tmp_path / "overlaps"
    command = (
        f"for p in $(cat {runs} 2>/dev/null); do kill -0 $p 2>/dev/null && "
        f"echo $p >> {overlaps}; done; echo $$ >> {runs}; echo started; "
        f"while [ ! -e {go} ]; do sleep 0.05; done"
    )
    client = cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--arg", f"command={command}",
        "--label", "fleet=edge", "--json",
    )  # fmt: skip
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started")
    [first_copy] = runs.read_text().split()
    mark = worker.mark()
    assert _cut_links(worker.p.pid, first_url) >= 1
    worker.wait_for(lambda e: e.get("event") == "carrying", start=mark)
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    stopped = worker.wait_for(
        lambda e: e.get("event") == "dispatch_finished" and e.get("status") == "stopped",
        start=mark,
    )
    assert "did not take it over" in stopped["error"], stopped
    client.wait_for(lambda e: e.get("event", {}).get("kind") == "redispatch")
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started", start=client.mark())
    go.touch()
    assert client.wait_exit() == 0, client.lines
    assert result_of(client.events())["status"] == "succeeded"
    assert runs.read_text().split()[0] == first_copy and len(runs.read_text().split()) == 2
    assert not overlaps.exists(), overlaps.read_text()  # the first copy was gone
    assert "adopted dispatch" not in second.log.read_text()


class _ItsLock:
    """An orchestrator's liveness lock, as the test takes it: its connection ended by the
    server (``pg_terminate_backend``), and — :meth:`held_while` — the lock taken and held
    here (the server queues this session: it holds the lock the moment the ended one lets it
    go, before the orchestrator asks again; it tries, never waits, every second or two)."""

    def __init__(self, pg_url: str, url: str) -> None:
        from swamp.domain.peers import liveness_lock
        from swamp.store.pg_locks import lock_key

        self.pg_url = pg_url
        [(me,)] = _rows(pg_url, f"SELECT id FROM swamp_orchestrator WHERE url = '{url}'")
        self.key = lock_key(liveness_lock(me))
        unsigned = self.key & 0xFFFF_FFFF_FFFF_FFFF
        self.holder = (
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
            f"AND classid = {unsigned >> 32} AND objid = {unsigned & 0xFFFF_FFFF}"
        )

    def end_its_connection(self) -> None:
        [(pid,)] = _rows(self.pg_url, self.holder)
        _rows(self.pg_url, f"SELECT pg_terminate_backend({pid})")

    def held_while(self, checks) -> None:
        """Its connection ended and its lock held here while ``checks()`` runs (in a thread:
        it may block), given back after."""
        from swamp.store import pg

        async def hold() -> None:
            async with await pg.connect(self.pg_url) as conn:
                [(pid,)] = (await conn.execute(self.holder)).rows
                await conn.execute("SELECT pg_terminate_backend($1)", (pid,))
                await conn.execute("SELECT pg_advisory_lock($1)", (self.key,))
                await trio.to_thread.run_sync(checks)

        trio.run(hold)


def test_an_orchestrator_that_loses_its_hold_on_the_database_lets_its_workers_go(
    cluster, pg_url, tmp_path
):
    """The first's liveness lock lost and held by another (as a peer looking at it would, or
    as the server frees it for a connection cut off): with serve's short heartbeat it lets
    its workers go at once, so the step running there stops instead of running on beside a
    copy a peer may start; the worker moves to the second; a worker given only the first is
    refused saying why, and so is a step sent through it. The step, queued again after the
    fence, is claimed by the second and succeeds: run twice, never at once."""
    database = ("--database", pg_url)
    first = cluster.serve(*database)
    first_url = cluster.url
    _, second_url, second_env = _serve_other(cluster, "second", *database)
    worker = _fleet_worker(cluster, first_url, second_url)
    name = worker.events()[-1]["workerName"]
    go, runs = tmp_path / "go", tmp_path / "runs"
    client, first_copy = _held_step(cluster, "fleet=edge", go, runs)
    its_lock = _ItsLock(pg_url, first_url)
    mark = worker.mark()

    def checks() -> None:
        worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
        # its first copy stopped as its socket closed: its process is gone
        wait_until(
            lambda: not os.path.exists(f"/proc/{first_copy}"),
            what="the first copy's process to end",
        )
        listed = cluster.cli_json("worker", "list", "--server", second_url, env=second_env)
        assert [(w["name"], w.get("orchestrator")) for w in listed["workers"]] == [
            (name, second_url)
        ]
        # a worker that knows only the first is refused while it lets workers go
        only_first = _spawn_fleet_worker(cluster, first_url)
        said = only_first.wait_for(lambda e: e.get("event") == "disconnected")
        assert "lost its hold on its PostgreSQL database" in said["reason"], said
        assert "let its 1 worker(s) go" in first.log.read_text()
        # a step sent through it meanwhile is refused at once, saying why
        refused = cluster.cli("model", "method", "run", "swamp/echo", "echo",
                              "--arg", "message=x", "--label", "fleet=edge")  # fmt: skip
        assert refused.returncode != 0
        assert "lost its hold on its PostgreSQL database" in refused.stderr, refused.stderr
        # its step, queued again after the fence, is claimed by the second and runs there
        wait_until(lambda: len(runs.read_text().split()) == 2, what="the step to run again")
        go.touch()
        assert client.wait_exit() == 0
        assert result_of(client.events())["status"] == "succeeded"

    its_lock.held_while(checks)


def test_a_lone_orchestrator_keeps_its_workers_through_a_blip_and_takes_them_back(
    cluster, pg_url, tmp_path
):
    """Alone on its database, with a heartbeat that leaves it time (4 s: it may go 5 s
    without its lock): its lock's connection ended and taken back at once changes nothing —
    the step runs on, the worker stays. Its lock held elsewhere, it lets the worker go no
    sooner than that wait, refuses it meanwhile saying why, and once it holds the lock
    again takes it back; the step, stopped with the socket, runs again and succeeds."""
    first = cluster.serve("--database", pg_url, "--heartbeat", "4s")
    worker = _spawn_fleet_worker(cluster, cluster.url)
    worker.wait_for(lambda e: e.get("event") == "enrolled")
    go, runs = tmp_path / "go", tmp_path / "runs"
    client, first_copy = _held_step(cluster, "fleet=solo", go, runs)
    its_lock = _ItsLock(pg_url, cluster.url)

    # a blip: the connection ended, the lock taken back at once
    mark = worker.mark()
    its_lock.end_its_connection()
    wait_until(
        lambda: "took its liveness lock back within 5s" in first.log.read_text(),
        what="the lock taken back in time",
    )
    assert [e for e in worker.events()[mark:] if e.get("event") == "disconnected"] == []
    assert os.path.exists(f"/proc/{first_copy}") and runs.read_text().split() == [first_copy]

    # held elsewhere: let go after the wait, refused meanwhile, taken back once it is free
    mark = worker.mark()
    before = time.time()

    def checks() -> None:
        dropped = worker.wait_for(lambda e: e.get("event") == "disconnected", start=mark)
        at = datetime.fromisoformat(dropped["time"].replace("Z", "+00:00")).timestamp()
        assert at - before >= 5 - 0.01, at - before  # not before the wait (clock rounding)
        refused = worker.wait_for(
            lambda e: "lost its hold on its PostgreSQL database" in e.get("reason", ""),
            start=mark,
        )
        assert refused["event"] == "disconnected"
        wait_until(
            lambda: not os.path.exists(f"/proc/{first_copy}"),
            what="the first copy's process to end",
        )

    its_lock.held_while(checks)
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    assert "holds its liveness lock again: takes workers again" in first.log.read_text()
    wait_until(lambda: len(runs.read_text().split()) == 2, what="the step to run again")
    go.touch()
    assert client.wait_exit() == 0
    assert result_of(client.events())["status"] == "succeeded"


def _held_step(cluster, label: str, go, runs):
    """A client running a step on ``label`` that appends its pid to ``runs`` and runs until
    ``go`` exists; started: the client and the first copy's pid."""
    command = f"echo $$ >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.05; done"
    client = cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--arg", f"command={command}",
        "--label", label, "--json",
    )  # fmt: skip
    client.wait_for(lambda e: e.get("event", {}).get("line") == "started")
    [first_copy] = runs.read_text().split()
    return client, first_copy


def _spawn_fleet_worker(cluster, *urls: str):
    """A worker of the fleet token ``solo`` given ``urls``, not waited for."""
    token = cluster.mint_fleet("solo", "2")
    return cluster.spawn(
        "worker", "connect", ",".join(urls), "--json", env={"SWAMP_WORKER_TOKEN": token}
    )
