"""Who this worker is: a machine id that survives restarts, an instance id that does not.

The machine id lives in ``<cache-dir>/machine-id``: the unit of trust a token binds to. Keep the
cache dir across restarts and the machine re-enrolls as itself; the default, a fresh temporary
directory, makes every process a new machine.
"""

from __future__ import annotations

import os
import re
import secrets
import uuid
from pathlib import Path

from swamp.errors import UserError

_VALID = re.compile(r"[A-Za-z0-9-]{8,128}")


def machine_id(cache_dir: Path) -> str:
    path = cache_dir / "machine-id"
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from exc
    if existing:
        if not _VALID.fullmatch(existing):
            raise UserError(f"{path} does not hold a machine id; delete it to make a new one")
        return existing
    new = _new_uuid()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(new)
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from exc
    return new


def instance_id() -> str:
    return _new_uuid()


def _new_uuid() -> str:
    """A random (version 4) UUID from ``secrets``: the ids a worker is known by must not be
    guessable (the shape of ``uuid.uuid4()``, which draws the same bytes)."""
    return str(uuid.UUID(bytes=secrets.token_bytes(16), version=4))
