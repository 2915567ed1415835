"""What the pyz must carry for every Python it runs on, when pip resolves on one of them
(``build.unmet_requirements``, ``build.unsupported``; the real build: test_pyz.py)."""

import build
from swamp.compat import tomllib


def _dist(name, version, *requires, python=None):
    meta = {"name": name, "version": version, "requires_dist": list(requires)}
    if python:
        meta["requires_python"] = python
    return {"metadata": meta}


# what pip resolves on 3.11: trio, without the backport it needs on 3.10
TRIO = _dist("trio", "0.35.0", "outcome", 'exceptiongroup; python_version < "3.11"')
OUTCOME = _dist("outcome", "1.3.0")


def test_a_backport_pip_dropped_for_its_own_python_is_unmet():
    assert build.unmet_requirements([TRIO, OUTCOME], ["trio"]) == ["exceptiongroup"]
    assert build.unmet_requirements([TRIO, OUTCOME], ["trio"], pythons=("3.11", "3.13")) == []
    backport = _dist("exceptiongroup", "1.3.2")
    assert build.unmet_requirements([TRIO, OUTCOME, backport], ["trio"]) == []


def test_a_requirement_is_unmet_at_a_version_it_does_not_accept():
    anyio = _dist("anyio", "4.0", 'typing_extensions>=4.5; python_version < "3.13"')
    old = _dist("typing-extensions", "4.1")
    assert build.unmet_requirements([anyio, old], ["anyio"]) == ["typing_extensions>=4.5"]
    new = _dist("Typing_Extensions", "4.16.0")  # names compare as PEP 503 says
    assert build.unmet_requirements([anyio, new], ["anyio"]) == []


def test_extras_are_followed_and_other_extras_and_platforms_are_not():
    hypercorn = _dist(
        "Hypercorn",
        "0.18.0",
        'trio>=0.22; extra == "trio"',
        'uvloop; extra == "uvloop"',
        'taskgroup; python_version < "3.11"',
        'colorama; platform_system == "Nonesuch"',
    )
    found = build.unmet_requirements([hypercorn], ["hypercorn[trio]>=0.17"])
    assert sorted(found) == ["taskgroup", "trio>=0.22"]
    assert build.unmet_requirements([hypercorn], ["hypercorn"]) == ["taskgroup"]
    # the project's own markers count too
    assert build.unmet_requirements([], ['tomli>=1.1; python_version < "3.11"']) == ["tomli>=1.1"]


def test_a_distribution_that_leaves_out_a_supported_python_is_named():
    dists = [
        _dist("annotated-doc", "0.0.7", python=">=3.11"),
        _dist("annotated-doc", "0.0.6", python=">=3.10"),
        _dist("capped", "1.0", python="<3.13,>=3.8"),
        _dist("sortedcontainers", "2.4.0"),  # says nothing: runs anywhere
    ]
    assert build.unsupported(dists) == [
        "annotated-doc==0.0.7 needs Python >=3.11",
        "capped==1.0 needs Python <3.13,>=3.8",
    ]


def test_the_pythons_the_build_serves_are_the_ones_the_project_and_the_launcher_name():
    project = tomllib.loads((build.ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">={build.PYTHONS[0]}"
    oldest = tuple(int(part) for part in build.PYTHONS[0].split("."))
    assert f"\nNEEDS = {oldest}\n" in build.LAUNCHER.read_text()
