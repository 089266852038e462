"""icecrypt.avro: encrypted Avro read/write against the same work on the plaintext file.

    python benchmarks/bench_avro.py [--rows 300000] [--rounds 5] [--dir /dev/shm] [--json]

The data is shaped like Iceberg Java's Avro data files in ../shared/tables (long, string,
int, double, timestamp, date, nullable string/decimal/boolean).  Every round runs every
variant once, in a new random order (the host is shared and noisy); the figures are
medians of ROUNDS rounds after one warm-up round.

  read/enc      icecrypt.avro.read of the AGS1 file
  read/plain    the same decoder (fastavro without logical-type conversion, the same
                Arrow batch builder) over the decrypted file: `_AvroFile.unencrypted`
  read/fastavro what a plain fastavro user does: fastavro.reader (logical types
                converted to Python objects) + pa.Table.from_pylist, plaintext file
  split/enc     the AGS1 file read as 4 consecutive read_split calls
  write/enc     icecrypt.avro.write
  write/plain   the same rows (the same Arrow -> Python conversion) through
                fastavro.writer into a plaintext file

``ratio`` = plaintext time / encrypted time (1.0: encryption is free; target >= 0.8).
:func:`run` returns the figures for other benchmarks (the data-plane report).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import fastavro
import numpy as np
import pyarrow as pa

import icecrypt
from icecrypt import ags1, avro
from icecrypt.avro._arrow import writable_rows


def make_table(rows: int, seed: int = 7) -> pa.Table:
    """Rows like the golden enc_avro_dek16 table's (Iceberg field ids included)."""
    rng = np.random.default_rng(seed)
    words = np.array(["alpha", "beta", "gamma", "delta", "naïve", "日本語", None], dtype=object)
    cents = rng.integers(-99_999_999, 99_999_999, rows)  # decimal(10, 2) unscaled values
    unscaled = np.ascontiguousarray(np.stack([cents, cents >> 63], axis=1))  # int128 little-endian
    price = pa.Array.from_buffers(pa.decimal128(10, 2), rows, [None, pa.py_buffer(unscaled)])
    price_mask = rng.random(rows) < 0.1

    def field(name: str, type_: pa.DataType, nullable: bool, fid: int) -> pa.Field:
        return pa.field(name, type_, nullable, {b"PARQUET:field_id": str(fid).encode()})

    schema = pa.schema([
        field("id", pa.int64(), False, 1), field("category", pa.string(), False, 2),
        field("qty", pa.int32(), False, 3), field("amount", pa.float64(), False, 4),
        field("ts", pa.timestamp("us"), False, 5), field("event_date", pa.date32(), False, 6),
        field("note", pa.string(), True, 7), field("price", pa.decimal128(10, 2), True, 8),
        field("flag", pa.bool_(), True, 9),
    ])
    return pa.Table.from_arrays([
        pa.array(np.arange(rows, dtype=np.int64)),
        pa.array(words[rng.integers(0, 5, rows)], pa.string()),
        pa.array(rng.integers(-2000, 2000, rows, dtype=np.int32)),
        pa.array(rng.standard_normal(rows) * 1e4),
        pa.array(1_700_000_000_000_000 + rng.integers(0, 10**13, rows), pa.timestamp("us")),
        pa.array(rng.integers(18000, 21000, rows, dtype=np.int32), pa.date32()),
        pa.array(words[rng.integers(0, len(words), rows)], pa.string()),
        pa.compute.if_else(pa.array(price_mask), pa.scalar(None, pa.decimal128(10, 2)), price),
        pa.array(np.where(rng.random(rows) < 0.2, None, rng.random(rows) < 0.5).tolist(), pa.bool_()),
    ], schema=schema)


def interleaved(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per variant: each round runs every variant once, shuffled, after a
    warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for rnd in range(rounds + 1):
        random.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            variants[name]()
            if rnd:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def run(rows: int = 300_000, rounds: int = 5, directory: str | None = None) -> dict:
    """Write the table, check every variant decodes the same rows, time them; returns
    {"rows", "avro_bytes", "seconds": {variant: s}, "ratios": {...}, "rows_per_s": {...}}."""
    table = make_table(rows)
    root = tempfile.mkdtemp(prefix="bench-avro-", dir=directory)
    try:
        enc, plain, plain_w = f"{root}/enc.avro", f"{root}/plain.avro", f"{root}/plain-w.avro"
        km = avro.write(table, enc)
        with ags1.open_reader(enc, km.encryption_key, km.aad_prefix, km.file_length) as r, open(plain, "wb") as out:
            shutil.copyfileobj(r, out, 8 << 20)
        avro_schema = avro.arrow_to_avro_schema(table.schema, "table")
        size = avro.plaintext_size(km)

        def read_plain() -> pa.Table:
            with avro._AvroFile.unencrypted(plain) as f:
                return pa.Table.from_batches(list(f.batches(None, avro.DEFAULT_BATCH_SIZE)), schema=f.arrow_schema())

        def read_fastavro() -> pa.Table:
            with open(plain, "rb") as fh:
                return pa.Table.from_pylist(list(fastavro.reader(fh)))

        def read_splits() -> pa.Table:
            step = -(-size // 4)
            return pa.Table.from_batches(
                [b for s in range(0, size, step) for b in avro.read_split(enc, km, s, step)], schema=table.schema)

        def write_plain() -> None:
            def records():
                for batch in table.to_batches(max_chunksize=avro.DEFAULT_BATCH_SIZE):
                    yield from writable_rows(batch)
            with open(plain_w, "wb") as out:
                fastavro.writer(out, avro_schema, records(), codec=avro.DEFAULT_CODEC,
                                codec_compression_level=avro.DEFAULT_DEFLATE_LEVEL,
                                sync_interval=avro.DEFAULT_SYNC_INTERVAL)

        expected = avro.read(enc, km)
        assert expected.equals(table), "icecrypt.avro.read does not give the table back"
        assert read_plain().equals(table) and read_splits().equals(table)
        seconds = interleaved({
            "read/enc": lambda: avro.read(enc, km),
            "read/plain": read_plain,
            "read/fastavro": read_fastavro,
            "split/enc": read_splits,
            "write/enc": lambda: avro.write(table, f"{root}/w.avro", key_metadata=km),
            "write/plain": write_plain,
        }, rounds)
        return {
            "rows": rows,
            "avro_bytes": size,
            "seconds": seconds,
            "ratios": {
                "read": seconds["read/plain"] / seconds["read/enc"],
                "split": seconds["read/plain"] / seconds["split/enc"],
                "write": seconds["write/plain"] / seconds["write/enc"],
                "read_vs_fastavro": seconds["read/fastavro"] / seconds["read/enc"],
            },
            "rows_per_s": {name: rows / s for name, s in seconds.items()},
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.rows, args.rounds, args.dir)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"icecrypt {icecrypt.__version__}, fastavro {fastavro.__version__}, pyarrow {pa.__version__}, "
          f"{result['rows']} rows, {result['avro_bytes'] / 1e6:.1f} MB of Avro, {args.rounds} rounds (medians)")
    for name, s in result["seconds"].items():
        print(f"  {name:<14} {s:8.3f} s  {result['rows_per_s'][name] / 1e3:8.0f} k rows/s"
              f"  {result['avro_bytes'] / s / 1e6:7.1f} MB/s")
    for name, ratio in result["ratios"].items():
        print(f"  ratio {name:<17} {ratio:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
