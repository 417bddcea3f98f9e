"""Benchmark: lease renewals per lease when the device's wall clock is off the cluster's
(issue 23: "exactly one per third of the lease" from -10 min to +10 min).

    python benchmarks/bench_renewal_skew.py [--offsets-s -600,...,600] [--window-s S] [--baseline-ref REF]

For each offset, a real resident ``pull`` runs one job (``sleep``) against the cluster
double over TLS 1.3 with 6 s leases; the device's wall clock is shifted by the offset
through the test-only shim (tests/support/wallclock: ``time.time`` of the agent only;
OpenSSL and the cluster keep the real time). From ``running_acknowledged`` on, the
lease-control requests the cluster receives in ``--window-s`` seconds (default 12) are
counted: renewals per lease = requests / (window / 6 s); target 3 (one per third). Then
the cluster cancels the job.

Baseline, in the same run: the agent at ``REF`` (default ``7ddaab9``, before issue 23, whose
lease clock compared the cluster's ``expiresAtMs`` with the wall clock), same offsets, same
count (a renewal storm when ahead; none when behind, where the lease runs out and the job
is stopped). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from qinglong_edge.errors import ExecutionError  # noqa: E402
from qinglong_edge.process.identity import decode_handle  # noqa: E402
from tests.support.cluster_double import ClusterDouble  # noqa: E402
from tests.support.remote_env import RemoteEnv  # noqa: E402
from tests.support.wall_clock import SHIM_DIRECTORY, WallClock  # noqa: E402

BASELINE_REF = "7ddaab9"
LEASE_MS = 6000
OFFSETS_S = (-600, -300, -60, 0, 60, 300, 600)


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


def _end_job(env: RemoteEnv) -> None:
    """Kill the job's process group if a pull left it running (nothing may outlive the run)."""
    for record in env.inbox().values():
        handle = record.get("executorHandle")
        if not isinstance(handle, str):
            continue
        try:
            os.killpg(decode_handle(handle).identity.pgid, signal.SIGKILL)
        except (ExecutionError, OSError):
            pass


def _count(cluster: ClusterDouble) -> int:
    return len(cluster.exchanges_for("lease-control"))


def measure(package_root: pathlib.Path, offset_s: int, window_s: float, work: pathlib.Path,
            name: str) -> dict[str, Any]:
    with ClusterDouble(lease_duration_ms=LEASE_MS, renewal_duration_ms=LEASE_MS) as cluster:
        root = work / f"{name}{offset_s:+d}"
        root.mkdir()
        env = RemoteEnv(root, cluster)
        wall = WallClock(root, offset_s * 1000)
        env_vars = {key: value for key, value in os.environ.items()
                    if not key.startswith(("QINGLONG_EDGE_", "PYTHON"))}
        env_vars.update(wall.env())
        env_vars["PYTHONPATH"] = f"{SHIM_DIRECTORY}{os.pathsep}{package_root}"
        task = cluster.add_command_task("exec sleep 100000")
        run_id = task.candidate["runId"]
        proc = subprocess.Popen([sys.executable, "-m", "qinglong_edge", "--config", str(env.config_path), "pull",
                                 "--no-splay", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env_vars, cwd=str(package_root))
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                inbox = env.inbox()
                if inbox and next(iter(inbox.values()))["state"] not in ("accepted", "starting_acknowledged",
                                                                          "launching", "started"):
                    break
                time.sleep(0.02)
            start, started = _count(cluster), time.monotonic()
            while time.monotonic() - started < window_s and proc.poll() is None:
                time.sleep(0.05)
            calls, elapsed = _count(cluster) - start, time.monotonic() - started
            state = env.state()
            try:
                cluster.request_cancel(run_id)
            except KeyError:
                pass
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pass  # an agent that no longer talks to the cluster (the baseline when behind): ended below
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            _end_job(env)
        completion = cluster.completion(run_id)
    per_lease = calls / (elapsed * 1000 / LEASE_MS) if elapsed > 0 else None
    return {"offset_s": offset_s, "window_s": round(elapsed, 1), "lease_control_calls": calls,
            "renewals_per_lease": None if per_lease is None else round(per_lease, 2),
            "state_after_window": state, "completion": None if completion is None else completion["status"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offsets-s", default=",".join(str(o) for o in OFFSETS_S),
                        help="comma-separated wall-clock offsets in seconds")
    parser.add_argument("--window-s", type=float, default=12.0, help="seconds counted per offset (default 12)")
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="git revision of the baseline agent")
    args = parser.parse_args()
    offsets = [int(part) for part in args.offsets_s.split(",") if part.strip()]
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-renewal-skew-"))
    try:
        ours = [measure(REPO, offset, args.window_s, work, "ours") for offset in offsets]
        tree = _baseline_tree(args.baseline_ref, work)
        baseline = None if tree is None else [measure(tree, offset, args.window_s, work, "base") for offset in offsets]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # One per third of the lease: 3 per lease, +- one call over the window (its edges).
    slack = 1 / (args.window_s * 1000 / LEASE_MS)
    met = all(row["renewals_per_lease"] is not None and abs(row["renewals_per_lease"] - 3) <= slack + 0.01
              and row["completion"] == "cancelled" for row in ours)
    print(json.dumps({"lease_ms": LEASE_MS, "window_s": args.window_s, "ours": ours, "baseline_ref": args.baseline_ref,
                      "baseline": baseline, "targets": {"renewals_per_lease": 3}, "met": met}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
