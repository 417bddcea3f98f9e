"""The job wrapper: the small parent process of every job, Local Runs and remote runs.

This file is a *program*, never imported by the agent: :func:`qinglong_edge.process.spawn.start_job`
reads this source through the package's loader and starts it as::

    <sys.executable> -I -S /proc/self/fd/N qinglong-edge-job LABEL

with the program on descriptor ``N``: a sealed ``memfd`` holding it compiled (once per
agent process, by a short-lived interpreter; a ``.pyc`` image), else a pipe with this
source. So it works the same from an installed package and from a read-only zipapp,
imports nothing of ours, writes no bytecode, and ``ps`` shows one short line. ``-I -S``:
no user site, no ``PYTHON*`` variables, no ``site``; only ``os``, ``select``, ``errno``,
``time``, ``_signal`` (``signal`` would pull in ``enum``) and ``_ctypes`` for one ``prctl``
(the ``ctypes`` package would add 0.5 MiB RSS). Measured here (``smaps_rollup`` of a
running job's wrapper): 8.9 MiB RSS, 3.0 MiB of it private, of which ``_ctypes`` adds
0.25 and 0.1 (a bare ``python -I -S``: 8.5 and 2.8). Tests import it for its pure
helpers (no side effects at import).

Descriptors at start: 0 the *control pipe* (the job spec, then the release line), 1 the
*status pipe* (our answer before the release), 2 ``/dev/null``, ``N`` this source. Its
environment is empty: the job's environment, secrets included, travels only in the spec
on the control pipe (never in argv, our environment or a file).

Protocol (all bytes):

1. The agent writes :data:`MAGIC`, then frames ``TAG SP LENGTH LF DATA LF`` and the frame
   ``end 0 LF LF``. ``cgroup`` frames come first: the wrapper writes its pid into each of
   those ``cgroup.procs`` files as soon as the frame is read, before anything else, so
   nothing it starts can be outside the job's cgroups. The tags are in :data:`TAGS`.
2. The wrapper checks the spec, opens the log (creating its directory 0700), opens the
   directories of the truncation fact and the receipt, then answers ``ready LF`` on the
   status pipe, or ``error CODE TEXT LF`` and exits :data:`NOT_STARTED`.
3. The agent records the job's durable identity (the wrapper's pid, group, start time)
   and writes ``go LF``. End of file (the agent died) or anything else instead: exit
   :data:`NOT_STARTED`; the command never ran (the start barrier).
4. The wrapper forks the command: only fds 0 (``/dev/null``), 1 and 2 (the write end of
   its output pipe), default signal dispositions, an empty signal mask, the wrapper's
   process group and session, the spec's ``cwd`` and exactly the spec's environment; with
   ``isolate``, first a private user + mount namespace hiding the ``hide`` paths and
   binding the ``readonly`` ones read-only (see :func:`_isolate`); with ``pidns`` also a
   PID namespace whose PID 1 is our init, the command PID 2 in a session of its own
   (:func:`_pid_namespace`, :func:`_init_loop`: the init passes signals on, reaps orphans,
   ends leftovers and exits with the command's status, which is then the wrapper's
   "command"). Before that the child raises its ``oom_score_adj`` to 1000 and enters the
   ``jobcgroup`` leaves (the job's memory leaf: the wrapper stays outside it). A failed
   ``exec`` (or ``chdir``, or isolation) writes one line into
   the log and ends with :data:`CANNOT_EXECUTE` (126) or, for a missing file,
   :data:`NOT_FOUND` (127), as a shell would.
5. While the command runs (and after, while the wrapper drains and publishes): a TERM, INT
   or HUP received by the wrapper is passed on to the job's whole process group with one
   ``killpg`` while that signal is ignored in the wrapper itself, so each member of the
   group (the command, a pipeline's other members, background children) gets it exactly
   once and the wrapper goes on to write the receipt. Stop a job by signalling the wrapper
   (its pid is the job's identity): :func:`qinglong_edge.process.stop.stop` does; a signal
   sent to the whole group reaches every member twice (directly, then through the
   wrapper), which makes tools that force-quit on a second TERM or INT skip their graceful
   shutdown. Output is copied head-first into the log up to
   ``logcap`` bytes (existing bytes count), then ``notice`` once; the rest is read,
   counted and discarded, so the command never blocks on its log.
   Before the fork the wrapper makes itself a *child subreaper*
   (:func:`become_subreaper`): orphans of the job (a ``setsid`` escapee whose parent
   exited, a double fork) re-parent to it instead of init, and it reaps them as they exit
   (their zombies would hold tasks of the job's PID cap). As a subreaper, a forwarded
   signal also goes, once, to each descendant outside the group
   (:func:`signal_descendants`), which no ``killpg`` reaches.
6. Leftovers (subreaper only). Once the command has exited, every descendant still there
   gets one TERM, as a forwarded one (none if a stop's TERM already reached them; a stop's
   TERM after this one is dropped, so nobody gets two). ``termgracems`` after that TERM,
   or after a stop's first TERM (also while the command still runs), SIGKILL passes over
   all descendants begin, every 20 ms, until the wrapper has no child at all (``waitpid``:
   ``ECHILD``) or ``killgracems`` more have passed (what survives that is stuck in the
   kernel with SIGKILL pending: it never runs user code again). So the receipt never
   precedes the end of anything the job started. Then output still arriving (a holder
   outside the tree: a descriptor passed away) is drained for at most ``drainms`` ms and
   the pipe is closed. Without a subreaper (no ``_ctypes``, no ``prctl``): exactly the
   behaviour before this step (drain from the command's exit; escapees re-parent to init
   and nothing here reaches them).
7. In this order: ``fsync`` the log; publish the truncation fact (``fact``: the caller's
   ``factprefix`` + ``,"quotaReached":B,"observedAtMs":N}`` by default); publish the
   receipt (``receipt``: ``receiptprefix`` + ``,"finishedAtMs":N,"exitCode":E}``, N in wall
   ms clamped >= ``startedatms``). Each is a temp file ``.<name>.<32 hex>.tmp`` (0600,
   ``O_EXCL``), written, fsynced, ``link``\\ ed to its name (an existing file is never
   replaced), the directory fsynced, the temp name unlinked. Then the wrapper exits E:
   the command's exit code, or 128 + the signal that killed it. (The directories of the
   log, fact and receipt that the wrapper made at the start, 0700, had their parents
   fsynced then: :func:`fsync_parents`.)

Steps 4-6 are :class:`Supervisor`'s, in explicit phases (``starting``, ``running``,
``stopping``, ``killing``, ``draining``, ``closed``: plain strings, their table is
:data:`PHASE_NEXT`, checked by :func:`advance`).

If the wrapper itself is killed (SIGKILL to the group, the OOM killer), nothing is
published: that is the caller's "No receipt" case. If the agent dies after the release,
the wrapper and the command go on and the receipt still appears.
"""

from __future__ import annotations

import errno
import os
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    import signal as _signal
    from collections.abc import Callable

    _Mount = Callable[[bytes | None, bytes, bytes | None, int, bytes | None], int]
else:  # _signal is the C module behind signal; signal itself imports enum (~0.8 MiB)
    import _signal

MAGIC = b"qinglong-edge-job 1\n"
#: The release line the agent writes once the job's identity is durable.
RELEASE = b"go\n"
READY = b"ready\n"
#: Exit status when the command was never started (spec, EOF or no release).
NOT_STARTED = 125
#: The command could not be executed (EACCES, ENOEXEC, chdir, isolation).
CANNOT_EXECUTE = 126
#: The command's file does not exist.
NOT_FOUND = 127
#: Upper bound of the spec, all frames included (bytes).
MAX_SPEC_BYTES = 4 * 1024 * 1024
#: Upper bound of a receipt or truncation-fact prefix (bytes).
MAX_PREFIX_BYTES = 4000
#: Default and upper bound of the drain after the command exits (ms).
DEFAULT_DRAIN_MS = 2000
MAX_DRAIN_MS = 600_000
#: Defaults and bound of the graces for the job's leftover descendants (ms; step 6).
DEFAULT_TERMINATE_GRACE_MS = 5000
DEFAULT_KILL_GRACE_MS = 1000
MAX_GRACE_MS = 30_000
#: Keys the truncation fact may end with, in the order asked (``factkeys``).
FACT_KEYS = ("quotaReached", "observedAtMs", "keptBytes", "discardedBytes")
DEFAULT_FACT_KEYS = ("quotaReached", "observedAtMs")
#: Frame tags; those marked repeated may appear more than once.
TAGS = {
    b"cgroup": "repeated: a cgroup.procs file the wrapper enters at once",
    b"argv": "repeated, >= 1: the command; the first is its absolute path",
    b"env": "repeated: NAME=VALUE, the job's whole environment",
    b"cwd": "the job's absolute working directory",
    b"log": "absolute path of the log file",
    b"logcap": "decimal: the log file's size cap in bytes (existing bytes count)",
    b"notice": "bytes appended once when output is cut (inside the cap)",
    b"drainms": "decimal: drain after the command exits, ms",
    b"termgracems": "decimal: SIGTERM to SIGKILL of leftover descendants, ms",
    b"killgracems": "decimal: wait after that SIGKILL, ms",
    b"fact": "absolute path of the truncation fact",
    b"factprefix": "the fact's bytes before the wrapper's keys",
    b"factkeys": "comma-separated subset of FACT_KEYS",
    b"receipt": "absolute path of the receipt",
    b"receiptprefix": "the receipt's bytes before finishedAtMs and exitCode",
    b"startedatms": "decimal: the receipt's startedAtMs (finishedAtMs is clamped to it)",
    b"isolate": "'userns': a private user + mount namespace, or the job does not run",
    b"hide": "repeated: an absolute path the isolated job must not see",
    b"keep": "repeated: an absolute path under a hidden one that stays visible",
    b"readonly": "repeated: an absolute path the isolated job sees read-only (bound onto itself)",
    b"pidns": "'proc' or 'noproc': a PID namespace (our init as PID 1), with or without a private /proc",
    b"jobcgroup": "repeated: a cgroup.procs file the job (not the wrapper) enters: its memory leaf",
    b"leasefile": "absolute path of the agent's lease file of this job: stop it by its lease (step 5a)",
    b"leasestop": "absolute path of the mark created when the job is stopped for its lease",
    b"end": "the last frame (empty)",
}
REPEATED = frozenset({b"cgroup", b"argv", b"env", b"hide", b"keep", b"readonly", b"jobcgroup"})
COMM = b"qinglong-job"
_CHUNK = 65536
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
#: prctl(2) option (<linux/prctl.h>): orphaned descendants re-parent to us, not to init.
PR_SET_CHILD_SUBREAPER = 36
#: Interval between SIGKILL passes over the descendants that are still there (s).
_KILL_PASS_S = 0.02

#: The phases of the supervision of a job (steps 4-7; :class:`Supervisor`), plain strings.
STARTING = "starting"  # before the fork; the forwarded signals are blocked
RUNNING = "running"  # the command runs; no TERM has gone out
STOPPING = "stopping"  # a TERM went out (a stop's, the leftovers', the lease stop's): SIGKILL at kill_at
KILLING = "killing"  # SIGKILL passes every 20 ms until no child is left or the kill grace is over
DRAINING = "draining"  # nothing of the job is left (or it is given up): its output drains for drainms
CLOSED = "closed"  # the output pipe is closed: the fact and the receipt follow (step 7)
#: phase -> the phases it may become (the table in :class:`Supervisor`'s docstring).
PHASE_NEXT: dict[str, tuple[str, ...]] = {
    STARTING: (RUNNING,),
    RUNNING: (STOPPING, DRAINING),
    STOPPING: (KILLING, DRAINING),
    KILLING: (DRAINING,),
    DRAINING: (CLOSED,),
    CLOSED: (),
}


def advance(phase: str, to: str) -> str:
    """``to``, when :data:`PHASE_NEXT` lets ``phase`` become it; ``to == phase`` is no move
    (a signal handler may have got there first). Raises RuntimeError otherwise (a bug)."""
    if to != phase and to not in PHASE_NEXT[phase]:
        raise RuntimeError(f"the job wrapper's phase {phase} cannot become {to}")
    return to


# Linux constants (<sched.h>, <sys/mount.h>) for the isolation; not in os before 3.12.
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
CLONE_NEWPID = 0x20000000
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_RELATIME = 1 << 21
#: statvfs f_flag bit -> the mount(2) flag a remount in a user namespace must repeat.
_ST_TO_MS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, MS_NOATIME),
             (2048, MS_NODIRATIME), (4096, MS_RELATIME))
#: The job's ``/proc/self/oom_score_adj``: the kernel's OOM killer takes a job before the agent.
JOB_OOM_SCORE_ADJ = 1000
#: Attempts to publish the receipt (and the fact) on a failing or full disk; waits between (s).
PUBLISH_ATTEMPTS = 5
_PUBLISH_WAIT_S = 0.1
#: Marks the init's pid on the failure pipe (never in a failure text: those have no NUL).
_INIT_MARK = b"\0init "
#: statvfs f_flag bits that a remount of a bind must keep (locked in a user namespace).
_ST_KEEP = 1 | 2 | 4 | 8 | 1024 | 2048 | 4096


class SpecError(Exception):
    """The spec or the job's files are unusable; ``code`` goes on the status pipe."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class Spec:
    """The parsed frames: one list of values per tag."""

    def __init__(self) -> None:
        self.frames: dict[bytes, list[bytes]] = {}

    def add(self, tag: bytes, value: bytes) -> None:
        values = self.frames.setdefault(tag, [])
        if values and tag not in REPEATED:
            raise SpecError("invalid_spec", f"duplicate frame {tag!r}")
        values.append(value)

    def all(self, tag: bytes) -> list[bytes]:
        return self.frames.get(tag, [])

    def one(self, tag: bytes, default: bytes | None = None) -> bytes | None:
        values = self.frames.get(tag)
        return values[0] if values else default

    def need(self, tag: bytes) -> bytes:
        value = self.one(tag)
        if value is None:
            raise SpecError("invalid_spec", f"missing frame {tag!r}")
        return value

    def number(self, tag: bytes, default: int | None, low: int, high: int) -> int | None:
        raw = self.one(tag)
        if raw is None:
            return default
        if not raw.isdigit() or len(raw) > 16 or not low <= int(raw) <= high:
            raise SpecError("invalid_spec", f"frame {tag!r} is not a number in {low}..{high}")
        return int(raw)


def encode_frame(tag: bytes, value: bytes) -> bytes:
    """One frame (the agent side uses this too)."""
    return tag + b" " + str(len(value)).encode("ascii") + b"\n" + value + b"\n"


class SpecReader:
    """Reads frames from the control pipe; ``cgroup`` frames are entered as they arrive."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.pos = 0
        self.eof = False

    def _fill(self, need: int) -> None:
        while len(self.buffer) - self.pos < need:
            if self.eof:
                raise SpecError("invalid_spec", "end of file inside the spec")
            if len(self.buffer) >= MAX_SPEC_BYTES:
                raise SpecError("spec_too_large", f"the spec exceeds {MAX_SPEC_BYTES} bytes")
            data = os.read(self.fd, _CHUNK)
            if not data:
                self.eof = True
                continue
            self.buffer += data

    def _line(self) -> bytes:
        while True:
            end = self.buffer.find(b"\n", self.pos)
            if end >= 0:
                line = bytes(self.buffer[self.pos : end])
                self.pos = end + 1
                return line
            if len(self.buffer) - self.pos > 64:
                raise SpecError("invalid_spec", "frame head too long")
            self._fill(len(self.buffer) - self.pos + 1)

    def read(self, enter: bool = True) -> Spec:
        self._fill(len(MAGIC))
        if bytes(self.buffer[: len(MAGIC)]) != MAGIC:
            raise SpecError("invalid_spec", "not a qinglong-edge job spec")
        self.pos = len(MAGIC)
        spec = Spec()
        while True:
            tag, _, length = self._line().partition(b" ")
            if tag not in TAGS or not length.isdigit() or len(length) > 8:
                raise SpecError("invalid_spec", f"bad frame head {tag[:16]!r}")
            size = int(length)
            self._fill(size + 1)
            value = bytes(self.buffer[self.pos : self.pos + size])
            if self.buffer[self.pos + size] != 0x0A:
                raise SpecError("invalid_spec", f"frame {tag!r} is not terminated")
            self.pos += size + 1
            if tag == b"end":
                return spec
            if tag == b"cgroup" and enter:
                enter_cgroup(value)
            spec.add(tag, value)

    def release(self) -> bool:
        """Wait for the release line; False on end of file or anything else."""
        try:
            while True:
                end = self.buffer.find(b"\n", self.pos)
                if end >= 0:
                    return bytes(self.buffer[self.pos : end + 1]) == RELEASE
                if len(self.buffer) - self.pos > len(RELEASE):
                    return False
                data = os.read(self.fd, 64)
                if not data:
                    return False
                self.buffer += data
        except OSError:
            return False

    def wipe(self) -> None:
        """Overwrite what was read (the environment's secrets) and forget it."""
        self.buffer[:] = bytes(len(self.buffer))
        self.buffer = bytearray()


def enter_cgroup(procs_file: bytes) -> None:
    """Write our pid into one ``cgroup.procs``: everything we start stays inside."""
    try:
        fd = os.open(procs_file, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode("ascii"))
        finally:
            os.close(fd)
    except OSError as exc:
        raise SpecError("cgroup_unavailable", f"{os.fsdecode(procs_file)}: {exc.strerror}") from None


def _absolute(path: bytes, what: str) -> bytes:
    if not path.startswith(b"/") or b"\0" in path or path == b"/":
        raise SpecError("invalid_spec", f"{what} must be an absolute path other than /")
    return os.path.normpath(path)


def open_directory(path: bytes, what: str) -> int:
    """An ``O_DIRECTORY`` fd of ``path``, creating missing directories 0700 on the way
    (each one's parent fsynced: :func:`fsync_parents`).

    The directory itself must not be a symlink (``O_NOFOLLOW``), must be ours and not
    writable by group/other (reference 4.3: the log directories are 0700 and not
    symlinks); its existing ancestors are the caller's (``/tmp`` is fine).
    """
    try:
        try:
            fd = os.open(path, _OPEN_DIR)
        except FileNotFoundError:
            missing = [path]
            while not os.path.isdir(os.path.dirname(missing[-1])) and os.path.dirname(missing[-1]) != missing[-1]:
                missing.append(os.path.dirname(missing[-1]))
            created = []
            for directory in reversed(missing):
                try:
                    os.mkdir(directory, 0o700)
                except FileExistsError:
                    continue
                created.append(directory)
            fsync_parents(created)
            fd = os.open(path, _OPEN_DIR)
    except OSError as exc:
        raise SpecError(f"{what}_unavailable", f"{os.fsdecode(path)}: {exc.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise SpecError(f"{what}_unavailable", f"{os.fsdecode(path)}: not ours or writable by group/other")
    return fd


def fsync_parents(created: list[bytes]) -> None:
    """fsync the parent of each directory just made (outermost first): a new directory's
    name is durable only once its parent is, so a receipt published into ``receipts/<aa>/``
    that this wrapper created survives a power loss (its own directory is fsynced when it
    is published). Raises OSError (a launch failure: nothing ran yet)."""
    for directory in created:
        # The parent may be a symlink (OpenWrt's /var/run): followed, only fsynced.
        fd = os.open(os.path.dirname(directory) or b"/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Publication:
    """A receipt or truncation fact to publish at the end: its directory fd, name, prefix."""

    def __init__(self, path: bytes, prefix: bytes, what: str) -> None:
        if not prefix or len(prefix) > MAX_PREFIX_BYTES:
            raise SpecError("invalid_spec", f"{what} prefix must be 1..{MAX_PREFIX_BYTES} bytes")
        path = _absolute(path, what)
        self.name = os.path.basename(path)
        self.prefix = prefix
        self.dir_fd = open_directory(os.path.dirname(path), "publication")
        try:
            os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SpecError("publication_unavailable", f"{what}: {exc.strerror}") from None
        # Never twice: a published receipt or fact means this attempt already ran.
        raise SpecError("already_published", f"{os.fsdecode(path)} already exists")

    def publish(self, data: bytes) -> bool:
        """temp file, write, fsync, link (never replaces), fsync(dir), unlink temp."""
        temp = b"." + self.name + b"." + os.urandom(16).hex().encode("ascii") + b".tmp"
        try:
            fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=self.dir_fd)
        except OSError:
            return False
        linked = False
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
                linked = True
            except FileExistsError:
                pass  # someone published it first: never replaced
            os.fsync(self.dir_fd)
        except OSError:
            return linked
        finally:
            try:
                os.unlink(temp, dir_fd=self.dir_fd)
            except OSError:
                pass
        return linked


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Log:
    """The capped log file: the head is kept, the rest counted and discarded."""

    def __init__(self, path: bytes, cap: int, notice: bytes) -> None:
        path = _absolute(path, "log")
        if len(notice) >= cap:
            raise SpecError("invalid_spec", "the notice does not fit in the cap")
        dir_fd = open_directory(os.path.dirname(path), "log")
        try:
            self.fd = os.open(os.path.basename(path),
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                              0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise SpecError("log_unavailable", f"{os.fsdecode(path)}: {exc.strerror}") from None
        finally:
            os.close(dir_fd)
        st = os.fstat(self.fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_nlink != 1 or st.st_uid != os.geteuid():
            os.close(self.fd)
            raise SpecError("log_unavailable", f"{os.fsdecode(path)}: not a private regular file")
        os.set_blocking(self.fd, True)  # O_NONBLOCK was only for the open: a planted FIFO must not hang us
        self.cap = cap
        self.notice = notice
        self.kept = st.st_size
        self.discarded = 0
        self.truncated = False

    def keep(self, data: bytes) -> None:
        if self.truncated:
            self.discarded += len(data)
            return
        room = self.cap - self.kept - len(self.notice)
        if len(data) <= room:
            self._write(data)
            return
        head = data[: max(room, 0)]
        self._write(head)
        self.discarded += len(data) - len(head)
        self.truncated = True
        if self.notice and self.kept + len(self.notice) <= self.cap:
            self._write(self.notice)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except OSError:
                # A full or failing disk must not stop the job: keep reading, stop keeping.
                self.discarded += len(view)
                self.truncated = True
                return
            self.kept += written
            view = view[written:]

    def line(self, text: str) -> None:
        """One diagnostic line of ours (exec failure), inside the cap like any output."""
        self.keep(b"qinglong-edge: " + text.encode("utf-8", "replace") + b"\n")

    def sync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError:
            pass


def boot_s() -> float:
    """``CLOCK_BOOTTIME`` in seconds: every timer of the wrapper (NTP cannot step it)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def flat_json(data: bytes) -> dict[bytes, bytes] | None:
    """A flat JSON object of plain strings (no escapes), integers and ``null``, as the
    agent writes its lease file; None for anything else. Values are kept raw (a string
    without its quotes)."""
    text = data.strip()
    if len(text) < 2 or text[:1] != b"{" or text[-1:] != b"}":
        return None
    out: dict[bytes, bytes] = {}
    pos, end = 1, len(text) - 1
    while pos < end:
        if text[pos : pos + 1] != b'"':
            return None
        close = text.find(b'"', pos + 1)
        if close < 0 or text[close + 1 : close + 2] != b":":
            return None
        key = text[pos + 1 : close]
        pos = close + 2
        if text[pos : pos + 1] == b'"':
            close = text.find(b'"', pos + 1)
            if close < 0:
                return None
            value = text[pos + 1 : close]
            pos = close + 1
        else:
            stop = text.find(b",", pos)
            stop = end if stop < 0 else stop
            value = text[pos:stop]
            if value != b"null" and not value.lstrip(b"-").isdigit():
                return None
            pos = stop
        if b"\\" in key or b"\\" in value or key in out:
            return None
        out[key] = value
        if text[pos : pos + 1] == b",":
            pos += 1
        elif pos != end:
            return None
    return out


class LeaseWatch:
    """The agent's lease file of this job (qinglong_edge/worker/remote/lease.py): when the
    job must be stopped for its lease, and the mark to leave when it is (step 5a).

    Read at the start (a missing, damaged or another boot's file: ``lease_unavailable``,
    the command never runs unprotected) and again at each ``stopAtBootMs``; a copy that
    cannot be read then keeps the last good one in force.
    """

    def __init__(self, path: bytes, mark_path: bytes) -> None:
        self.path = path
        self.mark_path = mark_path
        self.boot_id = _boot_id()
        values = self._read()
        if values is None:
            raise SpecError("lease_unavailable", f"{os.fsdecode(path)}: not a lease file of this boot")
        self.stop_at_ms, self.terminate_grace_ms, self.kill_grace_ms = values

    def _read(self) -> tuple[int, int, int] | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if (os.fstat(fd).st_mode & 0o170000) != 0o100000:
                return None
            data = os.read(fd, 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        values = flat_json(data)
        if values is None or self.boot_id is None or values.get(b"bootId") != self.boot_id:
            return None
        try:
            stop_at, term, kill = (int(values[k]) for k in (b"stopAtBootMs", b"terminateGraceMs", b"killGraceMs"))
        except (KeyError, ValueError):
            return None
        if stop_at < 0 or not 0 <= term <= MAX_GRACE_MS or not 0 <= kill <= MAX_GRACE_MS:
            return None
        return stop_at, term, kill

    def refresh(self) -> None:
        values = self._read()
        if values is not None:
            self.stop_at_ms, self.terminate_grace_ms, self.kill_grace_ms = values

    def mark(self) -> None:
        try:
            fd = os.open(self.mark_path, _TEMP_FLAGS, 0o600)
        except OSError:
            return  # there already (or nowhere to put it: the agent's own clock then decides)
        try:
            os.write(fd, b"lease\n")
        except OSError:
            pass
        finally:
            os.close(fd)


def _boot_id() -> bytes | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as handle:
            return handle.read(128).strip() or None
    except OSError:
        return None


def lease_watch(spec: Spec) -> LeaseWatch | None:
    """The job's :class:`LeaseWatch` (frames ``leasefile`` and ``leasestop``), or None."""
    path = spec.one(b"leasefile")
    if path is None:
        return None
    return LeaseWatch(_absolute(path, "leasefile"), _absolute(spec.need(b"leasestop"), "leasestop"))


class Job:
    """Everything the wrapper needs after the release."""

    def __init__(self, spec: Spec) -> None:
        argv = spec.all(b"argv")
        if not argv or not argv[0].startswith(b"/"):
            raise SpecError("invalid_spec", "argv must start with an absolute path")
        env = {}
        for entry in spec.all(b"env"):
            name, sep, value = entry.partition(b"=")
            if not sep or not name or name in env:
                raise SpecError("invalid_spec", "environment entries must be unique NAME=VALUE")
            env[name] = value
        if any(b"\0" in a for a in argv) or any(b"\0" in k or b"\0" in v for k, v in env.items()):
            raise SpecError("invalid_spec", "NUL in argv or environment")
        self.argv = argv
        self.env = env
        self.cwd = _absolute(spec.need(b"cwd"), "cwd")
        try:
            st = os.stat(self.cwd)
        except OSError as exc:
            raise SpecError("cwd_unavailable", f"{os.fsdecode(self.cwd)}: {exc.strerror}") from None
        if (st.st_mode & 0o170000) != 0o040000:
            raise SpecError("cwd_unavailable", f"{os.fsdecode(self.cwd)}: not a directory")
        cap = spec.number(b"logcap", None, 1, 1 << 40)
        if cap is None:
            raise SpecError("invalid_spec", "missing frame b'logcap'")
        self.drain_ms = spec.number(b"drainms", DEFAULT_DRAIN_MS, 0, MAX_DRAIN_MS) or 0
        self.terminate_grace_ms = spec.number(b"termgracems", DEFAULT_TERMINATE_GRACE_MS, 1, MAX_GRACE_MS) or 1
        self.kill_grace_ms = spec.number(b"killgracems", DEFAULT_KILL_GRACE_MS, 1, MAX_GRACE_MS) or 1
        self.started_at_ms = spec.number(b"startedatms", 0, 0, (1 << 53) - 1) or 0
        keys = spec.one(b"factkeys")
        self.fact_keys = tuple(k.decode("ascii") for k in keys.split(b",")) if keys else DEFAULT_FACT_KEYS
        if not set(self.fact_keys) <= set(FACT_KEYS) or len(set(self.fact_keys)) != len(self.fact_keys):
            raise SpecError("invalid_spec", "factkeys must be distinct names of FACT_KEYS")
        isolate = spec.one(b"isolate")
        if isolate not in (None, b"userns"):
            raise SpecError("invalid_spec", "isolate must be 'userns'")
        self.isolate = isolate is not None
        self.hide = [_absolute(p, "hide") for p in spec.all(b"hide")]
        self.keep = [_absolute(p, "keep") for p in spec.all(b"keep")]
        self.readonly = [_absolute(p, "readonly") for p in spec.all(b"readonly")]
        self.pidns = _pid_level(spec.one(b"pidns"), self.isolate)
        self.job_cgroups = [_open_job_cgroup(p) for p in spec.all(b"jobcgroup")]
        self.log = Log(spec.need(b"log"), cap, spec.one(b"notice", b"") or b"")
        self.fact = self.receipt = None
        if spec.one(b"fact") is not None:
            self.fact = Publication(spec.need(b"fact"), spec.need(b"factprefix"), "fact")
        if spec.one(b"receipt") is not None:
            self.receipt = Publication(spec.need(b"receipt"), spec.need(b"receiptprefix"), "receipt")
            if spec.one(b"startedatms") is None:
                raise SpecError("invalid_spec", "a receipt needs startedatms")
        self.lease = lease_watch(spec)


def fact_suffix(keys: tuple[str, ...], *, truncated: bool, observed_ms: int, kept: int, discarded: int) -> bytes:
    """``,"quotaReached":false,"observedAtMs":N}`` (the keys asked, in that order)."""
    values = {
        "quotaReached": "true" if truncated else "false",
        "observedAtMs": str(observed_ms),
        "keptBytes": str(kept),
        "discardedBytes": str(discarded),
    }
    return "".join(f',"{k}":{values[k]}' for k in keys).encode("ascii") + b"}"


def receipt_suffix(finished_ms: int, exit_code: int) -> bytes:
    """``,"finishedAtMs":N,"exitCode":E}``."""
    return f',"finishedAtMs":{finished_ms},"exitCode":{exit_code}}}'.encode("ascii")


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


# -- the job's descendants: the child subreaper ---------------------------------------------


def become_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``; True when the wrapper is one now.

    Orphaned descendants of the job (a ``setsid`` escapee whose parent exited, a double
    fork) then re-parent to the wrapper instead of ``init``, so it can still find and end
    them (step 6). Through ``_ctypes`` itself, the C module behind ``ctypes`` (0.2 MiB RSS
    here against 0.5 MiB for the ``ctypes`` package). Without ``_ctypes`` (OpenWrt without
    ``python3-ctypes``) or ``prctl`` (not Linux, a seccomp filter): False, and the wrapper
    goes on as before, guaranteeing nothing about escapees (they re-parent to init).
    """
    try:
        import _ctypes
    except ImportError:
        return False
    try:
        class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # not subscriptable at run time
            _type_ = "i"

        class _ULong(_ctypes._SimpleCData):  # type: ignore[type-arg]
            _type_ = "L"

        class _Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _Int

        class _Libc:
            _handle = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # None: the program's own symbols

        prctl = _Function(("prctl", _Libc()))  # type: ignore[arg-type]  # any object with a _handle
        prctl.argtypes = (_ULong, _ULong, _ULong, _ULong, _ULong)  # variadic in C: full-width words
        return bool(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except Exception:  # noqa: BLE001 - any failure means "not a subreaper", never a failed job
        return False


def _proc_stat(pid: int) -> tuple[bool, int, int] | None:
    """(zombie, ppid, pgrp) from ``/proc/<pid>/stat``; None when gone or unreadable."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = raw.rpartition(b")")[2].split()  # comm may hold spaces and parentheses
    if len(fields) < 3 or not fields[1].isdigit() or not fields[2].isdigit():
        return None
    return fields[0] == b"Z", int(fields[1]), int(fields[2])


def descendants(root: int) -> dict[int, tuple[int, int]]:
    """Every live (non-zombie) process below ``root`` by a ``/proc`` scan: pid -> (ppid, pgrp).

    ``ppid`` in ``/proc/<pid>/stat`` is the parent's thread group, so children of any
    thread of a descendant are found too.
    """
    children: dict[int, list[tuple[int, int, bool]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _proc_stat(int(name))
        if stat is not None:
            children.setdefault(stat[1], []).append((int(name), stat[2], stat[0]))
    found: dict[int, tuple[int, int]] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, pgrp, zombie in children.get(parent, ()):
            if pid in found or pid == root:
                continue
            if not zombie:
                found[pid] = (parent, pgrp)
            todo.append(pid)  # a zombie's children are already re-parented: kept for safety
    return found


def signal_descendants(number: int, skip_group: int | None = None) -> int:
    """Send ``number`` to every live descendant of ours outside ``skip_group``; how many.

    A pid read from ``/proc`` may exit and be recycled before the signal. Our own children
    cannot be: only we reap them, and not while this runs. Deeper descendants are pinned
    with a pidfd first, and signalled through it only if a second scan still finds them
    below us (the ``process/cgroups.py`` ``signal_pids`` rule); without ``pidfd_open``
    (Linux < 5.3) with ``kill`` after that second scan.
    """
    me = os.getpid()
    sent = 0
    pinned: dict[int, int] = {}
    try:
        for pid, (parent, pgrp) in descendants(me).items():
            if skip_group is not None and pgrp == skip_group:
                continue
            if parent == me:
                try:
                    os.kill(pid, number)
                    sent += 1
                except ProcessLookupError:
                    pass
                continue
            try:
                pinned[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except (AttributeError, OSError):
                pinned[pid] = -1
        if pinned:
            still = descendants(me)
            for pid, fd in pinned.items():
                if pid not in still:
                    continue
                try:
                    if fd >= 0:
                        _signal.pidfd_send_signal(fd, number)
                    else:
                        os.kill(pid, number)
                    sent += 1
                except ProcessLookupError:
                    pass
    finally:
        for fd in pinned.values():
            if fd >= 0:
                os.close(fd)
    return sent


# -- the child: from fork to exec ----------------------------------------------------------


def _libc_call(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _write_proc(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))  # one write, as the kernel requires for the maps
    finally:
        os.close(fd)


def _under(path: bytes, root: bytes) -> bool:
    return path == root or path.startswith(root.rstrip(b"/") + b"/")


def _isolate(hide: list[bytes], keep: list[bytes], readonly: list[bytes] | None = None, *,
             pid: bool = False) -> None:
    """Enter a private user + mount namespace in which the ``hide`` paths are empty.

    Runs in the forked child only, so the wrapper keeps the real view (its log, fact and
    receipt directories). The user namespace maps our uid and gid to themselves (the job
    keeps its identity and file access) and, after ``exec``, leaves the job without
    capabilities: it cannot unmount the covers, and in any namespace it creates they are
    locked. Processes outside the namespace (the agent, other jobs) are out of reach of
    ``/proc/<pid>/root``, ``environ``, ``fd`` and ``ptrace``: the kernel requires the
    same user namespace or ``CAP_SYS_PTRACE`` over theirs.

    A hidden directory gets an empty read-only tmpfs; a hidden file a read-only bind of
    ``/dev/null``. A ``keep`` path below a hidden directory (the job's cwd, added by the
    caller) is bound back at the same place, writable. Missing hidden paths are skipped.

    ``unshare(2)``: ``os.unshare`` (Python >= 3.12), else libc through ``ctypes``;
    ``mount(2)`` has no stdlib wrapper, so ``ctypes`` is required (an ImportError here is
    an isolation failure: the job does not run).

    Raises:
        OSError, ImportError: the caller turns it into a log line and exit 126.
    """
    import ctypes

    libc, mount = _libc_mount()
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | (CLONE_NEWPID if pid else 0)
    unshare = getattr(os, "unshare", None)
    if unshare is not None:
        unshare(flags)
    else:
        libc.unshare.argtypes = [ctypes.c_int]
        _libc_call(libc.unshare(flags), "unshare")
    try:
        _write_proc("/proc/self/setgroups", "deny")
    except FileNotFoundError:
        pass  # Linux < 3.19 has no setgroups file
    _write_proc("/proc/self/uid_map", f"{uid} {uid} 1")
    _write_proc("/proc/self/gid_map", f"{gid} {gid} 1")
    _libc_call(mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # Descriptors of the kept paths, opened in this namespace before anything covers them.
    kept = {}
    for path in sorted(set(keep), key=len):
        try:
            kept[path] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
    covers: list[bytes] = []
    inside_keep: list[bytes] = []
    for path in sorted(set(hide), key=len):
        if any(_under(path, c) for c in covers):
            if any(_under(path, k) for k in kept):
                inside_keep.append(path)
            continue
        if _cover(mount, path):
            covers.append(path)
    for path, fd in kept.items():
        if not any(_under(path, c) for c in covers):
            continue
        try:
            os.makedirs(path, 0o755, exist_ok=True)  # mount points inside the (still writable) cover
        except FileExistsError:
            pass
        _libc_call(mount(f"/proc/self/fd/{fd}".encode("ascii"), path, None, MS_BIND | MS_REC, None),
                   f"bind {os.fsdecode(path)}")
    for path in inside_keep:
        _cover(mount, path)
    for path in covers:
        if os.path.isdir(path):
            _libc_call(mount(None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
                       f"remount {os.fsdecode(path)} read-only")
    for fd in kept.values():
        os.close(fd)
    _bind_readonly(mount, [p for p in readonly or () if not any(_under(p, c) for c in covers)])
    if uid == 0:
        _drop_capabilities(libc)


def _cover(mount: _Mount, path: bytes) -> bool:
    """Cover one path; False when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if (st.st_mode & 0o170000) == 0o040000:
        _libc_call(mount(b"none", path, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                         b"mode=0755,size=64k,nr_inodes=1024"), f"cover {os.fsdecode(path)}")
        return True
    _libc_call(mount(b"/dev/null", path, None, MS_BIND, None), f"cover {os.fsdecode(path)}")
    flags = os.statvfs(path).f_flag & _ST_KEEP
    # Best effort: /dev/null reads empty either way; a locked flag set may refuse the remount.
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None)
    return True


def _libc_mount() -> tuple[ctypes.CDLL, _Mount]:
    """libc (``ctypes``) and its ``mount(2)``, typed; in a forked child only."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    mount.restype = ctypes.c_int
    return libc, mount


def _locked_flags(path: bytes) -> int:
    """The ``mount(2)`` flags of the mount holding ``path`` that a remount in a user
    namespace must keep (the kernel locks them: nosuid, nodev, noexec, the atime mode)."""
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _ST_TO_MS if flags & st and ms != MS_RDONLY)


def _bind_readonly(mount: _Mount, paths: list[bytes]) -> None:
    """Bind each existing path onto itself read-only (in the job's mount namespace only).

    The agent reads these back (its configuration, trust anchors, its own code): a job
    that could write them as the agent's user now gets EROFS, and EBUSY for a rename or
    an unlink over them (a mount point); a hard link from elsewhere is EXDEV. A failure
    is an isolation failure (the job does not run): these are promises, not best effort.
    """
    for path in sorted(set(paths), key=len):
        try:
            os.stat(path)
        except FileNotFoundError:
            continue
        _libc_call(mount(path, path, None, MS_BIND | MS_REC, None), f"bind {os.fsdecode(path)}")
        _libc_call(mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _locked_flags(path), None),
                   f"remount {os.fsdecode(path)} read-only")


#: prctl(2) option (<linux/prctl.h>): drop one capability from the bounding set.
PR_CAPBSET_DROP = 24


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    """An agent running as root: empty the bounding set, so that the job, root of its user
    namespace, has no capability there after ``exec`` either (it could otherwise unmount
    the covers, which it made itself: they are not locked). Its files are still its own.

    Raises:
        OSError: a capability could not be dropped (the job does not run).
    """
    import ctypes

    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL:
                return  # past the kernel's last capability
            raise OSError(code, f"drop capability {cap}: {os.strerror(code)}")


# -- memory: the job's cgroup leaf and its OOM score ----------------------------------------


def _open_job_cgroup(procs_file: bytes) -> int:
    """An open ``cgroup.procs`` of the job's memory leaf (checked now, entered by the job)."""
    try:
        return os.open(procs_file, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SpecError("cgroup_unavailable", f"{os.fsdecode(procs_file)}: {exc.strerror}") from None


def _enter_job(job: Job) -> None:
    """In the forked child, before anything: raise its OOM score and enter its leaves.

    ``oom_score_adj`` 1000 makes the kernel's OOM killer take the job (and what it
    starts: the value is inherited) before anything of the agent's, the wrapper
    included; best effort (a job may lower it again, to the agent's level; the agent
    never raises its own). The job, not its wrapper, then enters its memory leaf
    (``jobcgroup``): a job at its limit is OOM-killed there and the wrapper lives on to
    write the receipt.

    Raises:
        OSError: a leaf refused the job (reported as a start failure, 126).
    """
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(JOB_OOM_SCORE_ADJ).encode("ascii"))
        finally:
            os.close(fd)
    except OSError:
        pass
    pid = str(os.getpid()).encode("ascii")
    for fd in job.job_cgroups:
        os.write(fd, pid)
        os.close(fd)
    job.job_cgroups = []


# -- the PID namespace: our init as PID 1 ----------------------------------------------------


def _pid_level(value: bytes | None, isolate: bool) -> bytes | None:
    if value is None:
        return None
    if value not in (b"proc", b"noproc") or not isolate:
        raise SpecError("invalid_spec", "pidns must be 'proc' or 'noproc', with isolate")
    return value


def _pid_namespace(job: Job, err_w: int) -> None:
    """In the child that made the namespaces: fork the init, hand it over, exit.

    The first process forked after ``unshare(CLONE_NEWPID)`` is PID 1 of the new
    namespace: our init (this code, no ``exec``). Its pid goes to the wrapper on the
    failure pipe; this process then exits, and the init re-parents to the wrapper (a
    child subreaper). A TERM, INT or HUP that reached this process meanwhile is passed on
    to the init, which keeps them blocked until it waits for them. The init mounts a
    private ``/proc`` when asked (``pidns proc``), forks the command and returns in it
    alone: PID 2, in a session of its own, goes on to ``exec``. The init itself never
    returns (:func:`_init_loop`).

    Raises:
        OSError, ImportError: before the command exists (reported, 126).
    """
    init = os.fork()
    if init > 0:
        pending = _signal.sigpending()
        _write_all(err_w, _INIT_MARK + str(init).encode("ascii") + b"\0")
        for number in _FORWARDED:
            if number in pending:
                try:
                    os.kill(init, number)
                except OSError:
                    pass
        os._exit(0)
    if job.pidns == b"proc":
        _, mount = _libc_mount()
        _libc_call(mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount a private /proc")
    command = os.fork()
    if command == 0:
        os.setsid()
        return
    code = 255
    try:
        code = _init_loop(job, command, err_w)
    finally:
        os._exit(code)


def _kill_all(number: int) -> None:
    """From PID 1: ``number`` to every process of the namespace but ourselves, once each."""
    try:
        os.kill(-1, number)
    except OSError:
        pass  # ESRCH: nobody left


def _init_loop(job: Job, command: int, err_w: int) -> int:
    """The init's life: pass signals on, reap orphans, end leftovers; the command's code.

    A TERM, INT or HUP sent from outside the namespace (the wrapper forwarding a stop:
    ``si_pid`` 0) goes to every process of the namespace once (``kill(-1)``); one a job
    sends to its init is dropped. When the command has exited, what it left gets one TERM
    (none if a stop's TERM already reached it), then SIGKILL passes from
    ``termgracems`` on, every 20 ms, until no child is left; a stop's TERM starts the same
    clock. Then the init exits with the command's exit code (or 128 + its signal), which
    the wrapper records as the command's: PID 1 of a namespace cannot die of most signals.
    The signals stay blocked here since the wrapper blocked them before its fork, so none
    is lost; they are taken with ``sigtimedwait``. Its phases are the wrapper's
    (:data:`PHASE_NEXT`): running -> stopping (the one TERM, ours or a stop's) -> killing
    (the SIGKILL passes), then the exit.
    """
    os.close(err_w)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # the output pipe stays the job's alone: its end is the job's end
    os.close(null)
    watched = (*_FORWARDED, _signal.SIGCHLD)
    status: int | None = None
    phase = RUNNING
    kill_at = 0.0  # from "stopping" on: the next SIGKILL pass (boot clock s)
    while True:
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return exit_code(status) if status is not None else 255
            if pid == 0:
                break
            if pid == command:
                status = raw
        now = boot_s()
        if status is not None and phase == RUNNING:
            phase = advance(phase, STOPPING)
            kill_at = now + job.terminate_grace_ms / 1000
            _kill_all(_signal.SIGTERM)
        if phase != RUNNING and now >= kill_at:
            phase = advance(phase, KILLING)
            _kill_all(_signal.SIGKILL)
            kill_at = now + _KILL_PASS_S
        info = _signal.sigtimedwait(watched, 30.0 if phase == RUNNING else max(kill_at - now, 0.001))
        if info is None or info.si_signo == _signal.SIGCHLD or info.si_pid != 0:
            continue
        if info.si_signo == _signal.SIGTERM:
            if phase != RUNNING:
                continue
            phase = advance(phase, STOPPING)
            kill_at = boot_s() + job.terminate_grace_ms / 1000
        _kill_all(info.si_signo)


def publish_retried(publication: Publication, data: bytes) -> bool:
    """:meth:`Publication.publish`, tried up to :data:`PUBLISH_ATTEMPTS` times with growing
    waits (0.1, 0.2, 0.4, 0.8 s) while it fails and nothing is published at its name (a
    full or failing disk: a job may have filled it); then the caller's "No receipt" path."""
    for attempt in range(PUBLISH_ATTEMPTS):
        if publication.publish(data):
            return True
        try:
            os.stat(publication.name, dir_fd=publication.dir_fd, follow_symlinks=False)
            return False  # published meanwhile (never replaced)
        except OSError:
            pass
        if attempt + 1 < PUBLISH_ATTEMPTS:
            time.sleep(_PUBLISH_WAIT_S * (1 << attempt))
    return False


def _child(job: Job, out_w: int, err_w: int) -> None:
    """In the forked child: set up and exec the command; never returns."""
    stage = "setup"
    code = CANNOT_EXECUTE
    try:
        for number in range(1, _signal.NSIG):
            try:
                _signal.signal(number, _signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError):
                pass  # SIGKILL, SIGSTOP and the C library's reserved signals
        devnull = os.open("/dev/null", os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        stage = "cgroup"
        _enter_job(job)
        for name in os.listdir("/proc/self/fd"):  # belt and braces: ours are all O_CLOEXEC
            if int(name) > 2 and int(name) != err_w:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        if job.isolate:
            stage = "isolation"
            keep = list(job.keep)
            if any(_under(job.cwd, h) for h in job.hide):
                keep.append(job.cwd)
            _isolate(job.hide, keep, job.readonly, pid=job.pidns is not None)
            if job.pidns is not None:
                _pid_namespace(job, err_w)  # returns in the command only: PID 2, in a session of its own
        stage = "chdir"
        os.chdir(job.cwd)
        stage = "exec"
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
        os.execve(job.argv[0], job.argv, job.env)  # noqa: S606 - argv, never a shell of ours
    except OSError as exc:
        number = exc.errno or 0
        if stage == "exec" and number == errno.ENOENT:
            code = NOT_FOUND
        _report(err_w, stage, number, str(exc) if stage == "isolation" else "")
    except BaseException as exc:  # noqa: BLE001 - nothing may return into the wrapper's loop
        _report(err_w, stage, 0, f"{type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def _report(fd: int, stage: str, number: int, text: str) -> None:
    try:
        os.write(fd, f"{stage}:{number}:{text}".encode("utf-8", "replace")[:4000])
    except OSError:
        pass


def _failure_line(job: Job, report: bytes) -> str:
    stage, _, rest = report.decode("utf-8", "replace").partition(":")
    number_text, _, text = rest.partition(":")
    number = int(number_text) if number_text.isdigit() else 0
    reason = os.strerror(number) if number else text
    command = os.fsdecode(job.argv[0])
    if stage == "exec":
        return f"cannot execute {command}: {reason}"
    if stage == "chdir":
        return f"cannot change to {os.fsdecode(job.cwd)}: {reason}"
    if stage == "isolation":
        return f"job isolation failed, {command} was not started: {text or reason}"
    if stage == "cgroup":
        return f"cannot start {command}: its memory cgroup: {reason}"
    return f"cannot start {command}: {text or reason}"


# -- the wrapper ---------------------------------------------------------------------------


class Supervisor:
    """Fork the command, forward signals, copy output, end its leftovers, reap (steps 4-6).

    Its :attr:`phase` (one of :data:`PHASE_NEXT`'s keys, moved by :meth:`_enter` only)::

        starting  -> running              forked
        running   -> stopping             a stop's TERM passed on (``kill_at`` = now +
                                          ``termgracems``); the command exited and its
                                          leftovers got our TERM; the lease stop (5a)
        running   -> draining             the command exited, nothing of it is left (or
                                          no subreaper: nothing of ours to end)
        stopping  -> killing              ``kill_at`` reached: SIGKILL passes for up to
                                          ``killgracems`` (``give_up_at``); without a
                                          subreaper only the lease stop kills the command
        stopping  -> draining             all gone before ``kill_at``
        killing   -> draining             all gone, or given up (stuck in the kernel)
        draining  -> closed               the pipe's end of file, or ``drainms`` over

    The init of a PID namespace (:func:`_init_loop`) walks running -> stopping -> killing
    of the same table and exits. Facts that stay flags, orthogonal to the phase: ``reaper``
    (a capability), ``status`` and ``alone`` (what ``waitpid`` said), ``term_spent``
    (every member has had its one TERM: ours to the leftovers or the lease stop's, so a
    stop's TERM is dropped from then on, in any later phase), ``lease_stopping`` (the
    stop is the lease's: the lease file is not read again). The phases of real jobs are
    checked against the table by ``tests/process/test_wrapper_phases.py``.
    """

    def __init__(self, job: Job) -> None:
        self.job = job
        self.pid = 0
        self.status: int | None = None
        self.phase = STARTING
        #: prctl(PR_SET_CHILD_SUBREAPER) worked: orphaned descendants are our children.
        self.reaper = False
        #: No child of ours is left, zombie or alive (waitpid said ECHILD).
        self.alone = False
        #: From ``stopping`` on: when the job's remaining descendants get SIGKILL (boot
        #: clock s); only ever brought forward.
        self.kill_at = 0.0
        #: The wrapper's own TERM went out (the leftovers', the lease stop's): a stop now
        #: adds no second one.
        self.term_spent = False
        #: In ``killing``: when the wrapper stops waiting (boot clock s).
        self.give_up_at = 0.0
        #: In ``draining``: when the drain ends (boot clock s).
        self.drain_until = 0.0
        #: The job is being stopped for its lease (step 5a).
        self.lease_stopping = False

    def _enter(self, phase: str) -> None:
        """Move to ``phase`` along :data:`PHASE_NEXT` (:func:`advance`)."""
        self.phase = advance(self.phase, phase)

    def _stop_timer(self, kill_at: float) -> None:
        """``running`` -> ``stopping`` with SIGKILL due at ``kill_at``; later, bring it forward."""
        if self.phase == RUNNING:
            self._enter(STOPPING)
            self.kill_at = kill_at
        else:
            self.kill_at = min(self.kill_at, kill_at)

    def _forward(self, number: int, frame: object) -> None:
        """Pass ``number`` on to the job, once (module docstring, step 5).

        A TERM that arrives after the wrapper itself sent its TERM to the command's
        leftovers is dropped: each of them has had its one TERM, its SIGKILL is due.
        """
        if self.pid <= 0:
            return  # unreachable: the signals stay blocked until the command is forked
        if number == _signal.SIGTERM:
            if self.term_spent:
                return
            if self.phase == RUNNING:
                self._stop_timer(boot_s() + self.job.terminate_grace_ms / 1000)
        self._signal_job(number)

    def _signal_job(self, number: int) -> None:
        """``number`` to each process of the job exactly once.

        The wrapper leads the group, so ``killpg(0)`` reaches exactly the job's members, a
        child being forked included; the signal is ignored here meanwhile (a signal whose
        disposition is "ignore" is discarded when generated), so the wrapper does not get
        it back. Then, as a subreaper, every descendant outside the group (``setsid``
        escapees), each through :func:`signal_descendants`.
        """
        try:
            _signal.signal(number, _signal.SIG_IGN)
            try:
                os.killpg(0, number)
            finally:
                _signal.signal(number, self._forward)
        except OSError:
            pass
        if self.reaper and self.job.pidns is None:  # in a PID namespace our init passes it on
            try:
                signal_descendants(number, skip_group=os.getpid())
            except OSError:
                pass  # an unreadable /proc: the SIGKILL passes retry

    def run(self) -> int:
        """Start the command and supervise it to its end; its exit code (module docstring).

        A failure to start it (``fork`` refused under a task cap, no descriptors left) is
        one line in the log and :data:`CANNOT_EXECUTE`. Should the copy loop itself fail,
        the wrapper still waits for the command before publishing.
        """
        job, log = self.job, self.job.log
        self.reaper = become_subreaper()
        if job.pidns is not None and not self.reaper:  # the init must re-parent to us
            job.env.clear()
            log.line(f"job isolation failed, {os.fsdecode(job.argv[0])} was not started: no child subreaper")
            return CANNOT_EXECUTE
        try:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            _signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            # Blocked before the handlers exist: a TERM from here on waits until the command
            # is forked and is then passed on to it (none is lost in between).
            watched = {*_FORWARDED, _signal.SIGCHLD}
            _signal.pthread_sigmask(_signal.SIG_BLOCK, watched)
            for number in _FORWARDED:
                _signal.signal(number, self._forward)
            _signal.signal(_signal.SIGCHLD, lambda n, f: None)  # only so that the wakeup fd fires
            try:
                self.pid = os.fork()
            finally:
                if self.pid != 0:
                    self._enter(RUNNING)  # before the signals: a pending TERM starts the stop's clock
                    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, watched)  # pending ones are forwarded now
        except OSError as exc:
            job.env.clear()
            log.line(f"cannot start {os.fsdecode(job.argv[0])}: {exc.strerror}")
            return CANNOT_EXECUTE
        if self.pid == 0:
            _child(job, out_w, err_w)
        job.env.clear()  # the secrets now live in the child only
        os.close(out_w)
        os.close(err_w)
        try:
            self._supervise(err_r, out_r, wake_r)
        except Exception:  # noqa: BLE001 - a bug here must not lose the outcome
            log.line("the job wrapper stopped copying output (internal error)")
            while self.status is None:
                pid, raw = os.waitpid(self.pid, 0)
                if pid == self.pid:
                    self.status = raw
        return exit_code(self.status) if self.status is not None else 255

    def _adopt_init(self, report: bytes) -> bytes:
        """Take the init's pid off the failure pipe (a PID namespace): from now on the
        command, for us, is that init (it re-parented to us, a subreaper, when the process
        that forked it exited); the rest is a failure report as before."""
        start = report.find(_INIT_MARK)
        if start < 0:
            return report
        end = report.find(b"\0", start + 1)
        number = report[start + len(_INIT_MARK): end if end > 0 else len(report)]
        if number.isdigit():
            self.pid = int(number)
        return report[:start] + (report[end + 1:] if end > 0 else b"")

    def _reap(self) -> None:
        """Collect every child that exited: the command (its status) and, as a subreaper,
        adopted orphans, whose zombies would otherwise hold tasks of the job's PID cap."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.alone = True
                return
            if pid == 0:
                self.alone = False
                return
            if pid == self.pid:
                self.status = status

    def _end(self, now: float) -> float | None:
        """One step of ending the job (step 6); seconds until the next step, None to wait
        for an event only, or -1.0 once no descendant is left (or the kill grace is over)."""
        job = self.job
        if self.status is not None and (not self.reaper or self.alone):
            return -1.0
        if not self.reaper:
            return None  # the command still runs; nothing of ours to end
        if self.phase == RUNNING:
            if self.status is None:
                return None
            self.term_spent = True  # leftovers of a command that exited by itself: one TERM each
            self._stop_timer(now + job.terminate_grace_ms / 1000)
            self._signal_job(_signal.SIGTERM)
        if self.phase == STOPPING:
            if now < self.kill_at:
                return self.kill_at - now
            self.give_up_at = now + job.kill_grace_ms / 1000
            self._enter(KILLING)
        elif now >= self.give_up_at:
            # SIGKILL is pending on whatever is left (stuck in the kernel): it never runs
            # user code again. The receipt is not held back for it.
            return -1.0 if self.status is not None else None
        try:
            signal_descendants(_signal.SIGKILL)  # the command too: nothing left to wait for
        except OSError:
            pass
        return min(_KILL_PASS_S, max(0.0, self.give_up_at - now))

    def _supervise(self, err_r: int, out_r: int, wake_r: int) -> None:
        job, log = self.job, self.job.log
        report = b""
        while True:
            chunk = os.read(err_r, 4096)
            if not chunk:
                break
            report += chunk
        os.close(err_r)
        report = self._adopt_init(report)
        if report:
            log.line(_failure_line(job, report))
        os.set_blocking(out_r, False)
        poller = select.poll()
        poller.register(out_r, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        out_open = True
        while True:
            self._reap()
            now = boot_s()
            if self.phase != DRAINING:
                lease_wait = self._lease(now)
                wait = self._end(now)
                if wait is not None and wait < 0:
                    self._enter(DRAINING)  # the command and its descendants are gone
                    self.drain_until = now + job.drain_ms / 1000
                elif lease_wait is not None:
                    wait = lease_wait if wait is None else min(wait, lease_wait)
            if self.phase == DRAINING:
                if not out_open or now >= self.drain_until:
                    break
                wait = self.drain_until - now
            for fd, _ in poller.poll(None if wait is None else wait * 1000):
                if fd == wake_r:
                    try:
                        while os.read(wake_r, 256):
                            pass
                    except BlockingIOError:
                        pass
                elif not self._copy(out_r):
                    poller.unregister(out_r)
                    out_open = False
        os.close(out_r)  # a holder still writing gets EPIPE: nobody reads any more
        self._enter(CLOSED)

    def _lease(self, now: float) -> float | None:
        """Step 5a: the stop of a job whose lease the agent stopped renewing (a frozen or
        killed agent). Seconds until the lease needs a look again, None without one.

        At the lease file's ``stopAtBootMs`` the file is read again (a live agent has
        moved it later at every renewal); if it still says so, the mark is created, the
        command's group gets TERM (as a forwarded one: nobody gets a second), and SIGKILL
        follows after the lease's terminate grace, so the job is gone by the lease's
        local expiry. A command that has exited already gets no mark (its outcome is its
        own); only its leftovers' SIGKILL is brought forward.
        """
        watch = self.job.lease
        if watch is None:
            return None
        if self.lease_stopping:
            if not self.reaper and self.status is None and now >= self.kill_at:
                if self.phase == STOPPING:
                    self._enter(KILLING)
                try:
                    os.kill(self.pid, _signal.SIGKILL)  # no subreaper: the command itself, at least
                except OSError:
                    pass
                return None
            return None if self.reaper else max(0.0, self.kill_at - now)
        left = watch.stop_at_ms / 1000 - now
        if left > 0:
            return left
        watch.refresh()
        left = watch.stop_at_ms / 1000 - now
        if left > 0:
            return left
        self.lease_stopping = True
        if self.status is None:
            watch.mark()
            if not self.term_spent and self.phase == RUNNING:
                self._signal_job(_signal.SIGTERM)
            self.term_spent = True  # a stop's TERM after this one is dropped (each member has had one)
        self._stop_timer(now + watch.terminate_grace_ms / 1000)
        return max(0.0, self.kill_at - now)

    def _copy(self, fd: int) -> bool:
        """Copy what the pipe holds (bounded per call); False at end of file."""
        for _ in range(16):
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                return True
            if not data:
                return False
            self.job.log.keep(data)
        return True


def _answer(line: bytes) -> None:
    try:
        _write_all(1, line)
    except OSError:
        pass


def _set_comm() -> None:
    try:
        fd = os.open("/proc/self/comm", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, COMM)
        finally:
            os.close(fd)
    except OSError:
        pass


def _finish(job: Job, code: int) -> None:
    """Step 7: fsync the log, then the fact, then the receipt."""
    log = job.log
    log.sync()
    now = time.time_ns() // 1_000_000
    finished = max(now, job.started_at_ms)
    if job.fact is not None:
        job.fact.publish(job.fact.prefix + fact_suffix(
            job.fact_keys, truncated=log.truncated, observed_ms=finished, kept=log.kept, discarded=log.discarded))
    if job.receipt is not None:
        publish_retried(job.receipt, job.receipt.prefix + receipt_suffix(finished, code))


def main(argv: list[str]) -> int:
    """The wrapper's life (module docstring); returns its exit status."""
    _set_comm()
    source = argv[0].rpartition("/")[2] if argv and argv[0].startswith("/proc/self/fd/") else ""
    if source.isdigit() and int(source) > 2:
        try:
            os.close(int(source))
        except OSError:
            pass
    reader = SpecReader(0)
    try:
        job = Job(reader.read())
    except SpecError as exc:
        reader.wipe()
        _answer(f"error {exc.code} {exc.text}".replace("\n", " ").encode("utf-8", "replace")[:1000] + b"\n")
        return NOT_STARTED
    except Exception as exc:  # noqa: BLE001 - report anything, never run the command
        reader.wipe()
        _answer(f"error internal {type(exc).__name__}".encode() + b"\n")
        return NOT_STARTED
    _answer(READY)
    released = reader.release()
    reader.wipe()
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)  # nothing of the agent stays open here after the release
    os.dup2(devnull, 1)
    os.close(devnull)
    if not released:
        return NOT_STARTED
    code = Supervisor(job).run()
    _finish(job, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
