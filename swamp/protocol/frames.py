"""Frames, decoded once at the edge into typed values.

``request {type, id, method, params}``, ``response {id, result}``, ``error {id, error: {code,
message}}``, ``stream {id, event}``, ``cancel {id}``, ``ping``, ``pong``. Anything else, anything
larger than :data:`MAX_FRAME_BYTES`, or a frame with a missing or mistyped field is a
:class:`MalformedFrame`; the channel answers it with a coded error and carries on.

One depth limit, :data:`MAX_JSON_DEPTH`, holds both ways: a frame nested deeper is refused as it
is read (with its id, when the parser got that far), and a message's JSON stops two levels short
of it as it is written (the frame and the message around a field), so nothing a peer sends can
fail to go out again on its way through (a worker's result relayed to its client) — the relay
is as deep as what it carries. A value stored to be sent later inside other frames (a
resource written over the data plane, which a query's answer carries six levels down) may nest
only :data:`MAX_VALUE_DEPTH` deep.
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
#: How deep a frame's JSON may nest, read or written (``[]`` is one level, ``[[]]`` two).
MAX_JSON_DEPTH = 100
#: How deep a value may nest that is stored and sent again inside frames (data-plane resources).
MAX_VALUE_DEPTH = 64


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


def _id(obj: dict) -> str:
    value = obj.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise MalformedFrame(f"a frame id must be a string of 1-{MAX_ID_LENGTH} characters")
    return value


def _optional_id(obj: dict) -> str | None:
    """An error frame's id: absent when the error answers no request (or one without an id)."""
    return None if obj.get("id") is None else _id(obj)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def nested_deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) has a list or object more than ``limit`` levels down:
    level by level, without recursion, so any depth is answered."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        deeper = []
        for container in level:
            items = container.values() if isinstance(container, dict) else container
            deeper.extend([item for item in items if isinstance(item, (dict, list))])
        if not deeper:
            return False
        level = deeper
    return bool(level)


def _too_deep(text: str | bytes, value: object, limit: int) -> bool:
    """``nested_deeper_than`` for JSON and its text: text with no more brackets than the limit
    cannot nest deeper (two counts, what nearly every frame costs), so only others are walked."""
    if isinstance(text, str):
        brackets = text.count("[") + text.count("{")
    else:
        brackets = text.count(b"[") + text.count(b"{")
    return brackets > limit and nested_deeper_than(value, limit)


def too_deep(limit: int) -> str:
    return f"the JSON is nested more than {limit} levels deep"


def _parse(text: str | bytes):
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


def load_json(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH):
    """JSON from a peer: text that cannot come back out is refused here, once — a structure
    nested more than ``max_depth`` levels (or deeply enough to exhaust the parser), or a lone
    UTF-16 surrogate (``"\\ud800"``), which is valid JSON but cannot be encoded, written to
    SQLite or printed."""
    obj = _parse(text)
    if _too_deep(text, obj, max_depth):
        raise MalformedFrame(too_deep(max_depth))
    return obj


def decode(text: str | bytes) -> Frame:
    if len(text) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(text)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    obj = _parse(text)
    if not isinstance(obj, dict):
        raise MalformedFrame("a frame must be a JSON object")
    kind = obj.get("type")
    if _too_deep(text, obj, MAX_JSON_DEPTH):  # refused with its id: an answer fails its call
        frame_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        raise MalformedFrame(too_deep(MAX_JSON_DEPTH), frame_id=frame_id, frame_type=kind)
    if kind == "ping":
        return Ping()
    if kind == "pong":
        beat = obj.get("heartbeat")
        if isinstance(beat, (int, float)) and not isinstance(beat, bool) and 0 < beat <= 3600:
            return Pong(float(beat))
        return Pong(None)
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
            return Error(_optional_id(obj), error)
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
    """The frame's text. Its depth is not measured again here (that would cost every frame on
    the dispatch path): what goes in a frame is a message's JSON, which stops at the limit
    (``messages._dump``); deeper than the encoder itself can go is refused all the same."""
    try:
        return _ENCODER.encode(obj)
    except RecursionError:
        frame_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        raise MalformedFrame(
            f"refusing to send a frame nested more than {MAX_JSON_DEPTH} levels deep",
            frame_id=frame_id,
            frame_type=obj.get("type"),
        ) from None


def encode(frame: Frame) -> str:
    if isinstance(frame, Request):
        obj: dict[str, Any] = {
            "type": "request",
            "id": frame.id,
            "method": frame.method,
            "params": frame.params,
        }
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
