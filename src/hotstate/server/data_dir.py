"""The data directory's health, checked before a server starts and reported when a write on it fails.

A server refuses to start on a data directory it cannot write (read-only, full, missing permissions) or
whose metadata it cannot trust, with one line naming the directory and what is wrong and the exit code
`DISK_FAILURE_EXIT_CODE`, instead of a traceback halfway through opening its logs. A write that fails
while it runs ends it with the same code (docs/replication.md, "Bad disks").
"""

from __future__ import annotations

import os
from pathlib import Path

# sysexits.h EX_IOERR: a supervisor can tell a disk fault (fix the disk first) from a crash or a bad config.
DISK_FAILURE_EXIT_CODE = 74
_PROBE_FILE = ".write-check"
# A few pages, fsynced: a full disk refuses them where creating an empty file could still succeed.
_PROBE_BYTES = 16 * 1024


class DataDirError(Exception):
    """The data directory cannot be used, or what it holds cannot be trusted; the message says which."""


def check_writable(data_dir: Path) -> None:
    """Create `data_dir` if needed and prove it takes a synced write; DataDirError naming the cause if not."""
    probe = data_dir / _PROBE_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"\0" * _PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as error:
        with_cause = error.strerror or str(error)
        raise DataDirError(f"data directory {data_dir} is not writable: {with_cause}") from error
