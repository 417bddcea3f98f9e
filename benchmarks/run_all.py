"""Run every benchmark and write ``docs/benchmarks.md`` (``make bench``).

    python benchmarks/run_all.py [--output docs/benchmarks.md] [--only NAME ...] [--quick]

Runs each ``benchmarks/bench_*.py`` as its own process, one after another (never in
parallel: they measure time), with the arguments of :data:`PLAN` (a benchmark not in
the plan runs with its defaults). Each prints one JSON object: its figures *and* its
baseline measured in the same run, medians over several runs. This script adds the
machine (date, CPU, cores, kernel, Python, SQLite, OpenSSL, cgroups, commit), turns each
object into a table (ours, baseline, ratio, target, met) with the exact command, and
keeps the raw JSON under each table. A benchmark that fails is reported as failed (its
stderr tail in the document) and the exit status is 1; missed targets do not fail.
``--quick`` divides the repetitions (a smoke run; the document says so).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import glob
import json
import os
import platform
import signal
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDED = os.path.join(REPO, "benchmarks", "recorded.md")
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tables import ADAPTERS, Row, Section, generic  # noqa: E402  (benchmarks/tables.py)

#: name -> (arguments, arguments with --quick). About 4 minutes on 2 cores in all.
PLAN: dict[str, tuple[list[str], list[str]]] = {
    "journal": (["--offers", "20", "--repetitions", "7"], ["--offers", "5", "--repetitions", "2"]),
    "local_api": (["--repeat", "7"], ["--runs", "1000", "--cancels", "60", "--reads", "40", "--repeat", "1"]),
    "cancel_latency": (["--cancels", "300"], ["--cancels", "20"]),
    "controller_stop": (["--cancels", "200"], ["--cancels", "20"]),
    "pull": (["--runs", "40"], ["--runs", "3"]),
    "startup": (["--runs", "60", "--site"], ["--runs", "5"]),
    "envelope": (["--load-seconds", "15"], ["--load-seconds", "5"]),
    "fleet": (["--devices", "10000"], ["--devices", "2000", "--max-minutes", "40"]),
    "idle_writes": (["--cycles", "20"], ["--cycles", "5"]),
    "availability": (["--seconds", "20"], ["--seconds", "3", "--requests", "10000", "--timing-rounds", "300"]),
    "job_wrapper": (["--runs", "30", "--jobs", "4"], ["--runs", "5", "--jobs", "2"]),
    "job_isolation": (["--runs", "30"], ["--runs", "5"]),
    "transport": (["--requests", "60", "--repetitions", "5"], ["--requests", "10", "--repetitions", "1"]),
    "storage_caps": (["--runs", "20000"], ["--runs", "2000", "--baseline-runs", "300", "--disk-runs", "100"]),
    "remote_execution": (["--runs", "7", "--window-s", "60"], ["--runs", "2", "--window-s", "15"]),
    "lease_writes": (["--window-s", "60"], ["--window-s", "12"]),
    "renewal_skew": (["--window-s", "12"], ["--window-s", "6", "--offsets-s=-600,0,600"]),
    "inbox_week": (["--days", "7", "--baseline-days", "1"], ["--days", "1", "--baseline-days", "1"]),
    "observe": (["--requests", "400", "--repeat", "3", "--cycles", "12"],
                ["--requests", "100", "--repeat", "1", "--cycles", "4"]),
}
TIMEOUT_S = 420
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Outcome:
    name: str
    argv: list[str]
    seconds: float
    result: dict[str, Any] | None = None
    error: str = ""
    sections: list[Section] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)


def _become_subreaper() -> bool:
    """Orphans of a benchmark (a job it failed to stop) become our children, so that
    :func:`_sweep` can name and stop them instead of letting them run on."""
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _sweep() -> list[str]:
    """Kill and reap the processes left behind by the benchmark that just ended (our
    children now, as subreaper); returns their command lines."""
    me, found, killed = os.getpid(), [], []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                state, ppid_text = handle.read().rsplit(")", 1)[1].split()[:2]
            if int(ppid_text) != me or state in ("Z", "X"):
                continue  # not ours, or already dead (reaped below)
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                found.append(handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200])
            os.kill(int(entry), signal.SIGKILL)
            killed.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    for pid in killed:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:  # zombies that were already dead
            pass
    return found


def _run(name: str, script: str, args: list[str]) -> Outcome:
    # relative (the child runs in REPO): a benchmark that prints its own argv names no path of this machine
    argv = [sys.executable, os.path.relpath(script, REPO), *args]
    env = {key: value for key, value in os.environ.items() if not key.startswith("QINGLONG_EDGE_")}
    env["PYTHONPATH"] = REPO
    started = time.monotonic()
    sys.stderr.write(f"bench: {name}: {' '.join(['python', os.path.relpath(script, REPO), *args])}\n")
    sys.stderr.flush()
    # Files, not pipes: a process the benchmark leaves behind may hold its stdout/stderr
    # open, and a pipe would then never reach end of file.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        outcome = Outcome(name, argv, time.monotonic() - started, leaked=_sweep())
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if code is None:
        outcome.error = f"timed out after {TIMEOUT_S} s: {stderr[-1500:]}"
        return outcome
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        outcome.result = json.loads(lines[-1]) if lines else None
    except ValueError:
        outcome.result = None
    if code != 0 or outcome.result is None:
        outcome.error = f"exit {code}: {(stderr or stdout)[-1500:]}"
    return outcome


def machine() -> dict[str, str]:
    cpu = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = ""
    with open("/proc/meminfo", encoding="ascii", errors="replace") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) // 1024} MiB"
    system = "Linux"
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    system = line.split("=", 1)[1].strip().strip('"')
    cgroups = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            tail = right.split()
            if tail and tail[0] == "cgroup2":
                cgroups.append(f"v2 at {left.split()[4]}")
            elif tail and tail[0] == "cgroup" and len(tail) > 2:
                kinds = [k for k in ("memory", "pids", "freezer") if k in tail[2].split(",")]
                cgroups.extend(f"v1 {k}" for k in kinds)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO,
                            check=False).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=REPO, check=False).stdout.strip()
    return {
        "Date (UTC)": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "CPU": f"{cpu}, {os.cpu_count()} cores",
        "Memory": memory,
        "System": f"{system}; kernel {platform.release()} {platform.machine()}",
        # relative to the checkout: a tracked document names no path of this machine
        "Python": f"{platform.python_implementation()} {platform.python_version()} ({_relative(sys.executable)})",
        "SQLite": sqlite3.sqlite_version,
        "OpenSSL": ssl.OPENSSL_VERSION,
        "cgroups": ", ".join(cgroups) or "none",
        "User": "root" if os.geteuid() == 0 else f"uid {os.geteuid()}",
        "Commit": commit + (" (with uncommitted changes)" if dirty else ""),
    }


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|") if value not in (None, "") else "-"


def _met(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[value]


def _table(rows: list[Row]) -> list[str]:
    out = ["| figure | ours | baseline | ratio | target | met |", "| --- | --- | --- | --- | --- | --- |"]
    out += [f"| {_cell(r.figure)} | {_cell(r.ours)} | {_cell(r.baseline)} | {_cell(r.ratio)} | {_cell(r.target)} "
            f"| {_met(r.met)} |" for r in rows]
    return out


def _relative(path: str) -> str:
    """``path`` relative to the checkout when it is inside it (``.venv/bin/python``), else its name."""
    inside = os.path.abspath(path).startswith(REPO + os.sep)
    return os.path.relpath(path, REPO) if inside else os.path.basename(path)


def render(outcomes: list[Outcome], info: dict[str, str], total_s: float, quick: bool, command: str) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`{command}`) in {total_s:.0f} s"
        + (" -- **quick smoke run: reduced repetitions, not for the record**" if quick else "") + ".",
        "Each benchmark runs as its own process and measures our code *and* its baseline in the same run,",
        "several repetitions, medians; ratios are ours / baseline. Targets come from the issue that asked",
        "for the benchmark; a missed target is explained under its table. Figures are from this machine",
        "only; rerun `make bench` to regenerate this file.",
        "",
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
        *[f"| {key} | {_cell(value)} |" for key, value in info.items()],
        "",
        "## Summary",
        "",
        "| benchmark | figure | ours | baseline | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for outcome in outcomes:
        if outcome.error:
            lines.append(f"| {outcome.name} | **failed** | - | - | - | - | **no** |")
            continue
        for section in outcome.sections:
            for row in section.rows:
                if row.target not in (None, ""):
                    lines.append(f"| {outcome.name} | {_cell(row.figure)} | {_cell(row.ours)} | {_cell(row.baseline)} "
                                 f"| {_cell(row.ratio)} | {_cell(row.target)} | {_met(row.met)} |")
    for outcome in outcomes:
        command = " ".join(["python", *outcome.argv[1:]])
        lines += ["", f"## {outcome.name}", "", f"Command: `{command}` ({outcome.seconds:.0f} s)", ""]
        if outcome.leaked:
            lines += [f"**It left {len(outcome.leaked)} process(es) behind** (killed by the runner): "
                      + "; ".join(f"`{c}`" for c in outcome.leaked[:5]), ""]
        if outcome.error:
            lines += ["**Failed.**", "", "```", outcome.error.strip(), "```"]
            continue
        for section in outcome.sections:
            if section.title:
                lines += [f"### {section.title}", ""]
            if section.text:
                lines += [section.text, ""]
            if section.rows:
                lines += [*_table(section.rows), ""]
            lines += [f"* {note}" for note in section.notes]
            if section.notes:
                lines.append("")
        lines += ["<details><summary>raw JSON</summary>", "", "```json",
                  json.dumps(outcome.result, indent=1, sort_keys=False), "```", "", "</details>"]
    if os.path.exists(RECORDED):
        with open(RECORDED, encoding="utf-8") as handle:
            lines += ["", "## Recorded by hand", "", handle.read().rstrip("\n")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=os.path.join(REPO, "docs", "benchmarks.md"))
    parser.add_argument("--only", nargs="*", help="run only these benchmarks (names without bench_)")
    parser.add_argument("--quick", action="store_true", help="reduced repetitions (smoke run)")
    args = parser.parse_args()
    scripts = sorted(glob.glob(os.path.join(REPO, "benchmarks", "bench_*.py")))
    order = {name: index for index, name in enumerate(PLAN)}
    named = sorted(((os.path.basename(s)[len("bench_"):-3], s) for s in scripts),
                   key=lambda item: (order.get(item[0], len(order)), item[0]))
    if args.only:
        named = [(name, script) for name, script in named if name in args.only]
    started = time.monotonic()
    _become_subreaper()
    info = machine()
    outcomes = []
    for name, script in named:
        full, quick = PLAN.get(name, ([], []))
        outcome = _run(name, script, quick if args.quick else full)
        if outcome.result is not None and not outcome.error:
            adapter: Callable[[dict[str, Any]], list[Section]] = ADAPTERS.get(name, generic)
            try:
                outcome.sections = adapter(outcome.result)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                outcome.sections = [*generic(outcome.result),
                                    Section("", notes=[f"(its figures changed shape: {type(exc).__name__} {exc})"])]
        outcomes.append(outcome)
        sys.stderr.write(f"bench: {name}: {'FAILED' if outcome.error else 'done'} in {outcome.seconds:.0f} s\n")
    total = time.monotonic() - started
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "") + (
        f" --only {' '.join(args.only)}" if args.only else "")
    text = render(outcomes, info, total, args.quick, command)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    temp = args.output + ".tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temp, args.output)
    failed = [o.name for o in outcomes if o.error]
    sys.stderr.write(f"bench: wrote {os.path.relpath(args.output)} in {total:.0f} s"
                     + (f"; FAILED: {', '.join(failed)}" if failed else "") + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
