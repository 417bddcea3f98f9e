"""Failures said once per distinct failure per hour (issue 23 item 5), on a real runtime
directory, the boot clock passed in."""

from __future__ import annotations

import io
import pathlib

from qinglong_edge.config import load_config
from qinglong_edge.worker.delivery.failure_log import HOUR_MS, FailureLog, failure_key
from tests.support.cluster_double import ClusterDouble
from tests.support.manual_clock import ManualClock
from tests.support.pull_env import PullEnv


def test_each_distinct_failure_once_an_hour_and_again_after(tmp_path: pathlib.Path) -> None:
    with ClusterDouble() as cluster:
        env = PullEnv(tmp_path, cluster)
    worker = load_config(str(env.config_path)).worker
    assert worker is not None
    clock, out = ManualClock(10_000_000), io.StringIO()
    log = FailureLog(worker, out, duplicate=True, boot_clock=clock)
    down = failure_key({"status": "unavailable", "reason": "dns_failure", "offerId": "changes-every-time"})
    other = failure_key({"status": "unavailable", "reason": "connect_refused"})
    assert down == failure_key({"status": "unavailable", "reason": "dns_failure", "nextAttemptAtMs": 5})
    assert log.say("pull: unavailable (dns_failure) -> check DNS", down)
    clock.now += HOUR_MS - 1
    assert not log.say("pull: unavailable (dns_failure) -> check DNS", down)
    assert log.say("pull: unavailable (connect_refused) -> is it up?", other)  # distinct
    clock.now += 1
    assert log.say("pull: unavailable (dns_failure) -> check DNS", down)  # an hour later
    log.close()
    assert out.getvalue().splitlines() == ["pull: unavailable (dns_failure) -> check DNS",
                                           "pull: unavailable (connect_refused) -> is it up?",
                                           "pull: unavailable (dns_failure) -> check DNS"]
    # The memory is in the RAM runtime directory; a damaged copy says it again.
    (note,) = [p for p in env.runtime.iterdir() if p.name.startswith("failure.") and b"dns_failure" in p.read_bytes()]
    note.write_bytes(b"\x00garbage")
    again = FailureLog(worker, out, duplicate=True, boot_clock=clock)
    assert again.say("pull: unavailable (dns_failure) -> check DNS", down)
    again.close()


def test_nothing_is_said_twice_on_the_terminal_a_person_reads(tmp_path: pathlib.Path) -> None:
    with ClusterDouble() as cluster:
        env = PullEnv(tmp_path, cluster)
    worker = load_config(str(env.config_path)).worker
    assert worker is not None
    out = io.StringIO()
    log = FailureLog(worker, out, duplicate=False)
    assert not log.say("pull: x", "status=x")
    assert out.getvalue() == "" and not env.runtime.exists()  # nothing read or written either
