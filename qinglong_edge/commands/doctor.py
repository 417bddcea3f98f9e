"""``qinglong-edge doctor``: check this device for everything the agent relies on."""

from __future__ import annotations

import argparse

from qinglong_edge.commands._output import print_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "doctor",
        parents=[common],
        help="check Python, TLS 1.3, SQLite, storage, locks, cgroups and clock",
        description="Run real probes in the configured directories; exit 0 only when "
        "every required check passes (69 otherwise).",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from qinglong_edge.config import load_config
    from qinglong_edge.doctor import run_checks

    config = load_config(args.config)
    checks = run_checks(config)
    failed_required = [c for c in checks if c.required and not c.ok]
    if args.json:
        print_json({"ok": not failed_required, "checks": [c.to_json() for c in checks]})
    else:
        width = max(len(c.name) for c in checks)
        for check in checks:
            tag = "ok  " if check.ok else ("FAIL" if check.required else "warn")
            line = f"{tag} {check.name:<{width}}  {check.detail}"
            if not check.ok and check.remedy:
                line += f"  -> {check.remedy}"
            print(line)
        verdict = "all required checks passed" if not failed_required else (
            f"{len(failed_required)} required check(s) failed"
        )
        print(f"doctor: {verdict}")
    return 0 if not failed_required else 69
