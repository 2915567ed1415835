"""What this machine is, in the words placements use."""

from __future__ import annotations

import platform
import re

_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def local_platform() -> tuple[str, str]:
    """``(os, arch)``: ``linux``/``darwin``/``windows`` and ``x86_64``/``aarch64``/..."""
    system = _word(platform.system())
    machine = _word(platform.machine())
    return system, _ARCH_ALIASES.get(machine, machine)


def _word(text: str) -> str:
    """Lowercase, with anything outside ``[a-z0-9_.-]`` as ``-`` ("Power Macintosh")."""
    word = re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-._")[:32]
    return word or "unknown"
