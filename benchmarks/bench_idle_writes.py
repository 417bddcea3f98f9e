"""Benchmark: what idle cron ``pull`` cycles write under the state directory (issue 16 item 4).

    python benchmarks/bench_idle_writes.py [--cycles N] [--baseline-ref REF]

Cycle 1 registers the session and makes the claim; cycles 2..N (default 20) are the
steady state: no work on the cluster double, a heartbeat due in every cycle (between
cycles the runtime session record is aged by a minute, as a cron minute passing would).
Each cycle is the real CLI (``python -m qinglong_edge --config C pull --no-splay``) in its
own process against the cluster double over TLS 1.3, traced with ``strace -f -y``;
counted under the state directory (which holds the journal): ``fsync``-family calls,
bytes passed to ``write``/``pwrite``/``writev``, and every call that creates, renames,
removes or changes a name or an inode (tests/support/idle_writes.py). A stat snapshot of
every entry before and after each cycle must also be unchanged.

Baseline, in the same run: the same cycles with the agent as it was at ``REF`` (default
``5c3f77a``, the commit issue 16 measured: claim created, attempt persisted and cleared
every cycle, session record rewritten, owner record and hard-link probe), taken from git
into a temporary directory. Target: 0 fsyncs and 0 bytes (ours). Prints one JSON object.
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
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.cluster_double import ClusterDouble  # noqa: E402
from tests.support.idle_writes import snapshot, strace_path, trace_cycle  # noqa: E402
from tests.support.pull_env import PullEnv  # noqa: E402

BASELINE_REF = "5c3f77a"


def _age(env: PullEnv, legacy: bool) -> None:
    """Make the next cycle's heartbeat due (the interval is 5 s; less than the 60 s session lease)."""
    path = (env.journal / "session.json") if legacy else (env.runtime / "session.json")
    document = json.loads(path.read_bytes())
    session = document if legacy else document["session"]
    session["heartbeatAtMs"] -= 10_000
    data = json.dumps(document, separators=(",", ":")).encode() + b"\n"
    if legacy:  # the old journal refuses a file that is not 0600
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, data)
        os.close(fd)
    else:
        path.write_bytes(data)


def _measure(package_root: pathlib.Path, cycles: int, work: pathlib.Path, *, legacy: bool) -> dict[str, Any]:
    env_vars = {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_EDGE_", "PYTHON"))}
    env_vars["PYTHONPATH"] = str(package_root)
    with ClusterDouble() as cluster:
        root = work / ("baseline" if legacy else "ours")
        root.mkdir()
        env = PullEnv(root, cluster, heartbeatIntervalMs=5000, sessionLeaseDurationMs=60_000)
        if legacy:  # the old config has no runtimeDirectory (an unknown key would be refused)
            document = json.loads(env.config_path.read_text())
            document["worker"].pop("runtimeDirectory")
            env.config_path.write_text(json.dumps(document))
        argv = [sys.executable, "-m", "qinglong_edge", "--config", str(env.config_path), "pull", "--no-splay", "--json"]
        first = subprocess.run(argv, capture_output=True, env=env_vars, cwd=str(package_root), timeout=60, check=False)
        if first.returncode != 0:
            raise SystemExit(f"first cycle failed: {first.stderr.decode()[-2000:]}")
        totals = {"fsyncs": 0, "bytes_written": 0, "mutations": 0, "opens_with_create": 0, "snapshot_changes": 0}
        statuses = []
        for cycle in range(2, cycles + 1):
            _age(env, legacy)
            before = snapshot(env.state_dir)
            proc, writes = trace_cycle(argv, env.state_dir, work / f"trace-{cycle}.txt", env=env_vars,
                                       cwd=str(package_root))
            if proc.returncode != 0:
                raise SystemExit(f"cycle {cycle} failed: {proc.stderr.decode()[-2000:]}")
            line = json.loads(proc.stdout.decode().splitlines()[-1])
            statuses.append((line["status"], line["session"]["action"]))
            totals["fsyncs"] += writes.fsyncs
            totals["bytes_written"] += writes.bytes_written
            totals["mutations"] += len(writes.mutations)
            totals["opens_with_create"] += writes.opens_with_create
            totals["snapshot_changes"] += int(snapshot(env.state_dir) != before)
        heartbeats = sum(1 for _, action in statuses if action == "heartbeat")
        idle = sum(1 for status, _ in statuses if status == "idle")
    return {"cycles_measured": cycles - 1, "heartbeats": heartbeats, "idle_answers": idle, **totals,
            "per_cycle": {key: round(value / (cycles - 1), 2) for key, value in totals.items()}}


def _baseline_tree(ref: str, work: pathlib.Path) -> pathlib.Path | None:
    git = shutil.which("git")
    if git is None:
        return None
    target = work / "baseline-src"
    target.mkdir()
    archive = subprocess.run([git, "-C", str(REPO), "archive", ref, "qinglong_edge"], capture_output=True, check=False)
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="cycles in all; 2..N are measured (default 20)")
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="git revision of the baseline agent")
    args = parser.parse_args()
    if strace_path() is None:
        raise SystemExit("strace is not installed")
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-idle-writes-"))
    try:
        ours = _measure(REPO, args.cycles, work, legacy=False)
        tree = _baseline_tree(args.baseline_ref, work)
        baseline = None if tree is None else _measure(tree, args.cycles, work, legacy=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    met = ours["fsyncs"] == 0 and ours["bytes_written"] == 0 and ours["mutations"] == 0 and \
        ours["snapshot_changes"] == 0 and ours["heartbeats"] == args.cycles - 1
    print(json.dumps({"cycles": args.cycles, "ours": ours, "baseline_ref": args.baseline_ref, "baseline": baseline,
                      "targets": {"fsyncs": 0, "bytes_written": 0}, "met": met}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
