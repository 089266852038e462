"""Cost of Iceberg-style Parquet encryption on reads (and writes) of a ~300 MB file.

The same table is written twice with the same writer options (zstd, Iceberg's default):
once plain with ``pyarrow.parquet.write_table``, once encrypted with
``icecrypt.parquet.write_table``.  Then ``pyarrow.parquet.read_table`` of the plain file
and ``icecrypt.parquet.read_table`` of the encrypted one run in interleaved rounds (the
order alternates each round, so drift on the shared host hits both alike), after one
warm-up read of each that puts both files in the page cache.

    .venv/bin/python benchmarks/bench_parquet.py [--mb 300] [--rounds 7] [--dir DIR]

Prints each variant's median and best wall time, throughput and CPU time, and the ratio
plain_time / encrypted_time (1.0 = encryption costs nothing; the target is >= 0.8).  A
third variant, pyarrow with the same decryption properties, separates the cost of
decryption from that of icecrypt's wrapper.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icecrypt import parquet as ip

TARGET_RATIO = 0.8


def make_table(rows: int, seed: int = 42) -> pa.Table:
    """An Iceberg-like table: ids, measures, timestamps, a low-cardinality category,
    free text from a large pool, decimals and nulls."""
    rng = np.random.default_rng(seed)
    pool = pa.array([f"note-{i:08x}-{rng.integers(1 << 40):010x}" for i in range(200_000)])
    categories = pa.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])
    nulls = rng.random(rows) < 0.1
    price = pa.array(rng.integers(-(10**9), 10**9, rows), pa.int64())
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "qty": pa.array(rng.integers(-2**31, 2**31, rows, dtype=np.int32)),
            "amount": pa.array(rng.random(rows) * 1e6),
            "ts": pa.array(rng.integers(1_500_000_000_000_000, 1_800_000_000_000_000, rows), pa.timestamp("us")),
            "category": categories.take(pa.array(rng.integers(0, len(categories), rows))),
            "note": pool.take(pa.array(rng.integers(0, len(pool), rows))),
            "price": pc.cast(price, pa.decimal128(21, 2)),
            "flag": pa.array(rng.random(rows) < 0.5, mask=nulls),
        }
    )


def rows_for(target_bytes: int) -> int:
    """Rows that make a zstd Parquet file of about ``target_bytes``."""
    sample_rows = 1_000_000
    sink = pa.BufferOutputStream()
    pq.write_table(make_table(sample_rows, seed=1), sink, compression="zstd")
    return int(target_bytes / (sink.getvalue().size / sample_rows))


def timed(fn) -> tuple[float, float, int]:
    """Wall time, CPU time of the process (all threads) and Arrow bytes of one read."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    table = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    nbytes = table.nbytes
    del table
    return wall, cpu, nbytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=300, help="target file size in MB (10^6 bytes)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default=None, help="directory for the two files (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="icecrypt-bench-parquet-", dir=args.dir) as directory:
        plain_path = os.path.join(directory, "plain.parquet")
        enc_path = os.path.join(directory, "encrypted.parquet")
        rows = rows_for(int(args.mb * 1e6))
        table = make_table(rows)
        print(f"table: {rows:,} rows, {table.nbytes / 1e6:.0f} MB in memory", flush=True)

        # writes: two interleaved rounds, same options
        writers = {
            "plain": lambda t: pq.write_table(t, plain_path, compression="zstd"),
            "encrypted": lambda t: ip.write_table(t, enc_path, compression="zstd"),
        }
        write_times: dict[str, list[float]] = {name: [] for name in writers}
        for _ in range(2):
            for name, fn in writers.items():
                start = time.perf_counter()
                result = fn(table)
                write_times[name].append(time.perf_counter() - start)
                if name == "encrypted":
                    key_metadata = result
        del table
        plain_size, enc_size = os.path.getsize(plain_path), os.path.getsize(enc_path)
        print(f"files: plain {plain_size / 1e6:.1f} MB, encrypted {enc_size / 1e6:.1f} MB "
              f"(+{(enc_size - plain_size) / 1e3:.1f} kB of nonces, tags and lengths)")
        wp, we = min(write_times["plain"]), min(write_times["encrypted"])
        print(f"write (best of 2): plain {wp:.2f} s, encrypted {we:.2f} s, ratio {wp / we:.3f}")

        props = ip.decryption_properties(key_metadata)
        variants = {
            "plain pq.read_table": lambda: pq.read_table(plain_path),
            "icecrypt.parquet.read_table": lambda: ip.read_table(enc_path, key_metadata),
            # diagnostic: the same decryption without icecrypt's wrapper
            "pq.read_table + decryption": lambda: pq.read_table(enc_path, decryption_properties=props),
        }
        for fn in variants.values():  # warm-up: page cache, thread pools, allocator
            timed(fn)
        names = list(variants)
        wall: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        nbytes = 0
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
                w, c, nbytes = timed(variants[name])
                wall[name].append(w)
                cpu[name].append(c)

        print(f"read, {args.rounds} interleaved rounds (wall time; CPU time of all threads):")
        for name in names:
            med = statistics.median(wall[name])
            print(f"  {name:30s} median {med:.3f} s ({plain_size / med / 1e6:5.0f} MB/s of file, "
                  f"{nbytes / med / 1e6:5.0f} MB/s of Arrow data), best {min(wall[name]):.3f} s; "
                  f"CPU median {statistics.median(cpu[name]):.3f} s")
        plain, ours = names[0], names[1]
        ratio = statistics.median(wall[plain]) / statistics.median(wall[ours])
        per_round = statistics.median(p / e for p, e in zip(wall[plain], wall[ours]))
        best = min(wall[plain]) / min(wall[ours])
        cpu_ratio = statistics.median(cpu[plain]) / statistics.median(cpu[ours])
        print(f"ratio plain/icecrypt (1.0 = free): wall median-of-times {ratio:.3f}, per-round median "
              f"{per_round:.3f}, best-of-times {best:.3f}; CPU {cpu_ratio:.3f}")
        verdict = "OK" if ratio >= TARGET_RATIO else "BELOW TARGET"
        print(f"{verdict}: target ratio >= {TARGET_RATIO}")
        return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
