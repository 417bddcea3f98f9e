"""Issue 23 item 5 at the command: each failure of a pull also goes to stderr (where cron's
logger and the pull unit's journal listen) once per distinct failure per hour, with its
remedy; ``pull --json`` prints what it printed before, and an answered cycle says nothing
on stderr. The OpenWrt crontab line itself is tests/packaging/test_service_runtime.py."""

from __future__ import annotations

import pathlib

import pytest

from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.pull_env import PullEnv

#: The keys of a failed claim's --json line (unchanged by this issue).
FAILED_KEYS = {"device", "session", "status", "offerId", "reason", "nextAttemptAtMs", "httpStatus", "attemptCount",
               "clusterCode", "counted", "detail", "remedy"}


@pytest.fixture
def env(tmp_path: pathlib.Path, shared_cluster: ClusterDouble) -> PullEnv:
    shared_cluster.reset()
    return PullEnv(tmp_path, shared_cluster)


def _due(env: PullEnv) -> None:
    claim = env.claim()
    if claim is not None:
        env.wait_until_due(claim)


def test_a_failure_is_said_on_stderr_once_and_json_is_unchanged(env: PullEnv) -> None:
    env.cluster.push_fault(*[Fault.status_answer(500, "internal_error") for _ in range(2)])
    first = env.pull("--json")
    assert first.status == 75
    (line,) = first.lines()
    assert set(line) == FAILED_KEYS, line
    (said,) = first.stderr.splitlines()
    assert said.startswith("pull: ") and "unavailable (unexpected_status HTTP 500 internal_error)" in said
    assert "-> the cluster failed handling the call" in said
    _due(env)
    second = env.pull("--json")
    assert second.status == 75 and set(second.last()) == FAILED_KEYS
    assert second.stderr == ""  # the same failure within the hour
    _due(env)
    answered = env.pull()
    assert answered.status == 0 and answered.stderr == ""


def test_a_storage_failure_that_ends_the_pull_is_said_once_too(env: PullEnv) -> None:
    assert env.pull().status == 0
    (env.journal / "pending-claim.json").write_bytes(b"\x00 damaged on flash")
    (env.journal / "pending-claim.json").chmod(0o600)
    first = env.pull()
    assert first.status == 73, (first.stdout, first.stderr)
    (said,) = first.stderr.splitlines()  # the CLI's own error line, to the log once
    assert said.startswith("qinglong-edge: unsafe_storage: ") and first.stdout == ""
    again = env.pull()
    assert again.status == 73 and again.stdout.splitlines() == [said] and again.stderr == ""
    as_json = env.pull("--json")
    assert as_json.status == 73 and as_json.lines()[0]["code"] == "unsafe_storage"  # the CLI's own JSON line
