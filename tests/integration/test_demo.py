"""The README's main job, as a user runs it."""

import json

import pytest

pytestmark = pytest.mark.integration


def test_the_demo_runs_on_real_processes_and_cleans_up(cluster):
    result = cluster.cli("demo", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["status"] for r in report["runs"]] == ["succeeded"] * 3
    members = {w["name"] for w in report["workers"]}
    assert len(members) == 2 and all(name.startswith("demo-") for name in members)
    assert {r["worker"] for r in report["runs"][:2]} == members  # one run on each, by target
    assert report["verify"]["passed"] == 2
    assert all(w["labels"]["fleet"] == "demo" for w in report["workers"])
