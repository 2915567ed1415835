import ast
from pathlib import Path

import pytest

from swamp.domain import environment
from swamp.domain.leases import LEASE_LIFECYCLE, LeaseState, end, mark_writes
from swamp.domain.lifecycle import IllegalTransition
from swamp.domain.workers import WORKER_LIFECYCLE, WorkerStatus
from swamp.errors import UserError

DOMAIN = Path(__file__).resolve().parents[2] / "swamp" / "domain"
FORBIDDEN = {
    "trio",
    "hypercorn",
    "sqlite3",
    "pluggy",
    "typer",
    "socket",
    "time",
    "os",
    "httpx",
    "trio_websocket",
    "asyncio",
    "subprocess",
}


def test_the_domain_is_sans_io():
    for path in DOMAIN.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            assert not FORBIDDEN & set(names), f"{path.name} imports {names}"


def test_only_named_variables_are_shipped():
    orchestrator = {
        "HOME": "/root",
        "PATH": "/x",
        "SWAMP_WORKER_TOKEN": "t.s",
        "XDG_RUNTIME_DIR": "/run",
        "API_URL": "https://api",
        "AWS_SECRET": "k",
    }
    assert environment.ship(orchestrator, ()) == {}
    assert environment.ship(orchestrator, ("API_URL", "MISSING")) == {"API_URL": "https://api"}
    # a denied name never ships, even if it slipped past validation
    assert environment.ship(orchestrator, ("PATH", "SWAMP_WORKER_TOKEN")) == {}


@pytest.mark.parametrize(
    "names,needle",
    [
        (["PATH"], "can never be shipped"),
        (["swamp_token"], "can never be shipped"),
        (["XDG_CONFIG_HOME"], "can never be shipped"),
        (["1ABC"], "invalid variable name"),
        (["A B"], "invalid variable name"),
        (["OK\n"], "invalid variable name"),
        ([5], "invalid"),
    ],
)
def test_naming_a_variable_that_cannot_ship_is_an_input_error(names, needle):
    with pytest.raises(UserError, match=needle) as info:
        environment.check_names(names, source="--ship-env")
    assert "--ship-env" in info.value.message


def test_check_names_keeps_order_and_drops_repeats():
    assert environment.check_names(["B", "A", "B"], source="x") == ("B", "A")


def test_environment_overlay():
    shipped = {"API_URL": "https://api"}
    worker = {
        "HOME": "/home/w",
        "PATH": "/usr/bin",
        "SWAMP_WORKER_TOKEN": "mine.secret",
        "API_URL": "old",
    }
    merged = environment.overlay(worker, {**shipped, "SWAMP_EVIL": "1", "PATH": "/evil"})
    assert merged == {"HOME": "/home/w", "PATH": "/usr/bin", "API_URL": "https://api"}


def test_lease_transitions():
    lease = {"leaseId": "l1", "state": "active", "hasWrites": False}
    marked = mark_writes(lease)
    assert marked["hasWrites"] is True and mark_writes(marked) is None
    done = end(marked, LeaseState.COMPLETED, now_iso="t")
    assert done["state"] == "completed" and done["endedAt"] == "t"
    with pytest.raises(IllegalTransition):
        end(done, LeaseState.FAILED, now_iso="t")
    with pytest.raises(IllegalTransition, match="only active leases"):
        mark_writes(done)


@pytest.mark.parametrize(
    "lifecycle,states,legal",
    [
        (
            LEASE_LIFECYCLE,
            LeaseState,
            {
                ("active", "completed"),
                ("active", "failed"),
                ("active", "expired"),
                ("active", "cancelled"),
            },
        ),
        (
            WORKER_LIFECYCLE,
            WorkerStatus,
            {
                ("idle", "busy"),
                ("idle", "idle"),
                ("idle", "disconnected"),
                ("busy", "idle"),
                ("busy", "busy"),
                ("busy", "disconnected"),
                ("disconnected", "idle"),
                ("disconnected", "busy"),
                ("unverified", "idle"),
                ("unverified", "unverified"),
                ("unverified", "disconnected"),
                ("idle", "draining"),
                ("busy", "draining"),
                ("unverified", "draining"),
                ("draining", "draining"),
                ("draining", "disconnected"),
                ("idle", "unresponsive"),
                ("busy", "unresponsive"),
                ("unresponsive", "unresponsive"),
                ("unresponsive", "idle"),
                ("unresponsive", "busy"),
                ("unresponsive", "unverified"),
                ("unresponsive", "disconnected"),
                ("unresponsive", "draining"),
            },
        ),
    ],
)
def test_lifecycle_tables_pair_by_pair(lifecycle, states, legal):
    for a in states:
        for b in states:
            if (a.value, b.value) in legal:
                lifecycle.check(a, b)
            else:
                with pytest.raises(IllegalTransition):
                    lifecycle.check(a, b)


def test_a_method_run_by_the_orchestrator_never_sees_its_database_credentials():
    own = {"PATH": "/bin", "SWAMP_DATABASE_URL": "postgresql://u:p@h/db", "PGPASSWORD": "p"}
    assert environment.for_methods_here(own) == {"PATH": "/bin"}


def test_a_database_url_is_shown_without_its_password_or_not_at_all():
    from swamp.domain.database import check_database_url, shown

    assert shown("postgresql://bob:s3cret@db.example:5432/swamp?sslmode=require") == (
        "postgresql://db.example:5432/swamp"
    )
    for hidden in ("bob:s3cret@db/swamp", "postgres://bob:s3cret@/swamp", "s3cret"):
        assert "s3cret" not in shown(hidden)
        with pytest.raises(UserError) as refused:
            check_database_url(hidden)
        assert "s3cret" not in refused.value.message
