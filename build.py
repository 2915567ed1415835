#!/usr/bin/env python3
"""Project tasks on a fresh machine with nothing but python3 and access to PyPI.

    python3 build.py demo      # run `swamp demo` (the main job)
    python3 build.py test      # run the whole test suite (add -m "not integration" for the
                               # fast loop: the pure core, the store, the protocol; seconds)
    python3 build.py lint      # ruff: lint and format check (CI runs it before the tests)
    python3 build.py bench     # run the dispatch benchmark
    python3 build.py bench-queue  # the queue: decision time, wake on enroll, a backlog drained
    python3 build.py soak      # steps over a fleet under SIGKILLs and a restart (minutes)
    python3 build.py lock      # refresh constraints.txt from a clean resolve

Each task first makes sure `.venv/` exists and holds exactly the versions in constraints.txt
(re-installing only when pyproject.toml or constraints.txt changed).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".swamp-installed"


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def ensure_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - build.py runs on whatever python3 is
        sys.exit(f"swamp needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not PY.exists():
        print("creating .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if STAMP.exists() and STAMP.read_text() == _fingerprint():
        return
    print("installing dependencies into .venv (pinned by constraints.txt) ...", flush=True)
    pip = [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-c", str(ROOT / "constraints.txt"), "-e", f"{ROOT}[test]"], check=True)
    STAMP.write_text(_fingerprint())


def run(*args: str) -> int:
    return subprocess.call([str(PY), *args], cwd=ROOT)


def main(argv: list[str]) -> int:
    task = argv[0] if argv else "help"
    rest = argv[1:]
    if task in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    if task == "lock":
        lock_env = ROOT / ".venv-lock"
        venv.EnvBuilder(with_pip=True, clear=True).create(lock_env)
        lock_py = lock_env / BIN.name / PY.name
        subprocess.run(
            [str(lock_py), "-m", "pip", "install", "--quiet", f"{ROOT}[test]", "shiv"], check=True
        )
        frozen = subprocess.run(
            [str(lock_py), "-m", "pip", "freeze", "--exclude", "swamp"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        header = (
            "# Exact versions the virtualenv and the zipapp are built from (build.py uses "
            "this file).\n# Regenerate with: python3 build.py lock\n"
        )
        (ROOT / "constraints.txt").write_text(header + frozen)
        print("constraints.txt updated")
        return 0
    ensure_venv()
    if task == "demo":
        return run("-m", "swamp", "demo", *rest)
    if task == "test":
        return run("-m", "pytest", *rest)
    if task == "lint":
        return run("-m", "ruff", "check", ".", *rest) or run("-m", "ruff", "format", "--check", ".")
    if task == "bench":
        return run(str(ROOT / "bench" / "dispatch.py"), *rest)
    if task == "bench-queue":
        return run(str(ROOT / "bench" / "elastic_queue.py"), *rest)
    if task == "soak":
        return run(str(ROOT / "bench" / "soak.py"), *rest)
    print(f"unknown task {task!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
