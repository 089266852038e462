"""Structured Streaming through ``icecrypt.iceberg`` on local[2]: sustained rows/s into an
encrypted table versus the same into a plaintext table through the same sink, and the
end-to-end latency of a micro-batch (a row appended to a source table until it is
committed in the sink table), encrypted and plaintext.

Throughput: Spark's own Parquet file source (plaintext input, the same for both) feeds
``--files`` files of ``--rows`` rows each, one file per micro-batch, with
``trigger(availableNow=True)``; each run writes into a fresh table.  Runs alternate
encrypted / plaintext and swap the order every round (the host is shared and noisy); a
warm-up round is not counted.  Reported: median and best rows/s, the ratio, and the
median micro-batch duration Spark reports.

Latency: a query ``icecrypt.iceberg`` source -> ``icecrypt.iceberg`` sink with a 100 ms
processing-time trigger; the benchmark appends a snapshot to the source and polls the
sink's metadata until the snapshot of that epoch appears (``--probes`` times).

    .venv/bin/python benchmarks/streaming.py [--rows 200000] [--files 6] [--rounds 3] [--probes 5]
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
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from spark_fixtures import start_spark, stop_spark

from icecrypt.kms.local import LocalKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

MASTER = "master"


def events(n: int, start: int) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.int64)
    payload = rng.integers(0, 2**63, size=(n, 2), dtype=np.int64)
    return pa.table({
        "id": ids,
        "amount": rng.random(n) * 1000,
        "qty": rng.integers(0, 100, n, dtype=np.int32),
        "payload": pa.array(["".join(f"{v:016x}" for v in row) for row in payload.tolist()]),
    })


def options(kms_path: Path, encrypted: bool) -> dict[str, str]:
    kms = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(kms_path)}
    return kms if encrypted else {**kms, "encryption": "none"}


def new_table(path: Path, kms: LocalKms, encrypted: bool) -> EncryptedTable:
    schema = events(1, 0).schema
    return EncryptedTable.create(str(path), schema, kms=kms if encrypted else None,
                                 table_key_id=MASTER if encrypted else None)


def throughput(spark, root: Path, input_dir: Path, kms_path: Path, kms: LocalKms, encrypted: bool, run: int,
               total_rows: int) -> tuple[float, float]:
    """(rows/s, median micro-batch ms) of one availableNow run into a fresh table."""
    sink = root / f"sink-{'enc' if encrypted else 'plain'}-{run}"
    new_table(sink, kms, encrypted)
    schema = spark.read.parquet(str(input_dir)).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    started = time.perf_counter()
    query = (stream.writeStream.format("icecrypt.iceberg").options(**options(kms_path, encrypted))
             .option("checkpointLocation", str(root / f"cp-{sink.name}")).trigger(availableNow=True).start(str(sink)))
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    durations = [p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]]
    return total_rows / elapsed, statistics.median(durations) if durations else float("nan")


def latency(spark, root: Path, kms_path: Path, kms: LocalKms, encrypted: bool, probes: int, rows: int) -> list[float]:
    tag = "enc" if encrypted else "plain"
    source = new_table(root / f"lat-src-{tag}", kms, encrypted)
    sink = new_table(root / f"lat-sink-{tag}", kms, encrypted)
    source.append(events(rows, 0))
    stream = spark.readStream.format("icecrypt.iceberg").options(**options(kms_path, encrypted)).load(str(root / f"lat-src-{tag}"))
    query = (stream.writeStream.format("icecrypt.iceberg").options(**options(kms_path, encrypted))
             .option("checkpointLocation", str(root / f"cp-lat-{tag}")).trigger(processingTime="100 milliseconds")
             .start(str(root / f"lat-sink-{tag}")))
    try:
        query.processAllAvailable()  # the first (warm-up) batch
        found = []
        for probe in range(1, probes + 1):
            before = len(sink.refresh().snapshots())
            started = time.perf_counter()
            source.append(events(rows, probe * rows))
            while len(sink.refresh().snapshots()) == before:
                time.sleep(0.02)
            found.append(time.perf_counter() - started)
        return found
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows per input file (= per micro-batch)")
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="icecrypt-stream-bench-", dir=args.dir))
    spark = start_spark("icecrypt-streaming-bench")
    try:
        spark.dataSource.register(IcebergDataSource)
        kms_path = root / "keystore.json"
        LocalKms.create_keystore(kms_path, [MASTER])
        kms = LocalKms(kms_path)
        input_dir = root / "input"
        input_dir.mkdir()
        for i in range(args.files):
            pq.write_table(events(args.rows, i * args.rows), input_dir / f"part-{i:03d}.parquet")
        total = args.rows * args.files
        results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for run in range(args.rounds + 1):
            order = (True, False) if run % 2 else (False, True)
            for encrypted in order:
                measured = throughput(spark, root, input_dir, kms_path, kms, encrypted, run, total)
                if run:  # round 0 warms up
                    results[encrypted].append(measured)
        print(f"throughput: {args.files} micro-batches of {args.rows} rows, {args.rounds} rounds (local[2])")
        for encrypted in (True, False):
            rates = [r for r, _ in results[encrypted]]
            batch_ms = statistics.median(ms for _, ms in results[encrypted])
            print(f"  {'encrypted' if encrypted else 'plaintext'}: median {statistics.median(rates):,.0f} rows/s, "
                  f"best {max(rates):,.0f} rows/s, median micro-batch {batch_ms:,.0f} ms")
        ratio = statistics.median(r for r, _ in results[False]) / statistics.median(r for r, _ in results[True])
        print(f"  plaintext / encrypted rows/s: {ratio:.2f}")
        for encrypted in (True, False):
            found = latency(spark, root, kms_path, kms, encrypted, args.probes, rows=1000)
            print(f"latency ({'encrypted' if encrypted else 'plaintext'} source -> sink, 1000-row appends, "
                  f"100 ms trigger): median {statistics.median(found) * 1000:,.0f} ms, "
                  f"min {min(found) * 1000:,.0f} ms, max {max(found) * 1000:,.0f} ms")
    finally:
        stop_spark(spark)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
