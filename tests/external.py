"""Tests that need something outside the project (a command, an interpreter, a package from
Debian): skipped with the reason on a machine without it, a failure under CI (``CI=true``),
where ``.ci/run`` installs it and a missing one means a check silently did not run."""

from __future__ import annotations

import os
import shutil

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(present: bool, what: str) -> None:
    """Skip (or, under CI, fail) unless ``present``; ``what`` says what is missing."""
    if present:
        return
    if under_ci():
        pytest.fail(f"missing under CI: {what}")
    pytest.skip(f"missing: {what}")


def command(name: str) -> str:
    """The path of command ``name``, required as above."""
    path = shutil.which(name)
    require(path is not None, f"the {name} command")
    assert path is not None
    return path
