"""The status console's assets and ``GET /metrics`` on a real ``serve`` (issue 26 items 4, 5).

Headers as the reference's console (httpSurface.ts at 84d1a61); metrics checked by
Debian's ``promtool check metrics`` and scraped by a real Prometheus bound to 127.0.0.1
(tests/support/observe_tools.py: skipped without them, required under .ci/run).
"""

from __future__ import annotations

import json
import pathlib
import re
import sqlite3
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from qinglong_edge.local.public import CONSOLE_CSP, MAX_ASSET_BYTES, MAX_TOTAL_BYTES, ConsoleAssets
from tests.support.http_client import RawResponse, exchange, request_bytes
from tests.support.local_site import API, LocalSite, free_port
from tests.support.observe_tools import require_tool
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def site(tmp_path: pathlib.Path) -> Iterator[LocalSite]:
    site = LocalSite(tmp_path, local_api={"console": True, "metrics": True})
    site.provision()
    try:
        yield site
    finally:
        site.close()


def _get(site: LocalSite, target: str, *, method: str = "GET", body: bytes = b"",
         headers: list[tuple[str, str]] | None = None) -> RawResponse:
    response = exchange(("127.0.0.1", site.port), request_bytes(method, target, headers=headers or [], body=body))
    assert response is not None
    return response


def _audit_rows(site: LocalSite) -> int:
    with sqlite3.connect(site.state / "local.db") as conn:
        return int(conn.execute('SELECT count(*) FROM "QingLong3SecurityAuditEvents"').fetchone()[0])


def test_the_assets_are_small_local_and_strict() -> None:
    assets = ConsoleAssets()
    assert set(assets.assets) == {"/", "/console.css", "/console.js"}
    assert all(len(data) <= MAX_ASSET_BYTES for data, _ in assets.assets.values())
    assert assets.total_bytes <= MAX_TOTAL_BYTES
    for data, _ in assets.assets.values():
        text = data.decode("utf-8")
        assert not re.search(r"(https?:)?//[a-z0-9]", text.replace("// ", "")), "an external resource"
        assert "innerHTML" not in text and "eval(" not in text and "localStorage" not in text
        assert "sessionStorage" not in text and "document.cookie" not in text
    html = assets.assets["/"][0].decode()
    assert "<script>" not in html and " style=" not in html and "onclick" not in html  # nothing inline (CSP)


def test_serve_serves_exactly_the_console_with_the_reference_headers(site: LocalSite) -> None:
    serve = site.serve()
    before = _audit_rows(site)
    page = _get(site, "/")
    assert page.status == 200
    assert [name for name, _ in page.headers][:11] == [
        "content-type", "cache-control", "content-security-policy", "cross-origin-opener-policy",
        "cross-origin-resource-policy", "permissions-policy", "referrer-policy", "x-content-type-options",
        "x-frame-options", "etag", "x-request-id"]
    assert page.header("content-type") == "text/html; charset=utf-8"
    assert page.header("content-security-policy") == CONSOLE_CSP == (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self';"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    assert page.header("x-frame-options") == "DENY" and page.header("referrer-policy") == "no-referrer"
    assert page.header("cache-control") == "no-store" and page.header("x-content-type-options") == "nosniff"
    assert re.fullmatch(r'"[0-9a-f]{64}"', page.header("etag") or "")
    assert int(page.header("content-length") or 0) == len(page.body)
    assert b'<script src="/console.js" defer></script>' in page.body
    assert _get(site, "/console.css").header("content-type") == "text/css; charset=utf-8"
    assert _get(site, "/console.js").header("content-type") == "text/javascript; charset=utf-8"
    favicon = _get(site, "/favicon.ico")
    assert (favicon.status, favicon.body, favicon.header("content-length")) == (204, b"", None)
    for target in ("/?x=1", "/index.html", "/console.js?v=1", "/console.css/", "//", "/console"):
        miss = _get(site, target)
        assert (miss.status, miss.body) == (404, b'{"code":"route_not_found"}'), target
    assert _get(site, "/", method="POST", body=b"{}").status == 404
    with_body = _get(site, "/", body=b"x")
    assert (with_body.status, with_body.body) == (400, b'{"code":"invalid_request_body"}')
    assert _audit_rows(site) == before  # no credential, no audit row
    assert serve.stop() == 0


def test_the_console_and_metrics_are_off_by_default(tmp_path: pathlib.Path) -> None:
    site = LocalSite(tmp_path)
    site.provision()
    try:
        serve = site.serve()
        for target in ("/", "/console.js", "/favicon.ico", "/metrics"):
            assert _get(site, target).status == 404
        assert "status console" not in serve.stderr()
        serve.stop()
    finally:
        site.close()


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert match is not None, (name, labels, text)
    return float(match.group(1))


def test_metrics_count_what_serve_does_and_pass_promtool(site: LocalSite) -> None:
    serve = site.serve()
    assert "status console on http://127.0.0.1:" in serve.stderr()
    run_id = site.start_run()
    site.wait_run_status(run_id, "running")
    assert site.cancel(run_id)[0] == 202
    site.wait_run_status(run_id, "cancelled")
    assert site.cancel(run_id, token=site.viewer_token)[0] == 403
    assert _get(site, f"{API}/runs").status == 401
    before = _audit_rows(site)
    response = _get(site, "/metrics")
    assert response.status == 200
    assert response.header("content-type") == "text/plain; version=0.0.4; charset=utf-8"
    assert _audit_rows(site) == before
    text = response.body.decode()
    assert _metric(text, "qinglong_edge_local_runs", '{status="cancelled"}') == 1
    assert _metric(text, "qinglong_edge_local_runs", '{status="running"}') == 0
    assert _metric(text, "qinglong_edge_local_task_starts_total") == 1
    assert _metric(text, "qinglong_edge_local_launches_total") == 1
    assert _metric(text, "qinglong_edge_local_cancellations_total") == 1
    assert _metric(text, "qinglong_edge_local_api_refusals_total", '{reason="forbidden"}') == 1
    assert _metric(text, "qinglong_edge_local_api_refusals_total", '{reason="authentication_required"}') == 1
    assert _metric(text, "qinglong_edge_local_api_request_duration_seconds_count") >= 5
    assert _metric(text, "qinglong_edge_local_store_cap", '{store="terminal_runs"}') == 500
    assert _metric(text, "qinglong_edge_local_store_usage", '{store="terminal_runs"}') == 1
    promtool = require_tool("promtool")
    checked = subprocess.run([promtool, "check", "metrics"], input=response.body, capture_output=True, timeout=30,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert serve.stop() == 0


def test_a_real_prometheus_scrapes_serve(site: LocalSite, tmp_path: pathlib.Path) -> None:
    prometheus = require_tool("prometheus")
    serve = site.serve()
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: qinglong-edge\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{site.port}']\n")
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{web}"], stdout=out, stderr=subprocess.STDOUT)
    try:
        def scraped() -> dict[str, object] | None:
            url = f"http://127.0.0.1:{web}/api/v1/query?query=qinglong_edge_build_info"
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    value = json.loads(answer.read())
            except OSError:
                return None
            results = value.get("data", {}).get("result", [])
            return results[0] if results else None

        result = wait_until(scraped, 60, interval=0.05, what="Prometheus to scrape /metrics")
        assert result["metric"]["job"] == "qinglong-edge"  # type: ignore[index]
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/targets", timeout=5) as answer:
            targets = json.loads(answer.read())["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"], targets
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert serve.stop() == 0
