"""OpenWrt's split python3 packages, simulated in a child interpreter.

OpenWrt ships CPython as ``python3-light`` plus separate packages (packaging.md 3.2:
``python3-openssl`` holds ``_ssl``/``_hashlib``, ``python3-sqlite3`` holds
``sqlite3``, ``python3-email`` holds ``email``...). A module the agent imports that
lives in a package missing from our ``Depends:`` line works here and fails on the
router. This module runs code in a fresh ``python3 -I -S`` whose first statements
install a ``sys.meta_path`` finder that makes every module of a split package that is
not installed raise ``ModuleNotFoundError`` naming the package, exactly as the
missing files would (the method of packaging.md 3.3). ``-S`` keeps ``site`` from
pre-importing modules (pyenv's ``.pth`` files load ``urllib`` and ``lzma``); the
bootstrap refuses to start if a blocked module is already imported.

The table is the openwrt-24.10 split for Python 3.11 (``lang/python/python3/files/
python3-package-*.mk``; 25.12 with 3.13 has the same split). It is a fake of the
router's file set, faithful to those files, because no OpenWrt root can run here.

Public API (what tests call; add new CLI cases through :func:`run_cli_under_split`)::

    DEPENDS                         our control file's Depends packages
    SPLIT_PACKAGES                  split package -> top-level modules it holds
    blocked_modules(installed)      top-level module -> missing package
    bootstrap_code(installed)       Python source: the blocker, for a child's -c
    run_code_under_split(code, installed=DEPENDS, python=None, sys_path=(REPO,), ...)
    run_cli_under_split(args, installed=DEPENDS, python=None, sys_path=(REPO,), ...)
        -> SplitResult(status, stdout, stderr, refused)
    available_pythons()             distinct interpreters >= 3.11 on this machine
    interpreter_without(packages, directory)
                                    a copy of Debian's python3 whose stdlib lacks those
                                    packages' modules (also for the interpreters the agent
                                    starts: the job wrapper), or None

``SplitResult.refused`` lists every ``(module, package)`` import the blocker refused,
including those the code caught (``hashlib`` tries ``_hashlib`` only if present), so a
test can show the blocker was active.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEPENDS",
    "NOT_PACKAGED",
    "PACKAGE_DEPENDS",
    "REPO",
    "SPLIT_PACKAGES",
    "SplitResult",
    "available_pythons",
    "blocked_modules",
    "bootstrap_code",
    "installed_closure",
    "interpreter_without",
    "run_cli_under_split",
    "run_code_under_split",
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: ``Depends:`` of qinglong-edge_*.ipk (packaging.md 3.5), python3-light included.
DEPENDS: tuple[str, ...] = ("python3-light", "python3-openssl", "python3-sqlite3", "python3-urllib", "python3-logging",
                             "python3-ctypes")

#: Split package -> top-level modules it ships (openwrt-24.10, python3-package-*.mk).
SPLIT_PACKAGES: Mapping[str, tuple[str, ...]] = {
    "python3-asyncio": ("asyncio",),
    "python3-cgi": ("cgi",),
    "python3-cgitb": ("cgitb",),
    "python3-codecs": ("_codecs_cn", "_codecs_hk", "_codecs_iso2022", "_codecs_jp",
                       "_codecs_kr", "_codecs_tw", "unicodedata"),
    "python3-ctypes": ("ctypes", "_ctypes"),
    "python3-dbm": ("dbm", "_dbm", "_gdbm"),
    "python3-decimal": ("decimal", "_decimal"),
    "python3-distutils": ("distutils",),
    "python3-email": ("email",),
    "python3-lib2to3": ("lib2to3",),
    "python3-logging": ("logging",),
    "python3-lzma": ("lzma", "_lzma"),
    "python3-multiprocessing": ("multiprocessing", "_multiprocessing"),
    "python3-ncurses": ("curses", "_curses", "_curses_panel"),
    "python3-openssl": ("_ssl", "_hashlib"),
    "python3-pydoc": ("pydoc", "pydoc_data", "doctest"),
    "python3-readline": ("readline",),
    "python3-sqlite3": ("sqlite3", "_sqlite3"),
    "python3-unittest": ("unittest",),
    "python3-urllib": ("urllib",),
    "python3-uuid": ("uuid", "_uuid"),
    "python3-venv": ("venv", "ensurepip"),
    "python3-webbrowser": ("webbrowser",),
    "python3-xml": ("xml", "xmlrpc", "_elementtree", "pyexpat"),
}

#: Split package -> the split packages its own Depends pull in (23.05-25.12).
PACKAGE_DEPENDS: Mapping[str, tuple[str, ...]] = {
    "python3-urllib": ("python3-email",),
    "python3-cgi": ("python3-email",),
    "python3-cgitb": ("python3-cgi", "python3-pydoc"),
    "python3-xml": ("python3-urllib",),
}

#: Never shipped by OpenWrt (python3-light's filespec removes them).
NOT_PACKAGED: tuple[str, ...] = ("idlelib", "tkinter", "_tkinter", "turtledemo", "turtle", "test",
                                 "_osx_support")


def installed_closure(packages: Iterable[str]) -> frozenset[str]:
    """``packages`` plus every split package their Depends pull in."""
    todo = list(packages)
    seen: set[str] = set()
    while todo:
        package = todo.pop()
        if package not in seen:
            seen.add(package)
            todo.extend(PACKAGE_DEPENDS.get(package, ()))
    return frozenset(seen)


def blocked_modules(installed: Iterable[str] = DEPENDS) -> dict[str, str]:
    """Top-level module -> the package that would provide it, for every module not installed."""
    have = installed_closure(installed)
    blocked = dict.fromkeys(NOT_PACKAGED, "(not packaged by OpenWrt)")
    for package, modules in SPLIT_PACKAGES.items():
        if package not in have:
            blocked.update(dict.fromkeys(modules, package))
    return blocked


_BOOTSTRAP = '''
import sys
_QLE_BLOCKED = {blocked!r}
_QLE_REFUSED = []


class _OpenWrtSplit:
    """Refuse modules of OpenWrt python3 packages that are not installed."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        package = _QLE_BLOCKED.get(top)
        if package is None and top.startswith("_test"):
            package = "(not packaged by OpenWrt)"
        if package is None:
            return None
        _QLE_REFUSED.append((name, package))
        raise ModuleNotFoundError(
            "No module named %r (OpenWrt package %s is not installed)" % (name, package), name=name)


_qle_early = sorted(m for m in sys.modules if m.partition(".")[0] in _QLE_BLOCKED)
if _qle_early:
    raise SystemExit("openwrt_split: imported before the blocker: " + ", ".join(_qle_early))
sys.meta_path.insert(0, _OpenWrtSplit())


def _qle_report():
    path = {report!r}
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            for name, package in _QLE_REFUSED:
                handle.write(name + "\\t" + package + "\\n")


import atexit
atexit.register(_qle_report)
del atexit
'''


def bootstrap_code(installed: Iterable[str] = DEPENDS, report: str = "") -> str:
    """Python source that installs the blocker; must run before any other import.

    Args:
        installed: the OpenWrt packages present (their Depends are added).
        report: a file to write the refused imports to at exit (``module\\tpackage``
            lines); empty for none.
    """
    return _BOOTSTRAP.format(blocked=dict(sorted(blocked_modules(installed).items())), report=report)


@dataclass
class SplitResult:
    """What a child under the split simulation did."""

    status: int
    stdout: str
    stderr: str
    refused: list[tuple[str, str]] = field(default_factory=list)


def run_code_under_split(
    code: str,
    *,
    installed: Iterable[str] = DEPENDS,
    python: str | None = None,
    sys_path: Sequence[str] = (REPO,),
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 60,
    input_bytes: bytes | None = None,
) -> SplitResult:
    """Run ``code`` in ``python -I -S -c`` after the blocker, with ``sys_path`` first on sys.path.

    ``env`` replaces the child's environment (default: ours minus PYTHON* and
    QINGLONG_EDGE_CONFIG, which -I ignores anyway for the former).
    """
    with tempfile.NamedTemporaryFile(prefix="qle-split-", suffix=".tsv", delete=False) as handle:
        report = handle.name
    try:
        prelude = bootstrap_code(installed, report)
        paths = "".join(f"sys.path.insert({i}, {p!r})\n" for i, p in enumerate(sys_path))
        child_env = dict(os.environ) if env is None else dict(env)
        child_env.pop("QINGLONG_EDGE_CONFIG", None)
        proc = subprocess.run(
            [python or sys.executable, "-I", "-S", "-c", prelude + paths + code],
            capture_output=True, env=child_env, cwd=cwd or tempfile.gettempdir(),
            timeout=timeout, input=input_bytes, check=False,
        )
        with open(report, encoding="utf-8") as lines:
            refused = [tuple(line.rstrip("\n").split("\t", 1)) for line in lines if line.strip()]
    finally:
        os.unlink(report)
    return SplitResult(
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
        [(name, package) for name, package in refused],
    )


def run_cli_under_split(args: Sequence[str], **kwargs: object) -> SplitResult:
    """Run ``qinglong-edge ARGS`` (``qinglong_edge.cli.main``) under the split simulation.

    Takes the keyword arguments of :func:`run_code_under_split`.
    """
    code = f"from qinglong_edge.cli import main\nsys.exit(main({list(args)!r}))\n"
    return run_code_under_split(code, **kwargs)  # type: ignore[arg-type]


def available_pythons() -> list[str]:
    """Distinct interpreters >= 3.11 here: ours first, then 3.13/3.12/the system's."""
    candidates = [sys.executable]
    for name in ("python3.13", "python3.12", "python3.11"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    pyenv = os.path.expanduser("~/.pyenv/versions")
    if os.path.isdir(pyenv):
        for version in sorted(os.listdir(pyenv), reverse=True):
            candidates.append(os.path.join(pyenv, version, "bin", "python3"))
    candidates += ["/usr/bin/python3"]
    seen: dict[str, str] = {}
    for candidate in candidates:
        try:
            proc = subprocess.run(
                [candidate, "-I", "-S", "-c",
                 "import sys; print('%d.%d.%d' % sys.version_info[:3]) if sys.version_info >= (3, 11) else None"],
                capture_output=True, text=True, timeout=30, check=False,
            )
        except OSError:
            continue
        version = proc.stdout.strip()
        if proc.returncode == 0 and version and version not in seen:
            seen[version] = candidate
    return list(seen.values())


#: What :func:`interpreter_without` copies: Debian's CPython is one static binary (no
#: libpython.so), which finds its standard library from its own location.
BASE_PYTHON = "/usr/bin/python3"

_LAYOUT = (
    "import json, os, sys, sysconfig\n"
    "dynload = os.path.join(sysconfig.get_path('platstdlib'), 'lib-dynload')\n"
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'binary': os.path.realpath(sys.executable),"
    " 'stdlib': sysconfig.get_path('stdlib'), 'dynload': dynload if os.path.isdir(dynload) else ''}))\n"
)


def interpreter_without(packages: Iterable[str], directory: str, python: str = BASE_PYTHON) -> str | None:
    """An interpreter whose standard library lacks the modules of the split ``packages``.

    The meta-path blocker holds in the process it is injected into only; the agent also
    starts interpreters of its own (the job wrapper runs ``sys.executable -I -S``). This
    lays out a router-like Python in ``directory``: ``bin/python3.X`` (a copy of
    ``python``), ``lib/python3.X/`` and its ``lib-dynload/`` as symlinks to the real files,
    minus every module of ``packages``, exactly what the missing ipk leaves out. CPython
    finds that standard library from the copy's location (the ``lib/python3.X/os.py``
    landmark), so it and every interpreter it starts as ``sys.executable`` lack those
    modules. Returns the interpreter, or None when ``python`` cannot be laid out so (it
    is missing, links a shared libpython, or the copy does not lack the modules).
    """
    import json as _json
    import pathlib

    try:
        proc = subprocess.run([python, "-I", "-S", "-c", _LAYOUT], capture_output=True,
                              text=True, timeout=60, check=False)
    except OSError:
        return None
    if proc.returncode != 0:
        return None
    layout = _json.loads(proc.stdout)
    binary = pathlib.Path(layout["binary"])
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=60, check=False)
    if "libpython" in ldd.stdout or not layout["dynload"]:
        return None
    modules = {module for package in packages for module in SPLIT_PACKAGES[package]}
    root = pathlib.Path(directory)
    library = root / "lib" / f"python{layout['version']}"
    (library / "lib-dynload").mkdir(parents=True)
    (root / "bin").mkdir()
    copy = root / "bin" / f"python{layout['version']}"
    shutil.copy2(binary, copy)
    for entry in pathlib.Path(layout["stdlib"]).iterdir():
        top = entry.name.partition(".")[0]
        if entry.name not in ("lib-dynload", "site-packages", "dist-packages", "__pycache__") and top not in modules:
            (library / entry.name).symlink_to(entry)
    for entry in pathlib.Path(layout["dynload"]).iterdir():
        if entry.name.partition(".")[0] not in modules:
            (library / "lib-dynload" / entry.name).symlink_to(entry)
    check = "import importlib.util, sys\nsys.exit(any(importlib.util.find_spec(m) for m in sys.argv[1:]))\n"
    proof = subprocess.run([str(copy), "-I", "-S", "-c", check, *sorted(modules)], capture_output=True,
                           timeout=60, check=False)
    return str(copy) if proof.returncode == 0 else None
