"""``swamp demo``: the product in one command, on real processes."""

from __future__ import annotations

import typer

from swamp.cli.common import JSON, command


@command
def demo(
    workers: int = typer.Option(
        2, "--workers", min=1, max=8, help="How many worker processes to start."
    ),
    keep: bool = typer.Option(
        False, "--keep", help="Keep the temporary repo afterwards and print its path."
    ),
    json_output: bool = JSON,
) -> None:
    """Start an orchestrator on a free port in a temporary repo, mint one fleet token, start
    worker processes, run command/shell on each by target and once by label, show what ran where,
    the pool and a fleet verification, then shut everything down."""
    import trio

    from swamp.demo import run_demo

    raise typer.Exit(trio.run(run_demo, workers, keep, json_output))
