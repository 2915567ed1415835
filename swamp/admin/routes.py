"""Which route an admin command takes: a running server, or the repo itself."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

from swamp.admin.local import RepoAdmin
from swamp.admin.remote import RemoteAdmin
from swamp.domain.database import shown
from swamp.domain.urls import is_loopback, redact, sends_in_clear, url_list
from swamp.errors import PeerError, Unauthorized, UserError
from swamp.protocol.admin import AdminApi
from swamp.repo import Repo, same_server


def admin_credential(server: str, server_token: str | None, repo_dir: Path | None) -> str | None:
    """The credential to present to ``server``: the explicit server token, else the local
    credential of the repo's running server — only when ``server`` is that server."""
    if server_token:
        if sends_in_clear(server):
            print(
                f"warning: the server token crosses the network in clear text to "
                f"{redact(server)}; prefer wss://",
                file=sys.stderr,
            )
        return server_token
    try:
        return Repo.find(repo_dir).admin_credential_for(server)
    except UserError:
        return None


def _announced_elsewhere(server: str, repo_dir: Path | None) -> str | None:
    """The address the repo's running server announced, when ``server`` is another spelling of
    a loopback address on its port (``localhost``, ``[::1]``): the local credential was not
    presented there, and the operator should be told why."""
    announced = running_server(repo_dir)
    if announced is None or same_server(announced, server):
        return None
    try:
        a, b = urlsplit(announced), urlsplit(server)
        same_port = a.scheme == b.scheme and a.port == b.port
    except ValueError:
        return None
    if same_port and is_loopback(a.hostname or "") and is_loopback(b.hostname or ""):
        return announced
    return None


def own_ca(server: str, repo_dir: Path | None) -> str | None:
    """The CA of the repo's running server (``serve --tls auto``) when ``server`` is that
    server: the CLI in the repo trusts it with no ``--ca-cert``."""
    try:
        return Repo.find(repo_dir).own_ca_for(server)
    except UserError:
        return None


def running_server(repo_dir: Path | None) -> str | None:
    try:
        return Repo.find(repo_dir).running_server()
    except UserError:
        return None


def server_urls(server: str) -> tuple[str, ...]:
    """``--server``: one orchestrator's URL, or several of one shared database separated by
    commas (tried in turn)."""
    urls = url_list(server, source="--server (SWAMP_SERVE_URL)")
    if not urls:
        raise UserError(f"--server (SWAMP_SERVE_URL) names no URL (got {server[:80]!r})")
    return urls


@asynccontextmanager
async def connect_any(
    urls: tuple[str, ...],
    *,
    server_token: str | None,
    ca_cert: Path | None,
    repo_dir: Path | None,
) -> AsyncIterator[RemoteAdmin]:
    """The first of ``urls`` that can be reached (one that cannot: the next; none: why the
    last could not). Only reaching it moves on: what it answers is its own."""
    failed: PeerError | None = None
    for url in urls:
        stack = AsyncExitStack()
        try:
            api = await stack.enter_async_context(
                _connect(url, server_token=server_token, ca_cert=ca_cert, repo_dir=repo_dir)
            )
        except PeerError as exc:  # cannot connect, or closed as it did
            failed = exc
            continue
        async with stack:
            yield api
        return
    assert failed is not None
    raise failed


@asynccontextmanager
async def _connect(
    server: str, *, server_token: str | None, ca_cert: Path | None, repo_dir: Path | None
) -> AsyncIterator[RemoteAdmin]:
    credential = admin_credential(server, server_token, repo_dir)
    ca_pem = None if ca_cert else own_ca(server, repo_dir)
    try:
        async with RemoteAdmin.connect(
            server, credential=credential, ca_cert=ca_cert, ca_pem=ca_pem
        ) as api:
            yield api
    except Unauthorized as exc:
        announced = None if credential else _announced_elsewhere(server, repo_dir)
        if announced is None:
            raise
        raise Unauthorized(
            f"{exc.message} (this repo's server announced {announced}: its local "
            f"credential is presented to that address only; pass --server {announced})"
        ) from None


@asynccontextmanager
async def open_route(
    *,
    repo_dir: Path | None,
    server: str | None = None,
    server_token: str | None = None,
    ca_cert: Path | None = None,
    prefer_server: bool = False,
) -> AsyncIterator[AdminApi]:
    """``--server`` (or ``SWAMP_SERVE_URL``) means the server route. ``prefer_server`` — for
    what only a running orchestrator can do (placing a method, probing workers) — also takes
    the server the repo's ``.swamp/serve.json`` announces. Otherwise, the repo itself."""
    if not server and prefer_server:
        server = running_server(repo_dir)
    if server:
        async with connect_any(
            server_urls(server), server_token=server_token, ca_cert=ca_cert, repo_dir=repo_dir
        ) as api:
            yield api
        return
    repo = Repo.find(repo_dir)
    keeper, configured = repo.records_elsewhere()
    if keeper is not None:  # the records are in PostgreSQL: through the server that keeps them
        async with open_route(
            repo_dir=repo_dir, server=keeper, server_token=server_token, ca_cert=ca_cert
        ) as api:
            yield api
        return
    if configured is not None:
        raise UserError(
            f"this repo's records are in PostgreSQL ({shown(configured)}), not in its file: "
            "start 'swamp serve' here, or pass --server URL"
        )
    store = repo.open_store()
    try:
        yield RepoAdmin(repo, store)
    finally:
        store.close()
