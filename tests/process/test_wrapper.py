"""The job wrapper on real processes: fds, log cap, truncation fact, receipt, signals,
exec failures, secrets, and the deaths of the wrapper and of its agent.

Every job here is a real command started by :func:`qinglong_edge.process.spawn.start_job`
under the real wrapper program; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from qinglong_edge.process import wrapper
from qinglong_edge.process.logs import read_receipt, read_truncation_fact
from qinglong_edge.process.spawn import HeldJob, JobSpec, Publication, start_job
from tests.support.jobs import alive, command_of, descendants_by_marker, kill_pids, reap
from tests.support.wait import wait_until

REPO = pathlib.Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-value-5b0c1d7e"


def _spec(tmp: pathlib.Path, argv: list[str], **kwargs: object) -> JobSpec:
    env = kwargs.pop("env", {"PATH": "/usr/bin:/bin"})
    cap = kwargs.pop("cap", 1 << 20)
    return JobSpec(argv, env, str(kwargs.pop("cwd", tmp)), str(tmp / "logs" / "job.log"), cap,  # type: ignore[arg-type]
                   **kwargs)  # type: ignore[arg-type]


def _receipt(tmp: pathlib.Path, name: str = "receipt.json") -> Publication:
    return Publication(str(tmp / "receipts" / name), b'{"schemaVersion":1,"attemptId":"a-1","startedAtMs":1000')


def _run(spec: JobSpec, timeout: float = 10) -> int:
    job = start_job(spec)
    job.release()
    return job.process.wait(timeout)


def _log(tmp: pathlib.Path) -> bytes:
    return (tmp / "logs" / "job.log").read_bytes()


def test_the_command_gets_only_fds_0_1_2(tmp_path: pathlib.Path) -> None:
    # The job lists its own /proc/self/fd: besides 0-2 there is only the descriptor of
    # that very listing (the directory ls reads).
    assert _run(_spec(tmp_path, ["/bin/ls", "-l", "/proc/self/fd"])) == 0
    fds = {int(m.group(1)): m.group(2) for m in re.finditer(r" (\d+) -> (\S+)", _log(tmp_path).decode())}
    listing = [fd for fd, target in fds.items() if re.fullmatch(r"/proc/\d+/fd", target)]
    assert set(fds) - set(listing) == {0, 1, 2}, fds
    assert len(listing) == 1
    assert fds[0] == "/dev/null" and fds[1] == fds[2] and fds[1].startswith("pipe:"), fds


def test_a_running_command_holds_only_fds_0_1_2(tmp_path: pathlib.Path) -> None:
    job = start_job(_spec(tmp_path, ["/bin/sleep", "100051"]))
    try:
        job.release()
        command = command_of(job.pid)
        assert command is not None
        assert wait_until(lambda: os.readlink(f"/proc/{command}/exe").endswith("sleep"))
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{command}/fd")) == [0, 1, 2]
        # The wrapper holds the other end of the command's output pipe.
        pipe = os.readlink(f"/proc/{command}/fd/1")
        held = {os.readlink(f"/proc/{job.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{job.pid}/fd")}
        assert pipe in held
    finally:
        reap(job.process)


#: Signals 32 and 33 belong to the C library (NPTL): sigaction() refuses them, so an
#: ignored disposition inherited from far up (a test harness) cannot be reset by anyone.
_LIBC_SIGNALS = (1 << 31) | (1 << 32)


def test_default_dispositions_empty_mask_same_group_and_exact_environment(tmp_path: pathlib.Path) -> None:
    env = {"ONE": "1", "TWO": "two words", "PATH": "/bin"}
    # The agent ignores HUP and USR1 and blocks USR2 when it starts the job: ignored
    # dispositions and the mask survive exec, so the wrapper must reset them for the command.
    previous = [signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.signal(signal.SIGUSR1, signal.SIG_IGN)]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        job = start_job(_spec(tmp_path, ["/bin/cat", "/proc/self/status"], env=env))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})
        signal.signal(signal.SIGUSR1, previous[1])
        signal.signal(signal.SIGHUP, previous[0])
    wrapper_ignored = int(pathlib.Path(f"/proc/{job.pid}/status").read_text().split("SigIgn:\t")[1].split()[0], 16)
    assert wrapper_ignored & (1 << (signal.SIGUSR1 - 1))  # the wrapper did inherit it
    job.release()
    assert job.process.wait(10) == 0
    status = dict(line.split(":\t", 1) for line in _log(tmp_path).decode().splitlines() if ":\t" in line)
    assert int(status["SigBlk"], 16) == 0
    assert int(status["SigIgn"], 16) & ~_LIBC_SIGNALS == 0, status["SigIgn"]
    (tmp_path / "logs" / "job.log").unlink()
    assert _run(_spec(tmp_path, ["/usr/bin/env"], env=env)) == 0
    assert sorted(_log(tmp_path).decode().splitlines()) == sorted(f"{k}={v}" for k, v in env.items())


def test_command_runs_in_the_wrappers_group_and_session(tmp_path: pathlib.Path) -> None:
    job = start_job(_spec(tmp_path, ["/bin/sleep", "100052"]))
    try:
        job.release()
        command = command_of(job.pid)
        assert command is not None
        assert os.getpgid(command) == os.getsid(command) == job.pid == job.identity.pgid
        assert job.identity.pid == job.pid and os.getsid(job.pid) == job.pid
    finally:
        reap(job.process)


def test_log_keeps_the_head_up_to_the_cap_and_counts_the_rest(tmp_path: pathlib.Path) -> None:
    (tmp_path / "logs").mkdir(mode=0o700)
    (tmp_path / "logs" / "job.log").write_bytes(b"x" * 100)  # existing bytes count toward the cap
    (tmp_path / "logs" / "job.log").chmod(0o600)
    fact = Publication(str(tmp_path / "facts" / "fact.json"), b'{"schemaVersion":1,"maximumBytes":1100')
    # 200000 bytes of output, fast: the command must never block on its log.
    script = "import sys\nfor i in range(2000):\n    sys.stdout.write('%099d\\n' % i)\n"
    spec = _spec(tmp_path, [sys.executable, "-I", "-S", "-c", script], cap=1100, truncation_fact=fact,
                 fact_keys=("quotaReached", "keptBytes", "discardedBytes", "observedAtMs"))
    started = time.time_ns() // 1_000_000
    assert _run(spec) == 0
    data = _log(tmp_path)
    assert data == b"x" * 100 + b"".join(b"%099d\n" % i for i in range(10))  # exactly the head
    raw = read_truncation_fact(fact.path)
    assert raw is not None
    parsed = json.loads(raw)
    assert raw.startswith(b'{"schemaVersion":1,"maximumBytes":1100,"quotaReached":true,"keptBytes":1100,'
                          b'"discardedBytes":199000,"observedAtMs":')
    assert started <= parsed["observedAtMs"] <= time.time_ns() // 1_000_000
    assert os.stat(fact.path).st_mode & 0o777 == 0o600


def test_notice_is_appended_once_inside_the_cap(tmp_path: pathlib.Path) -> None:
    notice = b"\n[cut]\n"
    spec = _spec(tmp_path, ["/bin/sh", "-c", "i=0; while [ $i -lt 300 ]; do echo 0123456789; i=$((i+1)); done"],
                 cap=256, log_notice=notice)
    assert _run(spec) == 0
    data = _log(tmp_path)
    assert len(data) == 256 and data.endswith(notice) and data.count(notice) == 1
    assert data[: 256 - len(notice)] == (b"0123456789\n" * 30)[: 256 - len(notice)]


def test_output_under_the_cap_gives_a_fact_without_truncation(tmp_path: pathlib.Path) -> None:
    fact = Publication(str(tmp_path / "facts" / "fact.json"), b'{"a":1')
    assert _run(_spec(tmp_path, ["/bin/echo", "hello"], cap=6, truncation_fact=fact)) == 0  # exactly the cap
    assert _log(tmp_path) == b"hello\n"
    raw = read_truncation_fact(fact.path)
    assert raw is not None and raw.startswith(b'{"a":1,"quotaReached":false,"observedAtMs":') and raw.endswith(b"}")


def test_receipt_content_and_mode(tmp_path: pathlib.Path) -> None:
    receipt = _receipt(tmp_path)
    before = time.time_ns() // 1_000_000
    assert _run(_spec(tmp_path, ["/bin/sh", "-c", "exit 7"], receipt=receipt, started_at_ms=1000)) == 7
    raw = read_receipt(receipt.path)
    assert raw is not None
    match = re.fullmatch(rb'\{"schemaVersion":1,"attemptId":"a-1","startedAtMs":1000,"finishedAtMs":(\d+),"exitCode":7\}',
                         raw)
    assert match and before <= int(match.group(1)) <= time.time_ns() // 1_000_000
    st = os.stat(receipt.path)
    assert st.st_mode & 0o777 == 0o600 and st.st_nlink == 1
    assert sorted(os.listdir(tmp_path / "receipts")) == ["receipt.json"]  # the temp file is gone
    assert os.stat(tmp_path / "receipts").st_mode & 0o777 == 0o700


def test_finished_at_is_clamped_to_started_at(tmp_path: pathlib.Path) -> None:
    future = time.time_ns() // 1_000_000 + 3_600_000  # a start time in the future (clock stepped back)
    receipt = _receipt(tmp_path)
    assert _run(_spec(tmp_path, ["/bin/true"], receipt=receipt, started_at_ms=future)) == 0
    raw = read_receipt(receipt.path)
    assert raw is not None and raw.endswith(f',"finishedAtMs":{future},"exitCode":0}}'.encode())


def _traced(trace: pathlib.Path) -> tuple[list[str], Callable[[str], int]]:
    """The calls an ``strace -o`` file holds (pid prefix dropped), and a function giving the
    index of the first call matching a pattern (it fails, naming both, when none does)."""
    calls = [re.sub(r"^\d+\s+", "", line) for line in trace.read_text().splitlines()]

    def index(pattern: str) -> int:
        found = [i for i, call in enumerate(calls) if re.search(pattern, call)]
        assert found, (pattern, calls)
        return found[0]

    return calls, index


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_publish_order_log_fsync_then_fact_then_receipt(tmp_path: pathlib.Path) -> None:
    """Under strace (attached to the held wrapper): fsync(log) < link(fact) < fsync(its dir)
    < link(receipt) < fsync(its dir), and each publication's temp file was fsynced first."""
    fact = Publication(str(tmp_path / "facts" / "fact.json"), b'{"a":1')
    receipt = _receipt(tmp_path)
    job = start_job(_spec(tmp_path, ["/bin/echo", "out"], truncation_fact=fact, receipt=receipt, started_at_ms=1))
    trace = tmp_path / "trace"
    tracer = subprocess.Popen(["strace", "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync,link,linkat",
                               "-o", str(trace), "-p", str(job.pid)], stderr=subprocess.PIPE, text=True)
    try:
        # strace stops a process to attach: seen in /proc as the tracer pid.
        status = pathlib.Path(f"/proc/{job.pid}/status")
        assert wait_until(lambda: f"TracerPid:\t{tracer.pid}\n" in status.read_text())
        job.release()
        assert job.process.wait(10) == 0
        tracer.wait(10)
    finally:
        tracer.kill()
        tracer.wait()
        reap(job.process)
    calls, index = _traced(trace)

    log_sync = index(r"^fsync\(\d+<.*/logs/job\.log>\)")
    fact_temp_sync = index(r"^fsync\(\d+<.*/facts/\.fact\.json\.[0-9a-f]{32}\.tmp>\)")
    fact_link = index(r'^linkat\(.*"\.fact\.json\.[0-9a-f]{32}\.tmp".*"fact\.json"')
    fact_dir_sync = index(r"^fsync\(\d+<.*/facts>\)")
    receipt_temp_sync = index(r"^fsync\(\d+<.*/receipts/\.receipt\.json\.[0-9a-f]{32}\.tmp>\)")
    receipt_link = index(r'^linkat\(.*"receipt\.json"')
    receipt_dir_sync = index(r"^fsync\(\d+<.*/receipts>\)")
    assert (log_sync < fact_temp_sync < fact_link < fact_dir_sync < receipt_temp_sync < receipt_link
            < receipt_dir_sync), calls


def test_sigterm_to_the_wrapper_is_forwarded_and_143_recorded(tmp_path: pathlib.Path) -> None:
    receipt = _receipt(tmp_path)
    job = start_job(_spec(tmp_path, ["/bin/sleep", "100053"], receipt=receipt, started_at_ms=1))
    try:
        job.release()
        command = command_of(job.pid)
        assert command is not None
        assert wait_until(lambda: os.readlink(f"/proc/{command}/exe").endswith("sleep"))
        os.kill(job.pid, signal.SIGTERM)  # the wrapper alone: it survives and passes it on
        assert job.process.wait(10) == 143
    finally:
        reap(job.process)
    raw = read_receipt(receipt.path)
    assert raw is not None and raw.endswith(b',"exitCode":143}')


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGHUP, 129)], ids=["INT", "HUP"])
def test_int_and_hup_are_forwarded(tmp_path: pathlib.Path, sig: int, code: int) -> None:
    job = start_job(_spec(tmp_path, ["/bin/sleep", "100054"]))
    try:
        job.release()
        command = command_of(job.pid)
        assert command is not None and wait_until(lambda: os.readlink(f"/proc/{command}/exe").endswith("sleep"))
        os.kill(job.pid, sig)
        assert job.process.wait(10) == code
    finally:
        reap(job.process)


def test_a_trapped_term_lets_the_command_finish_its_way(tmp_path: pathlib.Path) -> None:
    receipt = _receipt(tmp_path)
    script = "trap 'echo cleaning; exit 5' TERM; echo ready; while :; do sleep 0.01; done"
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", script], receipt=receipt, started_at_ms=1))
    try:
        job.release()
        assert wait_until(lambda: b"ready" in _log(tmp_path))
        os.kill(job.pid, signal.SIGTERM)  # the wrapper alone, as stop() does: it signals the group
        assert job.process.wait(10) == 5
    finally:
        reap(job.process)
    assert b"cleaning\n" in _log(tmp_path)
    raw = read_receipt(receipt.path)
    assert raw is not None and raw.endswith(b',"exitCode":5}')


def test_leftovers_get_one_term_then_sigkill_also_when_a_stop_comes_meanwhile(tmp_path: pathlib.Path) -> None:
    """The command has exited; a background child of it (in the wrapper's group) traps TERM
    and goes on. The wrapper sends it one TERM, and SIGKILL after the grace; a stop's TERM
    to the wrapper meanwhile adds no second TERM (the one-TERM-per-process rule)."""
    terms, ready = tmp_path / "terms", tmp_path / "ready"
    # The command exits only once its child's trap is set: a TERM before it would end the child.
    script = (f"(trap 'echo TERM >> {terms}' TERM; echo started > {ready}; while :; do sleep 0.01; done) & "
              f"while [ ! -e {ready} ]; do sleep 0.01; done; exit 3")
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", script], terminate_grace_ms=1000))
    try:
        job.release()
        assert wait_until(lambda: terms.exists() and terms.read_text() == "TERM\n")
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(10) == 3  # the wrapper outlived it and kept the command's code
    finally:
        reap(job.process)
    assert terms.read_text() == "TERM\n"


def test_sigkill_of_the_wrapper_publishes_nothing(tmp_path: pathlib.Path) -> None:
    receipt = _receipt(tmp_path)
    fact = Publication(str(tmp_path / "facts" / "fact.json"), b'{"a":1')
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", "echo started; sleep 100055"], receipt=receipt,
                          truncation_fact=fact, started_at_ms=1))
    try:
        job.release()
        assert wait_until(lambda: b"started" in _log(tmp_path))
        os.killpg(job.pid, signal.SIGKILL)
        assert job.process.wait(10) == -signal.SIGKILL
        assert wait_until(lambda: not descendants_by_marker("100055"))
    finally:
        reap(job.process)
        kill_pids(descendants_by_marker("100055"))
    assert read_receipt(receipt.path) is None and read_truncation_fact(fact.path) is None
    assert not os.path.exists(tmp_path / "receipts" / "receipt.json")
    assert os.listdir(tmp_path / "receipts") == []  # no temp file either
    assert _log(tmp_path) == b"started\n"  # what was written before is kept


def test_the_receipt_appears_after_the_agent_is_sigkilled(tmp_path: pathlib.Path) -> None:
    go = tmp_path / "go"
    spec = {
        "argv": ["/bin/sh", "-c", f"echo waiting; while [ ! -e {go} ]; do sleep 0.01; done; echo finished; exit 4"],
        "env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path), "log": str(tmp_path / "logs" / "job.log"),
        "cap": 4096, "receipt": str(tmp_path / "receipts" / "r.json"), "prefix": '{"startedAtMs":5', "started": 5,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    helper = subprocess.Popen([sys.executable, "-m", "tests.support.job_agent", str(tmp_path / "spec.json")],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert helper.stdout is not None
        agent = int(helper.stdout.readline().split()[1])
        job = int(helper.stdout.readline().split()[1])
        assert wait_until(lambda: b"waiting" in _log(tmp_path))
        os.kill(agent, signal.SIGKILL)
        assert helper.stdout.readline().split() == ["exit", str(agent), "-9"]
        assert alive(job) and read_receipt(spec["receipt"]) is None  # the job goes on without its agent
        go.touch()
        assert helper.stdout.readline().split() == ["exit", str(job), "4"]  # the orphaned wrapper's status
        assert helper.stdout.readline().strip() == "done"
    finally:
        helper.kill()
        helper.wait()
    raw = read_receipt(spec["receipt"])
    assert raw is not None and re.fullmatch(rb'\{"startedAtMs":5,"finishedAtMs":\d+,"exitCode":4\}', raw)
    assert _log(tmp_path) == b"waiting\nfinished\n"


def _exec_failure(tmp_path: pathlib.Path, path: pathlib.Path) -> tuple[int, bytes, bytes | None]:
    receipt = _receipt(tmp_path)
    code = _run(_spec(tmp_path, [str(path), "arg"], receipt=receipt, started_at_ms=1))
    return code, _log(tmp_path), read_receipt(receipt.path)


def test_missing_command_is_127_with_a_line_and_a_receipt(tmp_path: pathlib.Path) -> None:
    code, log, receipt = _exec_failure(tmp_path, tmp_path / "no-such-tool")
    assert code == 127
    assert log == f"qinglong-edge: cannot execute {tmp_path}/no-such-tool: No such file or directory\n".encode()
    assert receipt is not None and receipt.endswith(b',"exitCode":127}')


def test_not_executable_is_126(tmp_path: pathlib.Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho never\n")
    tool.chmod(0o600)
    code, log, receipt = _exec_failure(tmp_path, tool)
    assert (code, log) == (126, f"qinglong-edge: cannot execute {tool}: Permission denied\n".encode())
    assert receipt is not None and receipt.endswith(b',"exitCode":126}')


def test_unknown_format_is_126(tmp_path: pathlib.Path) -> None:
    tool = tmp_path / "tool"
    tool.write_bytes(b"\x7fELF garbage, not a program")
    tool.chmod(0o700)
    code, log, _ = _exec_failure(tmp_path, tool)
    assert (code, log) == (126, f"qinglong-edge: cannot execute {tool}: Exec format error\n".encode())


def test_secrets_never_in_argv_environ_or_files(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "seen"
    script = f'[ "$SECRET" = "{SECRET}" ] && echo match > {marker}; exec sleep 100056'
    # The script itself holds the value to compare with, so it goes in a file the job reads
    # (argv of the job is the job's own business; the wrapper's argv is what is checked).
    (tmp_path / "job.sh").write_text(script)
    job = start_job(_spec(tmp_path, ["/bin/sh", str(tmp_path / "job.sh")],
                          env={"PATH": "/usr/bin:/bin", "SECRET": bytearray(SECRET.encode())}))
    needle = SECRET.encode()
    try:
        for proc_file in ("cmdline", "environ"):  # held at the barrier, and after the release
            assert needle not in pathlib.Path(f"/proc/{job.pid}/{proc_file}").read_bytes()
        assert pathlib.Path(f"/proc/{job.pid}/environ").read_bytes() == b""
        job.release()
        assert wait_until(marker.exists)  # the job did get it
        for proc_file in ("cmdline", "environ"):
            assert needle not in pathlib.Path(f"/proc/{job.pid}/{proc_file}").read_bytes()
        # No file the wrapper holds open contains it, nor any file it wrote.
        for fd in os.listdir(f"/proc/{job.pid}/fd"):
            target = os.readlink(f"/proc/{job.pid}/fd/{fd}")
            if target.startswith("/") and os.path.isfile(target):
                assert needle not in pathlib.Path(target).read_bytes(), target
    finally:
        reap(job.process)
    (tmp_path / "job.sh").unlink()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), path


def test_drain_after_the_command_exits_is_bounded(tmp_path: pathlib.Path) -> None:
    """A process that is no descendant of the job (here: this test, through
    ``/proc/<command>/fd/1``) keeps the output pipe open after the command exited: the
    wrapper keeps its output for drain_ms, then exits; the holder is not its to end."""
    go = tmp_path / "go"
    script = f"echo early; while [ ! -e {go} ]; do sleep 0.01; done; exit 3"
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", script], drain_ms=1000))
    holder = -1
    try:
        job.release()
        command = command_of(job.pid)
        assert command is not None and wait_until(lambda: b"early" in _log(tmp_path))
        holder = os.open(f"/proc/{command}/fd/1", os.O_WRONLY | os.O_CLOEXEC)
        started = time.monotonic()
        go.touch()
        assert wait_until(lambda: not alive(command))
        os.write(holder, b"late\n")
        assert job.process.wait(10) == 3
        elapsed = time.monotonic() - started
        assert 1.0 <= elapsed < 5.0  # the full drain was waited, then no longer
        assert _log(tmp_path) == b"early\nlate\n"
    finally:
        if holder >= 0:
            os.close(holder)
        reap(job.process)


# -- the child subreaper: what the job leaves behind is ended before the receipt --------------


def _pid_in(path: pathlib.Path) -> int:
    assert wait_until(lambda: path.exists() and path.read_text().strip().isdigit())
    return int(path.read_text())


def _gone(pid: int) -> bool:
    """No such process any more (reaped, not a zombie waiting for a parent)."""
    return not os.path.exists(f"/proc/{pid}")


def test_the_wrapper_is_a_child_subreaper(tmp_path: pathlib.Path) -> None:
    """An orphan of the job re-parents to the wrapper, not to init (and is reaped by it)."""
    pid_file, go = tmp_path / "pid", tmp_path / "go"
    script = f"(setsid sh -c 'echo $$ > {pid_file}; while [ ! -e {go} ]; do sleep 0.01; done' &); exec sleep 100058"
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", script]))
    try:
        job.release()
        orphan = _pid_in(pid_file)
        stat = pathlib.Path(f"/proc/{orphan}/stat").read_bytes().rpartition(b")")[2].split()
        assert wait_until(lambda: int(pathlib.Path(f"/proc/{orphan}/stat").read_bytes()
                                      .rpartition(b")")[2].split()[1]) == job.pid)
        assert int(stat[2]) != job.pid  # its own session and group: no killpg reaches it
        go.touch()
        assert wait_until(lambda: _gone(orphan))  # exited and reaped by the wrapper: no zombie left
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(10) == 143
    finally:
        reap(job.process)


def test_a_setsid_escapee_is_ended_when_the_job_completes(tmp_path: pathlib.Path) -> None:
    """(a) Regression: with no cgroup a ``setsid`` child outlived the job's completion."""
    receipt, pid_file = _receipt(tmp_path), tmp_path / "pid"
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", f"setsid sleep 300 & echo $! > {pid_file}; echo done"],
                          receipt=receipt, started_at_ms=1))
    escaped = 0
    try:
        job.release()
        assert job.process.wait(10) == 0
        escaped = _pid_in(pid_file)
        assert _gone(escaped), "the escaped child outlived the job's receipt"
    finally:
        reap(job.process)
        if not _gone(escaped):
            os.kill(escaped, signal.SIGKILL)
    raw = read_receipt(receipt.path)
    assert raw is not None and raw.endswith(b',"exitCode":0}')  # the command's code, not the leftover's
    assert _log(tmp_path) == b"done\n"


def test_a_double_forked_setsid_escapee_ignoring_term_is_killed_after_the_grace(tmp_path: pathlib.Path) -> None:
    """(c) A double fork, then setsid, then TERM ignored: SIGKILL after the wrapper's
    grace, reaped, and only then the receipt (with the command's exit code)."""
    receipt, pid_file = _receipt(tmp_path), tmp_path / "pid"
    inner = f"trap '' TERM; echo $$ > {pid_file}; exec sleep 100059"
    script = f"( setsid sh -c \"{inner}\" & ); while [ ! -s {pid_file} ]; do sleep 0.01; done; exit 4"
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", script], receipt=receipt, started_at_ms=1,
                          terminate_grace_ms=300, kill_grace_ms=1000))
    try:
        started = time.monotonic()
        job.release()
        assert job.process.wait(10) == 4
        assert time.monotonic() - started >= 0.3  # the TERM was ignored: the grace was waited
        escaped = _pid_in(pid_file)
        assert _gone(escaped) and not descendants_by_marker("100059")
    finally:
        reap(job.process)
        kill_pids(descendants_by_marker("100059"))
    raw = read_receipt(receipt.path)
    assert raw is not None and raw.endswith(b',"exitCode":4}')


def test_a_stop_reaches_a_setsid_escapee_exactly_once(tmp_path: pathlib.Path) -> None:
    """(b) A TERM to the wrapper (how stop() stops a job) reaches the escapee too, once;
    the wrapper waits for it, then writes the receipt."""
    from tests.process.test_stop import _PY_COUNTER, _terms

    receipt, counted, ready = _receipt(tmp_path), tmp_path / "terms", tmp_path / "ready"
    counter = shlex.join([sys.executable, "-I", "-S", "-c", _PY_COUNTER, str(counted), str(ready)])
    job = start_job(_spec(tmp_path, ["/bin/sh", "-c", f"setsid {counter} & exec sleep 100060"],
                          receipt=receipt, started_at_ms=1))
    try:
        job.release()
        assert wait_until(ready.exists, timeout=30)
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(20) == 143
        assert _terms(counted) == 1  # the counter exits 0.5 s after its first TERM
    finally:
        reap(job.process)
    raw = read_receipt(receipt.path)
    assert raw is not None and raw.endswith(b',"exitCode":143}')


def test_the_wrapper_is_named_in_ps(tmp_path: pathlib.Path) -> None:
    job = start_job(_spec(tmp_path, ["/bin/true"], label="attempt-42"))
    try:
        argv = pathlib.Path(f"/proc/{job.pid}/cmdline").read_bytes().split(b"\0")[:-1]
        assert argv[1:3] == [b"-I", b"-S"] and re.fullmatch(rb"/proc/self/fd/\d+", argv[3])
        assert argv[4:] == [b"qinglong-edge-job", b"attempt-42"]
        assert pathlib.Path(f"/proc/{job.pid}/comm").read_bytes() == b"qinglong-job\n"
        # The wrapper closed its source descriptor.
        assert argv[3].rsplit(b"/", 1)[1].decode() not in os.listdir(f"/proc/{job.pid}/fd")
    finally:
        job.abort()


def test_a_job_exceeding_no_limit_still_starts_from_a_pipe_source(tmp_path: pathlib.Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Where memfd_create is unavailable the source goes through a pipe."""
    import qinglong_edge.process.spawn as spawn_module

    monkeypatch.setattr(spawn_module, "USE_MEMFD", False)
    job = start_job(_spec(tmp_path, ["/bin/echo", "piped"]))
    assert os.readlink(f"/proc/{job.pid}/exe")  # alive, held
    job.release()
    assert job.process.wait(10) == 0 and _log(tmp_path) == b"piped\n"


def test_pure_helpers() -> None:
    assert wrapper.receipt_suffix(12, 0) == b',"finishedAtMs":12,"exitCode":0}'
    assert wrapper.fact_suffix(("observedAtMs", "quotaReached"), truncated=True, observed_ms=3, kept=1,
                               discarded=2) == b',"observedAtMs":3,"quotaReached":true}'
    assert [wrapper.exit_code(s) for s in (0, 3 << 8, signal.SIGTERM, signal.SIGKILL)] == [0, 3, 143, 137]
    assert wrapper.encode_frame(b"argv", b"a b") == b"argv 3\na b\n"


def _held(tmp_path: pathlib.Path) -> HeldJob:
    return start_job(_spec(tmp_path, ["/bin/true"]))


def test_release_after_the_wrapper_died_is_a_launch_failure(tmp_path: pathlib.Path) -> None:
    from qinglong_edge.errors import ExecutionError

    job = _held(tmp_path)
    os.kill(job.pid, signal.SIGKILL)
    job.process.wait(5)
    with pytest.raises(ExecutionError) as info:
        job.release()
    assert info.value.code == "spawn_failed"


def test_a_refused_fork_is_126_with_a_line_and_a_receipt(cgroup_manager: object, tmp_path: pathlib.Path) -> None:
    """pids.max = 1 leaves room for the wrapper only: its fork of the command is refused."""
    from qinglong_edge.contracts.ids import new_uuid4
    from qinglong_edge.process.cgroups import CgroupManager

    assert isinstance(cgroup_manager, CgroupManager)
    pids = [h for h in cgroup_manager.hierarchies if h.kind == "pids"]
    if not pids:
        pytest.skip("no v1 pids hierarchy on this machine")
    group = CgroupManager(pids, pids_max=1).create(f"test-{new_uuid4()}")
    assert group is not None
    receipt = _receipt(tmp_path)
    try:
        job = start_job(_spec(tmp_path, ["/bin/true"], receipt=receipt, started_at_ms=1), cgroup=group)
        job.release()
        assert job.process.wait(10) == 126
    finally:
        group.kill()
        assert wait_until(group.remove)
    assert _log(tmp_path) == b"qinglong-edge: cannot start /bin/true: Resource temporarily unavailable\n"
    raw = read_receipt(receipt.path)
    assert raw is not None and raw.endswith(b',"exitCode":126}')


def test_a_remote_shaped_job_publishes_what_the_remote_contracts_accept(tmp_path: pathlib.Path) -> None:
    """The prefixes the contracts build, the wrapper's suffixes, the contracts' parsers."""
    from qinglong_edge.contracts.receipt import (
        log_artifact_id,
        log_file_names,
        new_callback_token,
        parse_receipt,
        parse_truncation_fact,
        receipt_file_names,
        receipt_prefix,
        truncation_fact_prefix,
    )

    run_id, attempt_id = "run-0001", "att-0001"
    log_id = log_artifact_id("proj-1", run_id, attempt_id, "offer-0001")
    names = log_file_names(log_id)
    shard, receipt_name = receipt_file_names(attempt_id)
    token = new_callback_token()
    started = time.time_ns() // 1_000_000
    prefix = receipt_prefix(run_id=run_id, attempt_id=attempt_id, callback_sequence=1, token=token,
                            started_at_ms=started)
    log_dir = tmp_path / "logs" / names.shard
    spec = JobSpec(["/bin/sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x; exit 2"], {"PATH": "/usr/bin:/bin"},
                   str(tmp_path), str(log_dir / names.log), 4096,
                   truncation_fact=Publication(str(log_dir / names.truncation_fact), truncation_fact_prefix(
                       run_id=run_id, attempt_id=attempt_id, log_artifact_id=log_id, maximum_bytes=4096)),
                   receipt=Publication(str(tmp_path / "receipts" / shard / receipt_name), prefix),
                   started_at_ms=started, label=attempt_id)
    assert _run(spec) == 2
    prefix[:] = bytes(len(prefix))  # the caller wipes its token copy once the wrapper has it
    assert (log_dir / names.log).read_bytes() == b"x" * 4096  # the raw head, no notice
    fact = read_truncation_fact(str(log_dir / names.truncation_fact))
    assert fact is not None
    assert parse_truncation_fact(fact, run_id=run_id, attempt_id=attempt_id, log_artifact_id=log_id,
                                 maximum_bytes=4096) is True
    raw = read_receipt(str(tmp_path / "receipts" / shard / receipt_name))
    assert raw is not None
    receipt = parse_receipt(raw)
    assert (receipt.run_id, receipt.attempt_id, receipt.callback_sequence, receipt.exit_code) == (run_id, attempt_id,
                                                                                                  1, 2)
    assert receipt.started_at_ms == started <= receipt.finished_at_ms
    assert os.stat(tmp_path / "receipts" / shard).st_mode & 0o777 == 0o700


def test_without_ctypes_the_wrapper_is_no_subreaper_and_says_so_by_returning_false() -> None:
    """No ``_ctypes`` (OpenWrt without python3-ctypes): :func:`become_subreaper` is False,
    without an exception, and the wrapper goes on as before. In a child interpreter: the
    prctl would make this test process a subreaper."""
    script = ("import importlib.util, sys\n"
              "sys.modules['_ctypes'] = None\n"
              "spec = importlib.util.spec_from_file_location('w', sys.argv[1])\n"
              "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
              "print(w.become_subreaper())\n")
    source = str(REPO / "qinglong_edge" / "process" / "wrapper.py")
    blocked = subprocess.run([sys.executable, "-I", "-S", "-c", script, source], capture_output=True, check=True)
    assert blocked.stdout == b"False\n"
    allowed = subprocess.run([sys.executable, "-I", "-S", "-c", script.replace("sys.modules['_ctypes'] = None\n", ""),
                              source], capture_output=True, check=True)
    assert allowed.stdout == b"True\n"


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_directories_made_on_the_path_of_a_receipt_have_their_parents_fsynced(tmp_path: pathlib.Path) -> None:
    """Issue 23: a published receipt must not vanish after a power loss because the
    ``receipts/<aa>/`` directories the wrapper made were never made durable. Under strace
    (the agent and its wrapper, -f): each mkdir is followed by an fsync of its parent,
    before the receipt is linked."""
    base = tmp_path / "journal"
    base.mkdir()
    receipt = base / "receipts" / "ab" / "ab-attempt.json"
    script = (
        "import sys\n"
        "from qinglong_edge.process.spawn import JobSpec, Publication, start_job\n"
        f"spec = JobSpec(['/bin/true'], {{'PATH': '/bin'}}, {str(tmp_path)!r}, {str(tmp_path / 'job.log')!r}, 1024,\n"
        f"               receipt=Publication({str(receipt)!r}, b'{{\"schemaVersion\":1'), started_at_ms=1)\n"
        "job = start_job(spec)\n"
        "job.release()\n"
        "sys.exit(job.process.wait(10))\n"
    )
    trace = tmp_path / "trace"
    proc = subprocess.run(["strace", "-f", "-y", "-qq", "-e", "trace=mkdir,mkdirat,fsync,linkat", "-o", str(trace),
                           sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert receipt.exists()
    calls, index = _traced(trace)

    made_receipts = index(rf'^mkdir(at)?\(.*"{re.escape(str(base))}/receipts"')
    synced_base = index(rf"^fsync\(\d+<{re.escape(str(base))}>\)")
    made_ab = index(rf'^mkdir(at)?\(.*"{re.escape(str(base))}/receipts/ab"')
    synced_receipts = index(rf"^fsync\(\d+<{re.escape(str(base))}/receipts>\)")
    linked = index(r'^linkat\(.*"ab-attempt\.json"')
    assert made_receipts < synced_base < linked and made_ab < synced_receipts < linked, calls


def _fill(path: pathlib.Path) -> pathlib.Path:
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


@pytest.mark.parametrize("freed_after", [2, None], ids=["space-comes-back", "stays-full"])
def test_the_receipt_is_retried_a_bounded_number_of_times_on_a_full_disk(tmp_path: pathlib.Path,
                                                                        freed_after: int | None) -> None:
    """Issue 24 item 4: a job may fill the receipt's file system. The wrapper tries the
    receipt up to PUBLISH_ATTEMPTS times (0.1, 0.2, 0.4, 0.8 s apart), then gives up (the
    caller's "No receipt" path). A real full tmpfs; the observer frees the space after
    the second failed attempt in one case."""
    from tests.support.mounts import tmpfs

    with tmpfs(tmp_path / "small", "64k") as small:
        filler = _fill(small)
        publication = wrapper.Publication(os.fsencode(small / "r.json"), b'{"a":1', "receipt")
        attempts: list[bool] = []
        publish = publication.publish

        def observed(data: bytes) -> bool:
            attempts.append(publish(data))
            if len(attempts) == freed_after:
                filler.unlink()
            return attempts[-1]

        publication.publish = observed  # type: ignore[method-assign]
        try:
            published = wrapper.publish_retried(publication, b'{"a":1,"exitCode":0}')
        finally:
            os.close(publication.dir_fd)  # else the tmpfs could not be unmounted
        if freed_after is None:
            assert not published and attempts == [False] * wrapper.PUBLISH_ATTEMPTS
            assert not (small / "r.json").exists() and os.listdir(small) == ["filler"]  # no temp file left
        else:
            assert published and attempts == [False, False, True]
            assert (small / "r.json").read_bytes() == b'{"a":1,"exitCode":0}'
