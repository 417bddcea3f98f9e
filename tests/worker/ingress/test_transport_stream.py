"""The streaming upload of the artifact route (remote-execution.md 3.6) over real TLS.

``post_stream`` sends ``prefix`` + N file bytes with an exact ``content-length``, never
chunked, reading the file in <= 64 KiB steps; a file that changes under it fails with
``source_changed`` and the body is cut short. Memory: Python allocations during a
4 MiB upload stay far below the file (tracemalloc; the RSS figure is in
benchmarks/bench_transport.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

import qinglong_edge.worker.ingress.stream as stream_module
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.stream import STREAM_CHUNK_BYTES
from qinglong_edge.worker.ingress.transport import ARTIFACT_CONTENT_TYPE
from tests.support.tls_server import Request, TLSServer, http_response
from tests.support.transport_env import OFFER_PATH, WorkerFiles, expect_error, leak_guard

pytestmark = pytest.mark.usefixtures("no_leaks")

ARTIFACT_PATH = OFFER_PATH.replace("/offers", "/artifacts")
HEADER = b'{"schema":"qinglong/remote-worker-artifact-upload@v1"}'
PREFIX = len(HEADER).to_bytes(4, "big") + HEADER
ANSWER = b'{"schema":"qinglong/remote-worker-artifact-upload@v1","status":"stored"}'
MIB = 1024 * 1024


def log_file(tmp_path: pathlib.Path, size: int, name: str = "attempt.log") -> pathlib.Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


def stored(request: Request) -> bytes:
    return http_response(200, ANSWER)


def upload(files: WorkerFiles, origin: str, path: pathlib.Path, length: int | None = None, **kwargs: Any) -> Any:
    with files.transport(origin, timeout_ms=5000) as transport, path.open("rb") as handle:
        return transport.post_stream(ARTIFACT_PATH, PREFIX, handle, path.stat().st_size if length is None else length,
                                     max_response_bytes=4096, **kwargs)


@pytest.mark.parametrize("size", [0, 1, STREAM_CHUNK_BYTES - 1, STREAM_CHUNK_BYTES, STREAM_CHUNK_BYTES + 1, 5 * MIB + 3])
def test_streams_prefix_and_file_with_an_exact_length(files: WorkerFiles, tmp_path: pathlib.Path, size: int) -> None:
    path = log_file(tmp_path, size)
    with TLSServer(stored) as server:
        response = upload(files, server.origin(), path)
    (request,) = server.requests
    assert request.body == PREFIX + path.read_bytes()
    assert request.header("content-length") == str(len(PREFIX) + size)
    assert request.header("content-type") == ARTIFACT_CONTENT_TYPE
    assert request.header("transfer-encoding") is None
    assert request.header("authorization") == files.authorization
    assert request.header("accept") == "application/json"
    assert request.target == ARTIFACT_PATH
    assert response.body == ANSWER
    assert response.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_streams_a_part_of_a_file_by_offset(files: WorkerFiles, tmp_path: pathlib.Path) -> None:
    path = log_file(tmp_path, 300_000)
    with TLSServer(stored) as server:
        with files.transport(server.origin()) as transport:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.lseek(fd, 17, os.SEEK_SET)
                response = transport.post_stream(ARTIFACT_PATH, PREFIX, fd, 200_000, offset=1000,
                                                 max_response_bytes=4096)
                assert os.lseek(fd, 0, os.SEEK_CUR) == 17  # pread: the position is not used
            finally:
                os.close(fd)
    assert server.requests[0].body == PREFIX + path.read_bytes()[1000:201_000]
    assert response.source_sha256 == hashlib.sha256(path.read_bytes()[1000:201_000]).hexdigest()


def test_the_connection_is_kept_for_the_next_call(files: WorkerFiles, tmp_path: pathlib.Path) -> None:
    path = log_file(tmp_path, 200_000)
    with TLSServer(stored) as server, files.transport(server.origin()) as transport:
        for _ in range(2):
            with path.open("rb") as handle:
                transport.post_stream(ARTIFACT_PATH, PREFIX, handle, 200_000, max_response_bytes=4096)
    assert [r.connection for r in server.requests] == [1, 1]


def _change_after_first_chunk(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    """Make a real change to the file right after the upload read its first chunk."""
    real = stream_module.pread_into
    calls = {"n": 0}

    def reading(fd: int, view: memoryview, position: int) -> int:
        count = real(fd, view, position)
        calls["n"] += 1
        if calls["n"] == 1:
            change()
        return count

    monkeypatch.setattr(stream_module, "pread_into", reading)


@pytest.mark.parametrize("how", ["grow", "shrink", "rewrite"])
def test_a_file_changing_under_the_upload_is_never_completed(
    files: WorkerFiles, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    path = log_file(tmp_path, 3 * STREAM_CHUNK_BYTES + 5)

    def change() -> None:
        if how == "grow":
            with path.open("ab") as handle:
                handle.write(b"more output")
        elif how == "shrink":
            os.truncate(path, STREAM_CHUNK_BYTES)
        else:  # same size, new content: the mtime moves
            stat = path.stat()
            with path.open("r+b") as handle:
                handle.seek(STREAM_CHUNK_BYTES * 2)
                handle.write(b"X")
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))

    _change_after_first_chunk(monkeypatch, change)
    with TLSServer(stored) as server:
        error = expect_error("request_rejected", upload, files, server.origin(), path,
                             length=3 * STREAM_CHUNK_BYTES + 5)
        assert server.wait_for(lambda: server.peer_closed >= 1 or server.connections >= 1)
    assert error.reason == "source_changed"
    assert server.requests == []  # the body was cut short: the server never got a request


def test_an_early_answer_is_reported_not_the_broken_pipe(files: WorkerFiles, tmp_path: pathlib.Path) -> None:
    """The cluster answers 413 after the head (body over its cap) and closes: the
    upload's send fails; the answer it read is what the caller gets."""
    path = log_file(tmp_path, 8 * MIB)

    def over_the_cap(head: Request) -> bytes | None:
        if int(head.header("content-length") or 0) <= 1024:
            return None
        return http_response(413, b'{"code":"request_too_large"}', headers=(("Connection", "close"),))

    with TLSServer(stored, head_handler=over_the_cap) as server:
        error = expect_error("response_rejected", upload, files, server.origin(), path)
    assert (error.http_status, error.cluster_code, error.reason) == (413, "request_too_large", "unexpected_status")


def test_client_certificate_refused_during_a_large_upload(files: WorkerFiles, tmp_path: pathlib.Path) -> None:
    """The alert arrives while megabytes are being written: the write fails first, then
    the alert is read (deterministic here: the body cannot fit the socket buffers)."""
    path = log_file(tmp_path, 16 * MIB)
    with TLSServer(stored, client_ca="rogue-ca") as server:
        error = expect_error("request_rejected", upload, files, server.origin(), path)
    assert (error.reason, error.reached_cluster) == ("client_certificate_rejected", False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": OFFER_PATH}, "stream route"),
        ({"prefix": b""}, "prefix"),
        ({"length": -1}, "length"),
        ({"length": 64 * MIB + 1}, "length"),
        ({"content_type": "Application/X"}, "content_type"),
        ({"offset": 10}, "fewer than offset + length"),
    ],
)
def test_bad_calls_are_refused_before_any_io(files: WorkerFiles, tmp_path: pathlib.Path, kwargs: dict[str, Any],
                                             message: str) -> None:
    path = log_file(tmp_path, 100)
    arguments: dict[str, Any] = {"path": ARTIFACT_PATH, "prefix": PREFIX, "length": 100}
    arguments.update(kwargs)
    with files.transport("https://127.0.0.1:9") as transport, path.open("rb") as handle:
        error = expect_error("request_rejected", transport.post_stream, arguments.pop("path"), arguments.pop("prefix"),
                             handle, arguments.pop("length"), max_response_bytes=4096, **arguments)
    assert error.reason == "invalid_request" and message in str(error)
    assert error.reached_cluster is False


def test_source_must_be_a_regular_file(files: WorkerFiles) -> None:
    import io

    read, write = os.pipe()
    try:
        with files.transport("https://127.0.0.1:9") as transport:
            for source in (read, io.BytesIO(b"x"), "not a file"):
                error = expect_error("request_rejected", transport.post_stream, ARTIFACT_PATH, PREFIX, source, 1,
                                     max_response_bytes=4096)
                assert error.reason == "invalid_request"
    finally:
        os.close(read)
        os.close(write)


#: A TLS server in its own process (its reading of the body must not count).
_SERVER_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.support.tls_server import TLSServer, http_response
answer = http_response(200, sys.argv[2].encode())
with TLSServer(lambda request: answer) as server:
    print(server.port, flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def _server_process() -> Iterator[str]:
    repo = str(pathlib.Path(__file__).resolve().parents[3])
    child = subprocess.Popen([sys.executable, "-c", _SERVER_CHILD, repo, ANSWER.decode()], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        yield f"https://localhost:{port}"
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)
        child.stdout.close()  # type: ignore[union-attr]


def test_upload_never_holds_the_file_in_memory(files: WorkerFiles, tmp_path: pathlib.Path) -> None:
    """Python allocations during a 4 MiB upload: far below the file's size (the reader
    uses one 64 KiB buffer; a naive ``read()`` of the file would peak at >= 4 MiB)."""
    path = log_file(tmp_path, 4 * MIB)
    with _server_process() as origin, files.transport(origin, timeout_ms=10_000) as transport:
        with path.open("rb") as handle:  # warm: the context, the connection, the modules
            transport.post_stream(ARTIFACT_PATH, PREFIX, handle, 1000, max_response_bytes=4096)
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            with path.open("rb") as handle:
                response = transport.post_stream(ARTIFACT_PATH, PREFIX, handle, 4 * MIB, max_response_bytes=4096)
            _, peak = tracemalloc.get_traced_memory()
            # The measurement can fail: reading the file whole is seen.
            tracemalloc.reset_peak()
            data = path.read_bytes()
            _, naive_peak = tracemalloc.get_traced_memory()
            del data
        finally:
            tracemalloc.stop()
    assert response.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert naive_peak - before >= 4 * MIB
    assert peak - before < 512 * 1024, f"the upload allocated {peak - before} bytes at its peak"


def test_bad_source_does_not_leave_a_connection_half_used(files: WorkerFiles, tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = log_file(tmp_path, 3 * STREAM_CHUNK_BYTES)
    _change_after_first_chunk(monkeypatch, lambda: os.truncate(path, 10))
    with TLSServer(stored) as server, files.transport(server.origin()) as transport:
        with path.open("rb") as handle, pytest.raises(TransportError):
            transport.post_stream(ARTIFACT_PATH, PREFIX, handle, 3 * STREAM_CHUNK_BYTES, max_response_bytes=4096)
        monkeypatch.undo()
        with leak_guard(monkeypatch), path.open("rb") as handle:
            transport.post_stream(ARTIFACT_PATH, PREFIX, handle, 10, max_response_bytes=4096)
    assert [r.connection for r in server.requests] == [2]


def test_uploads_a_log_to_the_cluster_double_and_completes(tmp_path: pathlib.Path) -> None:
    """End to end with the agent's artifact contract (contracts/completion.py) against the
    cluster double's artifacts route (its framing and fence checks are the reference's):
    a 3 MiB log streamed, the answer's echo and sha256 checked against ours, then the
    completion that names it is applied."""
    from qinglong_edge.contracts.completion import (
        ARTIFACT_CONTENT_TYPE as CONTRACT_TYPE,
    )
    from qinglong_edge.contracts.completion import (
        ARTIFACT_RESPONSE_MAX_BYTES,
        artifact_upload_preamble,
        parse_artifact_response,
    )
    from tests.support.cluster_calls import WorkerCalls
    from tests.support.cluster_double import ClusterDouble

    assert CONTRACT_TYPE == ARTIFACT_CONTENT_TYPE  # the transport's default is the contract's
    path = log_file(tmp_path, 3 * MIB + 17)
    with ClusterDouble() as cluster:
        worker = WorkerCalls(cluster, cluster.provision(tmp_path / "files"))
        try:
            worker.register()
            cluster.add_command_task("echo hi")
            worker.claim()
            worker.run()
            offer = {**worker.offer, "lease": {**worker.offer["lease"], "version": worker.version}}
            preamble = artifact_upload_preamble(offer, log_artifact_id=worker.log_id,
                                                byte_length=path.stat().st_size, truncated=False)
            with path.open("rb") as handle:
                response = worker.transport.post_stream(worker.path("artifacts"), preamble, handle,
                                                        path.stat().st_size,
                                                        max_response_bytes=ARTIFACT_RESPONSE_MAX_BYTES)
            receipt = parse_artifact_response(response.body, offer, log_artifact_id=worker.log_id,
                                              byte_length=path.stat().st_size, truncated=False,
                                              sha256=str(response.source_sha256))
            assert receipt.status == "stored"
            assert receipt.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
            completion = worker.call("completion", worker.completion_body(path.read_bytes()))
            assert completion["status"] == "applied"
        finally:
            worker.close()
