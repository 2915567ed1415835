"""The rules of a workflow run: when a job or step may start, and how statuses add up.

Jobs and steps are ``pending`` → ``running`` → ``succeeded`` | ``failed`` | ``skipped``; a run is
``running`` → ``succeeded`` | ``failed`` | ``cancelled``. A node starts as soon as *its own*
dependencies have ended — there are no levels, so a slow branch never holds back another — and
runs only if every dependency's condition holds; otherwise it is skipped, with the reason.
A dependency on a ``forEach`` step means all of its expansions (their combined status).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from swamp.domain.run_record import Status
from swamp.domain.workflow import Dependency
from swamp.errors import UserError

# a tuple, not a set: ``in`` compares by value, so a status read back as text matches too
DONE = (Status.SUCCEEDED, Status.FAILED, Status.SKIPPED)
MAX_EXPANSIONS = 10_000  # a forEach runs a step at most this many times (serve --max-fan-out)
MAX_FAN_OUT_LIMIT = 1_000_000  # the most --max-fan-out may be
RUN_PLACES = 10_000_000  # a run's steps are numbered 0 … 9,999,999: seven digits, in text order
FAN_OUT_SETTING = "--max-fan-out (max-fan-out in swamp.toml [serve])"
MAX_INPUT_DEPTH = 32  # how deep an array or object input given as JSON may nest
_TOO_DEEP = object()  # JSON too deep for the parser itself


def combined(statuses: Iterable[Status | str]) -> Status | None:
    """The status of a group (a ``forEach`` step's expansions): ``None`` while any runs;
    ``failed`` if one failed; ``skipped`` if all were skipped (or there were none);
    else ``succeeded``."""
    statuses = list(statuses)
    if any(s not in DONE for s in statuses):
        return None
    if Status.FAILED in statuses:
        return Status.FAILED
    if all(s == Status.SKIPPED for s in statuses):
        return Status.SKIPPED
    return Status.SUCCEEDED


def decide(
    depends_on: Iterable[Dependency], status_of: Mapping[str, Status | str | None]
) -> str | None:
    """``None`` (wait: a dependency is still running), ``"run"``, or why it is skipped."""
    deps = list(depends_on)
    if any(status_of.get(d.name) is None for d in deps):
        return None
    for dep in deps:
        status = status_of[dep.name]
        if not dep.condition.holds(status):
            return f"{dep.name} {status} (needed: {_describe(dep.condition)})"
    return "run"


def _describe(condition) -> str:
    if condition.type in ("and", "or"):
        return f" {condition.type} ".join(_describe(c) for c in condition.conditions)
    if condition.type == "not":
        return f"not {_describe(condition.conditions[0])}"
    return condition.type


def job_status(steps: Iterable[tuple[Status | str, bool]]) -> Status:
    """A job ends ``failed`` if a step failed that was not allowed to; else ``succeeded``.
    ``steps``: (status, allowed to fail)."""
    failed = any(s == Status.FAILED and not allowed for s, allowed in steps)
    return Status.FAILED if failed else Status.SUCCEEDED


def run_status(jobs: Iterable[Status | str]) -> Status:
    return Status.FAILED if any(s == Status.FAILED for s in jobs) else Status.SUCCEEDED


def expansion_items(value: object, *, step: str, cap: int = MAX_EXPANSIONS) -> list:
    """What a ``forEach.in`` gave, as the items to run the step for: a list as it is, a table as
    ``{key, value}`` entries; anything else, or more than ``cap`` items (the orchestrator's
    ``--max-fan-out``), is an error."""
    if isinstance(value, dict):
        value = [{"key": k, "value": v} for k, v in value.items()]
    if not isinstance(value, list):
        kind = "null" if value is None else type(value).__name__
        raise UserError(f"step {step!r}: forEach.in gave {kind}, not a list")
    if len(value) > cap:
        raise UserError(
            f"step {step!r}: forEach.in gave {len(value)} items; a step runs at most {cap} "
            f"times (the orchestrator's {FAN_OUT_SETTING}; or split the list)"
        )
    return value


def no_items(expression: str) -> str:
    """Why a ``forEach`` step ran no times: its list was empty."""
    return f"forEach over zero items: {expression} gave none, so nothing ran"


def expansion_name(template: str, item: object, index: int) -> str:
    """The name of one ``forEach`` expansion whose name has no expression of its own."""
    if isinstance(item, (str, int, float)) and not isinstance(item, bool):
        text = str(item)
        if text and len(text) <= 64 and all(c.isalnum() or c in "-_." for c in text):
            return f"{template}-{text}"
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        return f"{template}-{item['name']}"
    return f"{template}-{index}"


def input_value(value: object, kind: object, key: str) -> object:
    """A run's input as its schema's ``type`` says: ``--input k=v`` gives text, so an
    ``integer``, ``number`` or ``boolean`` is read from it, and an ``array`` or ``object`` is
    read as JSON (``--input 'hosts=["a", "b"]'``); a ``string`` (or an input the schema gives
    no single type) stays the text it was. A value that is not text already has its type."""
    if not isinstance(value, str) or kind in (None, "string"):
        return value
    if kind in ("array", "object"):
        shown = value if len(value) <= 60 else f"{value[:60]}…"
        example = '["a", "b"]' if kind == "array" else '{"k": "v"}'
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            why = getattr(exc, "msg", "not JSON")
            raise UserError(
                f"input {key!r}: expected JSON for its type {kind} (e.g. {example}), got "
                f"{shown!r}: {why}"
            ) from None
        except RecursionError:
            parsed = _TOO_DEEP
        if parsed is _TOO_DEEP or _deeper_than(parsed, MAX_INPUT_DEPTH):
            raise UserError(
                f"input {key!r}: its JSON is nested more than {MAX_INPUT_DEPTH} levels deep"
            )
        return parsed  # of another type than the schema's? its check says so, by name
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
        if kind == "boolean" and value in ("true", "false"):
            return value == "true"
    except ValueError:
        raise UserError(f"input {key!r}: expected {kind}, got {value!r}") from None
    return value


def _deeper_than(value: object, limit: int) -> bool:
    """Whether parsed JSON has a list or object more than ``limit`` levels down (level by
    level: no recursion, whatever the depth)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)
            if isinstance(item, (dict, list))
        ]
    return bool(level)
