"""What ``serve`` answers before routing, without a credential or an audit row (issue 26).

* The status console (``localApi.console``, off by default): exactly ``GET /``,
  ``/console.css`` and ``/console.js`` (the raw target, so ``/?x`` or ``/index.html`` is
  a route miss: 404 ``route_not_found``), and ``GET /favicon.ico`` 204. The assets are
  files of this package (``qinglong_edge/local/console/``), read once at start: at most
  96 KiB each and 192 KiB in all (:class:`ConsoleAssets` refuses more), no build step,
  nothing external (the CSP forbids it anyway). Headers as the reference's console
  (``httpSurface.ts`` at 84d1a61): ``content-type``, ``cache-control: no-store``, the
  Content-Security-Policy :data:`CONSOLE_CSP`, ``cross-origin-opener-policy`` and
  ``cross-origin-resource-policy: same-origin``, ``permissions-policy: camera=(),
  geolocation=(), microphone=()``, ``referrer-policy: no-referrer``,
  ``x-content-type-options: nosniff``, ``x-frame-options: DENY``, ``x-request-id``, an
  ``etag`` (the SHA-256 of the bytes, quoted). A request with a body is 400
  ``invalid_request_body``.
* ``GET /metrics`` (``localApi.metrics``, off by default): :mod:`qinglong_edge.local.metrics`.

Both are public requests for the server (:attr:`PublicRoutes.is_public`): they hold at
most ``ServerLimits.public_slots`` request slots, never the budget of failed credentials.
The console's own API calls carry the user's ``ql3c`` credential and go through the
normal admission.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Final

from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.exposition import CONTENT_TYPE as METRICS_CONTENT_TYPE
from qinglong_edge.errors import ConfigError
from qinglong_edge.local.exchange import Response
from qinglong_edge.local.http11 import RequestHead
from qinglong_edge.local.metrics import ApiMetrics, StoreGauges

__all__ = ["CONSOLE_CSP", "MAX_ASSET_BYTES", "MAX_TOTAL_BYTES", "ConsoleAssets", "PublicRoutes"]

_log = logging.getLogger("qinglong_edge.local.public")

MAX_ASSET_BYTES: Final = 96 * 1024
MAX_TOTAL_BYTES: Final = 192 * 1024
CONSOLE_CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self';"
                      " base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: request path -> (file in qinglong_edge/local/console, content type)
_ASSETS: Final = (
    ("/", "index.html", "text/html; charset=utf-8"),
    ("/console.css", "console.css", "text/css; charset=utf-8"),
    ("/console.js", "console.js", "text/javascript; charset=utf-8"),
)
_ASSET_HEADERS: Final = (
    ("cache-control", "no-store"),
    ("content-security-policy", CONSOLE_CSP),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
    ("permissions-policy", "camera=(), geolocation=(), microphone=()"),
    ("referrer-policy", "no-referrer"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
)
_FAVICON_HEADERS: Final = (
    ("cache-control", "no-store"),
    ("cross-origin-resource-policy", "same-origin"),
    ("referrer-policy", "no-referrer"),
    ("x-content-type-options", "nosniff"),
)


class ConsoleAssets:
    """The three console files, loaded and checked once.

    Raises:
        ConfigError: ``console_unavailable`` when a file is missing, empty, over 96 KiB,
            or the three exceed 192 KiB (a broken install: ``serve`` refuses to start).
    """

    def __init__(self) -> None:
        self.assets: dict[str, tuple[bytes, tuple[tuple[str, str], ...]]] = {}
        total = 0
        root = resources.files("qinglong_edge.local") / "console"
        for path, name, content_type in _ASSETS:
            try:
                data = (root / name).read_bytes()
            except OSError as exc:
                raise ConfigError(f"the console asset {name} cannot be read ({exc.strerror})",
                                  code="console_unavailable") from None
            if not 2 <= len(data) <= MAX_ASSET_BYTES:
                raise ConfigError(f"the console asset {name} is not 2-{MAX_ASSET_BYTES} bytes",
                                  code="console_unavailable")
            total += len(data)
            if total > MAX_TOTAL_BYTES:
                raise ConfigError(f"the console assets exceed {MAX_TOTAL_BYTES} bytes", code="console_unavailable")
            headers = (("content-type", content_type), *_ASSET_HEADERS, ("etag", f'"{sha256_hex(data)}"'))
            self.assets[path] = (data, headers)

    @property
    def total_bytes(self) -> int:
        return sum(len(data) for data, _ in self.assets.values())


class PublicRoutes:
    """The server's public requests (module docstring).

    Args:
        console: the assets (None: the console is off).
        metrics: the counters (None: ``/metrics`` is off).
        gauges: the store gauges for ``/metrics``.
    """

    def __init__(self, console: ConsoleAssets | None = None, metrics: ApiMetrics | None = None,
                 gauges: StoreGauges | None = None) -> None:
        self.console = console
        self.metrics = metrics
        self.gauges = gauges

    def is_public(self, head: RequestHead) -> bool:
        """The request is one this object answers (the server's ``public``)."""
        if head.method != "GET":
            return False
        target = head.target
        if self.console is not None and (target in self.console.assets or target == "/favicon.ico"):
            return True
        return self.metrics is not None and target == "/metrics"

    def answer(self, head: RequestHead) -> Response | None:
        if not self.is_public(head):
            return None
        if head.has_body:
            return Response(400, {"code": "invalid_request_body"})
        target = head.target
        if target == "/metrics":
            return self._metrics()
        if target == "/favicon.ico":
            return Response(204, content=b"", headers=_FAVICON_HEADERS)
        assert self.console is not None
        data, headers = self.console.assets[target]
        return Response(200, content=data, headers=headers)

    def _metrics(self) -> Response:
        assert self.metrics is not None
        if not self.metrics.scrape.acquire(blocking=False):  # one scrape at a time
            return Response(503, {"code": "server_overloaded"})
        try:
            body = self.metrics.render(self.gauges)
        except Exception as exc:  # noqa: BLE001 - a store failure is a 503 of this scrape only
            _log.warning("metrics unavailable: %s", type(exc).__name__)
            return Response(503, {"code": "metrics_unavailable"})
        finally:
            self.metrics.scrape.release()
        return Response(200, content=body, headers=(("content-type", METRICS_CONTENT_TYPE),
                                                    ("cache-control", "no-store")))
