"""The method context on a worker: every capability is a call home.

``query_data`` is an RPC over the control socket; ``write_resource`` / ``read_resource`` go over
the HTTP data plane with the dispatch's own credential; logs stream back as events of the
dispatch. The method code cannot tell it apart from the local context. All of it goes through
the run's link (``swamp.worker.runs``): while the run is carried between orchestrators, a call
home waits, and a read cut off by the move is asked again through the next one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import httpx
import trio

from swamp.domain.names import check_data_name
from swamp.errors import (
    Busy,
    ChannelClosed,
    DataPlaneError,
    MalformedFrame,
    MalformedReply,
    PeerError,
    UserError,
    from_wire,
)
from swamp.models.context import ContextBase
from swamp.protocol.messages import (
    Effects,
    LogLine,
    LogStream,
    QueryDataReply,
    QueryDataRequest,
)
from swamp.worker.runs import Link, Run

T = TypeVar("T")


class RemoteContext(ContextBase):
    def __init__(
        self,
        *,
        run: Run,
        dispatch_id: str,
        cache_dir=None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dispatch_id=dispatch_id, **kwargs)
        self.dispatch_id: str = dispatch_id  # always one: a worker runs only dispatches
        self.cache_dir = cache_dir  # the worker's cache directory (for probe seams)
        self.run = run  # where its events and calls home go (the session of the moment's)
        self.commands = run.commands  # (paused while the run is carried)

    async def may_start(self) -> None:
        await self.run.linked()  # (no new command while the run is carried)

    def command_started(self, command) -> None:
        super().command_started(command)
        if self.run.link is None:  # (its start was under way as the socket went)
            command.pause(True)

    async def report_effects(self) -> None:
        await self.run.emit(Effects().to_json())

    async def log(self, line: str, *, stream: LogStream = "log") -> None:
        await self.run.emit(LogLine(line=line, stream=stream).to_json())

    async def query_data(self, predicate: str) -> list[dict]:
        request = QueryDataRequest(dispatch_id=self.dispatch_id, predicate=predicate).to_json()
        while True:
            link = await self.run.linked()  # (waits while the run is carried)
            try:
                answer = await _patiently(
                    partial(link.call.channel.call, "capability.queryData", request)
                )
                break
            except ChannelClosed:
                # its socket closed: carried, it is asked again through the orchestrator the
                # worker moves to (a read); not carried, the run is stopped meanwhile
                await self.run.unlinked(link)
        try:
            return QueryDataReply.decode(answer).records
        except MalformedFrame as exc:
            raise MalformedReply(f"queryData: {exc.message}") from None

    async def write_resource(self, spec: str, name: str, value: Any) -> dict:
        self._check_write(spec, name)
        if isinstance(value, (bytes, bytearray)):
            body, content_type = bytes(value), "application/octet-stream"
        elif isinstance(value, dict):
            body, content_type = json.dumps(value).encode(), "application/json"
        else:
            raise UserError("a resource value must be an object (dict) or bytes")
        response = await self._request(
            "PUT",
            f"/data/resources/{spec}/{name}",
            content=body,
            headers={"Content-Type": content_type},
        )
        handle = response.json()
        self.outputs.append(handle)
        return handle

    async def read_resource(self, name: str) -> Any:
        check_data_name(name)
        response = await self._request("GET", f"/data/resources/{name}", missing_ok=True)
        if response.status_code == 404:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.content

    async def _request(
        self, method: str, path: str, *, missing_ok: bool = False, **kwargs: Any
    ) -> httpx.Response:
        while True:
            link = await self.run.linked()  # (waits while the run is carried)
            try:
                return await _patiently(
                    partial(self._request_once, link, method, path, missing_ok, kwargs)
                )
            except PeerError:
                if method != "GET" or self.run.link is link:
                    raise  # a write may have landed: never sent twice
                # a read: asked again through the orchestrator the worker moved to

    async def _request_once(
        self, link: Link, method: str, path: str, missing_ok: bool, kwargs: dict
    ) -> httpx.Response:
        kwargs = dict(kwargs)
        url = link.data_plane + path
        try:
            response = await link.http.request(
                method, url, headers={**link.headers, **kwargs.pop("headers", {})}, **kwargs
            )
        except httpx.HTTPError as exc:
            raise PeerError(
                f"the data plane at {link.data_plane} is unreachable: {type(exc).__name__}: {exc}"
            ) from None
        if response.status_code == 404 and missing_ok:
            return response
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                raise DataPlaneError(
                    f"data plane refused {method} {path}: HTTP "
                    f"{response.status_code} {response.text[:200]}"
                ) from None
            refusal = from_wire(error)
            refusal.message = f"data plane refused {method} {path}: {refusal.message}"
            refusal.args = (refusal.message,)
            raise refusal
        return response


BUSY_PATIENCE = 60.0  # seconds a capability call is tried again while the orchestrator is busy


async def _patiently(attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, again with growing pauses while the orchestrator answers ``busy`` (its
    query threads or its intake of bodies are taken, or this dispatch has two writes under
    way): a method sees ``busy`` only if it lasts :data:`BUSY_PATIENCE` seconds."""
    pause = 0.05
    give_up = trio.current_time() + BUSY_PATIENCE
    while True:
        try:
            return await attempt()
        except Busy:
            if trio.current_time() + pause > give_up:
                raise
        await trio.sleep(pause)
        pause = min(pause * 2, 2.0)
