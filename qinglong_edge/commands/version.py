"""``qinglong-edge version``: print the version (imports nothing heavy)."""

from __future__ import annotations

import argparse
import platform

from qinglong_edge import __version__
from qinglong_edge.commands._output import emit


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("version", parents=[common], help="print the version")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    emit(
        args.json,
        f"qinglong-edge {__version__} (Python {platform.python_version()})",
        {"ok": True, "version": __version__, "python": platform.python_version()},
    )
    return 0
