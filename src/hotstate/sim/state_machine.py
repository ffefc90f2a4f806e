"""The state machine the simulator replicates: a hash chain over every committed entry.

Two members that applied the same entries hold the same digest, so comparing digests compares whole
histories in constant time; a snapshot is just (applied offset, digest).
"""

from __future__ import annotations

import hashlib

import msgpack

from hotstate.raft.records import Entry, Snapshot


def chain(digest: bytes, entry: Entry) -> bytes:
    h = hashlib.blake2b(digest, digest_size=16)
    h.update(entry.offset.to_bytes(8, "big"))
    h.update(entry.epoch.to_bytes(8, "big"))
    h.update(bytes([int(entry.kind)]))
    h.update(entry.data)
    return h.digest()


GENESIS = b"\x00" * 16


class HashChainStateMachine:
    def __init__(self) -> None:
        self.applied = 0  # offset of the next entry to apply
        self.digest = GENESIS

    def apply(self, entry: Entry) -> None:
        if entry.offset != self.applied:
            raise AssertionError(f"applied {entry.offset} but expected {self.applied}")
        self.digest = chain(self.digest, entry)
        self.applied += 1

    def snapshot_bytes(self) -> bytes:
        return msgpack.packb([self.applied, self.digest])

    def load(self, snapshot: Snapshot) -> None:
        applied, digest = msgpack.unpackb(snapshot.data)
        if applied != snapshot.id.end_offset:
            raise AssertionError(f"snapshot {snapshot.id} holds state at {applied}")
        self.applied = applied
        self.digest = digest
