"""What this machine is, in the words placements use."""

from __future__ import annotations

import platform

_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def local_platform() -> tuple[str, str]:
    """``(os, arch)``: ``linux``/``darwin``/``windows`` and ``x86_64``/``aarch64``/..."""
    system = platform.system().lower() or "unknown"
    machine = platform.machine().lower() or "unknown"
    return system, _ARCH_ALIASES.get(machine, machine)
