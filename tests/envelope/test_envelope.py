"""The edge promise on real kernel limits: the agent fits 128 MiB and 64 tasks.

One run of :mod:`tests.support.envelope_driver` per module (about 30 s): a fresh cgroup
(v2 where the root delegates memory+pids, else v1 memory+pids) limited to 128 MiB and
64 tasks; the limits are proved first (200 MiB allocation OOM-killed, the 65th task
refused with EAGAIN); then the real CLI runs in it as uid 65534 -- ``serve`` under 4
clients and real jobs while ``pull --duration`` cycles against the cluster double, a
fork-bomb Run, and SIGTERM -- with the state on a tmpfs, the rest of the file system
read-only and only loopback networking (fresh mount and network namespaces; without
``unshare`` the scenario runs unisolated and :func:`test_isolation` skips with the
reason). Each test below asserts one part of the driver's report.

Skipped (with the reason) when not root or when no cgroup backend with memory and pids
limits is writable; CI runs as root on cgroup v1.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cli import unprivileged_python
from tests.support.envelope import MIB, probe
from tests.support.envelope_driver import launch

pytestmark = pytest.mark.slow

MEMORY_LIMIT = 128 * MIB
PIDS_LIMIT = 64
RUN_PIDS_DEFAULT = 16  # execution.maxRunPids, edge profile (docs/worker/remote.md, "PIDs")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    backend, reason = probe()
    if not backend:
        pytest.skip(reason)
    result, stderr = launch(backend, unprivileged_python(), load_seconds=15)
    path = tmp_path_factory.mktemp("envelope") / "report.json"
    path.write_text(json.dumps(result, indent=1))
    if "error" in result or "cleanup_error" in result:
        pytest.fail(f"the envelope driver failed: {result.get('error') or result.get('cleanup_error')}\n"
                    f"{result.get('traceback', '')}\nstderr:\n{stderr[-3000:]}\nreport: {path}")
    return result


def _delta(report: dict[str, Any], scope: str, key: str, start: str = "after_proofs", end: str = "shutdown") -> int:
    counters = report["counters"]
    return int(counters[end][scope][key] or 0) - int(counters[start][scope][key] or 0)


def test_memory_limit_is_enforced(report: dict[str, Any]) -> None:
    memory = report["proofs"]["memory"]
    assert memory["returncode"] == -9 and memory["stdout"] == "", memory  # SIGKILL before it could print
    assert memory["oom_kills"] >= 1, memory  # by the kernel's OOM killer, not something else
    assert memory["memory_peak"] <= MEMORY_LIMIT, memory


def test_pids_limit_is_enforced(report: dict[str, Any]) -> None:
    pids = report["proofs"]["pids"]
    assert (pids["children"], pids["errno"], pids["tasks_when_refused"]) == (PIDS_LIMIT - 1, "EAGAIN", PIDS_LIMIT), pids
    assert pids["refused_task_number"] == PIDS_LIMIT + 1 and pids["fork_failures_counted"] >= 1, pids
    assert report["proofs"]["proof_cgroup_left"] == []


def test_isolation(report: dict[str, Any]) -> None:
    isolation = report["isolation"]
    if isolation["mode"] != "namespaces":
        pytest.skip(f"no private mount/network namespace here: {isolation['reason']}")
    seen = isolation["seen"]
    assert seen["mount_ns_private"] and seen["net_ns_private"], seen
    writes = seen["writes"]
    assert writes.pop(isolation["tmpfs"]) == "writable"
    assert writes and set(writes.values()) == {"EROFS"}, writes  # /, /tmp, the repository
    assert "/" in isolation["readonly_mounts"] and isolation["readonly_failures"] == [], isolation
    assert seen["interfaces"] == ["lo"], seen
    assert seen["connect_192.0.2.1"] in ("ENETUNREACH", "EHOSTUNREACH"), seen


def test_agent_stays_under_the_limits(report: dict[str, Any]) -> None:
    """From the proofs' end to serve's exit: no OOM kill, no limit hit, no refused fork,
    memory and task peaks (kernel and sampled) under the limits."""
    end = report["counters"]["shutdown"]
    envelope, agent = end["envelope"], end["agent"]
    assert envelope["memory_limit"] == MEMORY_LIMIT and envelope["pids_limit"] == PIDS_LIMIT, envelope
    assert _delta(report, "agent", "oom_kills") == 0 and _delta(report, "envelope", "oom_kills") == 0
    if report["backend"] == "v1":
        # The proofs hit the limit on purpose; the driver restarted the v1 counters after them.
        assert envelope["memory_limit_hits"] == 0, envelope
        assert 0 < envelope["memory_peak"] < MEMORY_LIMIT, envelope
    else:
        assert _delta(report, "envelope", "memory_limit_hits") == 0
        assert 0 < agent["memory_peak"] < MEMORY_LIMIT, agent
    sampled = report["sampled_maxima"]["overall"]
    assert 0 < sampled["envelope_memory"] < MEMORY_LIMIT, sampled
    assert 0 < sampled["envelope_tasks"] < PIDS_LIMIT, sampled
    if agent["pids_peak"] is not None:  # pids.peak: kernels that have it
        assert agent["pids_peak"] < PIDS_LIMIT, agent
    assert _delta(report, "agent", "fork_failures", end="load") == 0
    if report["backend"] == "v1":  # v1 counts refusals in the forking cgroup: serve and pull
        assert _delta(report, "agent", "fork_failures") == 0


def test_serve_answers_a_steady_load_with_real_jobs(report: dict[str, Any]) -> None:
    load = report["phases"]["load"]
    assert load["unexpected"] == 0, load["unexpected_samples"]
    by = load["by_operation_status"]
    assert by.get("start 202", 0) >= 5 and by.get("cancel 202", 0) >= 2, by
    assert by.get("list 200", 0) >= 50 and by.get("get 200", 0) >= 50, by
    assert set(by) <= {"list 200", "get 200", "events 200", "start 202", "cancel 202", "cancel 200"}, by
    runs = report["runs"]["by_task"]
    for task in ("work", "pyjob"):  # real jobs ran to completion and others were cancelled
        assert runs[task].get("succeeded", 0) >= 1 and runs[task].get("cancelled/user", 0) >= 1, runs
        assert set(runs[task]) <= {"succeeded", "cancelled/user"}, runs  # none failed, lost or left


def test_pull_cycles_against_the_cluster_double(report: dict[str, Any]) -> None:
    pull = report["pull"]
    assert pull["exit"] == 0, pull
    assert pull["cycles"] >= 5 and pull["statuses"].get("accepted", 0) >= 1, pull
    assert set(pull["statuses"]) <= {"accepted", "idle", "replayed"}, pull
    assert pull["maxrss_kib"] * 1024 < MEMORY_LIMIT


def test_sigterm_drains_stops_runs_and_leaves_nothing(report: dict[str, Any]) -> None:
    serve = report["serve"]
    assert serve["exit"] == 0, serve
    assert report["phases"]["shutdown"]["runs_running_at_sigterm"] == 2
    assert report["runs"]["sleepers"] == ["cancelled/shutdown", "cancelled/shutdown"], report["runs"]
    assert report["integrity_check"] == "ok"
    assert report["leaked_processes"] == [] and report["leftover_cgroups"] == []
    assert report["envelope_left"] == []


def test_fork_bomb_is_capped_and_serve_keeps_answering(report: dict[str, Any]) -> None:
    bomb = report["phases"]["bomb"]
    if "skipped" in bomb:
        pytest.skip(bomb["skipped"])
    assert bomb["start_status"] == 202 and bomb["hit_cap"], bomb
    assert bomb["run_pids_max"] == str(RUN_PIDS_DEFAULT) and bomb["run_fork_failures"] > 0, bomb
    assert bomb["run_tasks_sampled_max"] <= RUN_PIDS_DEFAULT, bomb
    if bomb["run_pids_peak_kernel"] is not None:
        assert bomb["run_pids_peak_kernel"] <= RUN_PIDS_DEFAULT, bomb
    clients = bomb["clients"]
    assert clients["unexpected"] == 0 and clients["requests"] >= 50, clients
    assert bomb["cancel_status"] == 202 and bomb["run_status"] == "cancelled", bomb
    assert bomb["bomb_cgroup_gone"], bomb
    assert report["runs"]["by_task"]["bomb"] == {"cancelled/user": 1}
    phase = report["sampled_maxima"]["per_phase"]["bomb"]
    assert phase["envelope_tasks"] < PIDS_LIMIT, phase
    if report["backend"] == "v1":  # refusals counted where the fork happened: only in the Run
        assert _delta(report, "agent", "fork_failures", start="load", end="bomb") == 0

