"""run_pull in process (the loop around session + pull): the wall-clock floor, the
duration loop, the early stop on a rejected credential, the abort signal, the runtime
directory (and its fallback) and the daily certificate warning. The cluster is the
double's state machine called directly; the journal and the runtime directory are real.
The splay phase is tested in tests/worker/delivery/test_pacing.py."""

from __future__ import annotations

import os
import pathlib
import stat
from typing import Any

import pytest

from qinglong_edge.config import WorkerConfig, parse_config
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.cycle import CLOCK_FLOOR_MS, run_pull
from qinglong_edge.worker.delivery.pull import AbortSignal, PullAborted
from qinglong_edge.worker.journal.runtime import RuntimeDirectory, journal_key
from tests.support.cluster_state import ClusterState
from tests.support.cluster_tasks import build_task
from tests.support.direct_ingress import DirectIngress

NOW = 1_800_000_000_000  # after clock.CLOCK_FLOOR_MS (2026-11-01)


def _worker(tmp_path: pathlib.Path, **overrides: Any) -> WorkerConfig:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    run = tmp_path / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    document = {"schema": "qinglong/edge-agent@v1", "stateDirectory": str(state), "worker": {
        "origin": "https://cluster.example:7443", "workerId": "edge-1", "credentialFile": "/c",
        "certificateFile": "/p", "privateKeyFile": "/k", "trustAnchorFiles": ["/a"], "pullIntervalMs": 100,
        "runtimeDirectory": str(run), **overrides}}
    worker = parse_config(document).worker
    assert worker is not None
    return worker


class Closable(DirectIngress):
    def close(self) -> None:
        pass


@pytest.fixture
def ingress() -> Closable:
    return Closable(ClusterState(os.urandom(32), clock_ms=lambda: NOW))


def test_a_clock_before_2020_pulls_nothing(tmp_path: pathlib.Path, ingress: Closable) -> None:
    reports = list(run_pull(_worker(tmp_path), clock_ms=lambda: CLOCK_FLOOR_MS - 1,
                            transport=ingress))  # type: ignore[arg-type]
    assert [(r.error, r.result) for r in reports] == [("clock_not_set", None)]
    assert reports[0].to_json()["status"] == "failed"
    assert ingress.calls == []


def test_the_runtime_directory_holds_the_session_and_owner_records(tmp_path: pathlib.Path,
                                                                    ingress: Closable) -> None:
    worker = _worker(tmp_path)
    reports = list(run_pull(worker, clock_ms=lambda: NOW, transport=ingress))  # type: ignore[arg-type]
    assert reports[0].result is not None and reports[0].result.status == "idle"
    runtime = tmp_path / "run" / journal_key(worker.journal_directory)
    # capabilities.probe: the probes' per-boot cache (worker/delivery/capabilities.py); identity.json:
    # the generation this device registered (worker/delivery/identity_guard.py); clock.json: the cluster clock sample
    assert sorted(os.listdir(runtime)) == ["capabilities.probe", "clock.json", "identity.json", "owner.json",
                                           "session.json"]
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert sorted(os.listdir(worker.journal_directory)) == [".owner.lock", "abandoned", "offers", "pending-claim.json"]


def test_an_unusable_runtime_directory_falls_back_to_the_journal(tmp_path: pathlib.Path, ingress: Closable) -> None:
    worker = _worker(tmp_path, runtimeDirectory=str(tmp_path / "no" / "such"))
    reports = list(run_pull(worker, clock_ms=lambda: NOW, transport=ingress))  # type: ignore[arg-type]
    assert reports[0].result is not None and reports[0].result.status == "idle"
    fallback = pathlib.Path(worker.journal_directory) / "run"
    assert sorted(os.listdir(fallback)) == ["capabilities.probe", "clock.json", "identity.json", "owner.json",
                                            "session.json"]
    with RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory) as runtime:
        assert runtime.on_fallback and "missing" in str(runtime.fallback_reason)


def test_duration_loop_stops_after_a_rejected_credential(tmp_path: pathlib.Path, ingress: Closable) -> None:
    ingress.state.add_candidate(build_task("shell", now_ms=NOW))
    ingress.script.extend([None, TransportError("no", code="response_rejected", http_status=401)])  # type: ignore[list-item]
    naps: list[float] = []
    reports = list(run_pull(_worker(tmp_path), duration_s=60, clock_ms=lambda: NOW, sleep=naps.append,
                            transport=ingress))  # type: ignore[arg-type]
    assert [r.result.status for r in reports if r.result] == ["credential_rejected"]
    assert naps == []


def test_duration_loop_sleeps_the_profile_cadence_between_cycles(tmp_path: pathlib.Path,
                                                                 ingress: Closable) -> None:
    naps: list[float] = []
    cycles = run_pull(_worker(tmp_path), duration_s=60, clock_ms=lambda: NOW, sleep=naps.append,
                      transport=ingress)  # type: ignore[arg-type]
    for _ in range(3):
        next(cycles)
    cycles.close()
    assert naps == [0.1, 0.1]


def test_a_tripped_abort_stops_before_any_request(tmp_path: pathlib.Path, ingress: Closable) -> None:
    abort = AbortSignal()
    abort.trip("SIGTERM")
    with pytest.raises(PullAborted):
        list(run_pull(_worker(tmp_path), abort=abort, clock_ms=lambda: NOW, transport=ingress))  # type: ignore[arg-type]
    assert ingress.calls == []


def test_an_abort_during_a_cycle_stops_the_loop_after_the_report(tmp_path: pathlib.Path, ingress: Closable) -> None:
    abort = AbortSignal()
    cycles = run_pull(_worker(tmp_path), duration_s=60, abort=abort, clock_ms=lambda: NOW, sleep=lambda _: None,
                      transport=ingress)  # type: ignore[arg-type]
    first = next(cycles)
    assert first.result is not None
    abort.trip("SIGINT")  # e.g. while the caller printed the report: recorded, raised at the boundary
    with pytest.raises(PullAborted):
        next(cycles)
    # the journal was released: a new cycle can open it
    assert next(run_pull(_worker(tmp_path), clock_ms=lambda: NOW, transport=ingress)).result is not None  # type: ignore[arg-type]


def test_the_client_certificate_expiry_warning_once_a_day(tmp_path: pathlib.Path, ingress: Closable) -> None:
    """Issue 18 item 7: inside 14 days of the client certificate's expiry, one warning
    line a day (remembered in the runtime directory)."""
    from tests.support.tls_server import cert_path

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    certificate = private / "client.pem"
    certificate.write_bytes(cert_path("client.pem").read_bytes())
    certificate.chmod(0o600)
    worker = _worker(tmp_path, certificateFile=str(certificate))
    not_after = 4_102_444_799_000  # Dec 31 23:59:59 2099 GMT, the committed client certificate
    day = 86_400_000
    near = (not_after - 10 * day) // day * day  # 0:00 UTC, ten days and a bit before
    ingress.state.clock_ms = lambda: near
    notices: list[str] = []
    for _ in range(3):
        list(run_pull(worker, clock_ms=lambda: near, transport=ingress, notice=notices.append))  # type: ignore[arg-type]
    assert len(notices) == 1 and notices[0].startswith("certificate_expiring: client certificate ")
    assert f"{certificate} [0]" in notices[0] and "(10 days left)" in notices[0]
    far = not_after - 30 * day
    list(run_pull(worker, clock_ms=lambda: far, transport=ingress, notice=notices.append))  # type: ignore[arg-type]
    # outside the window: nothing (the day changed, it was checked); the device's wall clock
    # jumped 20 days from the cluster's, which is said once (spec README "Skew")
    assert [n for n in notices if n.startswith("certificate")] == notices[:1]


def test_a_cycle_prunes_abandoned_claims_beyond_a_lowered_bound(tmp_path: pathlib.Path, ingress: Closable) -> None:
    """Issue 16: the bound holds from the next cycle, not only from the next abandon."""
    from qinglong_edge.contracts.journal_records import PendingClaim
    from qinglong_edge.worker.journal.store import Journal, JournalOptions
    from tests.worker import offer_vectors as vectors

    worker = _worker(tmp_path, abandonedMaximumEntries=2)
    with Journal.open(worker.journal_directory, JournalOptions(abandoned_maximum_entries=8)) as journal:
        for i in range(5):
            journal.create_claim(PendingClaim.create(vectors.authority(f"old-{i}"), NOW - 5000 + i))
            journal.abandon_claim("stale_session", NOW - 5000 + i)
    reports = list(run_pull(worker, clock_ms=lambda: NOW, transport=ingress))  # type: ignore[arg-type]
    assert reports[0].result is not None and reports[0].result.status == "idle"
    assert sorted(os.listdir(pathlib.Path(worker.journal_directory) / "abandoned")) == ["old-3.json", "old-4.json"]
