"""run_pull in process (the loop around session + pull): the wall-clock floor, the splay,
the duration loop, the early stop on a rejected credential and the abort signal. The
cluster is the double's state machine called directly; the journal is real."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest

from qinglong_edge.config import WorkerConfig, parse_config
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.cycle import CLOCK_FLOOR_MS, run_pull
from qinglong_edge.worker.pull import AbortSignal, PullAborted
from tests.support.cluster_state import ClusterState
from tests.support.cluster_tasks import build_task
from tests.support.direct_ingress import DirectIngress

NOW = 1_700_000_000_000


def _worker(tmp_path: pathlib.Path, **overrides: Any) -> WorkerConfig:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    document = {"schema": "qinglong/edge-agent@v1", "stateDirectory": str(state), "worker": {
        "origin": "https://cluster.example:7443", "workerId": "edge-1", "credentialFile": "/c",
        "certificateFile": "/p", "privateKeyFile": "/k", "trustAnchorFiles": ["/a"], "pullIntervalMs": 100,
        **overrides}}
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


def test_splay_sleeps_a_random_share_of_splay_max_before_the_journal_is_opened(tmp_path: pathlib.Path,
                                                                               ingress: Closable) -> None:
    slept: list[float] = []
    worker = _worker(tmp_path, splayMaxMs=8000)

    def sleep(seconds: float) -> None:
        assert not pathlib.Path(worker.journal_directory).exists()  # no lock held while splaying
        slept.append(seconds)

    reports = list(run_pull(worker, clock_ms=lambda: NOW, sleep=sleep, random=lambda: 0.25,
                            transport=ingress))  # type: ignore[arg-type]
    assert slept == [2.0]
    assert reports[0].result is not None and reports[0].result.status == "idle"
    list(run_pull(worker, splay=False, clock_ms=lambda: NOW, sleep=sleep, transport=ingress))  # type: ignore[arg-type]
    assert slept == [2.0]


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


def test_a_cycle_prunes_abandoned_claims_beyond_a_lowered_bound(tmp_path: pathlib.Path, ingress: Closable) -> None:
    """Issue 16: the bound holds from the next cycle, not only from the next abandon."""
    from qinglong_edge.contracts.journal_records import PendingClaim
    from qinglong_edge.worker.journal import Journal, JournalOptions
    from tests.worker import offer_vectors as vectors

    worker = _worker(tmp_path, abandonedMaximumEntries=2)
    with Journal.open(worker.journal_directory, JournalOptions(abandoned_maximum_entries=8)) as journal:
        for i in range(5):
            journal.create_claim(PendingClaim.create(vectors.authority(f"old-{i}"), NOW - 5000 + i))
            journal.abandon_claim("stale_session", NOW - 5000 + i)
    reports = list(run_pull(worker, clock_ms=lambda: NOW, transport=ingress))  # type: ignore[arg-type]
    assert reports[0].result is not None and reports[0].result.status == "idle"
    assert sorted(os.listdir(pathlib.Path(worker.journal_directory) / "abandoned")) == ["old-3.json", "old-4.json"]
