"""The demo's long-running Local job: prints its progress, stops cleanly on SIGTERM.

    python3 -u demo/progress_job.py [--steps N] [--interval S] [--pid-file PATH]

Prints ``progress <step>/<N>`` every ``S`` seconds (its Run log shows them), writes its
pid to ``--pid-file`` first (so the demo can show that this very process is gone after
the cancellation), and on SIGTERM prints which step it was at and exits 143, as a
well-behaved job does when the execution controller asks it to stop.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="progress_job.py")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between steps")
    parser.add_argument("--pid-file", help="write this process's pid here first")
    args = parser.parse_args(argv)
    step = 0

    def on_term(signum: int, _frame: FrameType | None) -> None:
        print(f"got {signal.Signals(signum).name} at step {step}/{args.steps}: stopping cleanly", flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    if args.pid_file:
        with open(args.pid_file, "w", encoding="ascii") as handle:
            handle.write(f"{os.getpid()}\n")
    for step in range(1, args.steps + 1):
        print(f"progress {step}/{args.steps}", flush=True)
        time.sleep(args.interval)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
