"""Sections 5-8 of the demo: the Local API, start and cancel a Run, restart, stop."""

from __future__ import annotations

import json
import shlex
import sys
import uuid

from context import PROJECT, REPO, TASK, DemoBase, free_port
from shell import DemoError, alive


class LocalSteps(DemoBase):
    """The Local run API half (ADR-0372)."""

    # -- 5. the Local API ----------------------------------------------------------------------

    def setup_local(self) -> None:
        c = self.console
        c.section(5, "Set up the Local run API (ADR-0372)", """
            The same agent serves QingLong's Local /api/v3 run API on loopback: Runs live in
            SQLite, callers authenticate with ql3c Bearer credentials (only an HMAC digest
            with a pepper from a 0700 keyring is stored), and role bindings decide who may
            start or stop a Run. `admin` commands provision it.""")
        self.api_port = free_port()
        # the status console and /metrics are off by default; the demo shows them
        self.config["localApi"] = {"listener": {"host": "127.0.0.1", "port": self.api_port}, "console": True,
                                   "metrics": True}
        self.config["execution"] = {"terminateGraceMs": 3000, "killGraceMs": 1000}
        self.write_config("added the localApi and execution sections")
        self.qle("admin init")
        self.qle(f"admin project create --id {PROJECT} --name 'Demo project'")
        for subject, role in (("alice", "operator"), ("victor", "viewer")):
            self.qle(f"admin subject create --type user --id {subject}")
            self.qle(f"admin role grant --project {PROJECT} --subject-type user --subject-id {subject} --role {role}")
        for variable, subject in (("OPERATOR_TOKEN", "alice"), ("VIEWER_TOKEN", "victor")):
            inner = (f"python3 -m qinglong_edge admin credential issue --id {subject}-cli --subject-type user "
                     f"--subject-id {subject}")
            c.command(f"{variable}=$({inner})")
            issued = self.shell.run(inner, show=False)
            token = issued.stdout.strip()
            if not token.startswith(f"ql3c_{subject}-cli_"):
                raise DemoError("credential issue printed no token")
            self.shell.env[variable] = token
            c.output(issued.stderr)
            c.result(f"the token is in ${variable} (ql3c_{subject}-cli_..., not shown again)")
        job = REPO / "demo" / "progress_job.py"
        created = self.qle(
            f"admin task create --project {PROJECT} --id {TASK} --name 'Progress job' --argv "
            f"{shlex.quote(sys.executable)} -u {shlex.quote(str(job))} --interval 0.2 "
            f"--pid-file {shlex.quote(str(self.pidfile))}")
        if "revision 1" not in created.stdout:
            raise DemoError("task create did not report revision 1")
        listed = self.qle(f"admin task list --project {PROJECT} --json", quiet=True)
        self.task = json.loads(listed.stdout)["tasks"][0]
        c.result(f"task.start will need expectedRevision {self.task['revision']} and "
                 f"expectedContentDigest {self.task['contentDigest'][:16]}... (both printed above)")
        self.start_serve(1)

    def start_serve(self, number: int) -> None:
        log = self.logs / f"serve-{number}.log"
        self.serve_proc = self.shell.start("serve", f"python3 -m qinglong_edge serve 2>{self.rel(log)}")

        def ready() -> bool:
            if self.serve_proc.poll() is not None:
                raise DemoError(f"serve exited ({self.serve_proc.returncode}); see {self.rel(log)}")
            return log.exists() and "serving the Local API" in log.read_text()

        self.shell.wait_for(ready, 20, "serve to listen")
        self.console.output(log.read_text())
        self.console.result(f"serve: pid {self.serve_proc.pid}, http://127.0.0.1:{self.api_port}")
        self.console.result(f"status console: http://127.0.0.1:{self.api_port}/ (a browser on this machine; "
                            "sign in with $OPERATOR_TOKEN); Prometheus: "
                            f"http://127.0.0.1:{self.api_port}/metrics")

    # -- 6. start and cancel ---------------------------------------------------------------------

    def start_and_cancel(self) -> None:
        c = self.console
        c.section(6, "Start a Run over HTTP, then cancel it", """
            task.start queues a Run of the task's current revision (the caller states which
            revision and content digest it expects, so it never starts a definition it has
            not seen); the execution controller launches it.""")
        _, _, started = self.api("POST", f"/tasks/{TASK}/runs", "OPERATOR_TOKEN", {
            "schema": "qinglong/task-start@v1",
            "mutationId": str(uuid.uuid4()),
            "expectedRevision": self.task["revision"],
            "expectedContentDigest": self.task["contentDigest"],
        }, expect=202, brief=lambda d: f"status {d['status']}, runId {d['runId']}, runStatus {d['runStatus']}")
        self.run_id = started["runId"]
        self.shell.wait_for(lambda: self.run_status() == "running", 20, "the Run to be running", 0.1)
        pid = int(self.shell.wait_for(
            lambda: self.pidfile.read_text().strip() if self.pidfile.exists() else None, 10, "the job's pid file"))
        self.shell.watched_groups.append(("the Run's job", pid))
        logs = self.state / "logs"
        self.shell.wait_for(lambda: any("progress 3/" in p.read_text() for p in logs.glob("*.log")), 10,
                            "the job's progress")
        self.api("GET", f"/runs/{self.run_id}", "OPERATOR_TOKEN", expect=200, brief=lambda d: (
            f"run.status {d['run']['status']}, version {d['run']['version']}, "
            f"latestAttempt.status {d['run']['latestAttempt']['status']}"))
        log_glob = f"{self.rel(logs)}/*.log"
        self.shell.run(f"tail -n 2 {log_glob}")
        self.shell.run(f"kill -0 {pid} && echo 'pid {pid} is running'")

        c.prose("""The viewer may read Runs but not stop them. The answer is decided from the
            request head alone: route, then the Bearer credential, then the project policy,
            then a durable audit row, and only an allowed request gets its body read. So the
            403 comes with `connection: close` and the body never reaches the JSON parser.""")
        cancel = {"schema": "qinglong/run-cancellation@v1", "mutationId": "cancel-1"}
        self.api("POST", f"/runs/{self.run_id}/cancellation", "VIEWER_TOKEN", cancel, expect=403,
                 show_headers=("connection",))
        self.shell.run(f"kill -0 {pid} && echo 'pid {pid} is still running'")

        c.prose("""The operator's cancellation is a durable intent: in one SQLite transaction
            (BEGIN IMMEDIATE) the policy fence is checked again and the intent and a
            run.cancel_requested event are written; 202 means it is on disk. The HTTP handler
            never signals a process: the execution controller does, from that row.""")
        self.api("POST", f"/runs/{self.run_id}/cancellation", "OPERATOR_TOKEN", cancel, expect=202)
        c.prose("""The same request again (say the 202 was lost on the way) is answered 200 from
            what is stored: no second intent, no second event.""")
        self.api("POST", f"/runs/{self.run_id}/cancellation", "OPERATOR_TOKEN", cancel, expect=200,
                 brief=lambda d: f"status {d['status']}, runStatus {d['runStatus']}, "
                                 f"cancelReason {d.get('cancelReason')}")
        self.shell.wait_for(lambda: self.run_status() == "cancelled", 20, "the Run to be cancelled", 0.1)
        c.prose("""The controller re-checked the process identity (boot id, pid, start time,
            process group), sent SIGTERM to the whole group, waited for it to go (SIGKILL and
            the Run's cgroup would follow a grace period), verified it was gone, and only
            then recorded the Run as cancelled.""")
        self.shell.run(f"kill -0 {pid}", expect=(1,))
        if alive(pid):
            raise DemoError(f"pid {pid} is still alive after the Run was cancelled")
        self.shell.run(f"tail -n 2 {log_glob}")
        self.api("GET", f"/runs/{self.run_id}", "OPERATOR_TOKEN", expect=200, brief=lambda d: (
            f"run.status {d['run']['status']}, version {d['run']['version']}, "
            f"latestAttempt.status {d['run']['latestAttempt']['status']}"))
        self.api("GET", f"/runs/{self.run_id}/events", "OPERATOR_TOKEN", expect=200,
                 brief=lambda d: "events: " + ", ".join(e["type"] for e in d["events"]))
        c.result(f"pid {pid} is gone and the Run is cancelled")

    # -- 7. restart ------------------------------------------------------------------------------

    def restart(self) -> None:
        c = self.console
        c.section(7, "Restart serve", """
            Everything above is on disk: stopping serve (SIGTERM drains in-flight requests)
            and starting it again changes nothing about the Run.""")
        pid = self.serve_proc.pid
        self.shell.run(f"kill -TERM {pid}")
        status = self.shell.stop("serve", self.serve_proc, signalled=True)
        c.output((self.logs / "serve-1.log").read_text())
        c.result(f"serve (pid {pid}) exited with status {status}")
        if status != 0:
            raise DemoError(f"serve exited {status} after SIGTERM")
        self.start_serve(2)
        _, _, document = self.api("GET", f"/runs/{self.run_id}", "OPERATOR_TOKEN", expect=200,
                                  brief=lambda d: f"run.status {d['run']['status']}")
        if document["run"]["status"] != "cancelled":
            raise DemoError("the Run is not cancelled after the restart")
        c.result("still cancelled after the restart")

    # -- 8. stop ---------------------------------------------------------------------------------

    def finish(self) -> None:
        c = self.console
        c.section(8, "Stop everything", "The demo stops what it started and checks nothing is left running.")
        pids = []
        for name, proc in (("serve", self.serve_proc), ("cluster", self.cluster_proc)):
            pids.append(proc.pid)
            self.shell.run(f"kill -TERM {proc.pid}")
            status = self.shell.stop(name, proc, signalled=True)
            if status != 0:
                raise DemoError(f"{name} exited {status} after SIGTERM")
        left = [pid for pid in pids if alive(pid)]
        if left:
            raise DemoError(f"processes still running: {left}")
        c.result(f"stopped serve and the cluster (pids {', '.join(map(str, pids))}); no process left")
