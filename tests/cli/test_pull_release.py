"""``pull --release``: what the package's prerm runs before opkg replaces or removes the
code a resident pull imports lazily (real CLI, real resident pull and job, the TLS
cluster double). The prerm's call itself: tests/packaging/test_maintainer_scripts.py.
"""

from __future__ import annotations

import json

from tests.support.remote_env import RemoteEnv, dump


def test_with_no_pull_it_says_so_and_creates_nothing(env: RemoteEnv) -> None:
    before = sorted(env.files_under())
    result = env.cli("--json", "pull", "--release")
    assert (result.status, json.loads(result.stdout)) == (0, {"status": "released", "pid": None}), result.stderr
    human = env.cli("pull", "--release")
    assert (human.status, human.stdout) == (0, "pull: no pull holds the journal; nothing to release\n")
    assert sorted(env.files_under()) == before  # no journal, no runtime directory made


def test_a_resident_pull_exits_its_job_goes_on_and_the_next_pull_adopts_it(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    resident = env.spawn_json()
    env.wait_state("running_acknowledged")
    released = env.cli("--json", "pull", "--release")
    assert released.status == 0, released.stderr
    assert json.loads(released.stdout) == {"status": "released", "pid": resident.pid}
    outcome = env.finish(resident)  # it has already exited: --release waited for the lock
    assert outcome.status == 0, dump(outcome)
    summary = outcome.summary()
    assert summary is not None and (summary["aborted"], summary["inFlight"]) == ("SIGTERM", 1)
    assert env.record()["state"] == "running_acknowledged" and env.starts("job") == 1
    again = env.cli("pull", "--release")  # nothing holds the journal any more
    assert again.stdout.startswith("pull: no pull holds the journal")
    env.release("job")
    final = env.run_to_end()
    assert final.status == 0, dump(final)
    assert final.events("adopted")[0]["pid"] == outcome.events("started")[0]["pid"]
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"
    assert env.starts("job") == 1
