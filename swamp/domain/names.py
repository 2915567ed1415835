"""Names of tokens, workers, models and data items.

One rule for every name that becomes part of a key or a URL segment: lowercase letters, digits,
``-`` and ``_``, starting with a letter or digit, at most 64 characters. A ``.`` can never appear,
which is what lets ``<name>.<secret>`` split unambiguously, and ``/`` or ``..`` never reach a path.
"""

from __future__ import annotations

import re

from swamp.errors import UserError

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# Data names may also carry dots and capitals (``result``, ``probe-result``, ``lease-<uuid>``).
DATA_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MODEL_TYPE_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]*(/[a-z0-9][a-z0-9_-]*)+")
# the instance of an ad-hoc run: ``run-`` and 16 hex digits, made by the orchestrator alone
ADHOC_INSTANCE = re.compile(r"run-[0-9a-f]{16}")


def check_name(name: str, *, what: str = "name") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise UserError(
            f"invalid {what} {name!r}: use 1-64 lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


def check_data_name(name: str, *, what: str = "data name") -> str:
    if not isinstance(name, str) or not DATA_NAME_PATTERN.fullmatch(name) or ".." in name:
        raise UserError(
            f"invalid {what} {name!r}: use 1-128 letters, digits, '.', '-' or '_', "
            "starting with a letter or digit, without '..'"
        )
    return name


def is_model_type(text: str) -> bool:
    return isinstance(text, str) and MODEL_TYPE_PATTERN.fullmatch(text) is not None


def is_adhoc_instance(name: str) -> bool:
    return isinstance(name, str) and ADHOC_INSTANCE.fullmatch(name) is not None


def check_instance_name(name: str, *, what: str = "model name") -> str:
    """A name for a model instance an operator chooses: a name, and not one of the shape the
    orchestrator gives ad-hoc runs (their data would mix, and be collected with theirs)."""
    check_name(name, what=what)
    if is_adhoc_instance(name):
        raise UserError(
            f"invalid {what} {name!r}: names of the form run-<16 hex digits> are those of "
            "ad-hoc runs; choose another"
        )
    return name
