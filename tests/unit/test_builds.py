"""What ``serve --pyz`` accepts as a swamp build (the real files: test_downloads.py)."""

import pytest

from swamp.domain.builds import build_problem


@pytest.mark.parametrize(
    "names,problem",
    [
        (["__main__.py", "swamp/__init__.py", "swamp/cli/__init__.py"], None),  # a zipapp
        (["__main__.py", "_bootstrap/__init__.py", "site-packages/swamp/__init__.py"], None),
        (["swamp/__init__.py"], "it has no __main__.py"),
        (["__main__.py", "other/__init__.py"], "it holds no swamp package"),
        (["__main__.py", "x/swamp/__init__.py"], "it holds no swamp package"),
        ([], "it has no __main__.py"),
    ],
)
def test_a_swamp_build_has_a_main_and_the_swamp_package(names, problem):
    assert build_problem(names) == problem
