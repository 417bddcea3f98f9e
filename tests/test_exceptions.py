"""Every exception class of the package is an :class:`EdgeError` (issue 27 item 5).

``qinglong_edge/errors.py`` holds the tree: each class has a stable ``code`` that the CLI maps
to an exit status and the Local API to an HTTP status. This test imports every module of
the package, finds every class deriving from ``BaseException`` defined there, and fails on
one that is neither an ``EdgeError`` nor in :data:`ALLOWED` below (each with its reason).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pickle
import pkgutil

import pytest

import qinglong_edge
from qinglong_edge.errors import EX_TEMPFAIL, EX_USAGE, EdgeError, UsageError, exit_status_for

#: Not EdgeErrors on purpose, each with why. Nothing else belongs here.
ALLOWED: dict[str, str] = {
    "qinglong_edge.worker.delivery.abort.PullAborted":
        "a BaseException so that no `except Exception` on the way swallows a signal's abort; the pull "
        "command catches it and exits by the signal",
    "qinglong_edge.contracts.strictjson._Reject":
        "internal control flow: a fast-path hook leaves the fast path, loads() catches it at once and "
        "locates the problem (a StrictJsonError is what escapes)",
}
#: Modules not walked: the job wrapper is a program of its own (python -I -S, imports nothing
#: of ours, never imported by the agent); its SpecError never leaves its process.
SKIPPED_MODULES = frozenset({"qinglong_edge.process.wrapper", "qinglong_edge.__main__"})


def _modules() -> list[str]:
    names = ["qinglong_edge"]
    for info in pkgutil.walk_packages(qinglong_edge.__path__, "qinglong_edge."):
        if info.name not in SKIPPED_MODULES:
            names.append(info.name)
    return names


def exception_classes() -> dict[str, type[BaseException]]:
    """``module.qualname`` -> class, for every exception class defined in the package."""
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for cls in _classes(module):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def _classes(namespace: object) -> list[type]:
    """The classes in ``namespace`` and, recursively, those nested in them."""
    out = []
    for _, value in inspect.getmembers(namespace, inspect.isclass):
        if value.__module__.startswith("qinglong_edge") and value not in out:
            out.append(value)
            if value.__qualname__.count(".") < 5:
                out += [c for c in _classes(value) if c.__qualname__.startswith(value.__qualname__ + ".")]
    return out


def strays(found: dict[str, type[BaseException]]) -> list[str]:
    return sorted(name for name, cls in found.items() if not issubclass(cls, EdgeError) and name not in ALLOWED)


def test_every_exception_is_an_edge_error() -> None:
    found = exception_classes()
    assert len(found) > 20  # the walk finds the tree (not an empty list passing by itself)
    assert strays(found) == []


def test_the_allow_list_names_only_real_classes() -> None:
    found = exception_classes()
    assert sorted(name for name in ALLOWED if name not in found) == []
    assert all(not issubclass(found[name], EdgeError) for name in ALLOWED)


def test_a_stray_is_caught() -> None:
    """The check can fail: a plain Exception subclass defined in a module of ours is a stray."""
    module = importlib.import_module("qinglong_edge.clock")

    class Stray(Exception):
        pass

    Stray.__module__ = module.__name__
    module.Stray = Stray  # type: ignore[attr-defined]
    try:
        assert strays(exception_classes()) == ["qinglong_edge.clock.test_a_stray_is_caught.<locals>.Stray"]
    finally:
        del module.Stray  # type: ignore[attr-defined]


def test_no_exception_class_hides_in_a_function() -> None:
    """The walk sees module- and class-level classes only: an exception class made inside a
    function would escape it, so none is (a base named like an exception is enough)."""
    package = pathlib.Path(qinglong_edge.__file__).parent
    hidden = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "wrapper.py" and path.parent.name == "process":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ClassDef) and any(
                            ast.unparse(base).split(".")[-1].endswith(("Error", "Exception", "Exit", "Interrupt",
                                                                        "Aborted", "Changed", "Closed", "Exceeded"))
                            for base in inner.bases):
                        hidden.append(f"{path.relative_to(package)}:{inner.lineno} {inner.name}")
    assert hidden == []


def _converted() -> list[tuple[EdgeError, str, int, int | None]]:
    """(error, code, exit status, HTTP status) of each class issue 27 item 5 made an EdgeError."""
    from qinglong_edge.cli import _ArgumentError
    from qinglong_edge.local.exchange import BodyReadError
    from qinglong_edge.worker.ingress.tls_wire import DeadlineExceeded, PeerClosed, SourceChanged

    return [
        (_ArgumentError("unknown option --x", "usage: qinglong-edge ..."), "usage", EX_USAGE, None),
        (BodyReadError("body_truncated"), "body_truncated", 70, 400),
        (BodyReadError("body_timeout"), "body_timeout", 70, 408),
        (BodyReadError("disconnected"), "disconnected", 70, None),
        (DeadlineExceeded("request deadline exceeded"), "deadline_exceeded", EX_TEMPFAIL, None),
        (PeerClosed("peer closed the connection before the response head"), "connection_closed", EX_TEMPFAIL, None),
        (SourceChanged("the source file changed size"), "source_changed", EX_TEMPFAIL, None),
    ]


@pytest.mark.parametrize("index", range(7))
def test_a_converted_class_keeps_its_code_and_statuses(index: int) -> None:
    error, code, exit_status, http_status = _converted()[index]
    assert error.code == code
    assert exit_status_for(error) == exit_status
    assert error.http_status == http_status
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (type(copy), copy.code, copy.message) == (type(error), error.code, error.message)


def test_the_converted_classes_keep_their_builtin_bases() -> None:
    from qinglong_edge.cli import _ArgumentError
    from qinglong_edge.worker.ingress.tls_wire import DeadlineExceeded, PeerClosed

    assert issubclass(_ArgumentError, UsageError)
    assert issubclass(DeadlineExceeded, TimeoutError) and issubclass(PeerClosed, ConnectionError)
    assert DeadlineExceeded("request deadline exceeded").message == "request deadline exceeded"
