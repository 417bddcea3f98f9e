"""Benchmark: what issue 24's isolation adds to a remote job's launch, against today's.

    python benchmarks/bench_job_isolation.py [--runs N]

Both are :func:`qinglong_edge.process.spawn.start_job` with a log, a truncation fact and
a receipt, as a remote run has, and a private user + mount namespace hiding a directory:

* ``baseline`` ("today's", before issue 24): no PID namespace, no memory leaf (the
  job in the per-run cgroups where the agent has them: v1 pids/freezer, v2);
* ``ours``: a PID namespace with our init as PID 1 and a private /proc, the read-only
  binds, and the job in a memory leaf of its own (v1 memory here) besides those cgroups.
  ``oom_score_adj`` 1000 is one write in both (it is not optional).

Figures (medians over N runs, interleaved):

* ``cycle_ms`` / ``cycle_cpu_ms``: start, release, ``/bin/true`` runs, everything is
  reaped: wall time and the CPU of the whole process tree (``RUSAGE_CHILDREN`` of this
  process: the wrapper, and what it and the init reaped);
* memory while a job (``sleep``) runs: the private memory (USS: private clean + dirty,
  ``smaps_rollup``) of our processes, the wrapper and, for ``ours``, the init; and
  their PSS.

Targets (issue 24): at most +1 MiB private per job, the init included, and +10 ms CPU.
Needs root for the per-run cgroups and the memory leaf (without, the cgroup parts are
left out of both and the result says so). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qinglong_edge.contracts.ids import new_uuid4  # noqa: E402
from qinglong_edge.process.cgroups import CgroupManager  # noqa: E402
from qinglong_edge.process.isolation import probe_isolation  # noqa: E402
from qinglong_edge.process.spawn import (  # noqa: E402
    PID_NONE,
    PID_PRIVATE_PROC,
    HeldJob,
    Isolation,
    JobSpec,
    Publication,
    start_job,
    wrapper_bytecode,
)

MIB = 1024 * 1024
TARGET_PRIVATE_KIB = 1024
TARGET_CPU_MS = 10.0


def _smaps(pid: int) -> dict[str, int]:
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                values[key] = int(rest.split()[0])
    return {"pss_kib": values["Pss"], "uss_kib": values["Private_Clean"] + values["Private_Dirty"]}


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(name))
    return found


class Variant:
    def __init__(self, name: str, root: pathlib.Path, pid: str, manager: CgroupManager | None) -> None:
        self.name, self.root, self.pid, self.manager = name, root, pid, manager
        (root / "hidden").mkdir(parents=True)
        (root / "etc").mkdir()
        (root / "etc" / "config.json").write_text("{}")
        self.counter = 0

    def spec(self, argv: list[str]) -> tuple[JobSpec, Any]:
        self.counter += 1
        n = self.counter
        readonly = [str(self.root / "etc" / "config.json")] if self.pid != PID_NONE else []
        spec = JobSpec(argv, {}, str(self.root), str(self.root / "logs" / f"{n}.log"), 1 << 20,
                       truncation_fact=Publication(str(self.root / "logs" / f".{n}.fact"), b'{"a":1'),
                       receipt=Publication(str(self.root / "receipts" / f"{n}.json"), b'{"startedAtMs":1'),
                       started_at_ms=1, drain_ms=0,
                       isolation=Isolation(hide=[str(self.root / "hidden")], readonly=readonly, pid=self.pid))
        group = self.manager.create(f"bench-{new_uuid4()}") if self.manager is not None else None
        return spec, group

    def cycle(self) -> tuple[float, float]:
        spec, group = self.spec(["/bin/true"])
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        job = start_job(spec, cgroup=group)
        job.release()
        job.process.wait(30)
        wall = (time.perf_counter() - started) * 1000
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if group is not None:
            group.remove()
        cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000
        return wall, cpu

    def running(self) -> dict[str, int]:
        spec, group = self.spec(["/bin/sleep", "30"])
        job: HeldJob = start_job(spec, cgroup=group)
        job.release()
        try:
            ours = [job.pid]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the init (ours) or the sleep (baseline) is there
                kids = _children(job.pid)
                if kids and all(_comm(k) in ("qinglong-job", "sleep") for k in kids):
                    break
                time.sleep(0.01)
            time.sleep(0.2)  # let the init settle into its wait
            ours += [k for k in _children(job.pid) if _comm(k) == "qinglong-job"]
            total = {"uss_kib": 0, "pss_kib": 0, "processes": len(ours)}
            for pid in ours:
                for key, value in _smaps(pid).items():
                    total[key] += value
            return total
        finally:
            job.process.terminate()
            job.process.wait(30)
            if group is not None:
                group.kill()
                group.remove()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    probe = probe_isolation()
    if not probe.available or probe.pid != PID_PRIVATE_PROC:
        print(json.dumps({"skipped": f"no PID namespace with a private /proc here: {probe.reason} {probe.pid_reason}"}))
        return 0
    wrapper_bytecode(sys.executable)  # once per agent process, outside the figures
    base = pathlib.Path(tempfile.mkdtemp(prefix="qle-bench-isolation-"))
    try:
        root = os.geteuid() == 0
        plain = CgroupManager.detect("auto") if root else None
        leaf = CgroupManager.detect("auto", memory_max=64 * MIB) if root else None
        variants = {
            "baseline": Variant("baseline", base / "baseline", PID_NONE, plain if plain and plain.available else None),
            "ours": Variant("ours", base / "ours", PID_PRIVATE_PROC,
                            leaf if leaf and leaf.available else None),
        }
        for variant in variants.values():  # warm-up
            variant.cycle()
        cycles: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        memory: dict[str, list[dict[str, int]]] = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, variant in variants.items():
                cycles[name].append(variant.cycle())
        for _ in range(max(3, args.runs // 5)):
            for name, variant in variants.items():
                memory[name].append(variant.running())
        result: dict[str, Any] = {"runs": args.runs, "level": probe.level,
                                  "memory_leaf": bool(leaf is not None and leaf.memory_available),
                                  "cgroups": bool(plain is not None and plain.available)}
        for key, index in (("cycle_ms_median", 0), ("cycle_cpu_ms_median", 1)):
            result[key] = {name: round(statistics.median(c[index] for c in cycles[name]), 2) for name in variants}
        result["running"] = {name: {key: int(statistics.median(m[key] for m in memory[name]))
                                    for key in ("uss_kib", "pss_kib", "processes")} for name in variants}
        added_uss = result["running"]["ours"]["uss_kib"] - result["running"]["baseline"]["uss_kib"]
        added_cpu = result["cycle_cpu_ms_median"]["ours"] - result["cycle_cpu_ms_median"]["baseline"]
        result["added"] = {"private_kib": added_uss, "cpu_ms": round(added_cpu, 2),
                           "pss_kib": result["running"]["ours"]["pss_kib"] - result["running"]["baseline"]["pss_kib"],
                           "wall_ms": round(result["cycle_ms_median"]["ours"] - result["cycle_ms_median"]["baseline"],
                                            2)}
        result["targets"] = {"private_kib": TARGET_PRIVATE_KIB, "cpu_ms": TARGET_CPU_MS}
        result["met"] = {"private_kib": added_uss <= TARGET_PRIVATE_KIB, "cpu_ms": added_cpu <= TARGET_CPU_MS}
        print(json.dumps(result))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
