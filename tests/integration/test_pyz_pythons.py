"""swamp.pyz on every Python it runs on: one orchestrator served from the pyz on the oldest
(3.10, Ubuntu 22.04's python3), and a worker from the pyz on each of 3.10-3.13 and on the
machine's own python3, each enrolled and running a step. An older Python gets one line and
exit status 2.

Interpreters are looked for where pyenv, deadsnakes and distributions put them. One that is
missing is a skip that says so (``-ra`` lists it), except under ``CI=true``, where every Python
the pyz is built for must be there: a skip would hide that it never ran on one of them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import build
from tests.integration.conftest import Proc, logs_of, result_of

pytestmark = pytest.mark.integration
OLDEST = build.PYTHONS[0]
OLDER = ("3.9", "3.8", "3.7", "3.6")  # refused: the launcher parses on 3.6 and newer
FIRST_RUN = 120  # a Python's first start from the pyz compiles its bytecode


def _candidates(minor: str) -> list[Path]:
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    releases = [p for p in pyenv.glob(f"{minor}.*") if re.fullmatch(rf"{minor}\.\d+", p.name)]
    releases.sort(key=lambda p: int(p.name.rsplit(".", 1)[1]), reverse=True)
    found = [p / "bin" / f"python{minor}" for p in releases]
    found += [Path(d) / f"python{minor}" for d in ("/usr/local/bin", "/usr/bin")]
    return [p for p in found if p.is_file() and os.access(p, os.X_OK)]


def _version(python: str) -> tuple[int, ...]:
    """``(3, 10, 13)``: what ``python`` says it is."""
    ran = subprocess.run(
        [python, "-c", "import sys; print(*sys.version_info[:3])"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return tuple(int(part) for part in ran.stdout.split())


def find_python(minor: str) -> str | None:
    """An interpreter of Python ``minor`` (``"3.10"``) on this machine, or None."""
    wanted = tuple(int(part) for part in minor.split("."))
    return next((str(p) for p in _candidates(minor) if _version(str(p))[:2] == wanted), None)


def python_or_skip(minor: str) -> str:
    python = find_python(minor)
    if python is None:
        why = f"no Python {minor} here (looked in pyenv, /usr/local/bin, /usr/bin)"
        if os.environ.get("CI") == "true" and minor in build.PYTHONS:
            pytest.fail(f"{why}: CI runs the pyz on every Python it is built for")
        pytest.skip(why)
    return python


def system_python() -> str | None:
    return shutil.which("python3", path="/usr/bin:/bin")


def _env(**extra) -> dict:
    return {"PATH": "/usr/bin:/bin", **extra}  # env -i: no HOME, no PYTHONPATH, no venv


def _run(swamp: list[str], *args: str, unpacked: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*swamp, *args],
        env=_env(SHIV_ROOT=str(unpacked)),
        capture_output=True,
        text=True,
        timeout=FIRST_RUN,
    )


@dataclass
class Orchestrator:
    python: str  # what serve and the CLI run on
    pyz: Path
    tmp: Path
    unpacked: Path  # one cache for every Python: each adds its own bytecode to it
    repo: Path
    url: str
    download: str
    token: str  # a fleet token: every worker of the module enrolls with it

    def swamp(self, python: str | None = None) -> list[str]:
        return [python or self.python, "-I", str(self.pyz)]

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return _run(self.swamp(), *args, "--repo-dir", str(self.repo), unpacked=self.unpacked)


@pytest.fixture(scope="module")
def orchestrator(pyz, tmp_path_factory):
    """``swamp serve`` from the pyz on the oldest Python (on the machine's python3 when that
    one is missing: the workers are still worth running, and the test of serve says what is
    missing)."""
    tmp = tmp_path_factory.mktemp("pythons")
    unpacked, repo = tmp / "unpacked", tmp / "repo"
    python = find_python(OLDEST) or system_python() or "python3"
    swamp = [python, "-I", str(pyz)]
    made = _run(swamp, "init", str(repo), unpacked=unpacked)
    assert made.returncode == 0, made.stderr
    serve = Proc(
        ["serve", "--port", "0", "--json", "--heartbeat", "1s", "--repo-dir", str(repo)],
        env=_env(SHIV_ROOT=str(unpacked)),
        log=tmp / "serve.log",
        swamp=swamp,
    )
    try:
        listening = serve.wait_for(lambda e: e.get("event") == "listening", timeout=FIRST_RUN)
        minted = _run(
            swamp, "worker", "token", "create", "pythons", "--duration", "1h",
            "--max-enrollments", "unlimited", "--json", "--repo-dir", str(repo),
            unpacked=unpacked,
        )  # fmt: skip
        assert minted.returncode == 0, minted.stderr
        token = json.loads(minted.stdout)["token"]
        yield Orchestrator(
            python, pyz, tmp, unpacked, repo, listening["url"], listening["download"], token
        )
    finally:
        serve.stop()
    assert serve.p.returncode == 0, serve.log.read_text()[-2000:]


def test_serve_runs_from_the_pyz_on_the_oldest_python(orchestrator):
    assert orchestrator.python == python_or_skip(OLDEST)
    assert httpx.get(orchestrator.download).content == orchestrator.pyz.read_bytes()


@pytest.mark.parametrize("which", [*build.PYTHONS, "python3"])
def test_a_worker_from_the_pyz_enrolls_and_runs_a_step(orchestrator, which, tmp_path):
    """``python3``: the machine's own (``/usr/bin/python3``), whichever version it is."""
    if which != "python3":
        python = python_or_skip(which)
    else:
        python = system_python()
        if python is None:
            pytest.skip("no python3 in /usr/bin or /bin")
        if _version(python) < (3, 10):
            return _refused(orchestrator.pyz, python, tmp_path)
    label = f"python={which}"
    worker = Proc(
        ["worker", "connect", "--json", "--label", label],
        env=_env(
            SHIV_ROOT=str(orchestrator.unpacked),
            SWAMP_ORCHESTRATOR_URL=orchestrator.url,
            SWAMP_WORKER_TOKEN=orchestrator.token,
            SWAMP_WORKER_CACHE_DIR=str(tmp_path / "cache"),
        ),
        log=tmp_path / "worker.log",
        swamp=orchestrator.swamp(python),
    )
    try:
        enrolled = worker.wait_for(lambda e: e.get("event") == "enrolled", timeout=FIRST_RUN)
        # the step says which program started its shell: the worker's own interpreter
        ran = orchestrator.cli(
            "model", "method", "run", "command/shell", "run",
            "--arg", "command=readlink /proc/$PPID/exe", "--label", label, "--json",
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        lines = [json.loads(line) for line in ran.stdout.splitlines() if line.strip()]
        result = result_of(lines)
        assert result["status"] == "succeeded", result
        assert result["worker"] == enrolled["workerName"]
        assert logs_of(lines) == [os.path.realpath(python)]
    finally:
        worker.stop()
    assert worker.p.returncode == 0, worker.log.read_text()[-2000:]  # SIGTERM: drained


@pytest.mark.parametrize("minor", OLDER)
def test_an_older_python_is_told_in_one_line_and_exits_2(pyz, minor, tmp_path):
    python = find_python(minor)
    if python is None:
        pytest.skip(f"no Python {minor} here (looked in pyenv, /usr/local/bin, /usr/bin)")
    _refused(pyz, python, tmp_path)


def _refused(pyz: Path, python: str, tmp: Path) -> None:
    cache = tmp / "never"
    ran = subprocess.run(
        [python, "-I", str(pyz), "worker", "connect"],
        env=_env(SHIV_ROOT=str(cache), SWAMP_ORCHESTRATOR_URL="ws://127.0.0.1:9"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = ".".join(map(str, _version(python)))
    assert ran.returncode == 2 and not ran.stdout, (ran.stdout, ran.stderr)
    assert ran.stderr == f"swamp.pyz needs Python {OLDEST} or newer; {python} is {found}\n"
    assert not cache.exists()  # checked first: nothing unpacked, nothing of swamp ran
