"""The worker's transport as a ``Protocol``: an annotation only, never imported at run time.

Import it only under the project's idiom, as :mod:`.records` (it imports :mod:`typing`,
which the pull path never loads; ``tests/cli/test_pull_imports.py`` checks the idle pull's
module list)::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from qinglong_edge.contracts.ports import Transport

One shape for every caller of the worker-ingress transport (the pull and the session in
``worker/delivery``, the execution calls in ``worker/remote``): the real one is
``worker/ingress/transport.py``'s client, wrapped by ``worker/cycle.py`` so that a signal
interrupts a call; tests pass their own. It lives here, not in ``worker/ingress``, because
``worker/remote`` does not import the HTTPS side (it is handed a transport).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Transport"]


class Transport(Protocol):
    """``post_json`` and ``post_stream`` of the worker-ingress client (remote-execution.md 2).

    Both return the response (status, headers, body bytes at most ``max_response_bytes``)
    and raise ``TransportError`` (``qinglong_edge.errors``) on a failed exchange.
    ``max_request_bytes`` bounds the JSON body (bytes); ``post_stream`` sends ``prefix``
    then exactly ``length`` bytes read from ``source`` (a binary file).
    """

    def post_json(self, path: str, body: bytes, *, max_response_bytes: int,
                  max_request_bytes: int = ...) -> Any: ...

    def post_stream(self, path: str, prefix: bytes, source: object, length: int, *,
                    max_response_bytes: int) -> Any: ...
