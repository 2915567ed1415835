"""Where an orchestrator keeps its records: the repo's SQLite file (the default) or a
PostgreSQL database shared by several orchestrators (``serve --database``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from swamp.domain.urls import redact
from swamp.errors import UserError

SCHEMES = ("postgresql", "postgres")


def shown(url: str) -> str:
    """``url`` as it may be printed: without its password, its user or its parameters — and not
    at all unless it is plainly ``scheme://host…`` (``bob:secret@host/db``, its scheme
    forgotten, would show the secret as a path)."""
    try:
        parts = urlsplit(url)
        plain = parts.scheme in SCHEMES and bool(parts.netloc) and bool(parts.hostname)
    except ValueError:
        plain = False
    return redact(url) if plain else "(not shown: it may hold a password)"


def check_database_url(url: str, *, what: str = "--database") -> str:
    """The URL as it may be printed (no password, no parameters), once it is one we take:
    ``postgresql://[user@]host[:port]/dbname``. The password had best come from the
    environment (``PGPASSWORD``, ``~/.pgpass``, ``SWAMP_DATABASE_URL``), not a command line."""
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in SCHEMES or not parts.hostname:
        raise UserError(
            f"invalid {what}: expected postgresql://[user@]host[:port]/dbname (the password "
            f"from PGPASSWORD or ~/.pgpass), got {shown(url)}"
        )
    if not parts.path.strip("/"):
        raise UserError(f"invalid {what}: name the database (postgresql://host/dbname)")
    return shown(url)


def has_password(url: str) -> bool:
    try:
        return urlsplit(url).password is not None
    except ValueError:
        return False
