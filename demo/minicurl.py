"""A stand-in for the few ``curl`` options the demo uses, for machines without curl.

    python3 demo/minicurl.py [-s] [-S] [-sS] [-i] [-X METHOD] [-H 'Name: value']... [--data BODY] URL

Plain ``http://`` only (the Local API listens on loopback). Like ``curl -i`` it prints
the status line, the response headers, a blank line and the body; without ``-i`` only
the body. Exit 0 when a response came back (whatever its status, as curl), 7 when the
connection failed (curl's "couldn't connect"), 2 on a usage error.
"""

from __future__ import annotations

import http.client
import sys
import urllib.parse


def _usage(message: str) -> int:
    print(f"minicurl: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    method: str | None = None
    headers: list[tuple[str, str]] = []
    data: bytes | None = None
    include = False
    url: str | None = None
    while args:
        arg = args.pop(0)
        if arg in ("-s", "-S", "-sS", "-Ss"):
            continue
        if arg == "-i":
            include = True
        elif arg == "-X" and args:
            method = args.pop(0)
        elif arg == "-H" and args:
            name, sep, value = args.pop(0).partition(":")
            if not sep:
                return _usage(f"bad header {name!r}")
            headers.append((name.strip(), value.strip()))
        elif arg == "--data" and args:
            data = args.pop(0).encode("utf-8")
        elif not arg.startswith("-") and url is None:
            url = arg
        else:
            return _usage(f"unsupported argument {arg!r}")
    if url is None:
        return _usage("no URL")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        return _usage("only http:// URLs")
    if data is not None and not any(name.lower() == "content-type" for name, _ in headers):
        headers.append(("Content-Type", "application/x-www-form-urlencoded"))  # as curl --data
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.putrequest(method or ("POST" if data is not None else "GET"), target,
                              skip_accept_encoding=True)
        for name, value in headers:
            connection.putheader(name, value)
        if data is not None:
            connection.putheader("Content-Length", str(len(data)))
        connection.endheaders(data)
        response = connection.getresponse()
        body = response.read()
    except OSError as exc:
        print(f"minicurl: (7) Failed to connect to {parts.netloc}: {exc}", file=sys.stderr)
        return 7
    finally:
        connection.close()
    out = sys.stdout.buffer
    if include:
        out.write(f"HTTP/1.1 {response.status} {response.reason}\r\n".encode("latin-1"))
        for name, value in response.getheaders():
            out.write(f"{name}: {value}\r\n".encode("latin-1"))
        out.write(b"\r\n")
    out.write(body)
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
