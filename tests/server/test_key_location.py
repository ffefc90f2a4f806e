"""Where a key lives (http/key_location.py): the partition the writer and the router compute, its holders
with their addresses, liveness and lags, and a clear error for anything that is not a key of the table."""

from __future__ import annotations

import datetime as dt

import pytest

from hotstate.controller.image import MetadataImage, PartitionInfo, ServerInfo, TableInfo
from hotstate.controller.records import Endpoint, KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.replica.messages import LagInfo
from hotstate.routing.lags import LagTable
from hotstate.server.http.key_location import KeyLocationError, encoded_key, locate

CLICKS = TableInfo("clicks", 1, 4, 1, (KeyColumn("user", KeyType.STRING),), None)
EVENTS = TableInfo(
    "events",
    2,
    4,
    1,
    (KeyColumn("id", KeyType.INT), KeyColumn("at", KeyType.TIMESTAMP), KeyColumn("tag", KeyType.BYTES)),
    None,
)


FLAGS = TableInfo("flags", 3, 2, 1, (KeyColumn("on", KeyType.BOOL),), None)


def _server(node: int) -> ServerInfo:
    return ServerInfo(
        node,
        "x",
        Endpoint("127.0.0.1", 9000 + node),
        Endpoint("127.0.0.1", 8000 + node),
        f"az-{node}",
        (),
        (),
        False,
        0,
    )


def _image() -> MetadataImage:
    parts = {
        table.table_id: tuple(
            PartitionInfo(table.table_id, p, (1 + p % 3, 1 + (p + 1) % 3), 1 + p % 3, (), 7, (1 + p % 3,))
            for p in range(4)
        )
        for table in (CLICKS, EVENTS)
    }
    return MetadataImage(5, {n: _server(n) for n in (1, 2, 3)}, {"clicks": CLICKS, "events": EVENTS}, parts)


def test_a_key_is_located_where_the_writer_puts_it_with_its_holders() -> None:
    lags = LagTable()
    key = encoded_key(CLICKS, "u42", {})
    assert key == encode_key(("u42",))
    partition = partition_for(key, 4)
    active, standby = 1 + partition % 3, 1 + (partition + 1) % 3
    lags.update(standby, [LagInfo("clicks", 1, partition, "standby", 90, 100, 10, 7, 100, True)], now_ms=1)
    answer = locate(_image(), CLICKS, key, lags=lags, alive=lambda node: node != standby)
    assert answer["partition"] == partition and answer["leader_epoch"] == 7
    assert answer["active"] == {
        "server": active,
        "http": f"127.0.0.1:{8000 + active}",
        "rack": f"az-{active}",
        "alive": True,
        "state": None,  # no lag report from it yet
        "offset_lag": None,
    }
    [held] = answer["standbys"]
    assert (held["server"], held["alive"], held["state"], held["offset_lag"]) == (
        standby,
        False,
        "standby",
        10,
    )
    assert answer["in_sync"] == [active]


def test_a_compound_key_is_named_column_by_column_each_read_as_its_type() -> None:
    at = "2026-01-02T03:04:05+00:00"
    key = encoded_key(EVENTS, None, {"id": "17", "at": at, "tag": "0aff"})
    assert key == encode_key((17, dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), b"\x0a\xff"))


@pytest.mark.parametrize(
    ("table", "path_key", "params", "message"),
    [
        (EVENTS, "17", {}, "has a compound key (id, at, tag): name each column"),
        (EVENTS, None, {"id": "17", "at": "2026-01-02"}, "key column 'tag' of events is missing"),
        (EVENTS, None, {"id": "x", "at": "2026-01-02", "tag": "00"}, "key column 'id' is BIGINT: 'x'"),
        (EVENTS, None, {"id": "1", "at": "yesterday", "tag": "00"}, "at"),
        (EVENTS, None, {"id": "1", "at": "2026-01-02", "tag": "zz"}, "key column 'tag' is BYTES"),
        (CLICKS, None, {"user": "a", "day": "1"}, "not key columns of clicks: day (key: user)"),
        (FLAGS, "maybe", {}, "'on'"),
        (FLAGS, None, {"day": "1"}, "not key columns of flags: day (key: on)"),
    ],
)
def test_what_is_not_a_key_of_the_table_is_refused_naming_why(
    table: TableInfo, path_key: str | None, params: dict[str, str], message: str
) -> None:
    with pytest.raises(KeyLocationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        encoded_key(table, path_key, params)


def test_a_windowed_key_is_located_by_the_key_alone_where_all_its_windows_live() -> None:
    from hotstate.controller.records import TableWindow
    from hotstate.protocol.keys import window_suffix

    key = (
        KeyColumn("user", KeyType.STRING),
        KeyColumn("WINDOWSTART", KeyType.WINDOW_START),
        KeyColumn("WINDOWEND", KeyType.WINDOW_END),
    )
    windowed = TableInfo(
        "w", 9, 8, 1, key, None, window=TableWindow("window", "TUMBLING", 60_000_000, 60_000_000)
    )
    alone = encoded_key(windowed, "u7", {})
    named = encoded_key(windowed, None, {"user": "u7"})
    full = encoded_key(
        windowed,
        None,
        {"user": "u7", "WINDOWSTART": "2026-01-01T00:00:00", "WINDOWEND": "2026-01-01T00:01:00"},
    )
    written = encode_key(("u7", dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 1, 0, 1)))
    assert full == written
    partitions = {partition_for(k, 8, window_suffix(key)) for k in (alone, named, full)}
    assert partitions == {partition_for(encode_key(("u7",)), 8)}
