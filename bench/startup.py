#!/usr/bin/env python3
"""Start-up benchmark of the one file, as a machine runs it (``python3 -I swamp.pyz``, no
``HOME``, no virtualenv):

- **version**: wall time of ``swamp.pyz --version``, warm (the file unpacked once already);
- **enrolled**: a real ``swamp serve`` from the file; then, one after another, workers started
  from the file with environment variables only: the wall time from starting the process to its
  ``enrolled`` line.

Prints one JSON object. Goals (issue 13): version ≤ 250 ms, enrolled ≤ 1 s on loopback.

    python3 build.py bench-startup [--pyz dist/swamp.pyz] [--rounds 20] [--workers 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import percentile

ROOT = Path(__file__).resolve().parent.parent
PYTHON = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin") or sys.executable


def summary(values: list[float]) -> dict:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
        "n": len(values),
    }


def swamp(pyz: Path, *args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-I", str(pyz), *args], env=env, cwd=cwd, capture_output=True, text=True
    )


def version_times(pyz: Path, env: dict, cwd: Path, rounds: int) -> list[float]:
    swamp(pyz, "--version", env=env, cwd=cwd)  # unpacks the file once: later runs are warm
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        done = swamp(pyz, "--version", env=env, cwd=cwd)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            sys.exit(done.stderr)
    return times


def enrolled_times(pyz: Path, env: dict, cwd: Path, workers: int) -> list[float]:
    repo = cwd / "repo"
    swamp(pyz, "init", str(repo), env=env, cwd=cwd)
    serve = subprocess.Popen(
        [PYTHON, "-I", str(pyz), "serve", "--port", "0", "--json", "--repo-dir", str(repo)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    times = []
    try:
        url = json.loads(serve.stdout.readline())["url"]
        made = swamp(
            pyz,
            *("worker", "token", "create", "bench", "--duration", "1h"),
            *("--max-enrollments", str(workers), "--json", "--repo-dir", str(repo)),
            env=env,
            cwd=cwd,
        )
        token = json.loads(made.stdout)["token"]
        for i in range(workers):
            worker_env = {
                **env,
                "SWAMP_ORCHESTRATOR_URL": url,
                "SWAMP_WORKER_TOKEN": token,
                "SWAMP_WORKER_CACHE_DIR": str(cwd / f"cache-{i}"),
            }
            started = time.perf_counter()
            worker = subprocess.Popen(
                [PYTHON, "-I", str(pyz), "worker", "connect", "--json"],
                env=worker_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for line in worker.stdout:
                if '"enrolled"' in line:
                    times.append(time.perf_counter() - started)
                    break
            else:
                sys.exit(f"worker {i} exited before it enrolled")
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=15)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=15)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyz", type=Path, default=ROOT / "dist" / "swamp.pyz")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=5)
    opts = parser.parse_args()
    if not opts.pyz.is_file():
        sys.exit(f"{opts.pyz} does not exist: build it with 'python3 build.py pyz'")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        pyz = cwd / "swamp.pyz"
        shutil.copy(opts.pyz, pyz)
        env = {"PATH": "/usr/bin:/bin", "SHIV_ROOT": str(cwd / "unpacked")}
        result = {
            "python": subprocess.run(
                [PYTHON, "-c", "import sys; print(sys.version.split()[0])"],
                capture_output=True,
                text=True,
            ).stdout.strip(),
            "pyz_bytes": pyz.stat().st_size,
            "version": summary(version_times(pyz, env, cwd, opts.rounds)),
            "enrolled": summary(enrolled_times(pyz, env, cwd, opts.workers)),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
