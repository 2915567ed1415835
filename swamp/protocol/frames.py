"""Frames, decoded once at the edge into typed values.

``request {type, id, method, params}``, ``response {id, result}``, ``error {id, error: {code,
message}}``, ``stream {id, event}``, ``cancel {id}``, ``ping``, ``pong``. Anything else, anything
larger than :data:`MAX_FRAME_BYTES`, or a frame with a missing or mistyped field is a
:class:`MalformedFrame`; the channel answers it with a coded error and carries on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from swamp.errors import FrameTooLarge, MalformedFrame

#: Bump when the shape of enrollment, dispatch or a capability changes.
#: 2: no session credential (nor ``worker.session.refresh``); the reply grants ``capacity``.
#: 3: a worker acknowledges a dispatch it is still running after a moment (``accepted``).
PROTOCOL_VERSION = 3
MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_ID_LENGTH = 128


@dataclass(frozen=True)
class Request:
    id: str
    method: str
    params: dict
    quiet: bool = False  # the caller reads no events: the handler's stream is not sent at all


@dataclass(frozen=True)
class Response:
    id: str
    result: Any


@dataclass(frozen=True)
class Error:
    id: str | None
    error: dict


@dataclass(frozen=True)
class Stream:
    id: str
    event: dict


@dataclass(frozen=True)
class Cancel:
    id: str


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Pong:
    # the interval the answering side wants from now on (its pool grew); absent: unchanged
    heartbeat: float | None = None


Frame = Request | Response | Error | Stream | Cancel | Ping | Pong


def _id(obj: dict, *, required: bool = True) -> str | None:
    value = obj.get("id")
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise MalformedFrame(f"a frame id must be a string of 1-{MAX_ID_LENGTH} characters")
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def load_json(text: str | bytes):
    """JSON from a peer: text that cannot come back out is refused here, once — a structure
    nested deeply enough to exhaust the parser, or a lone UTF-16 surrogate (``"\\ud800"``),
    which is valid JSON but cannot be encoded, written to SQLite or printed."""
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise MalformedFrame("a frame must be a JSON object") from None
    except RecursionError:
        raise MalformedFrame("the JSON is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text if isinstance(text, str) else text.decode("latin-1")):
        try:  # only frames that spell a surrogate pay for this check
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedFrame(
                "the JSON holds a lone surrogate (not a character: was the text valid UTF-8?)",
                frame_id=_answerable_id(obj),  # so that its caller is answered, not left waiting
            ) from None
    return obj


def _answerable_id(obj: object) -> str | None:
    """The id of a request refused after it parsed, if an answer can carry it back (only a
    request's: the id of anything else names a call of ours, not of the peer's)."""
    if not isinstance(obj, dict) or obj.get("type") != "request":
        return None
    value = obj.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def decode(text: str | bytes) -> Frame:
    if len(text) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(text)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    obj = load_json(text)
    if not isinstance(obj, dict):
        raise MalformedFrame("a frame must be a JSON object")
    kind = obj.get("type")
    if kind == "ping":
        return Ping()
    if kind == "pong":
        beat = obj.get("heartbeat")
        ok = isinstance(beat, (int, float)) and not isinstance(beat, bool) and 0 < beat <= 3600
        return Pong(float(beat) if ok else None)
    frame_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    try:
        if kind == "request":
            method = obj.get("method")
            params = obj.get("params", {})
            if not isinstance(method, str) or not method:
                raise MalformedFrame("a request needs a method name")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise MalformedFrame("request params must be a JSON object")
            return Request(_id(obj), method, params, obj.get("quiet") is True)
        if kind == "response":
            return Response(_id(obj), obj.get("result"))
        if kind == "error":
            error = obj.get("error")
            if not isinstance(error, dict):
                raise MalformedFrame("an error frame needs an error object")
            return Error(_id(obj, required=False), error)
        if kind == "stream":
            event = obj.get("event")
            if not isinstance(event, dict):
                raise MalformedFrame("a stream frame needs an event object")
            return Stream(_id(obj), event)
        if kind == "cancel":
            return Cancel(_id(obj))
    except MalformedFrame as exc:
        exc.frame_id = frame_id
        raise
    raise MalformedFrame(f"unknown frame type {kind!r}", frame_id=frame_id)


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # built once: json.dumps with options
# builds an encoder per call


def _dump(obj: dict) -> str:
    return _ENCODER.encode(obj)


def encode(frame: Frame) -> str:
    if isinstance(frame, Request):
        obj = {"type": "request", "id": frame.id, "method": frame.method, "params": frame.params}
        if frame.quiet:
            obj["quiet"] = True
        return _dump(obj)
    if isinstance(frame, Response):
        return _dump({"type": "response", "id": frame.id, "result": frame.result})
    if isinstance(frame, Error):
        return _dump({"type": "error", "id": frame.id, "error": frame.error})
    if isinstance(frame, Stream):
        return _dump({"type": "stream", "id": frame.id, "event": frame.event})
    if isinstance(frame, Cancel):
        return _dump({"type": "cancel", "id": frame.id})
    if isinstance(frame, Ping):
        return '{"type":"ping"}'
    if frame.heartbeat is not None:
        return _dump({"type": "pong", "heartbeat": frame.heartbeat})
    return '{"type":"pong"}'
