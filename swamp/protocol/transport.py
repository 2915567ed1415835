"""The channel's view of a websocket: send text, receive text, close. Two adapters.

Keeping the RPC channel independent of the server means the ASGI server (Hypercorn) and the
client library (trio-websocket) can each be swapped without touching the protocol.
"""

from __future__ import annotations

from typing import Protocol

import trio
import trio_websocket

from swamp.errors import ChannelClosed


class TransportClosed(ChannelClosed):
    """The socket is gone; ``message`` says why (close code and reason when known)."""


class Transport(Protocol):
    async def send(self, text: str) -> None: ...

    async def receive(self) -> str: ...

    async def aclose(self, code: int = 1000, reason: str = "") -> None: ...


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed websocket handshake (the cause is where the detail is)."""
    if isinstance(exc, trio_websocket.ConnectionRejected):
        return f"the server answered HTTP {exc.status_code}"
    return str(exc) or str(exc.__cause__ or "") or type(exc).__name__


def _describe(code: int | None, reason: str | None) -> str:
    if code in (None, 1000, 1005) and not reason:
        return "connection closed"
    text = f"connection closed (code {code}"
    return text + (f": {reason})" if reason else ")")


class WebSocketTransport:
    """A trio-websocket client connection."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws

    async def send(self, text: str) -> None:
        try:
            await self.ws.send_message(text)
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(_describe(exc.reason.code, exc.reason.reason)) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportClosed(f"connection lost: {exc}") from None

    async def receive(self) -> str:
        try:
            message = await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(_describe(exc.reason.code, exc.reason.reason)) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportClosed(f"connection lost: {exc}") from None
        return message if isinstance(message, str) else message.decode("utf-8", "replace")

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        with trio.move_on_after(2) as scope:
            scope.shield = True
            try:
                await self.ws.aclose(code, reason)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


class AsgiTransport:
    """An accepted ASGI websocket (Hypercorn)."""

    def __init__(self, receive, send) -> None:
        self._receive = receive
        self._send = send
        self.closed = False

    async def send(self, text: str) -> None:
        if self.closed:
            raise TransportClosed("connection closed")
        try:
            await self._send({"type": "websocket.send", "text": text})
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.closed = True
            raise TransportClosed(f"connection lost: {exc}") from None
        except Exception as exc:  # Hypercorn raises its own errors once the client is gone
            self.closed = True
            raise TransportClosed(f"connection lost: {exc}") from None

    async def receive(self) -> str:
        message = await self._receive()
        kind = message.get("type")
        if kind == "websocket.receive":
            if message.get("text") is not None:
                return message["text"]
            return (message.get("bytes") or b"").decode("utf-8", "replace")
        self.closed = True
        raise TransportClosed(_describe(message.get("code"), message.get("reason")))

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        with trio.move_on_after(2) as scope:
            scope.shield = True
            try:
                await self._send({"type": "websocket.close", "code": code, "reason": reason})
            except Exception:  # already gone: nothing left to close
                pass
