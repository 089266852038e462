"""Read throughput of a Parquet file through icecrypt.fsspec vs the plain fsspec filesystem.

One table is written twice with the same options: plain through fsspec's local
filesystem, and encrypted through ``icecrypt.fsspec.EncryptedFileSystem`` over it.  Then
both are read back in interleaved rounds (the order alternates each round, so drift on
the shared host hits both alike), after one warm-up read of each that puts both files in
the page cache, in two ways:

* ``filesystem``: ``pyarrow.parquet.read_table(path, filesystem=fs)`` — pyarrow swaps
  fsspec's local filesystem for its native one, and wraps the encrypting one in its
  fsspec adapter, so this is what a pandas/pyarrow user gets;
* ``fileobj``: ``pyarrow.parquet.read_table(fs.open(path, "rb"))`` — both through
  Python file objects.

    .venv/bin/python benchmarks/fsspec_read.py [--mb 200] [--rounds 5] [--base local|memory]

Prints each variant's median and best wall time, throughput, and the ratio
plain_time / encrypted_time measured in the same run (1.0 = encryption costs nothing).
``--base memory`` puts both files in fsspec's memory filesystem instead (the encrypted
reads then go through ranged ``cat_file`` calls, as on an object store).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from icecrypt.fsspec import EncryptedFileSystem
from icecrypt.keys import EncryptionManager
from icecrypt.kms.memory import MemoryKms


def make_table(rows: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    pool = pa.array([f"note-{i:08x}" for i in range(50_000)])
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "amount": pa.array(rng.random(rows) * 1e6),
            "qty": pa.array(rng.integers(0, 1 << 30, rows, dtype=np.int32)),
            "note": pool.take(pa.array(rng.integers(0, len(pool), rows))),
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="approximate Parquet file size (MB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", choices=["local", "memory"], default="local")
    parser.add_argument("--dir", default=None, help="directory for the local files (default: a temporary one)")
    args = parser.parse_args()

    rows = max(1, args.mb * 1_000_000 // 16)  # ~16 bytes a row after zstd
    table = make_table(rows)
    manager = EncryptionManager(MemoryKms.with_iceberg_test_keys(), "keyA")
    if args.base == "local":
        workdir = tempfile.mkdtemp(prefix="icecrypt-fsspec-bench-", dir=args.dir)
        base = fsspec.filesystem("file")
    else:
        workdir = f"/icecrypt-bench-{uuid.uuid4().hex[:8]}"
        base = fsspec.filesystem("memory")
        base.mkdir(workdir)
    enc = EncryptedFileSystem(base, manager)
    plain_path, enc_path = f"{workdir}/plain.parquet", f"{workdir}/encrypted.parquet"
    with base.open(plain_path, "wb") as f:
        pq.write_table(table, f, compression="zstd")
    with enc.open(enc_path, "wb") as f:
        pq.write_table(table, f, compression="zstd")
    size = enc.size(enc_path)
    print(f"{rows:,} rows; Parquet {size / 1e6:.1f} MB ({base.size(enc_path) / 1e6:.1f} MB stored as AGS1); "
          f"base={args.base}; {args.rounds} rounds; python {sys.version.split()[0]}")

    def by_filesystem(fs, path):
        return lambda: pq.read_table(path, filesystem=fs)

    def by_fileobj(fs, path):
        def read():
            with fs.open(path, "rb") as f:
                return pq.read_table(f)
        return read

    results = {}
    for mode, make in (("filesystem", by_filesystem), ("fileobj", by_fileobj)):
        variants = {"plain": make(base, plain_path), "encrypted": make(enc, enc_path)}
        for read in variants.values():  # warm-up: page cache, pools, imports
            assert read().num_rows == rows
        times = {name: [] for name in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                gc.collect()
                start = time.perf_counter()
                out = variants[name]()
                times[name].append(time.perf_counter() - start)
                assert out.num_rows == rows
                del out
        results[mode] = times
        for name, values in times.items():
            median = statistics.median(values)
            print(f"  {mode:10s} {name:9s} median {median * 1e3:8.1f} ms  best {min(values) * 1e3:8.1f} ms  "
                  f"{size / median / 1e9:6.2f} GB/s (Parquet bytes)")
        ratio = statistics.median(times["plain"]) / statistics.median(times["encrypted"])
        print(f"  {mode:10s} ratio plain/encrypted (median): {ratio:.2f}")
    if args.base == "local":
        for path in (plain_path, enc_path):
            os.remove(path)
        os.rmdir(workdir)
    else:
        base.rm(workdir, recursive=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
