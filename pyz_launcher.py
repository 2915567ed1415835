"""The ``__main__`` of swamp.pyz (``build.py pyz`` writes this file into it).

It runs before any of swamp is importable, with nothing but the standard library and the zip
it runs from. It unpacks the build's ``site-packages`` once into a cache directory and runs
swamp from there — but only from a tree that no other user could have written to, because
Python runs whatever it finds in it:

1. **Where.** ``SHIV_ROOT`` if set; else ``$XDG_CACHE_HOME/swamp``, ``~/.cache/swamp``, or
   ``$TMPDIR/swamp-<uid>`` (``/tmp``) when neither can be made (a service without a writable
   ``HOME``). The directory chosen and every directory above it must be ours or root's and not
   writable by group or others (a sticky ``/tmp`` above it is fine): otherwise another user
   could swap the tree after we checked it. An unsafe place is refused, never silently
   replaced by another.
2. **What.** The build writes a manifest into the pyz (``swamp-manifest.json``: every file it
   put in ``site-packages`` with its size, and the directories). Every entry of the unpacked
   tree is checked against it *before* anything in it runs: an extra file (a ``.pth``, which
   ``site`` would execute; an extension module beside a ``.py``, which would win), a changed
   size, a missing file, a symbolic link, or an entry writable by group or others or owned by
   another user, and the pyz refuses to start with one line saying what and where. Python's
   own bytecode (``__pycache__/<module>.<tag>.pyc`` of the build's sources) is allowed.
3. **How.** The tree is put on ``sys.path`` directly — not through ``site.addsitedir``, which
   executes ``.pth`` files — before the interpreter's own site-packages, and swamp's CLI runs.

This replaces shiv's own ``bootstrap()``: it ran ``.pth`` files before its integrity check
and that check hashed only ``*.py`` files (on every start: ≈ 50 ms here). Extraction itself
is still shiv's (``_bootstrap.extract_site_packages``: a lock, a temporary directory, an
atomic rename), done under a umask that keeps group and others from writing.

``SWAMP_PYZ`` tells swamp which file it runs from (its children start from the same file; the
orchestrator serves it) and ``SHIV_ROOT`` is exported, so children unpack nowhere else.

First of all, though, it checks the Python: an older one than the build carries its
dependencies for (``build.py``'s ``PYTHONS``) gets one line saying which Python is needed and
which was found, and exit status 2 — a machine set up wrongly, which a service manager should
not restart — instead of a traceback from deep inside a dependency. So that it can, this file
parses on Python 3.6 (Python compiles a module whole before it runs a line of it; ruff checks
it as 3.7, its oldest target) and imports nothing but ``sys`` before the check (the trust rule
is newer Python).
"""

import sys

NEEDS = (3, 10)

if sys.version_info < NEEDS:
    found = ".".join(str(part) for part in sys.version_info[:3])
    python = sys.executable or "this python"
    needs = ".".join(str(part) for part in NEEDS)
    sys.stderr.write(f"swamp.pyz needs Python {needs} or newer; {python} is {found}\n")
    sys.exit(2)

import os  # noqa: E402 - after the check: nothing runs on a Python it would break on

try:
    import _swamp_file_trust as trust  # swamp/domain/file_trust.py, copied here by build.py
except ImportError:  # imported from a checkout (the tests)
    from swamp.domain import file_trust as trust

MANIFEST = "swamp-manifest.json"
SAFE_UMASK = 0o022


def _refuse(message):
    sys.exit(f"swamp.pyz: {message}")


def _manifest(pyz):
    import json

    loader = globals().get("__loader__")
    if hasattr(loader, "get_data"):  # the zip importer that loaded this file: no second parse
        raw = loader.get_data(MANIFEST)
    else:
        import zipfile

        with zipfile.ZipFile(pyz) as archive:
            raw = archive.read(MANIFEST)
    return json.loads(raw)


def _doubt_above(real):
    """The first directory from ``/`` down to ``real`` (resolved) that another user could
    write to, as ``(path, why)``; None when there is none."""
    me = os.getuid()
    for path in trust.lineage(real):
        info = os.lstat(path)
        reason = trust.doubt(info.st_uid, info.st_mode, me=me, above=path != real)
        if reason:
            return path, reason
    return None


def _candidates():
    explicit = os.environ.get("SHIV_ROOT")
    if explicit:
        return [(os.path.abspath(os.path.expanduser(explicit)), True)]
    bases = (os.environ.get("XDG_CACHE_HOME"), os.path.expanduser("~/.cache"))
    found = [(os.path.join(b, "swamp"), False) for b in bases if b and b.startswith("/")]
    tmp = os.environ.get("TMPDIR") or "/tmp"
    found.append((os.path.join(tmp, f"swamp-{os.getuid()}"), False))
    return found


def _cache_root():
    for path, explicit in _candidates():
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            if explicit:
                _refuse(f"cannot use SHIV_ROOT {path}: {exc.strerror}")
            continue
        if not explicit and not os.access(path, os.W_OK | os.X_OK):
            continue
        real = os.path.realpath(path)
        found = _doubt_above(real)
        if found:
            _refuse(
                f"refusing to unpack into {path}: {found[0]} {found[1]}, so another user could "
                f"put code there (chmod go-w {found[0]} if it is yours, or set SHIV_ROOT to a "
                "directory only you can write)"
            )
        return real
    _refuse("no writable directory to unpack into; set SHIV_ROOT to one only you can write")


def _entries(tree):
    """``(relpath, kind, owner, mode, size)`` of everything under ``tree``, symbolic links
    not followed."""
    import stat

    found = []
    pending = [("", tree)]
    while pending:
        prefix, directory = pending.pop()
        with os.scandir(directory) as listing:
            for entry in listing:
                info = entry.stat(follow_symlinks=False)
                relpath = prefix + entry.name
                if stat.S_ISDIR(info.st_mode):
                    kind = "dir"
                    pending.append((relpath + "/", entry.path))
                else:
                    kind = "file" if stat.S_ISREG(info.st_mode) else "other"
                found.append((relpath, kind, info.st_uid, info.st_mode, info.st_size))
    return found


def _stranger(base, tree, manifest):
    me = os.getuid()
    try:
        for path in (base, tree):
            info = os.lstat(path)
            reason = trust.doubt(info.st_uid, info.st_mode, me=me)
            if reason:
                return f"{path} {reason}"
        entries = _entries(tree)
    except OSError as exc:
        return f"{exc.filename} cannot be read ({exc.strerror})"
    found = trust.stranger(entries, manifest["files"], set(manifest["dirs"]), me=me)
    if found:
        return f"{os.path.join(tree, found[0])} {found[1]}"
    return None


def _unpack(pyz, base):
    import zipfile
    from pathlib import Path

    from _bootstrap import extract_site_packages  # shiv's: a lock, a temp dir, a rename

    with zipfile.ZipFile(pyz) as archive:
        extract_site_packages(archive, Path(base), compile_pyc=True, compile_workers=0)


def main():
    pyz = os.path.abspath(sys.argv[0])
    manifest = _manifest(pyz)
    umask = os.umask(SAFE_UMASK)
    try:
        os.umask(umask | SAFE_UMASK)  # what we create here, group and others cannot write
        root = _cache_root()
        base = os.path.join(root, "swamp-" + manifest["id"])
        tree = os.path.join(base, "site-packages")
        if not os.path.isdir(base):
            try:
                _unpack(pyz, base)
            except OSError as exc:
                _refuse(f"cannot unpack into {root}: {exc.strerror or exc}; set SHIV_ROOT")
        problem = _stranger(base, tree, manifest)
    finally:
        os.umask(umask)
    if problem:
        _refuse(f"refusing to run: {problem}; remove {base} to unpack the build again")
    os.environ["SHIV_ROOT"] = root
    os.environ["SWAMP_PYZ"] = pyz
    at = len(sys.path)
    for index, entry in enumerate(sys.path):
        if os.path.basename(entry) in ("site-packages", "dist-packages"):
            at = index
            break
    sys.path.insert(at, tree)
    from swamp.cli import main as swamp

    sys.exit(swamp())


if __name__ == "__main__":
    main()
