"""Job isolation on the real kernel, as an unprivileged user: a private user + mount
namespace hides the given paths while the job keeps its cwd and the wrapper its log and
receipt (spec README, "Isolation"); and the probe's reasons where it cannot work.

As root the job runs as uid 65534 (nobody); as any other user, as that user. Skipped with
the probe's reason where unprivileged user namespaces are not available.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from qinglong_edge.process.isolation import probe_isolation
from tests.support.cli import unprivileged_python

REPO = pathlib.Path(__file__).resolve().parents[2]
NOBODY = 65534


@pytest.fixture
def world(tmp_path: pathlib.Path) -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    """``(lib, root)``: a root-owned, world-readable copy of the package, and a directory
    owned by the unprivileged user (both outside pytest's 0700 tree)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="qle-isolation-"))
    try:
        base.chmod(0o755)
        lib = base / "lib"
        shutil.copytree(REPO / "qinglong_edge", lib / "qinglong_edge", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO / "tests" / "support" / "isolation_driver.py", lib / "isolation_driver.py")
        for path in [lib, *lib.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        root = base / "root"
        root.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(root, NOBODY, NOBODY)
        yield lib, root
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _drive(lib: pathlib.Path, root: pathlib.Path) -> dict[str, Any]:
    python = unprivileged_python() if os.geteuid() == 0 else sys.executable
    kwargs: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
    proc = subprocess.run([python, "-I", str(lib / "isolation_driver.py"), str(lib), str(root)], capture_output=True,
                          text=True, cwd="/", timeout=120, check=False, env={"PATH": "/usr/bin:/bin"}, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    if not report["probe"]["available"]:
        pytest.skip(f"no job isolation for an unprivileged user here: {report['probe']['reason']}")
    return report


def test_an_isolated_job_cannot_see_hidden_paths_but_writes_its_cwd(world: tuple[pathlib.Path, pathlib.Path]) -> None:
    lib, root = world
    report = _drive(lib, root)
    seen = report["seen"]
    assert report["code"] == 0, report
    assert seen["uid"] == str(os.geteuid() if os.geteuid() != 0 else NOBODY)  # its own uid, not root
    assert seen["journal"] == "hidden"
    assert seen["state_listing"] == "jobs,"  # an empty cover but for the path to its kept cwd
    assert seen["key_bytes"] == "0"  # the private key file reads empty (/dev/null)
    assert seen["anchor"] == "public-anchor"  # what is not hidden stays readable
    assert seen["via_proc"] == "denied"  # the agent's mount view is out of reach ...
    assert seen["agent_environ"] == "denied"  # ... and its environment
    assert seen["cwd"] == "writable" and report["written"]  # the job's write landed in the real cwd
    assert seen["pwd"] == str(root / "state" / "jobs" / "a-1")
    assert seen["umount"] == "refused"  # no capability left after exec
    assert seen["cover"] == "read-only"
    # The wrapper, outside the namespace, wrote the log and the receipt into hidden directories.
    assert report["receipt"] is not None and report["receipt"].endswith(',"exitCode":0}')
    assert (root / "state" / "journal" / "offer.json").read_text() == '{"secret":"journal"}'  # untouched
    assert not (root / "state" / "new").exists()


def test_the_probe_explains_a_missing_ctypes(tmp_path: pathlib.Path) -> None:
    """An interpreter in which ``import ctypes`` fails (as on OpenWrt without python3-ctypes):
    a shim runs the real wrapper with ``sys.modules['ctypes'] = None``."""
    shim = tmp_path / "python-without-ctypes"
    shim.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -I -S -c '\n"
        "import sys\n"
        "sys.modules[\"ctypes\"] = None\n"
        "sys.argv = sys.argv[1:]\n"
        "source = open(sys.argv[0], \"rb\").read()\n"
        "exec(compile(source, sys.argv[0], \"exec\"), {\"__name__\": \"__main__\"})\n"
        "' \"$3\" \"$4\" \"$5\"\n"
    )
    shim.chmod(stat.S_IRWXU)
    probe = probe_isolation(str(tmp_path), python=str(shim))
    assert not probe.available and probe.mechanism == "none" and probe.via == ""
    assert "ctypes module is missing" in probe.reason and "opkg install python3-ctypes" in probe.remedy


def _probe_in_a_user_namespace(tmp_path: pathlib.Path, sysctl: str,
                               fields: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """``probe_isolation`` in a user namespace of its own (``unshare -U -r``) whose
    ``user.<sysctl>`` is 0; it prints the probe's ``fields``, one a line."""
    prints = "; ".join(f"print(p.{field})" for field in fields)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from qinglong_edge.process.isolation import probe_isolation; "
            f"p = probe_isolation(sys.argv[2]); {prints}")
    script = f"echo 0 > /proc/sys/user/{sysctl} && exec {sys.executable} -I -c \"$0\" \"$1\" \"$2\""
    return subprocess.run(["unshare", "-U", "-r", "sh", "-c", script, code, str(REPO), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is not installed")
def test_the_probe_explains_refused_user_namespaces(tmp_path: pathlib.Path) -> None:
    """Inside a user namespace whose user.max_user_namespaces is 0 the kernel refuses the
    job's namespace (ENOSPC): the probe says so instead of claiming isolation."""
    proc = _probe_in_a_user_namespace(tmp_path, "max_user_namespaces", ("available", "reason", "remedy"))
    if "unshare failed" in proc.stderr:
        pytest.skip(f"no user namespace for the test itself: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    available, reason, remedy = proc.stdout.splitlines()[:3]
    assert available == "False"
    assert "user.max_user_namespaces=0" in reason and "No space left on device" in reason
    assert "sysctl -w user.max_user_namespaces" in remedy


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is not installed")
def test_the_probe_falls_back_to_no_pid_namespace_where_the_kernel_refuses_one(tmp_path: pathlib.Path) -> None:
    """Inside a user namespace whose user.max_pid_namespaces is 0 (as systemd's
    RestrictNamespaces= without pid refuses it): the user + mount namespace still works,
    the probe reports the level "none" and why, and jobs are launched that way."""
    proc = _probe_in_a_user_namespace(tmp_path, "max_pid_namespaces", ("available", "pid", "level", "pid_reason"))
    if "unshare failed" in proc.stderr or "max_pid_namespaces" in proc.stderr:
        pytest.skip(f"no such user namespace for the test itself: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    available, pid, level, reason = proc.stdout.splitlines()[:4]
    assert (available, pid, level) == ("True", "none", "none")
    assert "refused a PID namespace" in reason


def test_the_probe_on_a_full_file_system_says_so(tmp_path: pathlib.Path) -> None:
    """Regression (issue 27 soak): with the work directory's file system full, the probe's
    mkdir worked but writing its secret file raised ENOSPC out of ``probe_isolation``, and
    ``doctor`` said ``internal_error: OSError`` (exit 70). The probe reports it instead."""
    from tests.support.mounts import tmpfs

    with tmpfs(tmp_path / "full", "64k") as full:
        with contextlib.suppress(OSError), open(full / "filler", "wb") as handle:
            while True:  # until ENOSPC
                handle.write(b"\0" * 4096)
                handle.flush()
        probe = probe_isolation(str(full))
        assert not probe.available and probe.mechanism == "none"
        assert f"cannot probe in {full}" in probe.reason and "No space left on device" in probe.reason
        assert [p.name for p in full.iterdir()] == ["filler"]  # nothing of the probe is left
