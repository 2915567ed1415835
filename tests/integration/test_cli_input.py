"""Bad input on the CLI: one clear line, a non-zero exit, no traceback, nothing written."""

import sqlite3

import pytest

pytestmark = pytest.mark.integration


def _rows(cluster) -> int:
    db = sqlite3.connect(cluster.repo / ".swamp" / "swamp.db")
    try:
        return db.execute("SELECT COUNT(*) FROM data").fetchone()[0]
    finally:
        db.close()


CASES = [
    (["model", "method", "run", "no/such", "run"], "unknown model type 'no/such'"),
    (["model", "method", "run", "nothing-here", "run"], "no model named 'nothing-here'"),
    (["model", "method", "run", "command/shell", "walk"], "has no method 'walk'"),
    (["model", "method", "run", "command/shell", "run"], "needs argument 'command'"),
    (["model", "method", "run", "command/shell", "run", "--arg", "command"], "expected name=value"),
    (
        [
            "model",
            "method",
            "run",
            "command/shell",
            "run",
            "--arg",
            "command=true",
            "--arg",
            "timeout=soon",
        ],
        "duration",
    ),
    (
        [
            "model",
            "method",
            "run",
            "command/shell",
            "run",
            "--arg",
            "command=true",
            "--arg",
            "colour=red",
        ],
        "no argument 'colour'",
    ),
    (["model", "method", "run", "swamp/worker", "run"], "bookkeeping"),
    (
        [
            "model",
            "method",
            "run",
            "command/shell",
            "run",
            "--arg",
            "command=true",
            "--label",
            "gpu",
        ],
        "invalid label 'gpu' in --label",
    ),
    (
        [
            "model",
            "method",
            "run",
            "command/shell",
            "run",
            "--arg",
            "command=true",
            "--target",
            "w1",
        ],
        "needs a running orchestrator",
    ),
    (["data", "query", "modelType =="], "position 12"),
    (["data", "query", "colour == 1"], "unknown field 'colour'"),
    (["worker", "list", "--server", "http://nope"], "must start with ws://"),
    (["worker", "connect", "ws://127.0.0.1:9", "--label", "a b=c"], "invalid label 'a b=c'"),
    (["worker", "connect", "http://x"], "must start with ws:// or wss://"),
    (["worker", "connect", "ws://127.0.0.1:9"], "missing enrollment token"),
    (["worker", "connect"], "SWAMP_ORCHESTRATOR_URL"),
    (["serve", "--auth", "maybe", "--port", "0"], "expected token or none"),
    (["serve", "--grace-window", "0s", "--port", "0"], "must be positive"),
    (["server", "token", "create", "Bad.Name"], "invalid server token name"),
    (["serve", "--queue-timeout", "5x", "--port", "0"], "invalid --queue-timeout"),
    (["serve", "--pyz", "/nowhere/swamp.pyz", "--port", "0"], "is not a file"),
    (
        ["worker", "connect", "ws://127.0.0.1:9", "--token", "a.b", "--max-dispatches", "0"],
        "expected 1 or more",
    ),
    (
        ["worker", "connect", "ws://127.0.0.1:9", "--token", "a.b", "--idle-timeout", "soon"],
        "--idle-timeout (SWAMP_WORKER_IDLE_TIMEOUT)",
    ),
    (
        ["worker", "connect", "ws://127.0.0.1:9", "--token", "a.b", "--concurrency", "lots"],
        "SWAMP_WORKER_CONCURRENCY",
    ),
    (["worker", "unit", "--exec", "swamp"], "must be an absolute path"),
    (
        ["worker", "token", "create", "p", "--duration", "1h", "--cloud-init", "--compose"],
        "choose one of",
    ),
    (
        ["worker", "token", "create", "p", "--duration", "1h", "--cloud-init"],
        "needs the orchestrator's URL",
    ),
    (["workflow", "run", "nope"], "no workflow 'nope'"),
    (["workflow", "run", "nope", "--timeout", "soon"], "invalid --timeout"),
    (["workflow", "create", "Bad Name"], "invalid workflow name"),
    (["workflow", "history", "get"], "needs a run id"),
    (["logs", "not-hex"], "invalid run or dispatch id"),
    (["logs", "abcd/"], "name a step after the '/'"),
    (["logs", "abcdef01"], "no workflow run or dispatch 'abcdef01'"),
]


@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(c[0][:4]) for c in CASES])
def test_bad_input_is_refused_clearly_and_writes_nothing(cluster, args, needle):
    before = _rows(cluster)
    result = (
        cluster.cli(*args, "--repo-dir", str(cluster.repo))
        if args[0] not in ("worker",) or args[1] == "list"
        else cluster.cli(*args)
    )
    assert result.returncode != 0
    assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ")
    if len(lines) != 1:  # a predicate error shows the predicate with a caret under the position
        assert len(lines) == 3 and lines[2].strip() == "^", result.stderr
    assert _rows(cluster) == before


def test_json_mode_reports_the_error_as_json(cluster):
    result = cluster.cli("data", "query", "version ==", "--json", "--repo-dir", str(cluster.repo))
    assert result.returncode == 2
    assert '"code": "invalid_predicate"' in result.stdout
