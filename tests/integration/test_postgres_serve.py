"""``swamp serve --database``: one orchestrator keeping every record in a real PostgreSQL, on
real processes — a fleet token, a worker enrolled, a step run with its output, its lease, the
step's log and the worker's record in the database and none in the repo's file; the CLI in the
repo going through the server that keeps them; a restart finding what the first left (several
orchestrators at once: test_orchestrators.py)."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3

import trio

from tests.integration.conftest import logs_of, result_of, wait_until


def _rows(url: str, sql: str) -> list[tuple]:
    from swamp.store import pg

    async def read() -> list[tuple]:
        async with await pg.connect(url) as conn:
            return (await conn.execute(sql)).rows

    return trio.run(read)


def test_one_orchestrator_keeps_every_record_in_postgresql(cluster, pg_url):
    database = ("--database", pg_url)  # (no password here: on a real host, PGPASSWORD)
    serve = cluster.serve(*database)
    listening = serve.wait_for(lambda e: e.get("event") == "listening")
    assert listening["records"].startswith("postgresql://127.0.0.1:")
    token = cluster.mint_fleet("edge", "2")  # the CLI in the repo: through the server
    worker = cluster.worker(token)
    name = worker.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=echo kept in postgres", "--label", "fleet=edge"
    )
    assert code == 0, lines
    result = result_of(lines)
    assert result["status"] == "succeeded" and result["worker"] == name
    assert logs_of(lines) == ["kept in postgres"]
    assert [w["name"] for w in cluster.workers()] == [name]

    leases = _rows(pg_url, "SELECT attributes FROM data WHERE model_type = 'swamp/step-lease'")
    [lease] = [json.loads(row[0]) for row in leases]
    assert lease["workerName"] == name and lease["state"] == "completed"
    [(lines_kept,)] = _rows(pg_url, "SELECT lines FROM step_log")
    assert lines_kept == 1
    with sqlite3.connect(cluster.repo / ".swamp" / "swamp.db") as local:
        count = local.execute("SELECT count(*) FROM sqlite_master WHERE name = 'data'").fetchone()[
            0
        ]
        in_file = local.execute("SELECT count(*) FROM data").fetchone()[0] if count else 0
    assert in_file == 0  # nothing went to the repo's file

    # stopped, the CLI in the repo says where the records are instead of reading its file
    # (serve left a note of where it kept them: no URL in this shell's environment)
    serve.signal(signal.SIGTERM)
    assert serve.wait_exit() == 0
    straight = cluster.cli("worker", "list", "--repo-dir", str(cluster.repo))
    assert straight.returncode == 2 and "records are in PostgreSQL" in straight.stderr
    assert pg_url.split("@")[-1].split("/")[0] in straight.stderr

    # started again, the worker comes back to it; killed (-9), the next start finds the
    # worker it held connected, and marks it disconnected until it comes back again
    port = int(listening["url"].rsplit(":", 1)[1])  # where the worker comes back to
    mark = worker.mark()
    again = cluster.serve(*database, port=port)
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    again.signal(signal.SIGKILL)
    again.wait_exit()
    mark = worker.mark()
    third = cluster.serve(*database, port=port)
    assert third.wait_for(lambda e: e.get("event") == "listening")["reconciled"]["workers"] == 1
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    code, lines = cluster.run("swamp/echo", "echo", "--arg", "message=hi", "--target", name)
    assert code == 0, lines


def test_the_orchestrator_outlives_a_restart_of_its_database(cluster, postgres_cluster):
    """PostgreSQL stopped under a serving orchestrator: a step sent meanwhile fails saying
    why, the orchestrator stays up (its workers with it: let go, they ask again), and once the
    database is back it takes its liveness lock again, its workers come back, and steps run
    as before."""
    cluster.env["SWAMP_DATABASE_URL"] = postgres_cluster.new_database()
    serve = cluster.serve()
    token = cluster.mint_fleet("edge", "2")  # a fleet: its workers labelled fleet=edge
    worker = cluster.worker(token)
    shell = ("command/shell", "run", "--label", "fleet=edge")
    code, lines = cluster.run(*shell, "--arg", "command=echo up")
    assert code == 0, lines
    postgres_cluster.stop("fast")
    try:
        # refused at once (it let its workers go: serve's short heartbeat leaves it no
        # time to take its lock back first), or failed as it wrote: either says why
        code, lines = cluster.run(*shell, "--arg", "command=echo down")
        refusals = [line["error"] for line in lines if "error" in line]
        results = [line["result"] for line in lines if "result" in line]
        assert code != 0 and (
            [(e["code"], "lost its hold on its PostgreSQL database" in e["message"])
             for e in refusals] == [("database_unavailable", True)]
            or "PostgreSQL" in results[0]["error"]
        ), lines  # fmt: skip
        assert serve.p.poll() is None and worker.p.poll() is None
    finally:
        postgres_cluster.start_again()

    def runs_again() -> bool:
        code, _ = cluster.run(*shell, "--arg", "command=echo back")
        return code == 0

    wait_until(runs_again, what="a step to run once the database is back")
    assert serve.p.poll() is None
    wait_until(
        lambda: "holds its liveness lock again" in serve.log.read_text(),
        what="the liveness lock taken again",
    )


def test_a_database_that_is_not_one_or_cannot_be_reached_changes_nothing(cluster):
    """Bad input on the new flags (--database, --advertise-url): one line, a status, nothing
    written — the CLI in the repo still reads its own file afterwards."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    for url, status, said in (
        ("mysql://db/swamp", 2, "expected postgresql://"),
        ("admin:s3cret@db/swamp", 2, "not shown"),
        (f"postgresql://127.0.0.1:{closed}/swamp", 1, "cannot connect to PostgreSQL"),
    ):
        run = cluster.cli("serve", "--port", "0", "--database", url)
        assert run.returncode == status, run.stderr
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and said in errors[0] and "s3cret" not in run.stderr
    for extra, said in (
        (("--advertise-url", "ws://orch:7420"), "goes with --database"),
        (("--database", f"postgresql://127.0.0.1:{closed}/swamp", "--advertise-url",
          "ftp://orch:7420"), "expected ws://HOST:PORT"),
        (("--database", f"postgresql://127.0.0.1:{closed}/swamp", "--advertise-url",
          "wss://orch:7420"), "expected ws://HOST:PORT"),
    ):  # fmt: skip
        run = cluster.cli("serve", "--port", "0", *extra)
        assert run.returncode == 2, run.stderr
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and said in errors[0], run.stderr
    assert not (cluster.repo / ".swamp" / "database").exists()
    assert cluster.cli("worker", "list").returncode == 0  # the repo's file, as before
