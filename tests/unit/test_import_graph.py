"""The house's import graph, read from the source with ``ast``: no circle, no arrow up.

Every ``import`` counts — at module level and inside functions alike (a function-level import
is a real dependency, only a later one) — except those under ``if TYPE_CHECKING:``, which never
run. Importing ``swamp.a.b`` also runs ``swamp/a/__init__.py``: that arrow counts too.

The layers, lowest first, are what the code is (docs/decisions.md, "Composed in one place"):
a module may import its own layer and the ones below, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import swamp

#: (layer, module prefixes), lowest first. A module belongs to the layer of its longest
#: matching prefix ("swamp.worker.token_sources" before "swamp.worker").
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "swamp",  # the package itself (its version)
            "swamp.errors",
            "swamp.ids",
            "swamp.compat",
            "swamp.concurrency",
            "swamp.hooks",
            "swamp.hostinfo",
            "swamp.processes",
            "swamp.bootstrap",  # stdlib only: it runs on a new machine before swamp is there
        ),
    ),
    ("domain", ("swamp.domain",)),
    ("wire and storage", ("swamp.protocol", "swamp.store", "swamp.tls")),
    (
        "models, repo, clients",
        ("swamp.models", "swamp.repo", "swamp.client", "swamp.demo_driver", "swamp.worker.config"),
    ),
    # the books read the built-in model types; the built-in token sources are a plugin
    ("books and built-in plugins", ("swamp.bookkeeping", "swamp.worker.token_sources")),
    ("plugin manager", ("swamp.plugins",)),
    ("shells", ("swamp.orchestrator", "swamp.worker")),
    ("workflows", ("swamp.workflows",)),
    ("admin operations", ("swamp.admin",)),
    ("web pages", ("swamp.ui",)),  # the pages read the live parts through the admin API
    (
        "composition roots",
        ("swamp.orchestrator.compose", "swamp.orchestrator.server", "swamp.demo"),
    ),
    ("command line", ("swamp.cli",)),
    ("entry point", ("swamp.__main__",)),
]

#: arrows between two packages of one layer that must not exist either
APART = [("swamp.orchestrator", "swamp.worker"), ("swamp.worker", "swamp.orchestrator")]

#: what a pure rule must never touch (no I/O, no trio, no clock of its own)
IMPURE = {
    "asyncio",
    "httpx",
    "hypercorn",
    "os",
    "pluggy",
    "socket",
    "sqlite3",
    "ssl",
    "subprocess",
    "threading",
    "time",
    "trio",
    "trio_websocket",
    "typer",
    "wsproto",
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Module name → (file, is a package), for every module under ``root`` (``swamp/``)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        found[".".join(parts)] = (path, package)
    return found


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all but the ones under ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        visit(node)

    visit(tree)
    return out


def build_graph(root: Path) -> tuple[dict[str, set[str]], set[str]]:
    """(swamp module → the swamp modules it imports, every third-party or stdlib top name
    each imports, as "module:name")."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    outside: set[str] = set()
    for name, (path, package) in modules.items():
        base = name.split(".") if package else name.split(".")[:-1]
        targets: set[str] = set()

        def add(target: str, name: str = name, targets: set[str] = targets) -> None:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target:
                return
            # importing swamp.a.b runs swamp/a/__init__.py first (unless we are inside it)
            parts = target.split(".")
            for end in range(1, len(parts) + 1):
                step = ".".join(parts[:end])
                if step != name and not name.startswith(step + ".") and step in modules:
                    targets.add(step)

        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "swamp":
                        add(alias.name)
                    else:
                        outside.add(f"{name}:{alias.name.split('.')[0]}")
                continue
            if node.level:
                module = ".".join(
                    base[: len(base) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                module = node.module or ""
            if module.split(".")[0] != "swamp":
                outside.add(f"{name}:{module.split('.')[0]}")
                continue
            for alias in node.names:
                full = f"{module}.{alias.name}"
                add(full if full in modules else module)
        graph[name] = targets
    # a package whose __init__ imports nothing of swamp carries no arrow of its own
    empty = {m for m, (_, package) in modules.items() if package and not graph[m]}
    return {m: targets - empty for m, targets in graph.items()}, outside


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for at, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                if prefix == "swamp" and module != "swamp":
                    continue  # the package itself only, not everything in it
                best, best_len = at, len(prefix)
    return best


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow from a module to one of a higher layer (or across APART), as text."""
    out = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(source):
                out.append(
                    f"{source} ({LAYERS[layer_of(source)][0]}) -> {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
            for a, b in APART:
                inside = source == a or source.startswith(a + ".")
                if inside and (target == b or target.startswith(b + ".")):
                    out.append(f"{source} -> {target} (kept apart)")
    return out


GRAPH, OUTSIDE = build_graph(Path(swamp.__file__).parent)


def test_the_graph_is_read_from_every_module():
    assert len(GRAPH) > 100 and "swamp.orchestrator.server" in GRAPH
    # function-level imports count: serve_cmd imports the server inside its command
    assert "swamp.orchestrator.server" in GRAPH["swamp.cli.serve_cmd"]


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if layer_of(m) < 0] == []


def test_no_import_circle():
    assert cycles(GRAPH) == []


def test_no_arrow_up():
    assert upward(GRAPH) == []


def test_nothing_imports_the_command_line_but_the_entry_point():
    assert (
        sorted(
            source
            for source, targets in GRAPH.items()
            if any(t == "swamp.cli" or t.startswith("swamp.cli.") for t in targets)
            and not (source.startswith("swamp.cli") or source == "swamp.__main__")
        )
        == []
    )


def test_the_domain_is_pure():
    """Domain rules import the domain and swamp's errors, and nothing that does I/O."""
    assert (
        sorted(
            f"{source} -> {target}"
            for source, targets in GRAPH.items()
            if source.startswith("swamp.domain")
            for target in targets
            if not (target.startswith("swamp.domain") or target == "swamp.errors")
        )
        == []
    )
    assert (
        sorted(
            pair
            for pair in OUTSIDE
            if pair.startswith("swamp.domain") and pair.split(":")[1] in IMPURE
        )
        == []
    )


def test_the_checks_see_a_circle_and_an_arrow_up():
    """The checks themselves: a made-up circle and a made-up upward arrow are found."""
    graph = {"swamp.domain.a": {"swamp.domain.b"}, "swamp.domain.b": {"swamp.domain.a"}}
    assert cycles(graph) == [["swamp.domain.a", "swamp.domain.b"]]
    assert upward({"swamp.store.x": {"swamp.orchestrator.y"}}) == [
        "swamp.store.x (wire and storage) -> swamp.orchestrator.y (shells)"
    ]


def test_type_only_imports_do_not_count(tmp_path):
    package = tmp_path / "swamp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from swamp import b\n"
    )
    (package / "b.py").write_text("def f():\n    from swamp import a\n")
    graph, _ = build_graph(package)
    assert graph["swamp.a"] == set() and graph["swamp.b"] == {"swamp.a"}
