"""``qinglong-edge offer check --claim CLAIM.json RESPONSE.json``: why was a response refused?

Validates a control-plane offer-pull response body against a pending-claim record
(ADR-0110 section 2.6, through :func:`qinglong_edge.contracts.offer.parse_offer_response`)
and prints one verdict line:

* ``valid idle <reason>`` / ``valid offered <offerId> <runId>`` -> exit 0;
* ``invalid <reason-code> <json-path>`` -> exit 65.

With ``--json``: ``{"ok": true, "verdict": "valid", "status": "idle", "reason": ...}``,
``{"ok": true, "verdict": "valid", "status": "offered", "offerId": ..., "runId": ...}``
or ``{"ok": false, "verdict": "invalid", "code": ..., "path": ...}``.

No configuration file is needed. An unreadable file is ``input_unreadable`` (exit 66);
an invalid claim file is reported through the error tree with its own code (exit 65),
never as a verdict on the response. Nothing secret is printed (no token, no body).
"""

from __future__ import annotations

import argparse

from qinglong_edge.commands._output import emit

EX_DATAERR = 65


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "offer",
        parents=[common],
        help="inspect offer-pull responses (ADR-0110)",
        description="Offer delivery tools.",
    )
    actions = parser.add_subparsers(dest="offer_command", metavar="ACTION")
    check = actions.add_parser(
        "check",
        parents=[common],
        help="validate a response body against a pending-claim record",
        description="Validate RESPONSE.json (a 200 offer-pull body) against CLAIM.json (a "
        "pending-claim.json record). Prints 'valid idle <reason>', 'valid offered <offerId> "
        "<runId>' (exit 0) or 'invalid <reason-code> <json-path>' (exit 65).",
    )
    check.add_argument("--claim", metavar="CLAIM.json", required=True, help="the pending-claim record")
    check.add_argument("response", metavar="RESPONSE.json", help="the response body, byte for byte")
    check.set_defaults(handler=_check)
    parser.set_defaults(handler=_usage(parser))


def _usage(parser: argparse.ArgumentParser) -> object:
    def handler(args: argparse.Namespace) -> int:
        from qinglong_edge.errors import UsageError

        raise UsageError("offer needs an action: check")

    return handler


def _read(path: str, limit: int, what: str) -> bytes:
    """Read at most ``limit + 1`` bytes: enough to tell "too large" without reading a huge file."""
    from qinglong_edge.errors import UsageError

    try:
        with open(path, "rb") as handle:
            return handle.read(limit + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"cannot read the {what} file {path!r}: {reason}", code="input_unreadable") from None


def _check(args: argparse.Namespace) -> int:
    from qinglong_edge.contracts.errors import ContractError
    from qinglong_edge.contracts.journal_records import MAX_RECORD_BYTES, parse_pending_claim
    from qinglong_edge.contracts.offer import OFFER_RESPONSE_MAX_BYTES, IdleResponse, parse_offer_response

    claim_bytes = _read(args.claim, MAX_RECORD_BYTES, "claim")
    response_bytes = _read(args.response, OFFER_RESPONSE_MAX_BYTES, "response")
    try:
        claim = parse_pending_claim(claim_bytes)
    except ContractError as exc:
        raise ContractError(exc.code, exc.path, "the claim file is not a valid pending claim") from None
    try:
        result = parse_offer_response(response_bytes, claim.authority)
    except ContractError as exc:
        emit(args.json, f"invalid {exc.code} {exc.path}",
             {"ok": False, "verdict": "invalid", "code": exc.code, "path": exc.path})
        return EX_DATAERR
    if isinstance(result, IdleResponse):
        emit(args.json, f"valid idle {result.reason}",
             {"ok": True, "verdict": "valid", "status": "idle", "reason": result.reason})
    else:
        emit(args.json, f"valid offered {result.offer_id} {result.run_id}",
             {"ok": True, "verdict": "valid", "status": "offered", "offerId": result.offer_id,
              "runId": result.run_id})
    return 0
