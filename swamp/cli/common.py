"""What every command shares: options, error handling, rendering. Imports stay light."""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any

import typer

REPO_DIR = typer.Option(
    None,
    "--repo-dir",
    envvar="SWAMP_REPO_DIR",
    show_default=False,
    help="The repo to act on (default: the current directory).",
)
JSON = typer.Option(False, "--json", help="Print machine-readable JSON instead of text.")
SERVER = typer.Option(
    None,
    "--server",
    envvar="SWAMP_SERVE_URL",
    show_default=False,
    help="Go through a running orchestrator (ws://host:port) instead of the repo; several of "
    "one shared database, comma-separated: the first that answers",
)
SERVER_TOKEN = typer.Option(
    None,
    "--server-token",
    envvar="SWAMP_SERVER_TOKEN",
    show_default=False,
    help="Admin server token <name.secret> (swamp server token create). Not needed in the "
    "orchestrator's repo: there the CLI presents the local credential from .swamp/.",
)
CA_CERT = typer.Option(
    None,
    "--ca-cert",
    envvar="SWAMP_CA_CERT",
    show_default=False,
    exists=False,
    help="PEM file of the CA that signed the orchestrator's TLS certificate.",
)


@dataclass(frozen=True)
class Route:
    """Where an admin command acts: straight on a repo, or through a running orchestrator
    (``swamp.admin.routes`` decides which). Its options are declared once, here, so that every
    command that can go either way offers the same names, variables and help."""

    server: str | None = None
    server_token: str | None = None
    ca_cert: Path | None = None
    repo_dir: Path | None = None


# A command's ``route: Route = ROUTE`` parameter: ``command`` shows typer the four options
# below in its place (in this order) and calls the command with the Route they make.
ROUTE = Route()
ROUTE_OPTIONS: tuple[tuple[str, type, Any], ...] = (
    ("server", str, SERVER),
    ("server_token", str, SERVER_TOKEN),
    ("ca_cert", Path, CA_CERT),
    ("repo_dir", Path, REPO_DIR),
)


def _route_parameter(fn: Callable) -> str | None:
    """The name of ``fn``'s parameter that defaults to :data:`ROUTE`, if it has one."""
    found = [p.name for p in inspect.signature(fn).parameters.values() if p.default is ROUTE]
    assert len(found) <= 1, f"{fn.__name__}: one route parameter at most"
    return found[0] if found else None


def _with_route_options(wrapper: Callable, fn: Callable, name: str) -> None:
    """What typer reads of ``wrapper``: ``fn``'s signature with the route options in place
    of its ``name`` parameter."""
    params: list[inspect.Parameter] = []
    annotations = {k: v for k, v in fn.__annotations__.items() if k != name}
    for param in inspect.signature(fn).parameters.values():
        if param.name != name:
            params.append(param)
            continue
        for option, kind, default in ROUTE_OPTIONS:
            params.append(inspect.Parameter(option, param.kind, default=default, annotation=kind))
            annotations[option] = kind
    wrapper.__signature__ = inspect.signature(fn).replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = annotations


def fail(message: str, *, code: str = "error", status: int = 1, as_json: bool = False):
    """``error: <message>`` on stderr. A message's own continuation lines (a predicate's caret)
    stay lines, indented, so that no text in a message can pass for a line of its own."""
    from swamp.domain.text import printable

    if as_json:
        print(json.dumps({"error": {"code": code, "message": message}}))
    first, *rest = message.split("\n")
    lines = [f"error: {printable(first)}"]
    lines += [printable(line) if line.startswith("  ") else f"  {printable(line)}" for line in rest]
    print("\n".join(lines), file=sys.stderr)
    raise typer.Exit(status)


def command(fn: Callable) -> Callable:
    """Map ``SwampError`` to one line on stderr (and JSON on stdout with --json) and an exit
    status; never a traceback for an error we raised on purpose. A parameter that defaults to
    :data:`ROUTE` is offered as the shared route options and handed over as one ``Route``."""
    route = _route_parameter(fn)

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        from swamp.errors import SwampError

        if route is not None:
            kwargs[route] = Route(**{name: kwargs.pop(name, None) for name, _, _ in ROUTE_OPTIONS})
        try:
            return fn(*args, **kwargs)
        except SwampError as exc:
            fail(
                exc.message,
                code=exc.code,
                status=exc.exit_status,
                as_json=bool(kwargs.get("json_output")),
            )
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None

    if route is not None:
        _with_route_options(wrapper, fn, route)
    return wrapper


def emit_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns for a terminal. Cells often hold what peers sent (a worker's platform, labels),
    so every control character is shown escaped, never interpreted."""
    from swamp.domain.text import printable

    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def repo_path(repo_dir: Path | None) -> Path:
    return Path(repo_dir) if repo_dir else Path.cwd()


def run_async(fn, *args):
    """Run a command's coroutine; Ctrl-C cancels it, then says "interrupted" (exit 130)."""
    from swamp.concurrency import run_interruptibly

    return run_interruptibly(fn, *args)


def with_admin(operation: Callable, route: Route, *, prefer_server: bool = False):
    """Run ``await operation(api)`` on the route the flags choose (see ``swamp.admin.routes``)
    and return its reply: a command formats it, whichever route answered."""
    from swamp.admin.routes import open_route

    async def go():
        async with open_route(
            repo_dir=route.repo_dir,
            server=route.server,
            server_token=route.server_token,
            ca_cert=route.ca_cert,
            prefer_server=prefer_server,
        ) as api:
            return await operation(api)

    return run_async(go)
