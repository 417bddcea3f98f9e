"""Benchmark: what the job wrapper costs per job, against the ``sh`` wrapper it replaced.

    python benchmarks/bench_job_wrapper.py [--runs N] [--jobs K]

Ours: :func:`qinglong_edge.process.spawn.start_job` (``python -I -S`` running
``process/wrapper.py``, spec on the control pipe, ``ready``, release) with a log file, a
truncation fact and a receipt, as a remote run has. Baseline: the previous launcher
(``/bin/sh -c ENTER_SCRIPT ...``: enter the cgroups, wait for ``go`` on stdin, then
``exec`` the command), copied here verbatim from the commit before the wrapper; its
output went to a FIFO the agent drained.

Figures (medians over N runs, interleaved):

* ``ready_ms``: from the call to the wrapper's ``ready`` (ours) / to the process being
  started (baseline: ``Popen`` returns; the ``sh`` reads its gate later);
* ``cycle_ms``: start, release, ``/bin/true`` runs, the process is reaped: the whole life
  of a trivial job; ``cycle_cpu_ms``: the CPU of that process tree (``wait4``: the
  wrapper and what it reaped);
* memory of one *running* job's supervision (``sleep`` held by the wrapper), from
  ``/proc/<pid>/smaps_rollup`` of the wrapper: RSS, PSS and USS (private clean + dirty;
  what the job's supervision adds to the machine). The baseline's supervision costs
  nothing once the ``sh`` has ``exec``\\ ed into the job (the job *is* the process); its
  footprint while held at the barrier is reported too;
* K jobs at once: the sum of the wrappers' USS and PSS (pages shared between wrappers
  are the interpreter's).

No issue sets a target: the figures are for the record (the spec decision "The job
wrapper" chose a parent process that outlives the agent). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qinglong_edge.process import spawn  # noqa: E402
from qinglong_edge.process.spawn import HeldJob, JobSpec, Publication, start_job  # noqa: E402

#: The previous launcher, verbatim (qinglong_edge/process/spawn.py before the job wrapper).
ENTER_SCRIPT = """n=$1; shift
while [ "$n" -gt 0 ]; do
  echo $$ > "$1" || exit 125
  shift; n=$((n - 1))
done
IFS= read -r go || exit 125
[ "$go" = go ] || exit 125
exec "$@" </dev/null
"""


def _smaps(pid: int) -> dict[str, int]:
    """RSS, PSS and USS (KiB) of one process."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                values[key] = int(rest.split()[0])
    return {"rss_kib": values["Rss"], "pss_kib": values["Pss"],
            "uss_kib": values["Private_Clean"] + values["Private_Dirty"]}


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


def _running(wrapper: int) -> bool:
    """The wrapper's child has exec'd the command (until then it shares the wrapper's pages)."""
    for child in _children(wrapper):
        try:
            if os.readlink(f"/proc/{child}/exe").endswith("sleep"):
                return True
        except OSError:
            continue
    return False


def _wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.002)


class Ours:
    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.n = 0

    def start(self, argv: list[str]) -> tuple[float, HeldJob]:
        self.n += 1
        d = self.root / f"ours-{self.n}"
        spec = JobSpec(argv, {"PATH": "/usr/bin:/bin", "SECRET": "x" * 32}, str(self.root), str(d / "job.log"),
                       1 << 20, truncation_fact=Publication(str(d / "fact.json"), b'{"schemaVersion":1'),
                       receipt=Publication(str(d / "receipt.json"), b'{"schemaVersion":1'), started_at_ms=1)
        started = time.perf_counter()
        job = start_job(spec)
        return (time.perf_counter() - started) * 1000, job

    def cycle(self) -> tuple[float, float]:
        started = time.perf_counter()
        _, job = self.start(["/bin/true"])
        job.release()
        _, status, usage = os.wait4(job.pid, 0)
        job.process.returncode = os.waitstatus_to_exitcode(status)
        return (time.perf_counter() - started) * 1000, (usage.ru_utime + usage.ru_stime) * 1000


class Baseline:
    def __init__(self, root: pathlib.Path) -> None:
        self.root = root

    def start(self, argv: list[str]) -> tuple[float, subprocess.Popen[bytes], int]:
        gate_r, gate_w = os.pipe()
        started = time.perf_counter()
        fd = os.open(os.devnull, os.O_WRONLY)
        proc = subprocess.Popen(["/bin/sh", "-c", ENTER_SCRIPT, "qinglong-edge-enter", "0", *argv], stdin=gate_r,
                                stdout=fd, stderr=fd, cwd=str(self.root), env={"PATH": "/usr/bin:/bin"},
                                start_new_session=True)
        elapsed = (time.perf_counter() - started) * 1000
        os.close(fd)
        os.close(gate_r)
        return elapsed, proc, gate_w

    def cycle(self) -> tuple[float, float]:
        started = time.perf_counter()
        _, proc, gate = self.start(["/bin/true"])
        os.write(gate, b"go\n")
        os.close(gate)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return (time.perf_counter() - started) * 1000, (usage.ru_utime + usage.ru_stime) * 1000


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-job-wrapper-"))
    ours, base = Ours(root), Baseline(root)
    try:
        # Once per agent process: the wrapper compiled by a short-lived interpreter.
        started = time.perf_counter()
        bytecode = spawn.wrapper_bytecode(sys.executable)
        compile_ms = (time.perf_counter() - started) * 1000
        source_bytes = len(spawn.wrapper_source())
        ready: dict[str, list[float]] = {"ours": [], "baseline": []}
        cycle: dict[str, list[float]] = {"ours": [], "baseline": []}
        cpu: dict[str, list[float]] = {"ours": [], "baseline": []}
        for _ in range(args.runs):
            ms, job = ours.start(["/bin/true"])
            ready["ours"].append(ms)
            job.abort()
            ms, proc, gate = base.start(["/bin/true"])
            ready["baseline"].append(ms)
            os.close(gate)
            proc.wait()
            for name, side in (("ours", ours), ("baseline", base)):
                wall, used = side.cycle()
                cycle[name].append(wall)
                cpu[name].append(used)
        # One running job each: what supervising it costs.
        _, job = ours.start(["/bin/sleep", "100091"])
        held_ours = _smaps(job.pid)
        job.release()
        _wait_for(lambda: _running(job.pid))
        running_ours = _smaps(job.pid)
        job.process.kill()
        os.killpg(job.pid, 9)
        job.process.wait()
        _, proc, gate = base.start(["/bin/sleep", "100092"])
        _wait_for(lambda: os.path.exists(f"/proc/{proc.pid}/smaps_rollup") and _smaps(proc.pid)["rss_kib"] > 0)
        time.sleep(0.05)
        held_base = _smaps(proc.pid)
        os.write(gate, b"go\n")
        os.close(gate)
        _wait_for(lambda: os.readlink(f"/proc/{proc.pid}/exe").endswith("sleep"))
        running_base_self = _smaps(proc.pid)  # this is the job itself now
        os.killpg(proc.pid, 9)
        proc.wait()
        # K jobs at once.
        jobs = []
        for _ in range(args.jobs):
            _, held = ours.start(["/bin/sleep", "100093"])
            held.release()
            jobs.append(held)
        for held in jobs:
            _wait_for(lambda h=held: _running(h.pid))
        many = [_smaps(h.pid) for h in jobs]
        for held in jobs:
            os.killpg(held.pid, 9)
            held.process.wait()
        result = {
            "runs": args.runs,
            "python": os.path.basename(sys.executable),
            "commands": {
                "ours": "start_job(JobSpec([...], env, cwd, log, 1 MiB, truncation_fact=..., receipt=...)) -> "
                        "python -I -S /proc/self/fd/N qinglong-edge-job",
                "baseline": "/bin/sh -c ENTER_SCRIPT qinglong-edge-enter 0 CMD... (the previous launcher)",
            },
            "ready_ms_median": {k: _median(v) for k, v in ready.items()},
            "cycle_ms_median": {k: _median(v) for k, v in cycle.items()},
            "cycle_cpu_ms_median": {k: _median(v) for k, v in cpu.items()},
            "held_at_barrier": {"ours": held_ours, "baseline": held_base},
            "running_supervision": {"ours": running_ours, "baseline": {"rss_kib": 0, "pss_kib": 0, "uss_kib": 0}},
            "baseline_job_itself_after_exec": running_base_self,
            "concurrent": {"jobs": args.jobs, "uss_kib_sum": sum(m["uss_kib"] for m in many),
                           "pss_kib_sum": sum(m["pss_kib"] for m in many),
                           "rss_kib_each_median": _median([m["rss_kib"] for m in many])},
            "tasks_added_per_job": 1,
            "once_per_agent": {"compile_ms": round(compile_ms, 2), "bytecode_bytes": len(bytecode),
                               "source_bytes": source_bytes},
        }
        print(json.dumps(result))
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
