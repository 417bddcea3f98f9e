"""``qinglong-edge inbox list|show|discard``: look at and discard inbox records.

Until a consumer of accepted offers exists, these commands let the operator see and
discard records (spec README, offer delivery gaps). They read
``worker.journalDirectory`` of the configuration.

* ``list``: offerId, state, runId, acceptedAtMs of every record (no lock needed:
  records change only by atomic link/rename, so a running ``pull`` is no problem).
* ``show OFFER_ID``: the record with the lease token replaced by ``"[redacted]"``.
* ``discard OFFER_ID --yes``: takes the owner lock (``already_owned``, exit 75, while a
  ``pull`` runs), unlinks the record and fsyncs ``offers/``. Without ``--yes`` it
  refuses (exit 64).

Exit statuses: 0 done; 64 usage (bad offerId, missing ``--yes``); 65 ``not_found``;
73/74 storage; 75 ``already_owned``; 78 no worker configuration.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from qinglong_edge.commands._output import emit, print_json

if TYPE_CHECKING:
    from qinglong_edge.config import WorkerConfig

REDACTED = "[redacted]"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "inbox",
        parents=[common],
        help="list, show or discard accepted offers in the worker journal",
        description="Inspect the worker journal's inbox (offers/<offerId>.json).",
    )
    actions = parser.add_subparsers(dest="inbox_action", metavar="ACTION", parser_class=type(parser))
    listing = actions.add_parser("list", parents=[common], help="one line per inbox record")
    listing.set_defaults(handler=_list)
    show = actions.add_parser("show", parents=[common], help="print one record (lease token redacted)")
    show.add_argument("offer_id", metavar="OFFER_ID")
    show.set_defaults(handler=_show)
    discard = actions.add_parser("discard", parents=[common], help="delete one record (needs --yes)")
    discard.add_argument("offer_id", metavar="OFFER_ID")
    discard.add_argument("--yes", action="store_true", help="really delete it")
    discard.set_defaults(handler=_discard)
    parser.set_defaults(handler=_usage)


def _usage(args: argparse.Namespace) -> int:
    from qinglong_edge.errors import UsageError

    raise UsageError("inbox needs an action: list, show OFFER_ID or discard OFFER_ID --yes")


def _worker_config(args: argparse.Namespace) -> WorkerConfig:
    from qinglong_edge.config import load_config
    from qinglong_edge.errors import ConfigError

    config = load_config(args.config)
    if config.worker is None:
        raise ConfigError("the configuration has no worker section (no journal)", path="$.worker")
    return config.worker


def _journal_root(args: argparse.Namespace) -> str:
    return _worker_config(args).journal_directory


def _check_offer_id(offer_id: str) -> str:
    from qinglong_edge.contracts.ids import JOURNAL_OFFER_ID
    from qinglong_edge.errors import UsageError

    if JOURNAL_OFFER_ID.fullmatch(offer_id) is None:
        raise UsageError("OFFER_ID must match [A-Za-z0-9._:-]{1,128}")
    return offer_id


def _not_found(offer_id: str) -> Exception:
    from qinglong_edge.errors import EdgeError

    return EdgeError(f"no inbox record {offer_id}", code="not_found")


def _record_document(record: Any) -> dict[str, Any]:
    """The record as JSON, lease token redacted (never print a capability)."""
    from qinglong_edge.contracts.journal_records import inbox_record_bytes

    document: dict[str, Any] = json.loads(inbox_record_bytes(record))
    offer = document.get("offer")
    if isinstance(offer, dict) and "leaseToken" in offer:
        offer["leaseToken"] = REDACTED
    return document


def _list(args: argparse.Namespace) -> int:
    from qinglong_edge.worker.journal import JournalReader

    root = _journal_root(args)
    rows: list[dict[str, Any]] = []
    if os.path.lexists(root):
        with JournalReader.open(root) as reader:
            for offer_id in reader.list_offers():
                record = reader.read_offer(offer_id)
                if record is None:  # discarded between the listing and the read
                    continue
                document = _record_document(record)
                rows.append({
                    "offerId": offer_id,
                    "state": document["state"],
                    "runId": document["offer"]["candidate"]["runId"],
                    "acceptedAtMs": document["acceptedAtMs"],
                })
    if args.json:
        print_json({"ok": True, "offers": rows})
        return 0
    if not rows:
        print("inbox: empty")
        return 0
    header = ("OFFER_ID", "STATE", "RUN_ID", "ACCEPTED_AT_MS")
    table = [header] + [(r["offerId"], r["state"], r["runId"], str(r["acceptedAtMs"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)))
    return 0


def _show(args: argparse.Namespace) -> int:
    from qinglong_edge.worker.journal import JournalReader

    offer_id = _check_offer_id(args.offer_id)
    root = _journal_root(args)
    if not os.path.lexists(root):
        raise _not_found(offer_id)
    with JournalReader.open(root) as reader:
        record = reader.read_offer(offer_id)
    if record is None:
        raise _not_found(offer_id)
    document = _record_document(record)
    if args.json:
        print_json({"ok": True, "record": document})
    else:
        print(json.dumps(document, indent=2, ensure_ascii=False))
    return 0


def _discard(args: argparse.Namespace) -> int:
    from qinglong_edge.errors import UsageError
    from qinglong_edge.worker.journal import Journal, JournalOptions

    offer_id = _check_offer_id(args.offer_id)
    if not args.yes:
        raise UsageError(f"discard deletes {offer_id} for good; add --yes to confirm")
    worker = _worker_config(args)
    root = worker.journal_directory
    if not os.path.lexists(root):
        raise _not_found(offer_id)
    with Journal.open(root, JournalOptions.from_config(worker)) as journal:
        removed = journal.discard_offer(offer_id)
    if not removed:
        raise _not_found(offer_id)
    emit(args.json, f"inbox: discarded {offer_id}", {"ok": True, "discarded": offer_id})
    return 0
