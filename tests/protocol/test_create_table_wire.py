"""CreateTableRequest version 4: the standby count may be absent (the server that takes the request
fills in its num.standby.replicas), and version 3 requests, which always carry one, still decode."""

from __future__ import annotations

import msgpack
import pytest

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import CreateTableRequest
from hotstate.protocol.wire import MESSAGES
from hotstate.rpc.schema import DecodeError

KEY = (KeyColumn("user", KeyType.STRING),)


@pytest.mark.parametrize("standbys", [None, 0, 2])
def test_a_create_round_trips_with_or_without_a_standby_count(standbys: int | None) -> None:
    request = CreateTableRequest("clicks", 4, standbys, KEY, None, "az-a")
    assert MESSAGES.decode(MESSAGES.encode(request)) == request


def test_a_version_3_request_still_decodes() -> None:
    type_id, version, fields = MESSAGES.to_wire(CreateTableRequest("clicks", 4, 1, KEY, None))
    assert version == 4
    old = MESSAGES.decode(msgpack.packb([type_id, 3, fields]))
    assert old == CreateTableRequest("clicks", 4, 1, KEY, None)


def test_a_newer_version_is_refused_rather_than_misread() -> None:
    type_id, _, fields = MESSAGES.to_wire(CreateTableRequest("clicks", 4, None, KEY, None))
    with pytest.raises(DecodeError, match="newer"):
        MESSAGES.decode(msgpack.packb([type_id, 5, fields]))
