"""HTTP/2 on the HTTP port, handed over from HTTP/1.1: a connection that starts with HTTP/2's preface (prior
knowledge), or a request that asks to upgrade (`Upgrade: h2c`, answered 101 and then over HTTP/2 as
stream 1), goes to http/http2.py's `Http2Protocol`. Only a connection's first bytes and each request's Upgrade
header are looked at, so HTTP/1.1 keeps uvicorn's httptools path as it was.
"""

from __future__ import annotations

import sys
import urllib.parse
from typing import Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hotstate.server.http.http2 import PREFACE, Http2Protocol
from hotstate.server.http.limits import RequestLimits
from hotstate.server.http.queries import MAX_BODY_BYTES  # a request that upgrades is read whole first


class Http2Handoff(RequestLimits):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._first_bytes: bytes | None = b""  # None once the connection is known to be HTTP/1.1
        self._h2c_settings: bytes | None = None  # the request asks to upgrade to HTTP/2
        self._h2c_offset = -1  # where the upgrading request's head ended in the last bytes read
        self._h2c_length = 0
        self._h2c_body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        if self.over_cap:
            return
        if self._first_bytes is not None:
            data = self._first_bytes + data
            if data[: len(PREFACE)] != PREFACE[: len(data)]:  # not HTTP/2's preface: HTTP/1.1
                self._first_bytes = None
            elif len(data) < len(PREFACE):  # could still be the preface
                self._first_bytes = data
                return
            else:
                self._switch_to_http2(data)
                return
        if self._h2c_offset < 0:
            HttpToolsProtocol.data_received(self, data)  # not super(): this runs for every read
            if self._h2c_offset < 0:  # set during that call when the request asks to upgrade
                return
            self._start_h2c()
            data = data[self._h2c_offset :]
        if not self.transport.is_closing():
            self._read_h2c_body(data)

    def on_headers_complete(self) -> None:
        self._h2c_settings = self._h2c_request() if self.parser.should_upgrade() else None
        HttpToolsProtocol.on_headers_complete(self)  # returns at once when upgrading (see _should_upgrade)

    def _start_h2c(self) -> None:
        length = next((value for name, value in self.headers if name == b"content-length"), b"0")
        try:
            self._h2c_length = int(length)
        except ValueError:
            self._h2c_length = -1
        if not 0 <= self._h2c_length <= MAX_BODY_BYTES:
            self.refuse(b"413 Content Too Large", f"request body larger than {MAX_BODY_BYTES} bytes")

    def _should_upgrade(self) -> bool:
        return self._h2c_settings is not None or super()._should_upgrade()

    def handle_websocket_upgrade(self) -> None:  # uvicorn's only upgrade hook; reached for h2c too
        if self._h2c_settings is None:
            super().handle_websocket_upgrade()
        else:  # the switch waits for the request's body, which follows the head (see data_received)
            error = sys.exc_info()[1]
            self._h2c_offset = error.args[0] if isinstance(error, httptools.HttpParserUpgrade) else 0

    def _h2c_request(self) -> bytes | None:
        """The HTTP2-Settings of a request that asks to upgrade to h2c (RFC 7540 3.2), else None. A chunked
        body is not read for an upgrade (curl and ksqlDB's clients send a Content-Length)."""
        if self._get_upgrade() != b"h2c" or any(name == b"transfer-encoding" for name, _ in self.headers):
            return None
        return next((value for name, value in self.headers if name == b"http2-settings"), None)

    def _read_h2c_body(self, data: bytes) -> None:
        """Bytes after an upgrading request's head: its body (Content-Length), then the switch."""
        self._h2c_body.append(data)
        received = sum(map(len, self._h2c_body))
        if received < self._h2c_length:
            return
        rest = b"".join(self._h2c_body)
        self._h2c_body = []
        self._h2c_offset = -1
        assert self._h2c_settings is not None
        protocol = self._switch_to_h2c(self._h2c_settings, rest[: self._h2c_length])
        if len(rest) > self._h2c_length:  # the client's preface, if it did not wait for the 101
            protocol.data_received(rest[self._h2c_length :])

    def _http2(self) -> Http2Protocol:
        self.stop_limits()
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        protocol = Http2Protocol(
            self.app,
            self.loop,
            connections=self.connections,
            tasks=self.tasks,
            app_state=self.app_state,
            server=self.server,
            client=self.client,
            idle_timeout_s=self.timeout_keep_alive,
            read_timeout_s=self.limits.read_timeout_s,
            max_header_bytes=self.limits.max_head_bytes,
        )
        transport = self.raw_transport()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return protocol

    def _switch_to_http2(self, data: bytes) -> None:
        self._first_bytes = None
        self._http2().start(data)

    def _switch_to_h2c(self, settings: bytes, body: bytes) -> Http2Protocol:
        scope = cast(dict[str, Any], self.scope)
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii", "replace")
        scope["path"] = urllib.parse.unquote(path) if "%" in path else path
        scope["raw_path"] = url.path
        scope["query_string"] = url.query or b""
        skip = (b"connection", b"upgrade", b"http2-settings", b"keep-alive", b"transfer-encoding")
        scope["headers"] = [(name, value) for name, value in self.headers if name not in skip]
        protocol = self._http2()
        protocol.start_upgraded(settings, scope, body)
        return protocol
