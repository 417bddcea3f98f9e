"""``qinglong-edge doctor [--placement JSON]``: check this device for everything the agent relies on.

With the worker role it also prints what the device advertises (the capabilities
file, or the probes: :mod:`qinglong_edge.worker.delivery.capabilities`) and, for a placement
given with ``--placement`` (a task's ``placement`` object), whether the reference's
rules would place that task here (:mod:`qinglong_edge.contracts.placement_decision`,
assuming an online session with a free slot). Diagnostics only: the cluster decides,
and the device runs whatever it claimed. An unreadable ``--placement`` is a usage error
(64); the placement's verdict never changes the exit status.
"""

from __future__ import annotations

import argparse
from typing import Any

from qinglong_edge.commands._output import print_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "doctor",
        parents=[common],
        help="check Python, TLS 1.3, SQLite, storage, locks, cgroups and clock; show the advertisement",
        description="Run real probes in the configured directories; exit 0 only when "
        "every required check passes (69 otherwise). With the worker role, print what the device "
        "advertises and, with --placement, whether a task with that placement would be placed here.",
    )
    parser.add_argument("--placement", metavar="JSON",
                        help="a task's placement object, e.g. '{\"required\":{\"minMemoryBytes\":67108864}}'")
    parser.set_defaults(handler=_run)


def _placement(text: str | None) -> object | None:
    if text is None:
        return None
    from qinglong_edge.contracts.strictjson import StrictJsonError, loads
    from qinglong_edge.errors import UsageError

    try:
        value: object = loads(text.encode("utf-8", "surrogatepass"), max_bytes=64 * 1024)
    except StrictJsonError as exc:
        raise UsageError(f"--placement: not strict JSON ({exc.code}: {exc.detail})") from None
    return value


def _decide(advert: object, placement: object) -> dict[str, Any]:
    from qinglong_edge.contracts.errors import ContractError
    from qinglong_edge.contracts.placement_decision import evaluate_placement
    from qinglong_edge.errors import UsageError

    try:
        return evaluate_placement(getattr(advert, "capabilities", None), placement).to_json()
    except ContractError as exc:
        raise UsageError(f"--placement: {exc.path}: {exc.detail} ({exc.code})") from None


def _run(args: argparse.Namespace) -> int:
    from qinglong_edge.config import load_config
    from qinglong_edge.doctor import check_capabilities, run_checks

    placement = _placement(getattr(args, "placement", None))
    config = load_config(args.config)
    checks = run_checks(config)
    advert = None
    if config.worker is not None and any(c.name == "capabilities" and c.ok for c in checks):
        advert = check_capabilities(config.worker)[1]
    decision = None if placement is None or advert is None else _decide(advert, placement)
    failed_required = [c for c in checks if c.required and not c.ok]
    if args.json:
        out: dict[str, object] = {"ok": not failed_required, "checks": [c.to_json() for c in checks]}
        if advert is not None:
            out["advertisement"] = advert.to_json()
        if decision is not None:
            out["placement"] = decision
        print_json(out)
    else:
        width = max(len(c.name) for c in checks)
        for check in checks:
            tag = "ok  " if check.ok else ("FAIL" if check.required else "warn")
            line = f"{tag} {check.name:<{width}}  {check.detail}"
            if not check.ok and check.remedy:
                line += f"  -> {check.remedy}"
            print(line)
        if advert is not None:
            print(f"advertises: {advert.json}")
        if decision is not None:
            if decision["matches"]:
                print(f"placement: would be placed here (score {decision['score']})")
            else:
                print(f"placement: would not be placed here: {', '.join(decision['mismatches'])} "
                      f"(score {decision['score']}; diagnostics only: the cluster decides)")
        elif placement is not None:
            print("placement: not evaluated (no worker role, or the capabilities check failed)")
        verdict = "all required checks passed" if not failed_required else (
            f"{len(failed_required)} required check(s) failed"
        )
        print(f"doctor: {verdict}")
    return 0 if not failed_required else 69
