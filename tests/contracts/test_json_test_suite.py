"""JSONTestSuite (../shared/corpora/JSONTestSuite) through strict JSON and every body parser.

``n_*`` must be rejected; ``y_*``/``i_*`` follow ``expectations.tsv`` (``strict_expect``).
Rows marked ``policy`` (underflow to 0.0, integers beyond 64 bits) are rejected by our
decision (spec README: integers beyond 2^53-1 are rejected; underflow loses the value).
Every file is also fed to the offer, cancellation, task-start, session and journal
parsers: they return or raise ContractError, nothing else.
"""

from __future__ import annotations

import csv
import pathlib

import pytest

from qinglong_edge.contracts.cancellation import (
    decode_local_api_body,
    parse_run_cancellation_request,
    parse_task_start_request,
)
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.journal_records import parse_inbox_record, parse_pending_claim
from qinglong_edge.contracts.offer import parse_offer_response
from qinglong_edge.contracts.session import parse_register_response
from qinglong_edge.contracts.strictjson import StrictJsonError, loads
from tests.conftest import corpora_dir
from tests.contracts import vector_a as va


def _cases() -> list[tuple[str, str]]:
    root = corpora_dir() / "JSONTestSuite"
    with open(root / "expectations.tsv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return [(row["file"], row["strict_expect"]) for row in rows]


CASES = _cases()


def _data(corpora: pathlib.Path, name: str) -> bytes:
    return (corpora / "JSONTestSuite" / "test_parsing" / name).read_bytes()


def test_the_corpus_is_complete(corpora: pathlib.Path) -> None:
    files = sorted(p.name for p in (corpora / "JSONTestSuite" / "test_parsing").iterdir())
    assert sorted(name for name, _ in CASES) == files
    assert len(files) == 318
    assert sum(name.startswith("n_") for name in files) == 188


@pytest.mark.parametrize(("name", "expect"), CASES, ids=[name for name, _ in CASES])
def test_strict_json_verdict(corpora: pathlib.Path, name: str, expect: str) -> None:
    data = _data(corpora, name)
    if name.startswith("n_"):
        assert expect == "reject"
    try:
        loads(data, max_bytes=1 << 20)
        verdict = "accept"
    except StrictJsonError:
        verdict = "reject"
    assert verdict == ("reject" if expect == "policy" else expect)


@pytest.mark.parametrize(("name", "expect"), CASES, ids=[name for name, _ in CASES])
def test_every_parser_returns_or_raises_contract_error(corpora: pathlib.Path, name: str, expect: str) -> None:
    data = _data(corpora, name)
    parsers = (
        lambda: parse_offer_response(data, va.AUTHORITY),
        lambda: parse_run_cancellation_request(decode_local_api_body(data)),
        lambda: parse_task_start_request(decode_local_api_body(data)),
        lambda: parse_register_response(data, worker_id=va.WORKER_ID, session_id=va.SESSION_ID),
        lambda: parse_pending_claim(data),
        lambda: parse_inbox_record(data),
    )
    for parse in parsers:
        try:
            parse()
        except ContractError:
            pass
    # No corpus file is a valid offer response for the claim of vector A.
    with pytest.raises(ContractError):
        parse_offer_response(data, va.AUTHORITY)
