"""Appending to an encrypted Iceberg table against the same append to a plaintext table.

    python benchmarks/table_append.py [--gib 1.0] [--rounds 3] [--dir /dev/shm] [--partitioned] [--json]

Both variants run the same code (``EncryptedTable.create`` + ``append``): the encrypted
table has ``encryption.key-id`` (fresh DEK per Parquet file with native Parquet
encryption, AGS1 manifests and manifest list, KEK-wrapped manifest-list key), the
plaintext one does not.  Each round creates a fresh table per variant, appends the same
in-memory Arrow data (about GIB gibibytes of Arrow buffers) and commits; the variants
alternate and swap order every round (the host is shared and noisy).  Files go to DIR
(default /dev/shm: what is measured is the CPU work of writing, not the disk).

Reported: median wall seconds per variant, GiB/s of Arrow data, the encryption overhead
(encrypted / plaintext - 1; the target is at most 15 %), and the same for the process's
CPU seconds (all threads), which other processes on a busy host disturb far less than
wall time.  One warm-up round is not counted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform

import icecrypt
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

GIB = 1 << 30


def make_table(target_bytes: int, seed: int = 11) -> pa.Table:
    """Event-like rows (ids, low-cardinality category, numbers, timestamps, short text),
    random enough that Parquet does not compress them away; about ``target_bytes`` of
    Arrow buffers."""
    rng = np.random.default_rng(seed)
    words = np.array([f"note-{i:05d}-{i * 7919 % 100003}" for i in range(20000)], dtype=object)
    chunk_rows = 1 << 20
    chunks = []
    total = 0
    start = 0
    while total < target_bytes:
        ids = np.arange(start, start + chunk_rows, dtype=np.int64)
        batch = pa.record_batch(
            {
                "id": ids,
                "category": pa.array(np.array(["alpha", "beta", "gamma", "delta"])[rng.integers(0, 4, chunk_rows)]),
                "qty": rng.integers(-1000, 1000, chunk_rows).astype(np.int32),
                "amount": rng.normal(0, 1000, chunk_rows),
                "ts": pa.array(1_700_000_000_000_000 + rng.integers(0, 10**12, chunk_rows), pa.timestamp("us")),
                "note": pa.array(words[rng.integers(0, len(words), chunk_rows)], pa.string()),
            }
        )
        chunks.append(batch)
        total += batch.nbytes
        start += chunk_rows
    return pa.Table.from_batches(chunks)


def append_once(
    root: Path, data: pa.Table, encrypted: bool, partitioned: bool, kms: MemoryKms
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) to append ``data`` to a new table (creation not timed)."""
    spec = None
    if partitioned:
        spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
    table = EncryptedTable.create(
        str(root), data.schema, kms=kms if encrypted else None, table_key_id="keyA" if encrypted else None,
        partition_spec=spec,
    )  # fmt: skip
    start, cpu = time.perf_counter(), time.process_time()
    table.append(data)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    summary = table.metadata["snapshots"][-1]["summary"]
    assert int(summary["added-records"]) == data.num_rows
    assert ("key-id" in table.metadata["snapshots"][-1]) == encrypted
    return elapsed, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="Arrow data appended per table (GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--partitioned", action="store_true", help="partition by category (identity)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    data = make_table(int(args.gib * GIB))
    kms = MemoryKms.with_iceberg_test_keys()
    work = Path(tempfile.mkdtemp(prefix="icecrypt-append-", dir=args.dir))
    times: dict[str, list[float]] = {"plaintext": [], "encrypted": []}
    cpu: dict[str, list[float]] = {"plaintext": [], "encrypted": []}
    try:
        for round_no in range(args.rounds + 1):
            order = ("plaintext", "encrypted") if round_no % 2 == 0 else ("encrypted", "plaintext")
            for variant in order:
                root = work / f"{variant}-{round_no}"
                elapsed, seconds = append_once(root, data, variant == "encrypted", args.partitioned, kms)
                shutil.rmtree(root)
                if round_no:  # round 0 warms up
                    times[variant].append(elapsed)
                    cpu[variant].append(seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    plain, enc = statistics.median(times["plaintext"]), statistics.median(times["encrypted"])
    plain_cpu, enc_cpu = statistics.median(cpu["plaintext"]), statistics.median(cpu["encrypted"])
    result = {
        "arrow_bytes": data.nbytes,
        "rows": data.num_rows,
        "rounds": args.rounds,
        "dir": args.dir,
        "partitioned": args.partitioned,
        "openssl": icecrypt.openssl_version(),
        "plaintext_s": plain,
        "encrypted_s": enc,
        "plaintext_gib_s": data.nbytes / GIB / plain,
        "encrypted_gib_s": data.nbytes / GIB / enc,
        "overhead": enc / plain - 1,
        "plaintext_cpu_s": plain_cpu,
        "encrypted_cpu_s": enc_cpu,
        "cpu_overhead": enc_cpu / plain_cpu - 1,
        "all": times,
        "all_cpu": cpu,
    }
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print(f"append {data.nbytes / GIB:.2f} GiB of Arrow data ({data.num_rows:,} rows), "
              f"{args.rounds} rounds, dir={args.dir}, partitioned={args.partitioned}")  # fmt: skip
        print(f"  plaintext table : {plain:7.2f} s  ({result['plaintext_gib_s']:.3f} GiB/s)")
        print(f"  encrypted table : {enc:7.2f} s  ({result['encrypted_gib_s']:.3f} GiB/s)")
        print(f"  encryption overhead: {result['overhead'] * 100:+.1f} %  (target <= +15 %)")
        print(f"  CPU seconds: plaintext {plain_cpu:.2f}, encrypted {enc_cpu:.2f}, "
              f"overhead {result['cpu_overhead'] * 100:+.1f} %")  # fmt: skip
        print("  wall per round:", {k: [round(v, 2) for v in vs] for k, vs in times.items()})
        print("  CPU per round: ", {k: [round(v, 2) for v in vs] for k, vs in cpu.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
