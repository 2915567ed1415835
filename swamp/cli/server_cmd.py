"""``swamp server token``: admin server tokens, managed on the orchestrator's repo."""

from __future__ import annotations

from pathlib import Path

import typer

from swamp.cli.common import JSON, REPO_DIR, Route, command, emit_json, table, with_admin

app = typer.Typer(
    help="The orchestrator's admin credentials.", no_args_is_help=True, rich_markup_mode=None
)
token_app = typer.Typer(
    help="Admin server tokens: what operators' CLIs elsewhere (and scrapers) present to a "
    "running orchestrator. Each has a scope: metrics (GET /metrics only), read (also lists "
    "and queries) or admin (everything).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(token_app, name="token")


def _on_repo(operation, repo_dir):
    """Server tokens are managed straight on the repo: whoever holds admin credentials' keys
    owns the orchestrator's directory (a running server notices changes within a second)."""
    return with_admin(operation, Route(repo_dir=repo_dir))


SCOPE_HELP = (
    "What the token may do. metrics: GET /metrics and nothing else (a Prometheus scraper). "
    "read: also everything that only looks: worker list, worker queue, worker token list, "
    "data query, workflow list/show/validate/history, /health's details and private "
    "downloads. admin: also everything that changes or runs something: worker token "
    "create/revoke, model method run, workflow run/cancel, worker verify."
)


@token_app.command("create", short_help="Mint a server token (--scope metrics|read|admin).")
@command
def create(
    name: str = typer.Argument(..., help="Token name."),
    scope: str = typer.Option("admin", "--scope", metavar="metrics|read|admin", help=SCOPE_HELP),
    repo_dir: Path = REPO_DIR,
    json_output: bool = JSON,
) -> None:
    """Mint a server token on the repo; prints NAME.SECRET once (only a hash is stored).

    Give each client the narrowest scope that does its job: a scraper gets
    '--scope metrics' (it sends 'Authorization: Bearer NAME.SECRET' to GET /metrics), a
    dashboard or an autoscaler '--scope read', an operator elsewhere the default, admin. A
    call beyond a token's scope is refused with one line naming both scopes (exit 1). The
    scope of a token never changes: revoke it and mint another.
    """
    from swamp.protocol.messages import ServerTokenCreateRequest

    request = ServerTokenCreateRequest(name, scope)
    item = _on_repo(lambda api: api.server_token_create(request), repo_dir)
    if json_output:
        emit_json(item.to_json())
        return
    print(f"server token {name} (scope {item.scope}):\n\n  {item.token}\n")
    if item.scope == "metrics":
        print("Shown once: store it now. A scraper sends it as Authorization: Bearer <token>.")
    else:
        print(
            "Shown once: store it now. Clients pass it with --server-token or SWAMP_SERVER_TOKEN."
        )


@token_app.command("list", short_help="Server tokens, their scope and state.")
@command
def list_tokens(repo_dir: Path = REPO_DIR, json_output: bool = JSON) -> None:
    """Every server token: its scope (a token minted before scopes existed is admin), its
    state and when it was created."""
    reply = _on_repo(lambda api: api.server_token_list(), repo_dir)
    if json_output:
        emit_json([t.to_json() for t in reply.tokens])
    elif reply.tokens:
        print(
            table(
                ["NAME", "SCOPE", "STATE", "CREATED"],
                [[t.name, t.scope, t.state, t.created_at] for t in reply.tokens],
            )
        )
    else:
        print("No server tokens: create one with 'swamp server token create NAME'.")


@token_app.command("revoke", short_help="Revoke a server token.")
@command
def revoke(
    name: str = typer.Argument(..., help="Token name."),
    repo_dir: Path = REPO_DIR,
    json_output: bool = JSON,
) -> None:
    """Revoke a server token: new connections presenting it are refused, and a running server
    closes the ones already open within a second."""
    from swamp.protocol.messages import NameRequest

    item = _on_repo(lambda api: api.server_token_revoke(NameRequest(name)), repo_dir)
    if json_output:
        emit_json(item.to_json())
    else:
        print(f"server token {name} revoked")
