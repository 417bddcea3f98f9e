"""An idle ``pull`` writes nothing to persistent storage (issue 16 item 4; spec README
"Decisions for storage on flash").

Steady state: cycle 2 onward, no work on the cluster, a heartbeat due every cycle (the
runtime session record is aged by a minute between cycles, as a cron minute would).
Each cycle is the real CLI in a child process against the cluster double over TLS.
Under the state directory (which holds the journal) it must make no fsync, write no
byte, create, rename or remove no name and change no inode: checked by ``strace`` (the
syscalls) and by a stat snapshot of every entry (ctime and listing). What it does write
goes to the runtime directory (RAM): the session record (a new heartbeat version), the
owner record. The cycle does heartbeat and does send the kept claim.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.idle_writes import snapshot, strace_path, trace_cycle
from tests.support.pull_env import PullEnv


@pytest.fixture
def env(tmp_path: pathlib.Path, shared_cluster: ClusterDouble) -> PullEnv:
    shared_cluster.reset()
    return PullEnv(tmp_path, shared_cluster, heartbeatIntervalMs=5000, sessionLeaseDurationMs=60_000)


def age_session(env: PullEnv, by_ms: int = 10_000) -> None:
    """Make the next cycle's heartbeat due (the interval here is 5 s), as a cron minute
    passing would; less than the 60 s session lease, whose local end is judged from the
    heartbeat's send instant on the boot clock (spec README "Decisions for clocks")."""
    path = env.runtime / "session.json"
    state = json.loads(path.read_bytes())
    state["session"]["heartbeatAtMs"] -= by_ms
    path.write_text(json.dumps(state, separators=(",", ":")) + "\n")


def test_idle_cycles_touch_nothing_under_the_state_directory(env: PullEnv) -> None:
    first = env.pull("--json")
    assert (first.status, first.last()["status"]) == (0, "idle"), first.stderr
    claim = env.claim()
    assert claim is not None
    for cycle in range(2, 7):
        age_session(env)
        before = snapshot(env.state_dir)
        version = env.session()["version"]  # type: ignore[index]
        outcome = env.pull("--json")
        line = outcome.last()
        assert (outcome.status, line["status"], line["session"]["action"]) == (0, "idle", "heartbeat"), cycle
        assert line["offerId"] == claim["offerId"]
        assert env.session()["version"] == version + 1  # type: ignore[index]  # written, in RAM
        assert snapshot(env.state_dir) == before, f"cycle {cycle} changed the state directory"
    offers = env.cluster.exchanges_for("offers")
    assert len(offers) == 6 and len({x.body for x in offers}) == 1
    assert len(env.cluster.exchanges_for("heartbeat")) == 5


def test_idle_cycles_make_no_fsync_and_write_no_byte_under_strace(env: PullEnv, tmp_path: pathlib.Path) -> None:
    if strace_path() is None:
        pytest.skip("strace is not installed (CI installs it)")
    assert env.pull("--json").last()["status"] == "idle"
    for cycle in range(2, 5):
        age_session(env)
        proc, writes = trace_cycle(env.argv("--json"), env.state_dir, tmp_path / f"trace-{cycle}.txt",
                                   env=env.entry.environment(None), cwd=env.entry.cwd)
        if proc.returncode != 0 and b"ptrace" in proc.stderr:
            pytest.skip(f"strace cannot trace here: {proc.stderr.decode(errors='replace').strip()}")
        assert proc.returncode == 0, proc.stderr.decode()
        assert json.loads(proc.stdout.decode().splitlines()[-1])["session"]["action"] == "heartbeat"
        assert (writes.fsyncs, writes.bytes_written, writes.mutations, writes.opens_with_create) == (0, 0, [], 0), \
            "\n".join(writes.lines)
        # The traced run did read the journal (so the filter sees it at all).
        assert any("pending-claim.json" in line for line in writes.lines)


def test_the_first_cycle_and_an_offer_do_write_durably(env: PullEnv, tmp_path: pathlib.Path) -> None:
    """The counter-check: the same measurement sees the writes that must happen."""
    if strace_path() is None:
        pytest.skip("strace is not installed (CI installs it)")
    proc, writes = trace_cycle(env.argv("--json"), env.state_dir, tmp_path / "first.txt",
                               env=env.entry.environment(None), cwd=env.entry.cwd)
    assert proc.returncode == 0, proc.stderr.decode()
    assert writes.fsyncs >= 2 and writes.bytes_written > 0  # the journal's creation and the claim
    env.cluster.add_task("shell")
    age_session(env)
    before = snapshot(env.state_dir)
    proc, writes = trace_cycle(env.argv("--json"), env.state_dir, tmp_path / "offer.txt",
                               env=env.entry.environment(None), cwd=env.entry.cwd)
    assert json.loads(proc.stdout.decode().splitlines()[0])["status"] == "accepted"
    assert writes.fsyncs >= 3 and writes.bytes_written > 0 and writes.mutations
    assert snapshot(env.state_dir) != before
