"""Set up one idle ``pull`` cycle per tree, to compare a change with an earlier commit.

    git worktree add /path/old REV
    python benchmarks/idle_pull_pair.py WORK . /path/old   # prints {"a": argv, "b": argv}; Enter stops it

Each tree gets its own cluster double (``tests.support.cluster_double`` from this checkout,
no tasks queued) and its own launcher copy (``packaging/files/launcher`` of that tree, the
package linked in as ``lib/qinglong-edge``), so neither side's session replaces the other's.
Both cycles are run twice (session registered, claim kept); then time the two printed
argvs in alternation with a whole-process timer and count instructions with
``valgrind --tool=callgrind`` (benchmarks/recorded.md). The launcher writes no ``.pyc``:
byte-compile both trees first (``python -m compileall -q TREE/qinglong_edge``) or the side
without them pays for compiling on every run.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    work, new, old = (pathlib.Path(arg).resolve() for arg in sys.argv[1:4])
    doubles = []
    argvs = {}
    try:
        for side, tree in (("a", new), ("b", old)):
            root = work / side
            root.mkdir(parents=True, exist_ok=True)
            double = subprocess.Popen([sys.executable, "-m", "tests.support.cluster_double", "--state-dir",
                                       str(root / "cluster"), "--tasks", ""], stdout=subprocess.PIPE, cwd=REPO)
            doubles.append(double)
            assert double.stdout is not None
            info = json.loads(double.stdout.readline())
            config = json.loads(pathlib.Path(info["configFile"]).read_text())
            config["worker"].update({"sessionLeaseDurationMs": 600_000, "heartbeatIntervalMs": 300_000})
            (root / "config.json").write_text(json.dumps(config))
            (root / "bin").mkdir(exist_ok=True)
            (root / "lib" / "qinglong-edge").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / "packaging" / "files" / "launcher", root / "bin" / "qinglong-edge")
            link = root / "lib" / "qinglong-edge" / "qinglong_edge"
            if not link.exists():
                link.symlink_to(tree / "qinglong_edge")
            argv = [sys.executable, "-S", str(root / "bin" / "qinglong-edge"), "pull", "--config",
                    str(root / "config.json"), "--no-splay"]
            for _ in range(2):
                subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd="/")
            argvs[side] = argv
        print(json.dumps(argvs), flush=True)
        sys.stdin.readline()
    finally:
        for double in doubles:
            double.terminate()
            double.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
