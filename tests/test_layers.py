"""Lower layers never import upper ones (spec README, "Layers")."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "qinglong_edge"

# Rank of each top-level part of the package; a module may import only ranks <= its own.
RANK = {
    "contracts": 0,
    "errors": 1,
    "config": 1,
    "filecheck": 1,
    "clock": 1,
    "crashpoints": 1,
    "process": 2,
    "worker": 3,
    "local": 4,
    "execution": 5,
    "doctor": 6,
    "commands": 6,
    "cli": 6,
    "__main__": 6,
    "__init__": 6,
}


def _part(module_path: pathlib.Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "qinglong_edge" and node.level == 0:
            # ``from qinglong_edge import crashpoints`` imports that module
            found += [(node.lineno, "qinglong_edge" if alias.name.startswith("__") else f"qinglong_edge.{alias.name}")
                      for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_respects_layers(path: pathlib.Path) -> None:
    own = _part(path)
    rank = RANK[own]
    for lineno, name in _imports(path):
        top = name.split(".")[0]
        if top == "qinglong_edge":
            parts = name.split(".")
            if len(parts) == 1:
                assert own in ("__init__", "cli", "commands", "__main__"), f"{path}:{lineno}"
                continue
            target = parts[1]
            assert RANK[target] <= rank, f"{path}:{lineno} imports {name} (layer {target} above {own})"
            if own == "contracts":
                assert target == "contracts", f"{path}:{lineno}: contracts imports only contracts"
        else:
            assert top in sys.stdlib_module_names, f"{path}:{lineno}: {name} is not standard library"


SQLITE_FREE = ("contracts", "errors", "config", "filecheck", "clock", "crashpoints", "process", "worker")


@pytest.mark.parametrize(
    "path", [m for m in MODULES if _part(m) in SQLITE_FREE], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_process_core_and_worker_never_import_sqlite(path: pathlib.Path) -> None:
    """The process core serves the pull path too, which stays sqlite-free (spec README, "Layers")."""
    for lineno, name in _imports(path):
        assert name.split(".")[0] != "sqlite3", f"{path}:{lineno} imports sqlite3"
