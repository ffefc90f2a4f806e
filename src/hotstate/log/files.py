"""Small durable files beside the segments: atomic replace, directory fsync, the log-start-offset file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

START_OFFSET_FILE = "log-start-offset"
# Present only between close() and the next open(): the last shutdown flushed everything.
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
_START_OFFSET_VERSION = 0


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and deletions in `directory` durable (POSIX keeps them in the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, fsync: bool) -> None:
    """Replace `path` so that a reader (or a crash) sees the old or the new content, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StartOffsetState(NamedTuple):
    start_offset: int
    # Set while a reset() is under way: on open, a pending reset is finished before anything else, so a
    # crash in the middle of one never leaves a mix of old segments and the new start.
    reset_pending: bool


def read_start_offset(directory: Path) -> StartOffsetState | None:
    """The persisted log start, or None when the file is missing or unreadable."""
    try:
        lines = (directory / START_OFFSET_FILE).read_text("ascii").split("\n")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    try:
        if len(lines) != 3 or lines[2] != "" or int(lines[0]) != _START_OFFSET_VERSION:
            return None
        offset_text, pending_text = lines[1].split(" ")
        offset, pending = int(offset_text), int(pending_text)
    except ValueError:
        return None
    if offset < 0 or pending not in (0, 1):
        return None
    return StartOffsetState(offset, bool(pending))


def write_start_offset(directory: Path, state: StartOffsetState, *, fsync: bool) -> None:
    text = f"{_START_OFFSET_VERSION}\n{state.start_offset} {int(state.reset_pending)}\n"
    atomic_write(directory / START_OFFSET_FILE, text.encode("ascii"), fsync=fsync)
