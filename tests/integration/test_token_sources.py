"""Token sources on real processes.

The example plugin ``plugins/swamp-token-exec`` is pip-installed as an operator would (its entry
point is what the worker finds). A worker whose ``SWAMP_WORKER_TOKEN`` is ``exec:cat <file>``
enrolls and runs a step; when its token is revoked it asks the command again and enrolls with
the rotated token it now prints, and when the command has nothing new it stops as a revoked
worker always did. A source that fails is one line and exit status 2, and no secret — not the
command's stdout, not its stderr, not the reference's arguments — reaches the output.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, logs_of

SECRET = "5d" * 32  # shaped like a minted secret


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--disable-pip-version-check", "--target", str(target),
         str(ROOT / "plugins" / "swamp-token-exec")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return target


def _with_plugin(cluster, site: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{site}:{cluster.env['PYTHONPATH']}"}


def _output(proc) -> str:
    return "\n".join(proc.lines) + proc.log.read_text()


def test_a_worker_enrolls_with_what_a_command_prints_and_follows_a_rotation(cluster, site):
    cluster.serve()
    first = cluster.mint("first")
    vault = cluster.tmp / "vault-secret"  # what the store holds; the command reads it
    vault.write_text(first + "\n")
    worker = cluster.spawn("worker", "connect", cluster.url, "--json",
                           env={**_with_plugin(cluster, site),
                                "SWAMP_WORKER_TOKEN": f"exec:cat {vault}"})  # fmt: skip
    assert worker.wait_for(lambda e: e.get("event") == "enrolled")["workerName"] == "first"
    code, lines = cluster.run("command/shell", "run", "--arg", "command=echo ran here",
                              "--target", "first")  # fmt: skip
    assert code == 0 and "ran here" in logs_of(lines), lines

    # a rotation: the new token goes where the command finds it, then the old one is revoked
    second = cluster.mint("second")
    vault.write_text(second + "\n")
    mark = worker.mark()
    assert cluster.cli("worker", "token", "revoke", "first").returncode == 0
    renewed = worker.wait_for(lambda e: e.get("event") == "token_renewed", start=mark)
    assert (renewed["source"], renewed["after"]) == ("exec:", "token_revoked")
    worker.wait_for(
        lambda e: e.get("event") == "enrolled" and e["workerName"] == "second", start=mark
    )
    # at once: a new token is a new worker, with an instance id of its own (the revoked
    # worker keeps its old one for its grace window)
    assert not [e for e in worker.events() if e.get("event") == "disconnected"
                and "instance id" in e["reason"]]  # fmt: skip
    code, lines = cluster.run("command/shell", "run", "--arg", "command=echo still here",
                              "--target", "second")  # fmt: skip
    assert code == 0 and "still here" in logs_of(lines), lines

    # revoked again, and the store has nothing new: it stops, as a revoked worker always did
    mark = worker.mark()
    assert cluster.cli("worker", "token", "revoke", "second").returncode == 0
    stopped = worker.wait_for(lambda e: e.get("event") == "stopped", start=mark)
    assert (stopped["code"], stopped["exitCode"]) == ("token_revoked", 1)
    assert "exec: still gives the same token" in stopped["reason"]
    assert worker.wait_exit() == 1
    shown = _output(worker)
    for token in (first, second):
        assert token.split(".", 1)[1] not in shown


@pytest.mark.parametrize(
    "given,extra_env,line",
    [
        (  # the command fails, with the secret on its stdout, its stderr and in its arguments
            f"exec:sh -c 'echo pool.{SECRET}; echo denied for pool.{SECRET} >&2; exit 3' "
            f"--password {SECRET}",
            {},
            "error: token source exec: sh exited with status 3: denied for ***",
        ),
        (  # it succeeds, but prints a document, not a token
            f"""exec:sh -c 'echo "{{\\"token\\": \\"pool.{SECRET}\\"}}"'""",
            {},
            "error: token source exec: gave more than one word or line, not a token "
            "(<name>.<secret>)",
        ),
        (
            "exec:sleep 30",
            {"SWAMP_TOKEN_EXEC_TIMEOUT": "1"},
            "error: token source exec: sleep gave no answer within 1s and was stopped",
        ),
        (
            "vault:secret/swamp",
            {},
            "error: unknown token source 'vault' in SWAMP_WORKER_TOKEN/--token "
            "(known: env, exec, file)",
        ),
        (
            "file:/nonexistent/swamp-token",
            {},
            "error: token source file: cannot read /nonexistent/swamp-token: "
            "No such file or directory",
        ),
        (
            "env:CI_SWAMP_TOKEN",
            {},
            "error: token source env: the variable CI_SWAMP_TOKEN is not set",
        ),
    ],
)
def test_a_source_that_fails_is_one_line_exit_2_and_no_secret(
    cluster, site, given, extra_env, line
):
    env = {**_with_plugin(cluster, site), **extra_env}
    for how in ("variable", "flag"):
        args = ["worker", "connect", "ws://127.0.0.1:9"]
        if how == "flag":
            args += ["--token", given]
        else:
            env["SWAMP_WORKER_TOKEN"] = given
        ran = cluster.cli(*args, env=env, timeout=60)
        assert (ran.returncode, ran.stdout, ran.stderr) == (2, "", line + "\n"), how
        env.pop("SWAMP_WORKER_TOKEN", None)


def test_with_json_the_failure_is_coded_and_still_holds_no_secret(cluster, site):
    ran = cluster.cli(
        "worker", "connect", "ws://127.0.0.1:9", "--json",
        env={**_with_plugin(cluster, site),
             "SWAMP_WORKER_TOKEN": f"exec:sh -c 'echo oops {SECRET} >&2; exit 1'"},
    )  # fmt: skip
    assert ran.returncode == 2
    assert '"code": "token_source_failed"' in ran.stdout
    assert SECRET not in ran.stdout + ran.stderr
    assert ran.stderr == "error: token source exec: sh exited with status 1: oops ***\n"


def test_a_token_that_expires_is_followed_by_the_one_the_source_has_now(cluster, site):
    cluster.serve()
    store = cluster.tmp / "store"
    long = cluster.mint("long")  # minted first: what follows the enrollment is a file write
    # a short deadline, longer each time a busy machine let it pass before the worker had
    # even enrolled, or before the new token was in the file: what is tested is an enrolled
    # worker whose token expires while the source has the next one
    renewed: dict = {"event": None}
    for seconds in (3, 12, 48):
        store.write_text(cluster.mint("short", duration=f"{seconds}s"))
        worker = cluster.spawn("worker", "connect", cluster.url, "--json",
                               "--token", f"exec:cat {store}",
                               env=_with_plugin(cluster, site))  # fmt: skip
        first = worker.wait_for(
            lambda e: e.get("event") in ("enrolled", "stopped"), timeout=seconds + 30
        )
        if first["event"] != "enrolled":
            assert worker.wait_exit() == 1, first
            continue
        assert first["workerName"] == "short"
        store.write_text(long)
        renewed = worker.wait_for(
            lambda e: e.get("event") in ("token_renewed", "stopped"), timeout=seconds + 30
        )
        if renewed["event"] == "token_renewed":
            break
        # the deadline passed before the file changed: the source still gave the same token
        assert "still gives the same token" in renewed["reason"], renewed
        assert worker.wait_exit() == 1, renewed
    assert renewed["event"] == "token_renewed", renewed
    assert renewed["after"] == "token_expired"
    assert worker.wait_for(lambda e: e.get("event") == "enrolled" and e["workerName"] == "long")
    # asked as the deadline passed, not after a refused attempt with the expired token
    kinds = [e["event"] for e in worker.events()]
    assert kinds.index("token_renewed") < kinds.index("connecting", kinds.index("disconnected"))
