"""A quorum member's durable state on a real disk: the one place in `hotstate.raft` that does file IO.

The core never imports this module; a shell loads the state here to build a `RaftNode`, then hands every
`Ready` to `RaftStorage.write` before sending its messages. Layout under the member's directory:

    quorum-state               msgpack {epoch, voted_id, leader_id}, replaced atomically (tmp, fsync, rename)
    log/                       the metadata log (hotstate.log), one record per entry: msgpack [kind, data]
    snapshot-<end>-<epoch>     the latest snapshot: CRC32C + msgpack [end, epoch, reset_log, data, voters]
                               (voters: the sorted voter set at `end`, or nil for the bootstrap set;
                               files written before it existed have four fields)

Write order: quorum state, then each log operation in turn (a snapshot is durable before the log below it
is dropped), then one fsync of the log. Loading repairs the one gap a crash can leave, a snapshot saved
but the log not yet compacted or reset behind it.

Damage (docs/replication.md, "Bad disks"): every Ready is fsynced before any message about it leaves, so
a crash can tear only what no peer was told of: the tail of the last segment written since the last
fsync. Such a tail is cut on open (with a warning naming the file), as KRaft does, and the member fetches
it again from the leader. Damage anywhere else (a bad batch with valid ones after it, a bad batch in an
older segment) hit entries this member may have acknowledged, which a Raft leader counted toward a
commit: cutting them could let this member vote for a candidate missing a committed entry. Loading then
raises StorageError, and the server refuses to start, naming the file and byte.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import crc32c
import msgpack

from hotstate.log import Log, RecordBatch
from hotstate.log.errors import CorruptLogError
from hotstate.raft.quorum_state import QuorumState
from hotstate.raft.ready import AppendEntries, Ready, SaveSnapshot, TruncateTo
from hotstate.raft.records import Entry, EntryKind, Snapshot, SnapshotId

QUORUM_STATE_FILE = "quorum-state"
SNAPSHOT_PREFIX = "snapshot-"
_READ_BYTES = 16 * 1024 * 1024


class StorageError(Exception):
    """The member's durable state is unreadable; starting anyway could forget a vote or a commit."""


@dataclass(frozen=True, slots=True)
class LoadedState:
    quorum_state: QuorumState
    snapshot: Snapshot | None
    entries: list[Entry]


def encode_entry(entry: Entry) -> bytes:
    return msgpack.packb([int(entry.kind), entry.data])


def decode_entry(offset: int, epoch: int, record: bytes) -> Entry:
    kind, data = msgpack.unpackb(record)
    return Entry(offset, epoch, data, EntryKind(kind))


class RaftStorage:
    def __init__(self, directory: str | Path, *, segment_bytes: int = 1024 * 1024) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        # One fsync per Ready (in write) rather than one per batch: the log itself never syncs on its own.
        # Small segments: a snapshot frees the segments wholly below it, so they must not be huge.
        try:
            self.log = Log.open(
                self.directory / "log", fsync="never", segment_bytes=segment_bytes, flushed_by_caller=True
            )
        except CorruptLogError as error:
            raise _corrupt(error) from error
        self._snapshot_path: Path | None = None

    def close(self) -> None:
        self.log.close()

    # ------------------------------------------------------------------ loading
    def load(self) -> LoadedState:
        state = self._read_quorum_state()
        snapshot, reset_log = self._read_latest_snapshot()
        if snapshot is not None:
            end = snapshot.id.end_offset
            if self.log.start_offset > end:
                raise StorageError(
                    f"{self.log.directory}: log starts at {self.log.start_offset}, past the snapshot {end}"
                )
            if self.log.start_offset < end:
                # A crash came between saving the snapshot and dropping the log below it: finish the job.
                if reset_log or self.log.end_offset <= end:
                    self.log.reset(end)
                else:
                    self.log.advance_start_offset(end)
                self.log.flush()
        elif self.log.start_offset > 0:
            raise StorageError(
                f"{self.log.directory}: log starts at {self.log.start_offset} but no snapshot covers it"
            )
        try:
            entries = self._read_entries()
        except CorruptLogError as error:
            raise _corrupt(error) from error
        return LoadedState(state, snapshot, entries)

    def _read_entries(self) -> list[Entry]:
        entries: list[Entry] = []
        offset = self.log.start_offset
        while offset < self.log.end_offset:
            for batch in self.log.read(offset, _READ_BYTES):
                for index, record in enumerate(batch.records):
                    entries.append(decode_entry(batch.base_offset + index, batch.leader_epoch, record))
                offset = batch.next_offset
        return entries

    def _read_quorum_state(self) -> QuorumState:
        path = self.directory / QUORUM_STATE_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return QuorumState()
        try:
            fields = msgpack.unpackb(raw)
            return QuorumState(int(fields["epoch"]), fields["voted_id"], fields["leader_id"])
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as error:
            raise StorageError(
                f"{path} is unreadable ({error}); refusing to start, since a member that forgets its "
                "vote can elect two leaders. Restore the file, or remove the member's data directory "
                "to rejoin empty."
            ) from error

    def _read_latest_snapshot(self) -> tuple[Snapshot | None, bool]:
        candidates = sorted(
            (
                p
                for p in self.directory.iterdir()
                if p.name.startswith(SNAPSHOT_PREFIX) and not p.name.endswith(".tmp")
            ),
            key=_snapshot_sort_key,
        )
        for path in reversed(candidates):
            raw = path.read_bytes()
            if len(raw) < 4 or int.from_bytes(raw[:4], "big") != crc32c.crc32c(raw[4:]):
                # Written with tmp+fsync+rename, so damage means the disk lost it: fall back to an older one.
                continue
            end, epoch, reset_log, data, *rest = msgpack.unpackb(raw[4:])
            voters = frozenset(rest[0]) if rest and rest[0] is not None else None
            self._snapshot_path = path
            return Snapshot(SnapshotId(end, epoch), data, voters), bool(reset_log)
        return None, False

    # ------------------------------------------------------------------ writing
    def write(self, ready: Ready) -> None:
        """Make `ready` durable, in the order the protocol needs; then its messages may leave."""
        if ready.quorum_state is not None:
            self._write_quorum_state(ready.quorum_state)
        for op in ready.log_ops:
            match op:
                case AppendEntries(entries):
                    self._append(entries)
                case TruncateTo(offset):
                    self.log.truncate_to(offset)
                case SaveSnapshot(snapshot, reset_log):
                    self.log.flush()  # what precedes the snapshot in this Ready is durable first
                    self._write_snapshot(snapshot, reset_log)
                    end = snapshot.id.end_offset
                    if reset_log or self.log.end_offset <= end:
                        self.log.reset(end)
                    else:
                        self.log.advance_start_offset(end)
        if ready.log_ops:
            self.log.flush()

    def _append(self, entries: Iterable[Entry]) -> None:
        group: list[Entry] = []
        for entry in entries:
            if group and entry.epoch != group[0].epoch:
                self._append_group(group)
                group = []
            group.append(entry)
        if group:
            self._append_group(group)

    def _append_group(self, group: list[Entry]) -> None:
        batch = RecordBatch(group[0].offset, group[0].epoch, tuple(encode_entry(e) for e in group))
        self.log.append_batch(batch)

    def _write_quorum_state(self, state: QuorumState) -> None:
        payload = msgpack.packb(
            {"epoch": state.epoch, "voted_id": state.voted_id, "leader_id": state.leader_id}
        )
        _atomic_write(self.directory / QUORUM_STATE_FILE, payload)

    def _write_snapshot(self, snapshot: Snapshot, reset_log: bool) -> None:
        voters = sorted(snapshot.voters) if snapshot.voters is not None else None
        body = msgpack.packb([snapshot.id.end_offset, snapshot.id.epoch, reset_log, snapshot.data, voters])
        path = self.directory / f"{SNAPSHOT_PREFIX}{snapshot.id.end_offset:020d}-{snapshot.id.epoch:010d}"
        _atomic_write(path, crc32c.crc32c(body).to_bytes(4, "big") + body)
        previous, self._snapshot_path = self._snapshot_path, path
        if previous is not None and previous != path:
            previous.unlink(missing_ok=True)


def _corrupt(error: CorruptLogError) -> StorageError:
    return StorageError(
        f"metadata log damaged: {error}. Refusing to start: the damage is not a torn tail, so it may hold "
        "entries this member acknowledged, and dropping them could let it vote a committed entry away. "
        "Restore the file, or (only if a majority of the other voters are healthy) remove the metadata "
        "directory so that this member rejoins empty and fetches the log from the leader."
    )


def _snapshot_sort_key(path: Path) -> tuple[int, int]:
    try:
        end, epoch = path.name[len(SNAPSHOT_PREFIX) :].split("-")
        return int(end), int(epoch)
    except ValueError:
        return -1, -1


def _atomic_write(path: Path, payload: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
