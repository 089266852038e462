"""Spark (local[2]) reads of encrypted files versus the same files unencrypted (issue 4).

For Avro and for Parquet: ~1 GiB of data is written encrypted, and again unencrypted
(Avro: the decrypted bytes of the very same container files; Parquet: the same rows
and row groups written by pyarrow).  Both are read through the same icecrypt data
source, the plaintext twins with ``encryption=none``, in ``count()`` and in a
``groupBy`` aggregation; runs interleave the two variants (the host is shared and
noisy); the figure to compare with the target (encrypted <= 1.25 x plaintext) is the
median of the ratios of adjacent runs, printed with the ratio of medians and of best runs.

It also plans Avro splits of a few MiB over some of the files and reads each split the
way a task does, with :class:`icecrypt.avro.ReadStats`, counting the AGS1 blocks each
split decrypts outside its byte range (target: at most one at each end; block 0, the
Avro header every split needs, is counted separately).

    .venv/bin/python benchmarks/spark_files.py [--gib 1] [--repeat 3] [--formats avro,parquet]

Takes several minutes for 1 GiB (Avro decoding in Python is the bulk of it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from spark_fixtures import start_spark, stop_spark

from icecrypt import ags1, avro, parquet
from icecrypt.keys import EncryptionManager
from icecrypt.keys.manifest import write_key_manifest
from icecrypt.kms.local import LocalKms

MIB = 1 << 20
MASTER = "master"
CATEGORIES = np.array([f"category-{i:02d}" for i in range(32)])


def events(n: int, start: int) -> pa.Table:
    """Event rows: ids, a low-cardinality category, numbers, a timestamp, 128 hex digits."""
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.int64)
    payload = rng.integers(0, 2**63, size=(n, 8), dtype=np.int64)
    return pa.table({
        "id": ids,
        "category": pa.array(CATEGORIES[rng.integers(0, len(CATEGORIES), n)]),
        "amount": rng.random(n) * 1000,
        "qty": rng.integers(0, 100, n, dtype=np.int32),
        "ts": pa.array(1_700_000_000_000_000 + ids * 997, pa.timestamp("us", tz="UTC")),
        "payload": pa.array(["".join(f"{v:016x}" for v in row) for row in payload.tolist()]),
    })


def write_avro(args: tuple[Path, Path, int, int]):
    enc, plain, rows, start = args
    km = avro.write(events(rows, start), enc, codec="null")
    plain.write_bytes(ags1.decrypt(enc.read_bytes(), km.encryption_key, km.aad_prefix, km.file_length))
    return str(enc), km


def write_parquet(args: tuple[Path, Path, int, int]):
    enc, plain, rows, start = args
    table = events(rows, start)
    km = parquet.write_table(table, enc, row_group_size=1 << 20)
    pq.write_table(table, plain, row_group_size=1 << 20, compression="zstd")
    return str(enc), km


def generate(fmt: str, root: Path, total: int, files: int, manager: EncryptionManager) -> tuple[Path, Path, Path, int]:
    """Write ``files`` encrypted files of ``total`` bytes (Avro plaintext bytes, or Parquet
    stored bytes) and their plaintext twins; returns dirs, the key manifest and row count."""
    enc, plain = root / fmt / "enc", root / fmt / "plain"
    enc.mkdir(parents=True)
    plain.mkdir(parents=True)
    probe = root / f"probe.{fmt}"
    sample = 20_000
    size = (avro.write(events(sample, 0), probe, codec="null").file_length if fmt == "avro"
            else parquet.write_table(events(sample, 0), probe).file_length)
    probe.unlink()
    rows = int(total / files / (size / sample))
    jobs = [(enc / f"part-{i:03d}.{fmt}", plain / f"part-{i:03d}.{fmt}", rows, i * rows) for i in range(files)]
    with ProcessPoolExecutor(2) as pool:
        keys = dict(pool.map(write_avro if fmt == "avro" else write_parquet, jobs))
    manifest = root / fmt / "keys.json"
    write_key_manifest(manifest, keys, manager)
    return enc, plain, manifest, rows * files


def timed(query, df) -> float:
    start = time.perf_counter()
    query(df)
    return time.perf_counter() - start


def bench_format(spark, fmt: str, enc: Path, plain: Path, manifest: Path, kms_options: dict, rows: int,
                 repeat: int) -> dict:
    from pyspark.sql import functions as F

    def frame(encrypted: bool):
        reader = spark.read.format(f"icecrypt.{fmt}")
        if encrypted:
            return reader.options(**kms_options).option("keys.manifest", str(manifest)).load(str(enc))
        return reader.option("encryption", "none").load(str(plain))

    queries = {
        "count": lambda df: df.count(),
        "groupBy": lambda df: df.groupBy("category").agg(F.sum("amount"), F.count("*")).collect(),
    }
    for encrypted in (True, False):  # warm-up: Python workers, JIT, page cache
        assert frame(encrypted).count() == rows
    times = {(q, e): [] for q in queries for e in (True, False)}
    for rep in range(repeat):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for name, query in queries.items():
            for encrypted in order:
                times[(name, encrypted)].append(timed(query, frame(encrypted)))
    result = {}
    for name in queries:
        enc_runs, plain_runs = times[(name, True)], times[(name, False)]
        enc_t, plain_t = statistics.median(enc_runs), statistics.median(plain_runs)
        # Each run is paired with the other variant's run next to it in time: the median
        # of those ratios is the least disturbed by the host's changing load.
        paired = statistics.median(e / p for e, p in zip(enc_runs, plain_runs, strict=True))
        best = min(enc_runs) / min(plain_runs)
        result[name] = (enc_t, plain_t, paired, best)
        print(f"  {fmt:7s} {name:8s} encrypted {enc_t:7.2f} s   plaintext {plain_t:7.2f} s   ratio of medians "
              f"{enc_t / plain_t:5.3f}, median paired ratio {paired:5.3f}, best-of ratio {best:5.3f} "
              f"({rows / enc_t / 1e6:5.2f} M rows/s encrypted)\n"
              f"      runs encrypted {fmt_list(enc_runs)}  plaintext {fmt_list(plain_runs)}", flush=True)
    return result


def fmt_list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def split_block_counts(enc: Path, manifest: Path, kms_options: dict, split_size: str, files: int) -> dict:
    """Plan Avro splits as the data source does and read each as a task does, counting
    the AGS1 blocks decrypted before and after the split's byte range."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    from icecrypt.spark import AvroDataSource

    paths = sorted(enc.glob("*.avro"))[:files]
    import json

    options = CaseInsensitiveDict({**kms_options, "keys.manifest": str(manifest), "split-size": split_size,
                                   "paths": json.dumps([str(p) for p in paths])})
    source = AvroDataSource(options)
    reader = source.reader(source.schema())
    before, after, header, splits, rows = [], [], 0, 0, 0
    for partition in reader.partitions():
        for file, start, length in partition.pieces:
            stats = avro.ReadStats()
            rows += sum(b.num_rows for b in avro.read_split(file.path, reader.key(file), start, length, stats=stats))
            first, last = start // MIB, (start + length - 1) // MIB
            decrypted = set(stats.blocks)
            header += 0 in decrypted and first > 0
            before.append(len({b for b in decrypted if 0 < b < first}))
            after.append(len({b for b in decrypted if b > last}))
            splits += 1
    return {"splits": splits, "rows": rows, "max_before": max(before), "max_after": max(after),
            "splits_with_block_after": sum(1 for a in after if a), "header_block_reads": header}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="data per format (GiB)")
    parser.add_argument("--files", type=int, default=16, help="files per format")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per variant")
    parser.add_argument("--formats", default="avro,parquet")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    args = parser.parse_args()

    root = Path(args.dir or tempfile.mkdtemp(prefix="icecrypt-spark-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        keystore = root / "keystore.json"
        kms = LocalKms.create_keystore(keystore, [MASTER])
        kms_options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
                       "encryption.key-id": MASTER}  # the key manifests' master key
        manager = EncryptionManager(kms, MASTER)
        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        data = {}
        for fmt in formats:
            start = time.perf_counter()
            data[fmt] = generate(fmt, root, int(args.gib * (1 << 30)), args.files, manager)
            enc, plain, _, rows = data[fmt]
            enc_bytes = sum(p.stat().st_size for p in enc.iterdir())
            plain_bytes = sum(p.stat().st_size for p in plain.iterdir())
            print(f"{fmt}: {rows} rows in {args.files} files, {enc_bytes / MIB:.0f} MiB encrypted, "
                  f"{plain_bytes / MIB:.0f} MiB plaintext (written in {time.perf_counter() - start:.0f} s)", flush=True)

        spark = start_spark("icecrypt-spark-bench")
        try:
            import icecrypt.spark

            icecrypt.spark.register(spark)
            print(f"Spark {spark.version}, {spark.sparkContext.master}; medians of {args.repeat} interleaved runs")
            for fmt in formats:
                enc, plain, manifest, rows = data[fmt]
                bench_format(spark, fmt, enc, plain, manifest, kms_options, rows, args.repeat)
        finally:
            stop_spark(spark)

        if "avro" in data:
            enc, _, manifest, _ = data["avro"]
            for split_size in ("1m", "3m", "4194305"):
                counts = split_block_counts(enc, manifest, kms_options, split_size, files=2)
                print(f"  avro splits of {split_size}: {counts['splits']} splits, {counts['rows']} rows; AGS1 blocks "
                      f"decrypted outside the range: at most {counts['max_before']} before (besides block 0, the "
                      f"header, read by {counts['header_block_reads']} splits) and {counts['max_after']} after "
                      f"({counts['splits_with_block_after']} splits read one past their end)", flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
