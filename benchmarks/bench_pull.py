"""Benchmark: CPU time and peak RSS of an idle ``pull`` cycle vs. one bare mTLS POST.

    python benchmarks/bench_pull.py [--runs N] [--keep DIR]

Both sides run as whole child processes of this script, interleaved, against the same
cluster double (``tests.support.cluster_double`` in its own process, no tasks queued,
so every pull is idle) with the same certificates, credential and trust anchor:

* ``pull``: ``python -S bin/qinglong-edge pull --config C --no-splay`` through the
  router's launcher (packaging/files/launcher, the package linked in as
  ``lib/qinglong-edge``) -- one complete cron cycle: CLI and config, journal open
  (owner lock, its record in the RAM runtime directory), inbox prune, session record
  read (current: no session call), the kept claim read, its attempt marker written to
  the runtime directory, one TLS 1.3 mTLS POST of the claim, idle response parsed (the
  claim kept as it is), the marker removed, lock released. Nothing is written to the
  journal (benchmarks/bench_idle_writes.py measures that).
* ``baseline``: a minimal script (only ``ssl``, ``http.client`` and ``json`` imported)
  that makes the same TLS 1.3 context (anchor, client chain and key), POSTs one claim
  body to the same offers route with the same ``Authorization`` and parses the JSON.

Both children run with ``-S`` (no :mod:`site`): the development interpreter's
site-packages (the editable install's ``.pth`` finder) would add the same ~15 ms to both
sides and do not exist on a router; ``--site`` keeps site for both.

Per child: ``os.wait4`` gives its own rusage -- CPU = ``ru_utime + ru_stime`` (ms) and
peak RSS = ``ru_maxrss`` (KiB on Linux); wall time by ``time.perf_counter``. The first
pull (which registers the session) is a warm-up and is not counted; the session lease
and heartbeat interval are set long enough that no measured cycle heartbeats. Medians
over N runs each, ratios pull / baseline. Targets (issue 6): CPU <= 1.10x, peak RSS
<= 1.05x. Reported, never asserted. Prints one JSON object.

To tell the standard library's share from our code's, the run also measures
``stdlib_floor``: a child that only imports the top-level stdlib modules a pull cycle
loads (taken from ``sys.modules`` after a real cycle) -- what any pull built on these
modules pays before a line of ours runs -- and the modules it adds to the baseline's.
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
import time
from typing import Any

from qinglong_edge.worker.journal.runtime import journal_key

REPO = pathlib.Path(__file__).resolve().parent.parent
CPU_TARGET = 1.10
RSS_TARGET = 1.05

BASELINE = r'''
import http.client, json, ssl, sys

origin_host, port, path, credential, certificate, key, anchor, generation = sys.argv[1:9]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.minimum_version = ssl.TLSVersion.TLSv1_3
context.load_verify_locations(anchor)
context.load_cert_chain(certificate, key)
with open(credential, encoding="ascii") as handle:
    token = handle.read().strip()
body = json.dumps({"workerGeneration": int(generation), "offerId": ssl.RAND_bytes(16).hex(),
                   "leaseToken": ssl.RAND_bytes(32).hex()}, separators=(",", ":")).encode()
connection = http.client.HTTPSConnection(origin_host, int(port), context=context, timeout=15)
connection.request("POST", path, body, {"accept": "application/json", "authorization": "Worker " + token,
                                        "content-type": "application/json"})
response = connection.getresponse()
answer = json.loads(response.read())
connection.close()
sys.exit(0 if response.status == 200 and answer["status"] == "idle" else 1)
'''


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_EDGE_", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _measure(argv: list[str]) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(), cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]}... exited {proc.returncode}: {stderr[-2000:]}")
    return {"cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000, "user_ms": usage.ru_utime * 1000,
            "sys_ms": usage.ru_stime * 1000, "maxrss_kib": float(usage.ru_maxrss), "wall_ms": wall * 1000}


MODULES_PROBE = r'''
import json, sys
sys.argv = ["qinglong-edge", *sys.argv[1:]]
sys.path.insert(0, sys.argv.pop(1))
from qinglong_edge.cli import main
status = main(sys.argv[1:])
names = sorted({name.split(".")[0] for name in sys.modules})
sys.stderr.write("MODULES=" + json.dumps(names) + "\n")
sys.exit(status)
'''


def _top_level_modules(argv: list[str]) -> list[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=REPO, check=False)
    line = [text for text in proc.stderr.splitlines() if text.startswith("MODULES=")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"module probe failed: {proc.stderr[-2000:]}")
    names: list[str] = json.loads(line[-1][len("MODULES="):])
    return names


def _summary(samples: list[dict[str, float]]) -> dict[str, float]:
    return {f"{key}_median": round(statistics.median(s[key] for s in samples), 2) for key in samples[0]} | {
        f"{key}_min": round(min(s[key] for s in samples), 2) for key in ("cpu_ms", "maxrss_kib")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="measured runs of each side (default 15)")
    parser.add_argument("--keep", help="use (and keep) this directory instead of a temporary one")
    parser.add_argument("--site", action="store_true", help="import site in both children (default: -S)")
    args = parser.parse_args()
    work = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="bench-pull-"))
    work.mkdir(parents=True, exist_ok=True)
    double = subprocess.Popen([sys.executable, "-m", "tests.support.cluster_double", "--state-dir",
                               str(work / "cluster"), "--tasks", ""], stdout=subprocess.PIPE, env=_env(), cwd=REPO)
    try:
        assert double.stdout is not None
        info = json.loads(double.stdout.readline())
        config = json.loads(pathlib.Path(info["configFile"]).read_text())
        config["worker"].update({"sessionLeaseDurationMs": 600_000, "heartbeatIntervalMs": 300_000})
        config_path = work / "bench-config.json"
        config_path.write_text(json.dumps(config))
        flags = [] if args.site else ["-S"]
        (work / "bin").mkdir(exist_ok=True)
        (work / "lib").mkdir(exist_ok=True)
        launcher = work / "bin" / "qinglong-edge"
        shutil.copyfile(REPO / "packaging" / "files" / "launcher", launcher)
        package_root = work / "lib" / "qinglong-edge"
        if not package_root.exists():
            package_root.mkdir()
            (package_root / "qinglong_edge").symlink_to(REPO / "qinglong_edge")
        pull = [sys.executable, *flags, str(launcher), "pull", "--config", str(config_path), "--no-splay"]
        _measure(pull)  # warm-up: registers the session, writes .pyc files
        # The session record lives in the runtime directory (RAM) since issue 16.
        journal = config["worker"].get("journalDirectory") or str(pathlib.Path(config["stateDirectory"]) / "worker")
        runtime = pathlib.Path(config["worker"]["runtimeDirectory"]) / journal_key(journal)
        session = json.loads((runtime / "session.json").read_text())["session"]
        script = work / "baseline_mtls_post.py"
        script.write_text(BASELINE)
        offers = f"/api/v3/worker-ingress/workers/{session['workerId']}/sessions/{session['sessionId']}/offers"
        baseline = [sys.executable, *flags, str(script), "127.0.0.1", str(info["port"]), offers, info["credentialFile"],
                    info["certificateFile"], info["privateKeyFile"], info["trustAnchorFile"],
                    str(session["generation"])]
        _measure(baseline)
        probe = [sys.executable, *flags, "-c", MODULES_PROBE, str(package_root), *pull[len(flags) + 2:]]
        ours_modules = _top_level_modules(probe)
        stdlib = sorted(set(ours_modules) & set(sys.stdlib_module_names))
        baseline_modules = _top_level_modules([sys.executable, *flags, "-c",
                                               "import http.client, json, ssl, sys\n"
                                               "sys.stderr.write('MODULES=' + json.dumps(sorted("
                                               "{n.split('.')[0] for n in sys.modules})) + '\\n')"])
        floor = [sys.executable, *flags, "-c", "import " + ", ".join(stdlib)]
        ours: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        floors: list[dict[str, float]] = []
        for _ in range(args.runs):
            ours.append(_measure(pull))
            theirs.append(_measure(baseline))
            floors.append(_measure(floor))
        state = json.loads((work / "cluster" / "cluster-state.json").read_text())
    finally:
        double.terminate()
        double.wait(timeout=10)
        if double.stdout:
            double.stdout.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    pull_summary, base_summary, floor_summary = _summary(ours), _summary(theirs), _summary(floors)
    cpu_ratio = pull_summary["cpu_ms_median"] / base_summary["cpu_ms_median"]
    rss_ratio = pull_summary["maxrss_kib_median"] / base_summary["maxrss_kib_median"]
    result: dict[str, Any] = {
        "benchmark": "pull_idle_cycle_vs_mtls_post",
        "command": "python " + " ".join(pull[1:]).replace(str(work), "<work>"),
        "baseline_command": "python baseline_mtls_post.py (ssl, http.client, json only; see BASELINE)",
        "python": sys.version.split()[0],
        "site": bool(args.site),
        "runs": args.runs,
        "units": {"cpu_ms": "ms user+sys of the child (wait4)", "user_ms": "ms", "sys_ms": "ms",
                  "maxrss_kib": "KiB peak RSS of the child", "wall_ms": "ms"},
        "pull": pull_summary,
        "baseline": base_summary,
        "ratios": {"cpu": round(cpu_ratio, 3), "maxrss": round(rss_ratio, 3)},
        "targets": {"cpu": CPU_TARGET, "maxrss": RSS_TARGET},
        "met": {"cpu": cpu_ratio <= CPU_TARGET, "maxrss": rss_ratio <= RSS_TARGET},
        "stdlib_floor": {
            "modules_beyond_baseline": sorted(set(stdlib) - set(baseline_modules)),
            **floor_summary,
            "ratios": {"cpu": round(floor_summary["cpu_ms_median"] / base_summary["cpu_ms_median"], 3),
                       "maxrss": round(floor_summary["maxrss_kib_median"] / base_summary["maxrss_kib_median"], 3)},
        },
        "cluster_requests": state["requests"],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
