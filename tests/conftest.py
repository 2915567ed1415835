"""What every test shares."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from tests import profiles

settings.load_profile(profiles.chosen())


def pytest_report_header(config: pytest.Config) -> str:
    return f"hypothesis profile: {profiles.chosen()} ({settings().max_examples} examples)"


FAST_LOOP = "not integration"  # the marker expression of the fast loop (build.py's help)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast loop does not import what it would deselect: every test under
    tests/integration is marked ``integration`` (its conftest), so with exactly the fast loop's
    expression that directory is not collected at all."""
    if (config.option.markexpr or "").strip() != FAST_LOOP:
        return None
    integration = Path(__file__).parent / "integration"
    return True if collection_path == integration else None


# -- PostgreSQL (tests.postgres) --------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_cluster():
    """One throwaway PostgreSQL server per test process (``tests.postgres``)."""
    from tests import postgres

    with postgres.cluster() as running:
        yield running


@pytest.fixture
def pg_url(postgres_cluster) -> str:
    """The URL of a fresh, empty database of its own for the test."""
    return postgres_cluster.new_database()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses PostgreSQL is marked ``postgres`` and ``integration``: the fast loop
    never starts a server, and ``-m postgres`` runs those tests alone."""
    for item in items:
        if "postgres_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
            item.add_marker(pytest.mark.integration)
