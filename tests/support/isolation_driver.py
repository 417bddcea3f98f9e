"""Run one isolated job as the user who runs this script, and report what the job saw.

``python -I isolation_driver.py LIB ROOT`` (LIB: a directory holding ``qinglong_edge``;
ROOT: an existing directory owned by this user). Prints one JSON object:

* ``probe``: :func:`probe_isolation` (``available``, ``via``, ``reason``); when it is not
  available nothing else is run;
* ``code``: the wrapper's exit status; ``seen``: one ``key value`` per line the job
  printed (see ``JOB``); ``written``: whether the job's write landed in the real cwd;
  ``receipt``: the receipt the wrapper published inside a hidden directory;
  ``agent_pid``: this process (the job tried its ``/proc/<pid>/root`` and ``environ``).

Layout under ROOT: ``state/`` (hidden) with ``state/journal/offer.json`` (a secret),
``state/jobs/a-1/`` (the job's cwd: kept), ``state/logs/`` and ``state/receipts/`` (written
by the wrapper from outside the namespace); ``etc/worker.key`` (a hidden file) beside
``etc/cluster-ca.pem`` (not hidden).
"""

from __future__ import annotations

import json
import os
import sys

JOB = r"""
echo "uid $(id -u)"
if cat "$ROOT/state/journal/offer.json" >/dev/null 2>&1; then echo "journal readable"; else echo "journal hidden"; fi
echo "state_listing $(ls -A "$ROOT/state" | tr '\n' ,)"
echo "key_bytes $(wc -c < "$ROOT/etc/worker.key")"
echo "anchor $(cat "$ROOT/etc/cluster-ca.pem")"
if cat "/proc/$AGENT/root$ROOT/state/journal/offer.json" >/dev/null 2>&1; then echo "via_proc readable"; else echo "via_proc denied"; fi
if cat "/proc/$AGENT/environ" >/dev/null 2>&1; then echo "agent_environ readable"; else echo "agent_environ denied"; fi
echo hello > written.txt && echo "cwd writable"
if umount "$ROOT/state" 2>/dev/null; then echo "umount succeeded"; else echo "umount refused"; fi
if touch "$ROOT/state/new" 2>/dev/null; then echo "cover writable"; else echo "cover read-only"; fi
echo "pwd $(pwd)"
"""


def main() -> int:
    lib, root = sys.argv[1], sys.argv[2]
    sys.path.insert(0, lib)
    from qinglong_edge.process.isolation import probe_isolation
    from qinglong_edge.process.logs import read_receipt
    from qinglong_edge.process.spawn import Isolation, JobSpec, Publication, start_job

    probe = probe_isolation(root)
    report: dict[str, object] = {"probe": {"available": probe.available, "via": probe.via, "reason": probe.reason}}
    if not probe.available:
        print(json.dumps(report))
        return 0
    state, etc = os.path.join(root, "state"), os.path.join(root, "etc")
    cwd = os.path.join(state, "jobs", "a-1")
    for path in (os.path.join(state, "journal"), cwd, etc):
        os.makedirs(path, 0o700, exist_ok=True)
    with open(os.path.join(state, "journal", "offer.json"), "w") as handle:
        handle.write('{"secret":"journal"}')
    with open(os.path.join(etc, "worker.key"), "w") as handle:
        handle.write("PRIVATE KEY")
    with open(os.path.join(etc, "cluster-ca.pem"), "w") as handle:
        handle.write("public-anchor")
    receipt = os.path.join(state, "receipts", "a-1.json")
    spec = JobSpec(
        ["/bin/sh", "-c", JOB], {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "ROOT": root, "AGENT": str(os.getpid())},
        cwd, os.path.join(state, "logs", "a-1.log"), 65536,
        receipt=Publication(receipt, b'{"startedAtMs":1'), started_at_ms=1,
        isolation=Isolation(hide=[state, os.path.join(etc, "worker.key")]),
    )
    job = start_job(spec)
    job.release()
    report["code"] = job.process.wait(30)
    report["agent_pid"] = os.getpid()
    with open(os.path.join(state, "logs", "a-1.log"), encoding="utf-8") as handle:
        report["seen"] = dict(line.split(" ", 1) for line in handle.read().splitlines() if " " in line)
    report["written"] = os.path.exists(os.path.join(cwd, "written.txt"))
    raw = read_receipt(receipt)
    report["receipt"] = raw.decode() if raw is not None else None
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
