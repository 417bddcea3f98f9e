"""A throwaway PKI for the demo, made with the openssl CLI (OpenSSL 1.1.1 or 3.x).

Two CAs, as a real deployment has them:

* ``cluster-ca``: signs the cluster's server certificate; the worker trusts it
  (``worker.trustAnchorFiles``);
* ``client-ca``: signs worker client certificates; the cluster requires one from it
  (mutual TLS, offer-delivery.md 1.2).

Leaves: ``server`` (SAN ``DNS:localhost, IP:127.0.0.1``, EKU serverAuth) and
``worker`` (CN = the worker id, EKU clientAuth). Every key is EC P-256 (TLS 1.3 and
security level 2 accept it, and it is fast to make); certificates are valid for 30 days
from now (`pull` warns once a day within 14 days of the client certificate's end) with a
random serial. Key files are 0600 in a 0700 directory.

Nothing here talks to the network; every step is one ``openssl`` command, passed to
``run`` so the demo can print it before running it.
"""

from __future__ import annotations

import os
import pathlib
import secrets
from collections.abc import Callable, Sequence

__all__ = ["EXTENSIONS", "Pki", "make_pki"]

#: Extension sections for ``openssl req -x509 -extensions`` / ``x509 -req -extensions``.
EXTENSIONS = """\
# qinglong-edge demo PKI: certificate extensions (openssl -extfile / -config)
[ req ]
distinguished_name = dn
[ dn ]
[ ca ]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[ server ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[ client ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""

DAYS = "30"

#: ``run(argv)`` runs one openssl command (argv[0] == "openssl") in the PKI directory.
Runner = Callable[[Sequence[str]], None]


class Pki:
    """Paths of the PKI under ``root`` (relative names are what the commands use)."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.extensions = root / "extensions.cnf"

    def key(self, name: str) -> pathlib.Path:
        return self.root / f"{name}.key"

    def cert(self, name: str) -> pathlib.Path:
        return self.root / f"{name}.pem"


def _serial() -> str:
    return "0x" + secrets.token_hex(8)


def _new_key(run: Runner, name: str) -> None:
    run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key"])


def _ca(run: Runner, name: str, common_name: str) -> None:
    _new_key(run, name)
    run(["openssl", "req", "-x509", "-new", "-key", f"{name}.key", "-subj", f"/CN={common_name}",
         "-days", DAYS, "-set_serial", _serial(), "-config", "extensions.cnf", "-extensions", "ca",
         "-out", f"{name}.pem"])


def _leaf(run: Runner, name: str, common_name: str, issuer: str, section: str) -> None:
    _new_key(run, name)
    run(["openssl", "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={common_name}",
         "-config", "extensions.cnf", "-out", f"{name}.csr"])
    run(["openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.pem", "-CAkey", f"{issuer}.key",
         "-set_serial", _serial(), "-days", DAYS, "-sha256", "-extfile", "extensions.cnf",
         "-extensions", section, "-out", f"{name}.pem"])


def make_pki(root: pathlib.Path, worker_id: str, run: Runner, wrote: Callable[[pathlib.Path], None]) -> Pki:
    """Make the whole PKI in ``root`` (an existing directory, set to 0700) with ``run``
    (cwd = ``root``); ``wrote`` is told about the extensions file written first.

    Raises:
        whatever ``run`` raises when an openssl command fails.
    """
    root.chmod(0o700)
    pki = Pki(root)
    pki.extensions.write_text(EXTENSIONS)
    wrote(pki.extensions)
    _ca(run, "cluster-ca", "qinglong-edge demo cluster CA")
    _leaf(run, "server", "localhost", "cluster-ca", "server")
    _ca(run, "client-ca", "qinglong-edge demo client CA")
    _leaf(run, "worker", worker_id, "client-ca", "client")
    for path in root.iterdir():
        os.chmod(path, 0o600 if path.suffix == ".key" else 0o644)
    return pki
