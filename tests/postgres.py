"""A throwaway PostgreSQL server for the tests: Debian's ``postgresql`` package, ``initdb``
into a temporary directory, started on a free port of 127.0.0.1, stopped and deleted at the
end of the session; a fresh database for each test that asks (``pg_url``).

``initdb`` and ``postgres`` refuse to run as root: under root they run as the package's
``postgres`` user (``runuser``), which owns the directory. The server trades durability for
speed (``fsync=off``): a test's database lives for the test. Missing the package, or psycopg,
the tests that need them are skipped with the reason — a failure under CI (``tests.external``),
where ``.ci/run`` installs both.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.external import require

USER = "swamp"  # the cluster's superuser (trust authentication, loopback only)
START_ATTEMPTS = 3  # a free port taken by someone else meanwhile: try another
_names = itertools.count()


def binaries() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: on the PATH, else Debian's newest
    ``/usr/lib/postgresql/N/bin`` (the package does not put them on the PATH)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    return Path(versions[-1]).parent if versions else None


@dataclass(frozen=True)
class Cluster:
    directory: Path
    port: int
    bin: Path
    as_user: tuple[str, ...]  # the command prefix that runs as the directory's owner

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t_{os.getpid()}_{next(_names)}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode],
            capture_output=True,
            check=False,
        )

    def start_again(self) -> None:
        """After :meth:`stop`: the same server on the same port (a fault test's restart)."""
        started = _pg_ctl_start(self.bin, self.as_user, self.directory, self.port)
        if started.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start again: {started.stderr}")

    @property
    def data(self) -> Path:
        return self.directory / "data"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_owner() -> tuple[str, ...]:
    if os.geteuid() != 0:
        return ()
    runuser = shutil.which("runuser")
    require(runuser is not None, "runuser (util-linux), to run PostgreSQL as postgres under root")
    return (str(runuser), "-u", "postgres", "--")


def start(bin_dir: Path) -> Cluster:
    """initdb and start a server in a new temporary directory."""
    directory = Path(tempfile.mkdtemp(prefix="swamp-pg-"))
    as_user = _as_owner()
    if as_user:
        shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    subprocess.run(
        [
            *as_user,
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ],  # fmt: skip
        check=True,
        capture_output=True,
    )
    last = ""
    for _ in range(START_ATTEMPTS):
        port = _free_port()
        started = _pg_ctl_start(bin_dir, as_user, directory, port)
        if started.returncode == 0:
            return Cluster(directory, port, bin_dir, as_user)
        last = started.stderr + (directory / "server.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"PostgreSQL did not start: {last}")


def _pg_ctl_start(
    bin_dir: Path, as_user: tuple[str, ...], directory: Path, port: int
) -> subprocess.CompletedProcess:
    options = (
        f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
    )
    return subprocess.run(
        [
            *as_user,
            str(bin_dir / "pg_ctl"),
            "start",
            "-D",
            str(directory / "data"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "-l",
            str(directory / "server.log"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=False,
    )


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """A running server for the session (skipped, or failed under CI, without one)."""
    bin_dir = binaries()
    require(bin_dir is not None, "PostgreSQL (Debian's postgresql package: initdb, pg_ctl)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        require(False, "psycopg (pip install 'swamp[postgres]')")
    assert bin_dir is not None
    running = start(bin_dir)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(running.directory, ignore_errors=True)
