"""Syscall order under strace (offer-delivery.md 3.5, field lessons 8).

write(tmp) -> fsync(tmp) -> link/rename -> fsync(dir), and the claim is unlinked only
after the inbox file's directory entry was fsynced. This is what protects against
power loss, which the crash matrix (process kills) cannot simulate. The cycle traced is
a pull that is offered work (claim create, accept, clear); the claim rewrite that
counts an attempt of unknown outcome is traced on its own. That an idle pull makes no
write at all is tests/cli/test_pull_idle_writes.py.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.support.journal_proc import REPO, child_env
from tests.worker import offer_vectors as vectors

_LINE = re.compile(r"^\d+ +(\w+)\((.*)\) += (-?\d+)")
_FD_PATH = re.compile(r"\d+<([^>]*)>")
_NAME = re.compile(r'"([^"]*)"')
TRACED = "openat,write,fsync,fdatasync,link,linkat,rename,renameat,renameat2,unlink,unlinkat"


@dataclass(frozen=True)
class Call:
    name: str
    args: str
    result: int

    @property
    def fd_paths(self) -> list[str]:
        return _FD_PATH.findall(self.args)

    @property
    def names(self) -> list[str]:
        return _NAME.findall(self.args)


def _trace_cycle(tmp_path: pathlib.Path, command: str = "cycle") -> tuple[list[Call], pathlib.Path]:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (CI installs it)")
    root = tmp_path / "journal"
    out = tmp_path / "trace.txt"
    proc = subprocess.run(
        [strace, "-f", "-qq", "-y", "-s", "64", "-e", f"trace={TRACED}", "-o", str(out),
         sys.executable, "-m", "tests.support.journal_child", command, str(root)],
        capture_output=True, env=child_env(), cwd=REPO, timeout=120, check=False,
    )
    if proc.returncode != 0 and b"ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.decode(errors='replace').strip()}")
    assert proc.returncode == 0, proc.stderr.decode()
    calls = []
    for line in out.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match and str(root) in line:
            calls.append(Call(match.group(1), match.group(2), int(match.group(3))))
    return calls, root


def _index(calls: list[Call], predicate, after: int = -1) -> int:  # type: ignore[no-untyped-def]
    for i, call in enumerate(calls):
        if i > after and predicate(call):
            return i
    raise AssertionError("expected syscall not found")


def _publication(calls: list[Call], root: pathlib.Path, commit: str, target_dir: pathlib.Path, *,
                 target: str, size: int, after: int = -1) -> tuple[int, int]:
    """Check one publication; return (index of the commit, index of the dir fsync)."""
    commit_at = _index(calls, lambda c: c.name.startswith(commit) and c.result == 0 and c.names[-1:] == [target]
                       and c.fd_paths[-1:] == [str(target_dir)], after)
    tmp = calls[commit_at].names[0]
    assert tmp.startswith(f".{target}.") and tmp.endswith(".tmp")
    tmp_path = str(root / tmp)
    created = _index(calls, lambda c: c.name == "openat" and c.names[:1] == [tmp] and "O_EXCL" in c.args
                     and "O_NOFOLLOW" in c.args and "O_CREAT" in c.args and "0600" in c.args, after)
    writes = [i for i, c in enumerate(calls) if c.name == "write" and c.fd_paths[:1] == [tmp_path]]
    synced = _index(calls, lambda c: c.name == "fsync" and c.fd_paths == [tmp_path], after)
    assert writes and sum(calls[i].result for i in writes) == size  # the whole record
    assert created < min(writes) and max(writes) < synced < commit_at  # write -> fsync(tmp) -> commit
    dir_synced = _index(calls, lambda c: c.name == "fsync" and c.fd_paths == [str(target_dir)], commit_at)
    between = calls[commit_at + 1 : dir_synced]
    assert not [c for c in between if c.name.startswith(("link", "rename", "unlink")) and not c.names[-1].endswith(".tmp")]
    return commit_at, dir_synced


def test_claim_and_offer_syscall_order(tmp_path: pathlib.Path) -> None:
    calls, root = _trace_cycle(tmp_path)
    offers = root / "offers"
    claim_size = len(vectors.CLAIM_T1000)

    created, created_synced = _publication(calls, root, "link", root, target="pending-claim.json", size=claim_size)
    accepted, accepted_synced = _publication(calls, root, "link", offers, target="offer-1.json",
                                             size=len(vectors.OFFER_RECORD_T1001), after=created_synced)

    clear = _index(calls, lambda c: c.name == "unlinkat" and c.names == ["pending-claim.json"])
    # Only then is the claim cleared: after the inbox entry's directory fsync...
    assert accepted_synced < clear
    # ...and the clear itself is made durable.
    _index(calls, lambda c: c.name == "fsync" and c.fd_paths == [str(root)], clear)
    # Nothing touched the claim by name between its creation and the accept's fsync.
    assert not [c for c in calls[created_synced:accepted_synced] if "pending-claim.json" in c.names
                and c.name != "openat"]
    assert created < accepted
    # This open created the journal, so the hard-link probe ran, once, before the claim.
    probes = [c for c in calls if c.name.startswith("link") and any(".journal-probe" in n for n in c.names)]
    assert len(probes) == 1 and calls.index(probes[0]) < created


def test_counting_an_attempt_rewrites_the_claim_durably(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "journal"
    from tests.support.journal_proc import run_child

    assert run_child("count", str(root)).returncode == 0  # the claim, revision 0 (not traced)
    calls, _ = _trace_cycle(tmp_path, "count")
    _publication(calls, root, "rename", root, target="pending-claim.json", size=len(vectors.CLAIM_T1000))
    # An existing journal is not probed again.
    assert not [c for c in calls if any(".journal-probe" in n for n in c.names)]


def test_temp_files_are_never_created_in_offers(tmp_path: pathlib.Path) -> None:
    calls, root = _trace_cycle(tmp_path)
    creates = [c for c in calls if c.name == "openat" and "O_CREAT" in c.args]
    offers = str(root / "offers")
    assert creates
    assert all(c.fd_paths[:1] != [offers] for c in creates)
