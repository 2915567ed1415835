"""The README runs as written: every command block and file a reader would copy from README.md
(and from docs/*.md but docs/decisions.md, which is a record) is run, or checked as far as this
machine can, by this test.

The convention. Every fenced block has an HTML comment on the line right above its fence
(GitHub does not show it) that says how it is held to its word:

``<!-- readme: run NAME -->``
    A shell session. Its commands run for real, in order, in one ``bash`` (so ``cd`` carries
    over), as the reader's terminal: a real ``swamp`` CLI (this checkout) in a temporary
    directory laid out like the checkout (``examples/``, ``plugins/``, ``dist/swamp.pyz``), so
    ``..`` from ``myrepo`` means the same as for a reader. Comment lines are what the reader
    sees, not commands. ``swamp serve`` and ``swamp worker connect`` keep running, as in a
    terminal of their own: they are started in the background and waited for (serve until it
    says how workers connect, a worker until it enrolls); a new ``swamp serve`` first stops the
    one running and its workers (one serve per repo), and they must exit 0. Each command must
    exit 0 unless ``RUN[NAME]`` says otherwise, and what ``RUN[NAME]`` expects a command to
    print (the claims in its comment) must be there.
``<!-- readme: output FILE -->``
    What an earlier ``run`` block wrote to ``FILE`` (in the repo), shortened: both parse as
    YAML and are equal, where the block's ``…`` stands for any text and ``<sha256>``,
    ``<hex>``, ``<secret>`` for 64 hex digits. What the README cannot run (cloud-init, a
    Kubernetes cluster, Docker) is checked here: ``cloud-init schema`` and the Kubernetes
    API's schemas pass, on the file and on the block; the bootstrap each carries is
    ``swamp/bootstrap.py``; Compose's token is in the file beside it, not in it.
``<!-- readme: file PATH -->``
    Exactly the file ``PATH`` of the checkout (an example a later block copies).
``<!-- readme: writes PATH -->``
    A file the reader writes into the repo, as it is: the session writes it there.
``<!-- readme: checked NAME -->``
    Cannot run inside the tests (the test suite itself, the benchmarks, minutes each): checked
    as far as possible by the function ``NAME`` names (``build-tasks``: build.py has the task
    and the script it names starts; ``layout``: the paths exist).

Placeholders a reader replaces, and what the session puts there: ``NAME.<secret>`` the token
the session last saw minted for NAME; ``sha256:<hex>`` the pin the running serve printed;
``<run>`` the id the last workflow run printed; the host ``orchestrator.example`` (and
``127.0.0.1``) with port 7420, the address of the running serve — which listens where the
block says but on a free port (``SWAMP_SERVE_PORT=0``: tests run side by side); a path under
``/var/lib/`` is under the session's directory. ``pip install`` installs into the session's own
directory (``PIP_TARGET``), on its ``PYTHONPATH``; ``vault`` is a stand-in that prints the token
of the path it is asked for; ``dist/swamp.pyz`` is a stand-in build (what ``serve --pyz``
checks: a zip with ``__main__.py`` and the ``swamp`` package; ``test_pyz.py`` runs the real one).

A block without a marker (or of an unknown kind) fails the first test below: a new block says
how it is checked, and a new ``run`` block gets its entry in ``RUN``.

The blocks run in order in one session — README.md, then docs/*.md by name (the run blocks
are all in docs/usage.md, the manual) — as a reader who follows them would: one repo
throughout, and one serve shared by the blocks until a block starts another. ``RUN`` lists the
run blocks in that order: a block moved to another document must keep its place in the session.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.external import command, require
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

TIMEOUT = 60  # for one command, or a process to be ready: generous on a busy machine
KINDS = ("run", "output", "file", "writes", "checked")
MARKER = re.compile(r"<!-- readme: (\w+)(?: (\S+))? -->")
SECRET = re.compile(r"\b([a-z][a-z0-9_-]*)\.([0-9a-f]{64})\b")


# -- the blocks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    source: str  # file:line of the opening fence
    kind: str | None  # None: no marker (an error)
    arg: str | None
    lang: str
    text: str


def documents() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "decisions.md")
    return [ROOT / "README.md", *docs]


def blocks(path: Path) -> list[Block]:
    found = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == fence[1])
        marker = MARKER.fullmatch(lines[i - 1].strip()) if i else None
        found.append(
            Block(
                source=f"{path.relative_to(ROOT)}:{i + 1}",
                kind=marker[1] if marker else None,
                arg=marker[2] if marker else None,
                lang=fence[2].strip(),
                text="".join(line + "\n" for line in lines[i + 1 : end]),
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in documents() for b in blocks(path)]


def commands(text: str) -> list[str]:
    """The command lines of a shell block: continuation lines joined, comment lines dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        out.append((pending + line.strip()).strip())
        pending = ""
    assert not pending, f"a continuation line ends the block: {pending!r}"
    return out


def without_comment(line: str) -> str:
    """``line`` up to an unquoted ``#`` that starts a word (the shell's comment)."""
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
        i += 1
    return line.rstrip()


# -- what each run block must do ----------------------------------------------------------------


@dataclass
class Expect:
    """What one command of a run block must do. ``match``: a piece of the command as written
    (expectations are taken in order, each by the first command left that contains it)."""

    match: str
    exit: int | None = 0
    says: tuple[str, ...] = ()  # regexes its output (stdout and stderr) must contain
    not_says: tuple[str, ...] = ()
    ready: str | None = None  # runs in the background until its output matches this
    stop: int | None = None  # a background command stopped at the end of its block by this
    then: Callable[[Session], None] | None = None  # a further check, after the command


def _revoked_worker_stops(s: Session) -> None:
    worker = s.background_of("--label gpu=true")
    assert s.exit_of(worker) == 1, s.output_of(worker)
    assert "token 'build' has been revoked" in s.output_of(worker)


def _machine_id_in(path: str) -> Callable[[Session], None]:
    def check(s: Session) -> None:
        assert (s.moved(path) / "machine-id").is_file()

    return check


def _labels_and_slots(s: Session) -> None:
    workers = s.json("worker", "list")["workers"]
    [eu] = [w for w in workers if w["labels"].get("zone") == "eu"]
    assert eu["labels"]["fleet"] == "pool" and eu["capacity"] == 4, eu


def _vault_was_asked(s: Session) -> None:
    assert s.vault_calls() == ["kv get -field=token secret/swamp/pool"]


def _step_left_the_queue(s: Session) -> None:
    assert s.json("worker", "queue")["items"] == [], "Ctrl-C left the step in the queue"


def _one_step_per_member(s: Session) -> None:
    [run] = [r for r in s.json("workflow", "history")["runs"] if r["runId"].startswith(s.run_id)]
    assert run["workflow"] == "fleet-uptime" and run["status"] == "succeeded", run
    members = [w["name"] for w in s.json("worker", "list")["workers"] if w["status"] == "idle"]
    assert run["steps"] == run["succeeded"] == len(members) == 2, (run, members)


NO_GPU = shutil.which("nvidia-smi") is None

RUN: dict[str, list[Expect]] = {
    "using-it": [
        Expect("swamp init myrepo", says=(r"repo \S+/myrepo: created",)),
        Expect("swamp serve", ready=r"workers connect with:", says=(r"ws://127\.0\.0\.1:\d+",)),
        Expect("token create build", says=(r"\bbuild\.[0-9a-f]{64}\b",)),
        Expect("swamp worker connect", ready=r"enrolled as build\b"),
        Expect("'uname -a'", says=(r"\[build\] \S+", r"succeeded on build")),
        Expect(
            "nvidia-smi",
            exit=1 if NO_GPU else 0,
            says=(r"dispatched to build",) + ((r"exited with status 127",) if NO_GPU else ()),
        ),
        Expect(
            "swamp worker list",
            says=(r"NAME +STATUS +SLOTS +LABELS +PLATFORM/ARCH +LAST SEEN", r"build +idle"),
        ),
        Expect("swamp worker queue", says=(r"No steps are waiting",)),
        Expect("workflow create hello", says=(r"workflow hello succeeded",)),
        Expect(
            "swamp data query",
            says=(r"command/shell +run-[0-9a-f]{16} +result .*\"exitCode\":127",) if NO_GPU else (),
        ),
        Expect("token revoke build", says=(r"token build revoked",), then=_revoked_worker_stops),
        Expect("server token create ops", says=(r"\bops\.[0-9a-f]{64}\b",)),
    ],
    "fleets": [
        Expect(
            "swamp serve",
            ready=r"workers connect with:",
            says=(
                r"listening on wss://0\.0\.0\.0:\d+",
                r"ca pin: sha256:[0-9a-f]{64}",
                r"certificate for orchestrator\.example",
            ),
        ),
        Expect("token create pool", says=(r"up to 50 machines", r"ca pin: sha256:[0-9a-f]{64}")),
        Expect(
            "swamp worker connect",
            ready=r"enrolled as pool-[0-9a-f]{8}\b",
            then=_machine_id_in("/var/lib/swamp"),
        ),
        Expect("swamp worker list", says=(r"pool-[0-9a-f]{8} +idle .*fleet=pool",)),
        Expect("'uname -n'", says=(r"succeeded on pool-[0-9a-f]{8}\b",)),
        Expect("worker token list", says=(r"ENROLLMENTS", r"\bpool\b.* 1 / 50\b")),
    ],
    "cloud-init": [
        Expect(
            "swamp serve",
            ready=r"workers connect with:",
            says=(r"listening on wss://", r"workers download this build from https://"),
        ),
        Expect("--cloud-init", says=(r"wrote user-data\.yaml \(mode 0600",)),
    ],
    "workers": [
        Expect(
            "swamp worker connect", ready=r"enrolled as pool-[0-9a-f]{8}\b", then=_labels_and_slots
        ),
    ],
    "token-sources": [
        Expect("pip install"),
        Expect(
            "swamp worker connect", ready=r"enrolled as pool-[0-9a-f]{8}\b", then=_vault_was_asked
        ),
    ],
    "kubernetes": [Expect("--kubernetes", says=(r"wrote swamp-worker\.yaml \(mode 0600",))],
    "compose": [Expect("--compose", says=(r"wrote compose\.yaml and \S*swamp_token",))],
    "queue": [
        Expect(
            "--label gpu=true",
            ready=r"queued, waiting for a worker matching labels gpu=true",
            stop=signal.SIGINT,
            exit=130,
            then=_step_left_the_queue,
        ),
        Expect("swamp worker queue", says=(r"gpu=true: 1 waiting", r"0 matching workers")),
    ],
    "workflows": [
        Expect("cp ../examples/workflows/fleet-uptime.toml"),
        Expect(
            "workflow run fleet-uptime",
            says=(r"workflow fleet-uptime succeeded \(run [0-9a-f]{12}\)",),
            then=_one_step_per_member,
        ),
        Expect("workflow history", says=(r"RUN +WORKFLOW +STATUS", r"fleet-uptime +succeeded")),
        Expect("history get", says=(r"workflow fleet-uptime succeeded", r"load average")),
        Expect("swamp logs", says=(r"uptime-pool-[0-9a-f]{8} │ .*load average",)),
        Expect("workflow cancel", exit=1, says=(r"has already ended: succeeded",)),
        Expect("--step", exit=1, says=(r"has already ended: succeeded",)),
        Expect("workflow validate"),
    ],
    "verify": [
        Expect(
            "swamp worker verify",
            says=(r"WORKER +RESULT +PLATFORM/ARCH +DETAILS", r"pool-[0-9a-f]{8} +✓ pass"),
            not_says=(r"✗ fail",),
        ),
    ],
    "models": [
        Expect("uptime run --label zone=eu", says=(r"wrote result v1 of uptime",)),
        Expect("--bogus", exit=1, says=(r"exited with status 1",)),
        Expect("uptime run --label zone=eu", says=(r"wrote result v3 of uptime",)),
        Expect(
            "exitCode != 0'",
            says=(r"run-[0-9a-f]{16} +result",) if NO_GPU else (),
            not_says=(r"\buptime +result",),
        ),
        Expect("--all-versions", says=(r"\buptime +result +2 ",)),
    ],
}


# -- the session --------------------------------------------------------------------------------


@dataclass
class Background:
    command: str  # as written
    pid: int
    out: Path
    err: Path
    exit: int | None = None


@dataclass
class Session:
    """The reader's terminals: one bash for the commands, and the processes that keep running."""

    tmp: Path
    top: Path = field(init=False)  # what `..` is from the repo: the checkout, as far as it goes
    io: Path = field(init=False)  # each command's output and exit status, the shell's log
    site: Path = field(init=False)  # where `pip install` puts packages (PIP_TARGET)
    env: dict[str, str] = field(init=False)
    bash: subprocess.Popen = field(init=False)
    count: int = 0
    tokens: dict[str, str] = field(default_factory=dict)
    pin: str | None = None
    port: int | None = None
    run_id: str | None = None
    background: list[Background] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.top = self.tmp / "checkout"
        bin_dir, self.io, self.site = self.tmp / "bin", self.tmp / "io", self.tmp / "site"
        for folder in (self.top / "dist", bin_dir, self.io, self.site, self.tmp / "home"):
            folder.mkdir(parents=True)
        for name in ("examples", "plugins"):
            (self.top / name).symlink_to(ROOT / name)
        with zipfile.ZipFile(self.top / "dist" / "swamp.pyz", "w") as build:
            build.writestr("__main__.py", "raise SystemExit('a stand-in build')\n")
            build.writestr("swamp/__init__.py", "")
        py = shlex.quote(sys.executable)
        self._script(bin_dir / "swamp", f'exec {py} -m swamp "$@"')
        self._script(bin_dir / "pip", f'exec {py} -m pip "$@"')
        # vault: prints the token of the path it is asked for, and notes how it was asked
        self._script(
            bin_dir / "vault",
            f'echo "$*" >> {self.io}/vault.calls\nexec cat "{self.io}/vault/$(basename "$4")"',
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
        env.update(
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
            PYTHONPATH=f"{self.site}{os.pathsep}{ROOT}",
            PYTHONUNBUFFERED="1",
            HOME=str(self.tmp / "home"),
            SWAMP_SERVE_PORT="0",
            PIP_TARGET=str(self.site),
            PIP_NO_DEPS="1",
            PIP_QUIET="1",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
        )
        self.env = env
        self.bash = subprocess.Popen(
            [command("bash"), "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=open(self.io / "bash.log", "wb"),  # noqa: SIM115 - the shell's whole life
            stderr=subprocess.STDOUT,
            cwd=self.top,
            env=env,
            text=True,
        )
        # job control: a background command gets its own process group and the default SIGINT,
        # as in a terminal (a script's background jobs would ignore Ctrl-C)
        self._send("set -m")

    @staticmethod
    def _script(path: Path, body: str) -> None:
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def _send(self, text: str) -> None:
        self.bash.stdin.write(text + "\n")
        self.bash.stdin.flush()

    def _wait_file(self, path: Path, what: str, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.bash.poll() is not None:
                raise AssertionError(f"the shell ended while waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)
        return path.read_text().strip()

    # -- placeholders

    def moved(self, path: str) -> Path:
        return self.tmp / path.lstrip("/")

    def substitute(self, line: str) -> str:
        def address(m: re.Match) -> str:
            assert self.port is not None, f"no serve is running for {m[0]}"
            return f"{m[1]}://127.0.0.1:{self.port}"

        def token(m: re.Match) -> str:
            assert m[1] in self.tokens, f"no token {m[1]} was minted before {line!r}"
            return self.tokens[m[1]]

        line = re.sub(r"\b(wss?|https?)://(?:orchestrator\.example|127\.0\.0\.1):7420\b",
                      address, line)  # fmt: skip
        line = re.sub(r"\b([a-z][a-z0-9_-]*)\.<secret>", token, line)
        if "sha256:<hex>" in line:
            assert self.pin, f"no serve printed a pin before {line!r}"
            line = line.replace("sha256:<hex>", self.pin)
        if "<run>" in line:
            assert self.run_id, f"no workflow ran before {line!r}"
            line = line.replace("<run>", self.run_id)
        line = re.sub(r"(?<![\w./])/var/lib/", f"{self.tmp}/var/lib/", line)
        assert not re.search(r"<[a-z0-9.]+>|…", line), f"a placeholder is left in {line!r}"
        return line

    def _learn(self, text: str) -> None:
        for name, secret in SECRET.findall(text):
            self.tokens[name] = f"{name}.{secret}"
        runs = re.findall(r"\(run ([0-9a-f]{12})\)", text)
        if runs:
            self.run_id = runs[-1]

    # -- running

    def run(self, line: str) -> tuple[int, str]:
        self.count += 1
        n = self.count
        out, err, rc = (self.io / f"{n}.{x}" for x in ("out", "err", "rc"))
        self._send(
            f"{{ {line}\n}} > {out} 2> {err} < /dev/null; echo $? > {rc}.tmp; mv {rc}.tmp {rc}"
        )
        status = int(self._wait_file(rc, f"{line!r} to finish"))
        said = out.read_text() + err.read_text()
        self._learn(said)
        return status, said

    def start(self, written: str, line: str, ready: str) -> tuple[Background, str]:
        self.count += 1
        n = self.count
        out, err, pid = (self.io / f"{n}.{x}" for x in ("out", "err", "pid"))
        self._send(f"{without_comment(line)} > {out} 2> {err} < /dev/null &\n"
                   f"echo $! > {pid}.tmp; mv {pid}.tmp {pid}")  # fmt: skip
        proc = Background(written, int(self._wait_file(pid, f"{line!r} to start")), out, err)
        self.background.append(proc)
        deadline = time.monotonic() + TIMEOUT
        while not re.search(ready, said := self.output_of(proc)):
            if not _alive(proc.pid) or time.monotonic() > deadline:
                raise AssertionError(f"{written!r} never said /{ready}/:\n{said[-3000:]}")
            time.sleep(0.05)
        self._learn(said)
        return proc, said

    def output_of(self, proc: Background) -> str:
        return proc.out.read_text(errors="replace") + proc.err.read_text(errors="replace")

    def background_of(self, piece: str) -> Background:
        return next(p for p in reversed(self.background) if piece in p.command)

    def exit_of(self, proc: Background, timeout: float = TIMEOUT) -> int:
        """The exit status of a background process, once it has ended (bash's ``wait``)."""
        if proc.exit is None:
            self.count += 1
            done = self.io / f"{self.count}.exit"
            self._send(f"wait {proc.pid}; echo $? > {done}.tmp; mv {done}.tmp {done}")
            proc.exit = int(self._wait_file(done, f"{proc.command!r} to end", timeout))
        return proc.exit

    def stop(self, proc: Background, sig: int = signal.SIGTERM) -> int:
        if proc.exit is None and _alive(proc.pid):
            os.kill(proc.pid, sig)
        return self.exit_of(proc)

    def stop_serve(self) -> None:
        """What a reader does before starting serve again: stop its workers, then serve."""
        live = [p for p in self.background if p.exit is None]
        for proc in sorted(live, key=lambda p: " serve" in p.command):
            assert self.stop(proc) == 0, f"{proc.command!r}:\n{self.output_of(proc)[-3000:]}"
        self.port = self.pin = None

    def json(self, *args: str):
        """Ask the repo's CLI on the side (not a README line): a check's view of the state."""
        done = subprocess.run(
            [sys.executable, "-m", "swamp", *args, "--json"],
            cwd=self.cwd(), env=self.env, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def cwd(self) -> Path:
        self.count += 1
        where = self.io / f"{self.count}.pwd"
        self._send(f"pwd > {where}.tmp; mv {where}.tmp {where}")
        return Path(self._wait_file(where, "the shell's directory"))

    def vault_calls(self) -> list[str]:
        calls = self.io / "vault.calls"
        return calls.read_text().splitlines() if calls.exists() else []

    def close(self) -> None:
        for proc in self.background:
            if proc.exit is None and _alive(proc.pid):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.background:
            while _alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(proc.pid):
                os.kill(proc.pid, signal.SIGKILL)
        self.bash.stdin.close()
        try:
            self.bash.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.bash.kill()


def _alive(pid: int) -> bool:
    """Still running (a process bash has not reaped yet is a zombie: not running)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _is_daemon(line: str) -> bool:
    words = [w for w in shlex.split(without_comment(line)) if not re.match(r"^[A-Z_]+=", w)]
    return words[:2] == ["swamp", "serve"] or words[:3] == ["swamp", "worker", "connect"]


def run_block(s: Session, block: Block) -> None:
    expected = list(RUN[block.arg])
    stop_at_end: list[tuple[Background, Expect]] = []
    for written in commands(block.text):
        where = f"{block.source} ({block.arg}): {written!r}"
        expect = next((e for e in expected if e.match in written), None)
        if expect is not None:
            expected.remove(expect)
        else:
            expect = Expect(written)
        line = s.substitute(without_comment(written))
        if _is_daemon(written) or expect.ready:
            if written.startswith("swamp serve"):
                s.stop_serve()
            ready = expect.ready or (
                r"workers connect with:" if written.startswith("swamp serve") else r"enrolled as"
            )
            proc, said = s.start(written, line, ready)
            if written.startswith("swamp serve"):
                s.port = int(re.search(r"listening on wss?://\S+:(\d+)", said)[1])
                pin = re.search(r"ca pin: (sha256:[0-9a-f]{64})", said)
                s.pin = pin and pin[1]
            if expect.stop is not None:
                stop_at_end.append((proc, expect))
        else:
            status, said = s.run(line)
            if expect.exit is not None:
                assert status == expect.exit, f"{where}: exit {status}\n{said[-3000:]}"
        for pattern in expect.says:
            assert re.search(pattern, said), f"{where}: no /{pattern}/ in:\n{said[-3000:]}"
        for pattern in expect.not_says:
            assert not re.search(pattern, said), f"{where}: /{pattern}/ in:\n{said[-3000:]}"
        if expect.then and expect.stop is None:
            expect.then(s)
    assert not expected, f"{block.source} ({block.arg}): no command for {expected}"
    for proc, expect in stop_at_end:
        status = s.stop(proc, expect.stop)
        assert expect.exit is None or status == expect.exit, (status, s.output_of(proc))
        if expect.then:
            expect.then(s)


# -- output blocks: the YAML a command printed, shortened ---------------------------------------


def _pattern(shown: str) -> re.Pattern:
    text = re.escape(shown).replace("…", ".*?")
    for placeholder in ("<sha256>", "<hex>", "<secret>"):
        text = text.replace(re.escape(placeholder), "[0-9a-f]{64}")
    return re.compile(text, re.S)


def differences(shown, actual, where: str = "") -> list[str]:
    """Where the README's YAML (``…`` any text, placeholders 64 hex digits) is not ``actual``."""
    if isinstance(shown, dict) and isinstance(actual, dict):
        if list(shown) != list(actual):
            return [f"{where or '/'}: keys {list(shown)} != {list(actual)}"]
        return [d for k in shown for d in differences(shown[k], actual[k], f"{where}/{k}")]
    if isinstance(shown, list) and isinstance(actual, list):
        if len(shown) != len(actual):
            return [f"{where}: {len(shown)} items != {len(actual)}"]
        pairs = enumerate(zip(shown, actual, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(shown, str) and isinstance(actual, str):
        return [] if _pattern(shown).fullmatch(actual) else [f"{where}: {shown!r} != {actual!r}"]
    return [] if shown == actual else [f"{where}: {shown!r} != {actual!r}"]


def check_output(s: Session, block: Block) -> None:
    written = s.cwd() / block.arg
    assert written.is_file(), f"{block.source}: no {block.arg} was written before it"
    assert s.port is not None
    actual = written.read_text().replace(f"127.0.0.1:{s.port}", "orchestrator.example:7420")
    shown_docs = list(yaml.safe_load_all(block.text))
    actual_docs = list(yaml.safe_load_all(actual))
    problems = differences(shown_docs, actual_docs)
    assert not problems, f"{block.source} is not what {block.arg} holds:\n" + "\n".join(problems)
    # the comment lines it shows at the top are the file's (#cloud-config first of all)
    head = [line for line in block.text.splitlines() if line.startswith("#") and "…" not in line]
    for line in head:
        assert line in actual.splitlines(), f"{block.source}: {line!r} is not in {block.arg}"
    assert actual.splitlines()[0] == block.text.splitlines()[0]
    VALIDATE[block.arg](s, block.text, written)


BOOTSTRAP = (ROOT / "swamp" / "bootstrap.py").read_text()


def _cloud_init_schema(s: Session, shown: str, written: Path) -> None:
    readme_copy = s.tmp / "readme-user-data.yaml"
    readme_copy.write_text(shown)
    for path in (written, readme_copy):
        checked = subprocess.run(
            [command("cloud-init"), "schema", "--config-file", str(path)],
            capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
        assert checked.returncode == 0, f"{path.name}: {checked.stdout}{checked.stderr}"
    assert written.stat().st_mode & 0o777 == 0o600
    files = {f["path"]: f["content"] for f in yaml.safe_load(written.read_text())["write_files"]}
    assert files["/opt/swamp/bootstrap.py"] == BOOTSTRAP


def _kubernetes_schemas(s: Session, shown: str, written: Path) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        require(False, "kubernetes-validate (pip, in the test extras)")
    version = kubernetes_validate.latest_version()
    for text in (shown, written.read_text()):
        for document in yaml.safe_load_all(text):
            kubernetes_validate.validate(document, version, strict=True)
    config = next(d for d in yaml.safe_load_all(written.read_text()) if d["kind"] == "ConfigMap")
    assert config["data"]["bootstrap.py"] == BOOTSTRAP


def _compose_token(s: Session, shown: str, written: Path) -> None:
    token_file = written.parent / "swamp_token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert re.fullmatch(r"compose\.[0-9a-f]{64}\n", token_file.read_text())
    assert token_file.read_text().strip() not in written.read_text()
    compose = yaml.safe_load(written.read_text())
    assert compose["configs"]["swamp_bootstrap"]["content"] == BOOTSTRAP.replace("$", "$$")


VALIDATE: dict[str, Callable[[Session, str, Path], None]] = {
    "user-data.yaml": _cloud_init_schema,
    "swamp-worker.yaml": _kubernetes_schemas,
    "compose.yaml": _compose_token,
}


# -- checked blocks ------------------------------------------------------------------------------


def check_build_tasks(block: Block) -> None:
    """Each ``python3 build.py TASK`` is a task build.py runs; a benchmark script it names (in
    the comment) starts (``--help``: the benchmarks take minutes; ``.ci/run`` runs the tests,
    ``test_demo.py`` the demo)."""
    source = (ROOT / "build.py").read_text()
    for line in commands(block.text):
        words = shlex.split(without_comment(line))
        assert words[:2] == ["python3", "build.py"], f"{block.source}: {line!r}"
        assert f'task == "{words[2]}"' in source, f"{block.source}: build.py has no {words[2]}"
        script = re.search(r"#\s*(bench/\w+\.py)", line)
        if script:
            assert f'"{Path(script[1]).name}"' in source, f"build.py does not run {script[1]}"
            started = subprocess.run(
                [sys.executable, str(ROOT / script[1]), "--help"],
                cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
            )  # fmt: skip
            assert started.returncode == 0, f"{script[1]} --help: {started.stderr[-2000:]}"


def check_layout(block: Block) -> None:
    """Each path the layout names is there."""
    for line in block.text.splitlines():
        first = line.split(" ", 1)[0]
        if first and ("/" in first or first.endswith(".py")):
            assert (ROOT / first).exists(), f"{block.source}: {first} is not in the checkout"


def check_grammar(block: Block) -> None:
    """Each quoted terminal of the grammar is one token of the language's lexer (or, in the
    predicates' grammar, one of a record's fields)."""
    from swamp.domain import language, query

    for terminal in re.findall(r'"([^"]+)"', block.text):
        if terminal in query.FIELDS:
            continue
        tokens = language.tokenize(terminal)
        assert len(tokens) == 2 and tokens[0].text == terminal, f"{block.source}: {terminal!r}"


def check_predicate_error(block: Block) -> None:
    """The error shown is the one the predicate on its second line gets, word for word."""
    from swamp.domain import query
    from swamp.errors import SwampError

    source = block.text.splitlines()[1].strip()
    with pytest.raises(SwampError) as refused:
        query.parse(source)
    assert refused.value.message + "\n" == block.text, block.source


CHECKED: dict[str, Callable[[Block], None]] = {
    "build-tasks": check_build_tasks,
    "layout": check_layout,
    "grammar": check_grammar,
    "predicate-error": check_predicate_error,
}


# -- the tests -----------------------------------------------------------------------------------


def test_every_block_says_how_it_is_checked():
    found = all_blocks()
    unmarked = [b.source for b in found if b.kind not in KINDS or b.arg is None]
    assert not unmarked, f"blocks without a known <!-- readme: KIND ARG --> above: {unmarked}"
    runs = [b.arg for b in found if b.kind == "run"]
    assert runs == list(RUN), (runs, list(RUN))  # the session's order, wherever the blocks live
    outputs = [b.arg for b in found if b.kind == "output"]
    assert sorted(outputs) == sorted(VALIDATE), outputs
    assert {b.arg for b in found if b.kind == "checked"} <= set(CHECKED)
    for block in found:
        if block.kind == "run":
            assert block.lang == "sh", block.source
            for line in commands(block.text):
                assert not line.startswith("$"), f"{block.source}: no prompts: {line!r}"


def test_example_files_are_the_files_in_the_checkout():
    for block in all_blocks():
        if block.kind == "file":
            assert (ROOT / block.arg).read_text() == block.text, block.source


def test_blocks_that_cannot_run_here_are_checked():
    for block in all_blocks():
        if block.kind == "checked":
            CHECKED[block.arg](block)


def test_the_readme_runs_as_written(tmp_path):
    s = Session(tmp_path)
    (s.io / "vault").mkdir()
    try:
        for block in all_blocks():
            if block.kind == "run":
                if block.arg == "token-sources":  # the secret store holds the fleet's token
                    (s.io / "vault" / "pool").write_text(s.tokens["pool"] + "\n")
                run_block(s, block)
            elif block.kind == "writes":
                (s.cwd() / block.arg).write_text(block.text)
            elif block.kind == "output":
                check_output(s, block)
        s.stop_serve()  # everything still running stops cleanly: workers drain, serve exits 0
    finally:
        s.close()
