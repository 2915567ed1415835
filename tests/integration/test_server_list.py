"""``--server`` given several orchestrators, and following a step, on real processes: the
first that answers is used; a step is followed only through an orchestrator that records
steps (a shared database), and every refusal is one line with an exit status other than 0."""

from __future__ import annotations

import pytest

from tests.integration.test_orchestrator_list import _closed_port

pytestmark = pytest.mark.integration


def test_the_first_orchestrator_that_answers_is_used(cluster):
    cluster.serve()
    nobody = f"ws://127.0.0.1:{_closed_port()}"
    listed = cluster.cli("worker", "list", "--server", f"{nobody}, {cluster.url}", "--json")
    assert listed.returncode == 0, listed.stderr
    alone = cluster.cli("worker", "list", "--server", nobody, "--json")
    assert alone.returncode == 1 and "cannot connect" in alone.stderr, alone.stderr
    too_many = ",".join(f"ws://127.0.0.1:{9000 + n}" for n in range(17))
    refused = cluster.cli("worker", "list", "--server", too_many)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "at most 16" in refused.stderr
    for empty in (",", " , "):
        nothing = cluster.cli("worker", "list", "--server", empty)
        assert nothing.returncode == 2 and len(nothing.stderr.splitlines()) == 1, nothing.stderr
        assert "names no URL" in nothing.stderr


def test_following_a_step_needs_an_orchestrator_that_records_steps(cluster):
    followed = cluster.cli("model", "method", "follow", "0" * 32)  # nothing runs here
    assert followed.returncode != 0 and len(followed.stderr.splitlines()) == 1, followed.stderr
    assert "--server" in followed.stderr
    cluster.serve()  # its records are its own file: no step records
    followed = cluster.cli("model", "method", "follow", "0" * 32, "--server", cluster.url)
    assert followed.returncode == 2 and len(followed.stderr.splitlines()) == 1, followed.stderr
    assert "keeps no step records" in followed.stderr
    json_out = cluster.cli("model", "method", "follow", "0" * 32, "--json")  # serve.json's
    assert json_out.returncode == 2 and '"not_found"' in json_out.stdout, json_out.stdout
