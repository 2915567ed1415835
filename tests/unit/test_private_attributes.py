"""swamp touches no private attribute of another library's object.

A library's private names (``ws._wsproto``, ``conn._proto``, ``getattr(ws, "_recv_channel")``)
change without notice in any release; swamp/ uses only public APIs, and where a library's
internal *classes* must be used (Hypercorn's, for the HTTP side of the one-port listener) the
version is bounded in pyproject.toml. Types are not known to a static scan, so the rule is by
name: ``x._name`` is ours when swamp itself defines ``_name`` somewhere (a function, a class, a
module, an attribute it assigns, a slot, an alias it imports); any other private name is
another library's."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import swamp

SWAMP = Path(swamp.__file__).parent
_REFLECTION = {"getattr", "hasattr", "setattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own_names(trees: list[ast.AST], modules: list[Path]) -> set[str]:
    """Every private name swamp defines."""
    names = {path.stem for path in modules if _private(path.stem)}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)  # self._x = ..., as every class here sets its own
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
                and isinstance(node.value, (ast.Tuple, ast.List))
            ):
                names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    return {name for name in names if _private(name)}


def foreign_privates(tree: ast.AST, own: set[str], where: str = "") -> list[str]:
    """Each use of another library's private name in ``tree``: attributes read, names given
    to getattr and its kin, and names imported from a private module of another package."""
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and _private(node.attr):
            name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _REFLECTION
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            name = node.args[1].value
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "swamp" and any(_private(part) for part in parts):
                found.append(f"{where}:{node.lineno}: from {node.module} import ...")
            continue
        if name is not None and name not in own:
            found.append(f"{where}:{node.lineno}: {name}")
    return found


@functools.cache
def _swamp() -> tuple[list[Path], list[ast.AST]]:
    modules = sorted(SWAMP.rglob("*.py"))
    return modules, [ast.parse(path.read_text(), str(path)) for path in modules]


@functools.cache
def _own() -> set[str]:
    modules, trees = _swamp()
    return own_names(trees, modules)


def test_swamp_touches_no_private_attribute_of_another_library():
    modules, trees = _swamp()
    own = _own()
    found = [
        hit
        for path, tree in zip(modules, trees, strict=True)
        for hit in foreign_privates(tree, own, str(path.relative_to(SWAMP.parent)))
    ]
    assert found == []


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
"""


def test_the_scan_catches_what_the_websocket_transport_did_before():
    own = _own()
    tree = ast.parse(YESTERDAY)
    caught = {hit.split(": ", 1)[1] for hit in foreign_privates(tree, own)}
    assert caught >= {
        "_stream_lock",
        "_recv_channel",
        "_send_channel",
        "_max_message_size",
        "_abort_web_socket",
        "_proto",
        "_frame_decoder",
        "_parse_more",
        "from trio_websocket._impl import ...",
    }
    # and a private name swamp defines itself is not another library's
    assert foreign_privates(ast.parse("self._lock\nws._inbox"), own) == []
