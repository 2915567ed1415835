#!/usr/bin/env python3
"""Project tasks on a fresh machine with nothing but python3 and access to PyPI.

    python3 build.py demo      # run `swamp demo` (the main job)
    python3 build.py test      # run the whole test suite, two processes at a time (add
                               # -m "not integration" for the fast loop: the pure core, the
                               # store, the protocol; seconds; -n 0 for one process)
    python3 build.py lint      # ruff: lint and format check (CI runs it before the tests)
    python3 build.py typecheck  # mypy over swamp/: at its defaults, then --check-untyped-defs
    python3 build.py bench     # dispatch against the floor (bench/floor.py), as ratios
    python3 build.py bench-fleet  # 10,000 idle workers: enrollment rate, idle CPU, memory
    python3 build.py bench-ui     # the web pages at 10,000 workers: page time, one page's CPU
    python3 build.py bench-queue  # the queue: decision time, wake on enroll, a backlog drained
    python3 build.py bench-metrics  # one /metrics scrape at 10,000 workers, by requirements
    python3 build.py bench-workflows  # forEach of 2,500 and 10,000 over 4 workers x 32 slots,
                                      # beside the raw dispatch rate; the store's growth
    python3 build.py bench-pg  # PostgreSQL from trio (swamp.store.pg) against psycopg in threads
    python3 build.py bench-records  # the record store's seam: SQLite beside PostgreSQL
    python3 build.py walk      # the dispatch walk: stays, rooms and climbs of one dispatch
    python3 build.py bench-startup  # the pyz: --version, and a worker started to enrolled
    python3 build.py bench-hostile  # memory under a flood before trust; admin calls under a
                                  # query flood over 600 MB
    python3 build.py soak      # steps over a fleet under SIGKILLs and a restart (minutes)
    python3 build.py pyz       # dist/swamp.pyz: the one file every machine runs
    python3 build.py lock      # refresh constraints.txt from a clean resolve

Each task first makes sure `.venv/` exists and holds exactly the versions in constraints.txt
(re-installing only when pyproject.toml or constraints.txt changed).
"""

from __future__ import annotations

import hashlib
import json
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
    # developing (the tools, the test suite, the build) needs 3.11; the pyz runs on PYTHONS
    if sys.version_info < (3, 11):  # noqa: UP036 - build.py runs on whatever python3 is
        sys.exit(
            f"build.py needs Python 3.11 or newer; this is {sys.version.split()[0]} "
            f"(dist/swamp.pyz itself runs on {PYTHONS[0]} or newer)"
        )
    if not PY.exists():
        print("creating .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if STAMP.exists() and STAMP.read_text() == _fingerprint():
        return
    print("installing dependencies into .venv (pinned by constraints.txt) ...", flush=True)
    pip = [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run(
        [*pip, "-c", str(ROOT / "constraints.txt"), "-e", f"{ROOT}[test,postgres]"], check=True
    )
    STAMP.write_text(_fingerprint())


# The Pythons the pyz runs on (a machine's python3: Ubuntu 22.04's is 3.10). It carries what
# each of them needs, and its launcher refuses anything older than the first in one line.
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# pip resolves as for the oldest of them, and takes only wheels that any Python can run.
PURE_WHEELS = [
    "--only-binary=:all:",
    f"--python-version={PYTHONS[0]}",
    "--implementation=py",
    "--abi=none",
    "--platform=any",
]


def unmet_requirements(dists: list[dict], requirements: list[str], pythons=PYTHONS) -> list[str]:
    """What one of ``pythons`` needs that a resolution does not give it (``dists``: pip's
    report of what it would install, ``{"metadata": {"name", "version", "requires_dist"}}``).

    pip evaluates markers for the Python it runs on, never for ``--python-version``: built on
    3.11, ``exceptiongroup; python_version < "3.11"`` is dropped and the pyz dies on 3.10. So
    the requirements are walked here once per Python, from ``requirements`` (the project's)
    through each distribution's, extras followed; one whose distribution is absent, or at a
    version it does not accept, is returned without its marker, for pip to resolve again.
    Needs ``packaging``."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    by_name = {canonicalize_name(d["metadata"]["name"]): d["metadata"] for d in dists}
    unmet: dict[str, None] = {}
    for python in pythons:
        env = {**default_environment(), "python_version": python}
        env["python_full_version"] = env["implementation_version"] = f"{python}.0"
        seen: set[tuple[str, str]] = set()
        pending = [(Requirement(r), "") for r in requirements]
        while pending:
            req, extra = pending.pop()
            if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
                continue
            name = canonicalize_name(req.name)
            found = by_name.get(name)
            if found is None or not req.specifier.contains(found["version"], prereleases=True):
                req.marker = None
                unmet[str(req)] = None
                continue
            for wanted in ("", *sorted(req.extras)):
                if (name, wanted) not in seen:
                    seen.add((name, wanted))
                    pending += [(Requirement(r), wanted) for r in found.get("requires_dist", [])]
    return list(unmet)


def unsupported(dists: list[dict], pythons=PYTHONS) -> list[str]:
    """``name==version needs Python …`` for each distribution whose Requires-Python leaves out
    one of ``pythons``. Needs ``packaging``."""
    from packaging.specifiers import SpecifierSet

    found = []
    for dist in dists:
        meta = dist["metadata"]
        needs = SpecifierSet(meta.get("requires_python") or "")
        if not all(needs.contains(f"{python}.0", prereleases=True) for python in pythons):
            found.append(f"{meta['name']}=={meta['version']} needs Python {needs}")
    return found


def pyz_pins(constraints: str | None) -> list[str]:
    """``name==version`` of everything the pyz carries, for every Python in PYTHONS: pip's
    resolution of the project's dependencies (pure wheels, within ``constraints``), grown by
    what :func:`unmet_requirements` finds until nothing is unmet. Needs ``packaging``, so it
    runs in a virtualenv (:func:`_pins_in`)."""
    import tempfile
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"]
    wanted = list(requirements)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    limit = ["-c", constraints] if constraints else []
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        for _ in range(10):
            # --target: an older pip takes --platform and the like only with it
            where = ["--target", str(Path(scratch) / "site-packages")]
            resolve = ["--dry-run", "--ignore-installed", *where, "--report", str(report)]
            command = [*pip, *resolve, *PURE_WHEELS, *limit, *wanted]
            if subprocess.run(command, stdout=sys.stderr).returncode != 0:  # stdout: the answer
                loud = [arg for arg in command if arg != "--quiet"]  # to say why
                subprocess.run(loud, stdout=sys.stderr)
                sys.exit(
                    f"refusing to build: pip found no pure-Python set of the dependencies for "
                    f"Python {PYTHONS[0]} (its reasons are above)"
                )
            dists = json.loads(report.read_text())["install"]
            unmet = unmet_requirements(dists, requirements)
            if not unmet:
                break
            wanted += unmet
        else:
            sys.exit(f"refusing to build: still unmet after 10 resolutions: {unmet}")
    refused = unsupported(dists)
    if refused:
        sys.exit(f"refusing to build: {'; '.join(refused)} (the pyz runs on {', '.join(PYTHONS)})")
    return sorted(
        (f"{d['metadata']['name']}=={d['metadata']['version']}" for d in dists), key=str.lower
    )


def _pin_key(line: str) -> str:
    """``Typing_Extensions==4.1`` → ``typing-extensions==4.1`` (a name as PEP 503 compares it)."""
    import re

    name, _, version = line.strip().partition("==")
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


def _pins_in(python: Path, constraints: Path | None) -> list[str]:
    """:func:`pyz_pins`, run by ``python`` (a virtualenv with ``packaging``): the python3 that
    runs build.py may have nothing but the standard library."""
    limit = str(constraints) if constraints else None
    code = f"import build; print(*build.pyz_pins({limit!r}), sep='\\n')"
    ran = subprocess.run([str(python), "-c", code], cwd=ROOT, stdout=subprocess.PIPE)
    if ran.returncode != 0:
        sys.exit(ran.returncode)  # it said why
    return ran.stdout.decode().split()


# The pyz's own __main__ (pyz_launcher.py: where to unpack, and that nobody else wrote there)
# and what it needs beside it in the zip: its copy of the trust rule and the build's manifest.
LAUNCHER = ROOT / "pyz_launcher.py"
TRUST_RULE = ROOT / "swamp" / "domain" / "file_trust.py"
PYZ_LIMIT = 5 * 1024 * 1024


def _manifest(source) -> bytes:
    """What the build puts in site-packages: every file with its size, every directory, and an
    id (a digest of names and contents) that names the directory it is unpacked into. The
    launcher refuses to run from a tree that holds anything else."""
    prefix = "site-packages/"
    files: dict[str, int] = {}
    dirs: set[str] = set()
    digest = hashlib.sha256()
    for info in sorted(source.infolist(), key=lambda i: i.filename):
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        name = info.filename[len(prefix) :]
        files[name] = info.file_size
        parts = name.split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        digest.update(f"{name}\0{hashlib.sha256(source.read(info)).hexdigest()}\n".encode())
    manifest = {"id": digest.hexdigest()[:32], "dirs": sorted(dirs), "files": files}
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()


def build_pyz(target: Path) -> int:
    """dist/swamp.pyz from exactly the runtime versions in constraints.txt: pure Python only,
    reproducible (the same inputs give the same bytes), bytecode compiled on first run."""
    import shutil
    import zipfile

    build = ROOT / "build" / "pyz"
    site = build / "site-packages"
    shutil.rmtree(build, ignore_errors=True)
    site.mkdir(parents=True)
    pip = [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    locked = ROOT / "constraints.txt"
    subprocess.run([*pip, "-c", str(locked), "shiv", "packaging"], check=True)
    pins = _pins_in(PY, locked)
    exact = {_pin_key(line) for line in locked.read_text().splitlines()}
    loose = [pin for pin in pins if _pin_key(pin) not in exact]
    if loose:
        sys.exit(f"refusing to build: not pinned in constraints.txt: {loose} (build.py lock)")
    subprocess.run(
        [*pip, "--no-deps", "--no-compile", *PURE_WHEELS, "--target", str(site), *pins],
        check=True,
    )
    subprocess.run(
        [*pip, "--no-deps", "--no-compile", "--upgrade", "--target", str(site), str(ROOT)],
        check=True,
    )
    compiled = [p for p in site.rglob("*") if p.suffix in (".so", ".pyd", ".dylib") and p.is_file()]
    # the launcher never runs .pth files and allows no symbolic link: none may be in the build
    startup = [p for p in site.rglob("*") if p.suffix == ".pth" or p.is_symlink()]
    if startup:
        sys.exit(f"refusing to build: start-up files or links {startup[:5]}")
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
        ],
        check=True,
    )
    target.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(raw) as source, open(target, "wb") as out:
        out.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zipped:
            stamp = None
            for info in source.infolist():
                main = info.filename == "__main__.py"
                data = LAUNCHER.read_bytes() if main else source.read(info)
                zipped.writestr(info, data)
                stamp = stamp or info
            for name, data in (
                ("_swamp_file_trust.py", TRUST_RULE.read_bytes()),
                ("swamp-manifest.json", _manifest(source)),
            ):
                info = zipfile.ZipInfo(name, date_time=stamp.date_time)
                info.external_attr = 0o100644 << 16
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
        pip = [str(lock_py), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "packaging"], check=True)
        # the pyz's first: the newest versions that run on every Python of PYTHONS, with the
        # backports only the older ones need (pip, on this Python, would leave them out)
        runtime = _pins_in(lock_py, None)
        pinned = lock_env / "pyz-pins.txt"
        pinned.write_text("\n".join(runtime) + "\n")
        subprocess.run([*pip, "-c", str(pinned), f"{ROOT}[test,postgres]", "shiv"], check=True)
        frozen = subprocess.run(
            [str(lock_py), "-m", "pip", "freeze", "--exclude", "swamp"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        have = {_pin_key(line).partition("==")[0] for line in frozen}
        frozen += [pin for pin in runtime if _pin_key(pin).partition("==")[0] not in have]
        header = (
            "# Exact versions the virtualenv and the zipapp are built from (build.py uses "
            "this file).\n# Regenerate with: python3 build.py lock\n"
        )
        lines = sorted(frozen, key=lambda line: _pin_key(line).partition("==")[0])
        (ROOT / "constraints.txt").write_text(header + "\n".join(lines) + "\n")
        print("constraints.txt updated")
        return 0
    ensure_venv()
    if task == "demo":
        return run("-m", "swamp", "demo", *rest)
    if task == "test":
        # two processes: the integration tests mostly wait on real processes and sockets;
        # work stealing, because xdist's default hands each process long runs of tests ahead
        # of time, and one could sit idle for minutes while the other works through its share
        # (measured: one done at 502 s, the other at 1,196 s)
        workers = (
            []
            if any(a == "-n" or a.startswith("-n") for a in rest)
            else ["-n", "2", "--dist", "worksteal"]
        )
        return run("-m", "pytest", *workers, *rest)
    if task == "lint":
        return run("-m", "ruff", "check", ".", *rest) or run("-m", "ruff", "format", "--check", ".")
    if task == "typecheck":
        # twice: the defaults are what a plugin author's editor shows; the bodies of functions
        # without annotations (tests' helpers, callbacks) are checked only by the second
        mypy = ("-m", "mypy")
        return run(*mypy, "swamp", *rest) or run(*mypy, "--check-untyped-defs", "swamp", *rest)
    if task == "bench":
        return run(str(ROOT / "bench" / "dispatch.py"), *rest)
    if task == "bench-fleet":
        return run(str(ROOT / "bench" / "fleet.py"), *rest)
    if task == "bench-ui":
        return run(str(ROOT / "bench" / "ui.py"), *rest)
    if task == "bench-pg":
        return run(str(ROOT / "bench" / "pg_driver.py"), *rest)
    if task == "bench-records":
        return run(str(ROOT / "bench" / "records.py"), *rest)
    if task == "bench-startup":
        if "--pyz" not in rest and build_pyz(ROOT / "dist" / "swamp.pyz") != 0:
            return 1
        return run(str(ROOT / "bench" / "startup.py"), *rest)
    if task == "bench-metrics":
        return run(str(ROOT / "bench" / "metrics.py"), *rest)
    if task == "bench-queue":
        return run(str(ROOT / "bench" / "elastic_queue.py"), *rest)
    if task == "bench-workflows":
        return run(str(ROOT / "bench" / "workflows.py"), *rest)
    if task == "walk":
        return run(str(ROOT / "bench" / "walk.py"), *rest)
    if task == "bench-hostile":
        return run(str(ROOT / "bench" / "hostile.py"), *rest)
    if task == "soak":
        return run(str(ROOT / "bench" / "soak.py"), *rest)
    if task == "pyz":
        return build_pyz(ROOT / "dist" / "swamp.pyz")
    print(f"unknown task {task!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
