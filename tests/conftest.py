"""What every test shares."""

from hypothesis import settings

from tests import profiles

settings.load_profile(profiles.chosen())


def pytest_report_header(config):
    return f"hypothesis profile: {profiles.chosen()} ({settings.default.max_examples} examples)"
