"""What the benchmarks share: percentiles, a process's CPU and memory, a scratch directory."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from swamp import __version__
from swamp.protocol.frames import PROTOCOL_VERSION

TICKS = os.sysconf("SC_CLK_TCK")


def enroll_params(token: str, machine_id: str, labels: dict[str, str] | None = None) -> dict:
    """``worker.enroll`` params of a worker spoken by a benchmark (a new process each time)."""
    from swamp.protocol.messages import EnrollRequest

    return EnrollRequest(
        token=token,
        instance_id=str(uuid.uuid4()),
        machine_id=machine_id,
        protocol_version=PROTOCOL_VERSION,
        platform="linux",
        arch="x86_64",
        version=__version__,
        labels=labels or {},
    ).to_json()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def rss_kib(pid: int) -> int:
    """Resident memory of a process (Linux /proc), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary directory for a run's repo and logs; kept (and named on stderr) when
    ``SWAMP_BENCH_KEEP`` is set, removed otherwise."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if os.environ.get("SWAMP_BENCH_KEEP"):
            print(f"kept {root} (logs of every process)", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
