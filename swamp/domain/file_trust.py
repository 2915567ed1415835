"""Could another user have put this file where we are about to run it from?

The rule behind the pyz's unpack cache and the plugin directories. Python runs what it finds:
a module, a compiled ``.pyc`` in ``__pycache__``, an extension module beside a ``.py`` (it wins),
a ``.pth`` file (``site`` executes its ``import`` lines at start-up). So everything on the way to
such a file must be such that only we (or root, who can do anything anyway) could have written
it:

- the file and every directory that holds it are owned by us or root, and neither group nor
  others may write to them (a group-writable file is as good as another user's);
- every directory above is owned by us or root and not writable by others either, except a
  *shared* directory with the sticky bit (``/tmp``): others may create entries in it, but not
  rename or remove ours, so our entry in it is still ours.

Pure: the shells stat the files and ask. This module imports nothing, because the pyz's
launcher — which runs before swamp is unpacked — carries a copy of it (``build.py``).
"""

from __future__ import annotations

ROOT_UID = 0
GROUP_WRITE = 0o020
OTHER_WRITE = 0o002
STICKY = 0o1000


def doubt(owner: int, mode: int, *, me: int, above: bool = False) -> str | None:
    """Why an entry with this owner and mode could hold another user's code, or None when only
    ``me`` (or root) could have written it. ``above``: the entry is a directory above the one
    we use, where a sticky, world-writable directory (``/tmp``) is fine."""
    if owner not in (me, ROOT_UID):
        return f"belongs to another user (uid {owner})"
    writable = mode & (GROUP_WRITE | OTHER_WRITE)
    if not writable or (above and mode & STICKY):
        return None
    if writable == GROUP_WRITE:
        return "is writable by its group"
    if writable == OTHER_WRITE:
        return "is writable by every user"
    return "is writable by its group and every user"


def lineage(path: str) -> list[str]:
    """``/a/b/c`` → ``["/", "/a", "/a/b", "/a/b/c"]``: every directory a resolved absolute
    path goes through, the path itself last."""
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def compiled_from(relpath: str) -> str | None:
    """The source a bytecode cache file stands for: ``pkg/__pycache__/mod.cpython-311.pyc`` (or
    ``….opt-1.pyc``, any interpreter's tag) → ``pkg/mod.py``; None for any other name."""
    head, _, name = relpath.rpartition("/")
    folder, _, cache = head.rpartition("/")
    if cache != "__pycache__" or not name.endswith(".pyc"):
        return None
    parts = name[: -len(".pyc")].split(".")
    if len(parts) == 3 and parts[2].startswith("opt-"):
        parts = parts[:2]
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return f"{folder}/{parts[0]}.py" if folder else f"{parts[0]}.py"


def stranger(
    entries: list[tuple[str, str, int, int, int]],
    files: dict[str, int],
    dirs: set[str],
    *,
    me: int,
) -> tuple[str, str] | None:
    """The first entry of an unpacked build that the build did not put there, and why; None
    when the tree is exactly the build's.

    ``entries``: ``(relpath, kind, owner, mode, size)`` for everything under the tree, ``kind``
    one of ``dir``, ``file``, ``other`` (a symbolic link, a socket …). ``files``: the build's
    files and their sizes; ``dirs``: its directories. Allowed besides them: ``__pycache__``
    directories and the bytecode of the build's ``.py`` files (Python writes them, for any
    interpreter version). Every entry must also pass :func:`doubt`."""
    present = 0
    for relpath, kind, owner, mode, size in entries:
        if kind not in ("dir", "file"):
            return relpath, "is not a plain file or directory"
        reason = doubt(owner, mode, me=me)
        if reason:
            return relpath, reason
        if kind == "dir":
            folder, _, name = relpath.rpartition("/")
            cache = name == "__pycache__" and (not folder or folder in dirs)
            if relpath not in dirs and not cache:
                return relpath, "was not put there by this build"
        else:
            expected = files.get(relpath)
            if expected is None:
                if compiled_from(relpath) not in files:
                    return relpath, "was not put there by this build"
            elif size != expected:
                return relpath, f"has changed since it was unpacked ({size} bytes, not {expected})"
            else:
                present += 1
    if present != len(files):
        seen = {entry[0] for entry in entries}
        return next(name for name in sorted(files) if name not in seen), "is missing"
    return None
