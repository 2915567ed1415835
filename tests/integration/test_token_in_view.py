"""A command cannot read its worker's enrollment token from the worker's (or the reaper's)
environment block or command line, however the token was given.

A dispatched command runs as the worker's user, and may read ``/proc/<pid>/environ`` and
``/proc/<pid>/cmdline`` of every process of that user. The command here reads them all and
reports every process that holds the secret. The control is a decoy started the way the worker
used to run — the token in its environment and on its command line — which the same command
finds; the worker, its reaper and the command's own parent, which it also reads, hold nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, base_env, logs_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
# Told the secret reversed, so that its own command line does not hold it.
SCAN = """\
import os, sys
secret = sys.argv[1][::-1].encode()
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                data = f.read()
        except OSError:
            continue
        print("read", pid, name)
        if secret in data:
            print("holds", pid, name)
print("parent", os.getppid())
"""


def _scan(cluster, target: str, secret: str) -> tuple[set, set, int]:
    """Run the scan on ``target``: (what it read, what holds the secret, its parent's pid)."""
    script = cluster.tmp / "scan.py"
    script.write_text(SCAN)
    command = f"{sys.executable} {script} {secret[::-1]}"
    code, lines = cluster.run("command/shell", "run", "--arg", f"command={command}",
                              "--target", target)  # fmt: skip
    assert code == 0, lines
    found = [line.split() for line in logs_of(lines)]
    read = {(int(f[1]), f[2]) for f in found if f[0] == "read"}
    holds = {(int(f[1]), f[2]) for f in found if f[0] == "holds"}
    parent = next(int(f[1]) for f in found if f[0] == "parent")
    return read, holds, parent


def _children(parent: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent:
            found.add(int(stat.parent.name))
    return found


def _assert_hidden(cluster, target: str, token: str, worker: int) -> None:
    secret = token.split(".", 1)[1]
    decoy = subprocess.Popen(  # the control: how the worker used to hold its token
        [sys.executable, "-c", "import sys; sys.stdin.read()", "--token", token],
        env={**cluster.env, "SWAMP_WORKER_TOKEN": token},
        stdin=subprocess.PIPE,
    )
    try:
        read, holds, parent = _scan(cluster, target, secret)
    finally:
        decoy.communicate()
    assert holds == {(decoy.pid, "environ"), (decoy.pid, "cmdline")}, target
    # it did read the worker, its reaper and its own parent, and found nothing there
    helpers = _children(worker) - {decoy.pid}
    assert helpers, "the worker's reaper"
    for pid in {worker, parent, *helpers}:
        assert {(pid, "environ"), (pid, "cmdline")} <= read, (target, pid)


def test_no_process_of_the_worker_shows_its_token(cluster):
    cluster.serve()
    tokens = {name: cluster.mint(name) for name in ("env", "argv", "file")}
    (cluster.tmp / "token").write_text(tokens["file"] + "\n")
    workers = {
        "env": cluster.worker(tokens["env"]),  # SWAMP_WORKER_TOKEN, as systemd's unit gives it
        "argv": cluster.spawn("worker", "connect", cluster.url, "--json",
                              "--token", tokens["argv"]),
        "file": cluster.spawn("worker", "connect", cluster.url, "--json",
                              env={"SWAMP_WORKER_TOKEN_FILE": str(cluster.tmp / "token")}),
    }  # fmt: skip
    for proc in workers.values():
        proc.wait_for(lambda e: e.get("event") == "enrolled")
    for how, token in tokens.items():
        # the pid as started: a service manager, and kill, see no change
        _assert_hidden(cluster, how, token, workers[how].p.pid)


def test_nor_does_a_worker_whose_token_came_from_a_source(cluster):
    """``env:NAME``: the other variable is erased and unset like ``SWAMP_WORKER_TOKEN`` (a
    method sees the worker's variables bar ``SWAMP_*``: it would otherwise get the token);
    ``exec:`` (the example plugin): only the reference was ever in view."""
    cluster.serve()
    tokens = {name: cluster.mint(name) for name in ("from-var", "from-cmd")}
    (cluster.tmp / "store").write_text(tokens["from-cmd"] + "\n")
    plugin = ROOT / "plugins" / "swamp-token-exec"
    workers = {
        "from-var": cluster.spawn("worker", "connect", cluster.url, "--json",
                                  env={"SWAMP_WORKER_TOKEN": "env:CI_SWAMP_TOKEN",
                                       "CI_SWAMP_TOKEN": tokens["from-var"]}),
        "from-cmd": cluster.spawn("worker", "connect", cluster.url, "--json",
                                  env={"SWAMP_WORKER_TOKEN": f"exec:cat {cluster.tmp / 'store'}",
                                       "PYTHONPATH": f"{plugin}:{cluster.env['PYTHONPATH']}",
                                       "SWAMP_PLUGINS": "swamp_testkit,swamp_token_exec"}),
    }  # fmt: skip
    for proc in workers.values():
        proc.wait_for(lambda e: e.get("event") == "enrolled")
    for how, token in tokens.items():
        _assert_hidden(cluster, how, token, workers[how].p.pid)
    # the reference is no secret, but a command's arguments may hold the store's credential
    shown = [Path(f"/proc/{workers['from-cmd'].p.pid}/{name}").read_bytes()
             for name in ("environ", "cmdline")]  # fmt: skip
    assert not any(b"exec:cat" in text for text in shown)


def test_a_worker_from_the_pyz_with_environment_variables_only(cluster, pyz):
    cluster.serve()
    token = cluster.mint("pyz")
    home = cluster.tmp / "home"
    home.mkdir()
    env = {  # env -i, as a cloud-init script or a unit gives it
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "SWAMP_ORCHESTRATOR_URL": cluster.url,
        "SWAMP_WORKER_TOKEN": token,
    }
    worker = subprocess.Popen(
        [PYTHON, "-I", str(pyz), "worker", "connect", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = threading.Timer(300, worker.kill)  # the first start unpacks the pyz
    deadline.start()
    try:
        for line in worker.stdout:
            if json.loads(line).get("event") == "enrolled":
                break
        else:
            pytest.fail(f"the worker exited {worker.wait()}: {worker.stderr.read()}")
        deadline.cancel()
        _assert_hidden(cluster, "pyz", token, worker.pid)
    finally:
        deadline.cancel()
        worker.terminate()
        assert worker.wait(timeout=60) == 0  # a drain: exit 0


STARTS_AGAIN = """
import os, sys
from swamp.worker import handoff
if handoff.TOKEN_FD in sys.argv:
    token = handoff.read_token_fd(int(sys.argv[sys.argv.index(handoff.TOKEN_FD) + 1]))
    shown = [open(f"/proc/self/{name}", "rb").read() for name in ("environ", "cmdline")]
    held = any(token.split(".")[1].encode() in text for text in shown)
    print(os.getpid(), token, held, " ".join(sys.argv[1:]))
else:
    print(os.getpid(), flush=True)
    handoff.exec_without_token(os.environ["SWAMP_WORKER_TOKEN"])
"""


def test_where_it_cannot_be_erased_in_place_the_worker_starts_again_without_it():
    """The way elsewhere than Linux (and Linux's fallback): the same process, started again
    with neither the variable nor ``--token``, the token in a pipe."""
    token = "w1." + "ab" * 32
    started = subprocess.run(
        [sys.executable, "-c", STARTS_AGAIN, "worker", "connect", "--token", token, "ws://h:1"],
        env={**base_env(), "SWAMP_WORKER_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    before, after = started.stdout.splitlines()
    pid, got, held, args = after.split(" ", 3)
    assert pid == before  # exec: the same process
    assert (got, held) == (token, "False")
    assert args.startswith("worker connect --token-fd ") and args.endswith(" ws://h:1")
