"""The file half of a streamed upload (remote-execution.md 3.6, the artifact route).

Used by :meth:`qinglong_edge.worker.ingress.transport.IngressTransport.post_stream`, which sends
the head and the prefix; :func:`send_file` then sends ``length`` bytes of a regular
file from ``offset`` without holding it: ``preadv`` into one :data:`STREAM_CHUNK_BYTES`
buffer (the file position is neither used nor moved), each chunk hashed and sent.

A file that changes under the upload is never completed: before its last chunk is
sent, its size and mtime (and device and inode) must still be what they were when
the upload started, and a read that ends early (the file shrank) stops it too -- the
body then arrives short and the cluster refuses it (its content-length check).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.tls_wire import Deadline, SourceChanged, Wire

__all__ = [
    "MAX_STREAM_SOURCE_BYTES",
    "MIN_UPLOAD_BYTES_PER_S",
    "STREAM_CHUNK_BYTES",
    "SourceChanged",
    "StreamSource",
    "pread_into",
    "send_file",
]

#: Largest streamed file part: the artifact route's ``byteLength`` maximum (64 MiB).
MAX_STREAM_SOURCE_BYTES = 64 * 1024 * 1024
#: Bytes read from the file and sent per step (the memory a stream holds).
STREAM_CHUNK_BYTES = 64 * 1024
#: A stream's hard deadline grows by its size at this rate (bytes/s): a slow uplink may
#: take its time, a peer that reads a byte a minute may not (the inactivity timeout
#: still applies to every send).
MIN_UPLOAD_BYTES_PER_S = 16 * 1024


def _bad_call(message: str) -> TransportError:
    return TransportError(message, code="request_rejected", reason="invalid_request")


def _count(value: object, high: int, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise _bad_call(f"{name} must be an integer from 0 to {high}")
    return value


class StreamSource:
    """``length`` bytes of the regular file ``source`` (a descriptor or a file object
    with ``fileno()``) from ``offset``, checked when made.

    Raises:
        TransportError: ``request_rejected`` / ``invalid_request``: not a regular file,
            fewer than ``offset + length`` bytes, a length over 64 MiB.
    """

    __slots__ = ("fd", "length", "offset", "signature")

    def __init__(self, source: object, length: object, offset: object) -> None:
        fd = source if isinstance(source, int) and not isinstance(source, bool) else None
        if fd is None:
            fileno = getattr(source, "fileno", None)
            try:
                fd = fileno() if callable(fileno) else None
            except (OSError, ValueError):  # io.UnsupportedOperation: no descriptor (BytesIO)
                fd = None
            if not isinstance(fd, int):
                raise _bad_call("source must be a file descriptor or a file object")
        self.fd = fd
        self.length = _count(length, MAX_STREAM_SOURCE_BYTES, "length")
        self.offset = _count(offset, 1 << 62, "offset")
        try:
            info = os.fstat(fd)
        except OSError as exc:
            raise _bad_call(f"source: cannot stat ({exc.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            raise _bad_call("source must be a regular file")
        if info.st_size < self.offset + self.length:
            raise _bad_call(f"source holds {info.st_size} bytes, fewer than offset + length")
        self.signature = self._signature(info)

    @staticmethod
    def _signature(info: os.stat_result) -> tuple[int, int, int, int]:
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def check_unchanged(self) -> None:
        """Raises :class:`SourceChanged` when size or mtime moved since the start."""
        try:
            now = self._signature(os.fstat(self.fd))
        except OSError:
            raise SourceChanged("the source file cannot be stat'ed any more") from None
        if now != self.signature:
            raise SourceChanged("the source file changed size or content during the upload")


def pread_into(fd: int, view: memoryview, position: int) -> int:
    """Read into ``view`` at file ``position``; the number of bytes read (0 at EOF)."""
    preadv = getattr(os, "preadv", None)
    if preadv is not None:
        count: int = preadv(fd, [view], position)
        return count
    data = os.pread(fd, len(view), position)
    view[: len(data)] = data
    return len(data)


def send_file(wire: Wire, stream: StreamSource, update: Callable[[bytes], None], deadline: Deadline) -> bool:
    """Send the file part on ``wire``, each chunk passed to ``update`` (a hash) first.

    Returns:
        True when all was sent; False when the server answered (or closed, or sent an
        alert) before that -- looked at between chunks, as curl does, because once the
        server resets the connection its answer is lost with it.

    Raises:
        SourceChanged: see the module docstring.
        OSError: from the socket.
    """
    buffer = bytearray(min(STREAM_CHUNK_BYTES, max(1, stream.length)))
    view = memoryview(buffer)
    position, remaining = stream.offset, stream.length
    with view:
        while remaining:
            want = min(len(buffer), remaining)
            got = pread_into(stream.fd, view[:want], position)
            if got == 0:
                raise SourceChanged("the source file ended early (it shrank during the upload)")
            if got == remaining:
                stream.check_unchanged()  # before the last bytes: a changed file is never completed
            chunk = view[:got]
            update(chunk)  # type: ignore[arg-type]  # the hash takes any buffer
            wire.sock.settimeout(deadline.budget())
            wire.sock.sendall(chunk)
            position += got
            remaining -= got
            if remaining and wire.read_ready() is not None:
                return False
    return True
