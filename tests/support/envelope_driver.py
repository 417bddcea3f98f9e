"""The envelope scenario, end to end, as root: prove the limits, then run the agent in them.

    unshare --mount --net -- python -m tests.support.envelope_driver --root DIR \\
        --backend v1|v2 --python /usr/bin/python3 [--isolated] [--load-seconds 20]

(``tests/envelope/test_envelope.py`` runs it and asserts on its report.) Prints ONE JSON
report on stdout; progress on stderr. Steps:

1. Isolation (:mod:`tests.support.envelope_isolation`): state on a tmpfs, the rest
   read-only, loopback only -- or a plain directory, with the reason, without ``--isolated``.
2. A fresh envelope (:class:`tests.support.envelope.Envelope`: memory 128 MiB, pids 64).
3. Proofs, in the envelope's child ``proof``, as the agent user: a process allocating
   (and touching) 200 MiB is OOM-killed; a process forking until it fails gets EAGAIN
   when the 65th task would start. Then the envelope's v1 memory peak and limit-hit
   count are restarted (the proof hit them on purpose).
4. The agent, in the child ``agent`` delegated to the agent user (it nests its per-Run
   cgroups there): ``admin`` provisioning, ``serve`` (edge profile, ``execution``
   defaults: 2 concurrent Runs, ``maxRunPids`` 24), the cluster double in this process.
   Phase ``load``: 4 clients (reads, cancels, ``task.start`` of real shell and Python
   jobs) while ``pull --duration`` cycles against the double. Phase ``bomb``: 3 readers
   (this process is the 4th client: the edge profile serves 4 requests at a time and
   answers a 5th ``503 server_overloaded``); a fork-bomb Run is started, holds its
   per-Run cap for 3 s, is cancelled. Phase
   ``shutdown``: two long Runs running, SIGTERM to ``serve``.
5. Checks recorded: exit statuses, rusage peaks, the kernel counters per phase, sampled
   maxima, ``PRAGMA integrity_check``, processes or cgroups left in the envelope, Run
   outcomes. The envelope is removed at the end whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

from tests.support.cluster_double import ClusterDouble
from tests.support.envelope import MIB, Cgroup, Envelope, OrphanReaper
from tests.support.envelope_isolation import prepare_isolated, prepare_plain, verify
from tests.support.envelope_load import Client, LoadClients, Sampler
from tests.support.wait import wait_until

REPO = pathlib.Path(__file__).resolve().parent.parent.parent

#: Jobs: real processes that fork, write output and exit (or wait to be stopped).
JOBS = {
    "work": "i=0; while [ $i -lt 12 ]; do echo \"work $i\"; i=$((i+1)); sleep 0.1; done",
    "pyjob": "python3 -c 'import hashlib, time\n"
             "d = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(50000)]\n"
             "time.sleep(0.3); print(len(d))'",
    "sleeper": "trap 'exit 143' TERM; while :; do sleep 0.2; done",
    # The classic bomb; the leader then waits, so the Run stays running while the bomb
    # churns at its per-Run cap until it is cancelled. bash retries a refused fork, so
    # the bomb holds the cap; dash's processes exit on a refused fork (the bomb fizzles
    # within 0.1 s), so the sh fallback only proves the cap is reached.
    "bomb": ":(){ :|:& };:; exec sleep 600",
}
BOMB_SHELL = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
SH_BOMB = "b(){ b|b& }; b; exec sleep 600"  # dash and busybox sh reject a function named ":"
MEMORY_PROOF = "b = b'\\1' * (200 << 20); print(len(b))"
FORK_PROOF = """
import errno, os, sys
r, w = os.pipe()
children = 0
try:
    while True:
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        children += 1
except OSError as exc:
    current = open(sys.argv[1]).read().strip()
    print(children, errno.errorcode.get(exc.errno, exc.errno), current, flush=True)
os.close(w)
for _ in range(children):
    os.wait()
"""


def say(text: str) -> None:
    sys.stderr.write(f"envelope: {text}\n")
    sys.stderr.flush()


def wait_rusage(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, int | None]:
    """(exit status, peak RSS KiB) of a child, or (None, None) if it is still running."""

    def reaped() -> tuple[int, int] | None:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        return (os.waitstatus_to_exitcode(status), usage.ru_maxrss) if pid == proc.pid else None

    found = wait_until(reaped, timeout, interval=0.02)
    if found is None:
        return None, None
    proc.returncode = found[0]
    return found


class Lines:
    """Collects a child's output lines on a thread."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self.event = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for raw in stream:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
            self.event.set()
        stream.close()

    def wait_for(self, needle: str, timeout: float) -> bool:
        return wait_until(lambda: any(needle in line for line in self.lines), timeout, interval=0.05)

    def join(self) -> None:
        self._thread.join(10)


class Scenario:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = os.path.realpath(args.root)
        self.user = (args.uid, args.gid)
        self.report: dict[str, Any] = {"backend": args.backend, "limits": {
            "memory_bytes": args.memory_mib * MIB, "pids": args.pids}}
        self.envelope: Envelope | None = None
        self.agent: Cgroup | None = None
        self.cluster: ClusterDouble | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.reaper: OrphanReaper | None = None
        self.token = ""

    # -- helpers ------------------------------------------------------------------------------

    def agent_env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
                "HOME": os.path.join(self.root, "state"), "PYTHONPATH": os.path.join(self.root, "lib"),
                "PYTHONDONTWRITEBYTECODE": "1"}

    def cli_argv(self, *args: str) -> list[str]:
        return [self.args.python, "-m", "qinglong_edge", "--config", os.path.join(self.root, "config.json"), *args]

    def cli(self, *args: str) -> str:
        """Run one CLI command as the agent user inside the agent's cgroup."""
        assert self.agent is not None
        proc = self.agent.spawn(self.cli_argv(*args), user=self.user[0], group=self.user[1], env=self.agent_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"qinglong-edge {args[:3]} exited {proc.returncode}: {err.decode()[-500:]}")
        return out.decode()

    def chown_tree(self, path: str) -> None:
        for directory, _, files in os.walk(path):
            os.chown(directory, *self.user)
            for name in files:
                os.chown(os.path.join(directory, name), *self.user)

    # -- steps --------------------------------------------------------------------------------

    def isolate(self) -> None:
        package = str(REPO / "qinglong_edge")
        if self.args.isolated:
            facts = prepare_isolated(self.root, package)
        else:
            facts = prepare_plain(self.root, package, self.args.no_isolation_reason or "not requested")
        outer = json.loads(self.args.outer_namespaces) if self.args.outer_namespaces else {}
        # Write probes only where writes are expected to fail (never litter the real /).
        probes = ["/", "/tmp", str(REPO)] if self.args.isolated else []
        facts["seen"] = verify(self.root, probes, outer)
        self.report["isolation"] = facts

    def prove(self) -> None:
        assert self.envelope is not None
        proof = self.envelope.child("proof")
        env = self.agent_env()
        before = self.envelope.stats()
        proc = proof.spawn([self.args.python, "-c", MEMORY_PROOF], user=self.user[0], group=self.user[1], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, _ = proc.communicate(timeout=120)
        after = self.envelope.stats()
        # v1 counts an OOM kill in the victim's cgroup only; v2 there and in its ancestors.
        memory: dict[str, Any] = {
            "allocated_mib": 200, "returncode": proc.returncode, "stdout": out.decode().strip(),
            "oom_kills": proof.stats()["oom_kills"] or 0,
            "envelope_oom_kills": (after["oom_kills"] or 0) - (before["oom_kills"] or 0),
            "memory_peak": after["memory_peak"]}
        memory["killed"] = proc.returncode == -signal.SIGKILL and memory["oom_kills"] >= 1
        current = os.path.join(self.envelope.pids, "pids.current")
        proc = proof.spawn([self.args.python, "-c", FORK_PROOF, current], user=self.user[0], group=self.user[1],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=120)
        fields = out.decode().split()
        pids: dict[str, Any] = {"returncode": proc.returncode, "stderr": err.decode()[-300:]}
        if len(fields) == 3:
            pids.update(children=int(fields[0]), errno=fields[1], tasks_when_refused=int(fields[2]))
            pids["refused_task_number"] = int(fields[2]) + 1
        pids["fork_failures_counted"] = ((proof.stats()["fork_failures"] or 0) if self.args.backend == "v1"
                                         else (self.envelope.stats()["fork_failures"] or 0))
        pids["refused_65th"] = pids.get("errno") == "EAGAIN" and pids.get("tasks_when_refused") == self.args.pids
        left = proof.remove()
        self.report["proofs"] = {"memory": memory, "pids": pids, "proof_cgroup_left": left}
        self.envelope.reset_memory_peak()

    def provision(self) -> dict[str, dict[str, Any]]:
        assert self.cluster is not None
        state = os.path.join(self.root, "state")
        os.mkdir(state, 0o700)
        files = self.cluster.provision(os.path.join(self.root, "device"))
        self.chown_tree(os.path.join(self.root, "device"))
        self.chown_tree(state)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        document = self.cluster.agent_config(state, files, requestTimeoutMs=2000, backoffBaseMs=200,
                                             pullIntervalMs=500, splayMaxMs=0)
        document["localApi"] = {"listener": {"host": "127.0.0.1", "port": self.port}}
        document["execution"] = {"terminateGraceMs": 1000, "killGraceMs": 500, "controlIntervalMs": 250}
        config = os.path.join(self.root, "config.json")
        with open(config, "w", encoding="utf-8") as handle:
            json.dump(document, handle)
        os.chown(config, *self.user)
        os.chmod(config, 0o600)
        self.cli("admin", "init")
        self.cli("admin", "subject", "create", "--type", "user", "--id", "alice")
        self.cli("admin", "role", "grant", "--project", "default", "--subject-type", "user", "--subject-id",
                 "alice", "--role", "operator")
        self.token = self.cli("admin", "credential", "issue", "--id", "alice-cli", "--subject-type", "user",
                              "--subject-id", "alice").strip()
        tasks = {}
        for task_id, job in JOBS.items():
            script = SH_BOMB if task_id == "bomb" and BOMB_SHELL != "/bin/bash" else job
            shell = ["--shell-path", BOMB_SHELL] if task_id == "bomb" else []
            created = json.loads(self.cli("admin", "task", "create", "--project", "default", "--id", task_id,
                                          "--name", task_id, *shell, "--shell", script, "--json"))
            tasks[task_id] = created["task"]
        return tasks

    def start_serve(self) -> tuple[subprocess.Popen[bytes], Lines]:
        assert self.agent is not None
        proc = self.agent.spawn(self.cli_argv("serve"), user=self.user[0], group=self.user[1], env=self.agent_env(),
                                stderr=subprocess.PIPE)
        self.procs.append(proc)
        lines = Lines(proc.stderr)
        if not lines.wait_for("serving the Local API", 30):
            raise RuntimeError(f"serve did not start: {lines.lines[-5:]}")
        return proc, lines

    def snapshot(self, phase: str) -> None:
        assert self.envelope is not None and self.agent is not None
        self.report.setdefault("counters", {})[phase] = {"envelope": self.envelope.stats(), "agent": self.agent.stats()}

    def run(self) -> None:
        args = self.args
        self.isolate()
        self.reaper = OrphanReaper()
        self.report["orphan_reaper"] = self.reaper.start()
        self.envelope = Envelope.create(args.backend, memory_bytes=args.memory_mib * MIB, pids_max=args.pids,
                                        name=args.name)
        self.report["cgroup"] = dict(self.envelope.paths)
        say(f"envelope {self.envelope.name} ({args.backend}); proving the limits")
        self.prove()
        envelope = self.envelope
        self.agent = agent = envelope.child("agent", owner=self.user)
        self.cluster = ClusterDouble(tasks=("shell", "python", "shell", "python", "shell", "python")).start()
        self.snapshot("after_proofs")
        sampler = Sampler()
        sampler.watch_value("envelope_tasks", lambda: _read_int(os.path.join(envelope.pids, "pids.current")))
        sampler.watch_value("agent_tasks", lambda: _read_int(os.path.join(agent.pids, "pids.current")))
        usage = os.path.join(self.envelope.memory,
                             "memory.current" if args.backend == "v2" else "memory.usage_in_bytes")
        sampler.watch_value("envelope_memory", lambda: _read_int(usage))
        own = os.path.join(self.agent.pids, "cgroup.threads" if args.backend == "v2" else "tasks")
        sampler.watch_value("agent_own_tasks", lambda: len((_read_text(own) or "").split()))
        runs_parent = os.path.join(self.agent.pids, "qinglong-edge")
        sampler.watch_value("run_cgroups", lambda: sum(
            entry.is_dir() for entry in os.scandir(runs_parent)) if os.path.isdir(runs_parent) else 0)
        sampler.start()
        try:
            tasks = self.provision()
            self.scenario(tasks, sampler)
        finally:
            sampler.stop()
            self.report["sampled_maxima"] = {"per_phase": sampler.maxima, "overall": sampler.overall(),
                                             "samples": sampler.samples, "interval_ms": sampler.interval_s * 1000}

    def scenario(self, tasks: dict[str, dict[str, Any]], sampler: Sampler) -> None:
        assert self.agent is not None and self.envelope is not None and self.cluster is not None
        args = self.args
        sampler.phase("provisioned")
        self.snapshot("provisioned")
        serve, serve_err = self.start_serve()
        sampler.watch_process("serve", serve.pid)
        say(f"serve is up on port {self.port}; load for {args.load_seconds} s with pull --duration")
        pull = self.agent.spawn(self.cli_argv("pull", "--duration", str(args.load_seconds), "--json", "--no-splay"),
                                user=self.user[0], group=self.user[1], env=self.agent_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(pull)
        sampler.watch_process("pull", pull.pid)
        pull_out, pull_err = Lines(pull.stdout), Lines(pull.stderr)
        load = LoadClients(self.port, self.token, {k: tasks[k] for k in ("work", "pyjob")}, max_active=4)
        sampler.phase("load")
        load.start()
        pull_status, pull_rss = wait_rusage(pull, args.load_seconds + 60)
        pull_out.join()
        pull_err.join()
        # From now on this process sends requests too: 3 readers + 1 = the edge in-flight limit.
        phases: dict[str, Any] = {"load": load.phase("reads", clients=3)}
        self.report["phases"] = phases
        self.snapshot("load")
        lines = [json.loads(line) for line in pull_out.lines if line.startswith("{")]
        cycles = [line for line in lines if "event" not in line]  # record events and summaries aside
        self.report["pull"] = {"exit": pull_status, "maxrss_kib": pull_rss, "cycles": len(cycles),
                               "statuses": _count(c.get("status", "?") for c in cycles),
                               "stderr_tail": pull_err.lines[-5:], "cluster_requests": len(self.cluster.exchanges)}
        # Let the phase's Runs finish (the clients only read from now on).
        wait_until(lambda: not _active(self.database()), 30, interval=0.05)
        sampler.phase("bomb")
        if "pids" in self.agent.paths:
            phases["bomb"] = self.bomb(tasks["bomb"], load)
        else:
            # cgroup v2: the agent enables no controller for its per-Run cgroups, so a Run
            # has no pids cap of its own and a bomb would eat the whole envelope.
            phases["bomb"] = {"skipped": "per-Run pids cap needs the cgroup v1 pids hierarchy "
                                         "(qinglong_edge.process.cgroups enables no v2 controller)"}
        phases["bomb"]["clients"] = load.phase("reads", clients=3)
        self.snapshot("bomb")
        sampler.phase("shutdown")
        client = Client(self.port, self.token)
        sleepers = [load.start_task(client, "sleeper", tasks["sleeper"])[1]["runId"] for _ in range(2)]
        running = wait_until(lambda: all(self.run_status(client, r) == "running" for r in sleepers), 20, interval=0.05)
        client.close()
        phases["shutdown"] = {"runs_running_at_sigterm": len(sleepers) if running else 0}
        started = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        serve_status, serve_rss = wait_rusage(serve, 60)
        phases["shutdown"]["serve_exit_s"] = round(time.monotonic() - started, 2)
        phases["shutdown"]["clients"] = load.phase("reads", clients=3)
        load.stop()
        serve_err.join()
        self.snapshot("shutdown")
        self.report["serve"] = {"exit": serve_status, "maxrss_kib": serve_rss, "stderr_tail": serve_err.lines[-8:]}
        self.report["runs"] = self.outcomes(sleepers)
        self.report["integrity_check"] = self.integrity_check()
        agent = self.agent
        assert agent is not None
        wait_until(lambda: not agent.members(), 5)  # stragglers of the drain are reaped, or leaked
        self.report["leaked_processes"] = sorted(agent.members())
        self.report["leftover_cgroups"] = [d for d in self.agent.descendants() if d != "qinglong-edge"]

    def bomb(self, task: dict[str, Any], load: LoadClients) -> dict[str, Any]:
        """Start the fork bomb, let it hold its cap for 3 s while the readers run, cancel it."""
        assert self.agent is not None
        client = Client(self.port, self.token)
        status, body = load.start_task(client, "bomb", task)
        result: dict[str, Any] = {"start_status": status, "shell": BOMB_SHELL}
        run_id = body["runId"]
        parent = os.path.join(self.agent.pids, "qinglong-edge")

        def capped() -> str | None:
            with contextlib.suppress(OSError):
                for name in os.listdir(parent):
                    events = _read_text(os.path.join(parent, name, "pids.events"))
                    if events and int(events.split()[1]) > 0:
                        return os.path.join(parent, name)
            return None

        group = wait_until(capped, 30, interval=0.01)
        result["hit_cap"] = bool(group)
        peak_seen = 0
        at_cap, samples = 0, 0
        if group:
            result["run_pids_max"] = _read_text(os.path.join(group, "pids.max"))
            cap = _read_int(os.path.join(group, "pids.max")) or 0
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                current = _read_int(os.path.join(group, "pids.current")) or 0
                peak_seen = max(peak_seen, current)
                samples += 1
                at_cap += current >= cap
                time.sleep(0.01)  # the scenario: sample the cap every 10 ms for 3 s
            result["run_pids_peak_kernel"] = _read_int(os.path.join(group, "pids.peak"))
            result["run_fork_failures"] = int((_read_text(os.path.join(group, "pids.events")) or "max 0").split()[1])
        result["run_tasks_sampled_max"] = peak_seen
        result["samples_at_cap"] = f"{at_cap}/{samples}"
        started = time.monotonic()
        status, _ = client.call("POST", f"/api/v3/projects/default/runs/{run_id}/cancellation",
                                {"schema": "qinglong/run-cancellation@v1", "mutationId": "bomb-cancel"})
        result["cancel_status"] = status
        final = wait_until(lambda: self.run_status(client, run_id) in ("cancelled", "failed", "succeeded"), 30,
                           interval=0.05)
        result["run_status"] = self.run_status(client, run_id)
        result["stopped_in_s"] = round(time.monotonic() - started, 2)
        result["bomb_cgroup_gone"] = wait_until(lambda: not group or not os.path.isdir(group), 10, interval=0.05)
        result["terminal"] = bool(final)
        time.sleep(1.0)  # the scenario: the readers keep going for a second after the bomb
        client.close()
        return result

    def run_status(self, client: Client, run_id: str) -> str:
        status, body = client.call("GET", f"/api/v3/projects/default/runs/{run_id}")
        return str(body["run"]["status"]) if status == 200 else f"http {status}"

    def database(self) -> str:
        return os.path.join(self.root, "state", "local.db")

    def outcomes(self, sleepers: list[str]) -> dict[str, Any]:
        with contextlib.closing(sqlite3.connect(f"file:{self.database()}?mode=ro", uri=True)) as conn:
            rows = conn.execute('SELECT task_id, status, cancel_reason, id FROM "Runs"').fetchall()
        by_task: dict[str, dict[str, int]] = {}
        for task_id, status, reason, _ in rows:
            key = status if reason is None else f"{status}/{reason}"
            by_task.setdefault(task_id, {}).setdefault(key, 0)
            by_task[task_id][key] += 1
        return {"total": len(rows), "by_task": by_task,
                "sleepers": [f"{s}/{r}" for t, s, r, i in rows if i in sleepers]}

    def integrity_check(self) -> str:
        with contextlib.closing(sqlite3.connect(f"file:{self.database()}?mode=ro", uri=True)) as conn:
            return "; ".join(str(row[0]) for row in conn.execute("PRAGMA integrity_check").fetchall())

    def cleanup(self) -> None:
        if self.reaper is not None:
            self.reaper.stop()
            self.report["orphans_reaped"] = self.reaper.reaped
        for proc in self.procs:
            if proc.returncode is None and proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        if self.cluster is not None:
            self.cluster.stop()
        if self.envelope is not None:
            self.report["envelope_left"] = self.envelope.remove()


def _active(database: str) -> bool:
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as conn:
        return bool(conn.execute('SELECT count(*) FROM "Runs" WHERE status IN'
                                 " ('created', 'queued', 'dispatching', 'running')").fetchone()[0])


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path)
    return int(text) if text and text.isdigit() else None


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def unshare_reason() -> str:
    """Empty if ``unshare --mount --net`` works here, else why not."""
    try:
        proc = subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True, text=True,
                              check=False, timeout=30)
    except OSError as exc:
        return f"unshare is not available ({exc.strerror})"
    return "" if proc.returncode == 0 else f"unshare --mount --net failed: {proc.stderr.strip()[:200]}"


def launch(backend: str, agent_python: str, *, load_seconds: float = 15.0,
           timeout: float = 240.0) -> tuple[dict[str, Any], str]:
    """Run the driver from outside (tests, benchmarks): in fresh namespaces when
    ``unshare`` allows, in a new ``/tmp/qinglong-envelope-*`` directory that is removed
    afterwards, and remove the envelope's cgroups if the driver could not.

    Returns:
        (the report, the driver's stderr).
    """
    import tempfile
    import uuid

    from tests.support.envelope_isolation import namespaces

    name = f"qinglong-envelope-{uuid.uuid4().hex}"
    root = tempfile.mkdtemp(prefix="qinglong-envelope-", dir="/tmp")
    os.chmod(root, 0o755)  # noqa: S103 -- the agent user must reach the state below it
    reason = unshare_reason()
    argv = [sys.executable, "-m", "tests.support.envelope_driver", "--root", root, "--backend", backend,
            "--name", name, "--python", agent_python, "--load-seconds", str(load_seconds),
            "--outer-namespaces", json.dumps(namespaces())]
    argv = ["unshare", "--mount", "--net", "--", *argv, "--isolated"] if not reason else [
        *argv, "--no-isolation-reason", reason]
    env = {key: value for key, value in os.environ.items() if not key.startswith("QINGLONG_EDGE")}
    env["PYTHONPATH"] = str(REPO)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout, cwd=REPO,
                              env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        report: dict[str, Any] = json.loads(lines[-1]) if lines else {
            "error": f"the driver printed no report (exit {proc.returncode})"}
        return report, proc.stderr
    finally:
        left = Envelope.attach(backend, name)
        if left.paths:
            left.remove()
        if reason:  # a plain directory holds the state and a copy of the package
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.rmdir(root)  # the tmpfs went away with the namespace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.envelope_driver", description=__doc__)
    parser.add_argument("--root", required=True, help="an empty directory other users can traverse to")
    parser.add_argument("--backend", choices=("v1", "v2"), required=True)
    parser.add_argument("--name", help="the envelope's cgroup name (default: a new one)")
    parser.add_argument("--python", required=True, help="an interpreter the agent user may run")
    parser.add_argument("--isolated", action="store_true", help="we run in fresh mount+net namespaces")
    parser.add_argument("--no-isolation-reason", default="")
    parser.add_argument("--outer-namespaces", default="", help="JSON {mnt, net} of the caller's namespaces")
    parser.add_argument("--uid", type=int, default=65534)
    parser.add_argument("--gid", type=int, default=65534)
    parser.add_argument("--memory-mib", type=int, default=128)
    parser.add_argument("--pids", type=int, default=64)
    parser.add_argument("--load-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    scenario = Scenario(args)
    status = 0
    try:
        scenario.run()
    except Exception as exc:  # the report says what failed; the test shows it
        scenario.report["error"] = f"{type(exc).__name__}: {exc}"
        scenario.report["traceback"] = traceback.format_exc()[-3000:]
        status = 1
    finally:
        try:
            scenario.cleanup()
        except Exception as exc:
            scenario.report["cleanup_error"] = f"{type(exc).__name__}: {exc}"
            status = 1
    sys.stdout.write(json.dumps(scenario.report, default=str) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
