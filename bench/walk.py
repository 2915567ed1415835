#!/usr/bin/env python3
"""The dispatch walk: which modules one dispatch request passes through, and how often it climbs.

One real dispatch runs in-process (``tests/harness/dispatch.py``: a real SQLite store, the real
pool, queue, episodes and dispatch service; the worker a stand-in at the end of a memory
transport). ``sys.setprofile`` records every call of a function of ``swamp`` made in the task
that runs :meth:`DispatchService.run`, from that call on. Two walks are measured:

- **to the transport**: until the ``worker.dispatch`` frame reaches the worker's transport;
- **into the episode**: on until ``DispatchService.run`` returns (the result back, the lease
  ended).

Definitions (what the numbers count):

- a *room* is a module of ``swamp``; calls in other code (trio, the standard library, the
  harness) are transparent: a call's *caller* is the nearest ``swamp`` frame below it on the
  stack. A coroutine resumed is not a call (only a frame's first entry counts).
- a *stay* is a maximal run of consecutive calls into functions of one room (the walk's
  calls in order; returns are not moves). ``stays`` counts them, ``rooms`` the distinct rooms.
- a *climb* is a call made from a function of room X into a function of room Y, X ≠ Y, where
  Y is *above* X: Y imports X, directly or transitively (imports as written in the source,
  anywhere in the module, except under ``if TYPE_CHECKING:``). Such a call goes against the
  import arrow: a callback, a lambda handed down and called back, a listener the lower module
  was given. A request that flows downward makes none; each one is a place where a reader of
  the lower module must know the upper one to follow the request.
- an *upward move* (shown for reference; not a climb) is a pair of consecutive stays X, Y with
  Y above X, whatever made it: mostly a return to an upper module that then calls on (a
  module that does its work as many small calls down has many; a return is not a callback).

It follows one task, the dispatch's own: what other tasks do meanwhile (the worker's reader
relaying events, the bookkeeper writing rows) is not in the walk. "The worker's transport" is
the orchestrator's end of the memory pair the stand-in worker listens on.

    python3 build.py walk [--json] [--moves]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from swamp.orchestrator.dispatch import DispatchService  # noqa: E402
from tests.harness.dispatch import MemoryTransport, dispatch_harness, echo_request  # noqa: E402

PACKAGE = ROOT / "swamp"


# -- the import graph ------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, name: str, is_package: bool, modules: set[str]) -> set[str]:
    out: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in out if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    """Each ``swamp`` module → the ``swamp`` modules it imports directly."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {
        _module_name(p): _imports(
            ast.parse(p.read_text()), _module_name(p), p.name == "__init__.py", modules
        )
        for p in paths
    }


def below(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each module → every module it imports, directly or transitively."""
    out: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(graph.get(module, ()))
        out[start] = seen
    return out


# -- the walk --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    room: str
    function: str
    caller: str | None  # the room of the nearest swamp frame below it
    caller_function: str | None


@dataclass
class Walk:
    calls: list[Call] = field(default_factory=list)

    def stays(self) -> list[str]:
        out: list[str] = []
        for call in self.calls:
            if not out or out[-1] != call.room:
                out.append(call.room)
        return out

    def climbs(self, under: dict[str, set[str]]) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.caller is not None and c.caller != c.room and c.caller in under.get(c.room, ())
        ]

    def upward(self, under: dict[str, set[str]]) -> list[tuple[str, str]]:
        stays = self.stays()
        pairs = zip(stays, stays[1:], strict=False)
        return [(x, y) for x, y in pairs if x in under.get(y, ())]

    def summary(self, under: dict[str, set[str]]) -> dict:
        stays = self.stays()
        return {
            "calls": len(self.calls),
            "stays": len(stays),
            "rooms": len(set(stays)),
            "climbs": len(self.climbs(under)),
            "upward_moves": len(self.upward(under)),
        }


def _room(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name == "swamp" or name.startswith("swamp.") else None


def _caller(frame: FrameType) -> FrameType | None:
    back = frame.f_back
    while back is not None and _room(back) is None:
        back = back.f_back
    return back


class Tracer:
    """Records the calls of the dispatch task; see the module's docstring."""

    def __init__(self) -> None:
        self.entry = DispatchService.run.__code__
        self.sinks = {MemoryTransport.write_now.__code__, MemoryTransport.send.__code__}
        self.task: object = None
        self.entry_frame: FrameType | None = None
        self.seen: set[FrameType] = set()
        self.to_transport = Walk()
        self.into_episode = Walk()
        self.reached = False

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if self.task is None:
            if code is not self.entry:
                return
            self.task = trio.lowlevel.current_task()
            self.entry_frame = frame
        if code in self.sinks and not self.reached:
            if "worker.dispatch" in str(frame.f_locals.get("text", "")):
                self.reached = True
            return
        room = _room(frame)
        if room is None or frame in self.seen:
            return  # not ours, or a coroutine resumed
        if trio.lowlevel.current_task() is not self.task:
            return
        self.seen.add(frame)
        back = _caller(frame) if frame is not self.entry_frame else None
        call = Call(
            room,
            code.co_qualname,
            _room(back) if back is not None else None,
            back.f_code.co_qualname if back is not None else None,
        )
        if not self.reached:
            self.to_transport.calls.append(call)
        self.into_episode.calls.append(call)


async def measure(warm: int = 3) -> Tracer:
    """One traced dispatch, after ``warm`` untraced ones (imports, caches, the first lease)."""
    with tempfile.TemporaryDirectory() as tmp:
        async with dispatch_harness(Path(tmp)) as harness:
            for _ in range(warm):
                await harness.run(echo_request())
            tracer = Tracer()
            sys.setprofile(tracer)
            try:
                result = await harness.run(echo_request())
            finally:
                sys.setprofile(None)
            assert result.status == "succeeded", result
            assert tracer.reached, "the dispatch frame never reached the worker's transport"
    return tracer


def walk() -> dict:
    tracer = trio.run(measure)
    under = below(import_graph())
    out = {}
    for name, walked in (
        ("to_transport", tracer.to_transport),
        ("into_episode", tracer.into_episode),
    ):
        out[name] = {
            **walked.summary(under),
            "path": walked.stays(),
            "upward_at": [f"{x} -> {y}" for x, y in walked.upward(under)],
            "climbs_at": [
                f"{c.caller}.{c.caller_function} -> {c.room}.{c.function}"
                for c in walked.climbs(under)
            ],
        }
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--moves", action="store_true", help="list the upward moves too")
    args = parser.parse_args(argv)
    result = walk()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, walked in result.items():
        print(
            f"{name}: {walked['stays']} stays in {walked['rooms']} rooms, "
            f"{walked['climbs']} climbs ({walked['calls']} calls, "
            f"{walked['upward_moves']} upward moves)"
        )
        print("  path:  " + " > ".join(r.removeprefix("swamp.") for r in walked["path"]))
        for move in walked["upward_at"] if args.moves else ():
            print(f"  up:    {move}")
        for climb in walked["climbs_at"]:
            print(f"  climb: {climb}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
