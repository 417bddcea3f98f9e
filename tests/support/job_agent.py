"""A stand-in agent that can really be SIGKILLed while its job runs.

``python -m tests.support.job_agent SPEC.json`` becomes a child subreaper (``prctl``
through ctypes: test code), forks the *agent*, which starts the job of SPEC.json under
the job wrapper (:func:`qinglong_edge.process.spawn.start_job`), releases it, prints
``agent <pid>`` and ``wrapper <pid>`` and then sleeps until it is killed. When the agent
dies the wrapper is orphaned and re-parented to us (the subreaper), so its exit status
stays observable: we print ``exit <pid> <code>`` for every child we reap, then
``done`` once no child is left.

SPEC.json: ``{"argv": [...], "env": {...}, "cwd": ..., "log": ..., "cap": N,
"receipt": PATH, "prefix": TEXT, "started": MS}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _agent(spec: dict[str, object]) -> None:
    from qinglong_edge.process.spawn import JobSpec, Publication, start_job

    job = start_job(JobSpec(
        spec["argv"], spec["env"], spec["cwd"], spec["log"], spec["cap"],  # type: ignore[arg-type]
        receipt=Publication(str(spec["receipt"]), str(spec["prefix"]).encode()),
        started_at_ms=spec["started"],  # type: ignore[arg-type]
    ))
    job.release()
    print(f"agent {os.getpid()}", flush=True)
    print(f"wrapper {job.pid}", flush=True)
    while True:
        time.sleep(60)  # the scenario: the agent idles until the test kills it


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("error prctl", flush=True)
        return 1
    pid = os.fork()
    if pid == 0:
        try:
            _agent(spec)
        finally:
            os._exit(1)
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:
            break
        print(f"exit {child} {os.waitstatus_to_exitcode(status)}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
