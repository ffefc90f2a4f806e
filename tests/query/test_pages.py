"""The views a holder keeps for other servers' feeds reading a partition's rows in pages (query/pages.py),
and their messages on the wire."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hotstate.protocol.wire import MESSAGES
from hotstate.query.pages import ViewError, Views
from hotstate.replica.messages import FeedPageRequest, FeedPageResponse, FeedReadRequest, ReplicaError


def _rows(n: int) -> Iterator[tuple[bytes, bytes]]:
    return ((f"k{i:04}".encode(), b"v" * 10) for i in range(n))


def _read_all(views: Views, n: int, page: int, now: float = 0.0) -> list[list[tuple[bytes, bytes]]]:
    view = views.open(_rows(n), 7, 1, now)
    pages: list[list[tuple[bytes, bytes]]] = []
    cursor = None
    while True:
        view = views.resume(view.view_id, cursor, now) if pages else view
        view.busy = True
        rows = views.take(view, page)
        views.finish(view, now)
        pages.append(rows)
        cursor = view.cursor
        if view.done:
            return pages


def test_pages_of_one_view_give_every_row_once_in_order_and_free_it() -> None:
    views = Views()
    pages = _read_all(views, 25, 10)
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [k for p in pages for k, _ in p] == [f"k{i:04}".encode() for i in range(25)]
    assert len(views) == 0  # read to its end: freed


def test_an_exact_multiple_ends_with_an_empty_page() -> None:
    views = Views()
    pages = _read_all(views, 20, 10)
    assert [len(p) for p in pages] == [10, 10, 0]
    assert len(views) == 0


def test_a_byte_budget_stops_a_page_but_always_takes_a_row() -> None:
    views = Views()
    view = views.open(_rows(10), 0, 0, 0.0)
    assert len(views.take(view, 10, max_bytes=30)) == 2  # 15 bytes a row
    assert len(views.take(view, 10, max_bytes=1)) == 1
    assert view.cursor == b"k0002" and not view.done


def test_a_page_asked_out_of_step_is_refused_and_the_view_freed() -> None:
    views = Views()
    view = views.open(_rows(30), 0, 0, 0.0)
    views.take(view, 10)
    views.finish(view, 0.0)
    with pytest.raises(ViewError, match="not its next"):
        views.resume(view.view_id, b"k0004", 1.0)  # a repeated or lost page: never skip nor repeat rows
    with pytest.raises(ViewError, match="not open"):
        views.resume(view.view_id, b"k0009", 1.0)


def test_views_are_bounded_and_expire_when_their_reader_goes() -> None:
    views = Views(limit=2, ttl_s=30.0)
    first = views.open(_rows(5), 0, 0, 0.0)
    views.open(_rows(5), 0, 0, 10.0)
    with pytest.raises(ViewError, match="limit"):
        views.open(_rows(5), 0, 0, 20.0)
    third = views.open(_rows(5), 0, 0, 30.0)  # the first expired
    assert len(views) == 2
    with pytest.raises(ViewError, match="not open"):
        views.resume(first.view_id, None, 30.0)
    assert views.resume(third.view_id, None, 59.0) is third  # asked within its ttl
    views.finish(third, 59.0)  # held 30 s more from its last page
    assert views.expire(88.0) == []
    assert views.expire(89.0) == [third.view_id]


def test_a_view_being_read_is_neither_expired_nor_shared() -> None:
    views = Views(limit=1, ttl_s=1.0)
    view = views.open(_rows(5), 0, 0, 0.0)
    view.busy = True
    assert views.expire(100.0) == []
    with pytest.raises(ViewError, match="being read"):
        views.resume(view.view_id, None, 100.0)


def test_page_messages_round_trip_and_the_old_read_still_decodes() -> None:
    request = FeedPageRequest(3, 1, 9, b"k0009", 4000, 1 << 20, start=b"a", end=None)
    response = FeedPageResponse(ReplicaError.NONE, "", 9, 120, 2, ((b"k", b"v"),), True, b"k")
    for message in (request, response, FeedReadRequest(3, 1, 0, 0, 0, rows=True, by_keys=True)):
        assert MESSAGES.decode(MESSAGES.encode(message)) == message
    assert MESSAGES.to_wire(request)[0] == 181 and MESSAGES.to_wire(response)[0] == 182
