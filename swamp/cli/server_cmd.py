"""``swamp server token``: admin server tokens for ``serve --auth token``."""

from __future__ import annotations

from pathlib import Path

import typer

from swamp.cli.common import JSON, REPO_DIR, command, emit_json, repo_path, table

app = typer.Typer(help="The orchestrator's admin credentials.", no_args_is_help=True,
                  rich_markup_mode=None)
token_app = typer.Typer(help="Admin server tokens: what operators' CLIs present to a server "
                             "running --auth token.", no_args_is_help=True,
                        rich_markup_mode=None)
app.add_typer(token_app, name="token")


def _book(repo_dir):
    from swamp.bookkeeping.server_tokens import ServerTokenBook
    from swamp.repo import Repo

    return ServerTokenBook(Repo.find(repo_path(repo_dir)).open_store())


@token_app.command("create", short_help="Mint an admin server token.")
@command
def create(name: str = typer.Argument(..., help="Token name."), repo_dir: Path = REPO_DIR,
           json_output: bool = JSON) -> None:
    """Mint an admin token on the repo; prints NAME.SECRET once (only a hash is stored)."""
    book = _book(repo_dir)
    try:
        attrs, credential = book.create(name)
    finally:
        book.store.close()
    if json_output:
        emit_json({"name": attrs["name"], "createdAt": attrs["createdAt"], "token": credential})
        return
    print(f"server token {name}:\n\n  {credential}\n")
    print("Shown once: store it now. Clients pass it with --server-token or SWAMP_SERVER_TOKEN.")


@token_app.command("list", short_help="Admin server tokens and their state.")
@command
def list_tokens(repo_dir: Path = REPO_DIR, json_output: bool = JSON) -> None:
    """Every admin server token and its state."""
    book = _book(repo_dir)
    try:
        items = [{k: v for k, v in t.items() if k != "secretHash"} for t in book.all()]
    finally:
        book.store.close()
    if json_output:
        emit_json(items)
    elif items:
        print(table(["NAME", "STATE", "CREATED"],
                    [[t["name"], t["state"], t["createdAt"]] for t in items]))
    else:
        print("No server tokens: create one with 'swamp server token create NAME'.")


@token_app.command("revoke", short_help="Revoke an admin server token.")
@command
def revoke(name: str = typer.Argument(..., help="Token name."), repo_dir: Path = REPO_DIR,
           json_output: bool = JSON) -> None:
    """Revoke an admin token: new admin connections presenting it are refused."""
    book = _book(repo_dir)
    try:
        attrs = book.revoke(name)
    finally:
        book.store.close()
    if json_output:
        emit_json({k: v for k, v in attrs.items() if k != "secretHash"})
    else:
        print(f"server token {name} revoked")
