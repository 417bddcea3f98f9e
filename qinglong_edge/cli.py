"""Command line: parse arguments, load the config, run one command, map errors.

``qinglong-edge [--config PATH] [--json] COMMAND ...``

Each command group lives in :mod:`qinglong_edge.commands` and registers its own
sub-parser; a command module imports the layer it needs (``ssl``, ``sqlite3``,
``socket``...) only inside its ``run`` function, so ``--help`` and ``version`` stay
light on a router (spec README, layer 5; a test checks ``sys.modules``). The
cron-run ``pull`` in its plain spellings does not even import argparse
(:func:`qinglong_edge.commands.pull.plain_args`); anything else goes through argparse.

Exit statuses follow sysexits (spec README): 0 done, 64 usage, 65 invalid data,
69 unavailable, 73/74 storage, 75 temporary failure, 77 permission, 78 configuration.
Errors print one line ``qinglong-edge: <code>: <message>`` on stderr, or with
``--json`` one JSON object on stdout; never a traceback (set
``QINGLONG_EDGE_DEBUG=1`` to get one).
"""

from __future__ import annotations

import os
import sys

from qinglong_edge.errors import EX_SOFTWARE, EX_UNAVAILABLE, EX_USAGE, EdgeError, UsageError, exit_status_for

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]

PROG = "qinglong-edge"

#: Command groups, in help order: (module under qinglong_edge.commands).
COMMAND_MODULES: tuple[str, ...] = (
    "version",
    "doctor",
    "offer",
    "inbox",
    "admin",
    "config",
    "serve",
    "pull",
    "drain",
)


def _parser_class() -> type[argparse.ArgumentParser]:
    """argparse that raises instead of exiting, so usage errors map to 64.

    Made on demand: a plain ``pull`` never imports argparse (see
    :func:`qinglong_edge.commands.pull.plain_args`).
    """
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise _ArgumentError(message, self.format_usage())

    return _Parser


class _ArgumentError(UsageError):
    """argparse refused the command line (code ``usage``, exit 64); ``usage`` is its usage text."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


def _requested_command(argv: Sequence[str]) -> str | None:
    """The command named in ``argv`` (skipping the global options), or None."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            return None
        if arg == "--config":
            index += 2
            continue
        if not arg.startswith("-"):
            return arg if arg in COMMAND_MODULES else None
        index += 1
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Build the parser (imports only the light command modules).

    With ``argv`` naming a command, only that command's sub-parser is built in full;
    the others get empty stubs so argparse still knows every name. Building all of
    them (``admin`` alone has dozens of sub-commands) costs a cron-run ``pull`` tens
    of milliseconds on a router for nothing. Without a command (``--help``, a typo)
    every sub-parser is built, for the full help and the list of choices.
    """
    import argparse
    import importlib

    parser_class = _parser_class()
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="configuration file (default: $QINGLONG_EDGE_CONFIG or /etc/qinglong-edge/config.json)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print one machine-readable JSON line",
    )
    parser = parser_class(
        prog=PROG,
        description=(
            "QingLong 3.0 edge agent: a Remote Worker that pulls offers (ADR-0110) and a "
            "Local run API with authenticated cancellation (ADR-0372), for small devices."
        ),
        parents=[common],
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)
    wanted = None if argv is None else _requested_command(argv)
    for name in COMMAND_MODULES:
        if wanted is not None and name != wanted:
            subparsers.add_parser(name, add_help=False)
            continue
        module = importlib.import_module(f"qinglong_edge.commands.{name}")
        module.register(subparsers, common)
    return parser


#: The options accepted before the command (argparse also takes unique prefixes of them).
_GLOBAL_OPTIONS = ("--config", "--json", "--help", "--version")
_GLOBAL_VALUE_OPTIONS = ("--config",)


def _unknown_global_option(argv: Sequence[str]) -> str | None:
    """The first option before the command that is none of the global ones, or None.

    argparse would take ``--confg x doctor`` as an unknown option followed by the
    command ``x`` and complain about ``x`` ("invalid choice"), never naming the option
    the user mistyped (issue 18).
    """
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--" or not arg.startswith("-"):
            return None
        name = arg.split("=", 1)[0]
        if arg in ("-h",):
            return None
        matches = [option for option in _GLOBAL_OPTIONS if option.startswith(name)] if name.startswith("--") else []
        if len(matches) != 1:
            return name
        index += 2 if matches[0] in _GLOBAL_VALUE_OPTIONS and "=" not in arg else 1
    return None


def _version_flag(argv: Sequence[str]) -> list[str] | None:
    """``--version`` before the command is the ``version`` command (the other global
    options kept: ``--json --version`` prints the JSON line); None without it."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--" or not arg.startswith("-"):
            return None
        if arg == "--version":
            # What follows is ignored, as ``git --version anything`` does, but --json.
            rest = ["--json"] if "--json" in argv[index + 1 :] else []
            return [*argv[:index], *rest, "version"]
        index += 2 if arg == "--config" else 1
    return None


def _plain_args(argv: Sequence[str]) -> argparse.Namespace | None:
    """The cron-run ``pull`` without argparse (:func:`qinglong_edge.commands.pull.plain_args`),
    else None."""
    if _requested_command(argv) != "pull":
        return None
    from qinglong_edge.commands.pull import plain_args

    return plain_args(argv)


def _print_error(json_mode: bool, code: str, message: str, status: int) -> None:
    if json_mode:
        from qinglong_edge.commands._output import print_json

        print_json({"ok": False, "code": code, "message": message, "exitStatus": status})
    else:
        print(f"{PROG}: {code}: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return the exit status (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in args_list
    try:
        version = _version_flag(args_list)
        if version is not None:
            args_list = version
        args = _plain_args(args_list)
        if args is None:
            parser = build_parser(args_list)
            unknown = _unknown_global_option(args_list)
            if unknown is not None:
                import difflib

                close = difflib.get_close_matches(unknown, _GLOBAL_OPTIONS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise _ArgumentError(f"unknown option {unknown}{hint}: options before the command are "
                                     f"{', '.join(_GLOBAL_OPTIONS)}", parser.format_usage())
            args = parser.parse_args(args_list)
            # Defaults are applied here, not with set_defaults: argparse shares the
            # parent's action objects with every sub-parser, so a default set on one
            # would overwrite a value given before the sub-command.
            for name, default in (("config", None), ("json", False)):
                if not hasattr(args, name):
                    setattr(args, name, default)
            if getattr(args, "handler", None) is None:
                if json_mode:  # --json promises one JSON line, not the help text
                    _print_error(True, "usage", "a command is required", EX_USAGE)
                else:
                    parser.print_help()
                return EX_USAGE
        status: int = args.handler(args)
        return status
    except _ArgumentError as exc:
        if json_mode:
            _print_error(True, exc.code, exc.message, exit_status_for(exc))
        else:
            sys.stderr.write(exc.usage)
            print(f"{PROG}: usage: {exc.message}", file=sys.stderr)
        return exit_status_for(exc)
    except EdgeError as exc:
        if os.environ.get("QINGLONG_EDGE_DEBUG") == "1":
            raise
        status = exit_status_for(exc)
        _print_error(json_mode, exc.code, exc.message, status)
        return status
    except ModuleNotFoundError as exc:
        # A router whose Python lacks a split package (python3-sqlite3, python3-openssl...):
        # name the module, so the operator knows what to install.
        if os.environ.get("QINGLONG_EDGE_DEBUG") == "1":
            raise
        name = exc.name or "?"
        _print_error(json_mode, "module_missing",
                     f"the Python module {name!r} is not installed (on OpenWrt: opkg install the "
                     "python3 package that provides it; `qinglong-edge doctor` checks the rest)",
                     EX_UNAVAILABLE)
        return EX_UNAVAILABLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EX_SOFTWARE
    except Exception as exc:  # last resort: no traceback to a user
        if os.environ.get("QINGLONG_EDGE_DEBUG") == "1":
            raise
        _print_error(json_mode, "internal_error", type(exc).__name__, EX_SOFTWARE)
        return EX_SOFTWARE


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
