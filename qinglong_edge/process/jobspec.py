"""The job spec: what the job wrapper runs, and its bytes on the control pipe.

Shared by every caller of :func:`qinglong_edge.process.spawn.start_job` (Local Runs,
remote runs). The wire between the agent and the wrapper (frames ``TAG SP LENGTH LF
DATA LF`` after :data:`MAGIC`, ``end``, then the release line) is described in
:mod:`qinglong_edge.process.wrapper`, the program that reads it; the agent does not
import that program (parsing it would cost the agent ~2.4 MiB), so the protocol's
constants are repeated here and ``tests/process/test_spawn.py`` checks they agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.cgroups import RunCgroup

__all__ = [
    "CANNOT_EXECUTE",
    "DEFAULT_DRAIN_MS",
    "DEFAULT_FACT_KEYS",
    "DEFAULT_KILL_GRACE_MS",
    "DEFAULT_TERMINATE_GRACE_MS",
    "FACT_KEYS",
    "MAGIC",
    "MAX_DRAIN_MS",
    "MAX_GRACE_MS",
    "MAX_PREFIX_BYTES",
    "MAX_SPEC_BYTES",
    "NOT_FOUND",
    "NOT_STARTED",
    "PID_NAMESPACE",
    "PID_NONE",
    "PID_PRIVATE_PROC",
    "READY",
    "RELEASE",
    "Isolation",
    "JobSpec",
    "Publication",
    "encode_spec",
    "wipe",
]

MAGIC = b"qinglong-edge-job 1\n"
RELEASE = b"go\n"
READY = b"ready\n"
#: Exit statuses of the wrapper: the command never started (spec, end of file, no
#: release); could not be executed (EACCES, ENOEXEC, chdir, isolation, fork); not found.
NOT_STARTED = 125
CANNOT_EXECUTE = 126
NOT_FOUND = 127
MAX_SPEC_BYTES = 4 * 1024 * 1024
MAX_PREFIX_BYTES = 4000
DEFAULT_DRAIN_MS = 2000
MAX_DRAIN_MS = 600_000
#: The wrapper's graces for the job's leftover descendants (ms; config.py's defaults and
#: bound of ``execution.terminateGraceMs`` / ``killGraceMs``, as :mod:`.stop` uses).
DEFAULT_TERMINATE_GRACE_MS = 5000
DEFAULT_KILL_GRACE_MS = 1000
MAX_GRACE_MS = 30_000
FACT_KEYS = ("quotaReached", "observedAtMs", "keptBytes", "discardedBytes")
DEFAULT_FACT_KEYS = ("quotaReached", "observedAtMs")
#: What a ``label`` may hold (it is shown by ``ps``).
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-/")


class Publication:
    """A file the wrapper publishes once at the end (receipt or truncation fact).

    Attributes:
        path: absolute path; its directory is created 0700 when missing.
        prefix: the caller's bytes (1..4000), to which the wrapper appends its keys and
            the closing ``}`` (see :mod:`qinglong_edge.process.wrapper`):
            ``contracts.receipt.receipt_prefix`` / ``truncation_fact_prefix``. Kept by
            reference, not copied: zero a ``bytearray`` once :func:`start_job` returned.
    """

    __slots__ = ("path", "prefix")

    def __init__(self, path: str, prefix: bytes | bytearray) -> None:
        self.path = path
        self.prefix = prefix  # not copied: a receipt prefix (the callback token) is the caller's to wipe

    def __repr__(self) -> str:  # the receipt prefix holds the callback token: never shown
        return f"Publication({self.path!r}, <{len(self.prefix)} bytes>)"


#: :attr:`Isolation.pid` values: no PID namespace, one (the host's ``/proc`` stays
#: mounted), one with a private ``/proc`` (the levels ``doctor`` reports).
PID_NONE, PID_NAMESPACE, PID_PRIVATE_PROC = "none", "pidns", "pidns+proc"


class Isolation:
    """A private user + mount namespace for the job (spec README, "Isolation").

    Attributes:
        hide: absolute paths the job must not see (a directory becomes an empty
            read-only tmpfs, a file a read-only ``/dev/null``); missing ones are skipped.
        keep: absolute paths below a hidden directory that stay visible and writable
            (the job's ``cwd`` is kept automatically).
        readonly: absolute paths the job still sees but only read-only (each bound onto
            itself read-only: write EROFS, rename or unlink EBUSY); missing ones skipped.
        pid: :data:`PID_NONE`, :data:`PID_NAMESPACE` (a PID namespace whose PID 1 is our
            init, the command PID 2 in a session of its own) or :data:`PID_PRIVATE_PROC`
            (the same with a private ``/proc``).

    The job fails with 126 (one line in its log, never run) when the namespace cannot be
    made; :func:`qinglong_edge.process.isolation.probe_isolation` says beforehand which
    level works.
    """

    __slots__ = ("hide", "keep", "pid", "readonly")

    def __init__(self, hide: Sequence[str], keep: Sequence[str] = (), readonly: Sequence[str] = (),
                 pid: str = PID_NONE) -> None:
        if pid not in (PID_NONE, PID_NAMESPACE, PID_PRIVATE_PROC):
            raise _invalid(f"isolation pid level must be {PID_NONE}, {PID_NAMESPACE} or {PID_PRIVATE_PROC}")
        self.hide = tuple(hide)
        self.keep = tuple(keep)
        self.readonly = tuple(readonly)
        self.pid = pid

    def __repr__(self) -> str:
        return f"Isolation(hide={self.hide!r}, keep={self.keep!r}, readonly={self.readonly!r}, pid={self.pid!r})"


class JobSpec:
    """Everything the wrapper needs to run one job (all sizes in bytes, times in ms).

    Attributes:
        argv: the command; ``argv[0]`` an absolute path (no ``PATH`` lookup happens).
        env: the job's complete environment (values may be secrets: ``str``, ``bytes``
            or ``bytearray``, not copied; never shown by ``repr``). For a remote job:
            ``dict(zip(environment.names, environment.values))`` of
            ``contracts.launch.materialize_environment``, then ``environment.wipe()``
            once :func:`start_job` returned (the wrapper has its own copy by then).
        cwd: the job's absolute working directory (must exist).
        log_path: absolute path of the log file (created 0600, appended to; its
            directory is created 0700); stdout and stderr go there, merged, raw.
        log_cap: the log file's size cap; bytes already in the file count. Output
            beyond it is read and discarded.
        log_notice: appended once when output is cut (Local: a notice line; remote:
            empty, the truncation goes only in the fact, remote-execution.md 4.3).
        drain_ms: how long output is still copied after the command exits (its
            grandchildren may hold the pipe), 0..600000; with the wrapper a child
            subreaper, counted from when the last descendant is gone.
        terminate_grace_ms, kill_grace_ms: 1..30000, the stop's graces (the caller's
            ``execution.terminateGraceMs`` / ``killGraceMs``): the wrapper, a child
            subreaper, ends the job's descendants left when the command exits or when it
            is stopped with SIGTERM, then SIGKILL after ``terminate_grace_ms``, and waits
            up to ``kill_grace_ms`` more for them (:mod:`qinglong_edge.process.wrapper`).
        truncation_fact: published at the end when set; the wrapper appends
            ``fact_keys`` (``,"quotaReached":B,"observedAtMs":N`` by default) and ``}``.
        fact_keys: a subset of ``quotaReached``, ``observedAtMs``, ``keptBytes``,
            ``discardedBytes``, in the order to write.
        receipt: published at the end when set; the wrapper appends
            ``,"finishedAtMs":N,"exitCode":E}``.
        started_at_ms: the receipt's ``startedAtMs`` (required with ``receipt``):
            ``finishedAtMs`` is clamped to be >= it.
        isolation: :class:`Isolation`, or ``None`` (no namespace).
        label: shown in ``ps`` after ``qinglong-edge-job`` (e.g. the attempt id; not a
            secret): 0..128 of ``[A-Za-z0-9._:/-]``.
        lease_file, lease_stop_file: a remote job's lease file in the runtime directory
            and the mark the wrapper creates when it stops the job because the lease was
            not renewed in time (:mod:`qinglong_edge.worker.remote.lease`; the wrapper's
            step 5a); absolute paths, both or neither.
    """

    __slots__ = (
        "argv",
        "cwd",
        "drain_ms",
        "env",
        "fact_keys",
        "isolation",
        "kill_grace_ms",
        "label",
        "lease_file",
        "lease_stop_file",
        "log_cap",
        "log_notice",
        "log_path",
        "receipt",
        "started_at_ms",
        "terminate_grace_ms",
        "truncation_fact",
    )

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str | bytes | bytearray],
        cwd: str,
        log_path: str,
        log_cap: int,
        *,
        log_notice: bytes = b"",
        drain_ms: int = DEFAULT_DRAIN_MS,
        terminate_grace_ms: int = DEFAULT_TERMINATE_GRACE_MS,
        kill_grace_ms: int = DEFAULT_KILL_GRACE_MS,
        truncation_fact: Publication | None = None,
        fact_keys: Sequence[str] = DEFAULT_FACT_KEYS,
        receipt: Publication | None = None,
        started_at_ms: int | None = None,
        isolation: Isolation | None = None,
        label: str = "",
        lease_file: str | None = None,
        lease_stop_file: str | None = None,
    ) -> None:
        self.argv = tuple(argv)
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.log_cap = log_cap
        self.log_notice = log_notice
        self.drain_ms = drain_ms
        self.terminate_grace_ms = terminate_grace_ms
        self.kill_grace_ms = kill_grace_ms
        self.truncation_fact = truncation_fact
        self.fact_keys = tuple(fact_keys)
        self.receipt = receipt
        self.started_at_ms = started_at_ms
        self.isolation = isolation
        self.label = label
        self.lease_file = lease_file
        self.lease_stop_file = lease_stop_file

    def __repr__(self) -> str:
        return (f"JobSpec(argv[0]={self.argv[0] if self.argv else None!r}, cwd={self.cwd!r}, "
                f"env=<{len(self.env)} variables>, log_path={self.log_path!r})")


def _invalid(message: str) -> ExecutionError:
    return ExecutionError(message, code="invalid_input")


def _path(value: str, what: str) -> bytes:
    raw = os.fsencode(value)
    if not raw.startswith(b"/") or b"\0" in raw or os.path.normpath(raw) == b"/":
        raise _invalid(f"{what} must be an absolute path other than /")
    return raw


def _frame(buffer: bytearray, tag: bytes, *parts: bytes | bytearray) -> None:
    """Append one frame without building an intermediate copy of its value."""
    size = sum(len(p) for p in parts)
    buffer += tag + b" " + str(size).encode("ascii") + b"\n"
    for part in parts:
        buffer += part
    buffer += b"\n"


def _value(value: str | bytes | bytearray) -> bytes | bytearray:
    return os.fsencode(value) if isinstance(value, str) else value


def encode_spec(spec: JobSpec, cgroup: RunCgroup | None = None) -> bytearray:
    """The control-pipe bytes of ``spec`` (see :mod:`qinglong_edge.process.wrapper`).

    The caller overwrites the returned buffer after use (it holds the environment).

    Raises:
        ExecutionError: ``invalid_input`` for an unusable spec (the rules of
            :class:`JobSpec`); nothing is started.
    """
    if not spec.argv:
        raise _invalid("empty command")
    if len(spec.label) > 128 or not set(spec.label) <= _LABEL_CHARS:
        raise _invalid("label must be 0..128 of [A-Za-z0-9._:/-]")
    buffer = bytearray(MAGIC)
    try:
        if cgroup is not None:
            for procs in cgroup.procs_files():
                _frame(buffer, b"cgroup", _path(procs, "cgroup.procs"))
            for procs in cgroup.job_procs_files():
                _frame(buffer, b"jobcgroup", _path(procs, "cgroup.procs"))
        _frame(buffer, b"argv", _path(spec.argv[0], "argv[0]"))
        for arg in spec.argv[1:]:
            raw = os.fsencode(arg)
            if b"\0" in raw:
                raise _invalid("NUL in an argument")
            _frame(buffer, b"argv", raw)
        for name, value in spec.env.items():
            key = os.fsencode(name)
            data = _value(value)
            if not key or b"=" in key or b"\0" in key or b"\0" in data:
                raise _invalid("environment names must be non-empty without '=' or NUL, values without NUL")
            _frame(buffer, b"env", key, b"=", data)
        _frame(buffer, b"cwd", _path(spec.cwd, "cwd"))
        _frame(buffer, b"log", _path(spec.log_path, "log_path"))
        cap = spec.log_cap
        if isinstance(cap, bool) or not isinstance(cap, int) or not len(spec.log_notice) < cap <= 1 << 40:
            raise _invalid("log_cap must be an int above len(log_notice)")
        _frame(buffer, b"logcap", str(cap).encode("ascii"))
        if spec.log_notice:
            _frame(buffer, b"notice", bytes(spec.log_notice))
        if not isinstance(spec.drain_ms, int) or not 0 <= spec.drain_ms <= MAX_DRAIN_MS:
            raise _invalid(f"drain_ms must be 0..{MAX_DRAIN_MS}")
        _frame(buffer, b"drainms", str(spec.drain_ms).encode("ascii"))
        for tag, name, grace in ((b"termgracems", "terminate_grace_ms", spec.terminate_grace_ms),
                                 (b"killgracems", "kill_grace_ms", spec.kill_grace_ms)):
            if isinstance(grace, bool) or not isinstance(grace, int) or not 1 <= grace <= MAX_GRACE_MS:
                raise _invalid(f"{name} must be 1..{MAX_GRACE_MS} ms")
            _frame(buffer, tag, str(grace).encode("ascii"))
        for tag, publication in ((b"fact", spec.truncation_fact), (b"receipt", spec.receipt)):
            if publication is None:
                continue
            if not 1 <= len(publication.prefix) <= MAX_PREFIX_BYTES:
                raise _invalid(f"the {tag.decode()} prefix must be 1..{MAX_PREFIX_BYTES} bytes")
            _frame(buffer, tag, _path(publication.path, tag.decode()))
            _frame(buffer, tag + b"prefix", publication.prefix)
        if spec.truncation_fact is not None:
            keys = spec.fact_keys
            if not keys or not set(keys) <= set(FACT_KEYS) or len(set(keys)) != len(keys):
                raise _invalid(f"fact_keys must be distinct names of {FACT_KEYS}")
            _frame(buffer, b"factkeys", ",".join(keys).encode("ascii"))
        if spec.receipt is not None:
            started = spec.started_at_ms
            if isinstance(started, bool) or not isinstance(started, int) or not 0 <= started <= 2**53 - 1:
                raise _invalid("a receipt needs started_at_ms (a safe integer >= 0)")
            _frame(buffer, b"startedatms", str(started).encode("ascii"))
        if spec.isolation is not None:
            _frame(buffer, b"isolate", b"userns")
            for path in spec.isolation.hide:
                _frame(buffer, b"hide", _path(path, "a hidden path"))
            for path in spec.isolation.keep:
                _frame(buffer, b"keep", _path(path, "a kept path"))
            for path in spec.isolation.readonly:
                _frame(buffer, b"readonly", _path(path, "a read-only path"))
            if spec.isolation.pid != PID_NONE:
                _frame(buffer, b"pidns", b"proc" if spec.isolation.pid == PID_PRIVATE_PROC else b"noproc")
        _lease_frames(buffer, spec)
        _frame(buffer, b"end")
    except BaseException:
        wipe(buffer)
        raise
    if len(buffer) > MAX_SPEC_BYTES:
        wipe(buffer)
        raise _invalid(f"the job spec exceeds {MAX_SPEC_BYTES} bytes")
    return buffer


def _lease_frames(buffer: bytearray, spec: JobSpec) -> None:
    if (spec.lease_file is None) != (spec.lease_stop_file is None):
        raise _invalid("lease_file and lease_stop_file come together")
    if spec.lease_file is not None and spec.lease_stop_file is not None:
        _frame(buffer, b"leasefile", _path(spec.lease_file, "lease_file"))
        _frame(buffer, b"leasestop", _path(spec.lease_stop_file, "lease_stop_file"))


def wipe(buffer: bytearray) -> None:
    buffer[:] = bytes(len(buffer))
