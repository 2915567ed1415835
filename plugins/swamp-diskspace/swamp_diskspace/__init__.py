"""A third-party fleet-probe seam: ``disk-space``.

Passes when the filesystem holding the worker's cache directory (or, in the orchestrator, its
working directory) has at least ``SWAMP_DISKSPACE_MIN_FREE_MB`` megabytes free (default 1024),
read from the worker's own environment. Install it on the workers — it is discovered through the
``swamp`` entry-point group — and every ``swamp worker verify`` checks it.
"""

from __future__ import annotations

import os
import shutil

from swamp.hooks import hookimpl
from swamp.models.fleet_probe import Seam, SeamFailed

THRESHOLD_ENV = "SWAMP_DISKSPACE_MIN_FREE_MB"
DEFAULT_MIN_FREE_MB = 1024


def _threshold_mb() -> int:
    raw = os.environ.get(THRESHOLD_ENV, str(DEFAULT_MIN_FREE_MB))
    try:
        value = int(raw)
    except ValueError:
        raise SeamFailed(f"{THRESHOLD_ENV}={raw!r} is not a whole number of megabytes") from None
    if value < 0:
        raise SeamFailed(f"{THRESHOLD_ENV} must not be negative")
    return value


async def check_disk_space(ctx, args) -> str:
    where = getattr(ctx, "cache_dir", None) or os.getcwd()
    free_mb = shutil.disk_usage(where).free // (1024 * 1024)
    needed = _threshold_mb()
    if free_mb < needed:
        raise SeamFailed(f"{free_mb} MB free at {where}, below the {needed} MB required")
    return f"{free_mb} MB free at {where} (at least {needed} MB required)"


@hookimpl
def swamp_probe_seams():
    return [Seam("disk-space", check_disk_space, "free disk space where the worker works")]
