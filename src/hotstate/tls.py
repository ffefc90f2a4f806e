"""TLS for the RPC transport and the HTTP API: `ssl.SSLContext`s built from certificate files, and errors
that name the peer and what was wrong with its certificate.

TLS encrypts; it does not replace the RPC handshake (rpc/handshake.py), which still proves that a peer holds
`cluster.secret`. Every context here allows TLS 1.2 and later only, and every client context checks the
peer's certificate against the CA and its host name (or IP address) against the certificate's names.
docs/security.md describes the settings and `hotstate cluster up --tls`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

logger = logging.getLogger(__name__)

__all__ = [
    "CLIENT_AUTH_CHOICES",
    "MIN_VERSION",
    "TlsFiles",
    "TlsFilesError",
    "TlsListener",
    "TlsOption",
    "client_context",
    "describe_tls_error",
    "server_context",
    "to_client_context",
]

MIN_VERSION = ssl.TLSVersion.TLSv1_2
CLIENT_AUTH_CHOICES = ("none", "required")

# What a client takes for TLS: a ready context, or the path of the CA certificate (PEM) to trust.
TlsOption: TypeAlias = ssl.SSLContext | str | os.PathLike[str] | None


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A listener's TLS settings (rpc.tls.* or http.tls.*): TLS is on when `cert_file` is set.

    `ca_file`: the CA that peers' certificates must chain to (default: the system's CAs);
    `client_auth`: "required" makes the listener ask every client for a certificate from `ca_file`."""

    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None
    client_auth: str = "none"

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


class TlsFilesError(ValueError):
    """A certificate, key or CA file that cannot be used; names the setting, the file and why."""


def _check_file(what: str, path: str | os.PathLike[str]) -> None:
    if not os.path.isfile(path):
        raise TlsFilesError(f"{what} {os.fspath(path)!r}: no such file")
    if not os.access(path, os.R_OK):
        raise TlsFilesError(f"{what} {os.fspath(path)!r}: not readable")


def _load_chain(
    context: ssl.SSLContext, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]
) -> None:
    _check_file("certificate file", cert_file)
    _check_file("key file", key_file)
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as error:
        raise TlsFilesError(
            f"certificate {os.fspath(cert_file)!r} with key {os.fspath(key_file)!r}: cannot be used "
            f"({error.reason or error}); both must be PEM and the key must belong to the certificate"
        ) from None


def _load_ca(context: ssl.SSLContext, ca_file: str | os.PathLike[str] | None, ca_data: str | None) -> None:
    if ca_file is None and ca_data is None:
        context.load_default_certs()
        return
    if ca_file is not None:
        _check_file("CA file", ca_file)
    try:
        context.load_verify_locations(cafile=ca_file, cadata=ca_data)
    except ssl.SSLError as error:
        source = repr(os.fspath(ca_file)) if ca_file is not None else "data"
        raise TlsFilesError(f"CA {source}: not a PEM certificate ({error.reason or error})") from None


def server_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    *,
    ca_file: str | os.PathLike[str] | None = None,
    client_auth: bool = False,
    alpn: tuple[str, ...] = (),
) -> ssl.SSLContext:
    """A listener's context. With `client_auth`, clients must present a certificate from `ca_file`.
    `alpn`: the application protocols offered, most preferred first (HTTP: h2, then http/1.1)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MIN_VERSION
    if alpn:
        context.set_alpn_protocols(list(alpn))
    _load_chain(context, cert_file, key_file)
    if client_auth:
        if ca_file is None:
            raise TlsFilesError("client certificates are required but no CA file says which to trust")
        context.verify_mode = ssl.CERT_REQUIRED
        _load_ca(context, ca_file, None)
    return context


def client_context(
    *,
    ca_file: str | os.PathLike[str] | None = None,
    ca_data: str | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A client's context: trusts `ca_file` / `ca_data` (PEM), else the system's CAs; checks host names.
    `cert_file` and `key_file`: the certificate to present to a server that requires one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname by default
    context.minimum_version = MIN_VERSION
    _load_ca(context, ca_file, ca_data)
    if cert_file is not None or key_file is not None:
        if cert_file is None or key_file is None:
            raise TlsFilesError("a client certificate needs both its certificate file and its key file")
        _load_chain(context, cert_file, key_file)
    return context


def to_client_context(tls: TlsOption) -> ssl.SSLContext | None:
    """A client's `tls` argument as a context: a path is the CA certificate file to trust."""
    if tls is None or isinstance(tls, ssl.SSLContext):
        return tls
    return client_context(ca_file=tls)


# OpenSSL's reasons for a failed handshake, in words an operator can act on.
_REASONS = {
    "WRONG_VERSION_NUMBER": "the other end does not speak TLS (plain TCP?)",
    "UNSUPPORTED_PROTOCOL": "no TLS version both ends accept (at least TLS 1.2 is needed)",
    "TLSV1_ALERT_UNKNOWN_CA": "the peer does not trust our certificate (unknown CA)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the peer refused our certificate (bad certificate)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the peer refused our certificate: expired",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the peer requires a client certificate and we sent none",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no client certificate, and this listener requires one",
    "HTTP_REQUEST": "plain HTTP sent to a TLS port",
}


def describe_tls_error(error: BaseException | None, peer: str) -> str | None:
    """What a TLS failure with `peer` (host:port) means, or None if `error` is not about TLS.

    A certificate we refuse reads "TLS: certificate of 127.0.0.1:9092 refused: certificate has expired
    (certificate verify failed)"; OpenSSL's `verify_message` says which check failed (expired, hostname
    mismatch, unknown CA as "unable to get local issuer certificate" or "self-signed certificate").
    An error raised because of a TLS error (httpx's ConnectError) is described by its cause."""
    for _ in range(5):  # an httpx error wraps httpcore's, which wraps the ssl module's
        if error is None or isinstance(error, ssl.SSLError):
            break
        error = error.__cause__ or error.__context__
    if isinstance(error, ssl.SSLCertVerificationError):
        what = (error.verify_message or error.reason or str(error)).rstrip(".")
        hint = ""
        if error.verify_code in (19, 20, 21):  # self-signed in chain, unknown issuer, cannot verify leaf
            hint = " (unknown CA: is the right CA certificate given?)"
        return f"TLS: certificate of {peer} refused: {what}{hint} (certificate verify failed)"
    if isinstance(error, ssl.SSLError):
        reason = error.reason or ""
        if reason in _REASONS:
            return f"TLS handshake with {peer} failed: {_REASONS[reason]}"
        return f"TLS handshake with {peer} failed: {reason or error}"
    return None


# A peer whose TLS handshake fails is logged at WARNING at most this often per host and reason (then at
# DEBUG): a misconfigured server retries every fraction of a second.
REFUSAL_LOG_INTERVAL_S = 60.0


class TlsListener:
    """A TLS listening socket that, unlike `loop.create_server(ssl=...)`, hears of every failed handshake
    (plain TCP, a client certificate it refuses, a timeout) and logs it naming the client, one WARNING per
    host and reason a minute. Accepted connections get `protocol_factory()`'s protocol once TLS is up, as with
    create_server. Has what RpcServer uses of asyncio.Server: `sockets`, `close`, `wait_closed`."""

    def __init__(
        self,
        listener: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        context: ssl.SSLContext,
        handshake_timeout: float,
        what: str,
    ) -> None:
        self.sockets = [listener]
        self._factory = protocol_factory
        self._context = context
        self._handshake_timeout = handshake_timeout
        self._what = what
        self._handshakes: set[asyncio.Task[None]] = set()
        self._logged: dict[str, float] = {}
        self._accepting = asyncio.get_running_loop().create_task(self._accept(), name=f"tls-accept {what}")

    @staticmethod
    async def start(
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str,
        port: int,
        context: ssl.SSLContext,
        *,
        handshake_timeout: float,
        what: str,
    ) -> TlsListener:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        if not infos:
            raise OSError(f"cannot resolve {host!r}")
        family, kind, proto, _, address = infos[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(socket.SOMAXCONN)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        return TlsListener(listener, protocol_factory, context, handshake_timeout, what)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        (listener,) = self.sockets
        while True:
            try:
                connection, address = await loop.sock_accept(listener)
            except OSError as error:  # e.g. out of file descriptors: keep listening
                logger.warning("%s listener: accept failed: %s", self._what, error)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._handshake(connection, address))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, connection: socket.socket, address: object) -> None:
        loop = asyncio.get_running_loop()
        peer = _peer_text(address)
        try:
            await loop.connect_accepted_socket(
                self._factory,
                connection,
                ssl=self._context,
                ssl_handshake_timeout=self._handshake_timeout,
            )
        except asyncio.CancelledError:
            connection.close()
            raise
        except Exception as error:  # this connection only
            connection.close()
            if isinstance(error, ConnectionAbortedError) and "taking longer" in str(error):
                reason = f"TLS handshake timed out after {self._handshake_timeout:g} s"
            elif isinstance(error, ConnectionError | ssl.SSLEOFError):
                # A client that refused our certificate (it logs why) or a liveness probe (suspects.py),
                # which connects and leaves: not worth a WARNING here.
                logger.info("%s connection from %s closed during the TLS handshake", self._what, peer)
                return
            else:
                reason = describe_tls_error(error, peer) or f"TLS handshake failed: {error!r}"
            # The reason without the client's port: one line per host and kind of failure.
            kind = reason.replace(peer, peer.rpartition(":")[0])
            self._refused(
                f"{peer.rpartition(':')[0]} {kind}", f"refused {self._what} connection from {peer}: {reason}"
            )

    def _refused(self, key: str, line: str) -> None:
        now = time.monotonic()
        if len(self._logged) > 1000:  # bounded: many hosts failing is one incident, not a memory leak
            self._logged.clear()
        if now - self._logged.get(key, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            self._logged[key] = now
            logger.warning("%s", line)
        else:
            logger.debug("%s", line)

    def close(self) -> None:
        self._accepting.cancel()
        for task in self._handshakes:
            task.cancel()
        for listener in self.sockets:
            listener.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(self._accepting, *self._handshakes, return_exceptions=True)


def _peer_text(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), int(address[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(address)


@dataclass(frozen=True)
class PemTexts:
    """A client's TLS material as PEM text, not paths: what the Spark sink ships to its executors, which
    need not have the driver's files. `cert` and `key`: the client certificate a server requiring one
    (rpc.tls.client.auth=required) checks."""

    ca: str | None = field(default=None, repr=False)
    cert: str | None = field(default=None, repr=False)
    key: str | None = field(default=None, repr=False)

    @staticmethod
    def read(
        ca_file: str | os.PathLike[str] | None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
    ) -> PemTexts:
        """The files' texts, checked here (a bad file fails on the driver, not on every executor)."""
        if (cert_file is None) != (key_file is None):
            raise TlsFilesError("a client certificate needs both its certificate file and its key file")
        texts = PemTexts(*(None if f is None else _text(f) for f in (ca_file, cert_file, key_file)))
        if texts:
            client_context(ca_file=ca_file, cert_file=cert_file, key_file=key_file)
        return texts

    def __bool__(self) -> bool:
        return self.ca is not None or self.cert is not None

    def context(self) -> ssl.SSLContext | None:
        """The client context (None: no TLS). Python's ssl loads a certificate chain from files only, so
        a certificate and key are written once per process to a private temporary directory."""
        if not self:
            return None
        if self.cert is None or self.key is None:
            return client_context(ca_data=self.ca)
        cert_file, key_file = _pem_files(self.cert, self.key)
        return client_context(ca_data=self.ca, cert_file=cert_file, key_file=key_file)


def _text(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise TlsFilesError(f"{os.fspath(path)!r}: not a readable PEM file: {error}") from None


@functools.lru_cache(maxsize=8)
def _pem_files(cert: str, key: str) -> tuple[str, str]:
    directory = tempfile.mkdtemp(prefix="hotstate-tls-")  # mode 0700
    atexit.register(shutil.rmtree, directory, True)
    paths = []
    for name, text in (("client.crt", cert), ("client.key", key)):
        path = os.path.join(directory, name)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
        paths.append(path)
    return paths[0], paths[1]
