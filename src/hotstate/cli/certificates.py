"""Certificates for a local cluster (`hotstate cluster up --tls`): a CA and one certificate per server,
made with `cryptography` (no openssl command).

Keys are ECDSA P-256 (fast to make and to handshake with) and are written readable by their owner only.
A server's certificate serves both ends of its connections (serverAuth and clientAuth): servers dial each
other, and with `rpc.tls.client.auth=required` they present it as clients too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 825  # what browsers and most TLS clients still accept for a leaf certificate


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert_file: Path
    key_file: Path


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    files: Issued

    @staticmethod
    def create(
        directory: Path, name: str = "hotstate local CA", *, days: int = CA_DAYS
    ) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        files = _write(directory, "ca", cert, key)
        return CertificateAuthority(cert, key, files)

    @staticmethod
    def load(directory: Path) -> CertificateAuthority:
        """The CA `create` wrote in `directory` (e.g. a local cluster's, to issue another certificate)."""
        cert_file, key_file = directory / "ca.crt", directory / "ca.key"
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_file}: not the EC key of a CA made by hotstate")
        return CertificateAuthority(cert, key, Issued(cert_file.resolve(), key_file.resolve()))

    def issue(
        self,
        directory: Path,
        name: str,
        hosts: Iterable[str],
        *,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
    ) -> Issued:
        """A certificate for `name` valid for `hosts` (names and IP addresses), good for a server and a
        client, written as NAME.crt and NAME.key in `directory`. `not_before`/`not_after` default to now
        and CERT_DAYS from now (tests give other bounds, e.g. an expired certificate)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        names: list[x509.GeneralName] = []
        for host in dict.fromkeys(hosts):  # in order, once each
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - dt.timedelta(minutes=5))
            .not_valid_after(not_after or now + dt.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        return _write(directory, name, cert, key)


def _write(directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Created with owner-only permissions rather than chmod-ed afterwards: never readable by others.
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return Issued(cert_file.resolve(), key_file.resolve())
