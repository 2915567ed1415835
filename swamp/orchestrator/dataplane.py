"""The HTTP data plane: resources written and read by running dispatches, plus ``/health``.

``PUT  /data/resources/{spec}/{name}``  body: a JSON object, or raw bytes (any other type)
``GET  /data/resources/{name}``         the latest value: JSON, or the bytes as written
``GET  /health``                        ``{"status": "ok"}``; with a ``read`` (or ``admin``)
                                        credential, also the version and the pool's size
``GET  /metrics``                       supply and demand in the Prometheus text format (a
                                        credential of any scope, unless ``--auth none``)
``GET  /swamp.pyz``                     the orchestrator's own build (``X-Swamp-Sha256``), and
``GET  /swamp.pyz.sha256``              its checksum: open, unless ``--private-downloads``
                                        (then a ``read`` or ``admin`` credential)
``GET  /tls/ca.pem``                    the CA certificate of ``serve --tls auto`` (public:
                                        a worker checks it against its pin before trusting it)
``GET  /ui/…``, ``POST /ui/…``           the web pages of the fleet (``swamp.ui``, given as
                                        ``pages``: their own login, sessions and headers)

Every request carries ``Authorization: Bearer <dispatch credential>``; the credential scopes it
to one running dispatch and therefore to one model instance and its declared specs; an admin
credential of any scope opens none of it. Names are checked against the name rule, so no path
can escape. Errors are ``{"error": {code, message}}``. Which scope each admin route needs is
``swamp.domain.scopes``'s, checked by the app exactly as for an admin frame.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import unquote

import trio

from swamp import __version__
from swamp.domain.names import check_data_name
from swamp.domain.quota import WriteQuota
from swamp.domain.request_policy import is_page
from swamp.errors import (
    Busy,
    DispatchEnded,
    Forbidden,
    MalformedFrame,
    NotFound,
    SwampError,
    TooLarge,
    Unauthorized,
    UserError,
)
from swamp.models.context import read_value, write_value
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.downloads import CHUNK, Download
from swamp.orchestrator.metrics import CONTENT_TYPE, Metrics
from swamp.orchestrator.pool import Pool
from swamp.protocol.frames import MAX_VALUE_DEPTH, PROTOCOL_VERSION, load_json
from swamp.store.datastore import Key
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.dataplane")
Asgi = Callable[[dict, Callable, Callable], Awaitable[None]]  # an ASGI app: scope, receive, send
MAX_BODY = 16 * 1024 * 1024


# The HTTP status of each kind of error (the body carries its code, as on the websocket).
_STATUS = (
    (Busy, 429),
    (TooLarge, 413),
    (NotFound, 404),
    (Unauthorized, 401),
    (DispatchEnded, 409),
    (UserError, 400),
    (Forbidden, 403),
)


async def _nobody(scope, verb: str) -> None:
    raise Unauthorized("this data plane accepts no admin credential")


def http_status(exc: SwampError) -> int:
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), 409)


async def _respond(
    send,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    headers: list | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _json(send, status: int, obj) -> None:
    await _respond(send, status, json.dumps(obj, separators=(",", ":")).encode())


MAX_JSON_BODY = 1024 * 1024  # a JSON resource is attributes, read by every query that meets it
WRITES_PER_DISPATCH = 2  # under way at once; more get ``busy``
BODIES_IN_FLIGHT = 64 * 1024 * 1024  # bytes of bodies being taken in, all dispatches together


class _Intake:
    """What the data plane holds of bodies not yet written, across every request: a body is
    refused (``busy``, to be tried again) rather than held past :data:`BODIES_IN_FLIGHT`."""

    def __init__(self, limit: int = BODIES_IN_FLIGHT) -> None:
        self.limit = limit
        self.held = 0

    @asynccontextmanager
    async def read(
        self, receive, *, limit: int, over: Callable[[int], SwampError]
    ) -> AsyncIterator[bytes]:
        """The body, refused with ``over(size)`` as soon as it passes ``limit`` bytes. It
        counts as held until the block using it ends: the write included, however long the
        store makes it wait."""
        taken = 0
        try:
            chunks: list[bytes] = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise UserError("the client went away mid-request")
                chunk = message.get("body", b"")
                if taken + len(chunk) > limit:
                    raise over(taken + len(chunk))
                if self.held + len(chunk) > self.limit:
                    raise Busy(
                        "the orchestrator is taking in as much data as it may at once; "
                        "try the write again shortly"
                    )
                self.held += len(chunk)
                taken += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
            body = b"".join(chunks)
            del chunks
            yield body
        finally:
            self.held -= taken


async def _discard(receive, limit: int) -> None:
    """Read and drop a body the answer refuses before it is read (at most ``limit`` bytes),
    so the client is not cut off mid-upload and reads the refusal, not a reset."""
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            return
        size += len(message.get("body", b""))


def _content_length(headers: dict) -> int | None:
    try:
        value = int(headers.get(b"content-length", b"").decode("latin-1"))
    except ValueError:
        return None
    return value if value >= 0 else None


def _quota_refusal(quota: WriteQuota, active, size: int) -> SwampError:
    try:
        quota.check(
            written_bytes=active.written_bytes, written_records=active.written_records, adding=size
        )
    except SwampError as exc:
        return exc
    return TooLarge(f"a body of {size} bytes is too large")


class DataPlane:
    def __init__(
        self,
        dispatch: DispatchService,
        credentials: Credentials,
        pool: Pool,
        *,
        metrics: Metrics | None = None,
        download: Download | None = None,
        private_downloads: bool = False,
        quota: WriteQuota = WriteQuota(),
        ca_pem: str | None = None,
        admit: Callable[[dict, str], Awaitable[None]] | None = None,
        pages: Asgi | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.pages = pages  # /ui/…: the web pages of the fleet (swamp.ui), if served
        self.ca_pem = ca_pem  # GET /tls/ca.pem: the CA of serve --tls auto
        self.quota = quota  # what one dispatch may write, in all
        self.intake = _Intake()
        self.credentials = credentials
        self.pool = pool
        self.metrics = metrics
        self.download = download
        self.private_downloads = private_downloads
        # Raise unless the request's admin credential may call the verb (``AdminAuth.admit``).
        self.admit: Callable[[dict, str], Awaitable[None]] = admit if admit is not None else _nobody

    async def _admitted(self, scope, verb: str, *, missing: str) -> None:
        """``admit``, with this route's own words for a request that sent no credential."""
        if b"authorization" not in dict(scope.get("headers") or []):
            try:
                await self.admit(scope, verb)  # --auth none admits anyone
            except Unauthorized:
                raise Unauthorized(missing) from None
            return
        await self.admit(scope, verb)

    async def _may(self, scope, verb: str) -> bool:
        try:
            await self.admit(scope, verb)
        except Forbidden:  # Unauthorized and ScopeTooNarrow alike
            return False
        return True

    async def __call__(self, scope, receive, send) -> None:
        if self.pages is not None and is_page(scope["path"]):
            await self.pages(scope, receive, send)  # answers its own errors, as pages
            return
        try:
            await self._route(scope, receive, send)
        except SwampError as exc:
            await _json(send, http_status(exc), {"error": exc.to_wire()})

    async def _route(self, scope, receive, send) -> None:
        method, path = scope["method"], scope["path"]
        if path == "/health":
            # Anyone may learn that it is up (or that it cannot write); only a read or admin
            # credential learns what it runs, how big it is and why.
            store = self.dispatch.store
            broken = store.broken if store is not None else None
            body: dict = {"status": "degraded" if broken else "ok"}
            if await self._may(scope, "GET /health (details)"):
                body.update(
                    version=__version__,
                    protocolVersion=PROTOCOL_VERSION,
                    pool=self.pool.statistics(),
                    **({"reason": broken} if broken else {}),
                )
            await _json(send, 503 if broken else 200, body)
            return
        if path == "/tls/ca.pem" and method in ("GET", "HEAD"):
            await self._send_ca(send)
            return
        if path in ("/swamp.pyz", "/swamp.pyz.sha256") and method in ("GET", "HEAD"):
            await self._send_pyz(scope, send, checksum_only=path.endswith(".sha256"))
            return
        if path == "/metrics" and self.metrics is not None:
            await self._admitted(
                scope,
                "GET /metrics",
                missing="/metrics needs a credential: Authorization: Bearer <server token> "
                "(from 'swamp server token create NAME --scope metrics')",
            )
            await _respond(send, 200, self.metrics.render(), CONTENT_TYPE)
            return
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] != ["data", "resources"]:
            raise NotFound(f"no route {method} {path}")
        active = self._authorize(scope)
        if method == "PUT" and len(parts) == 4:
            await self._write(active, parts[2], parts[3], scope, receive, send)
        elif method == "GET" and len(parts) == 3:
            await self._read(active, parts[2], send)
        else:
            raise NotFound(f"no route {method} {path}")

    async def _send_ca(self, send) -> None:
        """The orchestrator's own CA certificate (``--tls auto``): public, for a worker that
        holds its pin to check before trusting it."""
        if self.ca_pem is None:
            raise NotFound("this orchestrator has no CA of its own (it does not serve --tls auto)")
        await _respond(send, 200, self.ca_pem.encode(), "application/x-pem-file")

    async def _send_pyz(self, scope, send, *, checksum_only: bool) -> None:
        """The orchestrator's own build, for machines to run (it holds no secret: open unless
        ``--private-downloads``)."""
        if self.private_downloads:
            await self._admitted(
                scope,
                "GET /swamp.pyz (private downloads)",
                missing="downloads are private here (--private-downloads): send a read or "
                "admin credential as Authorization: Bearer <server token>",
            )
        download = self.download
        if download is None:
            raise NotFound(
                "this orchestrator does not run from a pyz: start it from swamp.pyz, or pass "
                "'swamp serve --pyz PATH' to serve one"
            )
        digest = [(b"x-swamp-sha256", download.sha256.encode())]
        if checksum_only:
            body = f"{download.sha256}  swamp.pyz\n".encode()
            await _respond(send, 200, body, "text/plain; charset=utf-8", digest)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/zip"),
                    (b"content-length", str(download.size).encode()),
                    (b"content-disposition", b'attachment; filename="swamp.pyz"'),
                    *digest,
                ],
            }
        )
        if scope["method"] == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        async with await trio.open_file(download.path, "rb") as f:
            while chunk := await f.read(CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    def _authorize(self, scope):
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        grant = self.credentials.verify(token.strip()) if scheme.lower() == "bearer" else None
        if grant is None:
            raise Unauthorized(
                "a valid dispatch credential is required (Authorization: Bearer <credential>)"
            )
        active = self.dispatch.active.get(grant.dispatch_id)
        if active is None:
            raise DispatchEnded("the dispatch this credential belongs to has ended")
        return active

    async def _write(self, active, spec: str, name: str, scope, receive, send) -> None:
        policy = active.model_type.resource(spec).policy
        check_data_name(name)
        quota = self.quota
        quota.check(
            written_bytes=active.written_bytes, written_records=active.written_records, adding=0
        )
        if active.writing >= WRITES_PER_DISPATCH:
            raise Busy(
                f"this dispatch has {active.writing} writes under way already: wait for their "
                "answers before the next"
            )
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        is_json = content_type.startswith("application/json")
        cap = MAX_JSON_BODY if is_json else MAX_BODY
        room = quota.bytes - active.written_bytes

        def over(size: int) -> SwampError:
            if size > cap:
                kind = "a JSON resource" if is_json else "a resource"
                hint = " (write larger values as bytes)" if is_json else ""
                return TooLarge(f"{kind} may be at most {cap} bytes{hint}")
            return _quota_refusal(quota, active, size)

        declared = _content_length(headers)
        if declared is not None and declared > min(cap, room):
            refusal = over(declared)  # refused before a byte of it is kept
            await _discard(receive, MAX_BODY)  # so the client reads the refusal, not a reset
            raise refusal
        active.writing += 1
        try:
            async with self.intake.read(receive, limit=min(cap, room), over=over) as body:
                await self._keep(active, spec, name, policy, body, is_json, send)
        finally:
            active.writing -= 1

    async def _keep(self, active, spec: str, name: str, policy, body, is_json, send) -> None:
        """A body read whole and within every limit: checked, counted, written, answered."""
        quota = self.quota
        if is_json:
            try:
                value = load_json(body, max_depth=MAX_VALUE_DEPTH)
            except MalformedFrame as exc:
                raise UserError(f"the body is not usable JSON: {exc.message}") from None
            if not isinstance(value, dict):
                raise UserError("a JSON resource must be an object")
        else:
            value = body
        quota.check(
            written_bytes=active.written_bytes,
            written_records=active.written_records,
            adding=len(body),
        )
        # counted before the write: two writes of one dispatch at once cannot both fit
        active.written_bytes += len(body)
        active.written_records += 1
        try:
            await self.dispatch.episodes.record_write(active)
            key = Key(active.model_type.type, active.model_name, name)
            record = await retry_busy(lambda: write_value(self.dispatch.db, key, policy, value))
        except BaseException:
            active.written_bytes -= len(body)
            active.written_records -= 1
            raise
        handle = {"spec": spec, "name": name, "version": record.version}
        active.outputs.append(handle)
        await _json(send, 200, handle)

    async def _read(self, active, name: str, send) -> None:
        check_data_name(name)
        record = await self.dispatch.db.latest(Key(active.model_type.type, active.model_name, name))
        value = read_value(record)
        if record is None or value is None:
            raise NotFound(f"no data named {name!r} for this model yet")
        version = [(b"x-swamp-version", str(record.version).encode())]
        if isinstance(value, bytes):
            await _respond(send, 200, value, "application/octet-stream", version)
        else:
            await _respond(send, 200, json.dumps(value).encode(), "application/json", version)
