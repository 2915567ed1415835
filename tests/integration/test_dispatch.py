"""Enroll real workers and dispatch to them through a real orchestrator."""

import pytest

from tests.integration.conftest import logs_of, result_of

pytestmark = pytest.mark.integration


def test_dispatch_by_target_and_by_label_and_read_the_result_back(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("alpha"), "--label", "zone=a")
    cluster.worker(cluster.mint("beta"), "--label", "zone=b", "--label", "gpu=true")

    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=echo on-alpha", "--target", "alpha"
    )
    assert code == 0
    assert result_of(lines)["worker"] == "alpha"
    assert "on-alpha" in logs_of(lines)
    dispatched = [e["event"] for e in lines if e.get("event", {}).get("kind") == "dispatched"]
    assert dispatched[0]["worker"] == "alpha"

    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=echo gpu-job", "--label", "gpu=true"
    )
    assert code == 0 and result_of(lines)["worker"] == "beta"
    # each ad-hoc run is an instance of its own: its result is version 1 of its own data
    assert result_of(lines)["outputs"] == [{"spec": "result", "name": "result", "version": 1}]

    # The resource the worker wrote over the data plane is data at the orchestrator.
    records = cluster.query('modelType == "command/shell" && attributes.stdoutTail == "gpu-job"')
    assert len(records) == 1 and records[0]["attributes"]["exitCode"] == 0
    # ...and so is the lease (one row) and every real status change of a worker: busy and
    # idle are the live pool's, not versions.
    leases = cluster.query('modelType == "swamp/step-lease" && attributes.state == "completed"')
    assert {e["attributes"]["workerName"] for e in leases} == {"alpha", "beta"}
    statuses = cluster.cli_json(
        "data",
        "query",
        'modelType == "swamp/worker" && modelName == "alpha"',
        "--all-versions",
        "--repo-dir",
        str(cluster.repo),
    )
    assert [r["attributes"]["status"] for r in statuses] == ["idle"]
    every_lease = cluster.query('modelType == "swamp/step-lease"', "--all-versions")
    assert len(every_lease) == 2  # one row each, however long the dispatch ran

    listed = {
        w["name"]: w for w in cluster.cli_json("worker", "list", "--server", cluster.url)["workers"]
    }
    assert listed["beta"]["labels"] == {"zone": "b", "gpu": "true"}
    assert listed["alpha"]["status"] == "idle" and listed["alpha"]["capacity"] == 1
    for key in ("platform", "arch", "activeDispatchIds", "lastSeenAt"):
        assert key in listed["alpha"]


def test_a_failing_command_fails_the_dispatch_with_its_exit_code(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=echo bad >&2; exit 7", "--target", "w1"
    )
    assert code == 1
    result = result_of(lines)
    assert result["status"] == "failed" and "status 7" in result["error"]
    lease = cluster.query('modelType == "swamp/step-lease"')[0]["attributes"]
    assert lease["state"] == "failed" and "status 7" in lease["error"]


def test_remote_context_capabilities(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    (cluster.repo / "models" / "probe.toml").write_text('type = "test/steps"\n')
    code, lines = cluster.run("probe", "round_trip", "--arg", "value=42", "--target", "w1")
    assert code == 0, lines
    assert "read back 42 missing=None" in logs_of(lines)

    # a later run of the same model reads what the first wrote...
    code, lines = cluster.run(
        "probe", "query", "--arg", 'predicate=modelType == "test/steps"', "--target", "w1"
    )
    assert code == 0 and "found 1" in logs_of(lines)
    # ...an ad-hoc run (an instance of its own) does not
    code, lines = cluster.run(
        "test/steps", "query", "--arg", 'predicate=modelType == "test/steps"', "--target", "w1"
    )
    assert code == 0 and "found 0" in logs_of(lines)

    # tokens are not data a dispatch can see (test_disclosure covers the oracle)
    code, lines = cluster.run(
        "test/steps",
        "query",
        "--arg",
        'predicate=modelType == "swamp/enrollment-token"',
        "--target",
        "w1",
    )
    assert code == 0 and "found 0" in logs_of(lines)


def test_named_environment_is_shipped_and_swamp_credentials_never(cluster):
    cluster.env["SHIPPED_SETTING"] = "from-the-orchestrator"
    cluster.env["SWAMP_SECRET_THING"] = "must-not-cross"
    cluster.serve("--ship-env", "SHIPPED_SETTING")
    worker_env_token = cluster.mint("w1")
    cluster.env.pop("SHIPPED_SETTING")
    cluster.worker(worker_env_token)
    for name, expected in (
        ("SHIPPED_SETTING", "from-the-orchestrator"),
        ("SWAMP_SECRET_THING", "<unset>"),
        ("SWAMP_WORKER_TOKEN", "<unset>"),
        ("SWAMP_ATTEMPT", "1"),  # what swamp tells a command about its step
    ):
        code, lines = cluster.run("test/steps", "env", "--arg", f"name={name}", "--target", "w1")
        assert code == 0 and f"{name}={expected}" in logs_of(lines)


def test_without_placement_it_runs_in_the_orchestrator_or_here(cluster):
    cluster.serve()
    code, lines = cluster.run("command/shell", "run", "--arg", "command=echo in-serve")
    assert code == 0 and result_of(lines).get("worker") is None
    assert "in-serve" in logs_of(lines)
    result = cluster.cli(
        "model",
        "method",
        "run",
        "command/shell",
        "run",
        "--arg",
        "command=echo here",
        "--repo-dir",
        str(cluster.repo),
    )
    assert result.returncode == 0 and "[orchestrator] here" in result.stdout


def test_model_instances_from_the_repo(cluster):
    (cluster.repo / "models" / "hello.toml").write_text(
        'type = "command/shell"\n[args]\ncommand = "echo instance-$WHO"\n'
    )
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    code, lines = cluster.run(
        "hello", "run", "--target", "w1", env={"WHO": "ignored-by-the-client"}
    )
    assert code == 0 and result_of(lines)["model"] == "hello"
    assert cluster.query('modelName == "hello"')[0]["attributes"]["exitCode"] == 0


def test_no_matching_worker_waits_then_times_out_clearly_and_runs_nothing(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("w1"), "--label", "zone=a")
    code, lines = cluster.run(
        "command/shell",
        "run",
        "--arg",
        "command=true",
        "--label",
        "zone=mars",
        "--queue-timeout",
        "1s",
    )
    assert code == 1
    assert lines[0]["event"]["kind"] == "queued"
    assert lines[-1]["error"] == {
        "code": "queue_timeout",
        "message": "timed out waiting for a worker matching labels zone=mars to become available",
    }
    assert cluster.query('modelType == "swamp/step-lease"') == []


def test_an_idle_worker_is_last_seen_at_its_last_heartbeat(cluster):
    """Nothing dispatched: LAST SEEN still moves with the heartbeats (1 s here), through the
    server; nothing is written per heartbeat (the records keep the enrollment's time)."""
    import time
    from datetime import datetime

    cluster.serve()
    cluster.worker(cluster.mint("idle"))

    def seen() -> float:
        [w] = cluster.cli_json("worker", "list", "--server", cluster.url)["workers"]
        return datetime.fromisoformat(w["lastSeenAt"].replace("Z", "+00:00")).timestamp()

    [before] = cluster.workers()  # the repo's records
    first = seen()
    time.sleep(3)
    second, now = seen(), time.time()
    assert second > first and now - second < 2.5
    [after] = cluster.workers()
    assert after["lastSeenAt"] == before["lastSeenAt"]  # no write per heartbeat
