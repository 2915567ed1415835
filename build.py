#!/usr/bin/env python3
"""Project tasks on a fresh machine with nothing but python3 and access to PyPI.

    python3 build.py demo      # run `swamp demo` (the main job)
    python3 build.py test      # run the whole test suite, two processes at a time (add
                               # -m "not integration" for the fast loop: the pure core, the
                               # store, the protocol; seconds; -n 0 for one process)
    python3 build.py lint      # ruff: lint and format check (CI runs it before the tests)
    python3 build.py bench     # dispatch against the floor (bench/floor.py), as ratios
    python3 build.py bench-fleet  # 10,000 idle workers: enrollment rate, idle CPU, memory
    python3 build.py bench-queue  # the queue: decision time, wake on enroll, a backlog drained
    python3 build.py bench-startup  # the pyz: --version, and a worker started to enrolled
    python3 build.py soak      # steps over a fleet under SIGKILLs and a restart (minutes)
    python3 build.py pyz       # dist/swamp.pyz: the one file every machine runs
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


# The pyz's own __main__: before shiv unpacks its site-packages, choose where (shiv's default,
# ~/.shiv, is unusable for a service without a writable HOME), and tell swamp which file it runs
# from (its children are started from the same file; the orchestrator serves it).
LAUNCHER = """\
import os
import sys
import tempfile


def _writable(path):
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def _cache_root():
    for base in (os.environ.get("XDG_CACHE_HOME"), os.path.expanduser("~/.cache")):
        if base and base.startswith("/") and _writable(os.path.join(base, "swamp")):
            return os.path.join(base, "swamp")
    private = os.path.join(tempfile.gettempdir(), "swamp-%d" % os.getuid())
    if _writable(private):
        info = os.lstat(private)
        if info.st_uid == os.getuid() and not info.st_mode & 0o077:
            return private
    sys.exit("swamp.pyz: no private, writable directory to unpack into; set SHIV_ROOT")


os.environ.setdefault("SHIV_ROOT", _cache_root())
os.environ["SWAMP_PYZ"] = os.path.abspath(sys.argv[0])
import _bootstrap  # noqa: E402

_bootstrap.bootstrap()
"""
PYZ_LIMIT = 5 * 1024 * 1024


def build_pyz(target: Path) -> int:
    """dist/swamp.pyz from exactly the runtime versions in constraints.txt: pure Python only,
    reproducible (the same inputs give the same bytes), bytecode compiled on first run."""
    import shutil
    import tomllib
    import zipfile

    build = ROOT / "build" / "pyz"
    site = build / "site-packages"
    shutil.rmtree(build, ignore_errors=True)
    site.mkdir(parents=True)
    pip = [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = ["-c", str(ROOT / "constraints.txt")]
    subprocess.run([*pip, *constraints, "shiv"], check=True)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    subprocess.run(
        [*pip, *constraints, "--no-compile", "--only-binary=:all:", "--target", str(site), *deps],
        check=True,
    )
    subprocess.run(
        [*pip, "--no-deps", "--no-compile", "--upgrade", "--target", str(site), str(ROOT)],
        check=True,
    )
    compiled = [p for p in site.rglob("*") if p.suffix in (".so", ".pyd", ".dylib") and p.is_file()]
    impure = [
        w.parent.name
        for w in site.glob("*.dist-info/WHEEL")
        if "Root-Is-Purelib: true" not in w.read_text()
    ]
    if compiled or impure:
        sys.exit(f"refusing to build: platform-specific content {impure or compiled[:5]}")
    for junk in (site / "bin", *site.rglob("__pycache__")):
        shutil.rmtree(junk, ignore_errors=True)
    raw = build / "shiv.pyz"
    subprocess.run(
        [
            str(PY),
            "-m",
            "shiv",
            "--site-packages",
            str(site),
            "-e",
            "swamp.cli:main",
            "-o",
            str(raw),
            "-p",
            "/usr/bin/env python3",
            "--reproducible",
            "--compile-pyc",
            "--no-modify",
        ],
        check=True,
    )
    target.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(raw) as source, open(target, "wb") as out:
        out.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zipped:
            for info in source.infolist():
                data = LAUNCHER.encode() if info.filename == "__main__.py" else source.read(info)
                zipped.writestr(info, data)
    target.chmod(0o755)
    size = target.stat().st_size
    if size >= PYZ_LIMIT:
        sys.exit(f"{target} is {size} bytes: over the {PYZ_LIMIT}-byte limit")
    print(f"{target} ({size / 1048576:.1f} MiB)")
    return 0


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
        # two processes: the integration tests mostly wait on real processes and sockets
        workers = [] if any(a == "-n" or a.startswith("-n") for a in rest) else ["-n", "2"]
        return run("-m", "pytest", *workers, *rest)
    if task == "lint":
        return run("-m", "ruff", "check", ".", *rest) or run("-m", "ruff", "format", "--check", ".")
    if task == "bench":
        return run(str(ROOT / "bench" / "dispatch.py"), *rest)
    if task == "bench-fleet":
        return run(str(ROOT / "bench" / "fleet.py"), *rest)
    if task == "bench-startup":
        if "--pyz" not in rest and build_pyz(ROOT / "dist" / "swamp.pyz") != 0:
            return 1
        return run(str(ROOT / "bench" / "startup.py"), *rest)
    if task == "bench-queue":
        return run(str(ROOT / "bench" / "elastic_queue.py"), *rest)
    if task == "soak":
        return run(str(ROOT / "bench" / "soak.py"), *rest)
    if task == "pyz":
        return build_pyz(ROOT / "dist" / "swamp.pyz")
    print(f"unknown task {task!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
