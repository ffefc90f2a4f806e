"""Log throughput: appends/s and read MB/s, fsync="never" against fsync="always".

Run: .venv/bin/python bench/log_append.py  (writes bench/results/log_append.json)
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hotstate.log import FsyncPolicy, Log

RECORD_BYTES = 100
SHAPES = [(1, "1 record a batch"), (100, "100 records a batch")]
APPENDS = {"never": 20_000, "always": 2_000}
READ_MAX_BYTES = 1 << 20
RESULTS = Path(__file__).parent / "results" / "log_append.json"


def run(policy: FsyncPolicy, records_per_batch: int, root: Path) -> dict[str, object]:
    directory = root / f"{policy}-{records_per_batch}"
    appends = APPENDS[policy] // (10 if records_per_batch > 1 else 1)
    batch = [os.urandom(RECORD_BYTES) for _ in range(records_per_batch)]
    with Log.open(directory, fsync=policy) as log:
        began = time.perf_counter()
        for _ in range(appends):
            log.append(1, batch)
        append_seconds = time.perf_counter() - began
        size = log.size_bytes
        began = time.perf_counter()
        offset, batches = 0, 0
        while offset < log.end_offset:
            got = log.read(offset, READ_MAX_BYTES)
            batches += len(got)
            offset = got[-1].next_offset
        read_seconds = time.perf_counter() - began
        assert batches == appends
    shutil.rmtree(directory)
    return {
        "fsync": policy,
        "records_per_batch": records_per_batch,
        "record_bytes": RECORD_BYTES,
        "appends": appends,
        "appends_per_s": round(appends / append_seconds),
        "records_per_s": round(appends * records_per_batch / append_seconds),
        "append_mb_per_s": round(size / append_seconds / 1e6, 2),
        "read_mb_per_s": round(size / read_seconds / 1e6, 1),
        "read_records_per_s": round(appends * records_per_batch / read_seconds),
        "log_bytes": size,
    }


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="hotstate-bench-log-", dir=os.environ.get("BENCH_DIR")))
    try:
        rows = [run(policy, n, root) for policy in ("never", "always") for n, _ in SHAPES]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "benchmark": "hotstate.log append and sequential read",
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "filesystem_dir": str(root.parent),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "results": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        print(
            f"fsync={row['fsync']:<6} {row['records_per_batch']:>3} rec/batch: "
            f"{row['appends_per_s']:>7} appends/s ({row['records_per_s']:>8} records/s, "
            f"{row['append_mb_per_s']:>6} MB/s), read {row['read_mb_per_s']:>6} MB/s"
        )
    print(f"cpu_count={result['cpu_count']} load={result['load_average_1m']} -> {RESULTS}")


if __name__ == "__main__":
    main()
