"""What the client says when a plain-HTTP request meets a server whose HTTP API uses TLS: the TLS layer
drops the request, closing the connection or resetting it (which one is a matter of timing)."""

from __future__ import annotations

import httpx
import pytest

from hotstate.client.query import unreachable_hint

HINT = "use https:// addresses and give the CA"


@pytest.mark.parametrize(
    "error",
    [
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("[Errno 104] Connection reset by peer"),
    ],
)
def test_a_dropped_plain_http_request_says_to_use_https(error: httpx.TransportError) -> None:
    said = unreachable_hint(error, "http://127.0.0.1:9001/v1/query")
    assert HINT in str(said) and str(error) in str(said) and type(said) is type(error)
    assert unreachable_hint(error, "https://127.0.0.1:9001/v1/query") is error  # TLS already: no such hint


def test_other_failures_are_left_as_they_are() -> None:
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    assert unreachable_hint(refused, "http://127.0.0.1:9001/v1/query") is refused
