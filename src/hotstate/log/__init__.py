"""Segmented append-only log: CRC-checked record batches, leader-epoch file, crash recovery.

Used by the metadata quorum (fsync="always") and by partition replicas (fsync="never"). See log.py.
"""

from hotstate.log.batch import RecordBatch
from hotstate.log.errors import CorruptLogError, LogError, OffsetOutOfRangeError
from hotstate.log.log import FsyncPolicy, Log

__all__ = ["CorruptLogError", "FsyncPolicy", "Log", "LogError", "OffsetOutOfRangeError", "RecordBatch"]
