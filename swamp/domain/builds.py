"""What a swamp build looks like from its table of contents.

``swamp serve`` hands its build (``GET /swamp.pyz``) to anyone who asks; a typo in ``--pyz``
must not hand out something else (``--pyz .swamp/swamp.db`` served the database). A build is a
zip archive with a ``__main__.py`` and the ``swamp`` package: at its root (a plain zipapp of
the package) or in its ``site-packages/`` (what ``build.py pyz`` writes).
"""

from __future__ import annotations

from collections.abc import Iterable

PACKAGE = ("swamp/__init__.py", "site-packages/swamp/__init__.py")


def build_problem(names: Iterable[str]) -> str | None:
    """Why a zip archive with these member names is not a swamp build, or None."""
    members = set(names)
    if "__main__.py" not in members:
        return "it has no __main__.py"
    if not members.intersection(PACKAGE):
        return "it holds no swamp package"
    return None
