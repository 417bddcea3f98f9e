"""Sections 0-4 of the demo: preflight, PKI, the cluster, the worker device, pull."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

from context import WORKER_ID, DemoBase, iso_time
from pki import make_pki
from shell import DemoError


class WorkerSteps(DemoBase):
    """The Remote Worker half (ADR-0110)."""

    # -- 0. before we start ------------------------------------------------------------------

    def welcome(self) -> None:
        self.console.banner("qinglong-edge demo: the whole mission on this machine", [
            "A QingLong 3.0 Remote Worker pulls offers from a cluster without losing or duplicating",
            "one, then the Local run API starts a job and a cancellation really stops it.",
            f"State: ./{self.show_root}/ (made fresh; kept afterwards so you can look at it).",
        ])

    def prepare(self) -> None:
        c = self.console
        interpreter = sys.executable
        version = ".".join(map(str, sys.version_info[:3]))
        c.section(0, "Before we start", """
            The agent needs only Python >= 3.11 (standard library) and runs here straight from
            this source tree: nothing is installed. Commands are shown as you would type them
            in the repository root; `python3` below is this demo's interpreter.""")
        if shutil.which("openssl") is None:
            raise DemoError("the openssl command is needed for the throwaway PKI: install openssl")
        python3 = shutil.which("python3", path=self.shell.env.get("PATH"))
        if python3 is None or os.path.realpath(python3) != os.path.realpath(interpreter):
            bindir = self.root / "bin"
            bindir.mkdir(mode=0o700, exist_ok=True)
            (bindir / "python3").symlink_to(interpreter)
            self.shell.env["PATH"] = f"{bindir}{os.pathsep}{self.shell.env.get('PATH', '')}"
            c.info(f"`python3` is {interpreter} (Python {version}), via {self.rel(bindir)}/python3 on PATH")
        else:
            c.info(f"`python3` is {python3} (Python {version})")
        c.command("export PYTHONPATH=$PWD")
        self.shell.run("openssl version")
        if shutil.which("curl", path=self.shell.env.get("PATH")) is None:
            self.curl = "python3 demo/minicurl.py"
            c.result("curl is not installed: the HTTP calls below use demo/minicurl.py, a tiny stand-in "
                     "that takes the same options")
        else:
            self.shell.run("curl --version | head -n 1")

    # -- 1. PKI -----------------------------------------------------------------------------------

    def make_pki(self) -> None:
        c = self.console
        c.section(1, "A throwaway PKI", """
            The worker talks to its cluster only over TLS 1.3 with mutual TLS: it checks the
            cluster's certificate against the CA it was given, and shows a client certificate
            the cluster's client CA issued. Here both CAs are made on the spot (EC P-256 keys,
            valid 30 days) with the openssl CLI.""")
        self.shell.run(f"mkdir -m 0700 {self.rel(self.pki)}")
        c.command(f"cd {self.rel(self.pki)}")

        def run(argv: Any) -> None:
            line = shlex.join(argv)
            c.command(line)
            proc = subprocess.run(argv, cwd=self.pki, capture_output=True, check=False, timeout=60)
            if proc.returncode != 0:
                c.output(proc.stderr.decode("utf-8", "replace"))
                raise DemoError(f"`{line}` failed ({proc.returncode})")

        def wrote(path: pathlib.Path) -> None:
            c.info(f"wrote {path.name}: the certificate extensions (CA; serverAuth with subjectAltName "
                   "DNS:localhost, IP:127.0.0.1; clientAuth)")

        make_pki(self.pki, WORKER_ID, run, wrote)
        c.command("cd -")
        c.result("cluster-ca.pem + server.pem (localhost, 127.0.0.1); client-ca.pem + worker.pem "
                 f"(CN={WORKER_ID}); private keys 0600")

    # -- 2. the cluster ------------------------------------------------------------------------

    def start_cluster(self) -> None:
        c = self.console
        c.section(2, "The cluster", f"""
            In production this is a QingLong 3.0 cluster. Here it is the test suite's cluster
            double, in its own process: the same worker-ingress routes (register, heartbeat,
            offers) over TLS 1.3, requiring a client certificate from client-ca. Two tasks are
            queued for worker {WORKER_ID}: a shell task and a Python task that prints its
            progress. It also issues the worker's ql3w credential into a 0600 file; the
            cluster keeps only its HMAC digest.""")
        out = self.logs / "cluster.out"
        self.cluster_proc = self.shell.start("cluster", (
            f"python3 demo/cluster.py --pki {self.rel(self.pki)} --state-dir {self.rel(self.cluster_dir)} "
            f">{self.rel(out)} 2>{self.rel(self.logs / 'cluster.log')}"))

        def ready() -> dict[str, Any] | None:
            if self.cluster_proc.poll() is not None:
                raise DemoError(f"the cluster exited ({self.cluster_proc.returncode}); see {self.rel(self.logs)}/")
            text = out.read_text() if out.exists() else ""
            return json.loads(text.splitlines()[0]) if text.endswith("\n") else None

        info = self.shell.wait_for(ready, 20, "the cluster to listen")
        self.cluster_pid = int(info["pid"])
        self.origin = str(info["origin"])
        self.issued = pathlib.Path(info["credentialFile"])
        c.result(f"cluster double: pid {self.cluster_pid}, listening on {self.origin}; "
                 f"queued: {', '.join(info['tasks'])}")

    # -- 3. the worker device ------------------------------------------------------------------

    def provision_worker(self) -> None:
        c = self.console
        c.section(3, "Provision the worker device", """
            What an operator puts on the router: the ql3w credential, the client certificate
            and key (private: 0600 files in a 0700 directory, or the agent refuses them), the
            cluster's CA as trust anchor, and one JSON config file (schema
            qinglong/edge-agent@v1; unknown keys are rejected, every limit is range-checked).""")
        r = self.rel
        self.shell.run(f"install -d -m 0700 {r(self.agent)} {r(self.private)} {r(self.state)} {r(self.agent / 'run')}")
        self.shell.run(f"install -d -m 0755 {r(self.anchors)}")
        self.shell.run(f"install -m 0600 {r(self.issued)} {r(self.private / 'credential')}")
        self.shell.run(f"install -m 0600 {r(self.pki / 'worker.pem')} {r(self.private / 'client.pem')}")
        self.shell.run(f"install -m 0600 {r(self.pki / 'worker.key')} {r(self.private / 'client.key')}")
        self.shell.run(f"install -m 0644 {r(self.pki / 'cluster-ca.pem')} {r(self.anchors / 'cluster-ca.pem')}")
        self.config = {
            "schema": "qinglong/edge-agent@v1",
            "profile": "edge",
            "stateDirectory": str(self.state),
            "worker": {
                "origin": self.origin,
                "workerId": WORKER_ID,
                "credentialFile": str(self.private / "credential"),
                "certificateFile": str(self.private / "client.pem"),
                "privateKeyFile": str(self.private / "client.key"),
                "trustAnchorFiles": [str(self.anchors / "cluster-ca.pem")],
                # On a router this is a RAM directory (/var/run/qinglong-edge): the session
                # record an idle pull keeps there, so idle cycles never write to flash.
                "runtimeDirectory": str(self.agent / "run"),
            },
        }
        self.write_config("the worker section (the runtime directory stands in for the router's RAM one); "
                          "every other key keeps its default")
        c.command(f"export QINGLONG_EDGE_CONFIG=$PWD/{r(self.config_path)}")
        self.shell.env["QINGLONG_EDGE_CONFIG"] = str(self.config_path)
        c.prose("`doctor` runs real probes where the agent will write (links, O_EXCL, fsync, "
                "flock, modes) and checks the credential files:")
        self.qle("doctor", limit=30)

    # -- 4. pull and execute ----------------------------------------------------------------

    def _executions(self) -> dict[str, Any]:
        executions: dict[str, Any] = self.cluster_state().get("executions", {})
        return executions

    def pull_offers(self) -> None:
        c = self.console
        c.section(4, "Pull offers from the cluster and execute them (ADR-0110)", """
            `qinglong-edge pull` is what cron runs every minute: keep the Worker Session alive,
            then pull one offer. Before it asks, it writes its claim (offer id + lease token)
            to the journal and fsyncs it; the offer goes into the inbox (link + fsync) before
            the claim is cleared. So whatever is lost on the way, the next cycle asks again
            with the same claim and the cluster answers with the same lease. Then the same
            process runs what it accepted: it tells the cluster the Run is starting, starts
            the command under its job wrapper (after recording who owns it), says it is
            running, keeps its lease renewed, uploads its output and reports its exit code;
            it exits once nothing is left to do. (--no-splay: from cron, a cycle first waits
            for this device's phase in the minute, so a fleet spreads out.)""")
        first = self.qle("pull --no-splay", limit=20)
        if "accepted offer" not in first.stdout or "(new_claim)" not in first.stdout:
            raise DemoError("the first cycle did not accept an offer")
        if "completion acknowledged" not in first.stdout:
            raise DemoError("the first offer was not executed to its completion")
        executions = self._executions()
        shell_run = next((view for view in executions.values() if view.get("completion")), None)
        if shell_run is None or shell_run["artifact"] is None:
            raise DemoError(f"the cluster has no completed run with its log: {list(executions)}")
        artifact = self.cluster_dir / "artifacts" / f"{shell_run['artifact']['logArtifactId']}.log"
        c.info(f"the cluster's side: the log it stored ({self.rel(artifact)}) and the completion it applied:")
        self.shell.run(f"head -n 5 {self.rel(artifact)}")
        completion = shell_run["completion"]
        c.output(f"run {shell_run['runId']}: {completion['status']}, "
                 f"exit code {completion['result']['exitCode']}, {shell_run['artifact']['byteLength']} log bytes "
                 f"(sha256 {shell_run['artifact']['sha256'][:16]}...)")
        if completion["status"] != "succeeded":
            raise DemoError(f"the shell task's completion is {completion['status']}")
        c.result("the shell task ran on the device once: its output was uploaded and the cluster applied its "
                 "completion (succeeded); the device deleted its log and receipt after the acknowledgement")

        c.prose("Now the cluster will commit the next claim and then drop the connection "
                "before answering: the worker never hears that the lease is its own.")
        self.shell.run(f"kill -USR1 {self.cluster_pid}")
        self.shell.wait_for(lambda: "fault armed" in (self.logs / "cluster.log").read_text(), 5,
                            "the cluster to arm the fault")
        lost = self.qle("pull --no-splay", expect=(75,))
        if "claim" not in lost.stdout or "kept" not in lost.stdout:
            raise DemoError("the cycle with the lost response did not keep its claim")
        claim = self.claim()
        if claim is None:
            raise DemoError("no pending claim in the journal after the lost response")
        c.result("exit 75 (temporary failure; connection_closed is the transport's reason for \"the answer "
                 "was cut off\", and it may have reached the cluster): the claim is kept, nothing is lost")
        if "connection_closed" not in lost.stdout:
            raise DemoError("the cycle with the lost response did not name the connection_closed reason")
        c.info(f"the journal's pending claim ({self.rel(self.state / 'worker' / 'pending-claim.json')}, "
               "read by the demo; the lease token is a capability, so not shown):")
        c.output(f"offerId {claim['offerId']}  attemptCount {claim['attemptCount']}  "
                 f"workerGeneration {claim['workerGeneration']}  nextAttemptAtMs {claim['nextAttemptAtMs']} "
                 f"({iso_time(claim['nextAttemptAtMs'])})  leaseToken [redacted]")
        leases = self.cluster_state().get("leases", {})
        c.info(f"the cluster's side ({self.rel(self.cluster_dir / 'cluster-state.json')}): "
               f"{len(leases)} leases committed, one of them is this claim's: "
               f"{'yes' if claim['offerId'] in leases else 'NO'}")

        delay = claim["nextAttemptAtMs"] / 1000 - time.time()
        if delay > 0:
            c.info(f"waiting {delay:.1f} s for the claim's backoff (an earlier cycle would do no network I/O)")
            time.sleep(delay + 0.05)
        c.prose("The next cycle replays the claim and gets the same lease back. Its offer is the Python task "
                "that prints its progress once a second for 30 s, so this pull stays (resident) while it runs: "
                "it runs in the background here, its lines going to a log.")
        out = self.logs / "pull-resident.out"
        resident = self.shell.start("pull", f"python3 -m qinglong_edge pull --no-splay >{self.rel(out)} 2>&1")

        def text() -> str:
            return out.read_text() if out.exists() else ""

        started = self.shell.wait_for(lambda: re.search(r"started \(pid (\d+)", text()), 20,
                                      "the resident pull to start the Python task")
        self.shell.watched_groups.append(("remote job", int(started.group(1))))  # its wrapper leads its group
        if "(lease_recovery)" not in text() or claim["offerId"] not in text():
            raise DemoError("the replay did not come back as lease_recovery for the same offer")
        requests = [r for r in self.cluster_state().get("offerRequests", []) if r["offerId"] == claim["offerId"]]
        same = len(requests) == 2 and requests[0]["bodySha256"] == requests[1]["bodySha256"]
        c.result(f"replayed: the same offer id, a byte-identical request body "
                 f"(sha256 {requests[-1]['bodySha256'][:16]}... {'twice' if same else 'DIFFERS'}), "
                 "answered lease_recovery, and the job started")
        if not same:
            raise DemoError("the replayed request body differs from the lost one")
        logs = self.state / "logs" / "remote"
        self.shell.wait_for(lambda: any("progress 2/30" in p.read_text(errors="replace")
                                        for p in logs.rglob("*.log")), 20, "the job's progress in its log")
        self.qle("inbox list")
        c.prose("A cluster operator cancels that Run. The cluster says so in its answer to the device's next "
                "lease renewal (every third of the lease: 2 s with this cluster's 6 s leases); the device "
                "stops the job (SIGTERM, verified) and reports it.")
        self.shell.run(f"python3 -m tests.support.cluster_admin --state-dir {self.rel(self.cluster_dir)} cancel")
        status = self.shell.wait_for(lambda: resident.poll() is not None and (resident.returncode,), 30,
                                     "the resident pull to finish")[0]
        self.shell.forget(resident)
        c.command(f"head -n 20 {self.rel(out)}")
        c.output(text(), 20)
        if status != 0 or "stop requested (reason user)" not in text() or "completion acknowledged" not in text():
            raise DemoError(f"the resident pull did not stop the cancelled job and report it (exit {status})")
        cancelled = [view for view in self._executions().values()
                     if (view.get("completion") or {}).get("status") == "cancelled"]
        if len(cancelled) != 1 or cancelled[0]["completion"]["result"]["exitCode"] != 143:
            raise DemoError("the cluster did not apply the cancelled job's completion")
        c.result("the cluster's cancel stopped the job on the device: exit code 143 (SIGTERM) reported, the "
                 "Run cancelled on the cluster; the resident pull exited 0")

        idle = self.qle("pull --no-splay")
        if "idle (no_candidates)" not in idle.stdout:
            raise DemoError("the last cycle was not idle")
        listing = self.qle("inbox list")
        inbox_ids = [line.split()[0] for line in listing.stdout.splitlines()[1:]
                     if line.strip() and not line.startswith("inbox:")]  # the last line: what fills it
        state = self.cluster_state()
        leases = state.get("leases", {})
        if sorted(inbox_ids) != sorted(leases) or len(inbox_ids) != 2:
            raise DemoError(f"inbox {inbox_ids} does not match the cluster's leases {list(leases)}")
        kept = self.claim()
        if kept is None or kept["offerId"] in leases or kept["attemptCount"] != 0:
            raise DemoError("the idle cycle did not keep its claim as it was")
        shown = self.qle(f"inbox show {claim['offerId']} --json", quiet=True)
        record = json.loads(shown.stdout)["record"]
        offer = record["offer"]
        command = offer["executionRevision"]["command"]
        c.output(f"{offer['candidate']['taskId']}: deliveryKind {offer['deliveryKind']}, state {record['state']}, "
                 f"leaseToken {offer['leaseToken']}, command {command['file']} {' '.join(command['args'][:2])} ...")
        c.result(f"2 leases on the cluster, 2 offers in the inbox (each run once: one succeeded, one cancelled), "
                 f"and the idle cycle's claim kept for the next cycle (no lease on the cluster, nothing "
                 f"rewritten on disk): nothing lost, nothing duplicated ({state.get('requests')} requests in all)")
