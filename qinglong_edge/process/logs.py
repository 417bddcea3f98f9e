"""Bounded Run output: the job writes into a FIFO, the controller drains it into a file.

Choice (issue 9): a job that writes more than ``execution.maxLogBytes`` must not fill the
flash. ``RLIMIT_FSIZE`` would cap *every* file the job writes (and kill it with SIGXFSZ),
and a plain file cannot be capped at all, so stdout and stderr go to a pipe and the
controller thread copies at most ``max_bytes`` of it into ``<logArtifactId>.log``; the
rest is read and discarded (the job never blocks because its log is full) and one
truncation notice closes the file.

The pipe is a named FIFO ``<logArtifactId>.fifo`` in the log directory, and the job also
inherits one *read* end of it that it never uses. Both matter when the agent dies: the
FIFO keeps a reader, so the job's writes block (back-pressure, 64 KiB of buffer) instead
of killing it with SIGPIPE, and the restarted agent reopens the FIFO by name and carries
on draining. Output written while no agent runs is kept up to the pipe buffer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from qinglong_edge.errors import ExecutionError

__all__ = ["TRUNCATION_NOTICE", "LogSink", "create_fifo"]

#: Appended once when output is cut; it fits inside ``max_bytes``.
TRUNCATION_NOTICE = b"\n[qinglong-edge: output truncated]\n"
#: Bytes read from the FIFO per drain call (bounds the time one Run can take).
_CHUNK = 64 * 1024


def create_fifo(path: str) -> None:
    """Create the FIFO ``path`` (0600); an existing FIFO left by a crashed launch is reused.

    Raises:
        ExecutionError: ``log_unavailable`` when it cannot be created or a non-FIFO
            file has that name.
    """
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise ExecutionError(f"{path}: {exc.strerror}", code="log_unavailable") from None
        if not stat.S_ISFIFO(st.st_mode):
            raise ExecutionError(f"{path}: exists and is not a FIFO", code="log_unavailable") from None
    except OSError as exc:
        raise ExecutionError(f"{path}: {exc.strerror}", code="log_unavailable") from None


class LogSink:
    """Drains one Run's FIFO into its capped log file.

    Attributes:
        fifo_path, log_path: the two files (both under ``execution.logDirectory``).
        fd: the non-blocking read end the controller polls.
        written: bytes in the log file, at most ``max_bytes``.
        truncated: True once output was cut.
        closed: True after end of file (no writer left) or :meth:`close`.
    """

    def __init__(self, fifo_path: str, log_path: str, max_bytes: int) -> None:
        if max_bytes < len(TRUNCATION_NOTICE) + 1:
            raise ExecutionError("max_bytes is too small", code="invalid_input")
        self.fifo_path = fifo_path
        self.log_path = log_path
        self.max_bytes = max_bytes
        self.closed = False
        try:
            self.fd = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise ExecutionError(f"{fifo_path}: {exc.strerror}", code="log_unavailable") from None
        try:
            self._log = os.open(
                log_path,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW,
                0o600,
            )
            self.written = os.fstat(self._log).st_size
        except OSError as exc:
            os.close(self.fd)
            raise ExecutionError(f"{log_path}: {exc.strerror}", code="log_unavailable") from None
        self.truncated = self.written >= self.max_bytes

    def open_writer(self) -> int:
        """A blocking write end for the job's stdout/stderr (close it after spawning)."""
        try:
            return os.open(self.fifo_path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise ExecutionError(f"{self.fifo_path}: {exc.strerror}", code="log_unavailable") from None

    def open_keepalive_reader(self) -> int:
        """A read end handed to the job so that it never gets SIGPIPE (module docstring)."""
        try:
            return os.open(self.fifo_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise ExecutionError(f"{self.fifo_path}: {exc.strerror}", code="log_unavailable") from None

    def _keep(self, data: bytes) -> None:
        room = self.max_bytes - len(TRUNCATION_NOTICE) - self.written
        if self.truncated:
            return
        if len(data) > room:
            data = data[: max(room, 0)] + TRUNCATION_NOTICE
            self.truncated = True
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._log, view)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
                    # A full disk must not stop the Run: keep draining, stop keeping.
                    self.truncated = True
                    return
                raise ExecutionError(f"{self.log_path}: {exc.strerror}", code="log_unavailable") from None
            self.written += n
            view = view[n:]

    def drain(self, budget: int = 4 * _CHUNK) -> bool:
        """Read what is buffered (up to ``budget`` bytes) without blocking.

        Returns:
            False once every writer has closed (end of file); True otherwise.
        """
        if self.closed:
            return False
        taken = 0
        while taken < budget:
            try:
                data = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                self.close()
                return False
            if not data:
                self.close()
                return False
            taken += len(data)
            self._keep(data)
        return True

    def close(self) -> None:
        """Close both descriptors (idempotent); the files stay."""
        if self.closed:
            return
        self.closed = True
        for fd in (self.fd, self._log):
            with contextlib.suppress(OSError):
                os.close(fd)

    def remove_fifo(self) -> None:
        """Unlink the FIFO once the Run is over (the log file stays)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.fifo_path)
