"""Benchmark: fsyncs and bytes written per accepted offer by the worker journal.

    python benchmarks/bench_journal.py [--offers N] [--repetitions R] [--dir DIR]

One accepted offer is what the journal does for a pull that is offered work, on golden
vector A: claim create, accept (inbox record, 1 584 bytes), claim clear. (The attempt is
marked in the RAM runtime directory before the request, not written to the claim: spec
README "Decisions for storage on flash"; only an attempt of unknown outcome found at the
next start rewrites the claim.)
The baseline, in the same run, is the least any durable store must do: one
``write`` + ``fsync`` of the same 1 584-byte record into a new file.

Measured in child processes, so nothing else is counted:

* syscalls (``fsync``, ``write``...): ``strace -f -c`` of a child that runs N cycles,
  minus a child that runs 0 (opening the journal: lock, probe, directories), / N.
  Counts are deterministic, so one traced run per N is enough.
* bytes: ``/proc/self/io`` deltas around the loop inside the child: ``wchar`` (bytes
  passed to write()/pwrite(), the "bytes written" of the target) and ``write_bytes``
  (bytes of page cache dirtied for the block layer: page granular).
* time: ``time.perf_counter`` around the loop, untraced, median of R repetitions.

Targets (issue 4): at most 5 fsyncs and at most 2x the record size written per
accepted offer. Reported, never asserted. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

TRACED = "fsync,fdatasync,write,pwrite64,linkat,renameat,renameat2,unlinkat,openat"
FSYNC_TARGET = 5
BYTES_RATIO_TARGET = 2.0


def _io() -> dict[str, int]:
    with open("/proc/self/io", encoding="ascii") as handle:
        return {key: int(value) for key, value in (line.split(": ") for line in handle)}


def _child(mode: str, count: int, directory: str) -> None:
    """Run ``count`` units of work and print the /proc/self/io deltas and time."""
    # Imported here: the parent process measures nothing of ours.
    from qinglong_edge.contracts.journal_records import PendingClaim  # noqa: PLC0415
    from qinglong_edge.worker.journal.store import Journal, JournalOptions  # noqa: PLC0415
    from tests.worker import offer_vectors as vectors  # noqa: PLC0415

    offers = [{**vectors.offer(), "offerId": f"offer-{i}"} for i in range(count)]
    claims = [PendingClaim.create(vectors.authority(f"offer-{i}"), 1000) for i in range(count)]
    record_size = len(vectors.OFFER_RECORD_T1001)
    if mode == "journal":
        journal = Journal.open(os.path.join(directory, "worker"), JournalOptions(maximum_entries=1024))
        before, start = _io(), time.perf_counter()
        for claim, offer in zip(claims, offers, strict=True):
            journal.create_claim(claim)
            journal.accept_offer(offer, 1001)
            journal.clear_claim(claim.offer_id, claim.revision)
        elapsed, after = time.perf_counter() - start, _io()
        journal.close()
    else:  # baseline: one write + fsync of the same record into a new file
        data = vectors.OFFER_RECORD_T1001
        before, start = _io(), time.perf_counter()
        for i in range(count):
            fd = os.open(os.path.join(directory, f"offer-{i}.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
        elapsed, after = time.perf_counter() - start, _io()
    sys.stdout.write(json.dumps({
        "seconds": elapsed,
        "wchar": after["wchar"] - before["wchar"],
        "write_bytes": after["write_bytes"] - before["write_bytes"],
        "record_size": record_size,
    }) + "\n")


def _run_child(mode: str, count: int, base: str, strace: str | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    directory = tempfile.mkdtemp(prefix=f"bench-{mode}-", dir=base)
    os.chmod(directory, 0o700)
    argv = [sys.executable, os.path.abspath(__file__), "--child", mode, str(count), directory]
    summary = os.path.join(base, f"strace-{mode}-{count}.txt")
    if strace:
        argv = [strace, "-f", "-c", "-e", f"trace={TRACED}", "-o", summary, *argv]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run(argv, capture_output=True, check=True, env=env, timeout=600)
        result: dict[str, Any] = json.loads(proc.stdout.decode().splitlines()[-1])
        calls = _parse_strace_summary(summary) if strace else {}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if strace and os.path.exists(summary):
            os.unlink(summary)
    return result, calls


def _parse_strace_summary(path: str) -> dict[str, int]:
    """``strace -c`` table: syscall -> calls (errors included)."""
    calls = {}
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = handle.readlines()
    for line in lines:
        fields = line.split()
        if len(fields) >= 5 and re.fullmatch(r"[\d.]+", fields[0]) and fields[-1].isidentifier():
            calls[fields[-1]] = int(fields[3])
    return calls


def _per_unit(with_n: dict[str, int], with_zero: dict[str, int], n: int) -> dict[str, float]:
    names = sorted(set(with_n) | set(with_zero))
    return {name: (with_n.get(name, 0) - with_zero.get(name, 0)) / n for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--offers", type=int, default=20, help="accepted offers per repetition (<= 1024)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to create the journals (default: a temp dir)")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "N", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]), args.child[2])
        return 0

    n = args.offers
    base = tempfile.mkdtemp(prefix="qinglong-edge-bench-", dir=args.dir)
    os.chmod(base, 0o700)
    try:
        strace = shutil.which("strace")
        calls: dict[str, dict[str, float]] = {}
        if strace:
            for mode in ("journal", "baseline"):
                _, zero = _run_child(mode, 0, base, strace)
                _, full = _run_child(mode, n, base, strace)
                calls[mode] = _per_unit(full, zero, n)
        runs: dict[str, list[dict[str, Any]]] = {"journal": [], "baseline": []}
        for _ in range(args.repetitions):
            for mode in ("journal", "baseline"):
                runs[mode].append(_run_child(mode, n, base)[0])
    finally:
        shutil.rmtree(base, ignore_errors=True)

    record_size = runs["journal"][0]["record_size"]

    def median(mode: str, key: str, scale: float = 1.0) -> float:
        return statistics.median(run[key] * scale / n for run in runs[mode])

    journal_fsyncs = calls.get("journal", {}).get("fsync")
    journal_wchar = median("journal", "wchar")
    report = {
        "benchmark": "journal_fsync_and_bytes_per_accepted_offer",
        "command": " ".join([os.path.basename(sys.executable), "benchmarks/bench_journal.py",
                             f"--offers {n}", f"--repetitions {args.repetitions}"]),
        "filesystem_dir": args.dir or tempfile.gettempdir(),
        "unit_of_work": "claim create + attempt + accept + clear of one 1584-byte inbox record",
        "offers_per_repetition": n,
        "repetitions": args.repetitions,
        "record_size_bytes": record_size,
        "syscalls_per_offer": calls or "strace not installed",
        "journal": {
            "fsyncs_per_offer": journal_fsyncs,
            "write_syscall_bytes_per_offer_median": journal_wchar,
            "dirtied_page_bytes_per_offer_median": median("journal", "write_bytes"),
            "ms_per_offer_median": median("journal", "seconds", 1000.0),
        },
        "baseline_single_write_fsync": {
            "fsyncs_per_offer": calls.get("baseline", {}).get("fsync"),
            "write_syscall_bytes_per_offer_median": median("baseline", "wchar"),
            "dirtied_page_bytes_per_offer_median": median("baseline", "write_bytes"),
            "ms_per_offer_median": median("baseline", "seconds", 1000.0),
        },
        "ratios_journal_over_baseline": {
            "ms_per_offer": _ratio(median("journal", "seconds"), median("baseline", "seconds")),
            "write_syscall_bytes": _ratio(journal_wchar, median("baseline", "wchar")),
            "dirtied_page_bytes": _ratio(median("journal", "write_bytes"), median("baseline", "write_bytes")),
        },
        "targets": {
            "fsyncs_per_offer_max": FSYNC_TARGET,
            "fsyncs_met": None if journal_fsyncs is None else journal_fsyncs <= FSYNC_TARGET,
            "bytes_written_over_record_size": round(journal_wchar / record_size, 3),
            "bytes_written_max_ratio": BYTES_RATIO_TARGET,
            "bytes_met": journal_wchar <= BYTES_RATIO_TARGET * record_size,
        },
        "units": {"bytes": "bytes", "ms": "milliseconds (wall, perf_counter)", "fsyncs": "calls"},
    }
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


def _ratio(a: float, b: float) -> float | None:
    return None if not b else round(a / b, 3)


if __name__ == "__main__":
    sys.exit(main())
