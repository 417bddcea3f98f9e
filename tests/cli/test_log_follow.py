"""``admin runs log --follow`` and ``inbox log OFFER_ID [--follow]`` (issue 26 item 3):
the real CLI in a child process reads a growing log by offset until the run ends."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import threading
import time

import pytest

from qinglong_edge.commands._follow import follow_log
from qinglong_edge.config import parse_config
from qinglong_edge.worker.journal.store import Journal, JournalReader
from qinglong_edge.worker.remote.job_files import worker_record_files
from tests.support.cli import repo_entry, run_cli
from tests.support.local_site import API, LocalSite
from tests.worker import offer_vectors as vectors

pytestmark = pytest.mark.timeout(120)

ENTRY = repo_entry()
COUNTER = "i=0; while [ $i -lt 12 ]; do i=$((i+1)); echo \"line $i\"; sleep 0.15; done; printf 'last'"


def test_follow_log_reads_by_offset_until_ended(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "grow.log"
    done = threading.Event()

    def writer() -> None:
        with open(log, "ab", buffering=0) as out:
            for n in range(20):
                out.write(f"{n}\n".encode())
                time.sleep(0.01)  # the scenario: a log that grows while it is followed
        done.set()

    out = tmp_path / "copy"
    thread = threading.Thread(target=writer)
    with open(out, "wb") as sink:
        thread.start()
        end = follow_log(lambda: str(log) if log.exists() else None, done.is_set, sink, poll_s=0.02)
    thread.join()
    assert out.read_bytes() == log.read_bytes() == b"".join(f"{n}\n".encode() for n in range(20))
    assert end == log.stat().st_size


def test_follow_log_refuses_what_is_not_a_regular_file(tmp_path: pathlib.Path) -> None:
    from qinglong_edge.errors import EdgeError

    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with open(tmp_path / "sink", "wb") as sink, pytest.raises(EdgeError) as info:
        follow_log(lambda: str(tmp_path / "link"), lambda: True, sink, poll_s=0.01)
    assert info.value.code == "log_unavailable"


def test_admin_runs_log_follow_prints_a_run_to_its_end(tmp_path: pathlib.Path) -> None:
    site = LocalSite(tmp_path)
    site.provision()
    created = json.loads(site.cli("admin", "task", "create", "--project", "default", "--id", "counter",
                                  "--name", "Counter", "--shell", COUNTER, "--json"))["task"]
    try:
        serve = site.serve()
        status, started = site.request("POST", f"{API}/tasks/counter/runs", {
            "schema": "qinglong/task-start@v1", "mutationId": "2c9e1a0b-3d4f-4a5b-8c6d-7e8f9a0b1c2d",
            "expectedRevision": created["revision"], "expectedContentDigest": created["contentDigest"]})
        assert status == 202
        run_id = str(started["runId"])
        proc = subprocess.Popen(ENTRY.argv("--config", str(site.config), "admin", "runs", "log", run_id,
                                                  "--follow"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=ENTRY.environment(), cwd=ENTRY.cwd)
        first = proc.stdout.readline() if proc.stdout else b""  # type: ignore[union-attr]
        assert first == b"line 1\n"
        assert site.run_status(run_id) == "running"  # it printed while the Run still ran
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert first + rest == b"".join(f"line {n}\n".encode() for n in range(1, 13)) + b"last"
        assert f"run {run_id} succeeded" in err.decode()
        usage = run_cli("--config", str(site.config), "admin", "runs", "log", run_id, "--follow", "--json")
        assert usage.status == 64
        missing = run_cli("--config", str(site.config), "admin", "runs", "log", "no-such-run", "--follow")
        assert missing.status == 65 and "run_not_found" in missing.stderr and "Traceback" not in missing.stderr
        assert serve.stop() == 0
    finally:
        site.close()


def _remote_files(config_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    config = parse_config(json.loads(config_path.read_text()))
    assert config.worker is not None
    root = config.worker.journal_directory
    with Journal.open(root) as journal:
        journal.accept_offer({**vectors.offer(), "offerId": "offer-1"}, 1001)
    with JournalReader.open(root) as reader:
        record = reader.read_offer("offer-1")
    files = worker_record_files(config.worker, record)
    assert files is not None
    return pathlib.Path(files.log_path), pathlib.Path(files.receipt_path)


def test_inbox_log_prints_and_follows_a_remote_job(worker_config: pathlib.Path) -> None:
    log, receipt = _remote_files(worker_config)
    absent = run_cli("--config", str(worker_config), "inbox", "log", "offer-1")
    assert absent.status == 65 and "no log" in absent.stderr
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab", buffering=0) as out:
        out.write(b"hello \x1b[1mremote\x1b[0m\n")
        proc = subprocess.Popen(ENTRY.argv("--config", str(worker_config), "inbox", "log", "offer-1",
                                                  "--follow"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=ENTRY.environment(), cwd=ENTRY.cwd)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"hello \x1b[1mremote\x1b[0m\n"
        for n in range(5):  # the positive event: each line is followed as it is written
            out.write(f"more {n}\n".encode())
            assert proc.stdout.readline() == f"more {n}\n".encode()
        assert proc.poll() is None  # the job has not ended: still following
        receipt.parent.mkdir(parents=True, exist_ok=True)
        out.write(b"the end\n")
    receipt.write_bytes(b"{}")  # the job ended (any receipt file)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert rest == b"the end\n"
    shown = run_cli("--config", str(worker_config), "inbox", "log", "offer-1", "--max-bytes", "5", "--json")
    assert shown.status == 0 and shown.json()["shown"] == 5 and shown.json()["truncated"] is True
    assert run_cli("--config", str(worker_config), "inbox", "log", "nope").status == 65
    assert run_cli("--config", str(worker_config), "inbox", "log", "offer-1", "--max-bytes", "0").status == 64
    os.unlink(log)


