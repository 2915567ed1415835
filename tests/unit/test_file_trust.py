"""Who could have written a file we are about to run: the pyz's unpack cache and the plugin
directories (the rule; the real files and processes are in tests/integration/test_pyz.py)."""

import pytest

from swamp.domain.file_trust import compiled_from, doubt, lineage, stranger

ME, OTHER = 1000, 1001


@pytest.mark.parametrize(
    "owner,mode,above,expected",
    [
        (ME, 0o40755, False, None),
        (0, 0o40755, False, None),  # root's: root can do anything anyway
        (ME, 0o100644, False, None),
        (ME, 0o40700, False, None),
        (OTHER, 0o40755, False, "belongs to another user (uid 1001)"),
        (OTHER, 0o41777, True, "belongs to another user (uid 1001)"),
        (ME, 0o40775, False, "is writable by its group"),
        (ME, 0o100664, False, "is writable by its group"),
        (ME, 0o40757, False, "is writable by every user"),
        (ME, 0o40777, True, "is writable by its group and every user"),  # above, not sticky
        (0, 0o41777, True, None),  # /tmp above us: others cannot rename or remove our entry
        (0, 0o41777, False, "is writable by its group and every user"),  # but not to use it
    ],
)
def test_doubt(owner, mode, above, expected):
    assert doubt(owner, mode, me=ME, above=above) == expected


def test_lineage():
    assert lineage("/") == ["/"]
    assert lineage("/home/u/.cache/swamp") == [
        "/",
        "/home",
        "/home/u",
        "/home/u/.cache",
        "/home/u/.cache/swamp",
    ]


@pytest.mark.parametrize(
    "relpath,source",
    [
        ("trio/__pycache__/_core.cpython-311.pyc", "trio/_core.py"),
        ("__pycache__/sniffio.cpython-312.pyc", "sniffio.py"),
        ("a/b/__pycache__/m.pypy310.opt-1.pyc", "a/b/m.py"),
        ("trio/_core.cpython-311.pyc", None),  # not in a __pycache__
        ("trio/__pycache__/_core.pyc", None),
        ("trio/__pycache__/_core.cpython-311.so", None),
        ("trio/__pycache__/a.b.c.pyc", None),
        ("trio/__pycache__/.cpython-311.pyc", None),
    ],
)
def test_compiled_from(relpath, source):
    assert compiled_from(relpath) == source


FILES = {"mod.py": 10, "pkg/__init__.py": 0, "pkg/core.py": 20, "pkg-1.0.dist-info/RECORD": 5}
DIRS = {"pkg", "pkg-1.0.dist-info"}


def _tree(*extra):
    entries = [
        ("pkg", "dir", ME, 0o40755, 4096),
        ("pkg-1.0.dist-info", "dir", ME, 0o40755, 4096),
        *((name, "file", ME, 0o100644, size) for name, size in FILES.items()),
    ]
    return entries + list(extra)


def test_the_build_and_its_bytecode_are_at_home():
    assert stranger(_tree(), FILES, DIRS, me=ME) is None
    compiled = [
        ("pkg/__pycache__", "dir", ME, 0o40755, 4096),
        ("pkg/__pycache__/core.cpython-311.pyc", "file", ME, 0o100644, 99),
        ("pkg/__pycache__/core.cpython-313.opt-2.pyc", "file", ME, 0o100644, 99),
        ("__pycache__", "dir", ME, 0o40755, 4096),
        ("__pycache__/mod.cpython-311.pyc", "file", ME, 0o100644, 99),
    ]
    assert stranger(_tree(*compiled), FILES, DIRS, me=ME) is None


@pytest.mark.parametrize(
    "entry,why",
    [
        (("zzz.pth", "file", ME, 0o100644, 9), "was not put there by this build"),
        (("mod.cpython-311-x86_64-linux-gnu.so", "file", ME, 0o100755, 9), "was not put there"),
        (("pkg/extra.py", "file", ME, 0o100644, 9), "was not put there"),
        (("pkg/__pycache__/extra.cpython-311.pyc", "file", ME, 0o100644, 9), "was not put there"),
        (("pkg/sub", "dir", ME, 0o40755, 4096), "was not put there"),
        (("pkg-1.0.dist-info/__pycache__", "dir", ME, 0o40755, 4096), None),  # harmless: empty
        (("pkg/link.py", "other", ME, 0o120777, 9), "is not a plain file or directory"),
        (
            ("pkg/__pycache__/core.cpython-311.pyc", "file", OTHER, 0o100644, 9),
            "belongs to another user (uid 1001)",
        ),
        (("pkg/__pycache__/core.cpython-311.pyc", "file", ME, 0o100666, 9), "writable by"),
    ],
)
def test_anything_else_is_a_stranger(entry, why):
    found = stranger(_tree(entry), FILES, DIRS, me=ME)
    if why is None:
        assert found is None
    else:
        assert found[0] == entry[0] and why in found[1]


def test_a_changed_or_missing_file_or_a_loose_mode_is_named():
    changed = [e if e[0] != "pkg/core.py" else (*e[:4], 21) for e in _tree()]
    assert stranger(changed, FILES, DIRS, me=ME) == (
        "pkg/core.py",
        "has changed since it was unpacked (21 bytes, not 20)",
    )
    missing = [e for e in _tree() if e[0] != "pkg/core.py"]
    assert stranger(missing, FILES, DIRS, me=ME) == ("pkg/core.py", "is missing")
    loose = [e if e[0] != "pkg" else ("pkg", "dir", ME, 0o40777, 4096) for e in _tree()]
    assert stranger(loose, FILES, DIRS, me=ME) == (
        "pkg",
        "is writable by its group and every user",
    )
