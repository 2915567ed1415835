"""The environment a dispatch ships from the orchestrator to the worker.

The orchestrator's environment, minus what describes *its* machine or *its* credentials, is
overlaid on the worker's own. The worker drops the same names again on its side, so a denylisted
variable can never cross, and it never hands its own credentials to anything it spawns.
"""

from __future__ import annotations

from collections.abc import Mapping

DENY_EXACT = frozenset(
    {
        "HOME", "USER", "USERNAME", "USERPROFILE", "LOGNAME", "SHELL", "PATH", "PWD", "OLDPWD",
        "TMPDIR", "TEMP", "TMP", "HOSTNAME", "TERM", "LANG", "LC_ALL", "SHLVL", "MAIL",
        "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SSH_AUTH_SOCK", "DISPLAY",
    }
)
DENY_PREFIXES = ("XDG_", "SWAMP_", "SSH_", "LC_")


def denied(name: str) -> bool:
    upper = name.upper()
    return upper in DENY_EXACT or upper.startswith(DENY_PREFIXES)


def ship(env: Mapping[str, str]) -> dict[str, str]:
    """What the orchestrator sends with a dispatch."""
    return {k: v for k, v in env.items() if not denied(k)}


def overlay(local: Mapping[str, str], shipped: Mapping[str, str]) -> dict[str, str]:
    """The environment a method sees on the worker: the worker's own (minus swamp's credentials),
    with the shipped values winning, denylisted names dropped from the shipped side."""
    merged = {k: v for k, v in local.items() if not k.upper().startswith("SWAMP_")}
    merged.update(ship(shipped))
    return merged
