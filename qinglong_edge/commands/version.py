"""``qinglong-edge version``: print the version (imports nothing heavy)."""

from __future__ import annotations

import argparse
import sys

from qinglong_edge import __version__
from qinglong_edge.commands._output import emit


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("version", parents=[common], help="print the version")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    emit(
        args.json,
        f"qinglong-edge {__version__} (Python {_python_version()})",
        {"ok": True, "version": __version__, "python": _python_version()},
    )
    return 0



def _python_version() -> str:
    """``platform.python_version()`` (which parses ``sys.version`` the same way) without
    importing :mod:`platform` for every command."""
    return sys.version.split()[0]
