"""Spark (local[2]) reads of an encrypted Iceberg table versus the same table unencrypted,
through the same ``icecrypt.iceberg`` data source (issue 5, target: encrypted <= 1.25 x).

Both tables are written by the same code — ``EncryptedTable.create`` (with a KMS master
key, and with ``table_key_id=None`` for the plaintext one) and the same ``append`` calls
with the same Arrow data — so they hold the same files and layout; the encrypted one has
natively encrypted Parquet data files, AGS1 manifests and manifest lists and KEK-wrapped
keys.  Queries: ``count()`` (every column is decoded: Python data sources get no column
pruning) and a ``groupBy`` aggregation.  Each round runs both queries on both tables,
alternating and swapping the order every round (the host is shared and noisy); a warm-up
round is not counted.  Reported: median and best wall seconds and the ratio.

    .venv/bin/python benchmarks/spark_table.py [--rows 3000000] [--rounds 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pyspark.sql import functions as F
from spark_fixtures import start_spark, stop_spark

from icecrypt.kms.local import LocalKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

MASTER = "master"
CATEGORIES = np.array([f"category-{i:02d}" for i in range(32)])
COMMITS = 4


def events(n: int, start: int) -> pa.Table:
    """Event rows: ids, a low-cardinality category, numbers, a timestamp, 64 hex digits."""
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.int64)
    payload = rng.integers(0, 2**63, size=(n, 4), dtype=np.int64)
    return pa.table({
        "id": ids,
        "category": pa.array(CATEGORIES[rng.integers(0, len(CATEGORIES), n)]),
        "amount": rng.random(n) * 1000,
        "qty": rng.integers(0, 100, n, dtype=np.int32),
        "ts": pa.array(1_700_000_000_000_000 + ids * 997, pa.timestamp("us", tz="UTC")),
        "payload": pa.array(["".join(f"{v:016x}" for v in row) for row in payload.tolist()]),
    })


def build(root: Path, rows: int, kms: LocalKms) -> tuple[Path, Path, int]:
    """The two tables, same appends; returns their locations and the Arrow bytes written."""
    enc, plain = root / "encrypted", root / "plaintext"
    schema = events(1, 0).schema
    tables = [EncryptedTable.create(str(enc), schema, kms=kms, table_key_id=MASTER),
              EncryptedTable.create(str(plain), schema, kms=None, table_key_id=None)]
    per_commit = rows // COMMITS
    arrow_bytes = 0
    for commit in range(COMMITS):
        data = events(per_commit, commit * per_commit)
        arrow_bytes += data.nbytes
        for table in tables:  # two files per commit, so a query has several tasks
            table.append(data, target_file_size=max(1, data.nbytes // 2 + 1))
    return enc, plain, arrow_bytes


def stored_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path / "data").rglob("*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the tables go (default: a temporary directory)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="icecrypt-spark-table-", dir=args.dir))
    try:
        kms = LocalKms.create_keystore(root / "keystore.json", [MASTER])
        started = time.perf_counter()
        enc, plain, arrow_bytes = build(root, args.rows, kms)
        print(f"tables: {args.rows:,} rows, {arrow_bytes / 1e6:.0f} MB of Arrow data, Parquet files "
              f"{stored_bytes(enc) / 1e6:.0f} MB encrypted / {stored_bytes(plain) / 1e6:.0f} MB plaintext "
              f"(written in {time.perf_counter() - started:.0f} s)")

        spark = start_spark("icecrypt-bench-spark-table")
        try:
            spark.dataSource.register(IcebergDataSource)
            kms_options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(root / "keystore.json")}
            frames = {
                "encrypted": lambda: spark.read.format("icecrypt.iceberg").options(**kms_options).load(str(enc)),
                "plaintext": lambda: spark.read.format("icecrypt.iceberg").option("encryption", "none").load(str(plain)),
            }
            queries = {
                "count": lambda df: df.count(),
                "groupBy": lambda df: sorted(df.groupBy("category").agg(
                    F.count("*"), F.sum("qty"), F.max("amount")).collect()),  # deterministic aggregates
            }
            times: dict[tuple[str, str], list[float]] = {(q, v): [] for q in queries for v in frames}
            results: dict[tuple[str, str], object] = {}
            for round_number in range(args.rounds + 1):  # round 0 warms up
                order = list(frames) if round_number % 2 == 0 else list(reversed(frames))
                for query, run in queries.items():
                    for variant in order:
                        t0 = time.perf_counter()
                        result = run(frames[variant]())
                        elapsed = time.perf_counter() - t0
                        results[(query, variant)] = result
                        if round_number:
                            times[(query, variant)].append(elapsed)
            for query in queries:
                if results[(query, "encrypted")] != results[(query, "plaintext")]:
                    raise SystemExit(f"{query}: the two tables gave different results")
            assert results[("count", "encrypted")] == args.rows // COMMITS * COMMITS

            print(f"{'query':<8} {'encrypted s (median/best)':>26} {'plaintext s (median/best)':>26} "
                  f"{'ratio median':>13} {'ratio best':>11}")
            for query in queries:
                enc_t, plain_t = times[(query, "encrypted")], times[(query, "plaintext")]
                ratio = statistics.median(enc_t) / statistics.median(plain_t)
                best = min(enc_t) / min(plain_t)
                print(f"{query:<8} {statistics.median(enc_t):>17.2f} / {min(enc_t):5.2f} "
                      f"{statistics.median(plain_t):>17.2f} / {min(plain_t):5.2f} {ratio:>13.3f} {best:>11.3f}"
                      f"   {'ok' if ratio <= 1.25 else 'ABOVE TARGET'} (target <= 1.25)")
            mb_s = arrow_bytes / 1e6 / statistics.median(times[("count", "encrypted")])
            print(f"encrypted count(): {args.rows / statistics.median(times[('count', 'encrypted')]) / 1e6:.2f} M rows/s, "
                  f"{mb_s:.0f} MB/s of Arrow data")
        finally:
            stop_spark(spark)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
