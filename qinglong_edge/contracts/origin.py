"""The worker ingress origin (ADR-0110 section 1.1), parsed without I/O, and the HTTP
grammar both HTTP sides share.

The reference parses the origin as a WHATWG URL and accepts only ``https:`` with no
userinfo, a path of exactly ``/`` (or none), no query and no fragment; the port
defaults to 443. We accept the same set, spelled as an ASCII host name or an IP
literal (IPv6 in brackets), and reject everything else with ``invalid_origin``.

The RFC 9110 grammar fragments (:data:`HTTP_TOKEN`, :data:`HTTP_FIELD_VCHAR`,
:data:`HTTP_FIELD_VALUE`, :data:`HTTP_OWS`) are defined here once, as ``bytes`` regex
text, for the Local API's request parser (``local/http11.py``) and the worker ingress
client's response parser (``worker/ingress/http_exchange.py``): a field line is the same
on both. They live in this module, not one of their own, because the worker's idle pull
already imports it (``tests/cli/test_pull_imports.py`` pins that path's modules).
"""

from __future__ import annotations

import ipaddress
import re

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError

__all__ = [
    "HTTP_FIELD_VALUE",
    "HTTP_FIELD_VALUE_RE",
    "HTTP_FIELD_VCHAR",
    "HTTP_OWS",
    "HTTP_TOKEN",
    "Origin",
    "parse_origin",
]

# RFC 9110 / 9112 grammar as regex fragments (h11 _abnf style), bytes.
# tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~"
#       / DIGIT / ALPHA                                             (RFC 9110 5.6.2)
#: ``token = 1*tchar`` (RFC 9110 5.6.2): methods and field names.
HTTP_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
#: ``field-vchar = VCHAR / obs-text`` (RFC 9110 5.5), the body of a regex character class
#: (``[`` + it + ``]``); obs-text (%x80-FF) is accepted as bytes and decoded ISO-8859-1.
HTTP_FIELD_VCHAR = rb"\x21-\x7e\x80-\xff"
#: A field value once its OWS is trimmed: ``*( SP / HTAB / field-vchar )`` (field-content,
#: RFC 9110 5.5); also a reason-phrase (RFC 9112 4) and a chunk extension's text.
HTTP_FIELD_VALUE = rb"[\t\x20" + HTTP_FIELD_VCHAR + rb"]*"
HTTP_FIELD_VALUE_RE = re.compile(HTTP_FIELD_VALUE)
#: ``OWS = *( SP / HTAB )`` (RFC 9110 5.6.3): the bytes trimmed around a field value.
HTTP_OWS = b" \t"

_ORIGIN = re.compile(
    r"https://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?/?",
    re.ASCII,
)
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)


class Origin(Frozen):
    """A validated ``https`` origin.

    Attributes:
        host: host name (lower-cased) or IP literal without brackets.
        port: TCP port, 1-65535 (443 when the origin names none).
        is_ip: True for an IP literal; then no SNI is sent (section 1.2).
        text: canonical ``https://host[:port]`` form, for messages and the Host header.
    """

    __slots__ = ("host", "port", "is_ip", "text")  # noqa: RUF023 (field order)

    host: str
    port: int
    is_ip: bool
    text: str

    def __init__(self, host: str, port: int, is_ip: bool, text: str) -> None:
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "is_ip", is_ip)
        object.__setattr__(self, "text", text)

    @property
    def host_header(self) -> str:
        """The ``Host`` header value: the host, bracketed for IPv6, with a non-443 port."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 443 else f"{host}:{self.port}"


def parse_origin(text: object) -> Origin:
    """Parse ``text`` as a worker ingress origin.

    Raises:
        ContractError: ``invalid_origin`` for anything but ``https://host[:port][/]``.
    """
    if not isinstance(text, str) or len(text) > 2048:
        raise ContractError("invalid_origin", "$", "origin must be a string of at most 2048")
    match = _ORIGIN.fullmatch(text)
    if match is None:
        raise ContractError(
            "invalid_origin",
            "$",
            "origin must be https://host[:port] with no userinfo, path, query or fragment",
        )
    raw_host = match.group("host")
    port_text = match.group("port")
    port = 443 if port_text is None else int(port_text)
    if port_text is not None and (port < 1 or port > 65535 or port_text != str(port)):
        raise ContractError("invalid_origin", "$", "port must be 1-65535 in canonical form")
    is_ip = False
    if raw_host.startswith("["):
        try:
            host = str(ipaddress.IPv6Address(raw_host[1:-1]))
        except ValueError:
            raise ContractError("invalid_origin", "$", "invalid IPv6 literal") from None
        is_ip = True
    else:
        host = raw_host.lower()
        try:
            host = str(ipaddress.IPv4Address(host))
            is_ip = True
        except ValueError:
            labels = host.rstrip(".").split(".") if len(host) <= 253 else []
            if not labels or not all(_LABEL.fullmatch(label) for label in labels):
                raise ContractError("invalid_origin", "$", "invalid host name") from None
            if labels[-1].isdigit():
                raise ContractError("invalid_origin", "$", "invalid IPv4 literal") from None
            host = ".".join(labels)
    origin = Origin(host=host, port=port, is_ip=is_ip, text="")
    object.__setattr__(origin, "text", "https://" + origin.host_header)
    return origin
