"""Who may import whom: a graph of allowed imports between folders (spec README, "Layers";
docs/architecture.md, "Layers").

Each module belongs to a folder of the package (``worker/journal``, ``local``...) or is a
top-level module (``errors``, ``clock``...); :data:`ALLOWED` names, for each, the folders
its modules may import besides their own. The graph is the code's own: every edge is
used by some import (an unused one fails, so the graph stays as tight as the code), and
it has no cycle between folders. Runtime imports are standard library only; ``process/``
and ``worker/`` never import ``sqlite3``.

To add a folder (or a top-level module): give it a row in :data:`ALLOWED` naming exactly
the folders it imports, add it to the rows of the folders that import it, and give it
its row in docs/architecture.md's folder table (``tests/test_docs.py`` compares the
two). A module added inside an existing folder needs no change here.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "qinglong_edge"

#: Folder (a package path under qinglong_edge/, or a top-level module's name) -> the folders
#: its modules may import besides their own. ``__init__`` is the package itself
#: (``from qinglong_edge import __version__``).
ALLOWED: dict[str, set[str]] = {
    "contracts": set(),
    "clock": set(),
    "crashpoints": set(),
    "errors": {"contracts"},
    "filecheck": {"contracts"},
    "config": {"contracts", "errors"},
    "process": {"contracts", "errors", "clock", "filecheck"},
    "worker/journal": {"contracts", "errors", "config", "clock", "filecheck", "crashpoints"},
    "worker/ingress": {"contracts", "errors", "config", "filecheck"},
    "worker/delivery": {"contracts", "errors", "config", "clock", "crashpoints", "filecheck", "worker/journal",
                        "worker/ingress"},
    "worker/remote": {"contracts", "errors", "config", "clock", "crashpoints", "filecheck", "process",
                      "worker/journal", "worker/delivery"},
    # worker/cycle.py, drain.py, runtime_files.py (and worker/__init__.py): on top of the four wings.
    "worker": {"contracts", "errors", "config", "clock", "filecheck", "worker/journal", "worker/ingress",
               "worker/delivery", "worker/remote"},
    # local/worker_status.py reads the worker's files for edge.worker.get (never execution/).
    "local": {"contracts", "errors", "config", "clock", "crashpoints", "filecheck", "worker/journal",
              "worker/delivery", "worker/remote"},
    "execution": {"contracts", "errors", "config", "clock", "process", "local"},
    "doctor": {"contracts", "errors", "config", "clock", "filecheck", "process", "worker/journal", "worker/ingress",
               "worker/delivery", "worker/remote", "worker", "local"},
    "commands": {"__init__", "contracts", "errors", "config", "clock", "filecheck", "process", "worker/journal",
                 "worker/delivery", "worker/remote", "worker", "local", "execution", "doctor"},
    "cli": {"errors", "commands"},
    "__main__": {"cli"},
    "__init__": set(),
}

#: Modules no chain of imports from local/ may reach: the HTTP side has no PID or signal
#: authority (ADR-0372 decision 6; docs/architecture.md, "local never signals a process").
SIGNALLING = ("qinglong_edge.execution", "qinglong_edge.process.stop", "qinglong_edge.process.spawn",
              "qinglong_edge.process.cgroups")

SQLITE_FREE = ("contracts", "errors", "config", "filecheck", "clock", "crashpoints", "process", "worker")

MODULES = sorted(PACKAGE.rglob("*.py"))


def _folder(path: pathlib.Path) -> str:
    """The :data:`ALLOWED` key a file of the package belongs to (the longest that holds it)."""
    rel = path.relative_to(PACKAGE).as_posix()
    keys = [key for key in ALLOWED if rel == f"{key}.py" or rel.startswith(f"{key}/")]
    assert keys, f"{rel}: its folder is not in tests/test_layers.py ALLOWED (see the module docstring)"
    return max(keys, key=len)


def _module_file(dotted: str) -> pathlib.Path | None:
    """The file of module ``dotted`` (``qinglong_edge.a.b``), or None when it is not one."""
    base = PACKAGE.parent.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``, ``if TYPE_CHECKING`` and function
    bodies included; ``from X import Y`` is module ``X.Y`` when that is a module, else ``X``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                top = node.module.split(".")[0] == "qinglong_edge"
                found.append((node.lineno, child if top and _module_file(child) else node.module))
    return found


def _ours(name: str) -> pathlib.Path:
    """The file of an import of ours (a name inside a module: that module's file)."""
    parts = name.split(".")
    while parts:
        found = _module_file(".".join(parts))
        if found is not None:
            return found
        parts.pop()
    raise AssertionError(f"{name} is not a module of the package")


def _edges() -> dict[tuple[str, str], list[str]]:
    """(folder, imported folder) -> where (``file:line``), for every import between folders."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in MODULES:
        own = _folder(path)
        for lineno, name in _imports(path):
            if name.split(".")[0] != "qinglong_edge":
                continue
            target = _folder(_ours(name))
            if target != own:
                edges.setdefault((own, target), []).append(f"{path.relative_to(PACKAGE)}:{lineno}")
    return edges


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_only_what_its_folder_may(path: pathlib.Path) -> None:
    own = _folder(path)
    for lineno, name in _imports(path):
        if name.split(".")[0] == "qinglong_edge":
            target = _folder(_ours(name))
            assert target == own or target in ALLOWED[own], (
                f"{path}:{lineno} imports {name}: {own} may not import {target} (tests/test_layers.py ALLOWED)")
        else:
            assert name.split(".")[0] in sys.stdlib_module_names, f"{path}:{lineno}: {name} is not standard library"


def test_every_allowed_edge_is_used() -> None:
    """The graph is no wider than the code: an edge no import uses is removed."""
    used = set(_edges())
    unused = sorted((own, target) for own, targets in ALLOWED.items() for target in targets
                    if (own, target) not in used)
    assert unused == [], f"allowed but unused (remove them from ALLOWED): {unused}"


def test_the_graph_has_no_cycle() -> None:
    for own, targets in ALLOWED.items():
        assert own not in targets and targets <= set(ALLOWED), own
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"a cycle between folders: {' -> '.join((*path[path.index(node):], node))}"
        if node in done:
            return
        for target in sorted(ALLOWED[node]):
            visit(target, (*path, node))
        done.add(node)

    for node in sorted(ALLOWED):
        visit(node, ())


def test_local_never_reaches_the_signalling_modules() -> None:
    """No chain of imports from local/ (``TYPE_CHECKING`` and lazy ones included) reaches
    execution/ or the process core's spawn, stop and cgroup modules."""
    start = [p for p in MODULES if _folder(p) == "local"]
    parent: dict[pathlib.Path, pathlib.Path] = {}
    seen, stack = set(start), list(start)
    while stack:
        path = stack.pop()
        for _, name in _imports(path):
            if name.split(".")[0] != "qinglong_edge":
                continue
            target = _ours(name)
            if target not in seen:
                seen.add(target)
                parent[target] = path
                stack.append(target)
    for path in seen:
        dotted = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        if dotted.startswith(SIGNALLING):
            chain = [path]
            while chain[-1] in parent:
                chain.append(parent[chain[-1]])
            pytest.fail(f"local/ reaches {dotted}: " + " <- ".join(str(p.relative_to(PACKAGE)) for p in chain))


@pytest.mark.parametrize(
    "path", [m for m in MODULES if m.relative_to(PACKAGE).parts[0].removesuffix(".py") in SQLITE_FREE],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_process_core_and_worker_never_import_sqlite(path: pathlib.Path) -> None:
    """The process core serves the pull path too, which stays sqlite-free (spec README, "Layers")."""
    for lineno, name in _imports(path):
        assert name.split(".")[0] != "sqlite3", f"{path}:{lineno} imports sqlite3"


if __name__ == "__main__":  # python -m tests.test_layers: the graph today's imports make, to compare with ALLOWED
    derived: dict[str, set[str]] = {key: set() for key in ALLOWED}
    for (own, target), where in sorted(_edges().items()):
        derived[own].add(target)
        print(f"{own} -> {target}: {len(where)} imports, first {where[0]}")
    for key, allowed in ALLOWED.items():
        if derived[key] != allowed:
            print(f"{key}: ALLOWED {sorted(allowed)}, imports {sorted(derived[key])}")
