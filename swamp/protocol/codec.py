"""How a :class:`Message` goes to and from its JSON object: the codec, apart from the schemas
(``swamp.protocol.messages``), as h11 keeps its events apart from the code that reads them.

``Message.decode(payload)`` checks the JSON shape field by field — presence, type, the element
types of lists and maps — and turns anything else into one :class:`~swamp.errors.MalformedFrame`
naming the message and the field; ``to_json()`` is its inverse. Wire names are the fields' names
in camelCase; ``None`` means "absent" and is not sent.

Each class's ``_decode`` and ``to_json`` are written out as code for its fields the first time
either is used (as ``dataclasses`` writes ``__init__``): every frame of the dispatch path goes
through them, and a loop over a field table costs a dispatch several times more than
straight-line code that knows each field.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal, TypeVar, Union

from swamp.errors import MalformedFrame
from swamp.protocol.frames import MAX_JSON_DEPTH

JSON = Any  # any JSON value
M = TypeVar("M", bound="Message")
Check = Callable[[Any], Any]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if hint is str:
        return "a string"
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is dict or origin is dict:
        return "an object"
    if origin is list:
        return "a list"
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, Message):
        return f"an object ({hint.__name__})"
    return "a value"


class _Mismatch(Exception):
    """A value of the wrong shape: ``tail`` says what was wrong, ``path`` where below the
    field being decoded (``.key``, ``[i]``). Only the failing path pays for building it."""

    def __init__(self, tail: str) -> None:
        self.tail = tail
        self.path: tuple[str, ...] = ()

    def under(self, part: str) -> _Mismatch:
        self.path = (part, *self.path)
        return self


_CHECKERS: dict[Any, Check] = {}


def _checker(hint: Any) -> Check:
    """A function that returns a value of the JSON shape ``hint`` describes (an int becomes a
    float where a float is asked for) or raises :class:`_Mismatch`: worked out once per hint,
    as every frame on the dispatch path goes through these."""
    check = _CHECKERS.get(hint)
    if check is None:
        check = _CHECKERS[hint] = _build(hint)
    return check


def _build(hint: Any) -> Check:
    origin = typing.get_origin(hint)
    expected = f"expected {_describe(hint)}"

    if hint is Any:
        return lambda value: value
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        nullable = type(None) in options
        checks = [_checker(o) for o in options if o is not type(None)]
        union = "expected " + " or ".join(_describe(o) for o in options if o is not type(None))

        def check_union(value):
            if value is None and nullable:
                return None
            for check in checks:
                try:
                    return check(value)
                except _Mismatch:
                    continue
            raise _Mismatch(union)

        return check_union
    if origin is Literal:
        allowed = typing.get_args(hint)

        def check_literal(value):
            if type(value) in (str, int) and value in allowed:
                return value
            raise _Mismatch(expected)

        return check_literal
    if hint is bool or hint is str or hint is dict:

        def check_type(value, kind=hint):
            if isinstance(value, kind):
                return value
            raise _Mismatch(expected)

        return check_type
    if hint is int:

        def check_int(value):
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise _Mismatch(expected)

        return check_int
    if hint is float:

        def check_float(value):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and math.isfinite(value):
                return float(value)
            raise _Mismatch(expected)

        return check_float
    if origin is dict:
        check_item = _checker(typing.get_args(hint)[1])

        def check_map(value):
            if not isinstance(value, dict):
                raise _Mismatch(expected)
            out = {}
            for key, item in value.items():
                try:
                    out[str(key)] = check_item(item)
                except _Mismatch as exc:
                    raise exc.under(f".{key}") from None
            return out

        return check_map
    if origin is list:
        check_item = _checker(typing.get_args(hint)[0])

        def check_list(value):
            if not isinstance(value, list):
                raise _Mismatch(expected)
            out = []
            for index, item in enumerate(value):
                try:
                    out.append(check_item(item))
                except _Mismatch as exc:
                    raise exc.under(f"[{index}]") from None
            return out

        return check_list
    if isinstance(hint, type) and issubclass(hint, Message):
        return lambda value: hint._decode(value)  # its own, once compiled

    def refuse(value):
        raise _Mismatch(expected)

    return refuse


def _plain(hint: Any) -> bool:
    """Whether values of ``hint`` go to JSON as they are (no message, list or map inside)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return all(_plain(o) for o in typing.get_args(hint))
    return origin is Literal or hint in (str, int, float, bool, type(None))


# A field's value sits two levels down in its frame (the frame's object, the message's).
_MAX_FIELD_DEPTH = MAX_JSON_DEPTH - 2


def _dump(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON, its messages as theirs. A value nested so deep that its frame would
    pass the protocol's limit (which the peer would refuse, and which could exhaust the stack
    here) is a coded error instead."""
    if isinstance(value, Message):
        return value.to_json()
    if isinstance(value, (list, dict)):
        if depth >= _MAX_FIELD_DEPTH:
            raise MalformedFrame(
                f"refusing to send a frame nested more than {MAX_JSON_DEPTH} levels deep"
            )
        if isinstance(value, list):
            return [_dump(v, depth + 1) for v in value]
        return {k: _dump(v, depth + 1) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Message:
    """Base of every payload: a frozen dataclass whose codec is written on first use."""

    _compiled = False  # set on each class once its codec is written

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # on first use: annotations are strings until every class exists; each class
        # compiles its own, once (setattr: the base's are placeholders, replaced per class)
        setattr(cls, "_decode", classmethod(_decode_first))  # noqa: B010
        setattr(cls, "to_json", _to_json_first)  # noqa: B010

    @classmethod
    def decode(cls: type[M], payload: object, *, where: str | None = None) -> M:
        try:
            decoded: M = cls._decode(payload)
            return decoded
        except _Mismatch as exc:
            where = where or cls.__name__
            raise MalformedFrame(f"{where}{''.join(exc.path)}: {exc.tail}") from None

    @classmethod
    def _decode(cls, payload: object) -> Any:  # replaced per class (see __init_subclass__)
        return _decode_first(cls, payload)

    def to_json(self) -> dict[str, Any]:  # replaced per class (see __init_subclass__)
        return _to_json_first(self)


def _decode_first(cls: type[Message], payload: object) -> Any:
    _compile(cls)
    return cls._decode(payload)


def _to_json_first(message: Message) -> dict[str, Any]:
    _compile(type(message))
    return message.to_json()


_INLINE = {str: "str", bool: "bool", dict: "dict"}  # hints checked by one isinstance


def prepare(classes: typing.Iterable[type[Message]]) -> None:
    """Write out these classes' code now, not at their first frame (see
    ``swamp.protocol.messages.prepare``)."""
    for cls in classes:
        if cls is not Message:
            _compile(cls)


def _compile(cls: type[Message]) -> None:
    """Write ``cls._decode`` and ``cls.to_json`` for its fields: each field's presence and JSON
    shape checked (its hint's checker, or one ``isinstance`` for ``str``, ``bool``, ``dict``),
    the path to a bad value in the error, ``None`` left out on the way back."""
    if cls.__dict__.get("_compiled"):
        return
    hints = typing.get_type_hints(cls)  # in the globals of the module that defines it
    env: dict[str, Any] = {"_Mismatch": _Mismatch, "_dump": _dump, "cls": cls}
    decode = ["def _decode(payload):"]
    decode.append("    if not isinstance(payload, dict):")
    decode.append("        raise _Mismatch('expected an object')")
    decode.append("    get = payload.get")
    encode = ["def to_json(self):", "    out = {}"]
    arguments = []
    for index, f in enumerate(fields(cls)):
        name, hint = f.name, hints[f.name]
        key = _camel(name)
        value = f"v{index}"
        env[f"check{index}"] = _checker(hint)
        env[f"expected{index}"] = f"expected {_describe(hint)}"
        decode.append(f"    {value} = get({key!r})")
        decode.append(f"    if {value} is None:")
        if f.default is MISSING and f.default_factory is MISSING:
            missing = f"'{key}' is missing"
            decode.append(f"        raise _Mismatch({missing!r})")
        elif f.default is not MISSING:
            env[f"default{index}"] = f.default
            decode.append(f"        {value} = default{index}")
        else:
            env[f"factory{index}"] = f.default_factory
            decode.append(f"        {value} = factory{index}()")
        decode.append("    else:")
        if hint in _INLINE:
            decode.append(f"        if not isinstance({value}, {_INLINE[hint]}):")
            decode.append(f"            raise _Mismatch(expected{index}).under({'.' + key!r})")
        else:
            decode.append("        try:")
            decode.append(f"            {value} = check{index}({value})")
            decode.append("        except _Mismatch as exc:")
            decode.append(f"            raise exc.under({'.' + key!r}) from None")
        arguments.append(value)
        encode.append(f"    {value} = self.{name}")
        encode.append(f"    if {value} is not None:")
        encode.append(f"        out[{key!r}] = {value if _plain(hint) else f'_dump({value})'}")
    decode.append(f"    return cls({', '.join(arguments)})")
    encode.append("    return out")
    exec("\n".join(decode) + "\n\n" + "\n".join(encode), env)  # our own text, from field names
    setattr(cls, "_decode", staticmethod(env["_decode"]))  # noqa: B010
    setattr(cls, "to_json", env["to_json"])  # noqa: B010
    setattr(cls, "_compiled", True)  # noqa: B010
