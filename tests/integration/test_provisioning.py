"""Fleet provisioning on real processes: env-only workers, worker verify, verify-on-enroll,
and a third-party probe plugin installed with pip."""

import json
import subprocess
import sys

import pytest

from tests.integration.conftest import ROOT, logs_of, result_of, wait_until

pytestmark = pytest.mark.integration


def _fleet(cluster, name="fleet", allowance="10"):
    return cluster.cli_json(
        "worker",
        "token",
        "create",
        name,
        "--duration",
        "1h",
        "--max-enrollments",
        allowance,
        "--repo-dir",
        str(cluster.repo),
    )["token"]


def _env_worker(cluster, env: dict, *args: str, wait: bool = True):
    """``swamp worker connect`` configured by environment variables (and ``args``) only."""
    proc = cluster.spawn("worker", "connect", "--json", *args, env=env)
    if wait:
        proc.wait_for(lambda e: e.get("event") == "enrolled")
    return proc


def _verify(cluster, *args: str, env: dict | None = None):
    result = cluster.cli("worker", "verify", *args, "--json", "--server", cluster.url, env=env)
    return (
        result.returncode,
        json.loads(result.stdout) if result.stdout.strip() else None,
        result.stderr,
    )


def test_a_worker_needs_nothing_but_environment_variables(cluster):
    cluster.serve()
    token = _fleet(cluster)
    token_file = cluster.tmp / "token"
    token_file.write_text(token + "\n")  # as a Kubernetes secret mount would hold it
    proc = _env_worker(
        cluster,
        {
            "SWAMP_ORCHESTRATOR_URL": cluster.url,
            "SWAMP_WORKER_TOKEN_FILE": str(token_file),
            "SWAMP_WORKER_LABELS": "zone=a,gpu=true",
            "SWAMP_WORKER_CACHE_DIR": str(cluster.tmp / "env-cache"),
            "SWAMP_WORKER_CONCURRENCY": "2",
        },
    )
    assert (cluster.tmp / "env-cache" / "machine-id").exists()
    [worker] = cluster.workers()
    assert worker["labels"] == {"zone": "a", "gpu": "true", "fleet": "fleet"}
    assert worker["capacity"] == 2

    # a flag beats its variable; labels merge key by key
    flagged = _env_worker(
        cluster,
        {
            "SWAMP_ORCHESTRATOR_URL": "ws://127.0.0.1:9",
            "SWAMP_WORKER_TOKEN": token,
            "SWAMP_WORKER_LABELS": "zone=a,gpu=true",
        },
        cluster.url,
        "--label",
        "zone=b",
    )
    name = flagged.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    labels = {w["name"]: w["labels"] for w in cluster.workers()}[name]
    assert labels == {"zone": "b", "gpu": "true", "fleet": "fleet"}

    # the token never reaches what a method spawns, nor its environment
    code, lines = cluster.run(
        "command/shell",
        "run",
        "--arg",
        "command=env; cat /proc/$PPID/cmdline | tr '\\0' ' '",
        "--target",
        name,
    )
    assert code == 0
    output = "\n".join(logs_of(lines))
    assert token.split(".", 1)[1] not in output
    assert "SWAMP_WORKER_TOKEN" not in output and "SWAMP_ORCHESTRATOR_URL" not in output
    assert proc.p.poll() is None


@pytest.mark.parametrize(
    "env,args,needle",
    [
        ({"SWAMP_WORKER_TOKEN": "x.y"}, [], "SWAMP_ORCHESTRATOR_URL"),
        ({"SWAMP_ORCHESTRATOR_URL": "ws://127.0.0.1:9"}, [], "SWAMP_WORKER_TOKEN_FILE"),
        (
            {
                "SWAMP_ORCHESTRATOR_URL": "ws://127.0.0.1:9",
                "SWAMP_WORKER_TOKEN": "x.y",
                "SWAMP_WORKER_LABELS": "zone=a,broken",
            },
            [],
            "invalid label 'broken' in SWAMP_WORKER_LABELS",
        ),
        (
            {"SWAMP_ORCHESTRATOR_URL": "ws://127.0.0.1:9", "SWAMP_WORKER_TOKEN": "x.y"},
            ["--label", "a b=c"],
            "invalid label 'a b=c' in --label",
        ),
        (
            {
                "SWAMP_ORCHESTRATOR_URL": "ws://127.0.0.1:9",
                "SWAMP_WORKER_TOKEN": "x.y",
                "SWAMP_WORKER_TOKEN_FILE": "/nonexistent",
            },
            [],
            "not both",
        ),
        (
            {"SWAMP_ORCHESTRATOR_URL": "https://u:hunter2@h", "SWAMP_WORKER_TOKEN": "x.y"},
            [],
            "must start with ws:// or wss://",
        ),
    ],
)
def test_worker_configuration_errors_name_their_source(cluster, env, args, needle):
    result = cluster.cli("worker", "connect", *args, env=env)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr


def test_worker_verify_selects_and_reports_every_seam(cluster):
    cluster.serve()
    token = _fleet(cluster)
    gpu = cluster.worker(token, "--label", "gpu=true").wait_for(
        lambda e: e.get("event") == "enrolled"
    )["workerName"]
    plain = cluster.worker(token).wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    broken = cluster.worker(token, "--data-plane-url", "http://127.0.0.1:9").wait_for(
        lambda e: e.get("event") == "enrolled"
    )["workerName"]
    versions_before = len(
        cluster.cli_json(
            "data",
            "query",
            'modelType == "swamp/worker"',
            "--all-versions",
            "--repo-dir",
            str(cluster.repo),
        )
    )

    code, data, _ = _verify(cluster)
    assert code == 1
    by_name = {v["name"]: v for v in data["workers"]}
    assert (data["total"], data["passed"], data["failed"]) == (3, 2, 1)
    for name in (gpu, plain):
        assert by_name[name]["status"] == "pass"
        assert set(by_name[name]["seams"]) == {"env", "capability", "data-plane"}
        assert by_name[name]["platform"] and by_name[name]["arch"]
    failed = by_name[broken]
    assert failed["status"] == "fail"
    assert failed["seams"]["data-plane"]["ok"] is False
    assert failed["seams"]["env"]["ok"] and failed["seams"]["capability"]["ok"]
    assert failed["failures"][0].startswith("data-plane: ")

    text = cluster.cli("worker", "verify", "--server", cluster.url)
    assert text.returncode == 1
    assert "✗ fail" in text.stdout and "data-plane:" in text.stdout
    assert "1 failed of 3 worker(s)." in text.stdout

    code, data, _ = _verify(cluster, "--label", "gpu=true")
    assert code == 0 and [v["name"] for v in data["workers"]] == [gpu]
    code, data, _ = _verify(cluster, plain)
    assert code == 0 and [v["name"] for v in data["workers"]] == [plain]
    result = cluster.cli("worker", "verify", "ghost", "--server", cluster.url)
    assert result.returncode != 0 and "no connected worker named 'ghost'" in result.stderr
    result = cluster.cli("worker", "verify", "--label", "zone=nowhere", "--server", cluster.url)
    assert result.returncode == 1 and "No connected workers matching" in result.stderr

    # probing changed no worker's status: not one new status version
    after = cluster.cli_json(
        "data",
        "query",
        'modelType == "swamp/worker"',
        "--all-versions",
        "--repo-dir",
        str(cluster.repo),
    )
    assert len(after) == versions_before
    assert {w["status"] for w in cluster.workers()} == {"idle"}


def test_verify_needs_a_running_orchestrator(cluster):
    result = cluster.cli("worker", "verify", "--repo-dir", str(cluster.repo))
    assert result.returncode == 1 and "needs a running orchestrator" in result.stderr


def test_verify_on_enroll_keeps_broken_workers_out(cluster):
    serve = cluster.serve("--verify-on-enroll")
    token = _fleet(cluster)
    broken = cluster.worker(
        token, "--label", "pool=x", "--data-plane-url", "http://127.0.0.1:9"
    ).wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    wait_until(lambda: "failed verification" in serve.log.read_text(), what="the verdict")
    listed = {
        w["name"]: w for w in cluster.cli_json("worker", "list", "--server", cluster.url)["workers"]
    }
    assert listed[broken]["status"] == "unverified"
    assert listed[broken]["verifyFailureReason"].startswith("data-plane: ")
    text = cluster.cli("worker", "list", "--repo-dir", str(cluster.repo)).stdout
    assert f"{broken} is unverified: data-plane:" in text

    # placed work never runs on it: it waits for a verified worker, and times out
    code, lines = cluster.run(
        "command/shell",
        "run",
        "--arg",
        "command=true",
        "--label",
        "pool=x",
        "--queue-timeout",
        "1s",
    )
    assert code == 1 and lines[-1]["error"]["code"] == "queue_timeout"
    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=true", "--target", broken, "--queue-timeout", "1s"
    )
    assert code == 1 and lines[-1]["error"]["code"] == "queue_timeout"
    assert "is unverified (data-plane: " in lines[0]["event"]["detail"]  # said while it waited

    healthy = cluster.worker(token, "--label", "pool=x").wait_for(
        lambda e: e.get("event") == "enrolled"
    )["workerName"]
    wait_until(
        lambda: {w["name"]: w["status"] for w in cluster.workers()}.get(healthy) == "idle",
        what="the healthy worker to pass",
    )
    for _ in range(3):
        code, lines = cluster.run(
            "command/shell", "run", "--arg", "command=true", "--label", "pool=x"
        )
        assert code == 0 and result_of(lines)["worker"] == healthy
    history = [
        r["attributes"]["status"]
        for r in cluster.cli_json(
            "data",
            "query",
            f'modelType == "swamp/worker" && modelName == "{healthy}"',
            "--all-versions",
            "--repo-dir",
            str(cluster.repo),
        )
    ]
    assert history[:2] == ["unverified", "idle"]
    # a manual verify of the unverified worker does not promote it
    code, data, _ = _verify(cluster, broken)
    assert code == 1 and {w["name"]: w["status"] for w in cluster.workers()}[broken] == "unverified"


def test_without_the_flag_enrollment_is_unchanged(cluster):
    serve = cluster.serve()
    cluster.worker(cluster.mint("w1"), "--data-plane-url", "http://127.0.0.1:9")
    assert cluster.workers()[0]["status"] == "idle"
    assert "verification" not in serve.log.read_text()


def test_a_pip_installed_plugin_adds_its_seam_and_uninstalled_it_is_gone(cluster):
    site = cluster.tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(ROOT / "plugins" / "swamp-diskspace"),
        ],
        check=True,
        capture_output=True,
    )
    cluster.serve()
    token = _fleet(cluster)
    with_plugin = {"PYTHONPATH": f"{site}:{cluster.env['PYTHONPATH']}"}
    roomy = cluster.spawn(
        "worker",
        "connect",
        cluster.url,
        "--json",
        env={**with_plugin, "SWAMP_WORKER_TOKEN": token, "SWAMP_DISKSPACE_MIN_FREE_MB": "1"},
    )
    cramped = cluster.spawn(
        "worker",
        "connect",
        cluster.url,
        "--json",
        env={
            **with_plugin,
            "SWAMP_WORKER_TOKEN": token,
            "SWAMP_DISKSPACE_MIN_FREE_MB": str(10**12),
        },
    )
    without = cluster.worker(token)
    names = {}
    for key, proc in (("roomy", roomy), ("cramped", cramped), ("without", without)):
        names[key] = proc.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    code, data, _ = _verify(cluster)
    by_name = {v["name"]: v for v in data["workers"]}
    assert by_name[names["roomy"]]["status"] == "pass"
    assert by_name[names["roomy"]]["seams"]["disk-space"]["ok"] is True
    cramped_verdict = by_name[names["cramped"]]
    assert cramped_verdict["status"] == "fail"
    assert cramped_verdict["failures"] == [
        f for f in cramped_verdict["failures"] if f.startswith("disk-space: ")
    ]
    assert "below the" in cramped_verdict["seams"]["disk-space"]["detail"]
    assert "disk-space" not in by_name[names["without"]]["seams"]
    assert code == 1
