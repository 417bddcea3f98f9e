"""Issue 23 item 6, "One identity, one device": two real agents with the same credential
(a cloned SD card) against one TLS cluster double.

Before: they took the session from each other every few heartbeats, every offer answer
was ``idle worker_unavailable``, a running job was stopped, and nothing said why. Now the
device that first sees its session replaced by one it did not register a third time
within 10 minutes says "another device uses worker id X", makes no session call and no
claim for 10 minutes (a window in the RAM runtime directory), exits 78
``identity_conflict``, and doctor says so; the other device keeps its session and works.
No job of either device runs twice.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
from typing import Any

from qinglong_edge import clock
from tests.support.cluster_double import ClusterDouble
from tests.support.pull_env import Outcome
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until

#: The shortest heartbeat interval the config allows: a fight step every 5 s.
HEARTBEAT_MS = 5000


def _identity(env: RemoteEnv) -> dict[str, Any] | None:
    path = env.runtime / "identity.json"
    try:
        return dict(json.loads(path.read_bytes()))
    except (OSError, ValueError):
        return None


def _quiet(env: RemoteEnv) -> bool:
    state = _identity(env)
    return state is not None and state["quietUntilMs"] is not None and state["quietUntilMs"] > clock.boot_ms()


def _completed(cluster: ClusterDouble, run_id: str) -> bool:
    try:
        return cluster.completion(run_id) is not None
    except KeyError:  # not claimed yet
        return False


def _sessions(outcome: Outcome) -> set[str]:
    return {line["session"]["sessionId"] for line in outcome.cycles() if "session" in line}


def test_two_devices_with_one_credential_one_goes_quiet_and_says_why(tmp_path: pathlib.Path,
                                                                    cluster: ClusterDouble) -> None:
    a = RemoteEnv(tmp_path / "a", cluster, heartbeatIntervalMs=HEARTBEAT_MS)
    b = RemoteEnv(tmp_path / "b", cluster, heartbeatIntervalMs=HEARTBEAT_MS)
    shared = tmp_path / "trace"
    first = a.spawn_json("--duration", "60")
    assert wait_until(lambda: cluster.exchanges_for("register"), timeout=20)
    second = b.spawn_json("--duration", "60")
    quiet: RemoteEnv | None = None
    busy: RemoteEnv | None = None
    try:
        found = wait_until(lambda: (a if _quiet(a) else b if _quiet(b) else None), timeout=50,
                           what="one device to go quiet")
        quiet, busy = (a, b) if found is a else (b, a)
        mark = len(cluster.exchanges)
        # The other device keeps its session: a job queued now is run by it, once.
        task = cluster.add_command_task(f"echo started >> {shared}; echo done")
        assert wait_until(lambda: _completed(cluster, task.candidate["runId"]), timeout=40)
        assert not _quiet(busy)
    finally:
        outcomes = {}
        for env, proc in ((a, first), (b, second)):
            if proc.poll() is None:
                outcomes[id(env)] = RemoteEnv.stop(proc)
            else:
                outcomes[id(env)] = RemoteEnv.finish(proc)
    assert quiet is not None and busy is not None
    said, worked = outcomes[id(quiet)], outcomes[id(busy)]
    assert "Traceback" not in said.stderr + worked.stderr
    assert shared.read_text().count("started") == 1  # no job ran twice
    assert quiet.inbox() == {}  # the quiet device claimed nothing
    conflict = [line for line in said.cycles() if line.get("code") == "identity_conflict"]
    assert conflict, dump(said)
    assert f"another device uses worker id {cluster.worker_id}" in conflict[0]["detail"]
    assert conflict[0]["remedy"]
    # While quiet it made no call at all: every request since came from the other device.
    theirs = _sessions(worked)
    later = [e for e in cluster.exchanges[mark:] if e.op is not None]
    assert later and all(any(session in e.target for session in theirs) for e in later), [e.target for e in later]
    # doctor on the quiet device says so.
    doctor = quiet.cli("doctor", "--json").lines()[0]
    (check,) = [c for c in doctor["checks"] if c["name"] == "worker_identity"]
    assert check["ok"] is False and f"another device uses worker id {cluster.worker_id}" in check["detail"]
    # A cron pull in the window: one line, exit 78, nothing sent.
    before = len(cluster.exchanges)
    line = quiet.pull()
    assert line.status == 78, (line.stdout, line.stderr)
    assert line.stdout.startswith("pull: identity_conflict: another device uses worker id")
    assert len(line.stdout.strip().splitlines()) == 1 and len(cluster.exchanges) == before


def test_the_quiet_window_ends_by_itself(tmp_path: pathlib.Path, cluster: ClusterDouble) -> None:
    """Not a latch: a window is a boot-clock deadline in the RAM runtime directory. Here the
    10 minutes are skipped by moving that deadline to now (as 10 minutes would); a reboot
    (the RAM directory gone) forgets it too."""
    env = RemoteEnv(tmp_path, cluster)
    assert env.pull("--json").status == 0
    state = _identity(env)
    assert state is not None
    quiet_until = clock.boot_ms() + 600_000
    (env.runtime / "identity.json").write_text(json.dumps({**state, "quietUntilMs": quiet_until,
                                                           "quietSinceWallMs": int(time.time() * 1000)}))
    assert env.pull("--json").last()["code"] == "identity_conflict"
    (env.runtime / "identity.json").write_text(json.dumps({**state, "quietUntilMs": clock.boot_ms() - 1,
                                                           "quietSinceWallMs": int(time.time() * 1000)}))
    cluster.add_command_task("echo after")
    outcome = env.run_to_end()
    assert outcome.status == 0 and outcome.cycles()[0]["status"] == "accepted", dump(outcome)


def _session_ran_out(env: RemoteEnv) -> None:
    """Our session lease ran out between two pulls: on the device's boot clock (its last
    heartbeat went out a lease ago; the session's timers run on the boot clock, issue 23)
    and on the cluster (nobody renewed it)."""
    path = env.runtime / "session.json"
    if not path.exists():
        return
    state = json.loads(path.read_bytes())
    if state.get("session") is not None:
        state["session"]["heartbeatAtMs"] -= state["session"]["leaseDurationMs"]
        path.write_text(json.dumps(state, separators=(",", ":")) + "\n")
        env.cluster.state.expire_session("edge-1")


def test_our_own_re_registrations_never_count(tmp_path: pathlib.Path, cluster: ClusterDouble) -> None:
    """One device re-registering again and again (its session lease runs out before each
    pull; then a reboot: the RAM directory is gone) never says another device uses it."""
    env = RemoteEnv(tmp_path, cluster)
    generations = []
    for _ in range(6):
        _session_ran_out(env)
        outcome = env.pull("--json")
        assert outcome.status == 0, dump(outcome)
        assert outcome.last()["session"]["action"] == "registered"
        generations.append(outcome.last()["session"]["generation"])
        if len(generations) == 3:
            subprocess.run(["rm", "-rf", str(env.runtime)], check=True)  # a reboot empties /run
    assert generations == list(range(1, 7))
    assert not _quiet(env)
    check = [c for c in env.cli("doctor", "--json").lines()[0]["checks"] if c["name"] == "worker_identity"]
    assert check == []
