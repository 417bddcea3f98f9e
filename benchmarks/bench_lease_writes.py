"""Benchmark: what supervising one running remote job writes under the state directory
(issue 23 item 7: "renewals and heartbeats kept in the RAM runtime directory; the journal
written only when a record changes state").

    python benchmarks/bench_lease_writes.py [--window-s S] [--baseline-ref REF]

A real resident ``pull`` (``python -m qinglong_edge pull --no-splay --json``) against the
cluster double over TLS 1.3, with 6 s leases (a renewal every 2 s, three times the edge
default's pace, so a short window holds many renewals), runs one job (``sleep``) under
``strace -f -y``. Once the record is ``running_acknowledged``, the trace is counted over
``--window-s`` seconds (default 60) of pure supervision: ``fsync``-family calls and bytes
written under the state directory (which holds the journal; tests/support/idle_writes.py
does the counting), and the renewals the cluster granted in the window. Then the cluster
cancels the job and the pull ends. Figures: per renewal, and per hour at the edge default
(a 30 s lease renewed every 10 s: 360 renewals an hour; heartbeats are RAM only in both).

Baseline, in the same run: the agent at ``REF`` (default ``7ddaab9``, before issue 23: each
renewal rewrote the inbox record with two fsyncs), same job, same measurement. Target: 0
fsyncs and 0 bytes per renewal (ours). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.cluster_double import ClusterDouble  # noqa: E402
from tests.support.idle_writes import TRACED, parse_trace, strace_path  # noqa: E402
from tests.support.remote_env import RemoteEnv  # noqa: E402
from tests.support.wait import wait_until  # noqa: E402

BASELINE_REF = "7ddaab9"
LEASE_MS = 6000
EDGE_RENEWALS_PER_HOUR = 3600 // 10


def _baseline_tree(ref: str, work: pathlib.Path) -> pathlib.Path | None:
    git = shutil.which("git")
    if git is None:
        return None
    target = work / f"tree-{ref}"
    target.mkdir()
    archive = subprocess.run([git, "-C", str(REPO), "archive", ref, "qinglong_edge"], capture_output=True, check=False)
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def _version(env: RemoteEnv, run_id: str) -> int:
    try:
        return env.cluster.lease_version(run_id)
    except KeyError:
        return 0


def measure(package_root: pathlib.Path, window_s: float, work: pathlib.Path, name: str) -> dict[str, Any]:
    """One supervised job under strace (module docstring)."""
    strace = strace_path()
    assert strace is not None
    env_vars = {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_EDGE_", "PYTHON"))}
    env_vars["PYTHONPATH"] = str(package_root)
    with ClusterDouble(lease_duration_ms=LEASE_MS, renewal_duration_ms=LEASE_MS) as cluster:
        root = work / name
        root.mkdir()
        env = RemoteEnv(root, cluster)
        task = cluster.add_command_task("exec sleep 100000")
        run_id = task.candidate["runId"]
        trace = root / "trace.txt"
        argv = [sys.executable, "-m", "qinglong_edge", "--config", str(env.config_path), "pull", "--no-splay",
                "--json"]
        proc = subprocess.Popen([strace, "-f", "-qq", "-y", "-s", "256", "-e", f"trace={TRACED}", "-o", str(trace),
                                 *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_vars,
                                cwd=str(package_root))
        try:
            env.wait_state("running_acknowledged", timeout=60)
            wait_until(lambda: _version(env, run_id) >= 3, timeout=60, what="the launch's renewals")
            start_lines = len(trace.read_text(errors="replace").splitlines())
            start_version, started = _version(env, run_id), time.monotonic()
            time.sleep(window_s)
            lines = trace.read_text(errors="replace").splitlines()
            end_version, elapsed = _version(env, run_id), time.monotonic() - started
            window = parse_trace("\n".join(lines[start_lines:]), str(env.state_dir))
            cluster.request_cancel(run_id)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        renewals = end_version - start_version
        completion = cluster.completion(run_id)
    per_renewal_fsyncs = window.fsyncs / renewals if renewals else None
    per_renewal_bytes = window.bytes_written / renewals if renewals else None
    return {
        "window_s": round(elapsed, 1), "renewals": renewals, "fsyncs": window.fsyncs,
        "bytes_written": window.bytes_written, "mutations": len(window.mutations),
        "fsyncs_per_renewal": per_renewal_fsyncs, "bytes_per_renewal": per_renewal_bytes,
        "edge_per_hour": {
            "fsyncs": None if per_renewal_fsyncs is None else round(per_renewal_fsyncs * EDGE_RENEWALS_PER_HOUR),
            "bytes": None if per_renewal_bytes is None else round(per_renewal_bytes * EDGE_RENEWALS_PER_HOUR)},
        "completion": None if completion is None else completion["status"], "exit_status": proc.returncode,
        "stderr_tail": stderr.decode(errors="replace")[-500:] if proc.returncode else "",
        "events": len(stdout.splitlines()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-s", type=float, default=60.0, help="seconds of supervision measured (default 60)")
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="git revision of the baseline agent")
    args = parser.parse_args()
    if strace_path() is None:
        raise SystemExit("strace is not installed")
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-lease-writes-"))
    try:
        ours = measure(REPO, args.window_s, work, "ours")
        tree = _baseline_tree(args.baseline_ref, work)
        baseline = None if tree is None else measure(tree, args.window_s, work, "baseline")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    met = ours["renewals"] > 0 and ours["fsyncs"] == 0 and ours["bytes_written"] == 0
    print(json.dumps({"lease_ms": LEASE_MS, "ours": ours, "baseline_ref": args.baseline_ref, "baseline": baseline,
                      "targets": {"fsyncs_per_renewal": 0, "bytes_per_renewal": 0}, "met": met}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
