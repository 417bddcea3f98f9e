"""The external corpus ``http-malformed`` against the real Local API, adapted exactly as
its README says:

1. the bytes ``/v1/echo`` are replaced with a real route (the cancellation of a Run of
   its own per case, so effects can be attributed);
2. a valid ``Authorization: Bearer ql3c_...`` line is inserted right after the request
   line, ending with the same line ending as the request line;
3. the body is kept (``{"ping":true}`` fails the cancellation schema, which still
   counts as a rejection); for the ``must_reject=no`` controls a valid
   ``qinglong/run-cancellation@v1`` body is swapped in and ``Content-Length`` fixed.

A new TCP connection per case, half-closed after sending (so a truncated body ends
instead of waiting for the read timeout). ``must_reject=yes`` passes when no 2xx comes
back and no cancel intent or event appeared, and the server then answers the next
request; ``no`` must succeed; ``policy`` rows must give one of the listed statuses
(200 meaning any 2xx).
"""

from __future__ import annotations

import csv
import pathlib
import re
from collections.abc import Iterator

import pytest

from tests.conftest import corpora_dir
from tests.support.local_api import LocalApiServer, local_api
from tests.support.store import AUTHORIZATION, insert_run


def _manifest() -> list[dict[str, str]]:
    root = corpora_dir() / "http-malformed"
    with open(root / "manifest.tsv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


CASES = _manifest()


def adapt(case: dict[str, str], raw: bytes, run_id: str) -> bytes:
    route = f"/api/v3/projects/default/runs/{run_id}/cancellation".encode()
    assert raw.count(b"/v1/echo") == 1
    data = raw.replace(b"/v1/echo", route)
    newline = data.index(b"\n")
    ending = b"\r\n" if newline > 0 and data[newline - 1 : newline] == b"\r" else b"\n"
    cut = newline + 1
    data = data[:cut] + b"Authorization: " + AUTHORIZATION.encode() + ending + data[cut:]
    if case["must_reject"] == "no":
        body = f'{{"schema":"qinglong/run-cancellation@v1","mutationId":"corpus-{case["case"]}"}}'.encode()
        head, separator, _ = data.partition(b"\r\n\r\n")
        assert separator, case["case"]
        head = re.sub(rb"(?im)^(content-length):[ \t]*\d+", lambda m: m.group(1) + b": " + str(len(body)).encode(), head)
        data = head + separator + body
    return data


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with local_api(tmp_path_factory.mktemp("corpus"), with_run=False) as server:
        for index in range(len(CASES)):
            server.write(lambda c, i=index: insert_run(c, f"corpus-run-{i}"))
        yield server


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=[c["case"] for c in CASES])
def test_corpus_case(api: LocalApiServer, index: int, case: dict[str, str]) -> None:
    raw = (corpora_dir() / "http-malformed" / case["file"]).read_bytes()
    run_id = f"corpus-run-{index}"
    response = api.send(adapt(case, raw, run_id), half_close=True)
    status = 0 if response is None else response.status  # 0: closed without an answer
    intent = api.run_row(run_id)[3]
    events = api.events(run_id)
    if case["must_reject"] == "yes":
        assert not 200 <= status < 300, f"{case['case']} was accepted ({status})"
        assert intent is None and events == [], case["case"]
    elif case["must_reject"] == "no":
        assert status == 202, f"{case['case']}: {status} {response.body if response else b''!r}"
        assert intent is not None and len(events) == 1
    else:
        allowed = {int(s) for s in case["expected_status"].split("|")}
        normalised = 200 if 200 <= status < 300 else status
        assert normalised in allowed, f"{case['case']}: {status} not in {allowed}"
        assert (intent is not None) is (normalised == 200)
    assert api.next_request_served()


def test_every_case_of_the_corpus_is_covered() -> None:
    files = sorted(p.name for p in (corpora_dir() / "http-malformed" / "cases").glob("*.http"))
    assert sorted(pathlib.Path(c["file"]).name for c in CASES) == files
    assert {c["must_reject"] for c in CASES} == {"yes", "no", "policy"}
