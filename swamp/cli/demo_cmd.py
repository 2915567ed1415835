"""``swamp demo``: the product in one command, on real processes."""

from __future__ import annotations

import typer

from swamp.cli.common import JSON, command


@command
def demo(
    workers: int = typer.Option(
        2,
        "--workers",
        min=2,
        max=8,
        help="How many worker processes to start (two at least: one drains, another takes "
        "the work it refuses).",
    ),
    keep: bool = typer.Option(
        False, "--keep", help="Keep the temporary repo afterwards and print its path."
    ),
    json_output: bool = JSON,
) -> None:
    """The fleet design on real processes, in numbered sections: an orchestrator on a free port
    in a temporary repo and one fleet token; a step submitted before any worker exists waits in
    the queue and is dispatched the moment the first worker enrolls; the rest of the fleet
    enrolls; command/shell by target and by label; the pool and a fleet verification; a
    workflow fan-out with one step per member; a worker drained by SIGTERM while a step runs
    (it takes no new work, finishes the step, exits 0); then everything is shut down and the
    temporary directory removed, on Ctrl-C too. Exit 0 when every section showed what it
    claims; --json prints the facts each section checked."""
    from swamp.cli.common import run_async
    from swamp.demo import run_demo

    raise typer.Exit(run_async(run_demo, workers, keep, json_output))
