"""Real processes: ``swamp serve`` and ``swamp worker connect`` driven through the CLI.

Nothing of ours is mocked. Waits are on events (JSON lines a process prints), each bounded by a
generous timeout; there are no bare sleeps hoping something happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
# Bounds against a hang, never speed targets: on a busy machine (two cores shared with the
# suite's other worker and a score of processes) a worker once took over 30 s from its start to
# its first line, and a CLI run over 60 s. Only a broken test waits this long.
TIMEOUT = 90  # for a line of a process
CLI_TIMEOUT = 120  # for a CLI command to exit


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGINS), str(ROOT)])
    env["SWAMP_PLUGINS"] = "swamp_testkit"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """A child process whose stdout lines are collected as they arrive. ``swamp`` is how it
    starts swamp: this checkout on the test's Python unless told otherwise (a pyz on another
    Python, say)."""

    def __init__(
        self, args: list[str], *, env: dict, log: Path, swamp: list[str] | None = None
    ) -> None:
        self.args = args
        self.log = log
        self.stderr = open(log, "wb")  # noqa: SIM115 - open for the child's whole life
        self.p = subprocess.Popen(
            [*(swamp or [sys.executable, "-m", "swamp"]), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def events(self) -> list[dict]:
        out = []
        with self.cond:
            lines = list(self.lines)
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def wait_for(self, predicate, *, timeout: float = TIMEOUT, start: int = 0) -> dict:
        """The first JSON line (from index ``start``) matching ``predicate``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines[start:]:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.p.poll() is not None and not self.reader.is_alive()):
                    raise AssertionError(
                        f"no matching line from swamp {' '.join(self.args[:2])} "
                        f"(exit {self.p.poll()}):\n"
                        + "\n".join(self.lines[-20:])
                        + "\n--- stderr ---\n"
                        + self.log.read_text()[-3000:]
                    )
                self.cond.wait(min(remaining, 0.5))

    def mark(self) -> int:
        with self.cond:
            return len(self.lines)

    def wait_exit(self, timeout: float = TIMEOUT) -> int:
        """The exit status, once the lines it printed last have been read too: the reader
        thread may still be behind the exit (its end of the pipe closes with the process, or
        with its reaper a moment later)."""
        code = self.p.wait(timeout=timeout)
        self.reader.join(10)
        return code

    def signal(self, sig) -> None:
        self.p.send_signal(sig)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.stderr.close()


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.repo = tmp / "repo"
        self.env = base_env()
        (tmp / "tmp").mkdir()
        self.env["TMPDIR"] = str(tmp / "tmp")  # temp cache dirs of SIGKILLed workers stay here
        self.procs: list[Proc] = []
        self.url: str | None = None
        self.serve_proc: Proc | None = None
        self.counter = 0
        result = self.cli("init", str(self.repo))
        assert result.returncode == 0, result.stderr
        # The operator's shell: commands find the repo, and through its .swamp/serve.json the
        # running server's local admin credential (as in 'cd repo').
        self.env["SWAMP_REPO_DIR"] = str(self.repo)

    def cli(
        self,
        *args: str,
        env: dict | None = None,
        timeout: float = CLI_TIMEOUT,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "swamp", *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.tmp,
            input=input,
        )

    def cli_json(self, *args: str, **kwargs):
        result = self.cli(*args, "--json", **kwargs)
        assert result.returncode == 0, f"{args}: {result.stderr}"
        return json.loads(result.stdout)

    def spawn(self, *args: str, env: dict | None = None) -> Proc:
        self.counter += 1
        proc = Proc(
            list(args),
            env={**self.env, **(env or {})},
            log=self.tmp / f"proc-{self.counter}-{args[0]}.log",
        )
        self.procs.append(proc)
        return proc

    def serve(self, *extra: str, port: int = 0) -> Proc:
        proc = self.spawn(
            "serve",
            "--repo-dir",
            str(self.repo),
            "--port",
            str(port),
            "--json",
            "--heartbeat",
            "1s",
            "--grace-window",
            "10s",
            *extra,
        )
        self.url = proc.wait_for(lambda e: e.get("event") == "listening")["url"]
        self.serve_proc = proc
        return proc

    def mint(self, name: str, duration: str = "1h") -> str:
        return self.cli_json(
            "worker", "token", "create", name, "--duration", duration, "--repo-dir", str(self.repo)
        )["token"]

    def mint_fleet(self, name: str, places: str, *extra: str, duration: str = "1h") -> str:
        """A fleet token admitting ``places`` machines (``unlimited`` too); ``extra``: more
        flags of ``worker token create``, e.g. ``--label``."""
        return self.cli_json(
            "worker", "token", "create", name, "--duration", duration,
            "--max-enrollments", places, *extra, "--repo-dir", str(self.repo),
        )["token"]  # fmt: skip

    def worker(
        self, token: str, *extra: str, cache_dir: Path | None = None, wait: bool = True
    ) -> Proc:
        args = ["worker", "connect", self.url, "--json", *extra]
        if cache_dir is not None:
            args += ["--cache-dir", str(cache_dir)]
        proc = self.spawn(*args, env={"SWAMP_WORKER_TOKEN": token})
        if wait:
            proc.wait_for(lambda e: e.get("event") == "enrolled")
        return proc

    def run(self, *args: str, env: dict | None = None) -> tuple[int, list[dict]]:
        """``swamp model method run ... --json`` against the server: (exit code, JSON lines)."""
        result = self.cli("model", "method", "run", *args, "--server", self.url, "--json", env=env)
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        return result.returncode, lines

    def workers(self, *extra: str) -> list[dict]:
        return self.cli_json("worker", "list", "--repo-dir", str(self.repo), *extra)["workers"]

    def query(self, predicate: str, *more: str) -> list[dict]:
        return self.cli_json("data", "query", predicate, *more, "--repo-dir", str(self.repo))

    def close(self) -> None:
        live = [proc for proc in reversed(self.procs) if proc.p.poll() is None]
        for proc in live:  # all at once: each stops by itself, in parallel
            proc.p.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            proc.stop()


def wait_until(check, *, timeout: float = TIMEOUT, what: str = "condition"):
    """For state only visible by asking (the CLI): re-ask until true, bounded."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def pytest_configure(config):
    """Tests press Ctrl-C on real CLI processes. A child inherits an *ignored* SIGINT (a suite
    started in the background by a non-interactive shell has one), and Python then raises no
    KeyboardInterrupt at all: the CLI would never stop. Handled here instead, it is back to the
    default in every child."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items):
    """Every test here starts real processes: ``-m "not integration"`` is the fast loop."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pyz(tmp_path_factory):
    """``build.py pyz`` once for the whole run. The build works in the checkout's ``build/``,
    so two at once would undo each other: the processes of a parallel run (xdist) share one
    build under a lock, in the directory they have in common."""
    import fcntl

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build_pyz(tmp_path_factory.mktemp("dist") / "swamp.pyz")
    shared = tmp_path_factory.getbasetemp().parent
    target = shared / "dist" / "swamp.pyz"
    with open(shared / "pyz.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            target.parent.mkdir(exist_ok=True)
            build_pyz(target)
    return target


def build_pyz(target: Path) -> Path:
    """``build.build_pyz(target)`` in a process of its own, as ``python3 build.py pyz`` runs it."""
    code = f"from pathlib import Path; import build; build.build_pyz(Path({str(target)!r}))"
    built = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr[-2000:]
    return target


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def result_of(lines: list[dict]) -> dict:
    return next(line["result"] for line in lines if "result" in line)


def logs_of(lines: list[dict]) -> list[str]:
    return [
        line["event"]["line"]
        for line in lines
        if "event" in line and line["event"].get("kind") == "log"
    ]
