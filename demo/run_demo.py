#!/usr/bin/env python3
"""``make demo``: the whole qinglong-edge mission on this machine, one step at a time.

    python3 demo/run_demo.py [--root DIR]        (make demo == python3 demo/run_demo.py)

Needs Python >= 3.11 and the ``openssl`` CLI; uses ``curl`` when it is installed, else
``demo/minicurl.py`` (and says so). Nothing is installed: the agent runs from this
source tree (``PYTHONPATH=.``), standard library only.

What it does, printing every command before running it and what came back:

1. a throwaway PKI with openssl (cluster CA, server certificate, client CA, worker
   client certificate);
2. starts the cluster double (``demo/cluster.py``) as its own process: TLS 1.3 mutual TLS,
   two tasks queued (a shell task and a Python task that prints its progress);
3. provisions the worker device: the ``ql3w`` credential, client certificate and key,
   trust anchor (0600 files in 0700 directories) and the agent config, then ``doctor``;
4. runs ``qinglong-edge pull``: the first cycle accepts the shell task and executes it
   (its output uploaded, its completion applied at the cluster); the next loses its
   response (the cluster commits, then drops the connection); the one after replays it,
   gets it back as ``lease_recovery`` and stays resident while the Python task runs,
   until a cluster-side cancel stops that job (exit 143, ``cancelled`` at the cluster);
5. adds the Local API: ``admin`` creates the store, a project, an operator and a viewer
   with their credentials and a long-running task; starts ``serve``;
6. starts a Run with curl, reads it, lets the viewer try to cancel (403), cancels with
   the operator (202), replays (200), and shows the process gone and the Run ``cancelled``;
7. restarts ``serve``: the Run is still ``cancelled``;
8. stops everything it started.

State lives under ``--root`` (default ``./var/demo``), made fresh each run. The demo
removes that directory only when it carries the marker file it leaves there itself,
and removes nothing else; the state is kept afterwards for you to look at. Every
process it starts is stopped on every exit path (success, failure, Ctrl-C, SIGTERM).
Exit 0 when every step gave what it should, 1 when one did not, 130/143 when
interrupted.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import shutil
import signal
import sys
from types import FrameType
from typing import NoReturn

from console import Console
from context import MARKER, REPO
from local_steps import LocalSteps
from shell import DemoError
from worker_steps import WorkerSteps


class Interrupted(BaseException):
    """SIGINT / SIGTERM / SIGHUP arrived: unwind to the clean-up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, _frame: FrameType | None) -> NoReturn:
    raise Interrupted(signum)


class Demo(WorkerSteps, LocalSteps):
    """Every section, in order (:meth:`run`)."""

    def run(self) -> None:
        self.prepare()
        self.make_pki()
        self.start_cluster()
        self.provision_worker()
        self.pull_offers()
        self.setup_local()
        self.start_and_cancel()
        self.restart()
        self.finish()


def _prepare_root(root: pathlib.Path, console: Console, show: str) -> None:
    """Make ``root`` fresh; refuse to remove a directory the demo did not create."""
    if root.is_symlink():
        raise DemoError(f"{show} is a symlink; the demo will not use it")
    if root.exists():
        if not (root / MARKER).is_file():
            raise DemoError(f"{show} exists and was not made by the demo; move it away or choose --root")
        console.command(f"rm -rf {shlex.quote(show)}   # left by the previous demo run")
        shutil.rmtree(root)
    root.mkdir(parents=True, mode=0o700)
    (root / MARKER).write_text("made by demo/run_demo.py; `make demo` replaces this directory\n")
    (root / "logs").mkdir(mode=0o700)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo/run_demo.py", description="qinglong-edge end-to-end demo")
    parser.add_argument("--root", type=pathlib.Path, default=REPO / "var" / "demo",
                        help="state directory (default ./var/demo; replaced only if the demo made it)")
    args = parser.parse_args(argv)
    console = Console()
    if sys.version_info < (3, 11):  # noqa: UP036 - `python3` may be older than the code's target
        console.failure("Python >= 3.11 is required")
        return 1
    root = args.root.resolve()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    demo = Demo(root, console)
    status = 0
    try:
        demo.welcome()
        _prepare_root(root, console, demo.show_root)
        demo.run()
    except DemoError as exc:
        console.failure(f"demo failed: {exc}")
        console.failure(f"logs: {demo.rel(root / 'logs')}/ (cluster.log, serve-*.log)")
        status = 1
    except Interrupted as exc:
        console.failure(f"interrupted by {exc}: stopping what the demo started")
        status = 128 + exc.signum
    except BrokenPipeError:  # `make demo | head`: stop quietly, but still clean up
        console.stream = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
        status = 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        leftovers = demo.shell.stop_all()
        if leftovers:
            console.info("stopped: " + ", ".join(leftovers))
    if status == 0:
        console.banner("demo finished: every step gave what it should (exit 0)", [
            f"Everything it made is under ./{demo.show_root}/ (logs in {demo.show_root}/logs/);",
            f"`make demo` replaces it, `rm -rf {demo.show_root}` removes it. Look around, e.g.:",
            f"  export PYTHONPATH=$PWD QINGLONG_EDGE_CONFIG=$PWD/{demo.show_root}/agent/config.json",
            "  python3 -m qinglong_edge inbox list; python3 -m qinglong_edge admin runs list --project demo",
            "  python3 -m qinglong_edge serve   # then the status console on the URL it prints (see above)",
            "Next: README.md (install on a router or a Pi, configuration, the Local API with curl).",
        ])
    return status


if __name__ == "__main__":
    sys.exit(main())
