"""``swamp``: the command line. One module per noun; each command parses, calls one service,
renders (text or ``--json``) and maps errors to exit statuses."""

from __future__ import annotations

import typer

from swamp.cli import (
    data_cmd,
    demo_cmd,
    logs_cmd,
    model_cmd,
    repo_cmd,
    serve_cmd,
    server_cmd,
    ui_cmd,
    worker_cmd,
    workflow_cmd,
)

app = typer.Typer(
    name="swamp",
    help="An orchestrator and its worker fleets. Start with 'swamp demo', or: swamp init; "
    "swamp serve; swamp worker token create NAME --duration 1h; swamp worker connect URL "
    "--token NAME.SECRET; swamp model method run command/shell run --arg command='uname -a' "
    "--target NAME.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain Click help: rewraps paragraphs, starts faster
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _versions() -> dict:
    from swamp import __version__
    from swamp.protocol.frames import PROTOCOL_VERSION

    return {"version": __version__, "protocolVersion": PROTOCOL_VERSION}


def _print_version(asked: bool) -> None:
    if asked:
        print("swamp {version} (protocol {protocolVersion})".format(**_versions()))
        raise typer.Exit()


@app.callback()
def root(
    show_version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version and exit ('swamp version --json' for machines).",
    ),
) -> None:
    """An orchestrator and its worker fleets."""


app.command("init", short_help="Create a repo (swamp.toml, models/, database).")(repo_cmd.init)
app.command("serve", short_help="Run the orchestrator.")(serve_cmd.serve)
app.command("demo", short_help="See it work: an orchestrator, two workers, dispatches.")(
    demo_cmd.demo
)
app.add_typer(worker_cmd.app, name="worker")
app.add_typer(server_cmd.app, name="server")
app.add_typer(data_cmd.app, name="data")
app.add_typer(model_cmd.app, name="model")
app.add_typer(workflow_cmd.app, name="workflow")
app.command("logs", short_help="What a run's steps or a dispatch printed; --follow for live.")(
    logs_cmd.logs
)
app.command("ui", short_help="Open the fleet's web pages (a one-time login link).")(ui_cmd.ui)


@app.command("version", short_help="Print the version and protocol version.")
def version(json_output: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print swamp's version and its protocol version (the same as 'swamp --version')."""
    if json_output:
        import json

        print(json.dumps(_versions()))
    else:
        _print_version(True)


def main() -> None:
    app()
