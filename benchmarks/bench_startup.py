"""Benchmark: what ``qinglong-edge --help`` and ``version`` cost over a bare interpreter.

    python benchmarks/bench_startup.py [--runs N] [--site]

Every command runs as a whole child process of this script, interleaved, N times each
(default 30), through the router's launcher (``packaging/files/launcher`` with the
package linked in as ``lib/qinglong-edge``, as ``bench_pull`` does):

* ``bare``: ``python -I -S -c pass`` -- the baseline: an interpreter that does nothing;
* ``help``: ``python -I -S bin/qinglong-edge --help``;
* ``version``: ``python -I -S bin/qinglong-edge version``.

Per child: ``os.wait4`` gives CPU (``ru_utime + ru_stime``, ms) and peak RSS
(``ru_maxrss``, KiB); wall time by ``time.perf_counter``. Medians, and ratios to
``bare``. ``-S`` (no :mod:`site`) on every side by default: the development venv's
``.pth`` files (editable-install finder, coverage hook, setuptools shim) would add about
2 MiB and 15 ms to each side and do not exist on a router; ``--site`` measures with
site (``python -I``, the issue's literal baseline) as well.

Import set (one probe child per command): the modules in ``sys.modules`` after the
command minus those of the bare interpreter; ``heavy`` lists the ones the lazy-import
rule forbids for these commands (issue 2: ``ssl``, ``sqlite3``, ``socket``, ``http``,
``subprocess``). ``-X importtime`` gives the largest cumulative imports.

Targets: ``heavy`` empty for both commands (issue 2). No issue sets a number for the
ratios; they are reported for the record. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
_PR_SET_CHILD_SUBREAPER = 36
SUBREAPER = False
HEAVY = ("ssl", "_ssl", "sqlite3", "_sqlite3", "socket", "_socket", "http", "subprocess")

PROBE = r'''
import json, sys
lib = sys.argv.pop(1)
before = set(sys.modules)
if lib:
    sys.path.insert(0, lib)
    from qinglong_edge.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
sys.stderr.write("MODULES=" + json.dumps(sorted(sys.modules)) + "\n")
'''


def _env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_EDGE_", "PYTHON"))}


def _become_subreaper() -> bool:
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _measure(argv: list[str]) -> dict[str, float]:
    """CPU, peak RSS and wall time of one run of ``argv``.

    A process's ``ru_maxrss`` starts from the RSS of the process it was forked from
    (``execve`` keeps the old address space's high-water mark), so a command forked by
    this script (~15 MiB) would never report less than that. With :data:`SUBREAPER`
    the command is forked by a small ``/bin/sh`` that exits at once; the orphan is
    re-parented to this process (``PR_SET_CHILD_SUBREAPER``) and ``wait4`` gives its own
    rusage. Both sides pay the same ``sh`` start in wall time (not in CPU or RSS).
    """
    started = time.perf_counter()
    if SUBREAPER:
        shell = subprocess.Popen(["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 & echo $!', "sh", *argv],
                                 stdout=subprocess.PIPE, env=_env(), cwd="/")
        assert shell.stdout is not None
        pid = int(shell.stdout.read())
        shell.stdout.close()
        shell.wait()
    else:
        pid = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), cwd="/").pid
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{argv} exited {code}")
    return {"cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000, "maxrss_kib": float(usage.ru_maxrss),
            "wall_ms": wall * 1000}


def _modules(flags: list[str], lib: str, argv: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, *flags, "-c", PROBE, lib, *argv], capture_output=True, text=True,
                          env=_env(), cwd="/", check=False)
    line = [text for text in proc.stderr.splitlines() if text.startswith("MODULES=")]
    if not line:
        raise SystemExit(f"module probe failed: {proc.stderr[-2000:]}")
    names: list[str] = json.loads(line[-1][len("MODULES="):])
    return names


def _import_time(flags: list[str], launcher: str, argv: list[str], top: int = 8) -> list[dict[str, Any]]:
    """The largest cumulative imports (``-X importtime``), outermost entries only."""
    proc = subprocess.run([sys.executable, *flags, "-X", "importtime", launcher, *argv], capture_output=True,
                          text=True, env=_env(), cwd="/", check=False)
    rows = []
    for line in proc.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if match and len(match.group(3)) <= 1:
            rows.append({"module": match.group(4), "cumulative_us": int(match.group(2))})
    return sorted(rows, key=lambda row: -row["cumulative_us"])[:top]


def _summary(samples: list[dict[str, float]]) -> dict[str, float]:
    return {f"{key}_median": round(statistics.median(s[key] for s in samples), 2) for key in samples[0]}


def _side(flags: list[str], launcher: str, lib: str, runs: int) -> dict[str, Any]:
    commands = {
        "bare": [sys.executable, *flags, "-c", "pass"],
        "help": [sys.executable, *flags, launcher, "--help"],
        "version": [sys.executable, *flags, launcher, "version"],
    }
    for argv in commands.values():
        _measure(argv)  # warm-up (page cache, .pyc)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            samples[name].append(_measure(argv))
    shown = {launcher: "<tmp>/bin/qinglong-edge"}
    result: dict[str, Any] = {"flags": " ".join(flags), "commands": {
        name: " ".join(["python", *(shown.get(a, a) for a in argv[1:])]) for name, argv in commands.items()}}
    bare = _summary(samples["bare"])
    result["bare"] = bare
    bare_modules = set(_modules(flags, "", []))
    for name, argv in (("help", ["--help"]), ("version", ["version"])):
        summary = _summary(samples[name])
        modules = set(_modules(flags, lib, argv))
        added = sorted(modules - bare_modules)
        result[name] = summary | {
            "ratios": {key: round(summary[f"{key}_median"] / bare[f"{key}_median"], 3)
                       for key in ("cpu_ms", "maxrss_kib", "wall_ms") if bare[f"{key}_median"] > 0},
            "modules_added": len(added),
            "our_modules": len([m for m in added if m.split(".")[0] == "qinglong_edge"]),
            "stdlib_top_level_added": sorted({m.split(".")[0] for m in added} - {"qinglong_edge"}),
            "heavy": sorted(m for m in added if m.split(".")[0] in HEAVY),
            "largest_imports": _import_time(flags, launcher, argv),
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="measured runs of each command (default 30)")
    parser.add_argument("--site", action="store_true", help="also measure with site (python -I)")
    args = parser.parse_args()
    global SUBREAPER
    SUBREAPER = _become_subreaper()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        (work / "bin").mkdir()
        package_root = work / "lib" / "qinglong-edge"
        package_root.mkdir(parents=True)
        (package_root / "qinglong_edge").symlink_to(REPO / "qinglong_edge")
        launcher = work / "bin" / "qinglong-edge"
        shutil.copyfile(REPO / "packaging" / "files" / "launcher", launcher)
        sides = {"no_site": _side(["-I", "-S"], str(launcher), str(package_root), args.runs)}
        if args.site:
            sides["site"] = _side(["-I"], str(launcher), str(package_root), args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    main_side = sides["no_site"]
    result: dict[str, Any] = {
        "benchmark": "startup_help_version_vs_bare_interpreter",
        "command": "python benchmarks/bench_startup.py" + (f" --runs {args.runs}" if args.runs != 30 else "")
        + (" --site" if args.site else ""),
        "python": sys.version.split()[0],
        "runs": args.runs,
        "maxrss_method": "wait4 of a grandchild forked by /bin/sh (child subreaper)" if SUBREAPER
        else "wait4 of the child: an upper bound (includes this script's RSS at fork)",
        "units": {"cpu_ms": "ms user+sys of the child (wait4)", "maxrss_kib": "KiB peak RSS of the child",
                  "wall_ms": "ms", "largest_imports": "cumulative us (-X importtime)"},
        **sides,
        "targets": {"heavy_modules": "none for --help and version (issue 2)"},
        "met": {"heavy_modules": not main_side["help"]["heavy"] and not main_side["version"]["heavy"]
                and all(not side[c]["heavy"] for side in sides.values() for c in ("help", "version"))},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
