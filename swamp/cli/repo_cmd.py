"""``swamp init``."""

from __future__ import annotations

from pathlib import Path

import typer

from swamp.cli.common import JSON, command, emit_json


@command
def init(
    directory: Path = typer.Argument(
        Path("."), help="Where to create the repo (created if missing)."
    ),
    json_output: bool = JSON,
) -> None:
    """Create a repo: swamp.toml, models/, workflows/ and the database in .swamp/swamp.db.

    Safe to run again: it completes a partial repo and never overwrites what exists.
    """
    from swamp.repo import Repo

    repo, created = Repo.init(directory)
    if json_output:
        emit_json({"repo": str(repo.root), "created": created, "database": str(repo.db_path)})
        return
    verb = "created" if created else "already complete"
    print(f"repo {repo.root}: {verb}")
    print("next: swamp serve --repo-dir", repo.root)
