"""The attack matrix (issue 24 item 5): what a hostile job can do, cell by cell, against
what the README says ("What a remote job can do") and docs/worker/remote.md lists ("What
the agent reads back").

One job per (kind, isolation level) tries every cell and prints the results
(:mod:`tests.support.attack_job`); :mod:`tests.support.attack_driver` launches it through
the real launch code as uid 65534, inside a cgroup delegated to that user (a real
envelope: :mod:`tests.support.envelope`), with every path of the table laid out as an
installation has them. The kinds and levels:

* ``remote-isolated``: the isolation the probe finds here (on this project's machines a
  PID namespace with a private /proc);
* ``remote-isolated`` at level ``PID namespace``: the same inside a mount namespace whose
  ``/proc/sys`` is a locked read-only bind, as systemd's ``ProtectKernelTunables=`` makes
  it, so the kernel refuses the job a private /proc (the probe finds and uses the lower
  level);
* ``remote-unisolated``: the launch with isolation off (a device where it cannot work:
  doctor then says so, ``tests/test_doctor.py``);
* ``local``: a Local Run (the operator's own task: trusted, not isolated).

Root only (cgroups with limits, a second user): skipped with the reason elsewhere; CI
(.ci/run) runs as root.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cli import unprivileged_python
from tests.support.envelope import MIB, Envelope, probe

REPO = pathlib.Path(__file__).resolve().parents[1]
NOBODY = 65534
OPERATIONS = ("read", "write", "create", "replace", "symlink", "hardlink")
COLUMNS = {"remote-isolated": 1, "remote-unisolated": 2, "local": 3}
#: Enters the cgroup (root writes its pid) before anything runs, then the command.
_GATE = 'IFS= read -r go || exit 125; [ "$go" = go ] || exit 125; exec "$@" </dev/null'
#: As root, in a private mount namespace: /proc/sys bound read-only over itself (locked for
#: the job's user namespace, as systemd's ProtectKernelTunables= does), then the driver as nobody.
_OVERMOUNT = ('mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && '
              f'exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups "$@"')


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading`` (cells stripped, the header row out)."""
    section = text.split(heading, 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def readme_answers() -> dict[str, list[str]]:
    """README "What a remote job can do": row key (its first cell, backquotes and all) ->
    the answer per column, reduced to its first word (``empty``, ``reads``, ``refused``,
    ``done``)."""
    rows = _table((REPO / "README.md").read_text(), "### What a remote job can do")
    return {row[0]: [cell.split()[0].strip("*,.;:").lower() for cell in row[1:]] for row in rows}


def path_classes() -> dict[str, str]:
    """docs/worker/remote.md "What the agent reads back": path key -> how a remote job is kept out
    (``hidden``, ``read-only`` or ``root's``), from the table's key and third column."""
    rows = _table((REPO / "docs" / "worker" / "remote.md").read_text(), "## What the agent reads back")
    found = {}
    for row in rows:
        key = re.search(r"\(`([a-z_]+)`\)", row[0])
        if key:
            found[key.group(1)] = row[3].split()[0].strip("*,.;:").lower()
    return found


ANSWER = {"empty": "hidden", "reads": "read", "refused": "refused", "done": "done"}


def _expected(answers: dict[str, list[str]], classes: dict[str, str], kind: str, cell: str,
              path: str | None) -> str:
    column = COLUMNS[kind] - 1
    if path == "cgroup_root":  # hidden when isolated, root's otherwise: its own rows
        row = "read /sys/fs/cgroup" if cell == "read" else "write, create, replace, symlink or hard-link /sys/fs/cgroup"
    elif path is not None:
        group = {"hidden": "hidden paths", "read-only": "read-only paths", "root's": "system paths"}[classes[path]]
        row = f"read the {group}" if cell == "read" else f"write, create, replace, symlink or hard-link the {group}"
    else:
        row = cell
    key = next(k for k in answers if k.replace("`", "") == row)
    answer = ANSWER[answers[key][column]]
    if cell.startswith("ptrace") and answer == "done" and _yama() > 0:
        answer = "refused"  # README: "unless Yama's ptrace_scope forbids it"
    return answer


def _yama() -> int:
    try:
        return int(pathlib.Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def world() -> Iterator[pathlib.Path]:
    """A root-owned, world-readable copy of the package and the two scripts."""
    if os.geteuid() != 0:
        pytest.skip("the attack matrix needs root (cgroups with limits, a second user); CI runs as root")
    backend, reason = probe()
    if not backend:
        pytest.skip(reason)
    base = pathlib.Path(tempfile.mkdtemp(prefix="qle-attack-"))
    try:
        base.chmod(0o755)
        lib = base / "lib"
        shutil.copytree(REPO / "qinglong_edge", lib / "qinglong_edge", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("attack_driver.py", "attack_job.py"):
            shutil.copy(REPO / "tests" / "support" / name, lib / name)
        for path in [lib, *lib.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _drive(base: pathlib.Path, kind: str, *, overmount: bool = False) -> dict[str, Any]:
    backend, _ = probe()
    python = unprivileged_python()
    root = base / f"{kind}{'-pidns' if overmount else ''}"
    root.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    envelope = Envelope.create(backend, memory_bytes=1024 * MIB, pids_max=256)
    try:
        agent = envelope.child("agent", owner=(NOBODY, NOBODY))
        argv = [python, "-I", str(base / "lib" / "attack_driver.py"), str(base / "lib"), str(root), kind]
        if overmount:
            command = ["/bin/sh", "-c", _GATE, "gate", "unshare", "-m", "--propagation", "private",
                       "sh", "-c", _OVERMOUNT, "overmount", *argv]
            user: dict[str, Any] = {}
        else:
            command = ["/bin/sh", "-c", _GATE, "gate", *argv]
            user = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, start_new_session=True,
                                **user)
        assert proc.stdin is not None
        for procs in agent.procs_files():
            pathlib.Path(procs).write_text(str(proc.pid))
        stdout, stderr = proc.communicate(b"go\n", timeout=240)
    finally:
        envelope.remove()
    assert proc.returncode == 0, stderr.decode()[-3000:]
    report: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    if "skipped" in report:
        pytest.skip(f"no job isolation for an unprivileged user here: {report['skipped']}")
    return report


def _check(report: dict[str, Any], kind: str) -> None:
    answers, classes = readme_answers(), path_classes()
    cells = {(cell, path): (result, detail) for cell, path, result, detail in report["cells"]}
    assert ("end", None) in cells, report["log_tail"]
    wrong = []
    for (cell, path), (result, detail) in sorted(cells.items(), key=str):
        if cell == "end" or result == "skipped":
            continue
        expected = _expected(answers, classes, kind, cell, path)
        if result != expected:
            wrong.append(f"{cell} {path}: {result} ({detail}), README says {expected}")
    assert wrong == [], "\n".join(wrong)
    # Every path of the table, every operation, every process cell: none left untried.
    tried = {(cell, path) for cell, path in cells}
    missing = [(op, key) for key in classes for op in OPERATIONS if (op, key) not in tried]
    assert missing == [], missing
    rows = {k.replace("`", "") for k in answers}
    assert {cell for cell, path in cells if path is None and cell != "end"} <= rows
    # The allocation past the limit ended as the job's outcome says (issue 24 item 3).
    assert report["reason"] == "out_of_memory", report
    assert report["exit_code"] == 0, report  # the job itself survived its OOM-killed child


def test_an_isolated_remote_job(world: pathlib.Path) -> None:
    report = _drive(world, "remote-isolated")
    _check(report, "remote-isolated")
    # Refused means untouched: what the agent reads back is as it was (the wrapper's own
    # writes, the log and the receipt, are in remote_logs and journal).
    assert set(report["changed"]) <= {"remote_logs", "journal", "receipts"}, report["changed"]


def test_an_isolated_remote_job_without_a_private_proc(world: pathlib.Path) -> None:
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("util-linux unshare and setpriv are needed")
    report = _drive(world, "remote-isolated", overmount=True)
    assert report["level"] == "PID namespace", report["level"]
    _check(report, "remote-isolated")
    assert set(report["changed"]) <= {"remote_logs", "journal", "receipts"}, report["changed"]


def test_a_remote_job_without_isolation(world: pathlib.Path) -> None:
    report = _drive(world, "remote-unisolated")
    _check(report, "remote-unisolated")
    assert {"config", "trust_anchor", "credential", "runtime", "local_database"} <= set(report["changed"])


def test_a_local_run(world: pathlib.Path) -> None:
    report = _drive(world, "local")
    _check(report, "local")
