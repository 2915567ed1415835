"""``swamp server token``: admin server tokens, managed on the orchestrator's repo."""

from __future__ import annotations

from pathlib import Path

import typer

from swamp.cli.common import JSON, REPO_DIR, command, emit_json, table, with_admin

app = typer.Typer(
    help="The orchestrator's admin credentials.", no_args_is_help=True, rich_markup_mode=None
)
token_app = typer.Typer(
    help="Admin server tokens: what operators' CLIs elsewhere present to a running orchestrator.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(token_app, name="token")


def _on_repo(operation, repo_dir):
    """Server tokens are managed straight on the repo: whoever holds admin credentials' keys
    owns the orchestrator's directory (a running server notices changes within a second)."""
    return with_admin(operation, repo_dir=repo_dir, server=None, server_token=None, ca_cert=None)


@token_app.command("create", short_help="Mint an admin server token.")
@command
def create(
    name: str = typer.Argument(..., help="Token name."),
    repo_dir: Path = REPO_DIR,
    json_output: bool = JSON,
) -> None:
    """Mint an admin token on the repo; prints NAME.SECRET once (only a hash is stored)."""
    from swamp.protocol.messages import NameRequest

    item = _on_repo(lambda api: api.server_token_create(NameRequest(name)), repo_dir)
    if json_output:
        emit_json(item.to_json())
        return
    print(f"server token {name}:\n\n  {item.token}\n")
    print("Shown once: store it now. Clients pass it with --server-token or SWAMP_SERVER_TOKEN.")


@token_app.command("list", short_help="Admin server tokens and their state.")
@command
def list_tokens(repo_dir: Path = REPO_DIR, json_output: bool = JSON) -> None:
    """Every admin server token and its state."""
    reply = _on_repo(lambda api: api.server_token_list(), repo_dir)
    if json_output:
        emit_json([t.to_json() for t in reply.tokens])
    elif reply.tokens:
        print(
            table(
                ["NAME", "STATE", "CREATED"],
                [[t.name, t.state, t.created_at] for t in reply.tokens],
            )
        )
    else:
        print("No server tokens: create one with 'swamp server token create NAME'.")


@token_app.command("revoke", short_help="Revoke an admin server token.")
@command
def revoke(
    name: str = typer.Argument(..., help="Token name."),
    repo_dir: Path = REPO_DIR,
    json_output: bool = JSON,
) -> None:
    """Revoke an admin token: new connections presenting it are refused, and a running server
    closes the ones already open within a second."""
    from swamp.protocol.messages import NameRequest

    item = _on_repo(lambda api: api.server_token_revoke(NameRequest(name)), repo_dir)
    if json_output:
        emit_json(item.to_json())
    else:
        print(f"server token {name} revoked")
