"""A step's output, kept whole: what a log is, how it is cut into chunks, and its cap.

Every line a dispatch prints (a workflow step's, an ad-hoc run's) is kept outside the run
record, in *chunks* of many lines each, so a million lines are a few hundred rows, not a
million. A log belongs to one dispatch (a step dispatched again after a lost worker has a log
per attempt) and names its owner: the workflow run, job and step, or the model instance of an
ad-hoc run. Each chunk knows the number of its first line and byte in the whole output, so a
reader that finds a gap (the oldest part dropped at the cap, or while it read) says how many
lines and bytes are missing instead of skipping them silently.

The cap bounds one log: past it the oldest chunks go (whole chunks, so a log keeps between
``cap - CHUNK_BYTES`` and ``cap`` bytes), in the store and, when the writer is behind, in
memory before they are written — the same lines either way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from swamp.errors import UserError

DEFAULT_CAP_BYTES = 32 * 1024 * 1024
PENDING_CAP_BYTES = 256 * 1024 * 1024  # unwritten output held across every log, at most


def pending_cap(cap: int) -> int:
    """The most unwritten output memory holds across every log while the writer is behind:
    :data:`PENDING_CAP_BYTES`, or one log's ``cap`` if that is more (a log can always hold
    what it keeps)."""
    return max(PENDING_CAP_BYTES, cap)


CHUNK_LINES = 4096  # a chunk is sealed at this many lines …
CHUNK_BYTES = 256 * 1024  # … or this many bytes of text, whichever comes first
LINE_CHARS = 64 * 1024  # a longer line is cut (a frame may carry up to 4 MiB of one line)

#: one character per line in a chunk's ``streams``: where the line came from
STREAM_CODES = {"stdout": "o", "stderr": "e", "log": "l"}
STREAM_NAMES = {code: name for name, code in STREAM_CODES.items()}

_ID = re.compile(r"[0-9a-f]{4,32}")


@dataclass(frozen=True)
class LogOwner:
    """Whose output a log is: a workflow run's step (``run_id`` set), or an ad-hoc run or a
    named model instance's dispatch (``run_id`` None)."""

    model_type: str
    model_name: str
    method: str
    run_id: str | None = None
    workflow: str | None = None
    job: str | None = None
    step: str | None = None


def line_bytes(line: str) -> int:
    """What a line costs against the cap: its UTF-8 size and its newline."""
    return len(line.encode("utf-8", "surrogatepass")) + 1


def overflow(sizes: Sequence[int], cap: int) -> int:
    """How many of a log's chunks (``sizes`` in bytes, oldest first) go so the rest fit in
    ``cap``; the newest chunk always stays, however large."""
    total = sum(sizes)
    drop = 0
    while total > cap and drop < len(sizes) - 1:
        total -= sizes[drop]
        drop += 1
    return drop


def gap_marker(lines: int, size: int, cap: int) -> str:
    """The line a reader prints where lines are missing (dropped at the cap)."""
    return (
        f"… {lines:,} line(s) ({_size(size)}) dropped here: a step's output is kept up to "
        f"{_size(cap)}, the oldest part goes first (serve --step-log-cap)"
    )


def _size(size: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} bytes"


@dataclass(frozen=True)
class LogRef:
    """What ``swamp logs`` was asked for: a run id (or prefix) with perhaps a step, or a
    dispatch id (or prefix) — which of the two is for the store to say."""

    id: str
    step: str | None = None


def parse_log_ref(text: str) -> LogRef:
    """``RUN``, ``RUN/STEP`` (``STEP`` may be ``JOB.STEP``) or ``DISPATCH``: ids are hex, at
    least 4 digits of one."""
    head, sep, step = text.partition("/")
    if not _ID.fullmatch(head):
        raise UserError(
            f"invalid run or dispatch id {text[:80]!r}: expected at least 4 hex digits of one "
            "(see 'swamp workflow history'), then perhaps /STEP"
        )
    if sep and not step:
        raise UserError(f"{text[:80]!r}: name a step after the '/', or leave the '/' out")
    return LogRef(head, step or None)
