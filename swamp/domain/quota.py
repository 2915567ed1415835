"""What one dispatch may write through the data plane, in all.

A method writes its outputs as data; nothing stopped one dispatch from writing hundreds of
megabytes into the orchestrator's database. Each dispatch now has a quota of bytes and of
records (versions written); the write that would pass either is refused with a coded error and
nothing of it is kept. The method sees the refusal like any failed write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from swamp.errors import QuotaExceeded, UserError

DEFAULT_BYTES = 256 * 1024 * 1024
DEFAULT_RECORDS = 10_000
_SIZE = re.compile(r"(\d+)\s*(|B|KiB|MiB|GiB|KB|MB|GB)", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
}


def parse_size(text: str, *, what: str) -> int:
    """``256MiB``, ``1GiB``, ``500MB``, ``65536``: a positive number of bytes."""
    match = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None or int(match.group(1)) <= 0:
        raise UserError(
            f"invalid {what} {text!r}: expected a positive size such as 256MiB, 1GiB or 500MB"
        )
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"


@dataclass(frozen=True)
class WriteQuota:
    bytes: int = DEFAULT_BYTES
    records: int = DEFAULT_RECORDS

    def check(self, *, written_bytes: int, written_records: int, adding: int) -> None:
        """Refuse a write of ``adding`` bytes after what the dispatch has written so far."""
        if written_records + 1 > self.records:
            raise QuotaExceeded(
                f"this dispatch has written {written_records} records, its quota "
                f"(serve --write-quota-records {self.records}); nothing more is kept"
            )
        if written_bytes + adding > self.bytes:
            raise QuotaExceeded(
                f"writing {format_size(adding)} would take this dispatch past its quota of "
                f"{format_size(self.bytes)} ({format_size(written_bytes)} written so far; "
                "serve --write-quota-bytes); nothing of it is kept"
            )
