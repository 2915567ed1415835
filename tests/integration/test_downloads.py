"""The orchestrator serves its own build: a machine downloads it, checks it, runs a worker."""

import hashlib
import json
import shutil
import subprocess
import sys
import zipapp
import zipfile

import httpx
import pytest

from swamp import __version__
from tests.integration.conftest import ROOT, wait_until

pytestmark = pytest.mark.integration


def _small_pyz(tmp, version: str | None = None) -> object:
    """A zipapp of this checkout's ``swamp`` package (its dependencies come from the
    interpreter running it): enough to show a downloaded file runs as a worker; ``version``
    makes it a build of another version."""
    staging = tmp / f"staging-{version}"
    shutil.copytree(ROOT / "swamp", staging / "swamp", ignore=shutil.ignore_patterns("__pycache__"))
    if version:
        init = staging / "swamp" / "__init__.py"
        init.write_text(init.read_text().replace(f'"{__version__}"', f'"{version}"'))
    (staging / "__main__.py").write_text("from swamp.cli import main\n\nmain()\n")
    target = tmp / f"swamp-{version}.pyz" if version else tmp / "swamp.pyz"
    zipapp.create_archive(staging, target)
    return target


def test_a_machine_downloads_the_build_checks_it_and_runs_a_worker_from_it(cluster):
    built = _small_pyz(cluster.tmp)
    serve = cluster.serve("--pyz", str(built))
    listening = serve.wait_for(lambda e: e.get("event") == "listening")
    base = cluster.url.replace("ws://", "http://")
    assert listening["download"] == f"{base}/swamp.pyz"
    answer = httpx.get(f"{base}/swamp.pyz")
    assert answer.status_code == 200
    digest = hashlib.sha256(answer.content).hexdigest()
    assert answer.headers["x-swamp-sha256"] == digest == listening["downloadSha256"]
    assert httpx.get(f"{base}/swamp.pyz.sha256").text == f"{digest}  swamp.pyz\n"
    downloaded = cluster.tmp / "machine" / "swamp.pyz"
    downloaded.parent.mkdir()
    downloaded.write_bytes(answer.content)
    worker = subprocess.Popen(
        [sys.executable, str(downloaded), "worker", "connect", cluster.url, "--json"],
        env={**cluster.env, "SWAMP_WORKER_TOKEN": cluster.mint("fromfile")},
        cwd=downloaded.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        first = worker.stdout.readline()
        while '"enrolled"' not in first and first:
            first = worker.stdout.readline()
        assert '"workerName": "fromfile"' in first
        code, _ = cluster.run("swamp/echo", "echo", "--target", "fromfile")
        assert code == 0
    finally:
        worker.terminate()
        assert worker.wait(timeout=10) == 0


def test_private_downloads_need_a_credential_and_no_build_is_a_clear_404(cluster):
    built = _small_pyz(cluster.tmp)
    cluster.serve("--pyz", str(built), "--private-downloads")
    base = cluster.url.replace("ws://", "http://")
    refused = httpx.get(f"{base}/swamp.pyz")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    token = cluster.cli_json("server", "token", "create", "provisioner")["token"]
    allowed = httpx.get(f"{base}/swamp.pyz", headers={"Authorization": f"Bearer {token}"})
    assert allowed.status_code == 200 and allowed.content == built.read_bytes()


def test_serve_hands_out_only_a_swamp_build_and_never_its_own_state(cluster):
    """``--pyz .swamp/swamp.db`` served the database to anyone: a path in the repo's
    ``.swamp/`` is refused, and so is anything that is not a swamp zipapp; one line, exit 2,
    and nothing is served (serve never starts listening)."""
    state = cluster.repo / ".swamp"
    built = _small_pyz(cluster.tmp)
    inside = state / "swamp.pyz"
    shutil.copy(built, inside)
    copied_db = cluster.tmp / "swamp.db"
    shutil.copy(state / "swamp.db", copied_db)
    other_app = cluster.tmp / "other.pyz"
    with zipfile.ZipFile(other_app, "w") as archive:
        archive.writestr("__main__.py", "print('not swamp')\n")
    refusals = [
        (state / "swamp.db", f"is in {state}, the orchestrator's own state"),
        (inside, f"is in {state}"),  # even a real build: .swamp/ is never served
        (copied_db, "is not a swamp build (it is not a zip archive)"),
        (other_app, "is not a swamp build (it holds no swamp package)"),
    ]
    for path, why in refusals:
        refused = cluster.cli("serve", "--port", "0", "--pyz", str(path), timeout=60)
        assert refused.returncode == 2 and not refused.stdout, refused.stderr
        assert refused.stderr.count("\n") == 1 and why in refused.stderr, refused.stderr
        assert not (state / "serve.json").exists()
    # the control: the same flag with a swamp build outside .swamp/ serves it, byte for byte
    cluster.serve("--pyz", str(built))
    served = httpx.get(cluster.url.replace("ws://", "http://") + "/swamp.pyz")
    assert served.status_code == 200 and served.content == built.read_bytes()


def test_without_a_build_the_download_says_how_to_get_one(cluster):
    cluster.serve()
    missing = httpx.get(cluster.url.replace("ws://", "http://") + "/swamp.pyz")
    assert missing.status_code == 404
    assert "swamp serve --pyz PATH" in missing.json()["error"]["message"]


def test_a_worker_of_another_version_enrolls_with_a_warning_on_both_sides(cluster):
    serve = cluster.serve()
    old = _small_pyz(cluster.tmp, version="0.0.1")
    worker = subprocess.Popen(
        [sys.executable, str(old), "worker", "connect", cluster.url, "--json"],
        env={**cluster.env, "SWAMP_WORKER_TOKEN": cluster.mint("old")},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        events = []
        while not events or events[-1].get("event") != "enrolled":
            line = worker.stdout.readline()
            assert line, f"the worker exited: {events}"
            events.append(json.loads(line))
        warning = next(e["message"] for e in events if e.get("event") == "warning")
        base = cluster.url.replace("ws://", "http://")
        assert f"runs swamp 0.0.1 but the orchestrator runs {__version__}" in warning
        assert f"{base}/swamp.pyz" in warning
        wait_until(lambda: "runs swamp 0.0.1" in serve.log.read_text(), what="the server's warning")
        assert f"this orchestrator {__version__}" in serve.log.read_text()
        # `worker list` points it out, on both routes, the same way
        for route in ((), ("--server", cluster.url)):
            listed = cluster.cli("worker", "list", *route)
            assert listed.returncode == 0, listed.stderr
            assert "VERSION" in listed.stdout.splitlines()[0]
            assert f"old runs swamp 0.0.1, the orchestrator {__version__}." in listed.stdout
            as_json = cluster.cli_json("worker", "list", *route)
            assert as_json["orchestratorVersion"] == __version__
            assert [w["swampVersion"] for w in as_json["workers"]] == ["0.0.1"]
        code, _ = cluster.run("swamp/echo", "echo", "--target", "old")  # it still runs work
        assert code == 0
    finally:
        worker.terminate()
        assert worker.wait(timeout=10) == 0


def test_a_web_page_cannot_reach_the_new_http_routes(cluster):
    built = _small_pyz(cluster.tmp)
    cluster.serve("--pyz", str(built))
    base = cluster.url.replace("ws://", "http://")
    for path in ("/swamp.pyz", "/swamp.pyz.sha256", "/metrics"):
        answer = httpx.get(base + path, headers={"Origin": "https://evil.example"})
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
        assert httpx.get(base + path).status_code in (200, 401)  # control: no Origin
