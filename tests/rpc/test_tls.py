"""TLS under the RPC handshake, on real loopback sockets in one process: mutual TLS serves; a certificate
from another CA, an expired one, one for another name, a plain client on a TLS port and a TLS client on a
plain port are each refused with a message naming the peer and what was wrong, and the server keeps
serving. Both event loops run it: asyncio's (tests, clients) and uvloop (servers)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvloop

from hotstate.cli.certificates import CertificateAuthority, Issued
from hotstate.rpc import Connection, HandshakeError, NotConnected, RpcServer
from hotstate.tls import TlsFilesError, client_context, server_context

from .helpers import CLUSTER, SECRET, Ping, Pong, make_server, transport_registry

# One worker takes the whole module, so its module-scoped fixture starts once (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("rpc_tls")

REGISTRY = transport_registry()
PAST = (dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2021, 1, 1, tzinfo=dt.UTC))


@dataclass(frozen=True)
class Pki:
    ca: CertificateAuthority
    server: Issued
    client: Issued
    expired: Issued
    other_name: Issued
    other_ca: CertificateAuthority
    other_client: Issued
    expired_client: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.create(root / "ca")
    other = CertificateAuthority.create(root / "other")
    return Pki(
        ca=ca,
        server=ca.issue(root / "ca", "server", ["127.0.0.1", "localhost"]),
        client=ca.issue(root / "ca", "client", ["client"]),
        expired=ca.issue(root / "ca", "expired", ["127.0.0.1"], not_before=PAST[0], not_after=PAST[1]),
        other_name=ca.issue(root / "ca", "other-name", ["other.example"]),
        other_ca=other,
        other_client=other.issue(root / "other", "client", ["client"]),
        expired_client=ca.issue(
            root / "ca", "expired-client", ["client"], not_before=PAST[0], not_after=PAST[1]
        ),
    )


def tls_server(pki: Pki, issued: Issued | None = None, *, client_auth: bool = False) -> RpcServer:
    files = issued or pki.server
    context = server_context(
        files.cert_file, files.key_file, ca_file=pki.ca.files.cert_file, client_auth=client_auth
    )
    return make_server(REGISTRY, tls=context)


def client(pki: Pki, *, ca: Path | None = None, cert: Issued | None = None) -> ssl.SSLContext:
    return client_context(
        ca_file=ca or pki.ca.files.cert_file,
        cert_file=cert.cert_file if cert else None,
        key_file=cert.key_file if cert else None,
    )


def connection(server: RpcServer, tls: ssl.SSLContext | None, node_id: int = 9) -> Connection:
    return Connection(
        "127.0.0.1",
        server.port,
        cluster_id=CLUSTER,
        secret=SECRET,
        node_id=node_id,
        registry=REGISTRY,
        tls=tls,
        backoff_initial=0.01,
        backoff_max=0.1,
    )


async def ping(server: RpcServer, tls: ssl.SSLContext | None) -> object:
    conn = connection(server, tls)
    try:
        return await conn.request(Ping(1, b"x"), timeout=5)
    finally:
        await conn.close()


LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    runner = LOOPS[request.param]

    def bounded(coroutine: Coroutine[Any, Any, Any]) -> Any:
        async def main() -> Any:
            async with asyncio.timeout(20):
                return await coroutine

        return runner(main())

    return bounded


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_mutual_tls_serves_and_the_handshake_still_checks_the_secret(pki: Pki, run: Any) -> None:
    async def main() -> None:
        async with tls_server(pki, client_auth=True) as server:
            assert await ping(server, client(pki, cert=pki.client)) == Pong(1, b"x")
            # TLS encrypts; membership is still the secret's to prove.
            intruder = Connection(
                "127.0.0.1",
                server.port,
                cluster_id=CLUSTER,
                secret=b"wrong-secret-here",
                node_id=9,
                registry=REGISTRY,
                tls=client(pki, cert=pki.client),
            )
            with pytest.raises(HandshakeError, match="authentication failed"):
                await intruder.request(Ping(1), timeout=5)
            await intruder.close()

    run(main())


@pytest.mark.parametrize(
    ("server_cert", "trusted", "expected"),
    [
        ("server", "other", "unable to get local issuer certificate (unknown CA"),
        ("expired", "ours", "certificate has expired"),
        ("other_name", "ours", "IP address mismatch, certificate is not valid for '127.0.0.1'"),
    ],
)
def test_a_server_certificate_the_client_refuses_names_the_peer_and_why(
    pki: Pki, run: Any, server_cert: str, trusted: str, expected: str
) -> None:
    ca = pki.other_ca.files.cert_file if trusted == "other" else None

    async def main() -> None:
        async with tls_server(pki, getattr(pki, server_cert)) as server:
            with pytest.raises(HandshakeError) as refused:
                await ping(server, client(pki, ca=ca))
            message = str(refused.value)
            assert f"TLS: certificate of 127.0.0.1:{server.port} refused: {expected}" in message, message
            assert message.endswith("(certificate verify failed)"), message
            if server_cert == "server":
                assert await ping(server, client(pki)) == Pong(1, b"x")  # still serving

    run(main())


@pytest.mark.parametrize(
    ("client_cert", "logged"),
    [
        (None, "no client certificate, and this listener requires one"),
        ("other_client", "unable to get local issuer certificate (unknown CA"),
        ("expired_client", "certificate has expired"),
    ],
)
def test_client_certificates_are_required_and_refusals_are_logged_naming_the_client(
    pki: Pki, run: Any, caplog: pytest.LogCaptureFixture, client_cert: str | None, logged: str
) -> None:
    cert = getattr(pki, client_cert) if client_cert else None

    async def main() -> None:
        async with tls_server(pki, client_auth=True) as server:
            with pytest.raises(
                NotConnected, match="a client certificate from the cluster's CA may be required"
            ):
                await ping(server, client(pki, cert=cert))
            assert await ping(server, client(pki, cert=pki.client)) == Pong(1, b"x")

    with caplog.at_level(logging.WARNING, logger="hotstate"):
        run(main())
    lines = [w for w in warnings_of(caplog) if w.startswith("refused RPC connection from 127.0.0.1:")]
    assert len(lines) == 1 and logged in lines[0], warnings_of(caplog)


def test_plain_client_on_a_tls_port_and_tls_client_on_a_plain_port_are_refused_clearly(
    pki: Pki, run: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with tls_server(pki) as server:
            with pytest.raises(NotConnected) as plain:
                await ping(server, None)
            assert f"cannot connect to 127.0.0.1:{server.port}" in str(plain.value)
            assert "if its rpc listener uses TLS, connect with TLS" in str(plain.value)
            # Many plain attempts: the server logs one line for them and keeps serving.
            for _ in range(5):
                with pytest.raises(NotConnected):
                    await ping(server, None)
            assert await ping(server, client(pki)) == Pong(1, b"x")
        async with make_server(REGISTRY) as plain_server:
            with pytest.raises(HandshakeError) as tls_to_plain:
                await ping(plain_server, client(pki))
            assert f"TLS handshake with 127.0.0.1:{plain_server.port} failed" in str(tls_to_plain.value)
            assert "does its rpc listener use TLS?" in str(tls_to_plain.value)
            assert await ping(plain_server, None) == Pong(1, b"x")

    with caplog.at_level(logging.WARNING, logger="hotstate"):
        run(main())
    warnings = warnings_of(caplog)
    refused = [w for w in warnings if w.startswith("refused RPC connection")]
    assert len(refused) == 1 and "the other end does not speak TLS (plain TCP?)" in refused[0], warnings
    assert any("the peer speaks TLS and this end does not" in w for w in warnings), warnings


def test_unusable_files_are_refused_naming_the_file(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(TlsFilesError, match=r"certificate file '.*missing.crt': no such file"):
        server_context(tmp_path / "missing.crt", pki.server.key_file)
    with pytest.raises(TlsFilesError, match="the key must belong to the certificate"):
        server_context(pki.server.cert_file, pki.client.key_file)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsFilesError, match=r"CA '.*garbage.pem': not a PEM certificate"):
        client_context(ca_file=garbage)
    with pytest.raises(TlsFilesError, match="no CA file"):
        server_context(pki.server.cert_file, pki.server.key_file, client_auth=True)
    context = client_context(ca_file=pki.ca.files.cert_file)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2 and context.check_hostname
    assert (pki.server.key_file.stat().st_mode & 0o777) == 0o600
