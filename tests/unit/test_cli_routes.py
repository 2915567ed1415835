"""The route options are one definition: every command that can act on the repo or through a
server offers the same four options, with the same names, variables and help, in the same
order, and the command receives them as one ``Route``."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from swamp.cli import app
from swamp.cli.common import ROUTE, ROUTE_OPTIONS, Route, command

ROUTE_FLAGS = ["--server", "--server-token", "--ca-cert", "--repo-dir"]


def _commands(group, path: tuple[str, ...] = ()):
    """Every leaf command under ``group`` (typer's click objects, read by their attributes)."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def _options(cmd) -> dict:
    return {p.opts[0]: p for p in cmd.params if p.param_type_name == "option"}


def test_every_routed_command_offers_the_same_four_options_in_order():
    root = typer.main.get_command(app)
    routed = {}
    for path, cmd in _commands(root):
        options = _options(cmd)
        if "--server" in options:
            routed[" ".join(path)] = cmd
            flags = [f for f in options if f in ROUTE_FLAGS]
            assert flags == ROUTE_FLAGS, (path, flags)
    assert {"worker list", "worker token create", "data query", "workflow run"} <= set(routed)
    first = _options(next(iter(routed.values())))
    for path, cmd in routed.items():
        for flag in ROUTE_FLAGS:
            mine, theirs = _options(cmd)[flag], first[flag]
            assert (mine.help, mine.envvar, mine.default) == (
                theirs.help,
                theirs.envvar,
                theirs.default,
            ), (path, flag)
    envvars = [_options(next(iter(routed.values())))[f].envvar for f in ROUTE_FLAGS]
    assert envvars == ["SWAMP_SERVE_URL", "SWAMP_SERVER_TOKEN", "SWAMP_CA_CERT", "SWAMP_REPO_DIR"]


def test_a_command_receives_its_options_as_one_route(tmp_path, monkeypatch):
    seen: list[Route] = []

    demo = typer.Typer()

    @demo.command()
    @command
    def show(route: Route = ROUTE, json_output: bool = typer.Option(False, "--json")) -> None:
        seen.append(route)

    monkeypatch.setenv("SWAMP_SERVER_TOKEN", "ops.x")
    result = CliRunner().invoke(
        demo, ["--server", "ws://h:1", "--repo-dir", str(tmp_path), "--ca-cert", "ca.pem"]
    )
    assert result.exit_code == 0, result.output
    assert seen == [Route("ws://h:1", "ops.x", Path("ca.pem"), tmp_path)]
    assert [name for name, _, _ in ROUTE_OPTIONS] == list(Route.__dataclass_fields__)
