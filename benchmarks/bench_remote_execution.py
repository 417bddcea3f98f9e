"""Benchmark: what executing a remote offer costs the device, against an idle cron cycle.

    python benchmarks/bench_remote_execution.py [--runs N] [--window-s S] [--keep DIR]

One cluster double in this process (TLS 1.3 mTLS on loopback, its reference lease
durations: a 30 s claim lease, 30 s renewals, so a renewal every 10 s; the session
heartbeats every 10 s), one device (its journal, RAM runtime directory and remote logs
in a temporary directory), the real CLI started as
``python -S <launcher> --config C pull --no-splay`` (packaging/files/launcher, the
package linked in as on a router). Figures, all in one run (issue 15):

* **idle cycle** (the denominator): a cron cycle with no work, as cron runs it every
  minute: the session record aged so its heartbeat is due (heartbeat + offers pull);
  CPU (user+sys) and peak RSS of the whole process from ``wait4``; medians of N runs.
* **resident RSS**: peak RSS (``wait4``: the pull; its children, the job wrapper and
  its command, are smaller) of a resident ``pull`` that accepted one offer and
  supervised its job to the end. Target: <= 1.15x the idle cycle's.
* **supervising a minute**: the pull's CPU (``/proc/<pid>/task/*/schedstat``, every
  thread) over ``--window-s`` seconds (default 60) while its job runs: the lease
  renewals and heartbeats, each a TLS 1.3 exchange (the cluster closes idle
  connections after 5 s: resumed handshakes), and the journal writes of the renewals.
  Reported per minute (scaled when the window is shorter). Target: <= 1x one idle cycle.
* **offered answer to the job's first instruction**: the pull's CPU from the moment the
  cluster answers the offer (read by the double as it sends it) to the moment the job's
  first shell instruction opens a FIFO whose reader, in the bench, then samples the
  pull's ``/proc`` (the job runs in its own PID namespace, issue 24): starting twice,
  the log, the launch barrier, the job wrapper's start (its compiled program and the
  isolation answer are cached in the runtime directory, warm after the first job of a
  boot), the handle. Median of N. Target: <= 2x one idle cycle.
* **uploading a 4 MiB log**: the peak RSS of a resident pull whose job wrote 4 MiB (under
  ``worker.maxLogBytes`` 4 MiB; the upload streams the file in 64 KiB steps) less that
  of the same run with a 6-byte log. Target: growth <= 1 MiB.

Reported, never asserted. Prints one JSON object.
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
import threading
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from qinglong_edge.worker.journal.runtime import journal_key  # noqa: E402
from tests.support.cluster_double import ClusterDouble, Exchange  # noqa: E402

TARGETS = {"resident_rss": 1.15, "supervise_cpu": 1.0, "launch_cpu": 2.0, "upload_rss_growth_mib": 1.0}
FOUR_MIB = 4 * 1024 * 1024


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_EDGE_", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _schedstat_ns(pid: int) -> int:
    """CPU time (ns) of every thread of ``pid`` so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as handle:
                total += int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def _hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


#: Runs the pull as its own child and reports its ``wait4`` rusage. Not this process:
#: ``ru_maxrss`` also counts the RSS a child had before its ``exec``, i.e. the forking
#: parent's (this one holds the cluster double: ~25 MiB), so the pull is forked by a
#: bare interpreter (~9 MiB, less than any pull).
SPAWNER = r"""
import json, os, sys
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[1], sys.argv[1:])
print(pid, flush=True)
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status), "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000,
                  "maxrss_kib": float(usage.ru_maxrss)}), flush=True)
"""


class Pull:
    """One ``pull`` process (through :data:`SPAWNER`): ``pid``, then :meth:`wait`."""

    def __init__(self, argv: list[str]) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        self.proc = subprocess.Popen([sys.executable, "-S", "-c", SPAWNER, *argv], stdout=subprocess.PIPE,
                                     stderr=null, env=_env(), cwd=REPO)
        os.close(null)
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def wait(self) -> dict[str, float]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.proc.wait()
        self.proc.stdout.close()
        result: dict[str, float] = json.loads(line)
        if result["status"] != 0:
            raise SystemExit(f"pull exited {result['status']}")
        return result


def _wait(pull: Pull) -> dict[str, float]:
    return pull.wait()


def _until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


class Device:
    def __init__(self, work: pathlib.Path, cluster: ClusterDouble, **worker: Any) -> None:
        self.work = work
        self.cluster = cluster
        files = cluster.provision(work / "device")
        self.state = work / "state"
        self.state.mkdir(mode=0o700)
        run = work / "run"
        run.mkdir(mode=0o700)
        self.config = work / "config.json"
        self.config.write_text(json.dumps(cluster.agent_config(self.state, files, runtimeDirectory=str(run),
                                                               splayMaxMs=0, **worker)))
        (work / "bin").mkdir()
        (work / "lib" / "qinglong-edge").mkdir(parents=True)
        (work / "lib" / "qinglong-edge" / "qinglong_edge").symlink_to(REPO / "qinglong_edge")
        self.launcher = work / "bin" / "qinglong-edge"
        shutil.copyfile(REPO / "packaging" / "files" / "launcher", self.launcher)
        self.runtime = run / journal_key(str(self.state / "worker"))
        self.traces = work / "traces"
        self.traces.mkdir()

    def argv(self) -> list[str]:
        return [sys.executable, "-S", str(self.launcher), "--config", str(self.config), "pull", "--no-splay", "--json"]

    def start(self) -> Pull:
        return Pull(self.argv())

    def age_session(self) -> None:
        """Make the next cycle's heartbeat due, as it is at every cron minute."""
        path = self.runtime / "session.json"
        state = json.loads(path.read_text())
        state["session"]["heartbeatAtMs"] -= 60_000
        path.write_text(json.dumps(state, separators=(",", ":")) + "\n")

    def state_of_inbox(self) -> str | None:
        offers = self.state / "worker" / "offers"
        states = [json.loads(p.read_text())["state"] for p in offers.iterdir()] if offers.exists() else []
        return states[-1] if len(states) == 1 else None

    def clear_inbox(self) -> None:
        offers = self.state / "worker" / "offers"
        for path in offers.iterdir():
            path.unlink()


def _job(traces: pathlib.Path, name: str, *, output: str = "echo ready", stamp: bool = False) -> str:
    """A shell job: it works and waits for its gate file. With ``stamp``, its first
    instruction opens the FIFO ``<name>.fifo`` for writing, which wakes the bench's
    :class:`Stamp` reader: the job runs in its own PID namespace (issue 24), so it
    cannot name the pull's ``/proc`` entry itself; the reader, outside, samples the
    pull's CPU the moment the job opens the FIFO."""
    gate = traces / f"{name}.go"
    first = f": > {traces / f'{name}.fifo'}; " if stamp else ""
    return f"{first}{output}; while [ ! -e {gate} ]; do sleep 0.1; done"


class Stamp:
    """Samples ``pid``'s CPU (ns, every thread) when the job opens its FIFO for writing."""

    def __init__(self, traces: pathlib.Path, name: str) -> None:
        self.path = traces / f"{name}.fifo"
        os.mkfifo(self.path, 0o600)
        self.pid = 0
        self.ns: int | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.path, "rb") as handle:  # blocks until the job's first instruction
            self.ns = _schedstat_ns(self.pid)
            handle.read()

    def wait(self, timeout: float) -> int:
        self.thread.join(timeout)
        if self.ns is None:
            raise SystemExit(f"the job never opened {self.path}")
        return self.ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="idle cycles and launches measured (default 7)")
    parser.add_argument("--window-s", type=float, default=60.0, help="supervision window (default 60 s)")
    parser.add_argument("--keep", help="use (and keep) this directory instead of a temporary one")
    args = parser.parse_args()
    work = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="bench-remote-"))
    work.mkdir(parents=True, exist_ok=True)
    offered: dict[str, int] = {}
    watched: dict[str, int] = {"pid": 0}
    lock = threading.Lock()

    def on_exchange(exchange: Exchange) -> None:
        # Called as the double answers: the pull is blocked waiting for it.
        if exchange.op == "offers" and exchange.status == 200 and watched["pid"]:
            with lock:
                offered.setdefault("ns", _schedstat_ns(watched["pid"]))

    cluster = ClusterDouble(on_exchange=on_exchange)
    cluster.start()
    try:
        device = Device(work, cluster)
        # warm-up: registers the session, compiles .pyc files, and runs one job (the
        # wrapper's compiled program and the isolation answer are cached per boot)
        cluster.add_command_task("true")
        _wait(device.start())
        device.clear_inbox()
        idle = []
        for _ in range(args.runs):
            device.age_session()
            idle.append(_wait(device.start()))
        idle_cpu = statistics.median(s["cpu_ms"] for s in idle)
        idle_rss = statistics.median(s["maxrss_kib"] for s in idle)

        launches: list[float] = []
        for index in range(args.runs):
            name = f"launch{index}"
            cluster.add_command_task(_job(device.traces, name, stamp=True))
            (device.traces / f"{name}.go").write_text("go")  # ends at once after its stamp
            offered.clear()
            stamp = Stamp(device.traces, name)
            proc = device.start()
            stamp.pid = watched["pid"] = proc.pid
            _wait(proc)
            watched["pid"] = 0
            launches.append((stamp.wait(10) - offered["ns"]) / 1e6)
            device.clear_inbox()

        # one resident pull supervising a running job for the window
        cluster.add_command_task(_job(device.traces, "supervise"))
        proc = device.start()
        _until(lambda: device.state_of_inbox() == "running_acknowledged", 60, "the job to run")
        time.sleep(2.0)  # past the start-up: only supervision from here
        before = _schedstat_ns(proc.pid)
        time.sleep(args.window_s)
        supervise_ms = (_schedstat_ns(proc.pid) - before) / 1e6
        renewals = sum(1 for x in cluster.exchanges_for("lease-control") if x.status == 200)
        (device.traces / "supervise.go").write_text("go")
        resident = _wait(proc)
        device.clear_inbox()
        per_minute = supervise_ms * 60 / args.window_s

        # the same job with a 4 MiB log, and with a 6-byte one: the difference of the two
        # pulls' peaks is what uploading 4 MiB costs (the rest of both runs is the same)
        worker = {**json.loads(device.config.read_text())["worker"], "maxLogBytes": FOUR_MIB}
        device.config.write_text(json.dumps({**json.loads(device.config.read_text()), "worker": worker}))
        uploads: dict[str, dict[str, float]] = {}
        hwm_before = 0
        uploaded = 0
        for name, output in (("small", "echo ready"), ("upload", f"head -c {FOUR_MIB} /dev/zero | tr '\\000' 'a'")):
            task = cluster.add_command_task(_job(device.traces, name, output=output))
            proc = device.start()
            size = FOUR_MIB if name == "upload" else 6
            logs = device.state / "logs" / "remote"

            def written(size: int = size, logs: pathlib.Path = logs) -> bool:
                return any(p.stat().st_size == size for p in logs.rglob("*.log")) if logs.exists() else False

            _until(written, 60, f"the {name} job's log")
            _until(lambda: device.state_of_inbox() == "running_acknowledged", 60, f"the {name} job to run")
            if name == "upload":
                hwm_before = _hwm_kib(proc.pid)
            (device.traces / f"{name}.go").write_text("go")
            uploads[name] = _wait(proc)
            stored = cluster.artifact(task.candidate["runId"])
            if name == "upload":
                uploaded = len(stored.data) if stored is not None else 0
            device.clear_inbox()
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    launch_ms = statistics.median(launches)
    growth_mib = (uploads["upload"]["maxrss_kib"] - uploads["small"]["maxrss_kib"]) / 1024
    ratios = {"resident_rss": round(resident["maxrss_kib"] / idle_rss, 3),
              "supervise_cpu": round(per_minute / idle_cpu, 3), "launch_cpu": round(launch_ms / idle_cpu, 3),
              "upload_rss_growth_mib": round(growth_mib, 3)}
    result = {
        "benchmark": "remote_execution",
        "command": "python -S bin/qinglong-edge --config C pull --no-splay --json",
        "python": sys.version.split()[0],
        "runs": args.runs,
        "window_s": args.window_s,
        "units": {"cpu_ms": "ms user+sys", "maxrss_kib": "KiB peak RSS (wait4)"},
        "idle_cycle": {"cpu_ms_median": round(idle_cpu, 2), "maxrss_kib_median": idle_rss},
        "resident": {"maxrss_kib": resident["maxrss_kib"], "cpu_ms": round(resident["cpu_ms"], 2)},
        "supervise": {"window_cpu_ms": round(supervise_ms, 2), "per_minute_cpu_ms": round(per_minute, 2),
                      "renewals_total": renewals},
        "launch": {"cpu_ms_median": round(launch_ms, 2), "cpu_ms_all": [round(v, 2) for v in launches]},
        "upload": {"log_bytes": uploaded, "maxrss_kib": uploads["upload"]["maxrss_kib"],
                   "small_log_maxrss_kib": uploads["small"]["maxrss_kib"], "hwm_before_upload_kib": hwm_before,
                   "growth_mib": round(growth_mib, 3)},
        "ratios": ratios,
        "targets": TARGETS,
        "met": {key: ratios[key] <= TARGETS[key] for key in TARGETS},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
