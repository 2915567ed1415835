"""swamp touches no private attribute of another library's object.

A library's private names (``ws._wsproto``, ``conn._proto``, ``getattr(ws, "_recv_channel")``)
change without notice in any release; swamp/ uses only public APIs, and where a library's
internal *classes* must be used (Hypercorn's, for the HTTP side of the one-port listener) the
version is bounded in pyproject.toml. Types are not known to a static scan, so the rule is by
place: every ``x._name`` (and ``getattr(x, "_name")`` and its kin) where ``x`` is not ``self``,
``cls`` or ``super()`` is a finding, unless that module's reach into that name of one of
swamp's *own* classes is listed in :data:`OWN` with why; so is every import of a private name
or module from another package."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import swamp

SWAMP = Path(swamp.__file__).parent
_REFLECTION = {"getattr", "hasattr", "setattr", "delattr"}

#: (module, name): a module reaching into a private name of one of swamp's own objects
OWN = {
    ("swamp/protocol/codec.py", "_decode"): "a message class's decoder, written per class",
    ("swamp/protocol/rpc.py", "_offer"): "the channel's outbox hand-off, from its own helpers",
    ("swamp/protocol/rpc.py", "_send"): "the channel's writer, from its own helpers",
    ("swamp/protocol/rpc.py", "_dropped_notice"): "an incoming call's note, from its channel",
    ("swamp/worker/reaper.py", "_say"): "the reaper's own line, from its process handle",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _mine(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object is the class's own."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def foreign_privates(tree: ast.AST, where: str = "") -> list[str]:
    """Each reach into a private name of an object that is not the class's own, in ``tree``:
    attributes, names given to getattr and its kin, and private names or modules imported from
    another package. Each as ``where:line: name``."""
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _mine(node.value):
            name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _REFLECTION
            and len(node.args) >= 2
            and not _mine(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            name = node.args[1].value
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "swamp" and (
                any(_private(part) for part in parts)
                or any(_private(alias.name) for alias in node.names)
            ):
                found.append(f"{where}:{node.lineno}: from {node.module} import ...")
            continue
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "swamp" and any(_private(part) for part in parts):
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
            continue
        if name is not None:
            found.append(f"{where}:{node.lineno}: {name}")
    return found


@functools.cache
def _swamp() -> tuple[list[Path], list[ast.AST]]:
    modules = sorted(SWAMP.rglob("*.py"))
    return modules, [ast.parse(path.read_text(), str(path)) for path in modules]


def test_swamp_touches_no_private_attribute_of_another_library():
    modules, trees = _swamp()
    found = []
    used = set()
    for path, tree in zip(modules, trees, strict=True):
        where = str(path.relative_to(SWAMP.parent))
        for hit in foreign_privates(tree, where):
            name = hit.split(": ", 1)[1]
            if (where, name) in OWN:
                used.add((where, name))
            else:
                found.append(hit)
    assert found == []
    assert used == set(OWN), f"no longer reached, take off OWN: {set(OWN) - used}"


# How the websocket transport reached into trio-websocket and wsproto before it was ours: each
# line must be caught.
YESTERDAY = """
lock, stream = ws._stream_lock, ws._stream
queued = getattr(ws, "_recv_channel", None)
taker = ws._send_channel = _Taker(take, ws._send_channel)
ws._max_message_size = size
await ws._abort_web_socket()
decoder = connection._proto._frame_decoder
if proto.extensions or proto._parse_more.gi_frame is None: pass
from trio_websocket._impl import WebSocketConnection
from trio import _core
import trio._core._run
"""


def test_the_scan_catches_what_the_websocket_transport_did_before():
    caught = {hit.split(": ", 1)[1] for hit in foreign_privates(ast.parse(YESTERDAY))}
    assert caught == {
        "_stream_lock",
        "_stream",
        "_recv_channel",
        "_send_channel",
        "_max_message_size",
        "_abort_web_socket",
        "_proto",
        "_frame_decoder",
        "_parse_more",
        "from trio_websocket._impl import ...",
        "from trio import ...",
        "import trio._core._run",
    }
    # the class's own private names are its business
    assert (
        foreign_privates(ast.parse("self._lock\ncls._x\nsuper()._y\nsetattr(cls, '_z', 1)")) == []
    )
