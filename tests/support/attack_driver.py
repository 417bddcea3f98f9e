"""The agent's side of the attack matrix: one hostile job of one kind, and what it did.

``python -I attack_driver.py LIB ROOT KIND`` as an unprivileged user, started inside a
cgroup delegated to it (``tests/test_attack_matrix.py`` does both), with LIB a directory
holding ``qinglong_edge`` and ``attack_job.py`` and ROOT an empty directory of this user.
KIND is ``remote-isolated`` (the isolation the probe finds here, at its PID level),
``remote-unisolated`` (the same launch with isolation off, as on a device where it cannot
work) or ``local`` (a Local Run, as the execution controller starts one).

It lays out a device below ROOT the way an installation does (every path the agent reads
back: docs/worker/remote.md, "What the agent reads back"), loads its configuration, and
launches :mod:`tests.support.attack_job` through the real code: remote jobs with
:func:`qinglong_edge.worker.remote.job.launch` (the limits, hidden and read-only paths,
cgroup and memory leaf of :func:`~qinglong_edge.worker.remote.job_files.remote_limits`), the
Local Run with the Local launcher's spec. Prints one JSON object: ``kind``, ``level``
(the probe's), ``cells`` (``[cell, path key or null, result, detail]``; a read's
``read`` becomes ``hidden`` when it did not find the real content), ``changed`` (path
keys whose content changed during the job), ``exit_code`` and ``reason`` (the outcome's).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import cast

TYPE_CHECKING = False
if TYPE_CHECKING:
    from qinglong_edge.contracts.records import InboxRecord

MIB = 1024 * 1024
#: What :func:`_real` says of an empty directory or file.
EMPTY = hashlib.sha256(b"").hexdigest()[:16]
MEMORY_LIMIT = 32 * MIB
PIDS_LIMIT = 16


def _write(path: str, data: str, mode: int = 0o600) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _layout(root: str, lib: str, python: str) -> tuple[str, dict[str, str]]:
    """The device's files; returns the configuration file and the path table."""
    for name in ("state", "journal", "run", "device", "db", "pepper", "logs", "work", "remote-logs"):
        os.makedirs(os.path.join(root, name), 0o700)
    os.makedirs(os.path.join(root, "etc"), 0o755)
    os.makedirs(os.path.join(root, "journal", "receipts"), 0o700)
    for name in ("credential", "client.key", "client.pem"):
        _write(os.path.join(root, "device", name), f"{name} of the agent\n")
    _write(os.path.join(root, "etc", "ca.pem"), "the cluster's trust anchor\n", 0o644)
    _write(os.path.join(root, "db", "local.db"), "the Local database\n")
    _write(os.path.join(root, "pepper", "k1.pepper"), "pepper\n")
    _write(os.path.join(root, "journal", "offer.json"), '{"leaseToken":"secret"}')
    _write(os.path.join(root, "state", "other-run.log"), "another run's log\n")
    _write(os.path.join(root, "logs", "r_a.log"), "a Local Run's log\n")
    _write(os.path.join(root, "work", "note"), "a Local Run's file\n")
    config = os.path.join(root, "etc", "config.json")
    document = {
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": os.path.join(root, "state"),
        "worker": {
            "origin": "https://cluster.example:7443", "workerId": "edge-1",
            "credentialFile": os.path.join(root, "device", "credential"),
            "certificateFile": os.path.join(root, "device", "client.pem"),
            "privateKeyFile": os.path.join(root, "device", "client.key"),
            "trustAnchorFiles": [os.path.join(root, "etc", "ca.pem")],
            "journalDirectory": os.path.join(root, "journal"),
            "runtimeDirectory": os.path.join(root, "run"),
            "logDirectory": os.path.join(root, "remote-logs"),
        },
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5700},
                     "databaseFile": os.path.join(root, "db", "local.db"),
                     "pepperKeyringDirectory": os.path.join(root, "pepper")},
        "execution": {"logDirectory": os.path.join(root, "logs"), "workDirectory": os.path.join(root, "work"),
                      "maxRunPids": PIDS_LIMIT, "maxRunMemoryBytes": MEMORY_LIMIT},
    }
    _write(config, json.dumps(document), 0o644)
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

    with RuntimeDirectory.open(os.path.join(root, "run"), os.path.join(root, "journal")) as runtime:
        runtime.write("session.json", b'{"sessionId":"the session"}\n')
    paths = {
        "credential": os.path.join(root, "device", "credential"),
        "private_key": os.path.join(root, "device", "client.key"),
        "certificate": os.path.join(root, "device", "client.pem"),
        "trust_anchor": os.path.join(root, "etc", "ca.pem"),
        "config": config,
        "journal": os.path.join(root, "journal"),
        "receipts": os.path.join(root, "journal", "receipts"),
        "runtime": os.path.join(root, "run"),
        "state": os.path.join(root, "state"),
        "remote_logs": os.path.join(root, "remote-logs"),
        "local_database": os.path.join(root, "db", "local.db"),
        "pepper": os.path.join(root, "pepper"),
        "local_logs": os.path.join(root, "logs"),
        "local_work": os.path.join(root, "work"),
        "cgroup_root": "/sys/fs/cgroup",
        "agent_code": os.path.join(lib, "qinglong_edge"),
        "interpreter": os.path.dirname(python),
    }
    return config, paths


def _real(path: str) -> str:
    """What a job that sees the real thing reports (attack_job's digest)."""
    if os.path.isdir(path):
        return hashlib.sha256("\n".join(sorted(os.listdir(path))).encode()).hexdigest()[:16]
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:16]


def _snapshot(path: str) -> str:
    """Names and contents below ``path`` (one level for the cgroup root, which the kernel
    changes by itself), without following symlinks."""
    digest = hashlib.sha256()
    if not os.path.isdir(path) or os.path.islink(path):
        try:
            with open(path, "rb") as handle:
                digest.update(handle.read())
        except OSError as exc:
            digest.update(str(exc.errno).encode())
        return digest.hexdigest()
    if path == "/sys/fs/cgroup":
        digest.update("\n".join(sorted(os.listdir(path))).encode())
        return digest.hexdigest()
    for directory, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(directory, name)
            digest.update(full.encode() + b"\0")
            if not os.path.islink(full) and os.path.isfile(full):
                try:
                    with open(full, "rb") as handle:
                        digest.update(handle.read())
                except OSError:
                    pass
        digest.update(("\n".join(dirs)).encode())
    return digest.hexdigest()


def _own_procs() -> list[str]:
    """The ``cgroup.procs`` of this process's own cgroups (where a job would escape to)."""
    from qinglong_edge.process.cgroups import find_hierarchies, own_cgroups

    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        mounts = {h.kind: h.mount for h in find_hierarchies(handle.read())}
    with open("/proc/self/cgroup", encoding="utf-8") as handle:
        own = own_cgroups(handle.read())
    return [os.path.join(mounts[k], own[k].strip("/"), "cgroup.procs") for k in sorted(own) if k in mounts]


def _launch_remote(root: str, config_path: str, kind: str, argv: list[str]) -> tuple[object, object, object, str]:
    from qinglong_edge.config import load_config
    from qinglong_edge.contracts.launch import Environment, LaunchPlan
    from qinglong_edge.contracts.receipt import new_callback_token
    from qinglong_edge.process.cgroups import CgroupManager
    from qinglong_edge.process.isolation import probe_isolation
    from qinglong_edge.worker.remote.job import launch
    from qinglong_edge.worker.remote.job_files import job_files, remote_limits

    config = load_config(config_path)
    limits = remote_limits(config)
    level = "none"
    isolate = None
    if kind == "remote-isolated":
        probe = probe_isolation(os.path.join(root, "remote-logs"))
        if not probe.available:
            raise SystemExit(json.dumps({"kind": kind, "skipped": probe.reason}))
        isolate, level = probe.pid, probe.level
    # Only the keys job_files and launch read: not a whole inbox record.
    record = cast("InboxRecord", {
        "offer": {"offerId": "offer-1", "candidate": {"projectId": "p-1", "runId": "run-1", "attemptId": "attempt-1"}},
        "executorStartedAtMs": int(time.time() * 1000), "completionReceiptCallbackSequence": 1})
    files = job_files(limits.log_directory, limits.receipt_directory, record)
    manager = CgroupManager.detect(limits.cgroups, pids_max=limits.max_run_pids, memory_max=limits.max_run_memory_bytes)
    plan = LaunchPlan("argv", tuple(argv), None, None, "run-1", "attempt-1")
    environment = Environment(["PLAN_KIND"], [bytearray(kind.encode())])
    token = new_callback_token()
    os.makedirs(os.path.dirname(files.log_path), 0o700, exist_ok=True)
    held, cgroup = launch(record, files, plan=plan, environment=environment, token=token, limits=limits,
                          cgroups=manager if manager.available else None, isolate=isolate)
    return held, cgroup, files, level


def _launch_local(root: str, config_path: str, argv: list[str]) -> tuple[object, object, str, str]:
    from qinglong_edge.config import load_config
    from qinglong_edge.contracts.ids import new_uuid4
    from qinglong_edge.process.cgroups import CgroupManager
    from qinglong_edge.process.logs import TRUNCATION_NOTICE
    from qinglong_edge.process.spawn import JobSpec, job_environment, start_job

    execution = load_config(config_path).execution
    assert execution is not None
    attempt = new_uuid4()
    manager = CgroupManager.detect(execution.cgroups, pids_max=execution.max_run_pids,
                                   memory_max=execution.max_run_memory_bytes)
    cgroup = manager.create(attempt) if manager.available else None
    cwd = os.path.join(execution.work_directory, "attack")  # the launcher's own work directory, not its root
    os.makedirs(cwd, 0o700)
    log = os.path.join(execution.log_directory, f"run_{attempt}.log")
    env = job_environment({}, run_id="run-1", attempt_id=attempt, home=cwd)
    # As execution/launcher.py builds it: no isolation (Local Runs are the operator's).
    held = start_job(JobSpec(argv, env, cwd, log, execution.max_log_bytes, log_notice=TRUNCATION_NOTICE,
                             terminate_grace_ms=execution.terminate_grace_ms, kill_grace_ms=execution.kill_grace_ms,
                             label=attempt), cgroup=cgroup)
    return held, cgroup, cwd, log


def main() -> int:
    lib, root, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, lib)
    python = sys.executable
    config_path, paths = _layout(root, lib, python)
    plan_path = os.path.join(root, "plan.json")
    plan = {"paths": paths, "agent_pid": os.getpid(), "escape_to": _own_procs(), "memory_limit": MEMORY_LIMIT,
            "pids_limit": PIDS_LIMIT}
    _write(plan_path, json.dumps(plan), 0o644)
    argv = [python, "-I", "-S", os.path.join(lib, "attack_job.py"), plan_path]
    from qinglong_edge.process.cgroups import out_of_memory

    if kind == "local":
        held, cgroup, cwd, log = _launch_local(root, config_path, argv)
        level = "none"
    else:
        held, cgroup, files, level = _launch_remote(root, config_path, kind, argv)
        cwd, log = files.work_path, files.log_path  # type: ignore[attr-defined]
    _write(os.path.join(cwd, "wrapper.pid"), str(held.pid), 0o644)  # type: ignore[attr-defined]
    log_fd = os.open(log, os.O_RDONLY)  # a job without isolation may move or replace its log's directory
    real = {key: _real(path) for key, path in paths.items()}  # as the job will find them
    before = {key: _snapshot(path) for key, path in paths.items()}
    held.release()  # type: ignore[attr-defined]
    code = held.process.wait(120)  # type: ignore[attr-defined]
    reason = out_of_memory(cgroup)  # type: ignore[arg-type]
    if cgroup is not None:
        cgroup.kill()  # type: ignore[attr-defined]
        for _ in range(200):
            if cgroup.remove():  # type: ignore[attr-defined]
                break
            time.sleep(0.01)  # a poll, kept: this file runs alone (python -I), without tests.support.wait
    with os.fdopen(log_fd, "rb") as handle:
        lines = handle.read().decode("utf-8", "replace").splitlines()
    cells = []
    for line in lines:
        if not line.startswith("{"):
            continue
        item = json.loads(line)
        result = item["result"]
        if result in ("read", "empty"):
            # A read that found the real content (an empty directory that is empty indeed
            # included) read it; anything else (a cover, nothing at all) did not.
            found = item["detail"] if result == "read" else EMPTY if item["detail"] == "" else None
            result = "read" if found == real[item["path"]] else "hidden"
        cells.append([item["cell"], item["path"], result, item["detail"]])
    changed = sorted(key for key, path in paths.items() if _snapshot(path) != before[key])
    print(json.dumps({"kind": kind, "level": level, "cells": cells, "changed": changed, "exit_code": code,
                      "reason": reason, "log_tail": lines[-5:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
