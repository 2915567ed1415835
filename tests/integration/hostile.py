"""A hostile client: a websocket spoken by hand (wsproto over a trio TCP stream).

The attacks need what a well-behaved client never does: any Host and Origin headers, an
enrollment with chosen ids, frames pipelined without reading a single reply, and hundreds of
sockets at once. Nothing of swamp's own client code is used here.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from swamp.protocol.frames import PROTOCOL_VERSION


class Refused(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.body = status, body


class RawSocket:
    def __init__(self, stream: trio.SocketStream, ws: WSConnection) -> None:
        self.stream = stream
        self.ws = ws
        self.closed: tuple[int, str] | None = None  # (code, reason) once the server closed
        self._ids = 0
        self._sending = trio.Lock()
        self._partial = ""

    async def _send_bytes(self, data: bytes) -> None:
        async with self._sending:
            await self.stream.send_all(data)

    @classmethod
    async def open(
        cls, url: str, *, host: str | None = None, headers: list[tuple[str, str]] = ()
    ) -> RawSocket:
        """Upgrade; raises :class:`Refused` if the server answers with an HTTP status."""
        parts = urlsplit(url)
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        ws = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(
            ws.send(Request(host=host or parts.netloc, target="/", extra_headers=list(headers)))
        )
        status, body = None, b""
        while True:
            data = await stream.receive_some(65536)
            if not data:
                await stream.aclose()
                raise Refused(status or 0, body)
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    return cls(stream, ws)
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        await stream.aclose()
                        raise Refused(status, body)
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        await stream.aclose()
                        raise Refused(status or 0, body)

    async def send(self, obj: dict | str) -> None:
        text = obj if isinstance(obj, str) else json.dumps(obj)
        await self._send_bytes(self.ws.send(Message(data=text)))

    async def request(self, method: str, params: dict | None = None) -> dict:
        """Send a request and return its reply frame (answering pings on the way)."""
        self._ids += 1
        frame_id = f"r{self._ids}"
        await self.send(
            {"type": "request", "id": frame_id, "method": method, "params": params or {}}
        )
        while True:
            frame = await self.next_frame()
            if frame is None:
                raise ConnectionError(f"closed before the reply: {self.closed}")
            if frame.get("id") == frame_id and frame.get("type") in ("response", "error"):
                return frame

    async def next_frame(self) -> dict | None:
        """The next JSON frame from the server; ``None`` once it has closed the socket."""
        while True:
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    self._partial += event.data
                    if not event.message_finished:
                        continue
                    frame, self._partial = json.loads(self._partial), ""
                    if frame.get("type") == "ping":
                        await self.send({"type": "pong"})
                    return frame
                if isinstance(event, CloseConnection):
                    self.closed = (event.code, event.reason)
                    return None
                if isinstance(event, Ping):
                    await self._send_bytes(self.ws.send(event.response()))
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.closed = self.closed or (1006, "connection lost")
                return None
            self.ws.receive_data(data)

    async def wait_closed(self) -> tuple[int, str]:
        while await self.next_frame() is not None:
            pass
        return self.closed

    async def close(self, code: int, reason: str) -> None:
        """A close frame with a reason of our choosing (reasons end up in the server's log)."""
        await self._send_bytes(self.ws.send(CloseConnection(code=code, reason=reason)))
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


def enroll_params(token: str, **over) -> dict:
    return {
        "token": token,
        "instanceId": str(uuid.uuid4()),
        "machineId": str(uuid.uuid4()),
        "protocolVersion": PROTOCOL_VERSION,
        "version": "test",
        "platform": "linux",
        "arch": "x86_64",
        "labels": {},
        "capacity": 1,
        **over,
    }


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")
