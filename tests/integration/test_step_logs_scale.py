"""``swamp logs RUN`` through ``--server`` on a 10,000-step run (a forEach over a fleet): every
line printed, no reply over the frame limit, and the server not stalled by the run's size."""

import pytest

from swamp.repo import Repo
from tests.unit import test_step_logs_scale as shape

pytestmark = pytest.mark.integration


def test_swamp_logs_of_a_ten_thousand_step_run_through_the_server(cluster, tmp_path):
    built, _ = shape._setup(tmp_path, Repo(cluster.repo).db_path)
    built.close()
    cluster.serve()
    result = cluster.cli("logs", shape.RUN_ID, "--server", cluster.url, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == shape.N
    assert lines[-1] == f"uptime-{shape.STEP_NAMES[-1]} │ up 3 days"
    one = cluster.cli(
        "logs", f"{shape.RUN_ID[:8]}/uptime-{shape.STEP_NAMES[42]}", "--server", cluster.url
    )
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == ["up 3 days"]
