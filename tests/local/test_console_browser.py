"""The status console in a real browser (issue 26 item 4): Debian's chromium driven by
playwright, against a real ``serve`` with a real job.

Load, sign in, list, start a task, watch its log grow, cancel as an operator, be refused
as a viewer, and no console error (the one network error the refusal itself logs is
the 403, expected). What a job printed stays text: HTML is not parsed, ANSI escapes and
control bytes show in caret notation (``^[``), invalid UTF-8 as U+FFFD. Screenshots go to
``var/test-artifacts/console/`` (ignored by git). Skipped without chromium or
playwright (tests/support/observe_tools.py), required under .ci/run.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.local_site import API, LocalSite
from tests.support.observe_tools import CHROMIUM_FLAGS, require_tool

pytestmark = pytest.mark.timeout(240)

ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "var" / "test-artifacts" / "console"
#: What the job prints: HTML, an ANSI colour, invalid UTF-8 (0xFF 0xFE), then a line a second-third.
PRINTER = (r"printf '<b>bold</b> <script>alert(1)</script>\n\033[31mred\033[0m\n\377\376 bad utf-8\n'; "
           "i=0; while :; do i=$((i+1)); echo \"tick $i\"; sleep 0.3; done")
WAIT_MS = 20_000


@pytest.fixture
def site(tmp_path: pathlib.Path) -> Iterator[LocalSite]:
    site = LocalSite(tmp_path, local_api={"console": True})
    site.provision()
    created = json.loads(site.cli("admin", "task", "create", "--project", "default", "--id", "printer",
                                  "--name", "Printer", "--shell", PRINTER, "--json"))
    assert created["task"]["revision"] == 1
    try:
        yield site
    finally:
        site.close()


@pytest.fixture
def browser_page(tmp_path: pathlib.Path) -> Iterator[tuple[Any, list[str]]]:
    require_tool("playwright")
    chromium = require_tool("chromium")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)

    profile = tmp_path / "chromium-profile"  # a fresh --user-data-dir
    problems: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, headless=True, args=list(CHROMIUM_FLAGS),
            viewport={"width": 1100, "height": 760})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.set_default_timeout(WAIT_MS)
            yield page, problems
        finally:
            context.close()


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _sign_in(page: Any, token: str) -> None:
    page.fill("#project", "default")
    page.fill("#token", token)
    page.click("#signin-button")
    page.wait_for_selector("#app", state="visible")


def test_console_end_to_end_in_chromium(site: LocalSite, browser_page: tuple[Any, list[str]]) -> None:
    # Playwright waits with locators (its own isolated world): the page's CSP forbids eval,
    # so wait_for_function cannot run there, which is the point of the CSP.
    from playwright.sync_api import expect

    page, problems = browser_page
    serve = site.serve()
    page.goto(f"http://127.0.0.1:{site.port}/")
    assert page.title() == "qinglong-edge status"
    _shot(page, "1-sign-in")

    # a wrong credential is refused and the form stays
    page.fill("#token", "ql3c_nobody_" + "A" * 43)
    page.click("#signin-button")
    expect(page.locator("#who")).to_contain_text("sign-in failed")
    assert page.is_visible("#signin")

    _sign_in(page, site.token)
    assert page.input_value("#token") == ""  # not left in the page
    page.wait_for_selector("#tasks tr[data-task-id='printer']")
    page.wait_for_selector("#worker dl, #worker:has-text('no worker section')")

    # start the task: the log panel follows it and grows
    page.click("#tasks tr[data-task-id='printer'] button.start")
    expect(page.locator("#log")).to_contain_text("tick 3")
    first = page.text_content("#log") or ""
    expect(page.locator("#log")).to_contain_text("tick 8")
    grown = page.text_content("#log") or ""
    assert len(grown) > len(first) and grown.startswith(first[:40])
    run_id = page.text_content("#log-run") or ""
    assert re.fullmatch(r"[0-9a-f-]{36}", run_id)
    page.wait_for_selector(f"#runs tr[data-run-id='{run_id}']")
    _shot(page, "2-log-growing")

    # everything the job printed is text
    assert "<b>bold</b> <script>alert(1)</script>" in grown
    assert "^[[31mred^[[0m" in grown  # ESC in caret notation, never interpreted
    assert "\ufffd\ufffd bad utf-8" in grown
    assert page.locator("#log b").count() == 0 and page.locator("#log script").count() == 0

    # cancel as the operator: the Run ends cancelled, the log stops
    page.click("#cancel-run")
    expect(page.locator("#status")).to_contain_text("accepted")
    expect(page.locator("#log-state")).to_have_text(re.compile("^finished: cancelled"))
    assert site.run_status(run_id) == "cancelled"
    page.wait_for_selector(f"#runs tr[data-run-id='{run_id}'] td.s-cancelled")
    _shot(page, "3-cancelled")

    # a viewer sees a running Run and its log, and is refused the cancel
    status, started = site.request("POST", f"{API}/tasks/printer/runs", {
        "schema": "qinglong/task-start@v1", "mutationId": "7b4a2c1e-0d3f-4e5a-9b8c-1a2b3c4d5e6f",
        "expectedRevision": 1, "expectedContentDigest": _digest(site)})
    assert status == 202
    second = str(started["runId"])
    site.wait_run_status(second, "running")
    page.click("#signout")
    page.wait_for_selector("#signin", state="visible")
    _sign_in(page, site.viewer_token)
    page.wait_for_selector(f"#runs tr[data-run-id='{second}'] button.follow")
    page.click(f"#runs tr[data-run-id='{second}'] button.follow")
    expect(page.locator("#log")).to_contain_text("tick 2")
    page.click("#cancel-run")
    expect(page.locator("#status")).to_contain_text("refused")
    assert "forbidden" not in (page.text_content("#status") or "") or "HTTP 403" in (page.text_content("#status") or "")
    assert site.run_status(second) == "running"
    _shot(page, "4-viewer-refused")
    assert site.cancel(second, mutation_id="cleanup")[0] == 202
    site.wait_run_status(second, "cancelled")

    expected = re.compile(r"console\.error: Failed to load resource: the server responded with a status of "
                          r"(401|403) \((Unauthorized|Forbidden)\)")
    assert [p for p in problems if not expected.fullmatch(p)] == []
    assert serve.stop() == 0


def _digest(site: LocalSite) -> str:
    listed = json.loads(site.cli("admin", "task", "list", "--project", "default", "--json"))
    return str(next(t for t in listed["tasks"] if t["taskId"] == "printer")["contentDigest"])
