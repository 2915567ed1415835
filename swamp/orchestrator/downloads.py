"""The orchestrator serves its own build: ``GET /swamp.pyz`` and ``GET /swamp.pyz.sha256``.

A machine provisioned from the orchestrator runs the orchestrator's own version. The file is the
one ``swamp serve`` runs from (a pyz), or the one ``--pyz PATH`` names; its sha256 is computed
once at start and sent with every download (``X-Swamp-Sha256``) so a script can check it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from swamp.domain.builds import build_problem
from swamp.errors import UserError

CHUNK = 256 * 1024


@dataclass(frozen=True)
class Download:
    path: Path
    sha256: str
    size: int

    @classmethod
    def of(cls, path: Path, *, what: str = "--pyz", private: Path | None = None) -> Download:
        """The build at ``path``, checked and hashed: a swamp build (a zip archive whose
        contents say so), outside ``private`` (the repo's ``.swamp/``: the database and the
        credentials are never served). ``what`` names where the path came from."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{what} {path} is not a file")
        resolved = path.resolve()
        if private is not None and resolved.is_relative_to(Path(private).resolve()):
            raise UserError(
                f"{what} {path} is in {private}, the orchestrator's own state (its database "
                "and credentials), which is never served: pass a swamp.pyz"
            )
        digest = hashlib.sha256()
        size = 0
        with resolved.open("rb") as f:
            try:
                with zipfile.ZipFile(f) as archive:
                    problem = build_problem(archive.namelist())
            except (zipfile.BadZipFile, OSError):
                problem = "it is not a zip archive"
            if problem:
                raise UserError(
                    f"{what} {path} is not a swamp build ({problem}): pass a swamp.pyz, such "
                    "as the one 'python3 build.py pyz' writes"
                )
            f.seek(0)
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return cls(resolved, digest.hexdigest(), size)


def served_build(named: Path | None, state_dir: Path) -> Download | None:
    """What ``GET /swamp.pyz`` serves: ``--pyz``, else the pyz this process runs from (if
    any); checked before anything is served."""
    if named is not None:
        return Download.of(named, private=state_dir)
    running = running_pyz()
    if running is None:
        return None
    what = "SWAMP_PYZ" if os.environ.get("SWAMP_PYZ") else "the program"
    return Download.of(running, what=what, private=state_dir)


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
