"""Where an orchestrator keeps its records: the repo's SQLite file (the default) or a
PostgreSQL database shared by several orchestrators (``serve --database``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from swamp.domain.urls import redact
from swamp.errors import UserError

SCHEMES = ("postgresql", "postgres")


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
            "from PGPASSWORD or ~/.pgpass), got "
            f"{redact(url) if parts is not None and parts.scheme else 'something else'}"
        )
    if not parts.path.strip("/"):
        raise UserError(f"invalid {what}: name the database (postgresql://host/dbname)")
    return redact(url)


def has_password(url: str) -> bool:
    try:
        return urlsplit(url).password is not None
    except ValueError:
        return False
