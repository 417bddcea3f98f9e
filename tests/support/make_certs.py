"""Generate the committed test PKI in ``tests/support/certs/`` with the openssl CLI.

The PEM files are made once and committed (CPython's ``make_ssl_certs.py`` approach), so
tests never depend on the clock or on key generation. Every validity period is *pinned*
with ``openssl ca -startdate/-enddate`` (OpenSSL 3.0's ``req -x509`` / ``x509 -req`` can
only say ``-days`` from now): valid certificates run 2025-01-01 .. 2099-12-31 so the
tests do not rot.

Regenerate (only when a certificate has to change; commit the result)::

    python tests/support/make_certs.py            # writes tests/support/certs/
    python tests/support/make_certs.py --out DIR  # somewhere else

The CA private keys are thrown away: regeneration always rebuilds the whole set.

Files (``*.pem`` = what a peer presents, leaf first then intermediates; ``*.key`` = its
PKCS#8 private key; every leaf key is EC P-256 unless named otherwise):

=============================  ==========================================================
``root-ca.pem``                the trust anchor the client is configured with
``intermediate-ca.pem``        signed by root-ca, signs the server leaves
``client-ca.pem``              the CA the test servers require client certificates from
``rogue-ca.pem``               a root nobody is configured to trust
``server.pem`` / ``.key``      valid server: leaf (SAN localhost, cluster.test,
                               127.0.0.1, ::1; EKU serverAuth) + intermediate
``server-leaf-only.pem``       the same leaf without the intermediate (incomplete chain;
                               key ``server.key``)
``server-expired``             valid 2020-01-01 .. 2021-01-01
``server-not-yet-valid``       valid 2090-01-01 .. 2099-12-31
``server-wrong-host``          SAN/CN ``wrong.test`` only
``server-self-signed``         self-signed leaf with the right SANs
``server-untrusted-root``      right SANs, issued by rogue-ca
``server-no-server-auth``      EKU clientAuth only
``server-issuer-not-ca``       leaf issued by a certificate with ``CA:FALSE`` (chain:
                               leaf, the non-CA issuer, intermediate)
``server-rsa1024``             RSA-1024 leaf key (below security level 2)
``client.pem`` / ``.key``      client leaf (EKU clientAuth) issued by client-ca
``client-next.pem`` / ``.key`` a second client leaf of client-ca (CN edge-1-next), for rotation
``client-rogue.pem`` / ``.key`` client leaf issued by rogue-ca (another CA)
=============================  ==========================================================
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "certs"

VALID = ("20250101000000Z", "20991231235959Z")
EXPIRED = ("20200101000000Z", "20210101000000Z")
NOT_YET_VALID = ("20900101000000Z", "20991231235959Z")
SERVER_SAN = "DNS:localhost, DNS:cluster.test, IP:127.0.0.1, IP:::1"

_CA_DIRECTORY = """\
[ ca ]
default_ca = ca_default
[ ca_default ]
dir = .
database = ./index.txt
new_certs_dir = ./newcerts
serial = ./serial
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
email_in_dn = no
[ policy_any ]
commonName = supplied
organizationName = optional
"""
_CA = "basicConstraints = critical, CA:TRUE"
_NOT_CA = "basicConstraints = critical, CA:FALSE"
_SIGNS_CERTIFICATES = "keyUsage = critical, keyCertSign, cRLSign"
_SIGNS_AND_ENCIPHERS = "keyUsage = critical, digitalSignature, keyEncipherment"


def _extensions(name: str, *lines: str, issued: bool = True) -> str:
    """One ``openssl ca -extensions`` section: ``lines``, then the subject key identifier
    and, for a certificate someone else ``issued``, the authority key identifier."""
    tail = ["subjectKeyIdentifier = hash", *(["authorityKeyIdentifier = keyid:always"] if issued else [])]
    return "".join(f"{line}\n" for line in (f"[ {name} ]", *lines, *tail))


CA_CONFIG = _CA_DIRECTORY + "".join([
    _extensions("root_ca", _CA, _SIGNS_CERTIFICATES, issued=False),
    _extensions("intermediate_ca", f"{_CA}, pathlen:1", _SIGNS_CERTIFICATES),
    _extensions("not_a_ca", _NOT_CA, "keyUsage = critical, digitalSignature, keyCertSign"),
    _extensions("server_leaf", _NOT_CA, _SIGNS_AND_ENCIPHERS, "extendedKeyUsage = serverAuth",
                "subjectAltName = {server_san}"),
    _extensions("server_self_signed", _NOT_CA, _SIGNS_AND_ENCIPHERS, "extendedKeyUsage = serverAuth",
                "subjectAltName = {server_san}", issued=False),
    _extensions("wrong_host_leaf", _NOT_CA, _SIGNS_AND_ENCIPHERS, "extendedKeyUsage = serverAuth",
                "subjectAltName = DNS:wrong.test"),
    _extensions("client_auth_leaf", _NOT_CA, _SIGNS_AND_ENCIPHERS, "extendedKeyUsage = clientAuth",
                "subjectAltName = {server_san}"),
    _extensions("client_leaf", _NOT_CA, "keyUsage = critical, digitalSignature", "extendedKeyUsage = clientAuth"),
])


class _Pki:
    """A throw-away ``openssl ca`` working directory."""

    def __init__(self, work: pathlib.Path) -> None:
        self.work = work
        (work / "newcerts").mkdir()
        (work / "index.txt").write_text("")
        (work / "ca.cnf").write_text(CA_CONFIG.format(server_san=SERVER_SAN))
        self.serial = 0x1000

    def run(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.work, check=True, capture_output=True)

    def key(self, name: str, rsa_bits: int = 0) -> pathlib.Path:
        path = self.work / f"{name}.key"
        if rsa_bits:
            self.run("genpkey", "-algorithm", "RSA", "-pkeyopt", f"rsa_keygen_bits:{rsa_bits}", "-out", path.name)
        else:
            self.run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path.name)
        return path

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        extensions: str,
        dates: tuple[str, str],
        issuer: str | None,
        rsa_bits: int = 0,
    ) -> pathlib.Path:
        """Make ``name.key`` and ``name.pem`` signed by ``issuer`` (None: self-signed)."""
        key = self.key(name, rsa_bits)
        csr = self.work / f"{name}.csr"
        self.run("req", "-new", "-key", key.name, "-subj", f"/CN={common_name}", "-out", csr.name)
        # Pinned, distinct serials so the set is reproducible apart from the keys.
        self.serial += 1
        (self.work / "serial").write_text(f"{self.serial:X}\n")
        args = ["ca", "-config", "ca.cnf", "-batch", "-notext", "-md", "sha256",
                "-startdate", dates[0], "-enddate", dates[1],
                "-extfile", "ca.cnf", "-extensions", extensions,
                "-in", csr.name, "-out", f"{name}.pem"]
        if issuer is None:
            args += ["-selfsign", "-keyfile", key.name]
        else:
            args += ["-cert", f"{issuer}.pem", "-keyfile", f"{issuer}.key"]
        self.run(*args)
        return self.work / f"{name}.pem"

    def read(self, name: str, suffix: str = "pem") -> str:
        return (self.work / f"{name}.{suffix}").read_text()


def generate(out: pathlib.Path) -> None:
    """Build the whole set in a temporary directory, then write it to ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        pki = _Pki(pathlib.Path(tmp))
        pki.issue("root-ca", "qinglong-edge test root CA", extensions="root_ca", dates=VALID, issuer=None)
        pki.issue("intermediate-ca", "qinglong-edge test intermediate CA", extensions="intermediate_ca", dates=VALID, issuer="root-ca")
        pki.issue("client-ca", "qinglong-edge test client CA", extensions="root_ca", dates=VALID, issuer=None)
        pki.issue("rogue-ca", "qinglong-edge rogue root CA", extensions="root_ca", dates=VALID, issuer=None)

        pki.issue("server", "localhost", extensions="server_leaf", dates=VALID, issuer="intermediate-ca")
        pki.issue("server-expired", "localhost", extensions="server_leaf", dates=EXPIRED, issuer="intermediate-ca")
        pki.issue("server-not-yet-valid", "localhost", extensions="server_leaf", dates=NOT_YET_VALID, issuer="intermediate-ca")
        pki.issue("server-wrong-host", "wrong.test", extensions="wrong_host_leaf", dates=VALID, issuer="intermediate-ca")
        pki.issue("server-self-signed", "localhost", extensions="server_self_signed", dates=VALID, issuer=None)
        pki.issue("server-untrusted-root", "localhost", extensions="server_leaf", dates=VALID, issuer="rogue-ca")
        pki.issue("server-no-server-auth", "localhost", extensions="client_auth_leaf", dates=VALID, issuer="intermediate-ca")
        pki.issue("not-a-ca", "qinglong-edge not a CA", extensions="not_a_ca", dates=VALID, issuer="intermediate-ca")
        pki.issue("server-issuer-not-ca", "localhost", extensions="server_leaf", dates=VALID, issuer="not-a-ca")
        pki.issue("server-rsa1024", "localhost", extensions="server_leaf", dates=VALID, issuer="intermediate-ca", rsa_bits=1024)

        pki.issue("client", "edge-1", extensions="client_leaf", dates=VALID, issuer="client-ca")
        pki.issue("client-next", "edge-1-next", extensions="client_leaf", dates=VALID, issuer="client-ca")
        pki.issue("client-rogue", "edge-1", extensions="client_leaf", dates=VALID, issuer="rogue-ca")

        files: dict[str, str] = {
            "root-ca.pem": pki.read("root-ca"),
            "intermediate-ca.pem": pki.read("intermediate-ca"),
            "client-ca.pem": pki.read("client-ca"),
            "rogue-ca.pem": pki.read("rogue-ca"),
            "server-leaf-only.pem": pki.read("server"),
            "client.pem": pki.read("client"),
            "client.key": pki.read("client", "key"),
            "client-next.pem": pki.read("client-next"),
            "client-next.key": pki.read("client-next", "key"),
            "client-rogue.pem": pki.read("client-rogue"),
            "client-rogue.key": pki.read("client-rogue", "key"),
        }
        intermediate = pki.read("intermediate-ca")
        for name in ("server", "server-expired", "server-not-yet-valid", "server-wrong-host",
                     "server-no-server-auth", "server-rsa1024"):
            files[f"{name}.pem"] = pki.read(name) + intermediate
            files[f"{name}.key"] = pki.read(name, "key")
        files["server-self-signed.pem"] = pki.read("server-self-signed")
        files["server-self-signed.key"] = pki.read("server-self-signed", "key")
        files["server-untrusted-root.pem"] = pki.read("server-untrusted-root")
        files["server-untrusted-root.key"] = pki.read("server-untrusted-root", "key")
        files["server-issuer-not-ca.pem"] = pki.read("server-issuer-not-ca") + pki.read("not-a-ca") + intermediate
        files["server-issuer-not-ca.key"] = pki.read("server-issuer-not-ca", "key")

        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name, text in sorted(files.items()):
            path = out / name
            path.write_text(text)
            os.chmod(path, 0o600 if name.endswith(".key") else 0o644)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
