"""The orchestrator's directory: ``swamp.toml``, ``models/``, ``workflows/``, ``.swamp/``.

``swamp init`` creates one; every repo command finds it through ``--repo-dir`` (env
``SWAMP_REPO_DIR``, default the current directory) and refuses, saying how to make one, when the
directory is not a repo. ``swamp serve`` does not initialise silently: serving the wrong directory
by a typo would create a stray database.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import tomli_w

from swamp.compat import tomllib
from swamp.domain.durations import parse_timeout
from swamp.domain.environment import check_names
from swamp.domain.names import check_instance_name, is_model_type
from swamp.domain.read_scope import ReadEntry, ReadScope, parse_reads
from swamp.errors import AlreadyServing, UnknownModel, UserError
from swamp.ids import new_id
from swamp.store.datastore import Datastore

CONFIG_FILE = "swamp.toml"


@dataclass(frozen=True)
class ModelInstance:
    """A named model with its arguments, from ``models/<name>.toml`` (or ad hoc from a type).

    ``env`` names the orchestrator's variables its dispatches carry to a worker; ``reads`` names
    the other models whose data its methods may query (see ``domain/read_scope``).
    """

    name: str
    type: str
    args: dict
    source: str
    env: tuple[str, ...] = ()
    reads: tuple[ReadEntry, ...] = ()
    retry: str = "unwritten"  # run again if its worker was lost before it wrote; or "never"
    timeout: str | None = None  # how long a dispatch may run on a worker ("30m"); a run's wins


_MODEL_KEYS = ("name", "type", "args", "env", "reads", "retry", "timeout")
RETRY_POLICIES = ("unwritten", "never")


@dataclass(frozen=True)
class Repo:
    root: Path
    # the model instances last read from models/, and the listing they were read at
    _models: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def state_dir(self) -> Path:
        return self.root / ".swamp"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "swamp.db"

    @property
    def journal_path(self) -> Path:
        """Lease rows made durable and not yet in the database (``swamp.store.journal``)."""
        return self.state_dir / "swamp.journal"

    @property
    def serve_file(self) -> Path:
        return self.state_dir / "serve.json"

    @property
    def database_file(self) -> Path:
        """Where this repo's orchestrator last kept its records when not in its file: the
        database's URL as it may be shown (no password), for the CLI once serve has stopped."""
        return self.state_dir / "database"

    def remember_database(self, shown: str | None) -> None:
        """``serve`` says where it keeps the records (``None``: the repo's file)."""
        if shown is None:
            self.database_file.unlink(missing_ok=True)
        else:
            self.database_file.write_text(shown + "\n")

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "serve.lock"

    @contextmanager
    def serve_lock(self) -> Iterator[None]:
        """Hold the repo for one ``swamp serve``: taken before anything is read or written, so a
        second one changes nothing — not the live one's leases, not its ``serve.json`` — and
        says which process holds it. The operating system drops the lock when the holder dies,
        however it dies."""
        self.state_dir.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _try_lock(fd):
                holder = os.read(fd, 64).decode("ascii", "replace").strip() or "?"
                raise AlreadyServing(
                    f"another swamp serve (pid {holder}) is serving {self.root}: stop it first, "
                    "or serve another repo"
                )
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            yield
        finally:
            os.close(fd)  # releases the lock

    @classmethod
    def init(cls, root: Path) -> tuple[Repo, bool]:
        """Create (or complete) a repo; returns it and whether anything was created."""
        root = root.resolve()
        created = False
        for sub in ("models", "workflows", ".swamp"):
            path = root / sub
            if not path.is_dir():
                path.mkdir(parents=True, exist_ok=True)
                created = True
        config = root / CONFIG_FILE
        if not config.exists():
            config.write_text(
                tomli_w.dumps(
                    {
                        "swamp": {"version": 1},
                        "serve": {"host": "127.0.0.1", "port": 7420},
                    }
                )
            )
            created = True
        repo = cls(root)
        if not repo.db_path.exists():
            created = True
        repo.open_store().close()
        os.chmod(repo.state_dir, 0o700)
        return repo, created

    @classmethod
    def find(cls, root: Path | str | None) -> Repo:
        path = Path(root or ".").resolve()
        if not (path / CONFIG_FILE).is_file():
            raise UserError(
                f"{path} is not a swamp repo (no {CONFIG_FILE}): create one with "
                f"'swamp init {path}' or point --repo-dir / SWAMP_REPO_DIR at an existing repo"
            )
        (path / ".swamp").mkdir(mode=0o700, exist_ok=True)
        return cls(path)

    def open_store(self, *, orchestrator: bool = False) -> Datastore:
        return Datastore(self.db_path, orchestrator=orchestrator)

    def config(self) -> dict:
        try:
            return tomllib.loads((self.root / CONFIG_FILE).read_text())
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{self.root / CONFIG_FILE} is not valid TOML: {exc}") from exc

    # -- model instances ---------------------------------------------------------------------

    def model_instances(self) -> dict[str, ModelInstance]:
        """The instances in ``models/*.toml``. A long-lived process (the orchestrator resolves
        a model per dispatch) reads and parses them again only when the directory's listing
        changed: a file added, removed, renamed, or rewritten (its size or modification time).
        Listing and comparing costs a tenth of reading and parsing, and nothing blocks on a
        file's contents while nothing changed."""
        listing = self._models_listing()
        if listing is not None and self._models.get("listing") == listing:
            return dict(self._models["instances"])
        instances = self._read_model_instances()
        self._models.update(listing=listing, instances=instances)
        return dict(instances)

    def _models_listing(self) -> tuple | None:
        """``(name, size, mtime)`` of each ``models/*.toml``; ``None`` if it cannot be listed
        (then nothing is cached)."""
        try:
            with os.scandir(self.root / "models") as entries:
                listing = []
                for entry in entries:
                    if entry.name.endswith(".toml"):
                        stat = entry.stat()
                        listing.append((entry.name, stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError:
            return ()
        except OSError:
            return None
        return tuple(sorted(listing))

    def _read_model_instances(self) -> dict[str, ModelInstance]:
        instances: dict[str, ModelInstance] = {}
        for path in sorted((self.root / "models").glob("*.toml")):
            try:
                data = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as exc:
                raise UserError(f"{path} is not valid TOML: {exc}") from exc
            name = data.get("name", path.stem)
            check_instance_name(name, what=f"model name in {path.name}")
            if not isinstance(data.get("type"), str):
                raise UserError(f"{path} needs a 'type' (e.g. type = \"command/shell\")")
            args = data.get("args", {})
            if not isinstance(args, dict):
                raise UserError(f"{path}: 'args' must be a table")
            unknown = sorted(set(data) - set(_MODEL_KEYS))
            if unknown:
                raise UserError(
                    f"{path}: unknown key {unknown[0]!r} (a model file has "
                    f"{', '.join(_MODEL_KEYS)})"
                )
            for key in ("env", "reads"):
                if not isinstance(data.get(key, []), list):
                    raise UserError(f"{path}: {key!r} must be a list of strings")
            env = check_names(data.get("env", []), source=f"{path.name} env")
            retry = data.get("retry", "unwritten")
            if retry not in RETRY_POLICIES:
                raise UserError(
                    f'{path}: retry must be "unwritten" (run again on another worker if its '
                    f'worker is lost before it writes anything) or "never", not {retry!r}'
                )
            reads = parse_reads(data.get("reads", []), source=f"{path.name} reads")
            timeout = data.get("timeout")
            if timeout is not None:
                parse_timeout(timeout, what=f"timeout in {path.name}")
            instances[name] = ModelInstance(
                name, data["type"], args, str(path), env, reads, retry, timeout
            )
        return instances

    def read_scope(self, model: ModelInstance) -> ReadScope:
        """What dispatches of ``model`` may query: its own data plus what it declares."""
        if not model.reads:
            return ReadScope.of(model.type, model.name)
        instances = self.model_instances()
        also, patterns = [], []
        for entry in model.reads:
            if entry.type_pattern is not None:
                patterns.append(entry.type_pattern)
            elif entry.instance in instances:
                also.append((instances[entry.instance].type, entry.instance))
            else:
                raise UserError(
                    f"{model.source}: reads names {entry.instance!r}, which is not a "
                    f"model in models/ (instances: {', '.join(sorted(instances))})"
                )
        return ReadScope.of(model.type, model.name, also=also, type_patterns=patterns)

    def resolve_model(self, model: str) -> ModelInstance:
        """An instance name from ``models/``, or a model type (an ad-hoc instance).

        Instance names cannot contain ``/``, so a type never needs the directory scan.
        """
        if is_model_type(model):
            return adhoc(model)
        instances = self.model_instances()
        if model in instances:
            return instances[model]
        known = ", ".join(sorted(instances)) or "none defined in models/"
        raise UnknownModel(
            f"no model named {model!r} (instances: {known}); pass a model type "
            "such as command/shell for an ad-hoc instance"
        )

    # -- the running server's address --------------------------------------------------------

    def remove_serve_file(self) -> None:
        """Remove ``serve.json`` if this process wrote it (never another server's)."""
        try:
            if json.loads(self.serve_file.read_text()).get("pid") == os.getpid():
                self.serve_file.unlink()
        except (OSError, ValueError, AttributeError):
            pass

    def write_serve_file(
        self,
        url: str,
        data_plane_url: str,
        *,
        admin_credential: str | None = None,
        ca_pin: str | None = None,
        shared_records: bool = False,
    ) -> None:
        """Announce the running server: its URL and (readable by the repo's owner only) the
        local admin credential the CLI presents to it; ``shared_records``: its records are in
        a database, not this repo's file (the CLI in the repo then goes through it)."""
        info: dict = {"url": url, "dataPlaneUrl": data_plane_url, "pid": os.getpid()}
        if shared_records:
            info["records"] = "postgresql"
        if admin_credential:
            info["adminCredential"] = admin_credential
        if ca_pin:
            info["caPin"] = ca_pin
        tmp = self.serve_file.with_name(f".serve.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(info))
        os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a file that already existed
        tmp.replace(self.serve_file)

    def _serve_info(self) -> dict | None:
        """``.swamp/serve.json`` if the process that wrote it still serves: it is alive, and
        the repo's serve lock is held (a pid alone may have been reused by another process
        after a crash left the file behind)."""
        try:
            info = json.loads(self.serve_file.read_text())
            os.kill(int(info["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(info, dict) or not self._serving():
            return None
        return info

    def _serving(self) -> bool:
        """Is the repo's serve lock held (by a running ``swamp serve``)?"""
        try:
            fd = os.open(self.lock_file, os.O_RDONLY)
        except OSError:
            return False
        try:
            return not _try_lock(fd)  # taken by us: nobody holds it (closing lets it go)
        finally:
            os.close(fd)

    def running_server(self) -> str | None:
        """The URL in ``.swamp/serve.json`` if that process is still alive."""
        info = self._serve_info()
        return info.get("url") if info else None

    def records_elsewhere(self) -> tuple[str | None, str | None]:
        """Where this repo's records are when they are not its file: (the running server that
        keeps them in PostgreSQL, the database otherwise meant — where this repo's serve last
        kept them, or set for it in ``SWAMP_DATABASE_URL`` or swamp.toml). A running serve is
        believed over the rest: it says where it keeps them."""
        info = self._serve_info()
        if info is not None:
            return (info.get("url") if info.get("records") == "postgresql" else None), None
        configured = os.environ.get("SWAMP_DATABASE_URL") or None
        if configured is None:
            table = self.config().get("serve")
            value = table.get("database") if isinstance(table, dict) else None
            configured = value if isinstance(value, str) and value else None
        if configured is None and self.database_file.is_file():
            configured = self.database_file.read_text().strip() or None
        return None, configured

    def admin_credential_for(self, url: str) -> str | None:
        """The local admin credential of the server running on this repo — only if ``url`` is
        that server (the credential must never be sent anywhere else)."""
        info = self._serve_info()
        if not info or not info.get("adminCredential") or not same_server(info.get("url"), url):
            return None
        return info["adminCredential"]

    def own_ca_for(self, url: str) -> str | None:
        """The CA certificate (PEM) of the server running on this repo, if it serves with its
        own CA and ``url`` is that server; checked against the pin it announced."""
        info = self._serve_info()
        if not info or not info.get("caPin") or not same_server(info.get("url"), url):
            return None
        from swamp.tls.authority import directory
        from swamp.tls.certificates import CertificateError
        from swamp.tls.trust import pem_pin

        try:
            text = (directory(self.state_dir) / "ca.pem").read_text()
            return text if pem_pin(text) == info["caPin"] else None
        except (OSError, CertificateError, ValueError):
            return None


def _try_lock(fd: int) -> bool:
    """An exclusive, non-blocking lock on an open file."""
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def same_server(announced: object, url: str) -> bool:
    """Is ``url`` exactly the address ``serve`` announced (the one it bound)? Scheme, host and
    port must all be the same; an IP address compares by value (``[::1]`` = ``[0::1]``), a name
    by its lowercase spelling. Other spellings of loopback are *not* the same server: another
    local user may listen on ``[::1]`` or answer for ``localhost`` on the same port, and the
    local credential must never reach them."""
    if not isinstance(announced, str):
        return False
    try:
        a, b = urlsplit(announced), urlsplit(url)
        a_port, b_port = a.port, b.port
    except ValueError:
        return False
    if a.scheme != b.scheme or a_port is None or a_port != b_port:
        return False
    host = _host_key(a.hostname)
    return host is not None and host == _host_key(b.hostname)


def _host_key(host: str | None) -> str | None:
    if not host:
        return None
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower()


def adhoc(model_type: str) -> ModelInstance:
    """A run of a model type with no instance named: an instance of its own (``run-`` and
    16 random hex digits), so its data is its own — what it writes, no other run reads or
    overwrites, and what it reads is only what it wrote (or what its model declares)."""
    return ModelInstance(name=f"run-{new_id()[:16]}", type=model_type, args={}, source="ad hoc")
