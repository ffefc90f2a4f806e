"""Views a server holds open for feeds on other servers reading one of its partitions' current rows in
pages (a remote snapshot or resync), pure: the view's rows are an iterator over one consistent view of the
store (a RocksDB iterator opened when the view was), so every page of a view is a part of the same rows at
the same position, whatever is written between pages.

A server holds at most `limit` views; each expires `ttl_s` after its last page was taken (a reader that
went away frees it then), and goes at once when its last page was taken. A page request names the view and
the cursor its reader has (the last key of the page before): a mismatch (a page lost or asked twice) is
refused, and the reader starts over with a new view, so no row is skipped or sent twice.

No clocks: `now` is given by the caller (server/feeds.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["HeldView", "ViewError", "Views"]


class ViewError(Exception):
    """A page of a view that is not (or no longer) held, or asked out of step."""


@dataclass(slots=True)
class HeldView:
    view_id: int
    rows: Iterator[tuple[bytes, bytes]] = field(repr=False)
    position: int
    epoch: int
    expires: float
    cursor: bytes | None = None  # the last key taken
    busy: bool = False  # a page is being read (in steps): no other request may take from it
    done: bool = False  # its rows ran out


class Views:
    def __init__(self, limit: int = 16, ttl_s: float = 30.0) -> None:
        self.limit = max(1, limit)
        self.ttl_s = ttl_s
        self._views: dict[int, HeldView] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._views)

    def open(self, rows: Iterator[tuple[bytes, bytes]], position: int, epoch: int, now: float) -> HeldView:
        """Hold a view (`rows`, of the store at `position`). Raises ViewError when `limit` views are held
        and none has expired."""
        self.expire(now)
        if len(self._views) >= self.limit:
            raise ViewError(f"{len(self._views)} snapshot views are open here, the limit: try again later")
        view = HeldView(next(self._ids), rows, position, epoch, now + self.ttl_s)
        self._views[view.view_id] = view
        return view

    def resume(self, view_id: int, after: bytes | None, now: float) -> HeldView:
        """The view `view_id` for its next page, its reader having the rows up to `after`. Raises
        ViewError."""
        self.expire(now)
        view = self._views.get(view_id)
        if view is None:
            raise ViewError(f"snapshot view {view_id} is not open here (expired, or read to its end)")
        if view.busy:
            raise ViewError(f"snapshot view {view_id} is being read by another request")
        if after != view.cursor:
            self.close(view_id)
            raise ViewError(f"snapshot view {view_id} was asked for the page after {after!r}, not its next")
        return view

    def take(self, view: HeldView, count: int, max_bytes: int | None = None) -> list[tuple[bytes, bytes]]:
        """Up to `count` more rows of `view`, stopping once they reach `max_bytes` (at least one row);
        `done` when it ran out."""
        if max_bytes is None:
            rows = list(itertools.islice(view.rows, max(0, count)))
            if len(rows) < count:
                view.done = True
        else:
            rows = []
            size = 0
            while len(rows) < count and (size < max_bytes or not rows):
                row = next(view.rows, None)
                if row is None:
                    view.done = True
                    break
                rows.append(row)
                size += len(row[0]) + len(row[1])
        if rows:
            view.cursor = rows[-1][0]
        return rows

    def finish(self, view: HeldView, now: float) -> None:
        """A page of `view` was read: it goes if it ran out, else it is held `ttl_s` more."""
        view.busy = False
        if view.done:
            self.close(view.view_id)
        else:
            view.expires = now + self.ttl_s

    def close(self, view_id: int) -> None:
        view = self._views.pop(view_id, None)
        if view is not None:
            close = getattr(view.rows, "close", None)
            if close is not None:
                close()  # a generator over a RocksDB iterator: release the view now

    def close_all(self) -> None:
        for view_id in list(self._views):
            self.close(view_id)

    def expire(self, now: float) -> list[int]:
        """Drop the views whose reader has not asked for a page in `ttl_s`: their ids."""
        gone = [i for i, v in self._views.items() if v.expires <= now and not v.busy]
        for view_id in gone:
            self.close(view_id)
        return gone
