"""Run the real CLI in a child process and capture what a user would see.

Two helpers:

* :func:`run_cli`: ``python -m qinglong_edge ARGS`` from this checkout (most CLI tests);
* :class:`Entry`: *how* the CLI is started, for tests that run the same scenario
  through several artefacts (the checkout, the zipapp, an installed launcher, under
  the OpenWrt split simulation). Constructors::

      repo_entry()                                  python -m qinglong_edge (this checkout)
      isolated_entry(script, cwd=..., flags=())     python -I [FLAGS] SCRIPT: a .pyz or an
                                                    installed launcher, nothing of the
                                                    checkout on the path, minimal env
      split_entry(script=None, cwd=..., flags=())   python -I -S -B [FLAGS] -c <OpenWrt split blocker>
                                                    then SCRIPT (runpy) or, without one,
                                                    qinglong_edge.cli.main from sys_path

  ``entry.argv("pull", ...)`` is the full argv, ``entry.environment(extra)`` the
  child's whole environment, ``entry.cwd`` its working directory; ``entry.run(...)``
  and ``entry.popen(...)`` start it.

:func:`agent_imports` reads the ``python -v`` output of such a child (``flags=("-v",)``)
and says which modules of ours it loaded and from where; :func:`assert_agent_loaded_from`
is the check the packaging tests use to prove nothing came from this checkout.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Result:
    status: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, self.stdout
        return json.loads(lines[0])


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            input_bytes: bytes | None = None) -> Result:
    """Run ``python -m qinglong_edge ARGS`` with the repo on the path."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("QINGLONG_EDGE_CONFIG", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "qinglong_edge", *args],
        capture_output=True,
        env=full_env,
        timeout=timeout,
        input=input_bytes,
        check=False,
    )
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@dataclass(frozen=True)
class Entry:
    """One way of starting the real CLI in a child process (see the module docstring).

    Attributes:
        name: for test ids and messages.
        prefix: the argv before the command (interpreter, flags, script or ``-c`` code).
        env: the child's environment (complete: nothing else is inherited).
        cwd: the child's working directory.
        user: run the child as this uid (and gid, no supplementary groups); None: as we are.
    """

    name: str
    prefix: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    cwd: str
    user: int | None = None

    def _identity(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user, "group": self.user, "extra_groups": []}

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, *args]

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**self.env, **(extra or {})}

    def run(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60,
            input_bytes: bytes | None = None) -> Result:
        proc = subprocess.run(self.argv(*args), capture_output=True, env=self.environment(env), cwd=self.cwd,
                              timeout=timeout, input=input_bytes, check=False, **self._identity())
        return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())

    def popen(self, *args: str, env: Mapping[str, str] | None = None, stdout: int | IO[Any] | None = None,
              stderr: int | IO[Any] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(*args), stdout=stdout, stderr=stderr, env=self.environment(env),
                                cwd=self.cwd, **self._identity())


def _without_agent_variables(environ: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in environ.items() if not key.startswith("QINGLONG_EDGE_")}


def repo_entry() -> Entry:
    """``python -m qinglong_edge`` with this checkout first on ``PYTHONPATH`` (cwd: the checkout)."""
    env = _without_agent_variables(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return Entry("checkout", (sys.executable, "-m", "qinglong_edge"), env, REPO)


def _minimal_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def isolated_entry(script: str | os.PathLike[str], *, cwd: str | os.PathLike[str], flags: Sequence[str] = (),
                   python: str | None = None, name: str = "isolated") -> Entry:
    """``python -I [FLAGS] SCRIPT``: a zipapp or an installed launcher, run as a user would.

    ``-I`` ignores ``PYTHON*`` variables and the user site directory and puts neither the
    working directory nor a script's directory on ``sys.path`` (a zipapp's archive still
    goes first); the environment is only ``PATH`` and ``LANG``. ``-I`` still processes
    site-packages: :func:`assert_agent_loaded_from` is how the zipapp tests prove that
    nothing came from this checkout.
    """
    return Entry(name, (python or sys.executable, "-I", *flags, os.fspath(script)), _minimal_env(), os.fspath(cwd))


def split_entry(script: str | os.PathLike[str] | None = None, *, cwd: str | os.PathLike[str] | None = None,
                sys_path: Sequence[str] = (REPO,), flags: Sequence[str] = (), python: str | None = None,
                installed: Sequence[str] | None = None, report: str = "", name: str = "openwrt_split") -> Entry:
    """The CLI under the OpenWrt split simulation (:mod:`tests.support.openwrt_split`).

    ``python -I -S -B [FLAGS] -c CODE ARGS``: CODE installs the blocker for every module of an
    OpenWrt python3 package outside our Depends line, then either runs ``script`` (an
    installed launcher, which puts its own ``../lib/qinglong-edge`` on the path) with
    :func:`runpy.run_path`, or, without a script, ``qinglong_edge.cli.main`` with
    ``sys_path`` first on the path. ``-B``: OpenWrt's Python never writes bytecode.
    ``installed``: the OpenWrt packages present (default: our Depends line). ``report``: a
    file the child writes its refused imports to at exit (``module<TAB>package`` lines).
    """
    from tests.support.openwrt_split import DEPENDS, bootstrap_code

    code = bootstrap_code(DEPENDS if installed is None else installed, report)
    if script is not None:
        path = os.fspath(script)
        code += f"import runpy\nsys.argv[0] = {path!r}\nrunpy.run_path({path!r}, run_name='__main__')\n"
    else:
        code += "".join(f"sys.path.insert({i}, {p!r})\n" for i, p in enumerate(sys_path))
        code += "from qinglong_edge.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = _without_agent_variables(os.environ) if script is None else _minimal_env()
    return Entry(name, (python or sys.executable, "-I", "-S", "-B", *flags, "-c", code), env,
                 os.fspath(cwd) if cwd is not None else (REPO if script is None else "/"))


_IMPORTED = re.compile(r"^import '(qinglong_edge(?:\.[A-Za-z0-9_.]+)?)' # (.*)$", re.MULTILINE)
_ZIPIMPORTER = re.compile(r'^<zipimporter object "(.*)">$')
_CODE_OBJECT = re.compile(r"^# code object from '?(.*?)'?$", re.MULTILINE)


@dataclass(frozen=True)
class AgentImports:
    """What ``python -v`` reported about the ``qinglong_edge`` package.

    Attributes:
        modules: every ``qinglong_edge`` module imported.
        sources: where their code came from: the file of each ``# code object from``
            line below a ``qinglong_edge`` directory, and the archive path of each
            ``zipimporter`` that loaded one of ours.
    """

    modules: frozenset[str]
    sources: frozenset[str]

    def outside(self, prefix: str) -> set[str]:
        """The sources that are not below ``prefix`` (a directory or an archive path)."""
        base = prefix.rstrip("/") + "/"
        return {source for source in self.sources if not source.startswith(base)}


def agent_imports(verbose_stderr: str) -> AgentImports:
    """Parse the stderr of a ``python -v`` child (see :class:`AgentImports`)."""
    modules: set[str] = set()
    sources: set[str] = set()
    for match in _IMPORTED.finditer(verbose_stderr):
        modules.add(match.group(1))
        archive = _ZIPIMPORTER.match(match.group(2))
        if archive:
            sources.add(archive.group(1))
    for match in _CODE_OBJECT.finditer(verbose_stderr):
        if "/qinglong_edge/" in match.group(1):
            sources.add(match.group(1))
    return AgentImports(frozenset(modules), frozenset(sources))


def assert_agent_loaded_from(verbose_stderr: str, location: str | os.PathLike[str], expected: set[str]) -> None:
    """Every ``qinglong_edge`` module a ``-v`` child loaded came from ``location`` (an
    archive or a library directory), ``expected`` modules among them, none from this checkout."""
    imports = agent_imports(verbose_stderr)
    assert expected <= imports.modules, sorted(expected - imports.modules)
    assert imports.sources, "no source of ours reported: was -v in effect?"
    assert imports.outside(os.fspath(location)) == set()
    assert f"{REPO}/qinglong_edge/" not in verbose_stderr


def unprivileged_python() -> str:
    """An interpreter that uid 65534 can execute (pyenv under /root is not).

    Returns the path, or calls ``pytest.skip`` with the reason.
    """
    import pytest

    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(candidate):
            continue
        try:
            proc = subprocess.run(
                [candidate, "-c", "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)"],
                user=65534, group=65534, extra_groups=[], capture_output=True, check=False, cwd="/",
            )
        except PermissionError:
            continue
        if proc.returncode == 0:
            return candidate
    pytest.skip("no Python >= 3.11 executable by an unprivileged user")
    raise AssertionError("unreachable")


def doctor_config(base: pathlib.Path) -> pathlib.Path:
    """The smallest config ``doctor`` and ``admin init`` accept: ``base / "state"`` (0700,
    with an empty 0700 ``pepper`` keyring) and a Local API listener on 127.0.0.1:5700; the
    path of ``base / "config.json"``."""
    state = base / "state"
    state.mkdir(mode=0o700)
    state.chmod(0o700)
    (state / "pepper").mkdir(mode=0o700)
    config = base / "config.json"
    config.write_text(json.dumps({"schema": "qinglong/edge-agent@v1", "stateDirectory": str(state),
                                  "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}}}))
    return config


def benchmark_result(script: str, *args: str, timeout: float) -> dict[str, Any]:
    """Run ``benchmarks/<script> ARGS`` from the checkout; it must exit 0 and print exactly
    one line, the JSON object returned."""
    proc = subprocess.run([sys.executable, f"benchmarks/{script}", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    result: dict[str, Any] = json.loads(lines[0])
    return result
