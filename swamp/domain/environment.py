"""The environment a dispatch ships from the orchestrator to the worker: only what is named.

Nothing leaves unnamed. A dispatch carries the variables named by ``serve --ship-env`` (every
dispatch), by its model instance (``env = [...]`` in ``models/*.toml``) and by its run
(``--env NAME``), with the orchestrator's values; nothing else. (The TypeScript original shipped
the whole environment minus a short denylist, which sent every cloud key and database URL the
orchestrator had to every worker.)

Some names may never be shipped, named or not: what describes the orchestrator's own machine or
session (``HOME``, ``PATH``, ``XDG_*``…) and swamp's own credentials (``SWAMP_*``). Naming one is
an input error. The worker drops the same names again on its side, and never hands its own
``SWAMP_*`` variables to anything it spawns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from swamp.errors import UserError

DENY_EXACT = frozenset(
    {
        "HOME",
        "USER",
        "USERNAME",
        "USERPROFILE",
        "LOGNAME",
        "SHELL",
        "PATH",
        "PWD",
        "OLDPWD",
        "TMPDIR",
        "TEMP",
        "TMP",
        "HOSTNAME",
        "TERM",
        "LANG",
        "LC_ALL",
        "SHLVL",
        "MAIL",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "SSH_AUTH_SOCK",
        "DISPLAY",
    }
)
DENY_PREFIXES = ("XDG_", "SWAMP_", "SSH_", "LC_")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_NAMES = 256


# what reaches the orchestrator's database: never in the environment of a method it runs itself
DATABASE_SECRETS = ("SWAMP_DATABASE_URL", "PGPASSWORD")


def for_methods_here(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a method run in the orchestrator's own process: its own, without
    the database's credentials (a step's ``env`` would print them into its stored output)."""
    return {k: v for k, v in env.items() if k not in DATABASE_SECRETS}


def denied(name: str) -> bool:
    upper = name.upper()
    return upper in DENY_EXACT or upper.startswith(DENY_PREFIXES)


def check_names(names: Iterable[object], *, source: str) -> tuple[str, ...]:
    """Validate variable names to ship (``source`` names where they came from); keeps order,
    drops repeats."""
    out: dict[str, None] = {}
    for name in names:
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise UserError(
                f"invalid variable name {name!r} in {source}: letters, digits and "
                "'_', not starting with a digit"
            )
        if denied(name):
            raise UserError(
                f"{name} in {source} can never be shipped to workers: it describes "
                "the orchestrator's own machine or holds swamp's credentials"
            )
        out[name] = None
    if len(out) > MAX_NAMES:
        raise UserError(f"{source} names {len(out)} variables (at most {MAX_NAMES})")
    return tuple(out)


def ship(env: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The named variables this environment has (a name it lacks is simply not shipped)."""
    return {name: env[name] for name in names if name in env and not denied(name)}


def step_identity(step_id: str, attempt: int) -> dict[str, str]:
    """What a command is told about its step: an id shared by every run of the step and which
    run this is. A step is run again after a lost worker; a command whose effect must happen
    once keys it on ``SWAMP_STEP_ID`` (the one window no runner can close is between a
    command's last write and anyone seeing it exit). Swamp sets these; nothing ships them."""
    return {"SWAMP_STEP_ID": step_id, "SWAMP_ATTEMPT": str(attempt)}


def own(local: Mapping[str, str]) -> dict[str, str]:
    """The worker's own environment as methods may see it: swamp's credentials dropped."""
    return {k: v for k, v in local.items() if not k.upper().startswith("SWAMP_")}


def overlay(local: Mapping[str, str], shipped: Mapping[str, str]) -> dict[str, str]:
    """The environment a method sees on the worker: the worker's own (minus swamp's credentials),
    with the shipped values winning, denied names dropped from the shipped side."""
    return with_shipped(own(local), shipped)


def with_shipped(own_env: dict[str, str], shipped: Mapping[str, str]) -> dict[str, str]:
    """:func:`overlay` of an environment :func:`own` has already filtered (a worker works it
    out once, not per dispatch)."""
    merged = dict(own_env)
    for name, value in shipped.items():
        if not denied(name):
            merged[name] = value
    return merged
