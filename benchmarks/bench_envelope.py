"""Benchmark: the agent's peak memory and tasks inside the edge envelope (128 MiB, 64 tasks).

    python benchmarks/bench_envelope.py [--load-seconds S]

Runs the scenario of ``tests/envelope`` once (:func:`tests.support.envelope_driver.launch`:
a fresh cgroup with the edge limits, proved first; ``serve`` under 4 clients and real
jobs while ``pull --duration`` cycles against the cluster double; a fork-bomb Run;
SIGTERM; as uid 65534 in private mount/network namespaces where ``unshare`` allows)
and reports the kernel's figures. The baseline is the limit itself: ratios are peak /
limit. Needs root and cgroup v1 memory+pids (or v2 with both delegated); elsewhere it
prints ``{"skipped": reason}``.

Figures: ``memory_peak`` (v1 ``memory.max_usage_in_bytes`` of the envelope after the
proofs, or v2 ``memory.peak`` of the agent's cgroup: process memory *and* the page cache
and tmpfs pages charged to it), the anonymous/file/shmem split at the end of the load
phase, peak RSS of ``serve`` and ``pull`` (wait4), peak tasks (``pids.peak`` where the
kernel has it, and sampled ``pids.current`` every 10 ms), OOM kills, refused forks, the
fork bomb's own cap. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.support.envelope import MIB, probe  # noqa: E402
from tests.support.envelope_driver import launch  # noqa: E402

MEMORY_LIMIT = 128 * MIB
PIDS_LIMIT = 64


def _agent_python() -> str | None:
    """An interpreter uid 65534 can run (pyenv under /root is not)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(candidate):
            continue
        try:
            proc = subprocess.run([candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"],
                                  user=65534, group=65534, extra_groups=[], capture_output=True, check=False, cwd="/")
        except PermissionError:
            continue
        if proc.returncode == 0:
            return candidate
    return None


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    counters = report["counters"]
    end, load = counters["shutdown"], counters["load"]
    v1 = report["backend"] == "v1"
    memory_peak = end["envelope"]["memory_peak"] if v1 else end["agent"]["memory_peak"]
    sampled = report["sampled_maxima"]
    tasks_kernel = end["agent"]["pids_peak"]
    tasks_sampled = sampled["overall"].get("envelope_tasks", 0)
    bomb = report["phases"].get("bomb", {})

    def delta(scope: str, key: str) -> int:
        return int(end[scope][key] or 0) - int(counters["after_proofs"][scope][key] or 0)

    return {
        "memory_peak_mib": round(memory_peak / MIB, 1),
        "memory_peak_sampled_mib": round(sampled["overall"]["envelope_memory"] / MIB, 1),
        "memory_at_end_of_load_mib": {key: round((load["agent"][f"memory_{key}"] or 0) / MIB, 1)
                                      for key in ("anon", "file", "shmem")},
        "serve_maxrss_mib": round(report["serve"]["maxrss_kib"] / 1024, 1),
        "pull_maxrss_mib": round(report["pull"]["maxrss_kib"] / 1024, 1),
        "serve_threads_max": sampled["overall"].get("serve_threads"),
        "tasks_peak_kernel": tasks_kernel,
        "tasks_peak_sampled": tasks_sampled,
        "tasks_peak_sampled_per_phase": {phase: values.get("envelope_tasks")
                                         for phase, values in sampled["per_phase"].items()},
        "oom_kills": delta("agent", "oom_kills") + delta("envelope", "oom_kills"),
        "memory_limit_hits": end["envelope"]["memory_limit_hits"] if v1 else delta("envelope", "memory_limit_hits"),
        "refused_forks_agent": delta("agent", "fork_failures") if v1 else None,
        "fork_bomb": {key: bomb.get(key) for key in ("skipped", "run_pids_max", "run_pids_peak_kernel",
                                                        "run_fork_failures", "run_status", "stopped_in_s")
                      if key in bomb} | {"reads_during": bomb.get("clients", {}).get("requests"),
                                         "unexpected_during": bomb.get("clients", {}).get("unexpected")},
        "load": {key: report["phases"]["load"][key] for key in ("requests", "unexpected", "latency_ms_p50",
                                                                 "latency_ms_p99")},
        "pull": {key: report["pull"][key] for key in ("exit", "cycles", "statuses")},
        "serve_exit": report["serve"]["exit"],
        "integrity_check": report["integrity_check"],
        "leaked_processes": len(report["leaked_processes"]),
        "ratios": {"memory_peak_over_limit": round(memory_peak / MEMORY_LIMIT, 3),
                   "tasks_peak_over_limit": round(max(tasks_kernel or 0, tasks_sampled) / PIDS_LIMIT, 3)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-seconds", type=float, default=15.0)
    args = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "envelope_edge_128mib_64_tasks",
                              "command": "python benchmarks/bench_envelope.py"
                              + (f" --load-seconds {args.load_seconds:g}" if args.load_seconds != 15.0 else ""),
                              "limits": {"memory_mib": 128, "tasks": PIDS_LIMIT}}
    backend, reason = probe()
    python = _agent_python() if backend else None
    if not backend or python is None:
        result["skipped"] = reason or "no Python >= 3.11 that uid 65534 can run"
        print(json.dumps(result))
        return 0
    report, stderr = launch(backend, python, load_seconds=args.load_seconds)
    result.update(backend=backend, agent_python=python, isolation=report.get("isolation", {}).get("mode"),
                  isolation_reason=report.get("isolation", {}).get("reason"))
    if "error" in report:
        result["error"] = report["error"]
        result["stderr_tail"] = stderr[-2000:]
        print(json.dumps(result))
        return 1
    proofs = report["proofs"]
    result["proofs"] = {"oom_killed_200_mib": proofs["memory"]["killed"],
                        "refused_task_number": proofs["pids"].get("refused_task_number"),
                        "refused_errno": proofs["pids"].get("errno")}
    result |= summarize(report)
    result["targets"] = {"memory_peak_mib_below": 128, "tasks_peak_below": PIDS_LIMIT, "oom_kills": 0,
                         "refused_forks_agent": 0}
    result["met"] = {
        "memory": result["memory_peak_mib"] < 128 and result["memory_limit_hits"] == 0,
        "tasks": max(result["tasks_peak_kernel"] or 0, result["tasks_peak_sampled"]) < PIDS_LIMIT,
        "no_oom_kill": result["oom_kills"] == 0,
        "no_refused_fork": result["refused_forks_agent"] in (0, None),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
