"""The orchestrator serves its own build: ``GET /swamp.pyz`` and ``GET /swamp.pyz.sha256``.

A machine provisioned from the orchestrator runs the orchestrator's own version. The file is the
one ``swamp serve`` runs from (a pyz), or the one ``--pyz PATH`` names; its sha256 is computed
once at start and sent with every download (``X-Swamp-Sha256``) so a script can check it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from swamp.errors import UserError

CHUNK = 256 * 1024


@dataclass(frozen=True)
class Download:
    path: Path
    sha256: str
    size: int

    @classmethod
    def of(cls, path: Path) -> Download:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"--pyz {path} is not a file")
        digest = hashlib.sha256()
        size = 0
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return cls(path.resolve(), digest.hexdigest(), size)


def running_pyz() -> Path | None:
    """The pyz this process runs from, if it runs from one (``SWAMP_PYZ``, set by the pyz's
    launcher, or a ``.pyz`` as the program)."""
    named = os.environ.get("SWAMP_PYZ")
    if named and Path(named).is_file():
        return Path(named)
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if program is not None and program.suffix == ".pyz" and program.is_file():
        return program
    return None
