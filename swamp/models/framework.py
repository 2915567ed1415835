"""What a model type is, and the context its methods run against.

A model type (``command/shell``) has methods (``run``) with declared arguments, and resource specs
that say which data its methods may write and how long it is kept. A method is an ``async``
function ``(ctx, args) -> result``; it touches the world only through its :class:`MethodContext`,
which is local in the orchestrator's process and remote (RPC + HTTP back home) on a worker. The
same method code runs in both places.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from swamp.domain.durations import parse_duration
from swamp.errors import MethodFailed, UnknownMethod, UserError

__all__ = [
    "Arg",
    "Method",
    "MethodContext",
    "MethodFailed",
    "ModelType",
    "ProcessResult",
    "ResourceSpec",
]  # MethodFailed is re-exported for method authors
from swamp.store.datastore import SpecPolicy

_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "duration": int}


@dataclass(frozen=True)
class Arg:
    name: str
    type: str = "string"  # string | integer | number | boolean | duration (→ seconds)
    required: bool = False
    default: Any = None
    help: str = ""

    def coerce(self, value: Any) -> Any:
        """Accept the declared type, or a string from ``--arg k=v`` / TOML, and convert it."""
        what = f"argument {self.name!r}"
        if self.type == "string":
            if isinstance(value, str):
                return value
            raise UserError(f"{what} must be a string, got {value!r}")
        if self.type == "boolean":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            raise UserError(f"{what} must be true or false, got {value!r}")
        if self.type == "duration":
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                return value
            if isinstance(value, str):
                return parse_duration(value, what=what)
            raise UserError(f"{what} must be a duration such as 30s or 5m, got {value!r}")
        kind = _TYPES[self.type]
        if isinstance(value, bool):
            raise UserError(f"{what} must be a {self.type}, got {value!r}")
        try:
            converted = kind(value)
        except (TypeError, ValueError):
            raise UserError(f"{what} must be a {self.type}, got {value!r}") from None
        if isinstance(converted, float) and not math.isfinite(converted):
            raise UserError(f"{what} must be a finite number, got {value!r}")
        if kind is int and isinstance(value, float) and value != converted:
            raise UserError(f"{what} must be a whole number, got {value!r}")
        if kind is int and isinstance(value, str) and value.strip() != str(converted):
            raise UserError(f"{what} must be a whole number, got {value!r}")
        return converted


MethodFn = Callable[["MethodContext", dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class Method:
    name: str
    run: MethodFn
    args: tuple[Arg, ...] = ()
    kind: str = "action"  # action | create | update | read
    help: str = ""

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Check names, coerce types, apply defaults; an unknown or missing argument is an error."""
        known = {a.name: a for a in self.args}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            choices = ", ".join(sorted(known)) or "none"
            raise UserError(
                f"method {self.name!r} has no argument {unknown[0]!r} (arguments: {choices})"
            )
        out: dict[str, Any] = {}
        for arg in self.args:
            if arg.name in raw and raw[arg.name] is not None:
                out[arg.name] = arg.coerce(raw[arg.name])
            elif arg.required:
                raise UserError(f"method {self.name!r} needs argument {arg.name!r}: {arg.help}")
            elif arg.default is not None:
                out[arg.name] = arg.default
        return out


@dataclass(frozen=True)
class ResourceSpec:
    name: str
    lifetime: str = "infinite"  # infinite | ephemeral | a duration such as 7d
    garbage_collection: int | None = 10  # versions kept per data name; None keeps all
    help: str = ""

    @property
    def policy(self) -> SpecPolicy:
        return SpecPolicy(self.name, self.lifetime, self.garbage_collection)


@dataclass(frozen=True)
class ModelType:
    type: str
    methods: tuple[Method, ...]
    resources: tuple[ResourceSpec, ...] = ()
    description: str = ""
    internal: bool = False  # bookkeeping types: not runnable from the CLI or by workers
    version: str = "1"

    def method(self, name: str) -> Method:
        for method in self.methods:
            if method.name == name:
                return method
        choices = ", ".join(m.name for m in self.methods)
        raise UnknownMethod(f"model type {self.type!r} has no method {name!r} (methods: {choices})")

    def resource(self, name: str) -> ResourceSpec:
        for spec in self.resources:
            if spec.name == name:
                return spec
        choices = ", ".join(s.name for s in self.resources) or "none"
        raise UserError(
            f"model type {self.type!r} declares no resource spec {name!r} (specs: {choices})"
        )


@dataclass
class ProcessResult:
    exit_code: int
    stdout_tail: list[str] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)
    timed_out: bool = False


class MethodContext(Protocol):
    """What a running method may touch. Local in the orchestrator, remote on a worker."""

    model_type: str
    model_name: str
    method: str
    dispatch_id: str | None
    env: Mapping[str, str]
    cwd: str | None
    #: the fleet probe's seams, as the process that built the context knows them (its plugins)
    probe_seams: Callable[[], Sequence[Any]]

    async def log(self, line: str, *, stream: str = "log") -> None: ...

    async def query_data(self, predicate: str) -> list[dict]: ...

    async def write_resource(self, spec: str, name: str, value: Any) -> dict: ...

    async def read_resource(self, name: str) -> Any: ...

    async def run_process(
        self,
        argv: Sequence[str] | str,
        *,
        cwd: str | None = None,
        timeout: float | None = None,
        tail: int = 20,
    ) -> ProcessResult: ...
