"""``swamp data query``."""

from __future__ import annotations

import json

import typer

from swamp.cli.common import (
    JSON,
    ROUTE,
    Route,
    command,
    emit_json,
    table,
    with_admin,
)

app = typer.Typer(
    help="Data: the versioned records methods (and the orchestrator) write.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("query", short_help="Select records with a predicate.")
@command
def query(
    predicate: str = typer.Argument(
        ..., help='e.g. modelType == "command/shell" && attributes.exitCode != 0'
    ),
    all_versions: bool = typer.Option(
        False, "--all-versions", help="Match every version, not only the latest."
    ),
    limit: int = typer.Option(
        None, "--limit", metavar="N", show_default=False, help="Stop after N matches."
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Select records with a predicate over modelType, modelName, name, version, spec,
    createdAt, size and attributes.* using ==, !=, <, <=, >, >=, in, &&, ||, !, has(). A
    missing field matches nothing (and != everything). The orchestrator's own bookkeeping is
    data too: modelType == "swamp/worker" lists the pool's records."""
    from swamp.domain.query import parse
    from swamp.protocol.messages import DataQueryRequest

    parse(predicate)  # a bad predicate is refused here, with its caret, on either route
    request = DataQueryRequest(predicate=predicate, all_versions=all_versions, limit=limit)
    reply = with_admin(
        lambda api: api.data_query(request),
        route,
    )
    if json_output:
        emit_json([r.to_json() for r in reply.records])
        return
    if not reply.records:
        print("No records match.")
        return
    rows = [
        [r.model_type, r.model_name, r.name, str(r.version), r.created_at, _short(r.attributes)]
        for r in reply.records
    ]
    print(table(["MODEL TYPE", "MODEL", "NAME", "VERSION", "CREATED", "ATTRIBUTES"], rows))
    print(f"{len(reply.records)} record{'s' if len(reply.records) != 1 else ''}")


def _short(attributes: dict, limit: int = 60) -> str:
    text = json.dumps(attributes, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"
